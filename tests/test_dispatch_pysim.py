"""Fast checks of the dispatch unit in Amaranth's simulator: reset in the middle of a run
returns it to idle with no stale output, and a run after that is correct."""

import numpy as np
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from moe_hw.formats import to_bits
from moe_hw.units.dispatch import DispatchParams, DispatchUnit


def test_reset_mid_run_leaves_no_stale_output():
    params = DispatchParams(lanes=2, max_pairs=8, max_hidden=8, max_capacity=4, max_experts=2)
    dut = DispatchUnit(params)
    top = Module()
    top.domains.sync = sync = ClockDomain()
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-6)
    one = int(to_bits(np.float32(1.0), "fp32"))
    writes = []

    async def start(ctx, tokens):
        ctx.set(dut.pairs, tokens)
        ctx.set(dut.hidden, 4)
        ctx.set(dut.capacity, 4)
        ctx.set(dut.num_experts, 2)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)

    async def bench(ctx):
        ctx.set(dut.write.ready, 1)
        ctx.set(dut.header.valid, 1)
        ctx.set(dut.header.payload.gate, one)
        ctx.set(dut.header.payload.index, 1)
        ctx.set(dut.header.payload.location, 2)
        ctx.set(dut.data.valid, 1)
        ctx.set(dut.data.payload.data[0], one)
        ctx.set(dut.data.payload.data[1], one)
        await start(ctx, 8)
        for _ in range(8):          # part of the way through the run
            await ctx.tick()
        assert ctx.get(dut.busy)
        ctx.set(sync.rst, 1)
        await ctx.tick()
        ctx.set(sync.rst, 0)
        for _ in range(20):         # idle: nothing stale comes out, no counter survives
            assert not ctx.get(dut.busy) and not ctx.get(dut.write.valid)
            assert not ctx.get(dut.done) and ctx.get(dut.dropped) == 0
            assert not ctx.get(dut.header.ready) and not ctx.get(dut.data.ready)
            await ctx.tick()
        await start(ctx, 1)         # a fresh one-pair run works
        for _ in range(30):
            if ctx.get(dut.write.valid):
                writes.append((ctx.get(dut.write.payload.addr), ctx.get(dut.write.payload.enable)))
            if ctx.get(dut.done):
                break
            await ctx.tick()
        assert ctx.get(dut.done) and not ctx.get(dut.error)

    sim.add_testbench(bench)
    sim.run()
    base = (1 * 4 + 2) * 4
    assert writes == [(base, 0b11), (base + 2, 0b11)]
