"""combine_gather behind its AXI wrapper (``--set interface=axi``), on its emitted Verilog with
cocotbext-axi (sim/bench_combine_gather_axi.py): AxiRam holds the expert buffer and answers
the read bursts late, AxiLiteMaster programs and starts the run, AxiStreamSource sends the
headers and AxiStreamSink takes the combined rows, with and without random pauses on both
streams and on the RAM's AR and R channels. The rows are compared bit for bit with
golden.combine_gather, DROPPED with the invalid pairs, and every read burst is checked (INCR,
length, no 4 KiB crossing, inside the buffer). dispatch_backward_data (the same ports and
run, its own sum and golden model) runs behind its wrapper on the same bench."""

import dataclasses

import numpy as np
import pytest

from moe_hw import problems
from moe_hw.axi import AxiParams
from moe_hw.host import dispatch_backward_data
from moe_hw.host.combine_gather import run_axi
from moe_hw.units.combine_gather import CombineGatherParams
from moe_hw.units.dispatch_backward_data import DispatchBackwardDataParams

from conftest import simulator_params

PARAMS = CombineGatherParams(format="fp32", lanes=4, max_tokens=64, max_hidden=64,
                             max_capacity=32, max_experts=8, max_top_k=2)
# Short bursts and few outstanding ones, so that the small problems reach every limit.
AXI = AxiParams(axi_max_burst=16, axi_outstanding=2, axi_fifo_depth=64)
BUS_BYTES = 16

CASES = {
    # top-2 with capacity drops, H = 29: rows start off the bus words (realigned reads).
    "k2_drops": (dict(tokens=23, hidden=29, experts=5, capacity=6, k=2), 0x3000),
    # Rows of 64 elements (256 bytes) from a base 64 bytes into a page: every 16th row
    # straddles a 4 KiB boundary, and its bursts are cut there.
    "pages": (dict(tokens=40, hidden=64, experts=2, capacity=24, k=1), 0x3040),
    "zero_tokens": (dict(tokens=0, hidden=16, experts=2, capacity=4, k=2), 0x3000),
}


@pytest.mark.parametrize("case, stall", [("k2_drops", 0.0), ("k2_drops", 0.3),
                                         ("pages", 0.3), ("zero_tokens", 0.0)])
def test_combine_gather_axi(case, stall):
    sizes, base = CASES[case]
    prob = problems.gather_problem(sorted(CASES).index(case), **sizes)
    _, results, findings = run_axi(prob, PARAMS, AXI, stall=stall, seed=3, base=base)
    assert findings == [], "\n".join(findings)
    beats, addr = results["burst_beats"], results["burst_addr"]
    assert np.all(beats <= AXI.axi_max_burst)
    if case == "pages":
        ends = addr + beats * BUS_BYTES
        assert np.any((beats < AXI.axi_max_burst) & (ends % 4096 == 0)), \
            "no burst was cut at a 4 KiB boundary"
    if case == "zero_tokens":
        assert len(beats) == 0


@pytest.mark.parametrize("sim", simulator_params("icarus"))
def test_combine_gather_axi_icarus(sim):
    """On Icarus (the four-state check), with pauses, and with the read master's FIFOs in
    DP16KD blocks (their simulation model), as the synthesis flow builds them on ECP5."""
    sizes, base = CASES["k2_drops"]
    prob = problems.gather_problem(sorted(CASES).index("k2_drops"), **sizes)
    _, results, findings = run_axi(prob, PARAMS, dataclasses.replace(AXI, axi_bram="ecp5"),
                                   sim=sim, stall=0.3, seed=3, base=base)
    assert findings == [], "\n".join(findings)
    assert len(results["burst_beats"]) > 0


@pytest.mark.parametrize("case, stall", [("k2_drops", 0.0), ("k2_drops", 0.3),
                                         ("pages", 0.3)])
def test_dispatch_backward_data_axi(case, stall):
    """grad_input behind the wrapper (the m_axi_grad_dispatch read master), bit for bit
    against golden.dispatch_backward_data, the bursts checked as above."""
    sizes, base = CASES[case]
    prob = problems.gather_problem(sorted(CASES).index(case), **sizes)
    params = DispatchBackwardDataParams(**dataclasses.asdict(PARAMS))
    outputs, results, findings = dispatch_backward_data.run_axi(prob, params, AXI, stall=stall,
                                                                seed=5, base=base)
    assert findings == [], "\n".join(findings)
    assert list(outputs) == ["grad_input"]
    assert len(results["burst_beats"]) > 0 and np.all(results["burst_beats"] <= AXI.axi_max_burst)


@pytest.mark.parametrize("settings, want", [
    ({"interface": "axi"}, 256),
    ({"interface": "axi", "max_outstanding": 32}, 32),
    ({}, 16),
])
def test_reads_in_flight_behind_axi(tmp_path, settings, want):
    """Behind the AXI wrapper a read unit keeps 256 beats in flight unless told otherwise
    (the bus's round trip; 16 cover an on-chip memory): the unit's ``max_outstanding`` in
    the emitted manifest, and in the synthesis flow's parameters of every unit with a read
    port."""
    import json

    from moe_hw.gen import emit
    from moe_hw.synth import synth_params
    _, manifest = emit("combine_gather", tmp_path,
                       {"lanes": 1, "max_tokens": 16, "max_hidden": 16, **settings})
    assert json.loads(manifest.read_text())["parameters"]["max_outstanding"] == want
    for unit in ("combine_gather", "dispatch_backward_data", "sparse_gather",
                 "moe_re_routing", "moe_layer", "expand"):
        _, params, _ = synth_params(unit, "ecp5-85k", settings)
        assert params.max_outstanding == (want if settings else
                                          type(params)().max_outstanding), unit
