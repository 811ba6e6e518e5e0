"""Stream plumbing: the skid buffer in Amaranth's simulator and, as emitted Verilog, under cocotb
in Verilator and Icarus; with and without random valid/ready stalls."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from moe_hw.flows.simulate import simulate
from moe_hw.stream import SkidBuffer

from conftest import STALLS, simulator_params


def run_skid_pysim(items, p_valid, p_ready, seed):
    dut = SkidBuffer(16)
    rng = np.random.default_rng(seed)
    got, cycles = [], []

    async def producer(ctx):
        for item in items:
            while rng.random() < p_valid:
                await ctx.tick()
            ctx.set(dut.i.payload, item)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        cycle = 0
        while len(got) < len(items):
            ready = not rng.random() < p_ready
            ctx.set(dut.o.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if valid and ready:
                got.append(payload)
                cycles.append(cycle)
            cycle += 1
            assert cycle < 20 * len(items) + 100

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return got, cycles


@pytest.mark.parametrize("p", [0.0, 0.3, 0.7])
def test_skid_buffer_order(p):
    items = list(range(1, 301))
    got, cycles = run_skid_pysim(items, p, p, seed=4)
    assert got == items
    if p == 0.0:
        # Full throughput: one item per cycle after a one-cycle latency.
        assert cycles == list(range(1, len(items) + 1))


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim", simulator_params("verilator", "icarus"))
def test_skid_buffer_verilog(sim, stall):
    items = (np.arange(500, dtype=np.uint64) * 7919) % 4096
    result = simulate(SkidBuffer(12), "skid", "bench_passthrough", {"items": items}, sim=sim,
                      settings={"stall": stall, "seed": 3})
    assert list(result["items"]) == list(items)
    if stall == 0.0:
        assert result["cycles"] == len(items) + 2
