# amaranth: UnusedElaboratable=no
"""The benchmark command's dispatch function on a tiny problem: exact cycle count and a
bit-exact result (builds one small Verilator model)."""

import pytest

from moe_hw.bench import dispatch_point
from moe_hw.flows.simulate import simulator_available
from moe_hw.units.dispatch import DispatchParams, DispatchUnit


def test_dispatch_point_cycles_and_bit_exact():
    reason = simulator_available("verilator")
    if reason:
        pytest.skip(f"Verilator is not available: {reason}")
    row = dispatch_point(lanes=4, tokens=8, hidden=16, experts=4, warm_up=False)
    assert row["problems"] == [] and row["passed"]
    assert row["ideal_cycles"] == 8 * (16 // 4)
    overhead = DispatchUnit(DispatchParams(format="fp32", lanes=4)).overhead
    assert row["overhead"] == overhead
    assert row["cycles"] == row["ideal_cycles"] + overhead
