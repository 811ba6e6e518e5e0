"""The benchmark command: every unit of ``gen list`` prints a bit-exact row on a tiny problem
(Icarus: no model build per design), and the one-unit sweep gives exact cycle counts."""

import subprocess
import sys

import pytest

from moe_hw.bench import bench_unit
from moe_hw.flows.simulate import simulator_available
from moe_hw.host.unit import BenchShape
from moe_hw.registry import units
from moe_hw.units.dispatch import DispatchParams

from conftest import TINY

# The tests' TINY shape (conftest.py): 20 of the 23 designs are the ones test_fastsim.py and
# test_reset.py emit, which the build root keeps, so the command reads them rather than emit
# them again.
TINY_ARGS = ["--tokens", str(TINY.tokens), "--hidden", str(TINY.hidden), "--experts",
             str(TINY.experts), "--top-k", str(TINY.top_k), "--lanes", str(TINY.lanes)]


def test_bench_units_prints_a_row_for_every_unit():
    reason = simulator_available("icarus")
    if reason:
        pytest.skip(f"icarus: {reason}")
    # The fast path in Icarus: the command's table for every unit in about a minute (the
    # cocotb benches took four; every unit's cocotb path has tests of its own).
    result = subprocess.run([sys.executable, "-m", "moe_hw.bench", "units", *TINY_ARGS,
                             "--sim", "fast-icarus"], capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("---"))
    end = lines.index("", start)
    rows = [line.split() for line in lines[start + 1:end]]      # the table's rows
    for name in units():
        mine = [row for row in rows if row and row[0] == name]
        assert mine, f"no row for {name}:\n{result.stdout}"
        assert all(row[-1] == "PASS" for row in mine), result.stdout


def test_bench_unit_dispatch_cycles_are_exact():
    reason = simulator_available("icarus")
    if reason:
        pytest.skip(f"icarus: {reason}")
    shape = BenchShape(tokens=8, hidden=16, experts=4, top_k=1, lanes=4)
    (row,) = bench_unit("dispatch", shape, sim="fast-icarus")
    assert row["passed"], row["problems"]
    assert row["ideal_cycles"] == 8 * (16 // 4)
    params = DispatchParams(lanes=4)
    assert row["cycles"] == row["formula_cycles"] == row["ideal_cycles"] + params.overhead


def test_bench_rejects_unknown_units():
    result = subprocess.run([sys.executable, "-m", "moe_hw.bench", "dispatchh"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "unit must be one of units, dispatch" in result.stderr
