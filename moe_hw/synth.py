"""``python -m moe_hw.synth``: place and route a unit out of context; report its Fmax, critical
path and resources, and its Fmax as a ratio to a reference adder in the same run.

    python -m moe_hw.synth UNIT|POINT --target T [--set NAME=VALUE ...] [--seeds N]
                           [--first-seed S] [--jobs J] [--freq MHZ] [--json FILE]
                           [--timeout S] [--work DIR] [--check] [--long-nets N]
                           [--against FILE]
    python -m moe_hw.synth UNIT|POINT --target T [--set ...] --resources [--paths N]
                           [--parts N] [--json FILE]

``--set interface=axi`` (and ``axi_*``) synthesizes the unit behind its AXI wrapper, as
``python -m moe_hw.gen emit`` does. ``--resources`` stops after nextpnr's packer: the
resources in seconds to a minute, no placement, no Fmax; on the ECP5 targets it also counts
every register input's logic levels in Yosys's netlist and lists the ``--paths`` deepest
signals with an estimate of their delay (moe_hw/flows/levels.py): the same figures on every
run, where a placement's critical path moves from seed to seed; ``--parts N`` adds the
unit's N largest parts (its submodules: a float lane, a queue, a sub-unit) by LUT4, from a
second Yosys run that keeps the hierarchy. With more than one seed the
table is followed by every seed's Fmax and critical path, and the registers the paths end
in, those that recur over the seeds first. ``--long-nets N`` adds the best seed's N nets
with the most sinks whose routing alone is over half the clock period (from nextpnr's detailed
net timing): the clock enables, set/resets and RAM write enables that a placement spread
over the chip, which the failing paths of a design far from its target share.
``--against FILE`` compares this run's seeds with those of an earlier ``--json`` report (the
build before a change, say): both means and standard deviations, the difference and its
standard error, and whether it is beyond two of them, where placement alone spreads the
seeds by 5-15 MHz.

Targets: ecp5-85k (LFE5U-85F, CABGA381, speed 8), ice40-up5k, nexus-40k (LIFCL-40), and the
ULX3S board, ulx3s-85f (its LFE5U-85F at speed 6, 25 MHz; also writes the bitstream top.bit
into the design's folder of --work). Every port
of the unit is registered, behind four pins (moe_hw/flows/out_of_context.py). The tools are
YoWASP's Yosys and nextpnr from PyPI; the first run of each compiles it (about a minute).
Progress goes to stderr, the table to stdout. A design that does not fit or fails to place
and route ends in one line naming it and the tool's error, with exit status 1. ``--check``
holds the design to the project's timing bar (250 MHz and 0.70 x the reference adder) and
exits with status 2 below it.
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from .cli import fail, parse_sets, run_main
from .flows.synth import (DEFAULT_SEEDS, DEFAULT_TIMEOUT, RESOURCES, TARGETS, SynthError,
                          compare_seeds, format_table, pack_design, synthesize,
                          target as find_target)
from .flows.levels import format_levels
from .gen import split_interface
from .registry import unit_or_point

__all__ = ["main", "synth", "synth_params", "pack", "meets_bar", "seeds_at_bar", "at_bar",
           "load_seeds", "BAR_MHZ", "BAR_RATIO"]

PROG = "python -m moe_hw.synth"

#: The timing bar every unit is held to (``--check``): Fmax and the ratio to the reference
#: adder in the same run.
BAR_MHZ = 250.0
BAR_RATIO = 0.70


def load_seeds(path):
    """The design's name and ``{seed: MHz}`` in an earlier report that ``--json`` wrote
    (``--against``); a clear error for a file that is not one."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
        design = report["design"]
        seeds = {int(seed): float(mhz) for seed, mhz in design["seed_fmax_mhz"].items()}
        name = str(design["name"])
    except FileNotFoundError:
        raise ValueError(f"--against: no file {path}") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError,
            UnicodeDecodeError):
        raise ValueError(f"--against: {path} is not a placement report of {PROG} --json "
                         "(a design with its seeds' Fmax; --resources writes none)") from None
    if not seeds:
        raise ValueError(f"--against: {path} has no placed seed")
    return name, seeds


def at_bar(fmax, reference):
    """Whether an Fmax of ``fmax`` MHz meets the bar beside a reference adder of
    ``reference`` MHz: :data:`BAR_MHZ` or more and :data:`BAR_RATIO` or more of it."""
    return fmax >= BAR_MHZ and fmax / reference >= BAR_RATIO


def seeds_at_bar(report):
    """The design's seeds that meet the bar each on its own (:func:`at_bar`, beside the
    reference adder's best seed, as the verdict takes it)."""
    return sorted(seed for seed, mhz in report.design.seed_fmax_mhz.items()
                  if at_bar(mhz, report.reference.fmax_mhz))


def meets_bar(report):
    """One line: whether the report's design meets :data:`BAR_MHZ` and :data:`BAR_RATIO`,
    and, over more than one seed, how many seeds meet it: the best seed is the verdict, and
    the count says how far it rests on one lucky placement."""
    fmax = report.design.fmax_mhz
    ratio = fmax / report.reference.fmax_mhz
    ok = at_bar(fmax, report.reference.fmax_mhz)
    seeds = report.design.seed_fmax_mhz
    count = ""
    if len(seeds) > 1:
        meeting = seeds_at_bar(report)
        count = f"; {len(meeting)} of {len(seeds)} seeds meet it" + (
            f" ({', '.join(map(str, meeting))})" if meeting else "")
    return (f"{'meets' if ok else 'below'} the bar: {report.design.description} "
            f"{fmax:.1f} MHz (>= {BAR_MHZ:g}), ratio {ratio:.3f} (>= {BAR_RATIO:.2f})"
            f"{count}")


def _progress(text):
    print(f"[moe_hw.synth] {text}", file=sys.stderr, flush=True)


def synth_params(name, target, settings=None):
    """``(unit, params, description)`` for unit or design point ``name`` with ``settings``
    (``--set`` values, on top of the design point's) on ``target``: the parameters
    :func:`synth` builds, which the exploration flow also feeds to the cycle formula."""
    target = find_target(target)
    unit, point = unit_or_point(name)
    settings = dict(settings or {})
    base = dict(point.params if point else {})
    unit_settings, interface, _ = split_interface(settings)
    # The multipliers and block memories are built for the device: registered MULT18X18D
    # and DP16KD blocks on ECP5 (the inferred `*` leaves the DSP registers unused, an
    # inferred block RAM has no output register), unless --set dsp=... / bram=... says
    # otherwise.
    fields = {f.name for f in dataclasses.fields(unit.params)}
    if target.nextpnr == "ecp5":
        for field in ("dsp", "bram"):
            if field in fields:
                base.setdefault(field, "ecp5")
    params = unit.make_params(unit_settings, base=base, interface=interface)
    shown = {**base, **settings}
    description = " ".join([name, *(f"{key}={value}" for key, value in shown.items())])
    return unit, params, description


def _design(name, target, settings):
    """``(unit name, build, description, params)`` of unit or design point ``name`` with
    ``settings`` on ``target``, behind its AXI wrapper when they say so."""
    unit, params, description = synth_params(name, target, settings)
    _, _, axi = split_interface(settings)
    if axi is not None and "axi_bram" not in (settings or {}) and \
            find_target(target).nextpnr == "ecp5":
        axi = dataclasses.replace(axi, axi_bram="ecp5")     # as the units' bram, above

    def build():
        return unit.build(params) if axi is None else unit.build_axi(params, axi,
                                                                     own_clock=False)

    return unit.name, build, description, dataclasses.asdict(params)


def synth(name, target, settings=None, *, seeds=DEFAULT_SEEDS, freq=None,
          timeout=DEFAULT_TIMEOUT, work_dir=None, progress=None, jobs=None, first_seed=1,
          long_nets=0):
    """Synthesize unit or design point ``name`` with ``settings`` (``--set`` values, on top
    of the design point's) on ``target``, placed on ``seeds`` seeds from ``first_seed`` on;
    return the :class:`~moe_hw.flows.synth.SynthReport`. Every argument is checked before any
    tool runs. ``long_nets``: list that many of the best seed's long nets."""
    unit, build, description, params = _design(name, target, settings)
    return synthesize(unit, build, target, description=description, params=params,
                      seeds=seeds, freq=freq, timeout=timeout, work_dir=work_dir,
                      progress=progress, jobs=jobs, first_seed=first_seed,
                      long_nets=long_nets)


def pack(name, target, settings=None, *, timeout=DEFAULT_TIMEOUT, work_dir=None,
         progress=None, parts=0):
    """``name`` with ``settings`` on ``target`` as :func:`synth` builds it, synthesized and
    packed only: its :class:`~moe_hw.flows.synth.PackResult` (the resources, no Fmax; with
    ``parts``, also its largest parts)."""
    unit, build, description, params = _design(name, target, settings)
    return pack_design(unit, build, target, description=description, params=params,
                       timeout=timeout, work_dir=work_dir, progress=progress, parts=parts)


def format_parts(parts):
    """The largest parts of a unit (:func:`~moe_hw.flows.synth.parts_from_stat`) as a
    table."""
    widths = {"LUT4": 7, "carry": 6, "FF": 7, "DSP": 4, "BRAM": 5, "DRAM": 5}
    lines = ["Largest parts (Yosys's cells with the hierarchy kept, before packing; a part "
             "counts its subparts):",
             " ".join(f"{column:>{width}}" for column, width in widths.items()) + "  part"]
    for name, cells in parts:
        lines.append(" ".join(f"{cells[column]:>{width}}" for column, width in widths.items())
                     + f"  {name or '(the unit)'}")
    return "\n".join(lines)


def format_resources(result, target, *, paths=12):
    """A :class:`~moe_hw.flows.synth.PackResult` as two lines of a table, on ECP5 its
    logic levels (the histogram and the ``paths`` deepest signals), and its largest parts
    when it has them."""
    head = [f"{heading:>7}" for heading in RESOURCES.values()]
    used = [f"{result.resources[column]['used']:>7}" for column in RESOURCES]
    return "\n".join([
        f"{result.description} on {find_target(target).device} ({target}), packed, "
        "not placed (no Fmax)",
        " ".join(head), " ".join(used),
        f"FF includes the out-of-context wrapper's {result.wrapper_registers} registers.",
        *([format_levels(result.levels, result.period_ns, rows=paths)]
          if result.levels is not None else []),
        *([format_parts(result.parts)] if result.parts else [])])


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("unit", help="a unit name or a design point name "
                                     "(python -m moe_hw.gen list)")
    parser.add_argument("--target", required=True, metavar="T",
                        help=f"the device: {', '.join(TARGETS)}")
    parser.add_argument("--set", action="append", metavar="NAME=VALUE", default=[],
                        help="a generation-time parameter (repeatable)")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, metavar="N",
                        help=f"placement seeds per design; the best is reported "
                             f"(default {DEFAULT_SEEDS})")
    parser.add_argument("--first-seed", type=int, default=1, metavar="S",
                        help="the first placement seed (default 1): --seeds 8 --first-seed 9 "
                             "places seeds 9-16, as the last eight of a run of 16 would")
    parser.add_argument("--jobs", type=int, default=None, metavar="J",
                        help="seeds placed and routed at once (default: one per CPU core, "
                             "at most --seeds; each seed's figures are the same either way)")
    parser.add_argument("--freq", type=float, default=None, metavar="MHZ",
                        help="the frequency nextpnr aims at (default: 250 MHz on ecp5-85k "
                             "and nexus-40k, 100 MHz on ice40-up5k)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="also write the report as JSON")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds each tool run (Yosys, one nextpnr seed) may take "
                             f"(default {DEFAULT_TIMEOUT:g}); a seed that takes longer is "
                             f"skipped, and the run fails only if no seed finishes")
    parser.add_argument("--check", action="store_true",
                        help=f"exit with status 2 unless the design meets the timing bar: "
                             f"Fmax >= {BAR_MHZ:g} MHz and >= {BAR_RATIO:.2f} x the "
                             f"reference adder")
    parser.add_argument("--work", type=Path, default=None, metavar="DIR",
                        help="keep the RTLIL, netlists, logs and nextpnr reports in DIR")
    parser.add_argument("--resources", action="store_true",
                        help="synthesize and pack only: the resources, no placement and no "
                             "Fmax (seconds to a minute); on ECP5 also the logic levels "
                             "of every register input")
    parser.add_argument("--paths", type=int, default=12, metavar="N",
                        help="with --resources on ECP5: list the N signals with the "
                             "deepest logic (default 12; 0 for the histogram alone)")
    parser.add_argument("--parts", type=int, default=0, metavar="N",
                        help="with --resources: also the unit's N largest parts (its "
                             "submodules, by LUT4: the cells per lane, per queue...) from a "
                             "second Yosys run that keeps the hierarchy (default 0: none)")
    parser.add_argument("--long-nets", type=int, default=0, metavar="N",
                        help="list the best seed's N nets with the most sinks whose routing "
                             "alone is over half the clock period (the clock enables and "
                             "set/resets a placement spread over the chip; default 0: none)")
    parser.add_argument("--against", type=Path, default=None, metavar="FILE",
                        help="an earlier --json report: compare this run's seeds with its "
                             "seeds (means, standard deviations, the difference and its "
                             "standard error)")
    args = parser.parse_args(argv)

    def resources():
        if args.check:
            raise ValueError("--check needs an Fmax: leave out --resources")
        if args.paths < 0:
            raise ValueError(f"--paths must be 0 or more, not {args.paths}")
        if args.parts < 0:
            raise ValueError(f"--parts must be 0 or more, not {args.parts}")
        if args.long_nets:
            raise ValueError("--long-nets needs a placement: leave out --resources")
        if args.against:
            raise ValueError("--against compares placements: leave out --resources")
        start = time.perf_counter()
        result = pack(args.unit, args.target, parse_sets(args.set), timeout=args.timeout,
                      work_dir=args.work, progress=_progress, parts=args.parts)
        print(format_resources(result, args.target, paths=args.paths))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result.to_json(), indent=2) + "\n")
            _progress(f"wrote {args.json}")
        _progress(f"done in {time.perf_counter() - start:.0f} s")
        return 0

    def body():
        if args.resources:
            return resources()
        if args.parts:
            raise ValueError("--parts counts a packed design: add --resources")
        if find_target(args.target).bitstream and args.work is None:
            raise ValueError(f"target {args.target} writes a bitstream: name --work DIR to "
                             "keep it")
        if args.long_nets < 0:
            raise ValueError(f"--long-nets must be 0 or more, not {args.long_nets}")
        earlier = load_seeds(args.against) if args.against else None
        start = time.perf_counter()
        report = synth(args.unit, args.target, parse_sets(args.set), seeds=args.seeds,
                       freq=args.freq, timeout=args.timeout, work_dir=args.work,
                       progress=_progress, jobs=args.jobs, first_seed=args.first_seed,
                       long_nets=args.long_nets)
        print(format_table(report))
        if earlier:
            name, seeds = earlier
            print("\n".join([f"Against {args.against} ({name}):", *(
                "  " + line for line in compare_seeds(report.design.seed_fmax_mhz, seeds,
                                                      names=("this run", "that report")))]))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
            _progress(f"wrote {args.json}")
        _progress(f"done in {time.perf_counter() - start:.0f} s")
        if args.check:
            verdict = meets_bar(report)
            print(verdict)
            return 0 if verdict.startswith("meets") else 2
        return 0

    try:
        return run_main(PROG, body)
    except SynthError as error:
        fail(PROG, str(error), code=1)


if __name__ == "__main__":
    sys.exit(main())
