# amaranth: UnusedElaboratable=no
"""Benchmarks: run a unit on a random problem in simulation, score it bit for bit against the
golden model, and print its cycle counts, efficiency and simulation speed.

    python -m moe_hw.bench dispatch [--lanes 1 4 16] [--tokens 1024] [--hidden 512]
                                    [--experts 8] [--format fp32] [--sim verilator]
                                    [--stall 0.0] [--json FILE] [--check-efficiency 0.99]
    python -m moe_hw.bench units [--tokens 1024] [--hidden 512] [--experts 8] [--k 2]
                                 [--lanes 16] [--only UNIT ...] [--json FILE]

Each unit has one benchmark function in :data:`BENCHMARKS`; it returns one row (a dict of
JSON-able figures) per design point. Cycle counts are exact; wall-clock times are what this
machine did at that moment and are printed, never asserted.

Wall-clock figures per design point (all in seconds):

``build``
    A one-pair warm-up run on the same Verilog, minus a second identical warm-up run: the
    Verilator build when the model was not already cached under ``build/``, else about 0.
``start``
    The second warm-up run: the fixed cost of any run (Verilog emission, simulator and
    cocotb start-up, result files), paid again by the measured run.
``run``
    The measured run, end to end through ``run_dispatch``: stimulus preparation, the cocotb
    bench (packing beats, the simulation, unpacking writes) and the memory image. Simulated
    cycles per second are measured cycles over this time.
``score``
    ``score_dispatch`` against the golden model (not included in ``run``).
"""

import argparse
import json
import math
import sys
import threading
import time

import numpy as np

from . import golden
from .formats import FORMATS
from .params import LANES

__all__ = ["BENCHMARKS", "random_dispatch_problem", "dispatch_point", "dispatch_benchmark",
           "main"]

EFFICIENCY_TARGET = 0.99     # the stall-free target the verdict lines compare against
HEARTBEAT_SECONDS = 30


def _progress(message):
    print(message, file=sys.stderr, flush=True)


class _Heartbeat:
    """Prints ``what ... N s`` to stderr every ``period`` seconds while a long step runs, so
    that a run of minutes does not look hung."""

    def __init__(self, what, period=HEARTBEAT_SECONDS):
        self.what, self.period = what, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self):
        start = time.perf_counter()
        while not self._stop.wait(self.period):
            _progress(f"    ... {self.what}, {time.perf_counter() - start:.0f} s")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


# ---- dispatch ------------------------------------------------------------------------------

def random_dispatch_problem(tokens, hidden, experts, *, format="fp32", capacity_factor=1.25,
                            seed=0):
    """A seeded top-1 dispatch problem: gates in (0, 1) exactly representable in ``format``,
    normal input, indices uniform in ``[0, experts)``, locations from the routing counters
    (so the pairs past an expert's capacity are the dropped ones)."""
    fmt = FORMATS[format]
    rng = np.random.default_rng(seed)
    precision = fmt.mant_bits + 1
    gates = (rng.integers(1, 1 << precision, tokens) / (1 << precision)).astype(fmt.dtype)
    input = rng.standard_normal((tokens, hidden)).astype(fmt.dtype)
    indices = rng.integers(0, experts, tokens).astype(np.int32)
    locations = golden.compute_locations(indices, num_experts=experts)
    capacity = golden.capacity_from_factor(capacity_factor, tokens, experts)
    return {"gates": gates, "indices": indices, "locations": locations, "input": input,
            "num_experts": experts, "capacity": capacity}


def dispatch_point(*, lanes, tokens, hidden, experts, format="fp32", sim="verilator",
                   stall=0.0, seed=0, warm_up=True):
    """Benchmark one design point of the dispatch unit; returns its row of figures."""
    from .host.dispatch import dispatch_params_for, run_dispatch, score_dispatch
    from .units.dispatch import DispatchUnit

    problem = random_dispatch_problem(tokens, hidden, experts, format=format, seed=seed)
    routing = {name: problem[name] for name in ("num_experts", "capacity")}
    params = dispatch_params_for(problem["gates"], problem["input"], **routing, lanes=lanes)
    overhead = DispatchUnit(params).overhead
    pairs = problem["gates"].size
    beats_per_pair = -(-hidden // lanes)
    label = f"lanes={lanes}"

    build_s = start_s = None
    if warm_up:
        # Same params, hence the same Verilog and the same cached model, on one pair.
        tiny = random_dispatch_problem(1, min(hidden, lanes), 1, format=format, seed=seed)
        tiny_args = (tiny["gates"], tiny["indices"], tiny["locations"], tiny["input"])
        tiny_routing = {"num_experts": 1, "capacity": tiny["capacity"]}
        _progress(f"  [{label}] warm-up: build the model unless cached, one-pair run")
        with _Heartbeat(f"{label} warm-up (Verilator build)"):
            _, first_s = _timed(run_dispatch, *tiny_args, **tiny_routing, params=params, sim=sim)
        _, start_s = _timed(run_dispatch, *tiny_args, **tiny_routing, params=params, sim=sim)
        build_s = max(0.0, first_s - start_s)

    args = (problem["gates"], problem["indices"], problem["locations"], problem["input"])
    _progress(f"  [{label}] simulating {pairs} pairs x {beats_per_pair} beats "
              f"= {pairs * beats_per_pair} beats, stall {stall}")
    with _Heartbeat(f"{label} simulating"):
        run, run_s = _timed(run_dispatch, *args, **routing, params=params, sim=sim,
                            stall=stall, seed=seed)
    _progress(f"  [{label}] scoring against the golden model")
    problems, score_s = _timed(score_dispatch, run, *args, **routing, lanes=lanes)

    ideal = pairs * beats_per_pair
    if run.ideal_cycles != ideal:
        problems.append(f"run_dispatch reports {run.ideal_cycles} ideal cycles, the bench "
                        f"computes {ideal}")
    return {
        "unit": "dispatch", "format": format, "lanes": lanes, "pairs": int(pairs),
        "hidden": hidden, "experts": experts, "capacity": problem["capacity"],
        "stall": stall, "seed": seed,
        "dropped": run.dropped, "writes": int(len(run.writes["addr"])),
        "ideal_cycles": ideal, "cycles": run.cycles, "overhead": overhead,
        "efficiency": ideal / run.cycles if run.cycles else math.nan,
        "elements_per_cycle": pairs * hidden / run.cycles if run.cycles else math.nan,
        "build_s": build_s, "start_s": start_s, "run_s": run_s, "score_s": score_s,
        "cycles_per_s": run.cycles / run_s,
        "passed": not problems, "problems": problems,
    }


def dispatch_benchmark(args):
    """The dispatch unit at every ``--lanes`` value on one random problem."""
    rows = []
    for number, lanes in enumerate(args.lanes, 1):
        _progress(f"[dispatch {number}/{len(args.lanes)}] lanes={lanes}: {args.tokens} tokens "
                  f"x {args.hidden}, {args.experts} experts, {args.format}, {args.sim}")
        rows.append(dispatch_point(lanes=lanes, tokens=args.tokens, hidden=args.hidden,
                                   experts=args.experts, format=args.format, sim=args.sim,
                                   stall=args.stall, seed=args.seed,
                                   warm_up=not args.no_warm_up))
    return rows


BENCHMARKS = {
    "dispatch": dispatch_benchmark,
}


# ---- report --------------------------------------------------------------------------------

_COLUMNS = [  # (heading, row key, format)
    ("lanes", "lanes", "{}"),
    ("pairs", "pairs", "{}"),
    ("H", "hidden", "{}"),
    ("ideal cyc", "ideal_cycles", "{}"),
    ("cycles", "cycles", "{}"),
    ("overhead", "overhead", "{}"),
    ("efficiency", "efficiency", "{:.6f}"),
    ("elem/cyc", "elements_per_cycle", "{:.3f}"),
    ("build s", "build_s", "{:.1f}"),
    ("start s", "start_s", "{:.1f}"),
    ("run s", "run_s", "{:.1f}"),
    ("cyc/s", "cycles_per_s", "{:.0f}"),
    ("score s", "score_s", "{:.1f}"),
    ("bit-exact", "passed", "{}"),
]


def _cell(row, key, spec):
    value = row.get(key)
    if value is None:
        return "-"
    if key == "passed":
        return "PASS" if value else "FAIL"
    return spec.format(value)


def format_table(rows):
    cells = [[heading for heading, _, _ in _COLUMNS]]
    cells += [[_cell(row, key, spec) for _, key, spec in _COLUMNS] for row in rows]
    widths = [max(len(line[c]) for line in cells) for c in range(len(_COLUMNS))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths))
             for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def verdicts(rows, threshold):
    """One line per row: bit-exactness and efficiency against ``threshold``."""
    lines = []
    for row in rows:
        exact = "bit-exact" if row["passed"] else "NOT bit-exact: " + "; ".join(row["problems"])
        ok = row["efficiency"] >= threshold
        note = "" if row["stall"] == 0 else f" (with stall {row['stall']}; the target is " \
                                           "for stall-free runs)"
        lines.append(f"lanes={row['lanes']}: {exact}; efficiency {row['efficiency']:.6f} "
                     f"{'>=' if ok else '<'} {threshold}: {'OK' if ok else 'BELOW TARGET'}"
                     f"{note}; cycles - ideal = {row['cycles'] - row['ideal_cycles']}, "
                     f"documented overhead {row['overhead']}")
    return lines


TIME_NOTE = (
    "Times in seconds, wall clock on this machine (shared, not asserted). build: a one-pair "
    "warm-up run minus a second one, i.e. the Verilator build (about 0 when the model was "
    "cached under build/). start: that second one-pair run, the fixed cost of every run "
    "(Verilog emission, simulator and cocotb start-up). run: the measured run through "
    "run_dispatch, end to end (stimulus, beat packing, simulation, write unpacking, memory "
    "image); cyc/s = cycles / run. score: score_dispatch against the golden model. "
    "elem/cyc = input elements (pairs x H) per measured cycle.")


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m moe_hw.bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("unit", choices=sorted(BENCHMARKS), help="the unit to benchmark")
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 4, 16], choices=LANES,
                        metavar="N", help="lane counts to sweep (default: 1 4 16)")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens S (default: 1024)")
    parser.add_argument("--hidden", type=int, default=512, help="hidden size H (default: 512)")
    parser.add_argument("--experts", type=int, default=8, help="experts E (default: 8)")
    parser.add_argument("--format", default="fp32", choices=sorted(FORMATS),
                        help="number format (default: fp32)")
    parser.add_argument("--sim", default="verilator", choices=("verilator", "icarus"),
                        help="simulator (default: verilator)")
    parser.add_argument("--stall", type=float, default=0.0,
                        help="probability of a random pause on every stream, per cycle "
                             "(default: 0.0)")
    parser.add_argument("--seed", type=int, default=0, help="problem and pause seed")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="skip the warm-up runs (no build/start figures)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--check-efficiency", type=float, metavar="MIN",
                        help="exit non-zero if any row's efficiency is below MIN")
    return parser


# ---- every unit on one problem ------------------------------------------------------------

# (unit, host module, function, what the ideal counts); each function takes tokens, hidden,
# experts, k, lanes, sim (the ones it has) and returns a dict with ideal_cycles, cycles,
# efficiency and passed -- or, for combine_scatter, one such dict per order.
UNIT_BENCHMARKS = [
    ("locations", "moe_hw.host.locations", "benchmark", "one (k, i) pair per cycle"),
    ("sparse_index", "moe_hw.host.sparse", "benchmark",
     "three passes: S row beats + E offsets + k*S placements"),
    ("dispatch", None, None, "one beat per cycle: k*S*ceil(H/lanes)"),
    ("sparse_gather", "moe_hw.host.gather", "benchmark_sparse_gather",
     "one beat per cycle: slots*ceil(H/lanes)"),
    ("combine_gather", "moe_hw.host.gather", "benchmark_combine_gather",
     "one read beat per cycle: k*S*ceil(H/lanes)"),
    ("dispatch_backward_data", "moe_hw.host.gather", "benchmark_dispatch_backward_data",
     "one read beat per cycle: k*S*ceil(H/lanes)"),
    ("dispatch_backward_gate", "moe_hw.host.backward_gate", "benchmark_backward_gate",
     "one beat per cycle: k*S*ceil(H/lanes)"),
    ("combine_scatter", "moe_hw.host.combine_scatter", "benchmark_combine_scatter",
     "one beat per cycle: slots*ceil(H/lanes)"),
    ("moe_layer", "moe_hw.host.moe_layer", "benchmark", "sum of its phases' ideals"),
]


def _unit_rows(unit, module, function, args):
    import importlib
    import inspect
    if module is None:          # dispatch: the lanes benchmark above, at the k*S pairs
        row = dispatch_point(lanes=args.lanes, tokens=args.tokens * args.k, hidden=args.hidden,
                             experts=args.experts, format="fp32", sim=args.sim, stall=0.0,
                             seed=0, warm_up=False)
        return [dict(row, unit=unit, order="")]
    try:
        bench = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as error:
        return [{"unit": unit, "order": "", "error": f"not available: {error}"}]
    wanted = dict(tokens=args.tokens, hidden=args.hidden, experts=args.experts, k=args.k,
                  lanes=args.lanes, sim=args.sim)
    accepted = inspect.signature(bench).parameters
    result = bench(**{key: value for key, value in wanted.items() if key in accepted})
    if "cycles" in result:
        return [dict(result, unit=unit, order="")]
    return [dict(value, unit=unit, order=name) for name, value in result.items()
            if isinstance(value, dict) and "cycles" in value]


def units_main(argv):
    parser = argparse.ArgumentParser(
        prog="python -m moe_hw.bench units",
        description="Every unit on one problem: cycles against its ideal, bit-exact check.")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--lanes", type=int, default=16, choices=LANES)
    parser.add_argument("--sim", default="verilator", choices=("verilator", "icarus"))
    parser.add_argument("--only", nargs="+", metavar="UNIT", help="run only these units")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    rows = []
    for unit, module, function, ideal in UNIT_BENCHMARKS:
        if args.only and unit not in args.only:
            continue
        _progress(f"[units] {unit}: {args.tokens} tokens, H={args.hidden}, E={args.experts}, "
                  f"k={args.k}, lanes={args.lanes}")
        started = time.perf_counter()
        for row in _unit_rows(unit, module, function, args):
            row["ideal_means"] = ideal
            row["wall_s"] = time.perf_counter() - started
            rows.append(row)
    print(f"units: {args.tokens} tokens, H={args.hidden}, E={args.experts}, k={args.k}, "
          f"lanes={args.lanes}, fp32, {args.sim}, stall-free")
    header = f"{'unit':<24}{'order':<22}{'ideal':>9}{'cycles':>9}{'efficiency':>12}" \
             f"{'bit-exact':>11}  ideal counts"
    print(header)
    print("-" * len(header))
    status = 0
    for row in rows:
        if "error" in row:
            print(f"{row['unit']:<24}{row['error']}")
            continue
        passed = row.get("passed", False)
        status |= not passed
        print(f"{row['unit']:<24}{row['order']:<22}{row['ideal_cycles']:>9}{row['cycles']:>9}"
              f"{row['efficiency']:>12.4f}{'PASS' if passed else 'FAIL':>11}  "
              f"{row['ideal_means']}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=2, default=str)
            file.write("\n")
    return status


def main(argv=None):
    """Run a benchmark; returns the exit status (1 on a bit-exactness failure or, with
    ``--check-efficiency``, an efficiency below the minimum)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["units"]:
        return units_main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    for name in ("tokens", "hidden", "experts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if not 0 <= args.stall < 1:
        parser.error(f"--stall must be in [0, 1), not {args.stall}")

    from .flows.simulate import simulator_available
    reason = simulator_available(args.sim)
    if reason:
        print(f"cannot benchmark with {args.sim}: {reason}", file=sys.stderr)
        return 2

    started = time.perf_counter()
    rows = BENCHMARKS[args.unit](args)
    total_s = time.perf_counter() - started
    threshold = EFFICIENCY_TARGET if args.check_efficiency is None else args.check_efficiency

    print(f"{args.unit}: {args.tokens} tokens x H={args.hidden}, {args.experts} experts, "
          f"{args.format}, {args.sim}, stall {args.stall}, seed {args.seed}")
    print(format_table(rows))
    print()
    for line in verdicts(rows, threshold):
        print(line)
    print()
    print(TIME_NOTE)
    print(f"Total wall time {total_s:.1f} s.")

    if args.json:
        with open(args.json, "w") as file:
            json.dump({"unit": args.unit, "argv": sys.argv[1:] if argv is None else list(argv),
                       "efficiency_threshold": threshold, "time_note": TIME_NOTE,
                       "total_s": total_s, "rows": rows}, file, indent=2)
            file.write("\n")

    status = 0
    if not all(row["passed"] for row in rows):
        print("FAIL: a run is not bit-exact", file=sys.stderr)
        status = 1
    if args.check_efficiency is not None and \
            any(not row["efficiency"] >= args.check_efficiency for row in rows):
        print(f"FAIL: an efficiency is below {args.check_efficiency}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
