"""The timing table of README.md: every unit at its default parameters, and dispatch at lanes
1, 8 and 16, through ``python -m moe_hw.synth`` on one target, against the timing bar.

    python benchmarks/timing_table.py [--target ecp5-85k] [--seeds 3] [--json FILE]

Prints a Markdown table (Fmax, ratio to the reference adder, whether the best seed meets the
bar and how many seeds do each on their own, LUT4, FF, DSP, distributed RAM, critical path,
and every seed's Fmax: placement alone moves it by up to 10 %) and, for
dispatch, the throughput at Fmax (lanes x 4 B x Fmax). Long: a few minutes per design and
seed; the seeds of a design run side by side, one per CPU core (``--jobs``).
"""

import argparse
import json
import sys
from pathlib import Path

from moe_hw.flows.synth import SynthError, format_seeds
from moe_hw.registry import units
from moe_hw.synth import BAR_MHZ, BAR_RATIO, at_bar, seeds_at_bar, synth


def designs():
    """(label, unit name, settings) for every row of the table."""
    rows = [(name, name, {}) for name in units()]
    rows += [(f"dispatch lanes={lanes}", "dispatch", {"lanes": lanes}) for lanes in (1, 8, 16)]
    return rows


def table_parser(description):
    """The options this table and ``levels_table.py`` share: ``--target``, ``--json``,
    ``--timeout``, ``--only``."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="ecp5-85k")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds per tool run (default 1800)")
    parser.add_argument("--only", action="append", default=[],
                        help="a row label to run (repeatable; default: every row)")
    return parser


def selected(args, tag):
    """The rows of :func:`designs` that ``--only`` names (every row without it), each
    announced on stderr as it starts."""
    for label, name, settings in designs():
        if args.only and label not in args.only:
            continue
        print(f"[{tag}] {label} ...", file=sys.stderr, flush=True)
        yield label, name, settings


def main(argv=None):
    parser = table_parser(__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=None,
                        help="seeds placed at once (default: one per CPU core)")
    args = parser.parse_args(argv)
    rows, records = [], []
    for label, name, settings in selected(args, "timing"):
        try:
            report = synth(name, args.target, settings, seeds=args.seeds, timeout=args.timeout,
                           jobs=args.jobs)
        except SynthError as error:
            rows.append(f"| {label} | failed: {error} | | | | | | | |")
            continue
        design = report.design
        ratio = design.fmax_mhz / report.reference.fmax_mhz
        path = next(iter(design.clocks.values())).critical_path
        used = {key: value["used"] for key, value in design.resources.items()}
        ok = at_bar(design.fmax_mhz, report.reference.fmax_mhz)
        extra = ""
        if name == "dispatch":
            lanes = settings.get("lanes", 4)
            extra = f" ({lanes * 4 * design.fmax_mhz / 1000:.1f} GB/s at Fmax)"
        meeting = len(seeds_at_bar(report))
        rows.append(f"| {label} | {design.fmax_mhz:.1f}{extra} | {ratio:.3f} | "
                    f"{'yes' if ok else 'no'} ({meeting} of {len(design.seed_fmax_mhz)} "
                    f"seeds) | {used['lut4']} | {used['ff']} | {used['dsp']} | "
                    f"{used['dram']} | `{path.start}` -> `{path.end}` | "
                    f"{format_seeds(design)} |")
        records.append(report.to_json())
        print(rows[-1], flush=True)
    return finish(args, f"{args.target}, best of {args.seeds} seeds; the bar: {BAR_MHZ:g} "
                        f"MHz and {BAR_RATIO:.2f} x the reference adder",
                  ["design", "Fmax MHz", "ratio", "meets the bar", "LUT4", "FF", "DSP", "DRAM",
                   "critical path", "Fmax by seed"], rows, records)


def finish(args, title, columns, rows, records):
    """Prints ``title`` and the Markdown table of ``rows`` under ``columns``; writes
    ``records`` to ``--json``. Returns 0."""
    print(f"\n{title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    print("\n".join(rows))
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
