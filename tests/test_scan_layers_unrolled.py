"""The scan_layers_unrolled unit (SPEC 1.7: L copies of the layer, for comparison) on its
emitted Verilog (every case on Verilator's fast path; a few also through the cocotb bench in
Verilator and Icarus), with and without random valid/ready stalls,
bit for bit against the same golden model as scan_layers, with the stall-free cycle count
asserted, in fp32 and int8 (saturating); its own host errors."""

import numpy as np
import pytest

from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.host.checks import HostError
from moe_hw.host.scan_layers import scan_layers_golden
from moe_hw.host.scan_layers_unrolled import UNIT
from moe_hw.host.unit import run
from moe_hw.params import ParameterError
from moe_hw.units.scan_layers_unrolled import ScanLayersUnrolledParams

from conftest import STALLS, simulator_cases

PARAMS = ScanLayersUnrolledParams(lanes=4, max_tokens=40, max_hidden=16, layers=3,
                                  mul_stages=3, add_stages=3)
# int8 at its default depths (D = 4) on the generic product (scan_layers' tests cover the
# ECP5 DSP model): one more build.
PARAMS_INT8 = PARAMS.replace(format="int8", mul_stages=None, add_stages=None)

CASES = {"partial_beat": (5, 7, 1, "fp32"), "full": (12, 16, 0, "fp32"),
         "one_beat": (1, 1, 1, "fp32"), "no_tokens": (0, 8, 1, "fp32"),
         "int8_full": (40, 16, 0, "int8"), "int8_partial_relu": (7, 13, 1, "int8")}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, case", simulator_cases(
    list(CASES), cocotb=["partial_beat", "no_tokens"], icarus=["int8_partial_relu"]))
def test_unrolled_cases(sim, case, stall):
    tokens, hidden, relu, format = CASES[case]
    params = PARAMS_INT8 if format == "int8" else PARAMS
    inputs = UNIT.random_inputs(tokens=tokens, hidden=hidden, layers=params.layers,
                                format=format, seed=len(case))
    outcome = run(UNIT, inputs, {"relu": relu}, params=params, sim=sim, stall=stall, seed=3)
    assert outcome.passed, outcome.problems
    want = scan_layers_golden(inputs["input"], inputs["scale"], inputs["bias"], relu)
    output = outcome.outputs["output"]
    assert output.shape == want.shape and output.dtype == want.dtype
    if format == "int8":                         # the clamp is reached at both ends
        low = 0 if relu else -128
        assert (output == 127).any() and (output == low).any(), output
        assert ((output > low) & (output < 127)).any(), output
    if stall == 0.0:
        assert outcome.cycles == params.cycles(tokens, hidden)
        if tokens == 0:
            assert outcome.cycles == EMPTY_CYCLES


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("hidden", [9, 3])
def test_unrolled_one_layer(hidden, stall):
    """A chain of one layer (its load ends on the first layer's last beat), relu on, on the
    fast path; the stall-free cycle count exact. At H = 3 (one beat) the first token reads
    the word the load's last write is writing: the stream waits for the registered write."""
    params = PARAMS.replace(layers=1)
    inputs = UNIT.random_inputs(tokens=6, hidden=hidden, layers=1, seed=11)
    outcome = run(UNIT, inputs, {"relu": 1}, params=params, sim="fast", stall=stall, seed=5)
    assert outcome.passed, outcome.problems
    want = scan_layers_golden(inputs["input"], inputs["scale"], inputs["bias"], 1)
    assert np.array_equal(outcome.outputs["output"].view(np.uint32), want.view(np.uint32))
    if stall == 0.0:
        assert outcome.cycles == params.cycles(6, hidden)


def test_unrolled_cycle_formula():
    """One beat per cycle through the chain: S*B + L*(3 + D) + the load and a constant (each
    layer's parameter read takes two cycles and a register; the float step's clamp one more;
    the first read's address register one in all; the stream starts a cycle after the
    load)."""
    latency = 1 + 3 * (3 + 6 + 1)
    assert PARAMS.latency == latency
    assert PARAMS.cycles(8, 16) == PARAMS.setup + 2 + 3 * 4 + 8 * 4 + latency + 4
    assert PARAMS_INT8.latency == 1 + 3 * (3 + 4)    # int8: D = 2 + 2


def test_unrolled_host_errors():
    inputs = UNIT.random_inputs(tokens=2, hidden=4, layers=2, seed=0)
    with pytest.raises(HostError, match="scale and bias have 2 layers, but the unit is built "
                                        "for layers = 3"):
        run(UNIT, inputs, {"relu": 0}, params=PARAMS)
    with pytest.raises(HostError, match="the problem needs layers >= 2, but layers = 1"):
        run(UNIT, inputs, {"layers": 1})
    with pytest.raises(ParameterError, match="layers must be an integer between 1 and 1024, "
                                             "not 0"):
        ScanLayersUnrolledParams(layers=0)
    with pytest.raises(ParameterError, match="mul_stages must be at least 2 for format int8, "
                                             "not 0"):
        ScanLayersUnrolledParams(format="int8", mul_stages=0)
    int8 = UNIT.random_inputs(tokens=2, hidden=4, layers=3, format="int8", seed=0)
    with pytest.raises(HostError, match=r"input has dtype int8, but the unit's format is "
                                        r"fp32 \(float32\)"):
        run(UNIT, int8, {"relu": 0}, params=PARAMS)
    assert UNIT.params_for(UNIT.problem(int8, {}), {}).format == "int8"
    assert UNIT.params_for(UNIT.problem(inputs, {}), {}) == \
        ScanLayersUnrolledParams(max_tokens=2, max_hidden=4, layers=2)
    assert np.asarray(inputs["scale"]).shape == (2, 4)
