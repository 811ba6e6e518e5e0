"""The flatness table of README.md (SPEC 1.7, issue 11): what building ``scan_layers`` (one
layer datapath, a parameter memory of depth L) and ``scan_layers_unrolled`` (L copies) costs
as L grows: Yosys's coarse cell count (memories apart, their bits in a column of their own),
the Verilog emission time (CPU seconds, the least of three runs) and the Verilator build time.

    python benchmarks/scan_flatness.py [--layers 2 8 32 128] [--lanes 4]
        [--unrolled-up-to 32] [--no-verilator] [--json FILE]

Cell counts are deterministic; times are figures of this machine and its load. The unrolled
chain is measured up to ``--unrolled-up-to`` layers (its cost grows linearly: the largest
points take many minutes).
"""

import argparse
import json
import sys

from moe_hw.flows.flatness import cell_count, emission_seconds, verilator_seconds
from moe_hw.units.scan_layers import ScanLayersParams, ScanLayersUnit
from moe_hw.units.scan_layers_unrolled import ScanLayersUnrolledParams, ScanLayersUnrolledUnit


def builders(layers, lanes, unrolled_up_to):
    """(unit name, L, build) for every row."""
    rows = []
    for count in layers:
        params = ScanLayersParams(lanes=lanes, max_layers=count)
        rows.append(("scan_layers", count, lambda p=params: ScanLayersUnit(p)))
    for count in layers:
        if count <= unrolled_up_to:
            params = ScanLayersUnrolledParams(lanes=lanes, layers=count)
            rows.append(("scan_layers_unrolled", count,
                         lambda p=params: ScanLayersUnrolledUnit(p)))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32, 128])
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--unrolled-up-to", type=int, default=32)
    parser.add_argument("--no-verilator", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    rows = []
    print("| unit | L | cells (no memories) | vs L=2 | memory bits | emit s | vs L=2 | "
          "verilator s |")
    print("|---|---|---|---|---|---|---|---|")
    first = {}
    first_emit = {}
    rows_to_build = builders(args.layers, args.lanes, args.unrolled_up_to)
    emission_seconds(rows_to_build[0][2], repeats=1)     # warm up (imports, Yosys)
    for name, count, build in rows_to_build:
        print(f"[scan_flatness] {name} L={count} ...", file=sys.stderr, flush=True)
        cost = cell_count(build)
        emit = emission_seconds(build)
        build_s = None if args.no_verilator else verilator_seconds(build)
        first.setdefault(name, cost.cells)
        first_emit.setdefault(name, emit)
        ratio = cost.cells / first[name]
        rows.append({"unit": name, "layers": count, "lanes": args.lanes, "cells": cost.cells,
                     "memory_bits": cost.memory_bits, "emit_s": emit, "verilator_s": build_s})
        verilator = "-" if build_s is None else f"{build_s:.1f}"
        print(f"| {name} | {count} | {cost.cells} | {ratio:.3f} | {cost.memory_bits} | "
              f"{emit:.2f} | {emit / first_emit[name]:.3f} | {verilator} |", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
