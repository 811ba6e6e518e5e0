"""The scan_layers_unrolled unit (SPEC 1.7: L copies of the layer, for comparison) on its
emitted Verilog (cocotb, Verilator and Icarus), with and without random valid/ready stalls,
bit for bit against the same golden model as scan_layers, with the stall-free cycle count
asserted; its own host errors."""

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

CASES = {"partial_beat": (5, 7, 1), "full": (12, 16, 0), "one_beat": (1, 1, 1),
         "no_tokens": (0, 8, 1)}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, case", simulator_cases(list(CASES),
                                                      icarus=["partial_beat", "no_tokens"]))
def test_unrolled_cases(sim, case, stall):
    tokens, hidden, relu = CASES[case]
    inputs = UNIT.random_inputs(tokens=tokens, hidden=hidden, layers=PARAMS.layers,
                                seed=len(case))
    outcome = run(UNIT, inputs, {"relu": relu}, params=PARAMS, sim=sim, stall=stall, seed=3)
    assert outcome.passed, outcome.problems
    want = scan_layers_golden(inputs["input"], inputs["scale"], inputs["bias"], relu)
    assert outcome.outputs["output"].shape == want.shape
    if stall == 0.0:
        assert outcome.cycles == PARAMS.cycles(tokens, hidden)
        if tokens == 0:
            assert outcome.cycles == EMPTY_CYCLES


def test_unrolled_cycle_formula():
    """One beat per cycle through the chain: S*B + L*(1 + D) + the load and a constant."""
    latency = 3 * (1 + 6)
    assert PARAMS.latency == latency
    assert PARAMS.cycles(8, 16) == PARAMS.setup + 1 + 3 * 4 + 8 * 4 + latency + 4


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
    assert UNIT.params_for(UNIT.problem(inputs, {}), {}) == \
        ScanLayersUnrolledParams(max_tokens=2, max_hidden=4, layers=2)
    assert np.asarray(inputs["scale"]).shape == (2, 4)
