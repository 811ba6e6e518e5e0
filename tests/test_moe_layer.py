"""The whole MoE layer (SPEC 1.8: locations -> dispatch -> affine experts -> combine, tutel's
postscore form) on its emitted Verilog (every case on Verilator's fast path; a few also through
the cocotb bench in Verilator and Icarus, ONE cocotb run per case), with and without random
valid/ready pauses on all seven streams (pairs, data, expert parameters, read request, read
response, write, output), scored bit for bit against the chained golden ``golden.moe_layer``
with scoreboards over every output beat, every write and every read of the expert buffer;
stall-free runs must take exactly the documented cycle count, phase by phase; the whole run's
cycles are the phases' sum. Plus parameters sized from settings, the benchmark problem,
Amaranth-simulator checks of the status outputs, and parameter and host errors."""

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Fragment, Module
from amaranth.sim import Simulator

from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw import golden
from moe_hw.golden.testing import bit_equal, random_floats
from moe_hw.host.checks import HostError
from moe_hw.host.moe_layer import UNIT, layer_gates, layer_problem
from moe_hw.host.unit import BenchShape, run
from moe_hw.params import ParameterError
from moe_hw.units.moe_layer import MoELayer, MoELayerParams

from conftest import SIM, STALLS, simulator_cases, simulator_params

# One generous design per format serves every case (a Verilator build of the composite takes
# 10 to 20 s).
MAXIMA = dict(lanes=4, max_tokens=64, max_hidden=32, max_experts=16, max_capacity=64,
              max_top_k=2)
FP32 = MoELayerParams(format="fp32", **MAXIMA)
BF16 = MoELayerParams(format="bf16", **MAXIMA)

CASES = {
    # DUET toy scale (seed 000: S=21, E=6, k=1, rows of L=16; d_model=8 is the width of the
    # DUET experts' outputs, which an elementwise affine expert does not change, so H=16
    # throughout). Default capacity k*ceil(1.25*S/E) = 5: some tokens drop.
    "duet_toy": dict(tokens=21, experts=6, k=1, hidden=16),
    # top-2 at random, H not a multiple of the lanes, default capacity.
    "random_k2": dict(tokens=40, experts=5, k=2, hidden=29),
    # Capacity drops and 10 of 16 experts empty; one-beat rows, so the location generator's
    # read-out of 16 totals outlasts the dispatch.
    "drops_empty_experts": dict(tokens=10, experts=16, k=2, hidden=3, capacity=2,
                                experts_used=[1, 4, 5, 9, 12, 15]),
    # One token: the token counters wrap at every step, and the combine reads one header
    # (the flags of T == 1).
    "one_token": dict(tokens=1, experts=3, k=2, hidden=5),
    # Identity experts (no scale, no bias): the expert phase is skipped.
    "identity": dict(tokens=33, experts=4, k=2, hidden=8, affine=False, specials=0.2),
    # NaN, Inf, subnormals, -0.0 in the gates, the token rows, the scales and the biases.
    "special_values": dict(tokens=24, experts=4, k=2, hidden=12, specials=0.3),
    # A scale without a bias (the host substitutes bias -0.0, which adds exactly nothing).
    "scale_only": dict(tokens=16, experts=3, k=2, hidden=6, bias=False, specials=0.2),
    # Zero-element problems: no tokens; no hidden elements; no routed gate at all (k = 0);
    # no capacity (every pair dropped, every output +0.0).
    "zero_tokens": dict(tokens=0, experts=4, k=2, hidden=8, capacity=4),
    "zero_hidden": dict(tokens=9, experts=4, k=2, hidden=0),
    "zero_k": dict(tokens=7, experts=3, k=0, hidden=5, capacity=3),
    "zero_capacity": dict(tokens=9, experts=4, k=2, hidden=8, capacity=0),
}


def problem(seed, *, tokens, experts, k, hidden, capacity=None, dtype=np.float32,
            affine=True, scale=True, bias=True, specials=0.0, experts_used=None):
    """``(inputs, settings)``: a random layer; no capacity setting means the default factor."""
    rng = np.random.default_rng(seed)
    gates = layer_gates(rng, tokens, experts, k, dtype, experts_used=experts_used,
                               specials=specials) if k else np.zeros((tokens, experts), dtype)
    inputs = {"gates": gates, "input": random_floats(rng, (tokens, hidden), dtype,
                                                     specials=specials)}
    if affine and scale:
        inputs["expert_scale"] = random_floats(rng, (experts,), dtype, specials=specials)
    if affine and bias:
        inputs["expert_bias"] = random_floats(rng, (experts,), dtype, specials=specials)
    return inputs, ({} if capacity is None else {"capacity": capacity})


def check(inputs, settings, params, sim=SIM, stall=0.0, seed=0):
    """One run, scored against the chained golden with every scoreboard; stall-free it must
    take exactly the documented count, phase by phase."""
    outcome = run(UNIT, inputs, settings, params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    phases = outcome.results["phase_cycles"]
    assert sum(phases.values()) == outcome.cycles
    if stall == 0.0:
        expected = UNIT.phase_cycles(outcome.problem, outcome.params)
        assert phases == expected, f"phases took {phases}, formula {expected}"
        assert outcome.cycles == outcome.expected_cycles
    else:
        assert outcome.cycles > outcome.expected_cycles or outcome.cycles == EMPTY_CYCLES
    return outcome


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, case", simulator_cases(
    CASES, cocotb=["duet_toy", "drops_empty_experts", "zero_tokens"]))
def test_moe_layer_cases(sim, case, stall):
    outcome = check(*problem(sorted(CASES).index(case), **CASES[case]), FP32, sim, stall,
                    seed=5)
    phases = outcome.results["phase_cycles"]
    if case == "drops_empty_experts":
        assert outcome.outputs["dropped"] > 0
        if stall == 0.0:   # phase 1 lasts at least the location generator's 16-total read-out
            assert phases["route_dispatch"] >= 10 * 2 + 16 + 4 + 1
    if case == "identity":
        assert phases["experts"] == 0
    if case == "duet_toy":   # default capacity 1 * ceil(1.25 * 21 / 6) = 5 slots per expert
        assert golden.capacity_from_factor(1.25, 21, 6, 1) == 5
        assert outcome.results["buffer"].shape == (30, 16)


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("capacity", [1, 2])
def test_moe_layer_one_row_experts(capacity, stall):
    """Experts of one row (capacity 1: all of them; capacity 2: some), of one beat each: the
    expert phase loads the next work-list entry in the cycle the last row's command is taken,
    entry after entry, so the last-row flag and the entries-left flags load from the list."""
    inputs, settings = problem(13 + capacity, tokens=14, experts=8, k=1, hidden=4,
                               capacity=capacity)
    check(inputs, settings, FP32, stall=stall, seed=7)
    rows = layer_problem(inputs["gates"], inputs["input"], capacity=capacity).filled_rows
    assert (rows == 1).sum() >= 3 and rows.max() == capacity, rows


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim", simulator_params(SIM, "icarus"))
def test_moe_layer_bf16(sim, stall):
    """bfloat16 with specials, top-2, a bias without a scale (the host substitutes 1.0)."""
    inputs, settings = problem(11, tokens=30, experts=5, k=2, hidden=21,
                               dtype=ml_dtypes.bfloat16, specials=0.2, scale=False)
    check(inputs, settings, BF16, sim, stall, seed=3)


# The pair memory as the ECP5 synthesis builds it (DP16KD blocks with their output register,
# under their simulation model): 1100 words, so one row of 2048 x 9 blocks, the aspect that
# holds them all (the rows of 1024 x 18 blocks past 16384 words are checked against the
# generic build in test_memories.py).
ECP5_BRAM = MoELayerParams(format="fp32", lanes=1, max_tokens=1100, max_hidden=2,
                           max_experts=4, max_capacity=1100, max_top_k=2, bram="ecp5")


@pytest.mark.parametrize("stall", STALLS)
def test_moe_layer_ecp5_block_ram(stall):
    """The same results and the same cycle count with the pair memory in DP16KD blocks."""
    inputs, settings = problem(23, tokens=1100, experts=4, k=2, hidden=2, specials=0.1)
    outcome = check(inputs, {**settings, "capacity": 500}, ECP5_BRAM, SIM, stall,
                    seed=7)
    assert outcome.outputs["dropped"] > 0


# ---- expert stacks: every expert a scan_layers stack of its own (experts=scan_layers) -----------
STACK = MoELayerParams(format="fp32", experts="scan_layers", max_layers=4, lanes=2,
                       max_tokens=32, max_hidden=16, max_experts=8, max_capacity=32,
                       max_top_k=2)

STACK_CASES = {
    # Three layers with relu, H not a multiple of the lanes, default capacity.
    "relu": dict(tokens=20, experts=5, k=2, hidden=7, layers=3, relu=1),
    # Drops, and 5 of 8 experts empty: their parameters are taken and dropped.
    "drops_empty_experts": dict(tokens=10, experts=8, k=2, hidden=3, layers=2, capacity=2,
                                experts_used=[1, 4, 6]),
    # One layer without relu, NaN, Inf, subnormals and -0.0 everywhere.
    "one_layer_specials": dict(tokens=12, experts=3, k=1, hidden=4, layers=1, specials=0.3),
    # The most layers the unit holds; every expert filled.
    "four_layers": dict(tokens=16, experts=2, k=2, hidden=16, layers=4, relu=1),
    # Zero-element problems: no hidden elements (no parameter beats at all); no capacity (the
    # parameters of every expert dropped, no row run); no tokens.
    "zero_hidden": dict(tokens=5, experts=3, k=2, hidden=0, layers=2),
    "zero_capacity": dict(tokens=6, experts=3, k=2, hidden=5, layers=2, capacity=0),
    "zero_tokens": dict(tokens=0, experts=3, k=2, hidden=5, layers=2, capacity=2),
}


def stack_problem(seed, *, tokens, experts, k, hidden, layers, relu=0, capacity=None,
                  dtype=np.float32, specials=0.0, experts_used=None):
    """``(inputs, settings)``: a random layer whose experts are stacks of ``layers`` layers."""
    inputs, settings = problem(seed, tokens=tokens, experts=experts, k=k, hidden=hidden,
                               capacity=capacity, dtype=dtype, affine=False,
                               specials=specials, experts_used=experts_used)
    rng = np.random.default_rng(seed + 100)
    inputs["expert_scale"] = random_floats(rng, (experts, layers, hidden), dtype,
                                           specials=specials)
    inputs["expert_bias"] = random_floats(rng, (experts, layers, hidden), dtype,
                                          specials=specials)
    return inputs, {**settings, "relu": relu}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, case", simulator_cases(
    STACK_CASES, cocotb=[], icarus=["drops_empty_experts", "zero_capacity"]))
def test_moe_layer_expert_stacks(sim, case, stall):
    """Bit-exact against golden.moe_layer with per-expert scan_layers stacks; every expert's
    L*B parameter beats taken (the empty experts' dropped); the exact phase cycles."""
    spec = STACK_CASES[case]
    outcome = check(*stack_problem(sorted(STACK_CASES).index(case), **spec), STACK, sim,
                    stall, seed=9)
    phases = outcome.results["phase_cycles"]
    beats = -(-spec["hidden"] // STACK.lanes)
    if spec["tokens"]:
        assert int(outcome.results["params_taken"]) == spec["experts"] * spec["layers"] * beats
    if stall == 0.0 and spec["tokens"] and spec["hidden"]:
        # Never less than the parameters and L passes over the filled rows.
        rows = outcome.problem["layer"].expert_rows
        assert phases["experts"] >= (spec["experts"] + rows * spec["layers"]) * beats


@pytest.mark.parametrize("stall", STALLS)
def test_moe_layer_affine_experts_on_a_stack_unit(stall):
    """Affine experts ([E] scale and bias) run on a stack unit as one-layer stacks: the same
    two roundings, bit for bit."""
    inputs, settings = problem(31, tokens=18, experts=4, k=2, hidden=9, specials=0.2)
    check(inputs, settings, STACK, SIM, stall, seed=4)


@pytest.mark.parametrize("sim", simulator_params("icarus"))
def test_moe_layer_expert_stacks_bf16(sim):
    """bfloat16 stacks with relu under random pauses."""
    params = MoELayerParams(format="bf16", experts="scan_layers", max_layers=2, lanes=4,
                            max_tokens=8, max_hidden=8, max_experts=4, max_capacity=8,
                            max_top_k=2)
    inputs, settings = stack_problem(3, tokens=8, experts=4, k=2, hidden=6, layers=2, relu=1,
                                     dtype=ml_dtypes.bfloat16, specials=0.2)
    check(inputs, settings, params, sim, 0.3, seed=2)


def test_moe_layer_expert_stack_host_errors():
    inputs, settings = stack_problem(0, tokens=4, experts=3, k=2, hidden=8, layers=2)

    def attempt(changes, settings=settings, params=STACK):
        run(UNIT, {**inputs, **changes}, settings, params=params)

    with pytest.raises(HostError, match="but the unit has experts=affine; build it with "
                                        "experts=scan_layers"):
        attempt({}, params=FP32)
    with pytest.raises(HostError, match="layers = 5 exceeds the unit's max_layers of 4"):
        attempt({name: np.ones((3, 5, 8), np.float32)
                 for name in ("expert_scale", "expert_bias")})
    with pytest.raises(HostError, match=r"expert_bias must have shape \(3, L, 8\) \[E, L, H\]"):
        attempt({"expert_bias": np.ones((3, 2, 7), np.float32)})
    with pytest.raises(HostError, match="expert_scale and expert_bias must have one shape"):
        attempt({"expert_bias": np.ones((3, 1, 8), np.float32)})
    with pytest.raises(HostError, match="expert_bias is missing: expert stacks need"):
        run(UNIT, {k: v for k, v in inputs.items() if k != "expert_bias"}, settings,
            params=STACK)
    with pytest.raises(HostError, match="L = 0 layers"):
        attempt({name: np.ones((3, 0, 8), np.float32)
                 for name in ("expert_scale", "expert_bias")})
    with pytest.raises(HostError, match="relu must be 0 or 1, not 2"):
        attempt({}, {**settings, "relu": 2})
    affine, _ = problem(0, tokens=4, experts=3, k=2, hidden=8)
    with pytest.raises(HostError, match="relu=1 applies to expert stacks only"):
        run(UNIT, affine, {"relu": 1}, params=STACK)


def test_moe_layer_sized_from_settings():
    """Parameters from ``--set``-style settings (sized to the problem otherwise) reproduce the
    golden chain; without a capacity the default factor 1.25 applies."""
    inputs, _ = problem(17, tokens=20, experts=4, k=2, hidden=10, specials=0.1)
    settings = {name: getattr(FP32, name) for name in MAXIMA}
    outcome = run(UNIT, inputs, settings)
    assert outcome.params == FP32 and outcome.passed, outcome.problems
    want, dropped = golden.moe_layer(inputs["gates"], inputs["input"],
                                     capacity=golden.capacity_from_factor(1.25, 20, 4, 2),
                                     scale=inputs["expert_scale"], bias=inputs["expert_bias"])
    assert set(outcome.outputs) == {"output", "dropped", "cycles"}
    assert bit_equal(outcome.outputs["output"], want) and outcome.outputs["dropped"] == dropped
    assert any(line.startswith("check: bit-exact") for line in outcome.report)
    identity = {name: inputs[name] for name in ("gates", "input")}
    outcome = run(UNIT, identity, {**settings, "capacity": 3})
    want, dropped = golden.moe_layer(inputs["gates"], inputs["input"], capacity=3)
    assert bit_equal(outcome.outputs["output"], want)
    assert outcome.outputs["dropped"] == dropped > 0


def test_bench_problem_small():
    """The ``bench units`` problem at a small shape: bit-exact, and its top-level cycles and
    ideal are the whole run's (the three phases together)."""
    shape = BenchShape(tokens=16, hidden=12, experts=4, top_k=2, lanes=4)
    (inputs, settings), = UNIT.bench_problems(shape, seed=0).values()
    outcome = check(inputs, settings, FP32)
    assert outcome.ideal_cycles == sum(UNIT.phase_ideals(outcome.problem, FP32).values())
    assert outcome.ideal_cycles >= 2 * 16 * 3 + 2 * 16 * 3     # dispatch and combine beats
    assert outcome.efficiency <= 1.0


def _float_cores(design):
    """The float multipliers and adders in the elaborated ``design``, by class name."""
    counts = {}

    def walk(fragment):
        for origin in fragment.origins or ():
            name = type(origin).__name__
            if name in ("FloatMultiplierCore", "FloatAdderCore"):
                counts[name] = counts.get(name, 0) + 1
        for subfragment, *_ in fragment.subfragments:
            walk(subfragment)

    walk(Fragment.get(design, None))
    return counts


@pytest.mark.parametrize("lanes", [1, 4])
def test_moe_layer_affine_experts_share_the_combine_lanes(lanes):
    """Affine experts run on the combine unit's multiply-add lanes: one float multiplier and
    one adder per lane in the whole layer (the dispatch has none: its gate is 1.0); expert
    stacks keep their own layer datapath beside the combine's lanes."""
    affine = _float_cores(MoELayer(lanes=lanes, max_hidden=16))
    assert affine == {"FloatMultiplierCore": lanes, "FloatAdderCore": lanes}
    stacked = _float_cores(MoELayer(lanes=lanes, max_hidden=16, experts="scan_layers"))
    assert stacked == {"FloatMultiplierCore": 2 * lanes, "FloatAdderCore": 2 * lanes}


# ---- Amaranth simulator: status outputs ------------------------------------------------------

def test_moe_layer_status_pysim():
    """A size past its maximum sets ``error`` and ``done`` one cycle after start and takes
    nothing; S = 0 is done at once; a reset in the middle of a run returns the unit to idle
    with nothing valid, and a start after that is taken."""
    params = MoELayerParams(format="bf16", lanes=1, max_tokens=4, max_hidden=2, max_experts=2,
                            max_capacity=4, max_top_k=1)
    dut = MoELayer(params)
    top = Module()
    top.domains.sync = sync = ClockDomain()
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-6)
    outputs = (dut.output.valid, dut.write.valid, dut.read_request.valid)
    inputs = (dut.pair.ready, dut.data.ready, dut.expert_params.ready)

    async def start(ctx, tokens, hidden=2):
        for port, value in ((dut.tokens, tokens), (dut.hidden, hidden), (dut.top_k, 1),
                            (dut.num_experts, 2), (dut.capacity, 4), (dut.affine, 1)):
            ctx.set(port, value)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)

    async def bench(ctx):
        for stream in (dut.pair, dut.data, dut.expert_params):
            ctx.set(stream.valid, 1)
        ctx.set(dut.output.ready, 1)
        ctx.set(dut.write.ready, 1)
        ctx.set(dut.read_request.ready, 1)
        await start(ctx, 5)                       # S = 5 > max_tokens
        await ctx.tick()                          # the run control's decide cycle
        assert ctx.get(dut.done) and ctx.get(dut.error) and not ctx.get(dut.busy)
        assert not any(ctx.get(s) for s in inputs + outputs)
        await start(ctx, 0)                       # S = 0
        await ctx.tick()
        assert ctx.get(dut.done) and not ctx.get(dut.error) and not ctx.get(dut.busy)
        await start(ctx, 3)
        for _ in range(6):
            await ctx.tick()
        assert ctx.get(dut.busy) and ctx.get(dut.phase) == 1 and ctx.get(dut.dropped) == 0
        ctx.set(sync.rst, 1)
        await ctx.tick()
        ctx.set(sync.rst, 0)
        for _ in range(30):
            assert not ctx.get(dut.busy) and not ctx.get(dut.done) and ctx.get(dut.phase) == 0
            assert not any(ctx.get(s) for s in inputs + outputs)
            await ctx.tick()
        await start(ctx, 3, hidden=1)
        assert ctx.get(dut.busy) and not ctx.get(dut.error)

    sim.add_testbench(bench)
    sim.run()


# ---- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("settings,message", [
    (dict(lanes=3), "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (dict(format="fp64"), "format must be fp32, fp16 or bf16, not 'fp64'"),
    (dict(max_top_k=0), "max_top_k must be an integer between 1 and 16, not 0"),
    (dict(max_tokens=0), "max_tokens must be an integer between 1 and"),
    (dict(add_stages=0), "add_stages must be an integer between 1 and 16, not 0"),
    (dict(index_width=8, max_capacity=4096), "index_width must hold max_capacity"),
    (dict(index_width=12, max_tokens=4096, max_top_k=2, max_capacity=16),
     "index_width must hold a location of max_tokens \\* max_top_k pairs"),
])
def test_moe_layer_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        MoELayerParams(**settings)


def test_moe_layer_old_parameter_names():
    """``max_k`` and ``outstanding`` are the old names of ``max_top_k`` and
    ``max_outstanding`` (accepted, with a warning)."""
    with pytest.deprecated_call(match="is deprecated"):
        params = UNIT.make_params({"max_k": 3, "outstanding": 8})
    assert (params.max_top_k, params.max_outstanding) == (3, 8)


def test_moe_layer_host_errors():
    inputs, _ = problem(0, tokens=4, experts=3, k=2, hidden=8, affine=False)
    gates, data = inputs["gates"], inputs["input"]
    capacity = {"capacity": 4}

    def attempt(changes, settings=capacity, params=None):
        run(UNIT, {**inputs, **changes}, settings, params=params)

    with pytest.raises(HostError, match=r"expert_scale must have shape \(3,\) \[E\]: the "
                                        "hardware's experts apply one scale per expert"):
        attempt({"expert_scale": np.ones((3, 8), np.float32)})
    with pytest.raises(HostError, match="expert_bias has dtype float16, but input has float32"):
        attempt({"expert_bias": np.zeros(3, np.float16)})
    with pytest.raises(HostError, match="hidden = 8 exceeds the unit's max_hidden of 4"):
        attempt({}, params=MoELayerParams(max_hidden=4))
    with pytest.raises(HostError, match="the problem needs max_hidden >= 8"):
        attempt({}, {**capacity, "max_hidden": 4})
    with pytest.raises(HostError, match="gates must be non-negative"):
        attempt({"gates": -gates})
    with pytest.raises(HostError, match="same number of nonzeros in every row"):
        uneven = gates.copy()
        uneven[0, :] = 0
        attempt({"gates": uneven})
    with pytest.raises(HostError, match="input must have 4 rows"):
        attempt({"input": data[:3]})
    with pytest.raises(HostError, match="the unit's format is bf16"):
        attempt({}, params=BF16)
    with pytest.raises(HostError, match="capacity must be a non-negative integer, not -1"):
        attempt({}, {"capacity": -1})
    with pytest.raises(HostError, match="memory_latency must be at least 1, not 0"):
        attempt({}, {**capacity, "memory_latency": 0})
    with pytest.raises(HostError, match="lacks input"):
        run(UNIT, {"gates": gates}, capacity)
