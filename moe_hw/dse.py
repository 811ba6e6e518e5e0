"""``python -m moe_hw.dse``: explore a unit's design space on a workload: place and route every
point of a parameter sweep (``python -m moe_hw.synth``'s flow), and report its resources,
post-route Fmax, the workload's cycles from the unit's analytic cycle formula, latency,
throughput, throughput per LUT and per DSP, and the Pareto fronts of throughput against LUTs
and against DSPs.

    python -m moe_hw.dse UNIT --workload POINT [--sweep NAME=V1,V2,... ...]
                         [--target T1,T2] [--out DIR] [--jobs N] [--scheduler tcp://HOST:PORT]
                         [--seeds N] [--freq MHZ] [--timeout S] [--cache DIR]

The workload is a named design point of UNIT (gen/*.toml): its ``[params]`` are the base of
every point and its ``[problem]`` the problem the cycle formula counts; each ``--sweep``
overrides one generation-time parameter with each of its values (the points are the product
of the sweeps and the targets).

Every point is one synthesis run out of context, with the reference adder, on a local process
pool (``--jobs``, default: one per CPU) or on a Dask distributed cluster (``--scheduler``). A
point that fails (does not fit, a tool error, a run past ``--timeout``) is a row with its
reason; the sweep goes on, and the command exits 0 when the sweep is done. Results are cached
per (unit, parameters, target, seeds, target frequency, tool versions, the design's RTLIL
text, the flow's own steps and tool options): a re-run only places and routes the points it
has not seen, and a change to the hardware or to the flow is a new point. A failure is cached only when it is the design's (does not fit, a
tool's error), not when a run passed its time limit or a worker died.

``--out DIR`` gets ``results.csv``, ``results.json``, ``results.md`` and ``pareto.png``
(throughput against LUTs, the front drawn, every point labelled by its swept parameters); the
Markdown table also goes to stdout, progress to stderr.
"""

import argparse
import csv
import dataclasses
import hashlib
import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from amaranth.back import rtlil

from .cli import fail, run_main, table_cell
from .flows.out_of_context import OutOfContext
from .flows.synth import (DEFAULT_TIMEOUT, RESOURCES, YOSYS_PREPARE, SynthError,
                          _check_positive, target as find_target, tool_versions)
from .params import ParameterError
from .registry import parse_value, unit_or_point
from .synth import synth, synth_params

__all__ = ["Workload", "WORKLOADS", "Point", "workload_problem", "explore", "pareto_front",
           "synthesize_point", "write_outputs", "main"]

PROG = "python -m moe_hw.dse"
DEFAULT_SEEDS = 1
DEFAULT_TARGET = "ecp5-85k"


def _format_bits(params):
    """The width of the unit's elements: its ``element_width`` (the units that move elements
    as bits), else its float format's."""
    width = getattr(params, "element_width", None)
    return params.fmt.width if width is None else width


@dataclass(frozen=True)
class Workload:
    """What a unit's workload moves: ``elements(problem)`` (the problem dict of
    :meth:`~moe_hw.host.unit.Unit.problem`) and ``element_bits(params)`` (default: the
    element format's width), for throughput in elements/s and GB/s. Its cycles come from the
    unit's own formula (:meth:`~moe_hw.host.unit.Unit.cycles`)."""

    elements: Callable
    element_bits: Callable = _format_bits


def _pair_rows(p):
    """k*S*H: every (k, token) pair's row of H elements (the gather-form routed units)."""
    return p["top_k"] * p["tokens"] * p["hidden"]


#: The units the exploration knows, by name, with what their workload counts as elements moved:
#: adding a unit is one line here (its design points need ``point_inputs``, by default the
#: benchmark problem at the point's sizes, and ``cycles`` in its declaration).
WORKLOADS = {
    "dispatch": Workload(lambda p: p["gates"].size * p["input"].shape[1]),   # k*S*H
    "locations": Workload(lambda p: p["indices"].size,                         # k*S pairs
                          lambda params: params.index_width),
    "sparse_index": Workload(lambda p: p["gates"].size),                       # S*E gates
    "sparse_gather": Workload(lambda p: p["slots"] * p["hidden"]),
    "combine_gather": Workload(_pair_rows),
    "combine_scatter": Workload(lambda p: p["rows"].size),                     # slots*H
    "dispatch_backward_data": Workload(_pair_rows),
    "dispatch_backward_gate": Workload(lambda p: p["indices"].size * p["input"].shape[1]),
    "moe_layer": Workload(lambda p: p["layer"].top_k * p["layer"].tokens * p["layer"].hidden),
    "moe_re_routing": Workload(lambda p: p["num_tokens"] * p["hidden"]),
    "expand": Workload(lambda p: p["output_elements"]),
    "repeat": Workload(lambda p: p["output_elements"]),
    "expand_backward": Workload(lambda p: p["output_elements"]),              # output_grad
    "scan_layers": Workload(lambda p: p["tokens"] * p["hidden"]),             # S*H through L
    "scan_layers_unrolled": Workload(lambda p: p["tokens"] * p["hidden"]),
    "scan_layers_backward": Workload(lambda p: p["tokens"] * p["hidden"]),
    "fmul": Workload(lambda p: p["a"].size),
    "fadd": Workload(lambda p: p["a"].size),
}


# ---- the sweep -------------------------------------------------------------------------------

def parse_sweeps(unit, texts):
    """``["lanes=1,4", "format=fp32,bf16"]`` -> ``{"lanes": [1, 4], "format": ["fp32",
    "bf16"]}``; a key that is not a parameter of ``unit``, a repeated key or an empty value
    list is a ParameterError naming it."""
    names = [field.name for field in dataclasses.fields(unit.params)]
    sweeps = {}
    for text in texts or ():
        name, sep, values = text.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise ParameterError(f"--sweep takes NAME=V1,V2,..., not {text!r}")
        if name not in names:
            raise ParameterError(f"--sweep: unit {unit.name} has no parameter {name!r}; its "
                                 f"parameters are {', '.join(names)}")
        if name in sweeps:
            raise ParameterError(f"--sweep: {name} is swept twice")
        values = [parse_value(value) for value in values.split(",") if value.strip()]
        if not values:
            raise ParameterError(f"--sweep: {name} has no values")
        sweeps[name] = values
    return sweeps


@dataclass
class Point:
    """One point of the sweep: where it is, and (once known) what it gave."""

    target: str
    swept: dict               # the swept parameters' values
    settings: dict            # the design point's parameters with the swept ones on top
    params: dict              # every parameter of the unit, as built
    description: str
    key: str                  # the cache key
    cycles: int
    elements: int
    element_bits: int
    synthesis: dict | None = None     # what synthesize_point gave
    cached: bool = False

    @property
    def label(self):
        return ", ".join(f"{name}={value}" for name, value in self.swept.items()) or "default"


def _cache_key(unit, params, target, seeds, freq, design_text):
    target = find_target(target)
    identity = {"unit": unit.name, "params": dataclasses.asdict(params), "target": target.name,
                "seeds": seeds, "freq": target.default_freq if freq is None else freq,
                "tools": tool_versions(target),
                # the flow's own steps and options: a change to them is a new result
                "flow": [YOSYS_PREPARE, *target.synth, *target.nextpnr_args],
                "rtlil": hashlib.sha256(design_text.encode()).hexdigest()}
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def workload_problem(unit_name, workload):
    """``(unit, design point, problem, elements)`` of design point ``workload`` of unit
    ``unit_name``: the unit's problem dict of random data at the point's sizes
    (``point_inputs``) and the elements its workload moves. Builds no hardware."""
    unit, point = unit_or_point(workload)
    if point is None:
        raise ParameterError(f"--workload must be a design point (gen/*.toml), not the unit "
                             f"{workload!r}")
    if unit.name != unit_name:
        raise ParameterError(f"workload {workload} is a design point of unit {unit.name}, "
                             f"not of {unit_name}")
    if unit.name not in WORKLOADS:
        raise ParameterError(f"unit must be one of {', '.join(WORKLOADS)} (the units with a "
                             f"workload), not {unit.name!r}")
    inputs, runtime = unit.point_inputs(point.problem)
    problem = unit.problem(inputs, runtime)
    return unit, point, problem, int(WORKLOADS[unit.name].elements(problem))


def plan(unit_name, workload, sweeps, targets, *, seeds, freq):
    """The sweep's points (every parameter checked, the cycle formula evaluated), before any
    tool runs."""
    unit, point, problem, elements = workload_problem(unit_name, workload)
    checked = []       # every point's parameters first: a bad value stops before any build
    for target in targets:
        for values in itertools.product(*sweeps.values()):
            swept = dict(zip(sweeps, values))
            settings = {**point.params, **swept}
            checked.append((target, swept, settings, *synth_params(unit.name, target,
                                                                   settings)[1:]))
    points = []
    for target, swept, settings, params, description in checked:
        cycles = unit.cycles(problem, params)
        if cycles is None:
            raise ParameterError(f"unit {unit.name} has no cycle formula for workload "
                                 f"{workload}")
        design_text = rtlil.convert(OutOfContext(unit.build(params)), name="top",
                                     emit_src=False)
        points.append(Point(
            target=target, swept=swept, settings=settings, params=dataclasses.asdict(params),
            description=description,
            key=_cache_key(unit, params, target, seeds, freq, design_text),
            cycles=int(cycles), elements=elements,
            element_bits=int(WORKLOADS[unit.name].element_bits(params))))
    return unit, point, points


# ---- one point: runs in a worker (a local process or a Dask worker) --------------------------

def synthesize_point(task):
    """Place and route one point; ``task`` is a dict (unit, target, settings, seeds, freq,
    timeout, work_dir). Returns a dict: ``{"ok": True, ...figures}`` or ``{"ok": False,
    "reason": one line, "cacheable": bool}``; a failure is cacheable when it is the design's
    (does not fit, a tool's error), not the run's (past the time limit, a worker that died).
    Never raises for a failed design."""
    try:
        # (one seed at a time: the sweep's workers already fill the cores, a point each)
        report = synth(task["unit"], task["target"], task["settings"], seeds=task["seeds"],
                       freq=task["freq"], timeout=task["timeout"],
                       work_dir=task.get("work_dir"), jobs=1)
    except SynthError as error:
        reason = str(error)
        return {"ok": False, "reason": reason, "cacheable": "did not finish" not in reason}
    except Exception as error:                      # noqa: BLE001 -- recorded as the row
        return {"ok": False, "reason": f"{type(error).__name__}: {error}",
                "cacheable": False}
    design = report.design
    clock = min(design.clocks.values(), key=lambda c: c.fmax_mhz)
    path = clock.critical_path
    # a seed past the time limit makes the best of the rest depend on the limit
    return {"ok": True, "cacheable": not design.unfinished_seeds, "fmax_mhz": design.fmax_mhz,
            "reference_mhz": report.reference.fmax_mhz, "ratio": round(report.ratio, 4),
            "resources": {column: design.resources[column]["used"] for column in RESOURCES},
            "available": {column: design.resources[column]["available"]
                          for column in RESOURCES},
            "critical_path": f"{path.start} -> {path.end}" if path else None,
            "seed_fmax_mhz": {str(seed): mhz for seed, mhz in design.seed_fmax_mhz.items()},
            "unfinished_seeds": list(design.unfinished_seeds), "seconds": design.seconds,
            "tools": report.tools}


def _local_results(tasks, jobs):
    """``(index, result)`` as each task finishes, on a local process pool of ``jobs``."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(synthesize_point, task): index for index, task in tasks}
        for future in as_completed(futures):
            yield futures[future], _result_of(future)


def _dask_results(tasks, scheduler):
    """``(index, result)`` as each task finishes, on the Dask cluster at ``scheduler``."""
    from distributed import Client, as_completed
    try:
        client = Client(scheduler, timeout="30s")
    except (OSError, ValueError) as error:
        raise SchedulerError(f"--scheduler {scheduler}: {error}") from None
    with client:
        futures = {client.submit(synthesize_point, task, key=f"moe_hw-dse-{task['key']}",
                                 pure=False): index for index, task in tasks}
        for future in as_completed(futures):
            yield futures[future], _result_of(future)


class SchedulerError(RuntimeError):
    """The Dask scheduler cannot be reached; one line naming it."""


def _result_of(future):
    try:
        return future.result()
    except Exception as error:                      # noqa: BLE001 -- a worker died
        return {"ok": False, "reason": f"the worker failed: {type(error).__name__}: {error}",
                "cacheable": False}


# ---- figures ---------------------------------------------------------------------------------

def pareto_front(points):
    """For ``points``, a list of ``(cost, gain)`` pairs (``None`` for a point without
    figures): whether each is on the Pareto front, i.e. no other point costs no more and
    gains no less, and is better in one of the two."""
    front = []
    for i, mine in enumerate(points):
        if mine is None:
            front.append(False)
            continue
        cost, gain = mine
        front.append(not any(
            other is not None and other[0] <= cost and other[1] >= gain and
            (other[0] < cost or other[1] > gain) for j, other in enumerate(points) if j != i))
    return front


def figures(point):
    """The row of ``point`` (a dict of plain values), the throughput figures derived from its
    synthesis and its workload."""
    row = {"target": point.target, **point.swept, "status": "", "fmax_mhz": None,
           **{f"{column}_used": None for column in RESOURCES}, "cycles": point.cycles,
           "elements": point.elements, "latency_us": None, "elements_per_s": None,
           "gb_per_s": None, "elements_per_s_per_lut": None, "elements_per_s_per_dsp": None,
           "pareto_lut": False, "pareto_dsp": False, "cached": point.cached, "reason": "",
           "reference_mhz": None, "ratio": None, "critical_path": None,
           "description": point.description}
    result = point.synthesis
    if result is None or not result["ok"]:
        row["status"] = "failed"
        row["reason"] = result["reason"] if result else "not run"
        return row
    fmax = result["fmax_mhz"]
    rate = point.elements * fmax * 1e6 / point.cycles if point.cycles else math.inf
    luts, dsps = result["resources"]["lut4"], result["resources"]["dsp"]
    row.update(status="ok", fmax_mhz=fmax,
               **{f"{column}_used": used for column, used in result["resources"].items()},
               reference_mhz=result["reference_mhz"], ratio=result["ratio"],
               critical_path=result["critical_path"],
               latency_us=point.cycles / fmax, elements_per_s=rate,
               gb_per_s=rate * point.element_bits / 8 / 1e9,
               elements_per_s_per_lut=rate / luts if luts else None,
               elements_per_s_per_dsp=rate / dsps if dsps else None)
    return row


def mark_fronts(rows):
    """Mark each target's Pareto fronts (throughput against LUTs, and against DSPs) in
    ``rows``: LUT counts of different devices are not compared."""
    for target in {row["target"] for row in rows}:
        mine = [row for row in rows if row["target"] == target]
        for column, flag in (("lut4_used", "pareto_lut"), ("dsp_used", "pareto_dsp")):
            pairs = [(row[column], row["elements_per_s"]) if row["status"] == "ok" else None
                     for row in mine]
            for row, on in zip(mine, pareto_front(pairs)):
                row[flag] = on
    return rows


# ---- outputs ---------------------------------------------------------------------------------

_TABLE = [  # (heading, row key, format: cli.table_cell's spec)
    ("Fmax MHz", "fmax_mhz", "{:.1f}"), ("LUT4", "lut4_used", "{}"), ("FF", "ff_used", "{}"),
    ("DSP", "dsp_used", "{}"), ("BRAM", "bram_used", "{}"), ("cycles", "cycles", "{}"),
    ("latency us", "latency_us", "{:.3f}"),
    ("Melem/s", "elements_per_s", lambda rate: f"{rate / 1e6:.1f}"),
    ("GB/s", "gb_per_s", "{:.3f}"), ("elem/s per LUT", "elements_per_s_per_lut", "{:.0f}"),
    ("elem/s per DSP", "elements_per_s_per_dsp", "{:.3g}"),
]


def markdown_table(rows, swept):
    """The rows as a Markdown table; Pareto points marked, failed points with their reason."""
    head = ["target", *swept, *(heading for heading, _, _ in _TABLE), "Pareto", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        # a failed point keeps its cycles (the formula's) and nothing from the synthesis
        cells = [table_cell(row, key, spec) for _, key, spec in _TABLE]
        front = " ".join(name for name, flag in (("LUT", "pareto_lut"), ("DSP", "pareto_dsp"))
                         if row[flag])
        note = ("cached" if row["cached"] else "") if row["status"] == "ok" else \
            "FAILED: " + row["reason"].replace("|", "/")
        lines.append("| " + " | ".join([row["target"], *(str(row[name]) for name in swept),
                                         *cells, front or "", note]) + " |")
    return "\n".join(lines)


def pareto_plot(rows, swept, path, title):
    """Throughput against LUTs, each target's front drawn, each point labelled."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(8, 5.5), dpi=100)
    targets = sorted({row["target"] for row in rows})
    for number, target in enumerate(targets):
        ok = [row for row in rows if row["target"] == target and row["status"] == "ok"]
        if not ok:
            continue
        colour = f"C{number}"
        front = sorted((row for row in ok if row["pareto_lut"]), key=lambda row: row["lut4_used"])
        rest = [row for row in ok if not row["pareto_lut"]]
        for group, face, label in ((front, colour, f"{target} (on the front)"),
                                   (rest, "none", target)):
            if group:
                axes.scatter([row["lut4_used"] for row in group],
                             [row["elements_per_s"] / 1e6 for row in group],
                             edgecolors=colour, facecolors=face, label=label, zorder=3)
        axes.step([row["lut4_used"] for row in front],
                  [row["elements_per_s"] / 1e6 for row in front], where="post", color=colour,
                  linewidth=1.5, alpha=0.7, label=f"{target} Pareto front")
        for row in ok:
            text = ", ".join(f"{name}={row[name]}" for name in swept) or "default"
            axes.annotate(text, (row["lut4_used"], row["elements_per_s"] / 1e6), fontsize=7,
                          xytext=(4, 4), textcoords="offset points")
    # a sweep over lanes spans decades; a narrow one reads better on linear axes
    for values, scale in (([row["lut4_used"] for row in rows if row["status"] == "ok"],
                           axes.set_xscale),
                          ([row["elements_per_s"] for row in rows if row["status"] == "ok"],
                           axes.set_yscale)):
        if values and min(values) > 0 and max(values) / min(values) > 4:
            scale("log")
    axes.margins(x=0.15, y=0.1)   # room for the labels
    axes.set_xlabel("LUT4 (logic cells, whole design out of context)")
    axes.set_ylabel("throughput at post-route Fmax (M elements/s)")
    axes.set_title(title, fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def write_outputs(rows, out_dir, *, swept, meta):
    """``results.json``, ``results.csv``, ``results.md`` and ``pareto.png`` in ``out_dir``;
    returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: out_dir / name for name in ("results.json", "results.csv", "results.md",
                                                "pareto.png")}
    paths["results.json"].write_text(json.dumps({**meta, "points": rows}, indent=2,
                                                default=str) + "\n")
    with open(paths["results.csv"], "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]) if rows else ["target"])
        writer.writeheader()
        writer.writerows(rows)
    title = meta["title"].replace("\n", "; ")
    paths["results.md"].write_text(f"{title}\n\n{markdown_table(rows, swept)}\n")
    pareto_plot(rows, swept, paths["pareto.png"], meta["title"])
    return paths


# ---- the exploration -------------------------------------------------------------------------

def default_cache_dir():
    from .flows.simulate import build_root
    return build_root() / "dse-cache"


def explore(unit_name, workload, sweeps=None, targets=(DEFAULT_TARGET,), *, out_dir=None,
            jobs=None, scheduler=None, seeds=DEFAULT_SEEDS, freq=None,
            timeout=DEFAULT_TIMEOUT, cache_dir=None, work_dir=None, progress_bar=True,
            log=None):
    """Run the sweep; return ``(rows, meta)`` (and write the outputs into ``out_dir`` when
    given). ``sweeps`` is ``{parameter: [values]}``; see the module docstring."""
    log = log or (lambda text: print(f"[moe_hw.dse] {text}", file=sys.stderr, flush=True))
    started = time.perf_counter()
    targets = [find_target(target).name for target in targets]
    if len(set(targets)) != len(targets):
        raise ParameterError(f"--target names a device twice: {', '.join(targets)}")
    jobs = _check_positive("jobs", (os.cpu_count() or 1) if jobs is None else jobs, int)
    seeds = _check_positive("seeds", seeds, int)
    timeout = _check_positive("timeout", timeout)
    freq = None if freq is None else _check_positive("freq", freq)
    sweeps = dict(sweeps or {})
    unit, point, points = plan(unit_name, workload, sweeps, targets, seeds=seeds, freq=freq)

    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    for entry in points:
        cached = cache_dir / f"{entry.key}.json"
        if cached.is_file():
            entry.synthesis, entry.cached = json.loads(cached.read_text()), True
    tasks = [(index, {"unit": unit.name, "target": entry.target, "settings": entry.settings,
                      "seeds": seeds, "freq": freq, "timeout": timeout, "key": entry.key,
                      "work_dir": str(Path(work_dir) / entry.key) if work_dir else None})
             for index, entry in enumerate(points) if not entry.cached]
    where = f"the Dask cluster at {scheduler}" if scheduler else \
        f"{min(jobs, max(len(tasks), 1))} local process(es)"
    log(f"{len(points)} points: {len(points) - len(tasks)} from the cache ({cache_dir}), "
        f"{len(tasks)} to place and route on {where}")

    if tasks:
        results = _dask_results(tasks, scheduler) if scheduler else \
            _local_results(tasks, min(jobs, len(tasks)))
        from tqdm import tqdm
        with tqdm(total=len(tasks), unit="point", desc=f"{unit.name} on {workload}",
                  file=sys.stderr, disable=not progress_bar) as bar:
            for index, result in results:
                entry = points[index]
                tools = tool_versions(find_target(entry.target))
                if result["ok"] and result["tools"] != tools:
                    # a worker elsewhere with other tools: its figures would be cached
                    # under this machine's versions
                    result = {"ok": False, "cacheable": False, "reason": (
                        f"the worker ran {result['tools']}, not {tools}")}
                entry.synthesis = result
                if result["cacheable"]:
                    (cache_dir / f"{entry.key}.json").write_text(json.dumps(result, indent=1))
                status = f"{result['fmax_mhz']:.1f} MHz" if result["ok"] else "failed"
                bar.set_postfix_str(f"{entry.target} {entry.label}: {status}")
                bar.update()
                if not result["ok"]:
                    bar.write(f"[moe_hw.dse] {entry.target} {entry.label}: {result['reason']}",
                              file=sys.stderr)

    rows = mark_fronts([figures(entry) for entry in points])
    wall_s = time.perf_counter() - started
    meta = {"unit": unit.name, "workload": workload, "workload_description": point.description,
            "problem": point.problem, "targets": targets, "sweeps": sweeps, "seeds": seeds,
            "freq_mhz": freq, "timeout_s": timeout, "scheduler": scheduler, "jobs": jobs,
            "from_cache": len(points) - len(tasks), "synthesized": len(tasks),
            "failed": sum(row["status"] != "ok" for row in rows), "wall_s": round(wall_s, 1),
            "title": f"{unit.name} on {workload}: {point.description}\n"
                     f"{', '.join(targets)}, best of {seeds} seed(s)"}
    if out_dir is not None:
        write_outputs(rows, out_dir, swept=list(sweeps), meta=meta)
    log(f"{len(points)} points ({meta['from_cache']} from the cache, {meta['synthesized']} "
        f"placed and routed, {meta['failed']} failed) in {wall_s:.0f} s")
    return rows, meta


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("unit", help=f"the unit: {', '.join(WORKLOADS)}")
    parser.add_argument("--workload", required=True, metavar="POINT",
                        help="a design point of the unit (gen/*.toml; python -m moe_hw.gen list)")
    parser.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2,...",
                        help="a generation-time parameter and its values (repeatable)")
    parser.add_argument("--target", default=DEFAULT_TARGET, metavar="T1,T2",
                        help=f"devices, comma-separated (default {DEFAULT_TARGET})")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write results.csv, results.json, results.md and pareto.png here")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="local worker processes (default: one per CPU)")
    parser.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                        help="run the points on this Dask distributed scheduler instead")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, metavar="N",
                        help=f"placement seeds per point, the best reported "
                             f"(default {DEFAULT_SEEDS})")
    parser.add_argument("--freq", type=float, default=None, metavar="MHZ",
                        help="the frequency nextpnr aims at (default: the target's)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds each tool run may take (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--cache", type=Path, default=None, metavar="DIR",
                        help="the result cache (default: $MOE_HW_BUILD_DIR/dse-cache, or "
                             "build/dse-cache in a checkout)")
    parser.add_argument("--work", type=Path, default=None, metavar="DIR",
                        help="keep each point's netlists and logs in DIR/<key>")
    args = parser.parse_args(argv)

    def body():
        unit, _ = unit_or_point(args.unit)
        if args.unit != unit.name:
            raise ParameterError(f"unit must be a unit name, not the design point {args.unit!r} "
                                 "(name it with --workload)")
        sweeps = parse_sweeps(unit, args.sweep)
        targets = [name.strip() for name in args.target.split(",") if name.strip()]
        rows, meta = explore(unit.name, args.workload, sweeps, targets, out_dir=args.out,
                             jobs=args.jobs, scheduler=args.scheduler, seeds=args.seeds,
                             freq=args.freq, timeout=args.timeout, cache_dir=args.cache,
                             work_dir=args.work)
        print(meta["title"].replace("\n", "; "))
        print()
        print(markdown_table(rows, list(sweeps)))
        return 0

    try:
        return run_main(PROG, body)
    except SchedulerError as error:
        fail(PROG, str(error), code=1)


if __name__ == "__main__":
    sys.exit(main())
