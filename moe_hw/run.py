"""``python -m moe_hw.run``: push arrays through a unit's emitted Verilog in simulation.

    python -m moe_hw.run UNIT --in inputs.npz --out outputs.npz [--set NAME=VALUE ...]
                         [--sim fast|fast-icarus|verilator|icarus] [--stall P] [--seed N]
                         [--trace FILE.fst] [--no-check]
    python -m moe_hw.run POINT [--out outputs.npz]      # a design point from gen/, random data
    python -m moe_hw.run ep_layer [--in inputs.npz] [--set NAME=VALUE ...]   # a composition

Input keys are the golden model's arguments, output keys its results, plus ``cycles``; run-time
values come from --set or from scalars in the npz. ``python -m moe_hw.run UNIT --help-unit``
lists a unit's keys; README.md has the table.

Generation-time parameters (``python -m moe_hw.gen list``) come from --set; the ones not given
are sized to the problem, and the number format follows the arrays' dtype. The result is
checked bit for bit against the golden model unless --no-check is given.

``--sim fast`` (the default) runs the whole problem inside a Verilator model
(moe_hw/flows/fastsim.py) for the units that have a fast description, and the cocotb bench in
Verilator for the others; ``verilator`` and ``icarus`` run the cocotb bench. ``--trace``
writes a waveform (fast path only; Verilator builds a traced model for it).

A composition (ep_layer) runs several units' Verilog one after another with the host moving
the data between them; without --in it runs on random data at its default problem, whose
sizes --set can change (python -m moe_hw.gen list shows them).
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from .cli import parse_sets, run_main
from .flows.simulate import SIMULATORS
from .host.checks import HostError, check_keys
from .host.unit import Composition, run
from .registry import runnable

__all__ = ["main", "run_unit", "from_npz", "read_npz", "write_npz"]


def _progress(text):
    print(f"[moe_hw.run] {text}", file=sys.stderr, flush=True)


def from_npz(array):
    """``array`` as read from an ``.npz`` file, with bfloat16 restored: NumPy stores an
    ``ml_dtypes.bfloat16`` array as 2-byte raw values (dtype ``|V2``), which no other number
    format of the project uses."""
    if array.dtype == np.dtype("V2"):
        return array.view(ml_dtypes.bfloat16)
    return array


def read_npz(path):
    """The arrays of the ``.npz`` file ``path`` by key (:func:`from_npz` applied), or a
    HostError naming the file (and the key, for an array that cannot be read)."""
    try:
        npz = np.load(path, allow_pickle=False)
    except Exception as error:        # a damaged file fails in zipfile, zlib or the parser
        raise HostError(f"--in {path} is not a readable .npz file: {error}") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise HostError(f"--in {path} holds one bare array (.npy), not an .npz file of named "
                        f"arrays")
    with npz:
        inputs = {}
        for key in npz.files:
            try:
                inputs[key] = from_npz(npz[key])
            except Exception as error:
                raise HostError(f"--in {path}: array {key!r} cannot be read: {error}") \
                    from None
    return inputs


def check_writable(path):
    """``path`` can take the output file: its folder exists (it is made) and takes a new
    file, and ``path`` is not a folder. Checked before a run, so that a long simulation does
    not end in an unwritable path."""
    path = Path(path)
    if path.is_dir():
        raise HostError(f"--out {path} is a folder, not a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}."):
            pass
    except OSError as error:
        raise HostError(f"--out {path} cannot be written: {error.strerror or error}") from None


def write_npz(path, arrays):
    """Write ``arrays`` to ``path`` (exactly that name) atomically: into a temporary file in
    the same folder, then renamed over ``path``, so that a failed or interrupted write leaves
    no partial file (and an older file at ``path`` stays whole)."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as file:
            np.savez(file, **arrays)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's file is private; the output is not
        os.replace(tmp, path)
        tmp = None
    except OSError as error:
        raise HostError(f"--out {path} cannot be written: {error.strerror or error}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def run_unit(name, inputs, settings=None, *, sim="fast", stall=0.0, seed=0, check=True,
             progress=None, trace=None):
    """Run unit (or composition, or design point) ``name`` on ``inputs`` (a dict of arrays);
    ``settings`` mixes generation-time parameters and run-time values. Returns an
    :class:`~moe_hw.host.unit.Outcome` (``outputs``, ``cycles``, ``report``, ``problems``)."""
    unit, point = runnable(name)
    check_keys(inputs, unit.name, unit.inputs, unit.optional, unit.runtime)
    settings = dict(settings or {})
    if isinstance(unit, Composition):
        if trace is not None:
            raise HostError(f"--trace is for one unit, not the composition {unit.name}")
        return unit.run(inputs, settings, sim=sim, stall=stall, seed=seed, check=check,
                        progress=progress)
    if point:
        settings = {**point.params, **settings}
    return run(unit, inputs, settings, sim=sim, stall=stall, seed=seed, check=check,
               progress=progress, trace=trace)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m moe_hw.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("unit", help="a unit or composition (python -m moe_hw.gen list) or a "
                                     "design point")
    parser.add_argument("--in", dest="inputs", type=Path,
                        help="input .npz (optional for a design point: random data)")
    parser.add_argument("--out", type=Path, help="output .npz")
    parser.add_argument("--set", action="append", metavar="NAME=VALUE", default=[],
                        help="generation-time parameter or run-time value (repeatable)")
    parser.add_argument("--sim", default="fast", choices=SIMULATORS,
                        help="fast (default; cocotb in Verilator for a unit without a fast "
                             "description), fast-icarus, or the cocotb bench in verilator or "
                             "icarus")
    parser.add_argument("--trace", type=Path, metavar="FILE.fst",
                        help="write a waveform of the run (fast path only; FST, or VCD for a "
                             "name ending in .vcd)")
    parser.add_argument("--stall", type=float, default=0.0,
                        help="probability of a random valid/ready pause per stream per cycle")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-check", action="store_true",
                        help="do not compare against the golden model")
    args = parser.parse_args(argv)

    def body():
        unit, point = runnable(args.unit)
        settings = parse_sets(args.set)
        if args.inputs is not None:
            inputs = read_npz(args.inputs)
        elif point is not None:
            inputs, runtime = unit.point_inputs(point.problem, args.seed)
            settings = {**runtime, **settings}
            _progress(f"design point {point.name}: {point.description}; random inputs "
                      f"(seed {args.seed})")
        elif isinstance(unit, Composition):
            _progress(f"{unit.name}: random inputs at {unit.describe_random(settings)} "
                      f"(seed {args.seed})")
            inputs, settings = unit.random_inputs(settings, args.seed)
        else:
            raise HostError(f"unit {unit.name} needs --in FILE.npz (its inputs: "
                            f"{', '.join(unit.inputs)}; run-time values: "
                            f"{', '.join(unit.runtime) or 'none'})")
        if args.out is not None:
            check_writable(args.out)         # before the run, not after it
        start = time.perf_counter()
        outcome = run_unit(args.unit, inputs, settings, sim=args.sim, stall=args.stall,
                           seed=args.seed, check=not args.no_check, progress=_progress,
                           trace=args.trace)
        for line in outcome.report:
            print(line)
        sim = unit.simulator(args.sim) if hasattr(unit, "simulator") else args.sim
        print(f"wall time: {time.perf_counter() - start:.1f} s ({sim})")
        if args.out is not None:
            write_npz(args.out, outcome.outputs)
            print(f"wrote {args.out} ({', '.join(outcome.outputs)})")
        if outcome.problems:
            print(f"{parser.prog}: MISMATCH against {unit.golden}:\n  " +
                  "\n  ".join(outcome.problems), file=sys.stderr)
            return 1
        return 0

    return run_main(parser.prog, body)


if __name__ == "__main__":
    sys.exit(main())
