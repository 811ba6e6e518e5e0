# amaranth: UnusedElaboratable=no
"""The combine_scatter unit on its emitted Verilog (every case on Verilator's fast path; a few
also through the cocotb bench in Verilator and Icarus), with and without random valid/ready
stalls on every stream and memory port, scored bit for bit against golden.sparse_combine with a
scoreboard over the read and write logs; adversarial slot orders for the read-modify-write
hazard with exact cycle counts; parameter and input errors; a reset in the middle of a run
(Amaranth simulator)."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw import golden
from moe_hw.formats import to_bits
from moe_hw.golden.testing import random_floats
from moe_hw.host.checks import HostError
from moe_hw.host.combine_scatter import UNIT, topk_gates, scatter_add_reference
from moe_hw.host.unit import BenchShape, run
from moe_hw.params import ParameterError
from moe_hw.units.combine_scatter import CombineScatterParams, CombineScatterUnit

from conftest import SIM, STALLS, simulator_cases

# One design for every case (one fast-path and one cocotb Verilator build), the hazard test's
# too: its rows reach lanes * hazard window (4 * 32) elements.
PARAMS = CombineScatterParams(format="fp32", lanes=4, max_tokens=64, max_slots=256,
                              max_hidden=128)
LATENCY = 2


def adversarial_gates(tokens, experts, dtype=np.float32, seed=0):
    """A gate matrix whose slot order repeats a token on back-to-back slots at every expert
    boundary: expert e takes tokens e .. e + tokens - experts (a sliding window), so the last
    token of expert e is the first of expert e + 1 whenever the window is one token wide, and
    with ``tokens == 1`` every slot is the same token."""
    rng = np.random.default_rng(seed)
    gates = np.zeros((tokens, experts), dtype=dtype)
    width = max(1, tokens - experts + 1)
    for e in range(experts):
        first = min(e, tokens - 1)
        gates[first:first + width, e] = rng.uniform(0.1, 1.0, min(width, tokens - first))
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
    "duet_toy": lambda rng: topk_gates(rng, 21, 6, 1),
    # The worked example of seed 000: batch_index [1,3,0,2], part sizes [1,1,2].
    "seed_example": lambda rng: np.array([[0, 0, .7], [.9, 0, 0], [0, 0, .5], [0, .8, 0]],
                                         dtype=np.float32),
    # top-2, H not a multiple of the lanes.
    "random_k2": lambda rng: topk_gates(rng, 37, 5, 2),
    # NaN, +Inf, subnormal, max and +0.0 gates; NaN, +-Inf, subnormals, -0.0 in the data.
    "special_values": lambda rng: topk_gates(rng, 24, 4, 2, specials=0.4),
    # Every token routed to every expert: each token comes back every 3 slots (2 beats each),
    # well inside the hazard window.
    "all_experts": lambda rng: rng.uniform(0.05, 1, (3, 6)).astype(np.float32),
    # One token, routed to every expert: the same token on every slot, back to back.
    "one_token_all_experts": lambda rng: rng.uniform(0.05, 1, (1, 7)).astype(np.float32),
    # Sliding windows: the last token of expert e is the first of expert e + 1.
    "back_to_back": lambda rng: adversarial_gates(6, 5),
    # Experts 0, 2, 3, 5, 6, 7 get no token; tokens 0 and 5 are not routed at all.
    "empty_experts": lambda rng: np.where(np.isin(np.arange(12), [0, 5])[:, None], 0,
                                          topk_gates(rng, 12, 8, 2, allowed=[1, 4])),
    # Zero-element problems.
    "zero_tokens": lambda rng: np.zeros((0, 4), dtype=np.float32),
    "zero_hidden": lambda rng: topk_gates(rng, 8, 3, 2),
}
HIDDEN = {"duet_toy": 16, "seed_example": 5, "random_k2": 29, "special_values": 13,
          "all_experts": 7, "one_token_all_experts": 6, "back_to_back": 3,
          "empty_experts": 10, "zero_tokens": 12, "zero_hidden": 0}


def slot_case(name):
    """(inputs, settings) of a hand-made slot order."""
    rng = np.random.default_rng(100 + sorted(SLOT_CASES).index(name))
    tokens, order, hidden = SLOT_CASES[name](rng)
    order = np.asarray(order, dtype=np.int64)
    return ({"batch_index": order,
             "nonzero_gates": random_floats(rng, order.size, np.float32, specials=0.2),
             "expert_out": random_floats(rng, (order.size, hidden), np.float32, specials=0.2)},
            {"tokens": tokens})


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


def case(name):
    """(inputs, settings) of any named case."""
    if name in SLOT_CASES:
        return slot_case(name)
    gates, expert_out = gate_case(name)
    return {"gates": gates, "expert_out": expert_out}, {}


def check(inputs, settings, *, params=PARAMS, sim=SIM, stall=0.0, seed=5):
    """One run, scored: bit-exact against golden.sparse_combine (or the golden loop for a
    hand-made order), read/write scoreboard, and (stall-free) the exact cycle count."""
    outcome = run(UNIT, inputs, settings, params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        assert outcome.cycles == outcome.expected_cycles
    return outcome


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, name", simulator_cases(
    [*GATE_CASES, *SLOT_CASES],
    cocotb=["seed_example", "same_token_one_beat", "out_of_range_tokens", "zero_tokens"]))
def test_combine_scatter_cases(sim, name, stall):
    """Every gate-matrix case and every hand-made slot order, bit-exact, scoreboarded, with
    exact stall-free cycle counts."""
    outcome = check(*case(name), sim=sim, stall=stall)
    if stall == 0.0 and name in ("zero_tokens", "zero_hidden"):
        assert outcome.cycles == EMPTY_CYCLES
    if name == "out_of_range_tokens":
        assert int(outcome.results["dropped"]) == 5


def test_hazard_cost_is_exact():
    """Back-to-back repeats of one token cost exactly ``hazard_window - beats`` cycles each;
    a hazard-free order (k = 1: every token once) runs at one beat per cycle; the memory's
    read latency moves only the constant and the hazard window. Closed-form counts."""
    rng = np.random.default_rng(7)
    # H up to lanes * window: a row as long as the hazard window never waits.
    params = PARAMS
    assert params.max_hidden == params.lanes * params.hazard_window(7)
    for latency in (LATENCY, 1, 7):
        window = params.hazard_window(latency)
        for hidden in (4, 9, params.lanes * window):
            slots = 6
            inputs = {"batch_index": np.full(slots, 1),
                      "nonzero_gates": rng.uniform(0.1, 1, slots).astype(np.float32),
                      "expert_out": rng.standard_normal((slots, hidden)).astype(np.float32)}
            beats = -(-hidden // PARAMS.lanes)
            outcome = check(inputs, {"tokens": 3, "memory_latency": latency}, params=params)
            assert outcome.cycles == (params.cycles(slots, hidden, latency) +
                                      (slots - 1) * max(0, window - beats)), (hidden, latency)
        gates, expert_out = gate_case("duet_toy")
        outcome = check({"gates": gates, "expert_out": expert_out}, {"memory_latency": latency},
                        params=params)
        assert outcome.cycles == 21 * 4 + params.overhead(latency)


@pytest.mark.parametrize("name", ["same_token_one_beat", "random_repeats", "all_experts"])
def test_small_tracker_with_stalls(name):
    """max_outstanding = 4, below the hazard window: the in-flight limit saturates at the
    tracker's depth and the token history holds 3 slots; repeats at every distance stay
    bit-exact under random stalls (the scoreboard checks every read and write)."""
    params = dataclasses.replace(PARAMS, max_outstanding=4)
    outcome = run(UNIT, *case(name), params=params, sim=SIM, stall=0.3, seed=11)
    assert outcome.passed, outcome.problems


@pytest.mark.parametrize("stall", STALLS)
def test_combine_scatter_bf16_lanes8(stall):
    params = CombineScatterParams(format="bf16", lanes=8, max_tokens=32, max_slots=64,
                                  max_hidden=32)
    rng = np.random.default_rng(3)
    for hidden in (21, 8, 3):
        gates = topk_gates(rng, 13, 4, 2, dtype=ml_dtypes.bfloat16, specials=0.2)
        expert_out = random_floats(rng, (int(np.count_nonzero(gates)), hidden),
                                   ml_dtypes.bfloat16, specials=0.3)
        check({"gates": gates, "expert_out": expert_out}, None, params=params, stall=stall)


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


def test_bench_problems_small():
    """The ``bench units`` problem at a small shape: both orders bit-exact with the exact
    count; the back-to-back order pays exactly ``hazard_window - beats`` per repeated token."""
    shape = BenchShape(tokens=8, hidden=12, experts=4, top_k=2, lanes=4)
    problems = UNIT.bench_problems(shape, seed=0)
    assert set(problems) == {"random", "back_to_back"}
    window, beats = PARAMS.hazard_window(LATENCY), 3
    outcomes = {name: check(inputs, settings) for name, (inputs, settings) in problems.items()}
    assert outcomes["back_to_back"].cycles == (PARAMS.cycles(16, 12, LATENCY) +
                                               8 * max(0, window - beats))
    assert outcomes["random"].ideal_cycles == 16 * beats
    assert outcomes["random"].efficiency <= 1.0


def test_combine_scatter_rows_keep_their_shape():
    """expert_out rows of shape (L, 1) (the DUET toy's) come back as [S, L, 1]."""
    rng = np.random.default_rng(9)
    gates = topk_gates(rng, 5, 3, 1)
    expert_out = rng.standard_normal((5, 6, 1)).astype(np.float32)
    combined = check({"gates": gates, "expert_out": expert_out}, None).outputs["combined"]
    assert combined.shape == (5, 6, 1)
    assert np.array_equal(to_bits(combined, "fp32"),
                          to_bits(golden.sparse_combine(gates, expert_out), "fp32"))


def test_combine_scatter_input_errors():
    gates = np.array([[0.5, 0.0], [0.0, 0.25]], dtype=np.float32)
    out = np.ones((2, 4), dtype=np.float32)

    def attempt(inputs, settings=None, params=PARAMS):
        run(UNIT, inputs, settings, params=params)

    with pytest.raises(HostError, match=r"gates must be non-negative.*at \[1, 1\]"):
        attempt({"gates": np.array([[0.5, 0], [0, -1]], np.float32), "expert_out": out})
    with pytest.raises(HostError, match="expert_out has dtype float16, but gates has float32"):
        attempt({"gates": gates, "expert_out": out.astype(np.float16)})
    with pytest.raises(HostError, match="expert_out has 3 rows, but there are 2 slots"):
        attempt({"gates": gates, "expert_out": np.ones((3, 4), np.float32)})
    with pytest.raises(HostError, match="hidden = 129 exceeds the unit's max_hidden of 128"):
        attempt({"gates": gates, "expert_out": np.ones((2, 129), np.float32)})
    with pytest.raises(HostError, match="the problem needs max_hidden >= 65"):
        attempt({"gates": gates, "expert_out": np.ones((2, 65), np.float32)},
                {"max_hidden": 64}, params=None)
    with pytest.raises(HostError, match=r"batch_index.flat\[1\] = 4294967296 does not fit"):
        attempt({"batch_index": [0, 1 << 32], "nonzero_gates": np.ones(2, np.float32),
                 "expert_out": out}, {"tokens": 2})
    with pytest.raises(HostError, match="run-time value tokens is missing"):
        attempt({"batch_index": [0, 1], "nonzero_gates": np.ones(2, np.float32),
                 "expert_out": out})
    with pytest.raises(HostError, match="memory_latency must be at least 1, not 0"):
        attempt({"gates": gates, "expert_out": out}, {"memory_latency": 0})
    with pytest.raises(HostError, match="needs gates and expert_out"):
        attempt({"gates": gates})


@pytest.mark.parametrize("settings,message", [
    (dict(lanes=3), "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (dict(max_outstanding=12), "max_outstanding must be a power of two, not 12"),
    (dict(max_slots=0), "max_slots must be an integer between 1 and"),
    (dict(add_stages="deep"), "add_stages must be an integer, not 'deep'"),
    (dict(index_width=8, max_tokens=4096), "index_width must hold max_tokens"),
])
def test_combine_scatter_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        CombineScatterParams(**settings)


def test_combine_scatter_old_parameter_name():
    """``max_inflight`` is the old name of ``max_outstanding`` (accepted, with a warning)."""
    with pytest.deprecated_call(match="'max_inflight' is deprecated"):
        params = UNIT.make_params({"max_inflight": 8})
    assert params.max_outstanding == 8


def test_reset_mid_run_leaves_no_stale_output():
    """Amaranth simulator: a reset in the middle of a run returns the unit to idle (no
    request, no write, no status left), and a fresh run after it is correct."""
    params = CombineScatterParams(lanes=2, max_tokens=4, max_slots=8, max_hidden=4,
                                  max_outstanding=8)
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
