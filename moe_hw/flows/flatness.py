"""What it costs to build a design, for the scan_layers flatness comparison (SPEC 1.7): the
generic Yosys cell count with the memory bits apart, the Verilog emission time and the
Verilator build time.

The cell count is Yosys's coarse synthesis (``synth -flatten -run :fine``: word-level cells,
before any technology mapping), so it is deterministic and independent of a target. Memories
(``$mem_v2`` cells) are not counted as cells: their bits are reported apart, since the
scan's parameter memory is meant to deepen with L while its logic stays flat.
"""

import json
import re
import tempfile
import resource
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil

from .emit import emit_verilog
from .synth import SynthError, _run_tool, _tool_error

__all__ = ["DesignCost", "memory_bits", "cell_count", "emission_seconds", "verilator_seconds"]


@dataclass
class DesignCost:
    cells: int            # coarse cells, memories excluded
    memory_bits: int      # bits of every memory (width x depth)
    memories: int


_MEMORY = re.compile(r"^\s*memory width (\d+) size (\d+) ", re.M)


def memory_bits(rtlil_text):
    """``(bits, count)`` of the memories declared in an RTLIL text (``memory width W size
    N``: each module's declarations, once per instance of the module)."""
    found = _MEMORY.findall(rtlil_text)
    return sum(int(width) * int(size) for width, size in found), len(found)


def cell_count(build, *, timeout=1800):
    """The :class:`DesignCost` of the component ``build()`` gives."""
    text = rtlil.convert(build(), name="top")
    bits, count = memory_bits(text)
    with tempfile.TemporaryDirectory(prefix="moe_hw_cells_") as work:
        work = Path(work)
        (work / "top.il").write_text(text)
        script = ("read_rtlil top.il; synth -flatten -top top -run :fine; "
                  "tee -q -o stat.json stat -json")
        code = _run_tool("yosys", ["-p", script], work, work / "yosys.log", timeout)
        if code is None:
            raise SynthError(f"yosys did not finish in {timeout:g} s")
        if code != 0:
            raise SynthError(f"yosys failed: {_tool_error(work / 'yosys.log')}")
        stat = json.loads((work / "stat.json").read_text())
    by_type = stat.get("design", {}).get("num_cells_by_type", {})
    cells = sum(n for kind, n in by_type.items() if not kind.startswith("$mem"))
    return DesignCost(cells, bits, count)


def _cpu_seconds():
    """CPU seconds of this process and its finished children (Yosys runs as one)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def emission_seconds(build, *, repeats=3):
    """CPU seconds to elaborate ``build()`` and emit its Verilog (the generation time): the
    least of ``repeats`` runs. CPU time, not wall time: other jobs on a shared machine
    stretch the wall time of a two-second run by a fifth and more."""
    times = []
    for _ in range(repeats):
        started = _cpu_seconds()
        emit_verilog(build(), "top")
        times.append(_cpu_seconds() - started)
    return min(times)


def verilator_seconds(build, *, timeout=3600):
    """Seconds for Verilator to build a model of ``build()`` (translation and C++ compile at
    the project's settings), in a fresh directory."""
    from .simulate import _runner, _verilator_args, simulator_available
    reason = simulator_available("verilator")
    if reason:
        raise SynthError(f"verilator: {reason}")
    text = emit_verilog(build(), "top")
    with tempfile.TemporaryDirectory(prefix="moe_hw_verilator_") as work:
        work = Path(work)
        (work / "top.v").write_text(text)
        started = time.perf_counter()
        _runner("verilator").build(sources=[work / "top.v"], hdl_toplevel="top",
                                   build_dir=work / "build", build_args=_verilator_args(),
                                   timescale=("1ns", "1ps"), log_file=work / "build.log")
        return time.perf_counter() - started
