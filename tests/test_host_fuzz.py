"""Bad input to the host API (``moe_hw.run.run_unit``) and the command line (``python -m
moe_hw.run``), fuzzed with hypothesis: wrong, mixed and unstorable dtypes, wrong and
mismatched shapes, 0-d arrays, NaN and Inf in index arrays stored as float, negative and huge
sizes, missing, extra and misspelled keys, bad generation-time parameters, a damaged or
non-npz input file and an output path that cannot be written.

Every example must end in a ValueError or TypeError (HostError and ParameterError are
ValueErrors) whose message is one line naming an argument, a key or a parameter; the command
line must turn it into one ``error:`` line and exit code 2, with no traceback and no output
file. Examples that happen to be valid stop where the simulation would start (it is stubbed
out), so the whole module runs in seconds. Each test prints how many examples it ran, and
how many of them were rejected or reached the simulation.

The examples are derandomized and no example database is kept (tests/conftest.py), so a run
is reproducible; ``HYPOTHESIS_PROFILE=fuzz`` draws fresh random examples, more of them.
"""

import contextlib
import dataclasses
import functools
import io
import os
import signal
import subprocess
import sys
import warnings
import zipfile
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import moe_hw.run as run_module
from moe_hw.host.unit import BenchShape, Composition, Unit
from moe_hw.registry import compositions, units
from moe_hw.run import main, run_unit

#: A small valid problem per unit (its benchmark variant at this shape): the examples mutate it.
SHAPE = BenchShape(tokens=6, hidden=5, experts=3, top_k=2, lanes=4)
EP_LAYER_PROBLEM = {"num_ranks": 2, "tokens": 4, "hidden": 4, "num_experts": 4}

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64,
          np.float16, np.float32, np.float64, ml_dtypes.bfloat16, np.complex64, "<U3", "V2",
          object]
#: Values for run-time sizes and generation-time parameters.
VALUES = [-1, 0, -2**31, 2**31, 2**40, 2**63 - 1, 2**64, 10**30, 1.5, 4.0, float("nan"),
          float("inf"), True, False, "x", "4", "", None, np.int64(4), np.float32(2)]
#: Values written into one element of an integer array (negative and huge sizes and indices).
INTEGERS = [-1, -2**31, 2**31, 2**40, 2**62, -2**63, 10**6]
#: Values written into one element of an array made float (NaN and Inf where an index goes).
FLOATS = [np.nan, np.inf, -np.inf, 1e30, 0.5, -0.0]
#: Seconds one example may take: a hang (a huge size looping) fails instead of waiting.
EXAMPLE_TIMEOUT = 20


class SimulationReached(Exception):
    """The example was valid: the run got as far as the simulation (stubbed out)."""


def _no_simulation(self, *args, **kwargs):
    raise SimulationReached


@contextlib.contextmanager
def no_simulation():
    """Stub out the simulation, and turn a hang into a failure."""
    def timeout(signum, frame):
        raise TimeoutError(f"an example took more than {EXAMPLE_TIMEOUT} s (a hang?)")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Unit, "simulate", _no_simulation)
        previous = signal.signal(signal.SIGALRM, timeout)
        try:
            yield
        finally:
            signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def time_limit():
    """At most EXAMPLE_TIMEOUT seconds; an old parameter name's deprecation warning is
    expected (the command line shows it as one warning line)."""
    signal.alarm(EXAMPLE_TIMEOUT)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        signal.alarm(0)


def runnables():
    return [*units(), *compositions()]


def baseline(name):
    """``(inputs, settings)``: a small valid problem of unit or composition ``name`` (fresh
    dicts, to be changed)."""
    inputs, settings = _baseline(name)
    return dict(inputs), dict(settings)


@functools.cache
def _baseline(name):
    unit = {**units(), **compositions()}[name]
    if isinstance(unit, Composition):
        inputs, settings = unit.random_inputs(EP_LAYER_PROBLEM, seed=0)
        return dict(inputs), {**settings, "lanes": 4}
    _, (inputs, settings) = next(iter(unit.bench_problems(SHAPE).items()))
    return dict(inputs), dict(settings)


def known_names(unit):
    """The names an error about ``unit``'s input may mention: keys, run-time values,
    parameters."""
    names = [*unit.inputs, *unit.optional, *unit.runtime, "stall", "seed"]
    if isinstance(unit, Composition):
        return names + ["lanes", *unit.units]
    return names + [field.name for field in dataclasses.fields(unit.params)]


def parameter_names(unit):
    if isinstance(unit, Composition):
        return ["lanes", "dispatch.lanes", "locations.max_pairs", "moe_re_routing.max_hidden",
                "nosuch.lanes", "lanse"]
    return [field.name for field in dataclasses.fields(unit.params)] + ["lanse", "max_k"]


def misspelled(key):
    """``key`` with its last letter changed."""
    return key[:-1] + ("x" if key[-1] != "x" else "y")


@st.composite
def mutation(draw, unit, keys, storable=False):
    """One change to a valid problem: ``(kind, name, value)``."""
    kind = draw(st.sampled_from(["dtype", "shape", "float", "integer", "scalar", "drop",
                                 "extra", "misspell", "runtime", "parameter"]))
    key = draw(st.sampled_from(keys))
    if kind == "dtype":
        dtypes = [d for d in DTYPES if d is not object] if storable else DTYPES
        return kind, key, draw(st.sampled_from(dtypes))
    if kind == "shape":
        return kind, key, tuple(draw(st.lists(st.integers(0, 7), max_size=4)))
    if kind == "float":
        return kind, key, draw(st.sampled_from(FLOATS))
    if kind == "integer":
        return kind, key, draw(st.sampled_from(INTEGERS))
    if kind == "scalar":
        return kind, key, draw(st.sampled_from(VALUES[:12]))
    if kind == "extra":
        return kind, draw(st.text("abcdefgh_", min_size=1, max_size=8)), None
    if kind == "runtime" and unit.runtime:
        return kind, draw(st.sampled_from(unit.runtime)), draw(st.sampled_from(VALUES))
    if kind in ("runtime", "parameter"):
        return "parameter", draw(st.sampled_from(parameter_names(unit))), \
            draw(st.sampled_from(VALUES))
    return kind, key, None


def mutations(name, storable=False):
    unit = {**units(), **compositions()}[name]
    keys = list(baseline(name)[0])
    return st.lists(mutation(unit, keys, storable), min_size=1, max_size=3)


def _change(inputs, settings, kind, name, value):
    array = np.asarray(inputs[name]) if name in inputs else None
    if kind in ("dtype", "shape", "float", "integer", "scalar") and array is None:
        return
    if kind == "dtype":
        inputs[name] = array.view(value) if value == "V2" else array.astype(value)
    elif kind == "shape":
        inputs[name] = np.resize(array, value)
    elif kind == "float":
        changed = array.astype(np.float64 if array.dtype.kind in "iub" else array.dtype)
        if changed.size:
            changed.flat[0] = value
        inputs[name] = changed
    elif kind == "integer":
        changed = array.astype(np.int64)
        if changed.size:
            changed.flat[-1] = value
        inputs[name] = changed
    elif kind == "scalar":
        inputs[name] = np.array(value)
    elif kind == "drop":
        inputs.pop(name, None)
    elif kind == "extra":
        inputs[name] = np.zeros(2, np.int32)
    elif kind == "misspell" and name in inputs:
        inputs[misspelled(name)] = inputs.pop(name)
    elif kind in ("runtime", "parameter"):
        settings[name] = value


def mutated(name, changes):
    """The baseline problem with ``changes`` made (a change that NumPy cannot make, such as
    NaN to an integer dtype, is left out)."""
    inputs, settings = baseline(name)
    for change in changes:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                _change(inputs, settings, *change)
            except (ValueError, TypeError, OverflowError):
                pass
    return inputs, settings


def check_message(message, unit, changes):
    """One line, naming a key, a run-time value or a parameter (the changed ones included)."""
    assert message and "\n" not in message, f"not one line: {message!r}"
    names = known_names(unit) + [change[1] for change in changes] + \
        [misspelled(change[1]) for change in changes]
    assert any(name in message for name in names), f"names no argument: {message!r}"


def report(entry, name, counts):
    total = sum(counts.values())
    print(f"\n{entry} {name}: {total} examples, {counts['rejected']} rejected with one clear "
          f"line, {counts['valid']} valid (reached the simulation)")
    assert total > 0 and counts["rejected"] > 0


# ---- the host API --------------------------------------------------------------------------

@pytest.mark.parametrize("name", runnables())
def test_run_unit_rejects_bad_input(name):
    """``run_unit`` on a mutated problem: a clear ValueError/TypeError, or (valid) the
    simulation; never another exception, a hang or a multi-line message."""
    unit = {**units(), **compositions()}[name]
    counts = Counter()

    @settings(max_examples=200)
    @given(mutations(name))
    def example(changes):
        inputs, settings = mutated(name, changes)
        try:
            with time_limit():
                run_unit(name, inputs, settings, sim="verilator")
        except SimulationReached:
            counts["valid"] += 1
            unknown = set(inputs) - {*unit.inputs, *unit.optional, *unit.runtime}
            assert not unknown, f"unknown keys {unknown} were accepted"
            return
        except (ValueError, TypeError) as error:
            check_message(str(error), unit, changes)
            counts["rejected"] += 1
            return
        raise AssertionError("the run returned without simulating")

    with no_simulation():
        example()
    report("run_unit", name, counts)


@given(stall=st.sampled_from(VALUES + [0.5, 1.0, -0.1]),
       seed=st.sampled_from(VALUES + [7]))
@settings(max_examples=60)
def test_run_unit_rejects_bad_stall_and_seed(stall, seed):
    inputs, settings = baseline("fadd")
    with no_simulation():
        try:
            run_unit("fadd", inputs, settings, stall=stall, seed=seed)
        except SimulationReached:
            assert isinstance(stall, (int, float)) and 0 <= stall < 1
            return
        except (ValueError, TypeError) as error:
            message = str(error)
            assert "\n" not in message and ("stall" in message or "seed" in message), message


def integer_keys():
    return [pytest.param(name, key, id=f"{name}-{key}") for name in runnables()
            for key, array in baseline(name)[0].items()
            if np.asarray(array).dtype.kind in "iu" and np.ndim(array)]


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name, key", integer_keys())
def test_index_arrays_stored_as_float_are_named(name, key, special):
    """An index or size array saved as float with NaN or Inf in it: refused, naming it."""
    inputs, settings = baseline(name)
    inputs[key] = inputs[key].astype(np.float64)
    inputs[key].flat[0] = special
    with no_simulation(), pytest.raises((ValueError, TypeError), match=key):
        run_unit(name, inputs, settings)


def test_unknown_key_is_named():
    inputs, settings = baseline("dispatch")
    inputs["gatse"] = inputs.pop("gates")
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'gatse'; it lacks gates"):
        run_unit("dispatch", inputs, settings)


def test_optional_keys_are_known():
    """expand_backward's expand_size and combine_scatter's hand-made slot order are keys."""
    inputs, settings = baseline("expand_backward")
    assert "expand_size" in inputs
    with no_simulation(), pytest.raises(SimulationReached):
        run_unit("expand_backward", inputs, settings)


@pytest.mark.parametrize("name", [name for name in runnables()
                                  if "memory_latency" in {**units(), **compositions()}[name].runtime])
def test_memory_latency_is_bounded(name):
    """A huge memory latency used to pass (then the run waited until its cycle limit)."""
    inputs, settings = baseline(name)
    with pytest.raises(ValueError, match=r"memory_latency must be at most 4096 cycles, not "
                                         r"1099511627776"):
        run_unit(name, inputs, {**settings, "memory_latency": 2**40})


def test_lane_count_must_be_an_integer():
    """A bool or float lane count used to pass ``lanes in (1, 2, 4, 8, 16)`` (True == 1,
    4.0 == 4) and crash later with "an integer is required"."""
    inputs, settings = baseline("scan_layers")
    for lanes in (True, 4.0):
        with pytest.raises(ValueError, match=rf"lanes must be 1, 2, 4, 8 or 16, not {lanes}"):
            run_unit("scan_layers", inputs, {**settings, "lanes": lanes})


# ---- the command line ----------------------------------------------------------------------

def run_main(argv):
    """``main(argv)`` in process: ``(exit code, stderr)``; ``None`` when the run reached the
    simulation."""
    stderr, stdout = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
            code = main(argv)
    except SystemExit as exit:
        code = exit.code
    except SimulationReached:
        code = None
    return code, stderr.getvalue()


def check_cli_error(code, stderr, *names):
    """Exit code 2 and one ``error:`` line naming one of ``names``."""
    assert code == 2, f"exit code {code}, stderr {stderr!r}"
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(lines) == 1, stderr
    assert any(name in lines[0] for name in names), f"names none of {names}: {lines[0]}"


def settings_args(settings):
    return [arg for name, value in settings.items() for arg in ("--set", f"{name}={value}")]


@pytest.mark.parametrize("name", runnables())
def test_cli_rejects_bad_input(name, tmp_path_factory):
    """``python -m moe_hw.run NAME --in FILE --out FILE`` in process on a mutated npz file:
    exit code 2 and one error line, or (valid) the simulation; never an output file."""
    unit = {**units(), **compositions()}[name]
    folder = tmp_path_factory.mktemp(name)
    npz, out = folder / "in.npz", folder / "out.npz"
    counts = Counter()

    @settings(max_examples=50)
    @given(mutations(name, storable=True))
    def example(changes):
        inputs, settings = mutated(name, changes)
        np.savez(npz, **inputs)
        with time_limit():
            code, stderr = run_main([name, "--in", str(npz), "--out", str(out),
                                     *settings_args(settings)])
        assert not out.exists(), "an output file was written"
        assert sorted(p.name for p in folder.iterdir()) == ["in.npz"], "a file was left over"
        if code is None:
            counts["valid"] += 1
            return
        check_cli_error(code, stderr, *known_names(unit), *(c[1] for c in changes),
                        *(misspelled(c[1]) for c in changes), "--set", "--in")
        counts["rejected"] += 1

    with no_simulation():
        example()
    report("python -m moe_hw.run", name, counts)


@pytest.fixture
def good_npz(tmp_path):
    inputs, _ = baseline("dispatch")
    path = tmp_path / "in.npz"
    np.savez(path, **inputs)
    return path


def dispatch_args(npz, out):
    _, settings = baseline("dispatch")
    return ["dispatch", "--in", str(npz), "--out", str(out), *settings_args(settings)]


def test_cli_rejects_truncated_npz(tmp_path):
    """The file cut short anywhere: one line naming the file, no output file."""
    inputs, _ = baseline("dispatch")
    np.savez(tmp_path / "whole.npz", **inputs)
    data = (tmp_path / "whole.npz").read_bytes()
    cut_file, out = tmp_path / "cut.npz", tmp_path / "out.npz"
    count = 0

    @settings(max_examples=40)
    @given(length=st.integers(0, len(data) - 1))
    def example(length):
        nonlocal count
        cut_file.write_bytes(data[:length])
        code, stderr = run_main(dispatch_args(cut_file, out))
        check_cli_error(code, stderr, str(cut_file))
        assert not out.exists()
        count += 1

    with no_simulation():
        example()
    print(f"\npython -m moe_hw.run dispatch, truncated --in: {count} examples, all rejected")


@pytest.mark.parametrize("content", ["garbage", "npy", "empty", "folder", "missing",
                                     "object_array", "bad_member"])
def test_cli_rejects_non_npz(content, tmp_path):
    path = tmp_path / "in.npz"
    if content == "garbage":
        path.write_bytes(b"\x93NUMPY not really" * 10)
    elif content == "npy":
        np.save(tmp_path / "in.npy", np.zeros(4))
        (tmp_path / "in.npy").rename(path)
    elif content == "empty":
        path.write_bytes(b"")
    elif content == "folder":
        path.mkdir()
    elif content == "object_array":
        np.savez(path, gates=np.array([1, "a"], dtype=object))
    elif content == "bad_member":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("gates.npy", b"not an npy header")
    with no_simulation():
        code, stderr = run_main(dispatch_args(path, tmp_path / "out.npz"))
    check_cli_error(code, stderr, str(path))
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("where", ["folder", "under_a_file", "in_proc"])
def test_cli_rejects_unwritable_output_before_the_run(where, good_npz, tmp_path):
    """An output path that cannot be written is an error before the run (it never reaches
    the simulation)."""
    if where == "folder":
        out = tmp_path / "outdir"
        out.mkdir()
    elif where == "under_a_file":
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "out.npz"
    else:
        out = Path("/proc/moe_hw_out.npz")
    with no_simulation():
        code, stderr = run_main(dispatch_args(good_npz, out))
    check_cli_error(code, stderr, f"--out {out}")


class FakeOutcome:
    report, problems = ["a run"], []
    outputs = {"dispatch": np.zeros((4, 4), np.float32), "cycles": np.int64(7)}


def test_cli_output_write_is_atomic(good_npz, tmp_path):
    """A write that fails half way (a full disk) leaves the old output file whole and no
    temporary file; a write that succeeds replaces it."""
    out = tmp_path / "out.npz"
    out.write_bytes(b"old results")

    def full_disk(file, **arrays):
        file.write(b"PK partial")
        raise OSError(28, "No space left on device")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_module, "run_unit", lambda *args, **kwargs: FakeOutcome())
        patch.setattr(run_module.np, "savez", full_disk)
        code, stderr = run_main(dispatch_args(good_npz, out))
    check_cli_error(code, stderr, f"--out {out}")
    assert "No space left on device" in stderr
    assert out.read_bytes() == b"old results"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "out.npz"]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_module, "run_unit", lambda *args, **kwargs: FakeOutcome())
        code, _ = run_main(dispatch_args(good_npz, out))
    assert code == 0
    with np.load(out) as written:
        assert written["cycles"] == 7 and written["dispatch"].shape == (4, 4)
    assert oct(out.stat().st_mode & 0o777) != oct(0o600), "the output kept mkstemp's mode"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "out.npz"]


@pytest.mark.parametrize("case", ["truncated", "misspelled_key"])
def test_cli_subprocess_bad_input(case, good_npz, tmp_path):
    """The real command line: exit code 2, one error line, no traceback, no output file."""
    if case == "truncated":
        path = tmp_path / "cut.npz"
        path.write_bytes(good_npz.read_bytes()[:100])
        names = [str(path)]
    else:
        inputs, _ = baseline("dispatch")
        inputs["indics"] = inputs.pop("indices")
        path = tmp_path / "misspelled.npz"
        np.savez(path, **inputs)
        names = ["'indics'"]
    out = tmp_path / "out.npz"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    result = subprocess.run([sys.executable, "-m", "moe_hw.run", *dispatch_args(path, out)],
                            capture_output=True, text=True, timeout=120, env=env)
    check_cli_error(result.returncode, result.stderr, *names)
    assert not out.exists()
