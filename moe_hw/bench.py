"""Benchmarks: run units on seeded random problems in simulation, score them bit for bit
against their golden models, and print cycle counts against the one-beat-per-cycle ideal
and the unit's own stall-free formula.

    python -m moe_hw.bench UNIT [--lanes 1 4 16] [--tokens 1024] [--hidden 512]
                                [--experts 8] [--top-k 2] [--format fp32] [--sim fast]
                                [--stall 0.0] [--json FILE] [--check-efficiency 0.99]
    python -m moe_hw.bench units [same options; --lanes takes one value] [--only UNIT ...]

``UNIT`` sweeps one unit over ``--lanes``; ``units`` runs every unit of ``gen list`` on one
problem. Every unit's benchmark problem comes from its declaration (``bench_problems``), so
every unit prints a row, or a row that says why it failed.

Cycle counts are exact. Wall-clock figures (``run s``: the whole run, Verilog emission and a
Verilator build when not cached included; ``cyc/s``: simulated cycles per second of it) are
what this machine did at that moment; they are printed, never asserted.
"""

import argparse
import json
import math
import sys
import threading
import time

from .cli import table_cell
from .flows.simulate import SIMULATORS
from .formats import FORMATS
from .host.unit import BenchShape, run
from .params import LANES
from .registry import units

__all__ = ["bench_unit", "main"]

EFFICIENCY_TARGET = 0.99     # the stall-free target the verdict lines compare against
HEARTBEAT_SECONDS = 30


def _progress(message):
    print(message, file=sys.stderr, flush=True)


class _Heartbeat:
    """Prints ``what ... N s`` to stderr every ``period`` seconds while a long step runs, so
    that a run of minutes does not look hung. :meth:`step` names the step now under way
    (building the model, simulating), and its seconds count from then."""

    def __init__(self, what, period=HEARTBEAT_SECONDS):
        self.what, self.period = what, period
        self._step, self._since = "", time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def step(self, text):
        self._step, self._since = text, time.perf_counter()

    def _beat(self):
        while not self._stop.wait(self.period):
            step = f": {self._step}" if self._step else ""
            _progress(f"    ... {self.what}{step}, {time.perf_counter() - self._since:.0f} s")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def bench_unit(name, shape, *, sim="fast", stall=0.0, seed=0):
    """Rows of figures (dicts) for unit ``name`` at ``shape`` (a BenchShape): one per
    variant of its benchmark problem. A failure becomes a row with ``error``."""
    unit = units()[name]
    rows = []
    try:
        problems = unit.bench_problems(shape, seed)
    except Exception as error:                       # noqa: BLE001 -- reported as a row
        return [{"unit": name, "variant": "", "lanes": shape.lanes,
                 "error": f"{type(error).__name__}: {error}"}]
    for variant, (inputs, settings) in problems.items():
        label = f"{name}{' ' + variant if variant else ''}"
        started = time.perf_counter()
        try:
            with _Heartbeat(label) as beat:
                def progress(text):
                    _progress(f"  [{label}] {text}")
                    beat.step(text.split(" in ")[0])   # "building the ... model of U"
                outcome = run(unit, inputs, settings, sim=sim, stall=stall, seed=seed,
                              progress=progress)
        except Exception as error:                   # noqa: BLE001 -- reported as a row
            rows.append({"unit": name, "variant": variant, "lanes": shape.lanes,
                         "error": f"{type(error).__name__}: {error}"})
            continue
        run_s = time.perf_counter() - started
        rows.append({
            "unit": name, "variant": variant, "lanes": getattr(outcome.params, "lanes", 1),
            "sim": unit.simulator(sim),
            "format": getattr(outcome.params, "format", shape.format),
            "problem": outcome.report[0], "ideal_means": unit.ideal,
            "ideal_cycles": outcome.ideal_cycles, "cycles": outcome.cycles,
            "formula_cycles": outcome.expected_cycles,
            "efficiency": outcome.efficiency, "stall": stall, "seed": seed,
            "run_s": run_s, "cycles_per_s": outcome.cycles / run_s if run_s else math.nan,
            "passed": outcome.passed, "problems": outcome.problems,
        })
    return rows


_COLUMNS = [  # (heading, row key, format: cli.table_cell's spec)
    ("unit", "unit", "{}"),
    ("variant", "variant", "{}"),
    ("lanes", "lanes", "{}"),
    ("ideal", "ideal_cycles", "{}"),
    ("cycles", "cycles", "{}"),
    ("formula", "formula_cycles", "{}"),
    ("efficiency", "efficiency", "{:.4f}"),
    ("run s", "run_s", "{:.1f}"),
    ("cyc/s", "cycles_per_s", "{:.0f}"),
    ("sim", "sim", "{}"),
    ("bit-exact", "passed", lambda passed: "PASS" if passed else "FAIL"),
]


def format_table(rows):
    """The rows as an aligned text table; a failed row shows its error."""
    cells = [[heading for heading, _, _ in _COLUMNS]]
    errors = []
    for row in rows:
        if "error" in row:
            cells.append([row["unit"], row.get("variant", ""), str(row.get("lanes", "-"))] +
                         ["-"] * (len(_COLUMNS) - 4) + ["ERROR"])
            errors.append(f"{row['unit']}: {row['error']}")
        else:
            cells.append([table_cell(row, key, spec) for _, key, spec in _COLUMNS])
    widths = [max(len(line[c]) for line in cells) for c in range(len(_COLUMNS))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths))
             for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines + errors)


def verdicts(rows, threshold):
    """One line per row: bit-exactness, the formula, and efficiency against ``threshold``."""
    lines = []
    for row in rows:
        if "error" in row:
            lines.append(f"{row['unit']}: FAILED TO RUN: {row['error']}")
            continue
        exact = "bit-exact" if row["passed"] else "NOT bit-exact: " + "; ".join(row["problems"])
        ok = row["efficiency"] >= threshold
        note = "" if row["stall"] == 0 else f" (with stall {row['stall']}; the target is " \
                                           "for stall-free runs)"
        label = row["unit"] + (f" {row['variant']}" if row["variant"] else "")
        lines.append(f"{label} lanes={row['lanes']}: {exact}; efficiency "
                     f"{row['efficiency']:.6f} {'>=' if ok else '<'} {threshold}: "
                     f"{'OK' if ok else 'BELOW TARGET'}{note}; ideal counts "
                     f"{row['ideal_means']}")
    return lines


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m moe_hw.bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("unit", help="a unit of gen list, or 'units' for all of them")
    parser.add_argument("--lanes", type=int, nargs="+", default=None, choices=LANES,
                        metavar="N", help="lane counts (default: 1 4 16 for a unit, 16 for "
                                          "units)")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens S (default: 1024)")
    parser.add_argument("--hidden", type=int, default=512, help="hidden size H (default: 512)")
    parser.add_argument("--experts", type=int, default=8, help="experts E (default: 8)")
    parser.add_argument("--top-k", "--k", dest="top_k", type=int, default=2,
                        help="top-k (default: 2)")
    parser.add_argument("--format", default="fp32", choices=sorted(FORMATS),
                        help="number format (default: fp32)")
    parser.add_argument("--sim", default="fast", choices=SIMULATORS,
                        help="fast (default: the whole problem inside Verilator; cocotb in "
                             "Verilator for a unit without a fast description), fast-icarus, "
                             "verilator or icarus (cocotb)")
    parser.add_argument("--stall", type=float, default=0.0,
                        help="probability of a random pause on every stream, per cycle")
    parser.add_argument("--seed", type=int, default=0, help="problem and pause seed")
    parser.add_argument("--only", nargs="+", metavar="UNIT", help="with units: only these")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--check-efficiency", type=float, metavar="MIN",
                        help="exit non-zero if any row's efficiency is below MIN")
    return parser


def main(argv=None):
    """Run a benchmark; returns the exit status (1 when a row failed, is not bit-exact, or,
    with ``--check-efficiency``, is below the minimum)."""
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    for name in ("tokens", "hidden", "experts", "top_k"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not "
                         f"{getattr(args, name)}")
    if not 0 <= args.stall < 1:
        parser.error(f"--stall must be in [0, 1), not {args.stall}")
    if args.unit == "units":
        names = [name for name in units() if not args.only or name in args.only]
        unknown = sorted(set(args.only or ()) - set(units()))
        lanes = args.lanes or [16]
        if len(lanes) != 1:
            parser.error("bench units takes one --lanes value")
    elif args.unit in units():
        names, lanes = [args.unit], args.lanes or [1, 4, 16]
        unknown = []
    else:
        parser.error(f"unit must be one of units, {', '.join(units())}, not {args.unit!r}")
    if unknown:
        parser.error(f"--only names units that do not exist: {', '.join(unknown)}")

    from .flows.simulate import simulator_available
    reason = simulator_available(args.sim)
    if reason:
        print(f"cannot benchmark with {args.sim}: {reason}", file=sys.stderr)
        return 2

    started = time.perf_counter()
    rows = []
    points = [(name, lane) for name in names for lane in lanes]
    for number, (name, lane) in enumerate(points, 1):
        shape = BenchShape(tokens=args.tokens, hidden=args.hidden, experts=args.experts,
                           top_k=args.top_k, lanes=lane, format=args.format)
        _progress(f"[{number}/{len(points)}] {name}: {shape.tokens} tokens, H={shape.hidden}, "
                  f"E={shape.experts}, k={shape.top_k}, lanes={lane}, {shape.format}")
        rows += bench_unit(name, shape, sim=args.sim, stall=args.stall, seed=args.seed)
    total_s = time.perf_counter() - started
    threshold = EFFICIENCY_TARGET if args.check_efficiency is None else args.check_efficiency

    print(f"{args.unit}: {args.tokens} tokens, H={args.hidden}, E={args.experts}, "
          f"k={args.top_k}, {args.format}, {args.sim}, stall {args.stall}, seed {args.seed}")
    print(format_table(rows))
    print()
    for line in verdicts(rows, threshold):
        print(line)
    print(f"\nTotal wall time {total_s:.1f} s (run s includes emission and any simulator "
          "build; times are not asserted).")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"argv": sys.argv[1:] if argv is None else list(argv),
                       "efficiency_threshold": threshold, "total_s": total_s, "rows": rows},
                      file, indent=2, default=str)
            file.write("\n")

    status = 0
    if any("error" in row or not row["passed"] for row in rows):
        print("FAIL: a row failed to run or is not bit-exact", file=sys.stderr)
        status = 1
    if args.check_efficiency is not None and any(
            "error" not in row and not row["efficiency"] >= args.check_efficiency
            for row in rows):
        print(f"FAIL: an efficiency is below {args.check_efficiency}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
