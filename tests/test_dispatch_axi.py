"""dispatch behind its AXI wrapper (``--set interface=axi``), on its emitted Verilog with
cocotbext-axi (sim/bench_dispatch_axi.py): AxiRam holds the expert buffer, AxiLiteMaster
programs and starts the run, AxiStreamSource sends headers and token rows, with and without
random pauses on every stream and on the RAM's AW and W channels. The buffer is compared bit
for bit with golden.dispatch_forward, the strobes element by element with the unit's lane
enables, and every burst is checked (INCR, length, wlast, no 4 KiB crossing). Plus the
emitted files (register map, C header, manifest, FuseSoC core) and the parameter errors."""

import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from moe_hw.axi import AxiParams
from moe_hw.gen import emit
from moe_hw.host.dispatch import run_axi
from moe_hw.params import ParameterError
from moe_hw.units.dispatch import DispatchParams

from conftest import STALLS, simulator_params
from test_dispatch import problem

PARAMS = DispatchParams(format="fp32", lanes=4, max_pairs=256, max_hidden=128,
                        max_capacity=128, max_experts=8)
# Short bursts and few outstanding ones, so that the small problems reach every limit.
AXI = AxiParams(axi_max_burst=16, axi_outstanding=2, axi_fifo_depth=64)
BUS_BYTES = 16

CASES = {
    # top-2 with capacity drops, H = 29 (rows start off the bus words: realigned).
    "k2_drops": (dict(tokens=37, hidden=29, experts=5, capacity=9, k=2), 0x3000),
    # One expert, slots in order: the buffer is one run of 25 KiB from a base 64 bytes into
    # a page: bursts end at max_burst and at each 4 KiB boundary.
    "one_run": (dict(tokens=100, hidden=64, experts=1, capacity=100), 0x3040),
    # Out-of-range and negative indices and locations.
    "out_of_range": (dict(tokens=40, hidden=7, experts=6, capacity=5, k=2,
                          index_range=(-3, 9), location_range=(-2, 8)), 0x3000),
    "zero_tokens": (dict(tokens=0, hidden=32, experts=2, capacity=8), 0x3000),
}


def check(case, sim, stall, axi=AXI):
    sizes, base = CASES[case]
    outputs, results, findings = run_axi(problem(sorted(CASES).index(case), **sizes), PARAMS,
                                         axi, sim=sim, stall=stall, seed=3, base=base)
    assert findings == [], "\n".join(findings)
    return results


@pytest.mark.parametrize("case, stall", [
    pytest.param(case, stall.values[0], id=f"{case}-{stall.id}") for case in sorted(CASES)
    for stall in STALLS if case != "zero_tokens" or stall.values[0] == 0.0])
def test_dispatch_axi(case, stall):
    results = check(case, "verilator", stall)
    beats, addr = results["burst_beats"], results["burst_addr"]
    assert np.all(beats <= AXI.axi_max_burst)
    if case == "one_run" and stall == 0.0:
        ends = addr + beats * BUS_BYTES
        assert np.any((beats < AXI.axi_max_burst) & (ends % 4096 == 0)), \
            "no burst was cut at a 4 KiB boundary"
        assert np.count_nonzero(beats == AXI.axi_max_burst) > len(beats) // 2


@pytest.mark.parametrize("sim", simulator_params("icarus"))
def test_dispatch_axi_icarus(sim):
    """On Icarus, with the word FIFO in DP16KD blocks (their simulation model), as the
    synthesis flow builds it on ECP5."""
    check("k2_drops", sim, 0.3, dataclasses.replace(AXI, axi_bram="ecp5"))


def test_gen_emits_axi_files(tmp_path):
    result = subprocess.run([sys.executable, "-m", "moe_hw.gen", "emit", "dispatch", "--out",
                             str(tmp_path), "--set", "interface=axi", "--set", "lanes=8",
                             "--set", "axi_outstanding=8"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "dispatch.json").read_text())
    buses = {bus["name"]: bus for bus in manifest["buses"]}
    assert buses["m_axi_dispatch"]["data_width"] == 256
    assert buses["m_axi_dispatch"]["outstanding"] == 8
    assert buses["s_axis_data"]["tdata_width"] == 256
    assert {"s_axil", "s_axis_header", "irq"} <= set(buses)
    offsets = {reg["name"]: reg["offset"] for reg in manifest["registers"]}
    assert offsets["CTRL"] == 0 and offsets["STATUS"] == 4 and "DISPATCH_BASE" in offsets
    verilog = (tmp_path / "dispatch.v").read_text()
    for port in ("aclk", "aresetn", "irq", "m_axi_dispatch_awaddr", "s_axil_wdata",
                 "s_axis_data_tkeep", "s_axis_data_tlast"):
        assert f" {port};" in verilog, port
    top_ports = re.search(r"^module dispatch\((.*?)\);", verilog, re.S | re.M).group(1)
    names = {name.strip() for name in top_ports.split(",")}
    assert {"aclk", "aresetn"} <= names and not {"clk", "rst"} & names
    header = (tmp_path / "dispatch_regs.h").read_text()
    assert "#define DISPATCH_DROPPED" in header and "0x20u" in header
    table = (tmp_path / "dispatch_regs.md").read_text()
    assert "| 0x24 | DISPATCH_BASE |" in table
    core = (tmp_path / "dispatch.core").read_text()
    assert core.startswith("CAPI=2:") and "toplevel: dispatch" in core
    assert set(manifest["files"]) >= {"dispatch.v", "dispatch_regs.h", "dispatch.core"}


def test_gen_native_emits_core_only(tmp_path):
    emit("dispatch", tmp_path, {"lanes": 1})
    assert "toplevel: dispatch" in (tmp_path / "dispatch.core").read_text()
    assert not (tmp_path / "dispatch_regs.h").exists()
    assert "input clk;" in (tmp_path / "dispatch.v").read_text()


@pytest.mark.parametrize("settings,message", [
    (dict(interface="ahb"), "interface must be native or axi, not 'ahb'"),
    (dict(axi_outstanding=2), "axi_outstanding needs interface=axi"),
    (dict(interface="axi", axi_burst=8), "has no parameter 'axi_burst'"),
    (dict(interface="axi", axi_max_burst=512),
     "axi_max_burst must be an integer between 1 and 256"),
    (dict(interface="axi", axi_fifo_depth=100), "axi_fifo_depth must be a power of two, not 100"),
])
def test_gen_axi_parameter_errors(tmp_path, settings, message):
    with pytest.raises(ParameterError, match=re.escape(message)):
        emit("dispatch", tmp_path, settings)
    assert not list(tmp_path.iterdir())


def test_gen_axi_parameter_error_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "moe_hw.gen", "emit", "dispatch", "--out",
                             str(tmp_path), "--set", "interface=axi", "--set",
                             "axi_outstanding=0"], capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "axi_outstanding must be an integer between 1 and 64" in \
        lines[0], result.stderr
