"""dispatch_backward_gate behind its AXI wrapper (``--set interface=axi``): its two read ports
(``input_read``/``input_data`` and ``grad_read``/``grad_data``, declared in ``axi_reads``)
become the AXI4 masters ``m_axi_input`` and ``m_axi_grad``, on the emitted Verilog with
cocotbext-axi (sim/bench_dispatch_backward_gate_axi.py): two AxiRams answer the read bursts
late, AxiLiteMaster programs and starts the run, the headers come in and the gate gradients
go out on AXI4-Streams, with and without random pauses on the streams and on both RAMs' AR
and R channels. The gradients are compared bit for bit with golden.dispatch_backward_gate,
DROPPED with the invalid pairs, and every read burst is checked (INCR, length, no 4 KiB
crossing, inside its buffer)."""

import dataclasses

import numpy as np
import pytest

from moe_hw.axi import AxiParams
from moe_hw.host.dispatch_backward_gate import UNIT, run_axi
from moe_hw.units.dispatch_backward_gate import DispatchBackwardGateParams

from conftest import simulator_params
from test_dispatch_backward_gate import problem

PARAMS = DispatchBackwardGateParams(format="fp32", lanes=4, max_tokens=64, max_top_k=2,
                                    max_hidden=64, max_capacity=32, max_experts=8)
# Short bursts and few outstanding ones, so that the small problems reach every limit.
AXI = AxiParams(axi_max_burst=16, axi_outstanding=2, axi_fifo_depth=64)

CASES = {
    # top-2 with capacity drops; H = 29: rows start off the bus words (realigned reads).
    "k2_drops": (dict(tokens=37, hidden=29, experts=5, capacity=9, k=2), (0x3000, 0x3040)),
    # Out-of-range and negative indices and locations: those pairs read nothing.
    "out_of_range": (dict(tokens=40, hidden=7, experts=6, capacity=5, k=2,
                          index_range=(-3, 9), location_range=(-2, 8)), (0x3000, 0x3000)),
    "zero_tokens": (dict(tokens=0, hidden=16, experts=2, capacity=4), (0x3000, 0x3000)),
}


@pytest.mark.parametrize("case, stall", [("k2_drops", 0.0), ("k2_drops", 0.3),
                                         ("out_of_range", 0.3), ("zero_tokens", 0.0)])
def test_dispatch_backward_gate_axi(case, stall):
    sizes, bases = CASES[case]
    prob = problem(sorted(CASES).index(case), **sizes)
    inputs = {name: prob[name] for name in UNIT.inputs}
    runtime = {name: prob[name] for name in ("num_experts", "capacity")}
    outputs, results, findings = run_axi(inputs, runtime, PARAMS, AXI, stall=stall, seed=7,
                                         bases=bases)
    assert findings == [], "\n".join(findings)
    assert set(outputs) == {"grad_gates", "dropped"}
    beats = results["burst_beats"]
    if case != "zero_tokens":
        assert int(results["input_bursts"]) > 0 and int(results["grad_bursts"]) > 0
        assert np.all(beats <= AXI.axi_max_burst)
    else:
        assert len(beats) == 0


@pytest.mark.parametrize("sim", simulator_params("icarus"))
def test_dispatch_backward_gate_axi_icarus(sim):
    """On Icarus (the four-state check), with pauses, and with the read masters' FIFOs in
    DP16KD blocks (their simulation model), as the synthesis flow builds them on ECP5."""
    sizes, bases = CASES["k2_drops"]
    prob = problem(sorted(CASES).index("k2_drops"), **sizes)
    _, results, findings = run_axi({name: prob[name] for name in UNIT.inputs},
                                   {name: prob[name] for name in ("num_experts", "capacity")},
                                   PARAMS, dataclasses.replace(AXI, axi_bram="ecp5"), sim=sim,
                                   stall=0.3, seed=3, bases=bases)
    assert findings == [], "\n".join(findings)
    assert int(results["input_bursts"]) > 0


def test_two_read_masters_and_their_bases():
    wrapper = UNIT.build_axi(UNIT.make_params({}, interface="axi"))
    wrapper._MustUse__silence = wrapper.unit._MustUse__silence = True
    masters = {bus["name"]: bus for bus in wrapper.buses() if bus["kind"] == "axi4"}
    assert set(masters) == {"m_axi_input", "m_axi_grad"}
    assert all(bus["channels"] == "read" for bus in masters.values())
    names = {r["name"] for r in wrapper.register_map()}
    assert {"INPUT_BASE", "GRAD_BASE", "DROPPED"} <= names
    assert wrapper.unit.params.max_outstanding == 256
