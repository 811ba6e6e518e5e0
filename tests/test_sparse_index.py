"""The sparse dispatcher's index unit (SPEC 1.3) on its emitted Verilog (every case on
Verilator's fast path; a few also through the cocotb bench in Verilator and Icarus), with and
without random valid/ready stalls, scored bit for bit against
golden.sparse_dispatch_indices with a scoreboard over the whole write log and the stall-free
cycle count asserted; the error flag for negative gates driven straight into the bench; the
prefix sum and the gate classifier in Amaranth's simulator; reset in the middle of a run; bad
input and bad parameters."""

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module, Signal
from amaranth.sim import Simulator

from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.blocks.prefix_sum import PrefixSum
from moe_hw.flows.simulate import simulator_available
from moe_hw.formats import FORMATS, to_bits
from moe_hw.golden.testing import bit_equal
from moe_hw.host.checks import HostError
from moe_hw.host.sparse_index import UNIT, softmax_gates, simulate_raw
from moe_hw.host.unit import BenchShape, run
from moe_hw.params import ParameterError
from moe_hw.units.sparse_index import SparseIndexParams, SparseIndexUnit, gate_class

from conftest import SIM, STALLS, comb_outputs, simulator_cases, simulator_params

# One generous parameter set for the simulated cases: one fast-path and one cocotb build each.
# lanes=4 with E up to 9 gives rows of 1 to 3 beats and padded lanes.
PARAMS = SparseIndexParams(format="fp32", lanes=4, max_tokens=128, max_experts=16)
SEED_GATES = np.float32([[0, 0, .7],
                         [.9, 0, 0],
                         [0, 0, .5],
                         [0, .8, 0]])


def check(gates, sim=SIM, stall=0.0, seed=0, params=PARAMS, settings=None):
    outcome = run(UNIT, {"gates": gates}, settings, params=params, sim=sim, stall=stall,
                  seed=seed)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        assert outcome.cycles == UNIT.cycles(outcome.problem, outcome.params)
    return outcome


def special_gates(rng):
    """Gates a softmax can give plus the IEEE specials the golden model accepts: NaN (either
    sign: NaN is routed), +-0.0 (not routed), +Inf, positive subnormals, in every lane."""
    gates = softmax_gates(rng, 40, 7, 2)
    specials = np.float32([np.nan, -np.nan, -0.0, 0.0, np.inf, 1e-45, 3e-39, 1.0])
    mask = rng.random(gates.shape) < 0.4
    gates[mask] = rng.choice(specials, int(mask.sum()))
    gates[0] = -0.0                       # a row with no routed gate at all
    return gates


def case_gates(name):
    rng = np.random.default_rng(sorted(CASES).index(name))
    if name == "seed_example":            # SPEC 1.3 worked example
        return SEED_GATES
    if name == "duet_toy":                # S=21, E=6, k=1
        return softmax_gates(rng, 21, 6, 1)
    if name == "random_k2":               # E=9: rows of 3 beats, the last one padded
        return softmax_gates(rng, 57, 9, 2)
    if name == "empty_experts":           # experts 0, 2, 3 and 7 get nothing
        gates = np.zeros((33, 8), np.float32)
        for i in range(33):
            gates[i, rng.choice([1, 4, 5, 6], 2, replace=False)] = rng.uniform(0.1, 1, 2)
        return gates
    if name == "dense":                   # every gate routed: 4 writes per beat
        return rng.uniform(0.01, 1, (17, 5)).astype(np.float32)
    if name == "nan_and_signed_zero":
        return special_gates(rng)
    if name == "zero_tokens":
        return np.zeros((0, 5), np.float32)
    raise KeyError(name)


CASES = ["seed_example", "duet_toy", "random_k2", "empty_experts", "dense",
         "nan_and_signed_zero", "zero_tokens"]


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, case", simulator_cases(
    CASES, cocotb=["seed_example", "nan_and_signed_zero", "zero_tokens"]))
def test_sparse_index_cases(sim, case, stall):
    gates = case_gates(case)
    out = check(gates, sim, stall, seed=11).outputs
    if case == "seed_example":
        assert out["batch_index"].tolist() == [1, 3, 0, 2]
        assert out["part_sizes"].tolist() == [1, 1, 2]
        assert bit_equal(out["nonzero_gates"], np.float32([.9, .8, .7, .5]))
    if case == "empty_experts":
        assert (out["part_sizes"][[0, 2, 3, 7]] == 0).all()
    if case == "nan_and_signed_zero":
        nan_slots = np.isnan(out["nonzero_gates"])
        assert nan_slots.any() and not (out["nonzero_gates"] == 0).any()
    if case == "zero_tokens" and stall == 0.0:
        assert out["cycles"] == 5 + PARAMS.offsets_overhead


@pytest.mark.parametrize("stall", STALLS)
def test_sparse_index_one_beat_rows(stall):
    """lanes = E = 8, the benchmark's shape: one beat per row, k = 2 writes per beat (the
    parameters sized to the matrix: lanes = 8)."""
    gates = softmax_gates(np.random.default_rng(8), 64, 8, 2)
    outcome = check(gates, stall=stall, seed=2, params=None)
    assert outcome.params == SparseIndexParams(lanes=8, max_tokens=64, max_experts=8)
    assert UNIT.single_pass_cycles(outcome.problem, outcome.params) == 64
    assert outcome.ideal_cycles == 64 + 8 + 2 * 64


def test_sparse_index_bench_problem():
    (inputs, settings), = UNIT.bench_problems(BenchShape(tokens=64, experts=8, top_k=2,
                                                         lanes=8)).values()
    outcome = check(inputs["gates"], params=None, settings=settings)
    assert outcome.params == SparseIndexParams(lanes=8, max_tokens=64, max_experts=8)
    assert np.count_nonzero(inputs["gates"]) == 128
    assert outcome.ideal_cycles == 64 + 8 + 128
    assert outcome.cycles == outcome.expected_cycles == \
        outcome.ideal_cycles + outcome.params.passes_overhead


# ---- the counters (and the offsets) in block RAM ------------------------------------------------

BLOCK = PARAMS.replace(counters="block")


def test_sparse_index_counters_by_size():
    """``counters="auto"``: LUT RAM up to 32 counters a bank (E / lanes; the default 16),
    block RAM past them, a stage more: two cycles more a run (one with no rows)."""
    assert SparseIndexParams(lanes=4, max_experts=128).counter_memory == "lut"
    assert SparseIndexParams(lanes=4, max_experts=129).counter_memory == "block"
    assert SparseIndexParams(lanes=16, max_experts=512).counter_memory == "lut"
    assert SparseIndexParams().counter_memory == "lut"
    assert (PARAMS.passes_overhead, PARAMS.offsets_overhead) == (28, 15)
    assert (BLOCK.passes_overhead, BLOCK.offsets_overhead) == (30, 16)


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("case", ["seed_example", "random_k2", "dense", "nan_and_signed_zero",
                                  "zero_tokens"])
def test_sparse_index_block_counters(case, stall):
    """The counters and the offsets in block RAM (generic: Amaranth's memories with a
    registered read): the same bits, and without stalls the formula's count."""
    check(case_gates(case), stall=stall, seed=9, params=BLOCK)


@pytest.mark.parametrize("stall", STALLS)
def test_sparse_index_many_experts_on_ecp5_blocks(stall):
    """1024 experts at 4 lanes, ``auto``: 256 counters a bank, each bank and the offsets in
    DP16KD blocks with their output registers on, under their model in Icarus; top-2 gates
    over every expert, and the same matrix's first 700 experts."""
    reason = simulator_available("icarus")
    if reason:
        pytest.skip(f"icarus: {reason}")
    params = SparseIndexParams(lanes=4, max_tokens=16, max_experts=1024, bram="ecp5")
    assert params.counter_memory == "block"
    gates = softmax_gates(np.random.default_rng(21), 12, 1024, 2)
    check(gates, sim="icarus", stall=stall, seed=15, params=params)
    check(gates[:, :700], sim="icarus", stall=stall, seed=16, params=params)


def test_sparse_index_bf16_specials():
    gates = special_gates(np.random.default_rng(3)).astype(ml_dtypes.bfloat16)
    check(gates, params=SparseIndexParams(format="bf16", lanes=4, max_tokens=128,
                                          max_experts=16))


@pytest.mark.parametrize("sim", simulator_params("verilator", "icarus"))
def test_sparse_index_negative_gate_raises_error_flag(sim):
    """A negative gate driven straight into the bench (the host API would reject it): error is
    set, the run still takes both copies of the matrix and completes, and its outputs are
    those of the nonzero rule (the negative gate routed)."""
    gates = SEED_GATES.copy()
    gates[2, 1] = -0.25
    res = simulate_raw(gates, params=PARAMS, sim=sim)
    assert res["error"] == 1
    problem = {"gates": gates}
    outputs = UNIT.unpack(problem, PARAMS, res)
    experts, tokens = np.nonzero(gates.T)
    expected = (tokens.astype(np.int64), np.bincount(experts, minlength=3).astype(np.int64),
                gates[tokens, experts])
    assert UNIT.score(problem, PARAMS, outputs, res, expected=expected) == []
    assert outputs["batch_index"].tolist() == [1, 2, 3, 0, 2]
    # Scored against the golden model of the matrix without the negative gate, it differs.
    gates[2, 1] = 0
    assert UNIT.score({"gates": gates}, PARAMS, outputs, res)


def test_sparse_index_negative_only_counts_in_range_lanes():
    # Column 3 is past E = 3: a padded lane, ignored, so its -1.0 is no error; a -NaN and a
    # -0.0 are not negative (NaN is routed, -0.0 is zero).
    gates = np.zeros((4, 4), np.float32)
    gates[:, :3] = SEED_GATES
    gates[:, 3] = -1.0
    gates[1, 1], gates[0, 1] = -np.nan, -0.0
    res = simulate_raw(gates, params=PARAMS, num_experts=3)
    assert res["error"] == 0
    assert res["part_size"].tolist() == [1, 2, 2]
    assert res["token"].tolist() == [0, 1, 1, 2, 3] and res["addr"].tolist() == [3, 0, 1, 4, 2]


def test_sparse_index_second_copy_mismatch_is_caught():
    """If pass 3's copy of the matrix has a nonzero pass 1 did not count, its slot falls
    outside [0, nonzeros): the write is suppressed and error is set."""
    second = SEED_GATES.copy()
    second[1, 2] = 0.3                    # one more nonzero in the last expert
    res = simulate_raw(SEED_GATES, params=PARAMS, second=second)
    assert res["error"] == 1 and res["nonzeros"] == 4
    assert sorted(res["addr"].tolist()) == [0, 1, 2, 3]


def test_sparse_index_runtime_size_error_flag():
    gates = np.zeros((2, 3), np.float32)
    res = simulate_raw(gates, params=PARAMS, tokens=PARAMS.max_tokens + 1)
    assert res["error"] == 1 and res["cycles"] == EMPTY_CYCLES and res["beats_taken"] == 0


def test_sparse_index_no_experts():
    outcome = check(np.zeros((6, 0), np.float32))
    assert outcome.cycles == EMPTY_CYCLES and outcome.outputs["part_sizes"].shape == (0,)
    assert outcome.outputs["batch_index"].shape == (0,)


def test_sparse_index_settings_size_the_unit():
    settings = {"lanes": 4, "max_tokens": 128, "max_experts": 16}
    outcome = check(SEED_GATES, params=None, settings=settings)
    assert outcome.params == PARAMS
    out = outcome.outputs
    assert out["batch_index"].tolist() == [1, 3, 0, 2]
    assert out["part_sizes"].tolist() == [1, 1, 2]
    assert bit_equal(out["nonzero_gates"], np.float32([.9, .8, .7, .5]))
    # S*B + E + place cycles (one write per routed gate, one beat per row) + overhead
    assert int(out["cycles"]) == 4 + 3 + 4 + PARAMS.passes_overhead
    assert outcome.report[-1].startswith("check: bit-exact")
    # Without settings: the maxima of the matrix, one beat per row.
    assert UNIT.params_for(UNIT.problem({"gates": SEED_GATES}, {}), {}) == \
        SparseIndexParams(lanes=4, max_tokens=4, max_experts=3)


def _run(gates, params=None, settings=None):
    return run(UNIT, {"gates": gates}, settings, params=params)


@pytest.mark.parametrize("call, error, match", [
    (lambda: _run(np.float32([[0, .5], [-0.25, 0]])), HostError,
     r"gates must be non-negative \(a gate is routed when nonzero\), not -0.25 at \[1, 0\]"),
    (lambda: _run(np.float32([[0, -np.inf]])), HostError, "gates must be non-negative"),
    (lambda: _run(np.float32([0, 1])), ValueError, r"gates must have 2 dimension\(s\) \[S, E\]"),
    (lambda: _run(np.int32([[0, 1]])), TypeError,
     "gates must have dtype float32, float16 or bfloat16, not int32"),
    (lambda: run(UNIT, {}), HostError, "the input file for sparse_index lacks gates"),
    (lambda: _run(np.zeros((129, 2), np.float32), PARAMS), HostError,
     r"tokens = 129 exceeds the unit's max_tokens of 128"),
    (lambda: _run(np.zeros((2, 17), np.float32), PARAMS), HostError,
     r"num_experts = 17 exceeds the unit's max_experts of 16"),
    (lambda: _run(np.zeros((2, 17), np.float32), settings={"max_experts": 16}), HostError,
     r"the problem needs max_experts >= 17, but max_experts = 16"),
    (lambda: _run(np.zeros((2, 3), np.float16), PARAMS), HostError,
     r"gates has dtype float16, but the unit's format is fp32"),
    (lambda: _run(np.zeros((2, 3), np.float32), settings={"capacity": 4}), ParameterError,
     "unit sparse_index has no parameter or run-time value 'capacity'"),
])
def test_sparse_index_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("settings, message", [
    (dict(lanes=3), "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (dict(format="fp8"), "format must be fp32, fp16 or bf16, not 'fp8'"),
    (dict(max_tokens=0), "max_tokens must be an integer between 1 and"),
    (dict(max_experts=1.5), "max_experts must be an integer, not 1.5"),
    (dict(counters="ram"), "counters must be auto, lut or block, not 'ram'"),
])
def test_sparse_index_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        SparseIndexParams(**settings)


# ---- blocks in Amaranth's simulator ------------------------------------------------------------

@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_gate_class_matches_the_golden_rule(fmt):
    """routed == (gate != 0) (NaN routed, +-0.0 not); negative == (gate < 0), the golden
    model's rejection, on specials and random bit patterns."""
    f = FORMATS[fmt]
    rng = np.random.default_rng(1)
    values = np.concatenate([np.float32([0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1, -1,
                                         1e-40, -1e-40, 6e-8, -6e-8]).astype(f.dtype),
                             rng.integers(0, 1 << f.width, 3000).astype(f.uint_dtype)
                             .view(f.dtype)])
    bits = to_bits(values, f).astype(np.int64)
    with np.errstate(invalid="ignore"):
        want_routed, want_negative = values != 0, values < 0
    gate = Signal(f.width)
    routed, negative = gate_class(gate, f)
    m = Module()
    r, n = Signal(), Signal()
    m.d.comb += [r.eq(routed), n.eq(negative)]
    got = np.array(comb_outputs(m, [gate], [r, n], [(b,) for b in bits.tolist()]), dtype=bool)
    assert np.array_equal(got[:, 0], want_routed) and np.array_equal(got[:, 1], want_negative)


@pytest.mark.parametrize("p", [0.0, 0.3, 0.7])
def test_prefix_sum_random_stalls(p):
    dut = PrefixSum(6, 9)
    rng = np.random.default_rng(int(p * 10))
    terms = rng.integers(0, 64, 120).tolist()
    restart = {40, 41, 90}               # clear in a cycle with no term, before this term
    got = []

    async def producer(ctx):
        for n, term in enumerate(terms):
            while rng.random() < p:
                await ctx.tick()
            if n in restart:
                ctx.set(dut.clear, 1)
                await ctx.tick()
                ctx.set(dut.clear, 0)
            ctx.set(dut.i.payload.value, term)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        cycles = clears = 0
        while len(got) < len(terms):
            ready = not rng.random() < p
            ctx.set(dut.o.ready, ready)
            _, _, valid, payload, clear = await ctx.tick().sample(
                dut.o.valid, dut.o.payload, dut.clear)
            if valid and ready:
                got.append((payload.value, payload.exclusive, payload.inclusive))
            cycles += 1
            assert cycles < 20 * len(terms) + 100
            if p == 0.0:
                # one term per cycle but for the clear cycles (a clear cycle takes no term,
                # so the output has a bubble the cycle after it)
                assert len(got) == cycles - 1 - clears or cycles == 1
            clears += clear

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    want, total = [], 0
    for n, term in enumerate(terms):
        total = 0 if n in restart else total
        want.append((term, total % 512, (total + term) % 512))
        total += term
    assert got == want


def test_prefix_sum_parameters():
    with pytest.raises(ParameterError, match="sum_width must be an integer between 1 and 64"):
        PrefixSum(8, 0)


def test_sparse_index_reset_mid_run_leaves_no_stale_state():
    params = SparseIndexParams(lanes=2, max_tokens=8, max_experts=4)
    dut = SparseIndexUnit(params)
    top = Module()
    top.domains.sync = sync = ClockDomain()
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-6)
    one = int(to_bits(np.float32(1.0), "fp32"))
    writes, parts = [], []

    async def start(ctx, tokens):
        ctx.set(dut.tokens, tokens)
        ctx.set(dut.num_experts, 2)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)

    async def bench(ctx):
        ctx.set(dut.write.ready, 1)
        ctx.set(dut.part_sizes.ready, 1)
        ctx.set(dut.rows.valid, 1)
        ctx.set(dut.rows.payload.gates[1], one)   # every row routes to expert 1
        await start(ctx, 8)
        for _ in range(5):                        # part of the way through the count pass
            await ctx.tick()
        assert ctx.get(dut.busy)
        ctx.set(sync.rst, 1)
        await ctx.tick()
        ctx.set(sync.rst, 0)
        for _ in range(10):
            assert not ctx.get(dut.busy) and not ctx.get(dut.done)
            assert not ctx.get(dut.write.valid) and not ctx.get(dut.part_sizes.valid)
            assert not ctx.get(dut.rows.ready) and not ctx.get(dut.error)
            await ctx.tick()
        await start(ctx, 2)                       # a fresh two-row run counts from zero
        for _ in range(40):
            if ctx.get(dut.write.valid):
                writes.append((ctx.get(dut.write.payload.addr), ctx.get(dut.write.payload.token)))
            if ctx.get(dut.part_sizes.valid):
                parts.append((ctx.get(dut.part_sizes.payload.part_size),
                              ctx.get(dut.part_sizes.payload.offset)))
            if ctx.get(dut.done):
                break
            await ctx.tick()
        assert ctx.get(dut.done) and not ctx.get(dut.error)

    sim.add_testbench(bench)
    sim.run()
    assert parts == [(0, 0), (2, 0)] and writes == [(0, 0), (1, 1)]
