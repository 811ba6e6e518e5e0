"""The re-routing unit (Ascend ``MoeReRouting``, SPEC 1.5) on its emitted Verilog (every
case on Verilator's fast path; the worked example also through the cocotb bench in Verilator
and Icarus), with and without random valid/ready stalls on every
stream, scored bit for bit against ``golden.moe_re_routing`` with scoreboards over every token
write, every read and every per-token write; stall-free runs must take exactly the documented
cycle count. Hostile counts and sizes driven straight into the bench raise the error flag and
write nothing; the host API names the rank and the expert; bad parameters fail at generation
time. Two designs (16-bit tokens without scales, int32 counts; int8 tokens with
scales, int64 counts) serve every simulated case."""

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from moe_hw.blocks.counter_bank import CounterBank
from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.flows.simulate import simulator_available
from moe_hw.host.checks import HostError
from moe_hw.host.moe_re_routing import UNIT, random_counts, random_problem, simulate_raw
from moe_hw.host.unit import run
from moe_hw.params import ParameterError
from moe_hw.units.moe_re_routing import MoeReRoutingParams

from conftest import SIM, STALLS, simulator_params

# 16-bit tokens (fp16 and bf16 give the same Verilog), no scales, int32 counts, 4 lanes.
WIDE = MoeReRoutingParams(format="bf16", lanes=4, max_tokens=96, max_hidden=24, max_ranks=6,
                          max_experts=16, max_blocks=64, count_type="int32", scales=False)
# int8 tokens with fp32 scales, int64 counts, 8 lanes.
NARROW = MoeReRoutingParams(format="int8", lanes=8, max_tokens=96, max_hidden=24, max_ranks=6,
                            max_experts=8, max_blocks=48, count_type="int64", scales=True)

# SPEC 1.5 worked example (golden test): N = 2, E = 3.
COUNTS = np.int32([[1, 0, 2],
                   [2, 1, 0]])


def params_of(fmt, scales):
    return NARROW if fmt == "int8" else WIDE.replace(format=fmt)


def check(inputs, settings=None, *, sim=SIM, stall=0.0, seed=0, params=None):
    """Run, require bit-exact with a clean scoreboard, and the exact stall-free count."""
    tokens = inputs["tokens"]
    fmt = {np.dtype(np.int8): "int8", np.dtype(np.float16): "fp16"}.get(tokens.dtype, "bf16")
    params = params or params_of(fmt, "per_token_scales" in inputs)
    outcome = run(UNIT, inputs, settings, params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    num_tokens, hidden = tokens.shape
    ranks, experts = inputs["expert_token_num_per_rank"].shape
    assert int(outcome.results["counts_taken"]) == ranks * experts
    if stall == 0.0:
        beats = -(-hidden // params.lanes) if hidden else 0
        passes = ranks * experts + experts
        if num_tokens and ranks and experts:
            want = (num_tokens * beats + passes + params.move_overhead + params.product_latency
                    + outcome.problem["memory_latency"])
        elif experts:
            want = passes + params.COUNT_OVERHEAD
        else:
            want = EMPTY_CYCLES
        assert outcome.cycles == outcome.expected_cycles == want
    return outcome


def worked_example(dtype=np.float16):
    tokens = np.arange(6 * 3).reshape(6, 3).astype(dtype)
    return {"tokens": tokens, "expert_token_num_per_rank": COUNTS}


def case(name):
    rng = np.random.default_rng(sorted(CASES).index(name) + 100)
    return CASES[name](rng)


CASES = {
    # random N and E, H not a multiple of the lanes, bf16 with NaN / Inf / -0.0 / subnormals
    "random_bf16": lambda rng: random_problem(rng, 70, 11, 5, 13, "bf16"),
    # counts with many zeros and whole zero ranks
    "zero_ranks_fp16": lambda rng: {
        "tokens": random_problem(rng, 40, 8, 1, 1, "fp16")["tokens"],
        "expert_token_num_per_rank": np.concatenate([
            np.zeros((2, 16), np.int32), random_counts(rng, 25, 1, 16, zeros=0.8)
            .astype(np.int32), np.zeros((1, 16), np.int32),
            random_counts(rng, 15, 2, 16, zeros=0.9).astype(np.int32)])},
    # one-token blocks of one beat (H <= lanes): a new block every cycle, no bubble
    "one_beat_blocks": lambda rng: {
        "tokens": random_problem(rng, 30, 3, 1, 1, "bf16")["tokens"],
        "expert_token_num_per_rank": np.ones((6, 5), np.int32)},
    # int8 with scales, H a multiple of the lanes and not
    "int8_scales": lambda rng: random_problem(rng, 90, 19, 6, 8, "int8", scales=True,
                                              count_dtype=np.int64),
    "int8_scales_h16": lambda rng: random_problem(rng, 33, 16, 3, 7, "int8", scales=True,
                                                  count_dtype=np.int64),
    # A = 0 (the counts still run: expert_token_num all zeros), N = 0
    "no_tokens": lambda rng: {"tokens": np.zeros((0, 5), ml_dtypes.bfloat16),
                              "expert_token_num_per_rank": np.zeros((3, 4), np.int32)},
    "no_ranks": lambda rng: {"tokens": np.zeros((0, 5), ml_dtypes.bfloat16),
                             "expert_token_num_per_rank": np.zeros((0, 4), np.int32)},
    "no_experts": lambda rng: {"tokens": np.zeros((0, 2), np.int8),
                               "expert_token_num_per_rank": np.zeros((3, 0), np.int64),
                               "per_token_scales": np.zeros(0, np.float32)},
}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("name", list(CASES))
def test_moe_re_routing_cases(name, stall):
    inputs = case(name)
    # Both values of each mode across the cases.
    index = sorted(CASES).index(name)
    settings = {"idx_type": index % 2, "expert_token_num_type": (index // 2) % 2}
    outcome = check(inputs, settings, stall=stall, seed=index)
    if name == "no_tokens":
        assert outcome.outputs["expert_token_num"].tolist() == [0, 0, 0, 0]
        assert outcome.outputs["permute_tokens"].shape == (0, 5)
    if name == "one_beat_blocks" and stall == 0.0:
        assert outcome.ideal_cycles == 30       # one beat per token, blocks back to back


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim", simulator_params("verilator", "icarus"))
def test_moe_re_routing_worked_example(sim, stall):
    """SPEC 1.5's example in all four mode combinations: gather [0, 3, 4, 5, 1, 2], scatter
    [0, 4, 5, 1, 2, 3], counts [3, 1, 2], cumsum [3, 4, 6]."""
    for idx_type in (0, 1):
        for num_type in (0, 1):
            out = check(worked_example(), {"idx_type": idx_type,
                                           "expert_token_num_type": num_type},
                        sim=sim, stall=stall, seed=idx_type * 2 + num_type).outputs
            assert out["permute_token_idx"].tolist() == \
                ([0, 3, 4, 5, 1, 2] if idx_type == 0 else [0, 4, 5, 1, 2, 3])
            assert out["expert_token_num"].tolist() == ([3, 1, 2] if num_type else [3, 4, 6])
            assert out["permute_tokens"][:, 0].tolist() == [0, 9, 12, 15, 3, 6]
            assert "permute_per_token_scales" not in out


@pytest.mark.parametrize("stall", STALLS)
def test_moe_re_routing_on_ecp5_primitives(stall):
    """The ECP5 netlist in Icarus: the block table and the offset table as DP16KD blocks with
    their output registers on (under their model), the product on registered MULT18X18D
    cells. The same bits, a clean scoreboard and, without stalls, the formula's count (the
    tables' two-cycle read on both targets)."""
    reason = simulator_available("icarus")
    if reason:
        pytest.skip(f"icarus: {reason}")
    params = WIDE.replace(dsp="ecp5", bram="ecp5")
    inputs = random_problem(np.random.default_rng(31), 70, 11, 5, 13, "bf16")
    for settings in ({"idx_type": 0, "expert_token_num_type": 1},
                     {"idx_type": 1, "expert_token_num_type": 0}):
        check(inputs, settings, sim="icarus", stall=stall, seed=7, params=params)


def test_moe_re_routing_formats_and_memory_latency():
    """fp16 and bf16 on one build; int8 scales moved bit for bit (NaN payloads too); full
    rate up to ``max_outstanding - 1`` of memory latency."""
    rng = np.random.default_rng(5)
    for fmt in ("fp16", "bf16"):
        inputs = random_problem(rng, 50, 9, 4, 16, fmt, zeros=0.5)
        check(inputs, {"memory_latency": WIDE.max_outstanding - 1}, seed=3)
    inputs = random_problem(rng, 60, 24, 6, 8, "int8", scales=True, count_dtype=np.int64)
    inputs["per_token_scales"][::7] = np.float32(np.nan)
    inputs["per_token_scales"].view(np.uint32)[1::7] = 0x7fc0_1234   # a NaN payload
    out = check(inputs, {"memory_latency": 1}).outputs
    _, _, gather, _ = UNIT.expected(UNIT.problem(inputs, {}))
    assert np.array_equal(out["permute_per_token_scales"].view(np.uint32),
                          inputs["per_token_scales"].view(np.uint32)[gather])


def raw(inputs, counts=None, sizes=None, *, stall=0.0, params=None):
    """Run the hardware on ``counts`` as given (no host checks)."""
    problem = UNIT.problem(inputs, {})
    params = params or WIDE
    return simulate_raw(problem, params, counts=counts, sizes=sizes, sim=SIM, stall=stall)


def assert_refused(res, params, ranks, experts, *, stall=0.0):
    """error set, every count taken, nothing read or written, done at the no-move count."""
    assert res["error"] == 1
    assert int(res["counts_taken"]) == ranks * experts
    assert len(res["write_addr"]) == 0 and len(res["request_addr"]) == 0
    assert len(res["row"]) == 0 and len(res["expert_token_num"]) == experts
    if stall == 0.0:
        assert res["cycles"] == params.cycles(0, 0, ranks, experts)


@pytest.mark.parametrize("stall", STALLS)
def test_moe_re_routing_bad_counts_raise_error(stall):
    """A negative count, counts summing to more or less than A, a count above A, and
    hidden = 0 with A > 0: the error flag, and not one token written."""
    inputs = worked_example(ml_dtypes.bfloat16)
    for counts in ([[1, -1, 3], [2, 1, 0]],       # negative, still summing to 6
                   [[1, 0, 2], [2, 1, 1]],        # 7 > A
                   [[1, 0, 2], [2, 0, 0]],        # 5 < A
                   [[1, 0, 2], [2, 1, 1 << 20]],  # far above A (and max_tokens)
                   [[-(1 << 31), 0, 0], [0, 0, 6]]):
        res = raw(inputs, np.array(counts, np.int64), stall=stall)
        assert_refused(res, WIDE, 2, 3, stall=stall)
    res = raw(inputs, sizes={"hidden": 0}, stall=stall)
    assert_refused(res, WIDE, 2, 3, stall=stall)
    # More non-empty blocks than max_blocks (64): 6 x 16 blocks of one token each.
    inputs = {"tokens": np.zeros((96, 2), ml_dtypes.bfloat16),
              "expert_token_num_per_rank": np.ones((6, 16), np.int32)}
    res = simulate_raw(UNIT.problem(inputs, {}), WIDE, sim=SIM, stall=stall)
    assert_refused(res, WIDE, 6, 16, stall=stall)
    # int64 counts on the int8 build: a negative in the upper half of the word.
    rng = np.random.default_rng(2)
    inputs = random_problem(rng, 20, 5, 2, 4, "int8", scales=True, count_dtype=np.int64)
    counts = inputs["expert_token_num_per_rank"].copy()
    counts[1, 2] -= 1 << 40
    counts[1, 3] += 1 << 40                        # the sum is still A
    res = raw(inputs, counts, params=NARROW, stall=stall)
    assert_refused(res, NARROW, 2, 4, stall=stall)
    assert int(res["scales_taken"]) <= 2        # at most what the scales' skid buffer holds


@pytest.mark.parametrize("count_type", ["uint32", "uint64"])
def test_moe_re_routing_unsigned_counts(count_type):
    """Unsigned count types in the hardware: a run is bit-exact at the exact count; a count
    with its top bit set (above A) is refused, and so is one whose addition wraps the count
    width back to A."""
    params = WIDE.replace(count_type=count_type)
    dtype = np.dtype(count_type)
    inputs = {**worked_example(ml_dtypes.bfloat16),
              "expert_token_num_per_rank": COUNTS.astype(dtype)}
    check(inputs, params=params)
    bits = dtype.itemsize * 8
    for counts in ([[1, 0, 2], [2, 1, 1 << (bits - 1)]],           # top bit set: huge
                   [[1, 0, 2], [2, 2, (1 << bits) - 1]]):          # the sum wraps to A = 6
        res = raw(inputs, np.array(counts, dtype), params=params)
        assert_refused(res, params, 2, 3)


def test_moe_re_routing_sizes_above_maxima():
    inputs = worked_example(ml_dtypes.bfloat16)
    for sizes in ({"tokens": WIDE.max_tokens + 1}, {"hidden": WIDE.max_hidden + 1},
                  {"num_ranks": WIDE.max_ranks + 1}, {"num_experts": WIDE.max_experts + 1}):
        res = raw(inputs, sizes=sizes)
        assert res["error"] == 1 and res["cycles"] == EMPTY_CYCLES
        assert int(res["counts_taken"]) == 0 and len(res["write_addr"]) == 0


def test_moe_re_routing_host_errors():
    inputs = worked_example()

    def attempt(counts=None, settings=None, params=WIDE.replace(format="fp16"), **changes):
        data = {**inputs, **changes}
        if counts is not None:
            data["expert_token_num_per_rank"] = np.asarray(counts, np.int32)
        run(UNIT, data, settings, params=params)

    with pytest.raises(HostError, match=r"expert_token_num_per_rank\[1, 2\] = -1 \(rank 1, "
                                        r"expert 2\) is negative"):
        attempt([[1, 0, 2], [2, 2, -1]])
    with pytest.raises(HostError, match=r"sums to 7, not A = 6 .*rank 1, expert 2 \(1 tokens\) "
                                        r"ends at row 7, past A"):
        attempt([[1, 0, 2], [2, 1, 1]])
    with pytest.raises(HostError, match=r"sums to 5, not A = 6 .*\(rank 1, expert 2\) ends at "
                                        r"row 5, 1 short"):
        attempt([[1, 0, 2], [2, 0, 0]])
    with pytest.raises(HostError, match="tokens = 6 exceeds the unit's max_tokens of 5"):
        attempt(params=WIDE.replace(format="fp16", max_tokens=5))
    with pytest.raises(HostError, match="num_experts = 3 exceeds the unit's max_experts of 2"):
        attempt(params=WIDE.replace(format="fp16", max_experts=2))
    with pytest.raises(HostError, match=r"has 4 non-empty blocks, above the unit's max_blocks "
                                        r"of 3 \(the first past it: rank 1, expert 1\)"):
        attempt(params=WIDE.replace(format="fp16", max_blocks=3))
    with pytest.raises(HostError, match="the problem needs max_ranks >= 2, but max_ranks = 1"):
        attempt(settings={"max_ranks": 1}, params=None)
    with pytest.raises(HostError, match="tokens must have dtype int8, float16 or bfloat16, "
                                        "not float32"):
        attempt(tokens=np.zeros((6, 3), np.float32))
    with pytest.raises(HostError, match="has dtype float16, but the unit's format is int8"):
        attempt(params=NARROW)
    with pytest.raises(HostError, match="per_token_scales were given, but the unit was built "
                                        "with scales=False"):
        attempt(per_token_scales=np.ones(6, np.float32))
    with pytest.raises(HostError, match="count_type is int64"):
        attempt(params=NARROW.replace(format="fp16"))
    with pytest.raises(HostError, match=r"per_token_scales must have shape \(6,\) \[A\], not "
                                        r"\(5,\)"):
        attempt(per_token_scales=np.ones(5, np.float32))
    with pytest.raises(HostError, match="per_token_scales must have dtype float32, not float16"):
        attempt(per_token_scales=np.ones(6, np.float16))
    with pytest.raises(HostError, match="idx_type must be 0 or 1, not 2"):
        attempt(settings={"idx_type": 2})
    with pytest.raises(HostError, match="tokens must have H >= 1 elements per token, not 0"):
        attempt(tokens=np.zeros((6, 0), np.float16))


@pytest.mark.parametrize("settings,message", [
    (dict(lanes=3), "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (dict(format="fp32"), "format must be int8, fp16 or bf16, not 'fp32'"),
    (dict(count_type="int16"), "count_type must be int32, int64, uint32 or uint64, not 'int16'"),
    (dict(max_tokens=0), "max_tokens must be an integer between 1 and"),
    (dict(max_experts=5000), "max_experts must be an integer between 1 and 4096, not 5000"),
    (dict(max_blocks=5000), "max_blocks must be an integer between 1 and 4096, not 5000"),
    (dict(scales=2), "scales must be False or True, not 2"),
])
def test_moe_re_routing_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        MoeReRoutingParams(**settings)


def test_moe_re_routing_defaults_and_sizing():
    """The defaults hold the Ascend scales (A up to 32768, H 7168, N 32 with E 16, E 256);
    without settings the unit is sized to the problem."""
    params = MoeReRoutingParams()
    assert (params.max_tokens, params.max_ranks, params.max_experts) == (32768, 32, 256)
    assert params.max_hidden >= 7168
    problem = UNIT.problem({**worked_example(), "per_token_scales": np.ones(6, np.float32)}, {})
    assert UNIT.params_for(problem, {}) == MoeReRoutingParams(
        format="fp16", max_tokens=6, max_hidden=3, max_ranks=2, max_experts=3, max_blocks=4)
    # The formula: A*ceil(H/lanes) + N*E + E + overhead; 4096 x 7168 bf16 at 16 lanes.
    params = MoeReRoutingParams(lanes=16)
    cycles = params.cycles(4096, 7168, 16, 16, 2)
    assert cycles == 4096 * 448 + 16 * 16 + 16 + params.move_overhead + \
        params.product_latency + 2
    assert 4096 * 448 / cycles >= 0.99


def test_counter_bank_amount():
    """The counter bank's ``amount`` (Amaranth's simulator): back-to-back additions to one
    counter, a read after them, and clear."""
    bank = CounterBank(4, 8, amount_width=4)
    top = Module()
    top.submodules.bank = bank
    sim = Simulator(top)
    sim.add_clock(1e-6)
    requests = [(1, 5), (1, 7), (2, 3), (1, 1), (2, 0), (1, None), (2, None), (0, None)]
    seen = []

    async def bench(ctx):
        ctx.set(bank.en, 1)
        for index, amount in requests + [(0, None)] * CounterBank.latency:
            ctx.set(bank.valid, 1)
            ctx.set(bank.index, index)
            ctx.set(bank.increment, amount is not None)
            ctx.set(bank.amount, amount or 0)
            await ctx.tick()
            seen.append(ctx.get(bank.value))

    sim.add_testbench(bench)
    sim.run()
    # the value before each request's addition, CounterBank.latency cycles after it entered
    lag = CounterBank.latency - 1
    assert seen[lag:lag + len(requests)] == [0, 5, 0, 12, 3, 13, 3, 0]
