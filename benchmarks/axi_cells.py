"""What the AXI wrapper adds to each unit: every unit that has run control, at its default
parameters, synthesized and packed for one target bare and behind its wrapper
(``--set interface=axi``), and the difference.

    python benchmarks/axi_cells.py [--target ecp5-85k] [--only UNIT ...] [--json FILE]

Both builds use the unit parameters the wrapper gives it (a read unit keeps 256 beats in
flight behind AXI, 16 on chip: that queue is the unit's, not the wrapper's), so the
difference is the wrapper alone: the AXI4-Lite register file, the AXI4-Stream adapters, and
per memory port an AXI4 master with its word FIFO (a block RAM on ECP5, ``axi_bram``). FF
leaves out the registers the out-of-context harness puts on every port (the bare unit has
wider ports than the wrapped one); its logic cells, about one per four port bits (the
output XOR tree), are in LUT4 and named in the last column. Packing only, no placement
(``python -m moe_hw.synth UNIT --resources``): seconds to a few minutes per design.
"""

import argparse
import json
import sys
from pathlib import Path

from moe_hw.flows.synth import RESOURCES, SynthError
from moe_hw.registry import units
from moe_hw.synth import pack

COLUMNS = ("lut4", "ff", "bram", "dram", "dsp")


def wrappable():
    """The units the wrapper takes: those with run control (the float blocks have none)."""
    names = []
    for name, unit in units().items():
        try:
            wrapper = unit.build_axi(unit.make_params({}, interface="axi"))
        except ValueError:
            continue
        wrapper._MustUse__silence = wrapper.unit._MustUse__silence = True
        names.append(name)
    return names


def used(result):
    figures = {column: result.resources[column]["used"] for column in COLUMNS}
    figures["ff"] -= result.wrapper_registers
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="ecp5-85k")
    parser.add_argument("--only", action="append", default=[], metavar="UNIT",
                        help="a unit to measure (repeatable; default: every wrappable unit)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds per tool run (default 1800)")
    args = parser.parse_args(argv)
    heads = [RESOURCES[column] for column in COLUMNS]
    print(f"The AXI wrapper's cells on {args.target} (packed, not placed), default parameters")
    print(f"| unit | bare {' / '.join(heads)} | wrapped | added | harness port bits bare / "
          "wrapped |")
    print("|---|---|---|---|---|")
    records = []
    for name in args.only or wrappable():
        print(f"[axi cells] {name} ...", file=sys.stderr, flush=True)
        unit = units()[name]
        try:
            bare = pack(name, args.target, dict(unit.axi_params), timeout=args.timeout)
            wrapped = pack(name, args.target, {"interface": "axi"}, timeout=args.timeout)
        except SynthError as error:
            print(f"| {name} | failed: {error} | | | |", flush=True)
            continue
        b, w = used(bare), used(wrapped)
        added = {column: w[column] - b[column] for column in COLUMNS}
        ports = (f"{bare.input_bits + bare.output_bits} / "
                 f"{wrapped.input_bits + wrapped.output_bits}")
        print(f"| {name} | {' / '.join(str(b[c]) for c in COLUMNS)} | "
              f"{' / '.join(str(w[c]) for c in COLUMNS)} | "
              f"{' / '.join(f'{added[c]:+d}' for c in COLUMNS)} | {ports} |", flush=True)
        records.append({"unit": name, "bare": b, "wrapped": w, "added": added,
                        "bare_port_bits": bare.input_bits + bare.output_bits,
                        "wrapped_port_bits": wrapped.input_bits + wrapped.output_bits})
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
