"""The location generator (SPEC 1.2) on its emitted Verilog (every case on Verilator's fast
path; a few also through the cocotb bench in Verilator and Icarus), with and without random
valid/ready stalls, scored exactly against golden.compute_locations / golden.expert_counts with
the stall-free cycle count asserted; the counter bank it is built on, in Amaranth's simulator;
reset in the middle of a run; bad input and bad parameters."""

import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw import golden
from moe_hw.blocks.counter_bank import CounterBank
from moe_hw.flows.simulate import simulator_available
from moe_hw.host.checks import HostError
from moe_hw.host.locations import UNIT, simulate_raw
from moe_hw.host.unit import BenchShape, run
from moe_hw.params import ParameterError
from moe_hw.problems import routed_problem
from moe_hw.units.locations import LocationsParams, LocationsUnit

from conftest import SIM, STALLS, simulator_cases

# One generous parameter set for every simulated case: one fast-path and one cocotb build each.
PARAMS = LocationsParams(max_pairs=512, max_experts=16, max_capacity=512, index_width=32)
INDEX_MIN, INDEX_MAX = -(1 << 31), (1 << 31) - 1


def check(indices, num_experts, capacity, sim=SIM, stall=0.0, seed=0, params=PARAMS):
    outcome = run(UNIT, {"indices": indices}, {"num_experts": num_experts, "capacity": capacity},
                  params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        assert outcome.cycles == params.stall_free_cycles(np.size(indices), num_experts)
    return outcome


def case_indices(name):
    """(indices [k, S], num_experts, capacity) of each simulated case, seeded."""
    seed = sorted(CASES).index(name)
    rng = np.random.default_rng(seed)
    if name == "worked_example":          # golden.compute_locations' docstring example
        return np.int32([[0, 1, 0, 2], [1, 0, 2, 2]]), 3, 2
    if name == "duet_toy":                # S=21, E=6, k=1; C = ceil(21/6) = 4: drops
        return rng.integers(0, 6, (1, 21)), 6, golden.capacity_from_factor(1.0, 21, 6)
    if name == "random_k2":               # top-2, distinct experts per token, E=7
        problem = routed_problem(tokens=97, hidden=0, experts=7, top_k=2, seed=seed)
        return problem["indices"], 7, problem["capacity"]
    if name == "empty_experts":           # E=12, only experts 0, 5 and 11 chosen
        return rng.choice([0, 5, 11], (2, 40)), 12, 9
    if name == "out_of_range":            # negative, too large and the field's extremes
        indices = rng.integers(-3, 9, (2, 45))
        indices[0, :4] = [INDEX_MIN, INDEX_MAX, 6, -1]
        indices[1, -3:] = [16, 15, INDEX_MIN + 5]   # 16, 15 alias counters 0, 15 if unmasked
        return indices.astype(np.int64), 6, 7
    if name == "same_expert":             # one counter hit every cycle, then the read-out
        return np.full((2, 33), 4), 5, 40
    if name == "zero_tokens":             # S = 0: only the read-out, all totals zero
        return np.zeros((2, 0), np.int32), 5, 3
    raise KeyError(name)


CASES = ["worked_example", "duet_toy", "random_k2", "empty_experts", "out_of_range",
         "same_expert", "zero_tokens"]


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, case", simulator_cases(
    CASES, cocotb=["worked_example", "out_of_range", "zero_tokens"]))
def test_locations_cases(sim, case, stall):
    indices, num_experts, capacity = case_indices(case)
    outcome = check(indices, num_experts, capacity, sim, stall, seed=5)
    if case == "worked_example":
        assert outcome.outputs["locations"].tolist() == [[0, 0, 1, 0], [1, 2, 1, 2]]
        assert outcome.outputs["expert_counts"].tolist() == [3, 2, 3]
        assert outcome.outputs["dropped"] == 2
    if case == "duet_toy":
        assert outcome.outputs["dropped"] > 0


def test_locations_no_pairs_no_experts():
    outcome = check(np.zeros((1, 0), np.int32), 0, 0)
    assert outcome.cycles == EMPTY_CYCLES and outcome.outputs["expert_counts"].shape == (0,)


def test_locations_experts_zero_routes_nothing():
    outcome = check(np.int32([[0, 1, -1, 2]]), 0, 4)
    assert outcome.outputs["locations"].tolist() == [[-1, -1, -1, -1]]
    assert outcome.outputs["dropped"] == 0 and outcome.cycles == 4 + PARAMS.overhead


def test_locations_runtime_size_error_flag():
    # num_experts above max_experts reaches the hardware only through the raw bench.
    res = simulate_raw([0, 1, 2], num_experts=PARAMS.max_experts + 1, capacity=4, params=PARAMS)
    assert res["error"] == 1 and res["cycles"] == EMPTY_CYCLES
    assert res["pairs_taken"] == 0 and res["location"].size == 0 and res["counts"].size == 0


def test_locations_bench_problem():
    (inputs, settings), = UNIT.bench_problems(BenchShape(tokens=64, experts=8, top_k=2)).values()
    outcome = run(UNIT, inputs, settings, params=PARAMS)
    assert outcome.passed, outcome.problems
    assert outcome.ideal_cycles == 128
    assert outcome.cycles == outcome.expected_cycles == 128 + 8 + PARAMS.overhead


def test_locations_settings_mix_parameters_and_runtime_values():
    indices = np.int32([[0, 1, 0, 2], [1, 0, 2, 2]])
    settings = {"num_experts": 3, "capacity": 2, "max_pairs": 512, "max_experts": 16,
                "max_capacity": 512}
    outcome = run(UNIT, {"indices": indices}, settings)
    assert outcome.params == PARAMS
    assert outcome.outputs["locations"].tolist() == [[0, 0, 1, 0], [1, 2, 1, 2]]
    assert outcome.outputs["expert_counts"].tolist() == [3, 2, 3]
    assert int(outcome.outputs["dropped"]) == 2
    assert int(outcome.outputs["cycles"]) == 8 + 3 + PARAMS.overhead
    assert outcome.report[-1].startswith("check: bit-exact")
    # Without maxima the unit is sized to the problem; the run-time values may be npz scalars.
    problem = UNIT.problem({"indices": indices, "num_experts": np.int64(3),
                            "capacity": np.int64(2)}, {})
    assert UNIT.params_for(problem, {}) == \
        LocationsParams(max_pairs=8, max_experts=3, max_capacity=2)


def _run(indices, settings, params=None):
    return run(UNIT, {"indices": indices}, settings, params=params)


@pytest.mark.parametrize("call, error, match", [
    (lambda: _run([[0, 1]], {"num_experts": -1, "capacity": 2}), HostError,
     "num_experts must be a non-negative integer, not -1"),
    (lambda: _run([[0, 1]], {"num_experts": 2, "capacity": -3}), HostError,
     "capacity must be a non-negative integer, not -3"),
    (lambda: _run([[0, 1]], {"capacity": 2}), HostError, "run-time value num_experts is missing"),
    (lambda: _run([[0.0, 1.0]], {"num_experts": 2, "capacity": 2}), TypeError,
     "indices must have an integer dtype, not float64"),
    (lambda: _run(np.zeros((1, 1, 2), int), {"num_experts": 2, "capacity": 2}), ValueError,
     "indices must have 1 or 2 dimension"),
    (lambda: run(UNIT, {}, {"num_experts": 2, "capacity": 2}), HostError,
     "the input file for locations lacks indices"),
    (lambda: _run(np.zeros((2, 300), int), {"num_experts": 2, "capacity": 2}, PARAMS),
     HostError, r"pairs = 600 exceeds the unit's max_pairs of 512"),
    (lambda: _run([0], {"num_experts": 17, "capacity": 2}, PARAMS), HostError,
     "num_experts = 17 exceeds the unit's max_experts of 16"),
    (lambda: _run([0, 1, 2], {"num_experts": 2, "capacity": 2, "max_pairs": 2}), HostError,
     "the problem needs max_pairs >= 3, but max_pairs = 2"),
    (lambda: _run(np.int64([0, 1 << 40]), {"num_experts": 2, "capacity": 2}), HostError,
     r"indices.flat\[1\] = 1099511627776 does not fit the 32-bit header field"),
    (lambda: _run([0], {"num_experts": 2, "capacity": 2, "lanes": 4}), ParameterError,
     "unit locations has no parameter or run-time value 'lanes'"),
])
def test_locations_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("settings, message", [
    (dict(max_pairs=0), "max_pairs must be an integer between 1 and"),
    (dict(max_experts="8"), "max_experts must be an integer, not '8'"),
    (dict(index_width=1), "index_width must be an integer between 2 and 64, not 1"),
    (dict(index_width=4, max_experts=9),
     r"index_width must hold max_experts \(9\) as a signed value, not 4"),
    (dict(counters="bram"), "counters must be auto, lut or block, not 'bram'"),
    (dict(bram="xilinx"), "bram must be generic or ecp5, not 'xilinx'"),
])
def test_locations_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        LocationsParams(**settings)


# ---- the counters in block RAM -----------------------------------------------------------------

BLOCK = PARAMS.replace(counters="block")


def test_locations_counters_by_size():
    """``counters="auto"``: LUT RAM up to 32 experts, block RAM past them (the default 64),
    whose bank has a stage more: one cycle more a run, one pair more inside."""
    assert LocationsParams(max_experts=32).counter_memory == "lut"
    assert LocationsParams(max_experts=33).counter_memory == "block"
    assert LocationsParams().counter_memory == "block"
    assert LocationsParams(max_experts=256, counters="lut").counter_memory == "lut"
    assert (PARAMS.overhead, PARAMS.inside) == (7, 4)
    assert (BLOCK.overhead, BLOCK.inside) == (8, 5)


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("case", ["worked_example", "random_k2", "out_of_range", "same_expert",
                                  "zero_tokens"])
def test_locations_block_counters(case, stall):
    """The counters in block RAM (generic: Amaranth's memory with a registered read): the same
    bits, and without stalls the formula's count with the bank's fourth stage."""
    indices, num_experts, capacity = case_indices(case)
    check(indices, num_experts, capacity, stall=stall, seed=11, params=BLOCK)


@pytest.mark.parametrize("stall", STALLS)
def test_locations_many_experts_on_ecp5_blocks(stall):
    """256 experts: the counters in a DP16KD with its output register on, under its
    model in Icarus; top-2 routing over every expert, and a run of more experts than pairs."""
    reason = simulator_available("icarus")
    if reason:
        pytest.skip(f"icarus: {reason}")
    params = LocationsParams(max_pairs=1024, max_experts=256, max_capacity=1024, bram="ecp5")
    assert params.counter_memory == "block"
    problem = routed_problem(tokens=300, hidden=0, experts=256, top_k=2, seed=3)
    check(problem["indices"], 256, problem["capacity"], sim="icarus", stall=stall, seed=13,
          params=params)
    check(np.int32([[255, 0, 255, 7]]), 200, 1, sim="icarus", stall=stall, seed=14,
          params=params)


# ---- the counter bank in Amaranth's simulator ---------------------------------------------------

def run_counter_bank(count, requests, p_stall, seed, clear_at=(), width=8, copy=0,
                     memory="lut", p_clear=0.0, cleared=None):
    """Drive ``requests`` ((index, increment) pairs, or (index, increment, amount) for a bank
    of ``width``-bit counters that adds amounts) through a CounterBank with a random global
    stall and random bubbles; return the value seen for each request, in order. With
    ``p_clear``, also a clear in any cycle in which the last stage holds no incrementing
    request, with that probability, while requests wait in the stages before it: the oldest
    request that it clears for (the model's clear point) is added to ``cleared``."""
    amounts = len(requests[0]) == 3
    dut = CounterBank(count, width, amount_width=width if amounts else None, copy=copy,
                      memory=memory)
    rng = np.random.default_rng(seed)
    values = []

    async def bench(ctx):
        sent = 0
        stages = [None] * dut.latency              # the request in each stage, last one last
        for cycle in range(20 * len(requests) + 50):
            en = not rng.random() < p_stall
            offer = sent < len(requests) and not rng.random() < p_stall
            # A clear waits for the pipeline to empty, and the request after it for the clear.
            clear = sent in clear_at and stages == [None] * len(stages)
            offer &= sent not in clear_at or clear
            last = stages[-1]
            if p_clear and (last is None or not requests[last][1]) and \
                    rng.random() < p_clear:
                clear = True
                cleared.add(min([n for n in stages[:-1] if n is not None], default=sent))
            ctx.set(dut.en, en)
            ctx.set(dut.valid, offer)
            ctx.set(dut.clear, clear)
            if offer:
                ctx.set(dut.index, requests[sent][0])
                ctx.set(dut.increment, requests[sent][1])
                if amounts:
                    ctx.set(dut.amount, requests[sent][2])
            if stages[-1] is not None and en:
                values.append(ctx.get(dut.value))   # the item leaves the last stage now
            await ctx.tick()
            if en:
                stages = [sent if offer else None] + stages[:-1]
                sent += offer
            if sent == len(requests) and stages == [None] * len(stages):
                break
        assert sent == len(requests) and stages == [None] * len(stages)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return values


def counter_bank_model(count, requests, clear_at=(), width=8):
    counters, values = [0] * count, []
    for n, (index, increment, *amount) in enumerate(requests):
        if n in clear_at:
            counters = [0] * count
        values.append(counters[index])
        if increment:
            counters[index] = (counters[index] + (amount[0] if amount else 1)) % (1 << width)
    return values


@pytest.mark.parametrize("memory", ["lut", "block"])
@pytest.mark.parametrize("p_stall", [0.0, 0.3, 0.6])
@pytest.mark.parametrize("count", [1, 3, 8, 64])
def test_counter_bank_random(count, p_stall, memory):
    rng = np.random.default_rng(count)
    # Few counters and long runs of one index: many back-to-back hits on one counter.
    indices = np.repeat(rng.integers(0, count, 60), rng.integers(1, 5, 60))[:150]
    requests = [(int(i), int(rng.random() < 0.8)) for i in indices]
    assert run_counter_bank(count, requests, p_stall, seed=count, memory=memory) == \
        counter_bank_model(count, requests)


@pytest.mark.parametrize("p_stall", [0.0, 0.3])
@pytest.mark.parametrize("count,width", [(5, 40), (256, 20), (2, 8)])
def test_counter_bank_block_memory(count, width, p_stall):
    """A bank in block memory (a stage more: the read's two cycles): amounts, clears, and
    hits on one counter every cycle, as the LUT bank counts them."""
    rng = np.random.default_rng(count + width)
    indices = np.repeat(rng.integers(0, count, 70), rng.integers(1, 5, 70))[:160]
    requests = [(int(i), int(rng.random() < 0.8), int(rng.integers(1 << width)))
                for i in indices]
    clear_at = (50, 101)
    assert CounterBank(count, width, memory="block").latency == 4
    assert run_counter_bank(count, requests, p_stall, seed=width, clear_at=clear_at,
                            width=width, memory="block") == \
        counter_bank_model(count, requests, clear_at, width)


@pytest.mark.parametrize("memory", ["lut", "block"])
@pytest.mark.parametrize("count", [3, 64])
def test_counter_bank_clear_in_flight(count, memory):
    """A clear while requests wait in the stages before the last (none incrementing in the
    last): they, and every later request, read the counters from 0."""
    rng = np.random.default_rng(count)
    indices = np.repeat(rng.integers(0, count, 80), rng.integers(1, 4, 80))[:200]
    requests = [(int(i), int(rng.random() < 0.6), int(rng.integers(1, 256))) for i in indices]
    cleared = set()
    values = run_counter_bank(count, requests, 0.3, seed=count + 1, width=16, memory=memory,
                              p_clear=0.05, cleared=cleared)
    assert len(cleared) >= 3
    assert values == counter_bank_model(count, requests, cleared, width=16)


@pytest.mark.parametrize("count", [5, 64])
def test_counter_bank_wide_amounts(count):
    """40-bit counters that add 40-bit amounts: the memory in three column groups, each with
    its own (scrambled) copy of the addresses."""
    rng = np.random.default_rng(40 + count)
    indices = np.repeat(rng.integers(0, count, 60), rng.integers(1, 4, 60))[:120]
    requests = [(int(i), int(rng.random() < 0.8), int(rng.integers(1 << 40))) for i in indices]
    assert run_counter_bank(count, requests, 0.3, seed=count, width=40) == \
        counter_bank_model(count, requests, width=40)


@pytest.mark.parametrize("copy", [1, 2, 3])
@pytest.mark.parametrize("count,width", [(5, 40), (64, 8), (3, 8)])
def test_counter_bank_copies(count, width, copy):
    """A bank built as copy 1, 2 or 3 (its address registers inverted or reset to all ones,
    every column group's; the memory spans the index's range) counts as copy 0 does, clears
    included."""
    rng = np.random.default_rng(7 * copy + count)
    indices = np.repeat(rng.integers(0, count, 50), rng.integers(1, 4, 50))[:100]
    requests = [(int(i), int(rng.random() < 0.8), int(rng.integers(1 << width)))
                for i in indices]
    clear_at = (40, 77)
    assert run_counter_bank(count, requests, 0.3, seed=copy, clear_at=clear_at, width=width,
                            copy=copy) == counter_bank_model(count, requests, clear_at, width)


def test_counter_bank_clear():
    requests = [(i % 3, 1) for i in range(40)]
    clear_at = (13, 27)
    values = run_counter_bank(3, requests, 0.2, seed=9, clear_at=clear_at)
    assert values == counter_bank_model(3, requests, clear_at)


def test_counter_bank_parameters():
    with pytest.raises(ParameterError, match="count must be an integer between 1 and"):
        CounterBank(0, 8)
    with pytest.raises(ParameterError, match="width must be an integer, not 2.5"):
        CounterBank(4, 2.5)
    with pytest.raises(ParameterError, match="copy must be an integer between 0 and 3, not 4"):
        CounterBank(4, 8, copy=4)
    with pytest.raises(ParameterError, match="memory"):
        CounterBank(4, 8, memory="ultra")
    assert CounterBank.latency == 3


# ---- reset in the middle of a run --------------------------------------------------------------

def test_locations_reset_mid_run_leaves_no_stale_state():
    dut = LocationsUnit(LocationsParams(max_pairs=16, max_experts=4, max_capacity=16))
    top = Module()
    top.domains.sync = sync = ClockDomain()
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-6)
    got = {"location": [], "count": []}

    async def start(ctx, pairs):
        ctx.set(dut.pairs, pairs)
        ctx.set(dut.num_experts, 3)
        ctx.set(dut.capacity, 16)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)

    async def bench(ctx):
        ctx.set(dut.location.ready, 1)
        ctx.set(dut.counts.ready, 1)
        ctx.set(dut.index.valid, 1)
        ctx.set(dut.index.payload.index, 2)
        await start(ctx, 12)
        for _ in range(6):                # counter 2 has counted a few pairs
            await ctx.tick()
        assert ctx.get(dut.busy)
        ctx.set(sync.rst, 1)
        await ctx.tick()
        ctx.set(sync.rst, 0)
        for _ in range(10):               # idle: nothing stale comes out
            assert not ctx.get(dut.busy) and not ctx.get(dut.done)
            assert not ctx.get(dut.location.valid) and not ctx.get(dut.counts.valid)
            assert not ctx.get(dut.index.ready) and ctx.get(dut.dropped) == 0
            await ctx.tick()
        await start(ctx, 2)               # a fresh run counts from zero
        for _ in range(20):
            for stream, field in ((dut.location, "location"), (dut.counts, "count")):
                if ctx.get(stream.valid):
                    got[field].append(ctx.get(getattr(stream.payload, field)))
            if ctx.get(dut.done):
                break
            await ctx.tick()
        assert ctx.get(dut.done) and not ctx.get(dut.error)

    sim.add_testbench(bench)
    sim.run()
    assert got == {"location": [0, 1], "count": [0, 0, 2]}
