# amaranth: UnusedElaboratable=no
"""The combine_scatter unit on its emitted Verilog (cocotb, Verilator and Icarus), every case
with and without random valid/ready stalls on every stream and memory port, scored bit for bit
against golden.sparse_combine with a scoreboard over the read and write logs; adversarial slot
orders for the read-modify-write hazard with exact cycle counts; parameter and input errors;
a reset in the middle of a run (Amaranth simulator)."""

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from moe_hw import golden
from moe_hw.formats import to_bits
from moe_hw.golden.testing import random_floats
from moe_hw.host.combine_scatter import (adversarial_gates, benchmark_combine_scatter,
                                         gate_problem, run_combine_batch, run_combine_scatter,
                                         run_combine_slots, scatter_add_reference,
                                         score_combine_scatter)
from moe_hw.host.common import HostError
from moe_hw.params import ParameterError
from moe_hw.units.combine_scatter import CombineScatterParams, CombineScatterUnit

from conftest import STALLS, simulator_params

# One design for every case (one Verilator and one Icarus build).
PARAMS = CombineScatterParams(format="fp32", lanes=4, max_tokens=64, max_slots=256,
                              max_hidden=64)
LATENCY = 2


def top_k_gates(rng, tokens, experts, k, dtype=np.float32, *, specials=0.0, allowed=None):
    """A gate matrix with k routed experts per token (chosen among ``allowed``); with
    ``specials``, gate values include NaN, +Inf, subnormals, the maximum and +0.0 (the last
    meaning "not routed after all")."""
    allowed = np.arange(experts) if allowed is None else np.asarray(allowed)
    gates = np.zeros((tokens, experts), dtype=dtype)
    for i in range(tokens):
        chosen = rng.permutation(allowed)[:k]
        if specials:
            gates[i, chosen] = np.abs(random_floats(rng, len(chosen), dtype, specials=specials))
        else:
            gates[i, chosen] = rng.uniform(0.05, 1.0, len(chosen)).astype(dtype)
    return gates


def gate_case(name):
    """(gates, expert_out) of a named case; seeded by the name's position."""
    rng = np.random.default_rng(sorted(GATE_CASES).index(name))
    gates = GATE_CASES[name](rng)
    slots = int(np.count_nonzero(gates))
    hidden = HIDDEN[name]
    specials = 0.4 if name == "special_values" else 0.0
    return gates, random_floats(rng, (slots, hidden), gates.dtype, specials=specials)


GATE_CASES = {
    # DUET toy scale (seed 000): S=21, E=6, k=1, H=L=16.
    "duet_toy": lambda rng: top_k_gates(rng, 21, 6, 1),
    # The worked example of seed 000: batch_index [1,3,0,2], part sizes [1,1,2].
    "seed_example": lambda rng: np.array([[0, 0, .7], [.9, 0, 0], [0, 0, .5], [0, .8, 0]],
                                         dtype=np.float32),
    # top-2, H not a multiple of the lanes.
    "random_k2": lambda rng: top_k_gates(rng, 37, 5, 2),
    # NaN, +Inf, subnormal, max and +0.0 gates; NaN, +-Inf, subnormals, -0.0 in the data.
    "special_values": lambda rng: top_k_gates(rng, 24, 4, 2, specials=0.4),
    # Every token routed to every expert: each token comes back every 3 slots (2 beats each),
    # well inside the hazard window.
    "all_experts": lambda rng: rng.uniform(0.05, 1, (3, 6)).astype(np.float32),
    # One token, routed to every expert: the same token on every slot, back to back.
    "one_token_all_experts": lambda rng: rng.uniform(0.05, 1, (1, 7)).astype(np.float32),
    # Sliding windows: the last token of expert e is the first of expert e + 1.
    "back_to_back": lambda rng: adversarial_gates(6, 5),
    # Experts 0, 2, 3, 5, 6, 7 get no token; tokens 0 and 5 are not routed at all.
    "empty_experts": lambda rng: np.where(np.isin(np.arange(12), [0, 5])[:, None], 0,
                                          top_k_gates(rng, 12, 8, 2, allowed=[1, 4])),
    # Zero-element problems.
    "zero_tokens": lambda rng: np.zeros((0, 4), dtype=np.float32),
    "zero_hidden": lambda rng: top_k_gates(rng, 8, 3, 2),
}
HIDDEN = {"duet_toy": 16, "seed_example": 5, "random_k2": 29, "special_values": 13,
          "all_experts": 7, "one_token_all_experts": 6, "back_to_back": 3,
          "empty_experts": 10, "zero_tokens": 12, "zero_hidden": 0}


def slot_case(name):
    rng = np.random.default_rng(100 + sorted(SLOT_CASES).index(name))
    tokens, order, hidden = SLOT_CASES[name](rng)
    order = np.asarray(order, dtype=np.int64)
    return dict(batch_index=order,
                nonzero_gates=random_floats(rng, order.size, np.float32, specials=0.2),
                expert_out=random_floats(rng, (order.size, hidden), np.float32, specials=0.2),
                tokens=tokens)


SLOT_CASES = {
    # The SAME token on every slot, back to back: one beat per slot (every slot waits the
    # whole hazard window) and three beats per slot.
    "same_token_one_beat": lambda rng: (5, [2] * 12, 4),
    "same_token_three_beats": lambda rng: (5, [3] * 8, 9),
    # Pairs of repeats, then a random order with repeats at every distance.
    "pairs_back_to_back": lambda rng: (6, np.repeat(rng.permutation(6), 2), 5),
    "random_repeats": lambda rng: (4, rng.integers(0, 4, 40), 6),
    # Out-of-range tokens (negative, S, huge) are dropped, the last slot among them.
    "out_of_range_tokens": lambda rng: (5, [1, -1, 5, 1, (1 << 31) - 1, -(1 << 31), 4, 1, 7],
                                        7),
}


def all_cases():
    """Every case as a (name, problem, golden result or None) triple."""
    cases = []
    for name in GATE_CASES:
        gates, expert_out = gate_case(name)
        cases.append((name, gate_problem(gates, expert_out),
                      golden.sparse_combine(gates, expert_out)))
    for name in SLOT_CASES:
        cases.append((name, slot_case(name), None))
    return cases


def check_batch(cases, sim, stall, *, params=PARAMS, seed=5, read_latency=LATENCY):
    """Run the cases back to back in one simulation; score every one (bit-exact result,
    read/write scoreboard, exact stall-free cycles). Returns the runs by name."""
    runs = run_combine_batch([problem for _, problem, _ in cases], params=params, sim=sim,
                             stall=stall, seed=seed, read_latency=read_latency)
    failures = []
    for (name, problem, want), run in zip(cases, runs):
        problems = score_combine_scatter(run, problem["batch_index"],
                                         problem["nonzero_gates"], problem["expert_out"],
                                         tokens=problem["tokens"], lanes=params.lanes,
                                         want=want)
        if stall == 0.0 and run.cycles != run.expected_cycles:
            problems.append(f"{run.cycles} cycles, expected exactly {run.expected_cycles}")
        failures += [f"{name}: {problem}" for problem in problems]
    assert not failures, "\n".join(failures)
    return {name: run for (name, _, _), run in zip(cases, runs)}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim", simulator_params("verilator", "icarus"))
def test_combine_scatter_cases(sim, stall):
    """Every gate-matrix case and every hand-made slot order, bit-exact, scoreboarded, with
    exact stall-free cycle counts."""
    runs = check_batch(all_cases(), sim, stall)
    if stall == 0.0:
        assert runs["zero_tokens"].cycles == runs["zero_hidden"].cycles == 1
        assert runs["out_of_range_tokens"].dropped == 5


def test_hazard_cost_is_exact():
    """Back-to-back repeats of one token cost exactly ``hazard_window - beats`` cycles each;
    a hazard-free order (k = 1: every token once) runs at one beat per cycle; the memory's
    read latency moves only the constant and the hazard window. Closed-form counts."""
    rng = np.random.default_rng(7)
    cases, expected = [], []
    for latency in (LATENCY, 1, 7):
        window = PARAMS.hazard_window(latency)
        for hidden in (4, 9, 4 * window):
            slots = 6
            problem = dict(batch_index=np.full(slots, 1),
                           nonzero_gates=rng.uniform(0.1, 1, slots).astype(np.float32),
                           expert_out=rng.standard_normal((slots, hidden)).astype(np.float32),
                           tokens=3, read_latency=latency)
            cases.append((f"repeat H={hidden} latency={latency}", problem, None))
            beats = -(-hidden // PARAMS.lanes)
            expected.append(PARAMS.cycles(slots, hidden, latency) +
                            (slots - 1) * max(0, window - beats))
        gates, expert_out = gate_case("duet_toy")
        cases.append((f"duet_toy latency={latency}",
                      {**gate_problem(gates, expert_out), "read_latency": latency},
                      golden.sparse_combine(gates, expert_out)))
        expected.append(21 * 4 + PARAMS.overhead(latency))
    runs = check_batch(cases, "verilator", 0.0)
    assert [run.cycles for run in runs.values()] == expected


@pytest.mark.parametrize("stall", STALLS)
def test_combine_scatter_bf16_lanes8(stall):
    params = CombineScatterParams(format="bf16", lanes=8, max_tokens=32, max_slots=64,
                                  max_hidden=32)
    rng = np.random.default_rng(3)
    cases = []
    for hidden in (21, 8, 3):
        gates = top_k_gates(rng, 13, 4, 2, dtype=ml_dtypes.bfloat16, specials=0.2)
        expert_out = random_floats(rng, (int(np.count_nonzero(gates)), hidden),
                                   ml_dtypes.bfloat16, specials=0.3)
        cases.append((f"bf16 H={hidden}", gate_problem(gates, expert_out),
                      golden.sparse_combine(gates, expert_out)))
    check_batch(cases, "verilator", stall, params=params)


def test_reference_is_the_golden_loop():
    """scatter_add_reference (any slot order) equals golden.sparse_combine on gate matrices,
    including the seed's worked example and rows of shape (L, 1)."""
    for name in GATE_CASES:
        gates, expert_out = gate_case(name)
        batch_index, _, nonzero_gates = golden.sparse_dispatch_indices(gates)
        got = scatter_add_reference(batch_index, nonzero_gates, expert_out,
                                    tokens=gates.shape[0])
        want = golden.sparse_combine(gates, expert_out)
        assert np.array_equal(to_bits(got, "fp32"), to_bits(want, "fp32")), name
    gates, _ = gate_case("seed_example")
    assert golden.sparse_dispatch_indices(gates)[0].tolist() == [1, 3, 0, 2]


def test_benchmark_function_small():
    result = benchmark_combine_scatter(tokens=8, hidden=12, experts=4, k=2, lanes=4,
                                       params=PARAMS)
    window = PARAMS.hazard_window(LATENCY)
    for order in ("random", "back_to_back", "back_to_back_short", "all_experts"):
        row = result[order]
        assert row["passed"], row["problems"]
        assert row["cycles"] == row["expected_cycles"]
    assert result["back_to_back_short"]["hazard_stalls"] == 8 * (window - 1)
    assert result["random"]["efficiency"] <= 1.0


def test_combine_scatter_rows_keep_their_shape():
    """expert_out rows of shape (L, 1) (the DUET toy's) come back as [S, L, 1]."""
    rng = np.random.default_rng(9)
    gates = top_k_gates(rng, 5, 3, 1)
    expert_out = rng.standard_normal((5, 6, 1)).astype(np.float32)
    run = run_combine_scatter(gates, expert_out, params=PARAMS)
    assert run.combined.shape == (5, 6, 1)
    assert np.array_equal(to_bits(run.combined, "fp32"),
                          to_bits(golden.sparse_combine(gates, expert_out), "fp32"))


def test_combine_scatter_input_errors():
    gates = np.array([[0.5, 0.0], [0.0, 0.25]], dtype=np.float32)
    out = np.ones((2, 4), dtype=np.float32)
    with pytest.raises(HostError, match=r"gates must be non-negative.*at \[1, 1\]"):
        run_combine_scatter(np.array([[0.5, 0], [0, -1]], np.float32), out, params=PARAMS)
    with pytest.raises(HostError, match="expert_out has dtype float16, but gates has float32"):
        run_combine_scatter(gates, out.astype(np.float16), params=PARAMS)
    with pytest.raises(HostError, match="expert_out has 3 rows, but there are 2 slots"):
        run_combine_scatter(gates, np.ones((3, 4), np.float32), params=PARAMS)
    with pytest.raises(HostError, match="hidden = 65 exceeds the unit's maximum of 64"):
        run_combine_scatter(gates, np.ones((2, 65), np.float32), params=PARAMS)
    with pytest.raises(HostError, match=r"batch_index\[1\] = 4294967296 does not fit"):
        run_combine_slots([0, 1 << 32], np.ones(2, np.float32), out, tokens=2, params=PARAMS)


@pytest.mark.parametrize("settings,message", [
    (dict(lanes=3), "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (dict(max_inflight=12), "max_inflight must be a power of two, not 12"),
    (dict(max_slots=0), "max_slots must be an integer between 1 and"),
    (dict(add_stages="deep"), "add_stages must be an integer, not 'deep'"),
    (dict(index_width=8, max_tokens=4096), "Index width must hold max_tokens"),
])
def test_combine_scatter_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        CombineScatterParams(**settings)


def test_reset_mid_run_leaves_no_stale_output():
    """Amaranth simulator: a reset in the middle of a run returns the unit to idle (no
    request, no write, no status left), and a fresh run after it is correct."""
    params = CombineScatterParams(lanes=2, max_tokens=4, max_slots=8, max_hidden=4,
                                  max_inflight=8)
    dut = CombineScatterUnit(params)
    top = Module()
    top.domains.sync = sync = ClockDomain()
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-6)
    two, half = (int(to_bits(np.float32(v), "fp32")) for v in (2.0, 0.5))

    async def start(ctx, slots):
        ctx.set(dut.tokens, 4)
        ctx.set(dut.slots, slots)
        ctx.set(dut.hidden, 2)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)

    async def bench(ctx):
        ctx.set(dut.write.ready, 1)
        ctx.set(dut.read.ready, 1)
        ctx.set(dut.header.valid, 1)
        ctx.set(dut.header.payload.token, 3)
        ctx.set(dut.header.payload.gate, half)
        ctx.set(dut.data.valid, 1)
        ctx.set(dut.data.payload.data[0], two)
        ctx.set(dut.data.payload.data[1], two)
        ctx.set(dut.read_data.valid, 1)          # the buffer reads +0.0
        await start(ctx, 8)
        for _ in range(10):
            await ctx.tick()
        assert ctx.get(dut.busy)
        ctx.set(sync.rst, 1)
        await ctx.tick()
        ctx.set(sync.rst, 0)
        for _ in range(20):
            assert not ctx.get(dut.busy) and not ctx.get(dut.done)
            assert not ctx.get(dut.write.valid) and not ctx.get(dut.read.valid)
            assert not ctx.get(dut.header.ready) and not ctx.get(dut.data.ready)
            assert not ctx.get(dut.read_data.ready) and ctx.get(dut.dropped) == 0
            await ctx.tick()
        await start(ctx, 1)
        writes = []
        for _ in range(40):
            if ctx.get(dut.write.valid):
                writes.append((ctx.get(dut.write.payload.addr),
                               ctx.get(dut.write.payload.data[0])))
            if ctx.get(dut.done):
                break
            await ctx.tick()
        assert ctx.get(dut.done) and not ctx.get(dut.error)
        one = int(to_bits(np.float32(1.0), "fp32"))
        assert writes == [(6, one)]

    sim.add_testbench(bench)
    sim.run()
