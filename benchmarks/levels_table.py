"""Logic levels of every design of the timing table, before placement: for each unit at its
default parameters (and dispatch at lanes 1, 8 and 16), how many register inputs sit 3, 4
and 5 or more levels behind a register in Yosys's netlist, how many signals the estimate
puts over the clock period, and the deepest one.

    python benchmarks/levels_table.py [--target ecp5-85k] [--only LABEL ...] [--json FILE]

The same figures on every run (synthesis and nextpnr's packer only: a minute or two per
design), where the placed Fmax of ``benchmarks/timing_table.py`` moves by 10-15 % with the
seed. See ``moe_hw/flows/levels.py`` for what a level is and what the estimate adds.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing_table import finish, selected, table_parser  # noqa: E402

from moe_hw.flows.synth import SynthError  # noqa: E402
from moe_hw.synth import pack  # noqa: E402


def main(argv=None):
    args = table_parser(__doc__).parse_args(argv)
    rows, records = [], []
    for label, name, settings in selected(args, "levels"):
        try:
            result = pack(name, args.target, settings, timeout=args.timeout)
        except SynthError as error:
            rows.append(f"| {label} | failed: {error} | | | | |")
            continue
        if result.levels is None:
            raise SystemExit(f"levels_table: target {args.target} has no level count "
                             "(ECP5 targets only)")
        histogram = result.levels.histogram
        at = {depth: histogram.get(depth, 0) for depth in (3, 4)}
        deeper = result.levels.deep(5)
        over = len(result.levels.over(result.period_ns))
        worst = result.levels.groups[0]
        rows.append(f"| {label} | {at[3]} | {at[4]} | {deeper} | {over} | "
                    f"{worst.levels}: `{worst.source}` -> `{worst.sink}` ({worst.pin}) |")
        records.append({"design": label, **result.to_json()})
        print(rows[-1], flush=True)
    return finish(args, f"{args.target}: register inputs by logic levels behind the nearest "
                        "register (Yosys's netlist, before placement)",
                  ["design", "at 3 levels", "at 4", "at 5 or more",
                   "signals estimated over the period", "deepest"], rows, records)


if __name__ == "__main__":
    sys.exit(main())
