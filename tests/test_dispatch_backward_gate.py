# amaranth: UnusedElaboratable=no
"""The dispatch_backward_gate unit on its emitted Verilog (every case on Verilator's fast path;
a few also through the cocotb bench in Verilator and Icarus), with and without random
valid/ready stalls on every stream and read port, scored bit for bit against
golden.dispatch_backward_gate (the lane/tree order) with a scoreboard over both read logs and
the result stream, exact stall-free cycle counts; the float64 error of the hardware's sums;
parameter and input errors; a reset in the middle of a run (Amaranth simulator)."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from moe_hw.blocks.block_fifo import BLOCK_FIFO_LATENCY
from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.formats import to_bits
from moe_hw.golden.testing import random_floats
from moe_hw.problems import routed_locations
from moe_hw.host.checks import HostError
from moe_hw.host.dispatch_backward_gate import UNIT, float64_error
from moe_hw.host.unit import BenchShape, run
from moe_hw.params import ParameterError
from moe_hw.units.dispatch_backward_gate import (DispatchBackwardGateParams,
                                                 DispatchBackwardGateUnit)

from conftest import SIM, STALLS, simulator_cases

# One design for every case (one fast-path and one cocotb Verilator build).
PARAMS = DispatchBackwardGateParams(format="fp32", lanes=4, max_tokens=64, max_top_k=2,
                                    max_hidden=64, max_capacity=32, max_experts=8)
LATENCY = 2


def problem(seed, *, tokens, hidden, experts, capacity, k=1, dtype=np.float32, specials=0.0,
            index_range=None, location_range=None, allowed=None):
    """A random backward-gate problem; locations from compute_locations unless ranges are
    given; ``allowed`` restricts the experts chosen."""
    rng = np.random.default_rng(seed)
    if index_range is not None:
        indices = rng.integers(*index_range, (k, tokens))
    elif allowed is not None:
        indices = rng.choice(allowed, (k, tokens))
    else:
        indices = rng.integers(0, max(experts, 1), (k, tokens))
    locations = routed_locations(rng, indices, experts, location_range)
    return dict(input=random_floats(rng, (tokens, hidden), dtype, specials=specials),
                indices=indices, locations=locations,
                grad_dispatch=random_floats(rng, (experts * capacity, hidden), dtype,
                                            specials=specials),
                num_experts=experts, capacity=capacity)


CASES = {
    # DUET toy scale: S=21, E=6, k=1, H=L=16, every token fits.
    "duet_toy": dict(tokens=21, hidden=16, experts=6, capacity=21),
    # top-2 with capacity drops; H not a multiple of the lanes; 74 pairs: a partial last
    # group.
    "random_k2_drops": dict(tokens=37, hidden=29, experts=5, capacity=9, k=2),
    # Out-of-range and negative indices and locations.
    "out_of_range": dict(tokens=40, hidden=7, experts=6, capacity=5, k=2,
                         index_range=(-3, 9), location_range=(-2, 8)),
    # NaN, Inf, subnormals and -0.0 in input and grad_dispatch.
    "special_values": dict(tokens=24, hidden=13, experts=4, capacity=8, k=2, specials=0.4),
    # H below the lanes: one beat per pair, a group every G cycles.
    "one_beat": dict(tokens=9, hidden=3, experts=3, capacity=4, k=2),
    # One pair (P = 1: the last-pair flag is set at the begin).
    "one_pair": dict(tokens=1, hidden=5, experts=2, capacity=1),
    # One token, top-2: the token row wraps at every pair.
    "one_token": dict(tokens=1, hidden=6, experts=4, capacity=1, k=2),
    # Experts 1, 2, 4, 5 get no token.
    "empty_experts": dict(tokens=12, hidden=10, experts=6, capacity=12, allowed=[0, 3]),
    # Zero-element problems: no pairs; no hidden (every result +0.0); no capacity (every pair
    # dropped, every result +0.0).
    "zero_tokens": dict(tokens=0, hidden=8, experts=2, capacity=4, k=2),
    "zero_hidden": dict(tokens=8, hidden=0, experts=2, capacity=8),
    "zero_capacity": dict(tokens=8, hidden=12, experts=2, capacity=0, k=2),
}


def case_problem(name):
    prob = problem(sorted(CASES).index(name), **CASES[name])
    if name == "out_of_range":     # the extremes of the 32-bit fields, too
        prob["indices"][0, :4] = [-(1 << 31), (1 << 31) - 1, 6, -1]
        prob["locations"][1, :4] = [(1 << 31) - 1, -(1 << 31), 5, -1]
    return prob


def check(prob, *, params=PARAMS, sim=SIM, stall=0.0, seed=5, memory_latency=LATENCY):
    """One run, scored: bit-exact results, one per pair in order, read scoreboards, the
    dropped count, and (stall-free) the exact cycle count."""
    inputs = {name: prob[name] for name in UNIT.inputs}
    settings = {"num_experts": prob["num_experts"], "capacity": prob["capacity"],
                "memory_latency": memory_latency}
    outcome = run(UNIT, inputs, settings, params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        assert outcome.cycles == outcome.expected_cycles
    return outcome


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, name", simulator_cases(
    CASES, cocotb=["duet_toy", "out_of_range", "zero_tokens"]))
def test_backward_gate_cases(sim, name, stall):
    outcome = check(case_problem(name), sim=sim, stall=stall)
    if name == "zero_tokens" and stall == 0.0:
        assert outcome.cycles == EMPTY_CYCLES, "a problem without pairs must finish at once"
    if name == "zero_capacity":
        assert outcome.outputs["dropped"] == 16
    if name == "duet_toy":
        if stall == 0.0:     # whole groups: one beat per pair plus the documented constant
            assert outcome.cycles == PARAMS.cycles(21, 16, LATENCY)
        # A valid pair's gradient is a real dot product: not all zeros.
        assert np.count_nonzero(outcome.outputs["grad_gates"]) > 0


def test_cycle_formula_whole_groups_and_latencies():
    """P a multiple of G: exactly P * B + overhead; other read latencies move the constant."""
    g = PARAMS.interleave
    for latency in (1, LATENCY, 6):
        for tokens, hidden in ((2 * g, 16), (3 * g, 9), (g, 1)):
            prob = problem(latency * 100 + hidden, tokens=tokens, hidden=hidden, experts=4,
                           capacity=min(2 * tokens, PARAMS.max_capacity))
            outcome = check(prob, memory_latency=latency)
            assert outcome.cycles == (tokens * -(-hidden // PARAMS.lanes) +
                                      PARAMS.overhead(latency)), (tokens, hidden, latency)


@pytest.mark.parametrize("latency, bram", [(40, "generic"), (40, "ecp5"), (1, "generic")])
def test_backward_gate_deep_descriptor_queue(latency, bram):
    """64 items in flight (behind AXI masters 256): the descriptors then wait in a block RAM
    FIFO, whose head comes 6 cycles after an item's issue. Bit-exact; stall-free exactly
    the formula's cycles, where a quicker memory's join waits for the FIFO instead (a whole
    number of groups: P * B + overhead, with the FIFO's latency in the join)."""
    params = dataclasses.replace(PARAMS, max_outstanding=64, bram=bram)
    g = params.interleave
    prob = problem(latency + 7, tokens=2 * g, hidden=16, experts=4, capacity=2 * g)
    outcome = check(prob, params=params, memory_latency=latency)
    assert outcome.cycles == 2 * g * 4 + params.overhead(latency)
    assert params.deep_descriptors and params.descriptor_latency == BLOCK_FIFO_LATENCY
    assert params.join_delay(latency) == max(BLOCK_FIFO_LATENCY, 1 + latency)
    check(case_problem("random_k2_drops"), params=params, memory_latency=latency)
    check(case_problem("out_of_range"), params=params, memory_latency=latency, stall=0.3)


@pytest.mark.parametrize("stall", STALLS)
def test_backward_gate_fp16_one_lane(stall):
    """Another format (its own adder depth, hence interleave G) and no adder tree (one
    lane)."""
    params = DispatchBackwardGateParams(format="fp16", lanes=1, max_tokens=32, max_top_k=2,
                                        max_hidden=16, max_capacity=16, max_experts=4)
    for tokens, hidden, k in ((11, 5, 2), (7, 1, 1), (10, 16, 2)):
        check(problem(hidden, tokens=tokens, hidden=hidden, experts=4, capacity=6, k=k,
                      dtype=np.float16, specials=0.2), params=params, stall=stall)


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("add_stages", [1, 2])
def test_backward_gate_short_adder(add_stages, stall):
    """The shortest groups: G = 2 (the group table written at the issue) and G = 3 (written a
    cycle later, read again two items on)."""
    params = DispatchBackwardGateParams(format="bf16", lanes=2, max_tokens=16, max_top_k=2,
                                        max_hidden=8, max_capacity=16, max_experts=4,
                                        add_stages=add_stages)
    assert params.interleave == add_stages + 1
    for tokens, hidden, k in ((9, 7, 2), (5, 1, 1), (16, 8, 2)):
        check(problem(hidden + add_stages, tokens=tokens, hidden=hidden, experts=4,
                      capacity=6, k=k, dtype=ml_dtypes.bfloat16, specials=0.2),
              params=params, stall=stall)


def test_float64_error():
    """The hardware's sums against float64 dot products: the worst error relative to
    sum |x_j y_j| stays within the classical bound gamma_m of this order (m roundings on a
    product's path); with non-negative data (no cancellation) that bound holds for the plain
    relative error too."""
    worst = {"normal": 0.0, "positive": 0.0, "normalised": 0.0}
    for seed in range(4):
        prob = problem(1000 + seed, tokens=32, hidden=64, experts=4, capacity=16, k=2)
        positive = dict(prob, input=np.abs(prob["input"]),
                        grad_dispatch=np.abs(prob["grad_dispatch"]))
        for kind, case in (("normal", prob), ("positive", positive)):
            grad_gates = check(case).outputs["grad_gates"]
            error = float64_error(grad_gates, case["input"], case["indices"],
                                  case["locations"], case["grad_dispatch"],
                                  num_experts=case["num_experts"], capacity=case["capacity"],
                                  lanes=PARAMS.lanes)
            assert error["pairs"] > 0
            assert error["worst_normalised"] <= error["bound"], (kind, seed, error)
            worst[kind] = max(worst[kind], error["worst_relative"])
            worst["normalised"] = max(worst["normalised"], error["worst_normalised"])
            if kind == "positive":
                assert error["worst_relative"] <= error["bound"], (kind, seed, error)
    print(f"\nfloat64 check (H=64, lanes=4, fp32, bound gamma_m = {error['bound']:.3e}): "
          f"worst relative error {worst['normal']:.3e} (random signs), "
          f"{worst['positive']:.3e} (non-negative data); worst error / sum|x*y| "
          f"{worst['normalised']:.3e}")


def test_bench_problem_small():
    """The ``bench units`` problem at a small shape: bit-exact, the exact count, the ideal
    pairs * ceil(H / lanes), and the float64 error within its bound."""
    shape = BenchShape(tokens=16, hidden=20, experts=4, top_k=2, lanes=4)
    (inputs, settings), = UNIT.bench_problems(shape, seed=0).values()
    outcome = run(UNIT, inputs, settings, params=PARAMS)
    assert outcome.passed, outcome.problems
    assert outcome.cycles == outcome.expected_cycles
    assert outcome.ideal_cycles == 32 * 5
    error = float64_error(outcome.outputs["grad_gates"], *(inputs[name] for name in UNIT.inputs),
                          num_experts=settings["num_experts"], capacity=settings["capacity"],
                          lanes=PARAMS.lanes)
    assert error["pairs"] > 0 and error["worst_normalised"] <= error["bound"]


def test_backward_gate_input_errors():
    prob = problem(0, tokens=4, hidden=8, experts=2, capacity=4)
    inputs = {name: prob[name] for name in UNIT.inputs}
    sizes = {"num_experts": 2, "capacity": 4}

    def attempt(changes, settings=sizes, params=PARAMS):
        run(UNIT, {**inputs, **changes}, settings, params=params)

    with pytest.raises(HostError, match=r"grad_dispatch must have shape \(6, 8\)"):
        attempt({}, {"num_experts": 3, "capacity": 2})
    with pytest.raises(HostError, match="grad_dispatch has dtype float16, but input has"):
        attempt({"grad_dispatch": prob["grad_dispatch"].astype(np.float16)})
    with pytest.raises(HostError, match="input has 4 rows, but indices has S = 3"):
        attempt({"indices": prob["indices"][:, :3], "locations": prob["locations"][:, :3]})
    with pytest.raises(HostError, match="capacity must be a non-negative integer, not -1"):
        attempt({}, {"num_experts": 2, "capacity": -1})
    with pytest.raises(HostError, match="run-time value num_experts is missing"):
        attempt({}, {"capacity": 4})
    with pytest.raises(HostError, match="memory_latency must be at least 1, not 0"):
        attempt({}, {**sizes, "memory_latency": 0})
    with pytest.raises(HostError, match="lacks grad_dispatch"):
        run(UNIT, {name: prob[name] for name in UNIT.inputs[:3]}, sizes)
    big = problem(0, tokens=4, hidden=65, experts=2, capacity=4)
    with pytest.raises(HostError, match="hidden = 65 exceeds the unit's max_hidden of 64"):
        attempt({name: big[name] for name in UNIT.inputs})
    with pytest.raises(HostError, match="the problem needs max_hidden >= 65"):
        attempt({name: big[name] for name in UNIT.inputs}, {**sizes, "max_hidden": 64},
                params=None)
    bad = prob["indices"].copy()
    bad[0, 1] = 1 << 40
    with pytest.raises(HostError, match=r"indices.flat\[1\] = 1099511627776 does not fit"):
        attempt({"indices": bad})


@pytest.mark.parametrize("settings,message", [
    (dict(lanes=3), "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (dict(add_stages=0), "add_stages must be an integer between 1 and 16, not 0"),
    (dict(max_outstanding=12), "max_outstanding must be a power of two, not 12"),
    (dict(max_top_k=0), "max_top_k must be an integer between 1 and"),
    (dict(index_width=8, max_capacity=4096), "index_width must hold max_capacity"),
])
def test_backward_gate_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        DispatchBackwardGateParams(**settings)


def test_backward_gate_old_parameter_name():
    """``max_k`` is the old name of ``max_top_k`` (accepted, with a warning)."""
    with pytest.deprecated_call(match="'max_k' is deprecated"):
        params = UNIT.make_params({"max_k": 4})
    assert params.max_top_k == 4


def test_reset_mid_run_leaves_no_stale_output():
    """Amaranth simulator: a reset in the middle of a run returns the unit to idle (no
    request, no result, no status left), and a fresh run after it is correct."""
    params = DispatchBackwardGateParams(lanes=2, max_tokens=4, max_top_k=2, max_hidden=4,
                                        max_capacity=2, max_experts=2, max_outstanding=8)
    dut = DispatchBackwardGateUnit(params)
    top = Module()
    top.domains.sync = sync = ClockDomain()
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-6)
    two, three = (int(to_bits(np.float32(v), "fp32")) for v in (2.0, 3.0))

    async def start(ctx, tokens, top_k):
        for name, value in (("tokens", tokens), ("top_k", top_k), ("hidden", 2),
                            ("capacity", 2), ("num_experts", 2)):
            ctx.set(getattr(dut, name), value)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)

    async def bench(ctx):
        for port in (dut.grad_gate, dut.input_read, dut.grad_read):
            ctx.set(port.ready, 1)
        ctx.set(dut.header.valid, 1)
        ctx.set(dut.header.payload.index, 1)
        ctx.set(dut.header.payload.location, 1)
        for port, value in ((dut.input_data, two), (dut.grad_data, three)):
            ctx.set(port.valid, 1)
            ctx.set(port.payload.data[0], value)
            ctx.set(port.payload.data[1], value)
        await start(ctx, 4, 2)
        for _ in range(9):
            await ctx.tick()
        assert ctx.get(dut.busy)
        ctx.set(sync.rst, 1)
        await ctx.tick()
        ctx.set(sync.rst, 0)
        for _ in range(30):
            assert not ctx.get(dut.busy) and not ctx.get(dut.done)
            assert not ctx.get(dut.grad_gate.valid) and not ctx.get(dut.input_read.valid)
            assert not ctx.get(dut.grad_read.valid) and not ctx.get(dut.header.ready)
            assert not ctx.get(dut.input_data.ready) and ctx.get(dut.dropped) == 0
            await ctx.tick()
        await start(ctx, 1, 1)
        results = []
        for _ in range(80):
            if ctx.get(dut.grad_gate.valid):
                results.append(ctx.get(dut.grad_gate.payload.value))
            if ctx.get(dut.done):
                break
            await ctx.tick()
        assert ctx.get(dut.done) and not ctx.get(dut.error)
        assert results == [int(to_bits(np.float32(12.0), "fp32"))]     # 2*3 + 2*3

    sim.add_testbench(bench)
    sim.run()
