# amaranth: UnusedElaboratable=no
"""The dispatch_backward_gate unit on its emitted Verilog (cocotb, Verilator and Icarus),
every case with and without random valid/ready stalls on every stream and read port, scored
bit for bit against golden.dispatch_backward_gate (the lane/tree order) with a scoreboard
over both read logs and the result stream, exact stall-free cycle counts; the float64 error
of the hardware's sums; parameter and input errors; a reset in the middle of a run (Amaranth
simulator)."""

import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from moe_hw import golden
from moe_hw.formats import to_bits
from moe_hw.golden.testing import random_floats
from moe_hw.host.backward_gate import (benchmark_backward_gate, float64_error,
                                       run_backward_gate, run_backward_gate_batch,
                                       score_backward_gate)
from moe_hw.host.common import HostError
from moe_hw.params import ParameterError
from moe_hw.units.dispatch_backward_gate import BackwardGateParams, DispatchBackwardGateUnit

from conftest import STALLS, simulator_params

# One design for every case (one Verilator and one Icarus build).
PARAMS = BackwardGateParams(format="fp32", lanes=4, max_tokens=64, max_top_k=2, max_hidden=64,
                            max_capacity=32, max_experts=8)
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
    if location_range is None:
        locations = golden.compute_locations(np.clip(indices, 0, max(experts - 1, 0)),
                                             num_experts=max(experts, 1)).astype(np.int64)
    else:
        locations = rng.integers(*location_range, (k, tokens))
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


def check_batch(cases, sim, stall, *, params=PARAMS, seed=5, read_latency=LATENCY):
    """Run the named problems back to back in one simulation and score every one: bit-exact
    results, one per pair in order, read scoreboards, the dropped count, exact stall-free
    cycles. Returns the runs by name."""
    runs = run_backward_gate_batch(list(cases.values()), params=params, sim=sim, stall=stall,
                                   seed=seed, read_latency=read_latency)
    failures = []
    for (name, prob), run in zip(cases.items(), runs):
        problems = score_backward_gate(run, prob["input"], prob["indices"], prob["locations"],
                                       prob["grad_dispatch"], num_experts=prob["num_experts"],
                                       capacity=prob["capacity"], lanes=params.lanes,
                                       interleave=params.interleave)
        if stall == 0.0 and run.cycles != run.expected_cycles:
            problems.append(f"{run.cycles} cycles, expected exactly {run.expected_cycles}")
        failures += [f"{name}: {problem}" for problem in problems]
    assert not failures, "\n".join(failures)
    return dict(zip(cases, runs))


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim", simulator_params("verilator", "icarus"))
def test_backward_gate_cases(sim, stall):
    runs = check_batch({name: case_problem(name) for name in CASES}, sim, stall)
    if stall == 0.0:
        assert runs["zero_tokens"].cycles == 1, "a problem without pairs must finish at once"
        assert runs["zero_capacity"].dropped == 16
        # Whole groups: one beat per pair plus the documented constant.
        duet = runs["duet_toy"]
        assert duet.cycles == PARAMS.cycles(21, 16, LATENCY)
    # A valid pair's gradient is a real dot product: not all zeros.
    assert np.count_nonzero(runs["duet_toy"].grad_gates) > 0


def test_cycle_formula_whole_groups_and_latencies():
    """P a multiple of G: exactly P * B + overhead; other read latencies move the constant."""
    g = PARAMS.interleave
    cases, expected = {}, []
    for latency in (1, LATENCY, 6):
        for tokens, hidden in ((2 * g, 16), (3 * g, 9), (g, 1)):
            prob = problem(latency * 100 + hidden, tokens=tokens, hidden=hidden, experts=4,
                           capacity=2 * tokens)
            cases[f"S={tokens} H={hidden} latency={latency}"] = {**prob,
                                                                  "read_latency": latency}
            expected.append(tokens * -(-hidden // PARAMS.lanes) + PARAMS.overhead(latency))
    runs = check_batch(cases, "verilator", 0.0)
    assert [run.cycles for run in runs.values()] == expected


@pytest.mark.parametrize("stall", STALLS)
def test_backward_gate_fp16_one_lane(stall):
    """Another format and interleave (fp16: G = 3) and no adder tree (one lane)."""
    params = BackwardGateParams(format="fp16", lanes=1, max_tokens=32, max_top_k=2,
                                max_hidden=16, max_capacity=16, max_experts=4)
    cases = {f"fp16 H={hidden} k={k}": problem(hidden, tokens=tokens, hidden=hidden, experts=4,
                                               capacity=6, k=k, dtype=np.float16,
                                               specials=0.2)
             for tokens, hidden, k in ((11, 5, 2), (7, 1, 1), (10, 16, 2))}
    check_batch(cases, "verilator", stall, params=params)


def test_float64_error():
    """The hardware's sums against float64 dot products: the worst error relative to
    sum |x_j y_j| stays within the classical bound gamma_m of this order (m roundings on a
    product's path); with non-negative data (no cancellation) that bound holds for the plain
    relative error too."""
    cases = {}
    for seed in range(4):
        prob = problem(1000 + seed, tokens=32, hidden=64, experts=4, capacity=16, k=2)
        cases[f"normal {seed}"] = prob
        positive = dict(prob, input=np.abs(prob["input"]),
                        grad_dispatch=np.abs(prob["grad_dispatch"]))
        cases[f"positive {seed}"] = positive
    runs = check_batch(cases, "verilator", 0.0)
    worst = {"normal": 0.0, "positive": 0.0, "normalised": 0.0}
    for name, run in runs.items():
        prob = cases[name]
        error = float64_error(run.grad_gates, prob["input"], prob["indices"],
                              prob["locations"], prob["grad_dispatch"],
                              num_experts=prob["num_experts"], capacity=prob["capacity"],
                              lanes=PARAMS.lanes)
        assert error["pairs"] > 0
        assert error["worst_normalised"] <= error["bound"], (name, error)
        kind = name.split()[0]
        worst[kind] = max(worst[kind], error["worst_relative"])
        worst["normalised"] = max(worst["normalised"], error["worst_normalised"])
        if kind == "positive":
            assert error["worst_relative"] <= error["bound"], (name, error)
    print(f"\nfloat64 check (H=64, lanes=4, fp32, bound gamma_m = {error['bound']:.3e}): "
          f"worst relative error {worst['normal']:.3e} (random signs), "
          f"{worst['positive']:.3e} (non-negative data); worst error / sum|x*y| "
          f"{worst['normalised']:.3e}")


def test_benchmark_function_small():
    row = benchmark_backward_gate(tokens=16, hidden=20, experts=4, k=2, params=PARAMS)
    assert row["passed"], row["problems"]
    assert row["cycles"] == row["expected_cycles"]
    assert row["ideal_cycles"] == 32 * 5
    assert row["float64"]["worst_normalised"] <= row["float64"]["bound"]


def test_backward_gate_input_errors():
    prob = problem(0, tokens=4, hidden=8, experts=2, capacity=4)
    args = (prob["input"], prob["indices"], prob["locations"], prob["grad_dispatch"])
    with pytest.raises(HostError, match=r"grad_dispatch must have shape \(6, 8\)"):
        run_backward_gate(*args, num_experts=3, capacity=2, params=PARAMS)
    with pytest.raises(HostError, match="grad_dispatch has dtype float16, but input has"):
        run_backward_gate(*args[:3], prob["grad_dispatch"].astype(np.float16), num_experts=2,
                          capacity=4, params=PARAMS)
    with pytest.raises(HostError, match="input has 4 rows, but indices has S = 3"):
        run_backward_gate(prob["input"], prob["indices"][:, :3], prob["locations"][:, :3],
                          prob["grad_dispatch"], num_experts=2, capacity=4, params=PARAMS)
    with pytest.raises(HostError, match="capacity must be a non-negative integer, not -1"):
        run_backward_gate(*args, num_experts=2, capacity=-1, params=PARAMS)
    big = problem(0, tokens=4, hidden=65, experts=2, capacity=4)
    with pytest.raises(HostError, match="hidden = 65 exceeds the unit's maximum of 64"):
        run_backward_gate(big["input"], big["indices"], big["locations"],
                          big["grad_dispatch"], num_experts=2, capacity=4, params=PARAMS)
    bad = prob["indices"].copy()
    bad[0, 1] = 1 << 40
    with pytest.raises(HostError, match=r"indices.flat\[1\] = 1099511627776 does not fit"):
        run_backward_gate(prob["input"], bad, prob["locations"], prob["grad_dispatch"],
                          num_experts=2, capacity=4, params=PARAMS)


@pytest.mark.parametrize("settings,message", [
    (dict(lanes=3), "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (dict(add_stages=0), "add_stages must be an integer between 1 and 8, not 0"),
    (dict(max_outstanding=12), "max_outstanding must be a power of two, not 12"),
    (dict(max_top_k=0), "max_top_k must be an integer between 1 and"),
    (dict(index_width=8, max_capacity=4096), "Index width must hold max_capacity"),
])
def test_backward_gate_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        BackwardGateParams(**settings)


def test_reset_mid_run_leaves_no_stale_output():
    """Amaranth simulator: a reset in the middle of a run returns the unit to idle (no
    request, no result, no status left), and a fresh run after it is correct."""
    params = BackwardGateParams(lanes=2, max_tokens=4, max_top_k=2, max_hidden=4,
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
