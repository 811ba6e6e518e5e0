"""The figures of README.md's scan_layers_backward section (SPEC 1.7 backward, issue 11):
cycles and memory bits of the backward pass with every activation stored and with
checkpoints every c layers.

    python benchmarks/scan_backward_figures.py [--layers 32] [--hidden 512] [--tokens 256]
        [--lanes 16] [--format fp32] [--checkpoints 0 8] [--simulate] [--json FILE]

The cycle counts are the unit's exact stall-free formula
(``ScanLayersBackwardParams.cycles``, asserted against Verilator and Icarus by
``tests/test_scan_layers_backward.py``); ``--simulate`` also runs each point in Verilator
through ``moe_hw.host.unit.run`` (bit-exact check against ``golden.scan_layers_backward``,
simulated cycles against the formula). Amaranth writes every memory's initial contents into
the Verilog, so a point with a large activation memory (134 Mbit at the defaults) is slow to
emit and to build: simulate smaller points (e.g. ``--layers 8 --tokens 32``).
"""

import argparse
import json
import sys

from moe_hw.host.scan_layers_backward import UNIT
from moe_hw.host.unit import run
from moe_hw.units.scan_layers_backward import ScanLayersBackwardParams


def figures(layers, hidden, tokens, lanes, format, checkpoint):
    params = ScanLayersBackwardParams(format=format, lanes=lanes, max_tokens=tokens,
                                      max_hidden=hidden, max_layers=layers,
                                      checkpoint=checkpoint)
    beats = -(-hidden // lanes)
    bits = params.memory_bits()
    cycles = params.cycles(tokens, hidden, layers)
    ideal = (2 * layers - 1) * tokens * beats
    return params, {"checkpoint": checkpoint, "sweeps": len(params.sweeps(layers)),
                    "slabs": params.slabs, "cycles": cycles, "ideal": ideal,
                    "efficiency": ideal / cycles, **{f"{k}_bits": v for k, v in bits.items()},
                    "memory_bits": sum(bits.values())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--lanes", type=int, default=16)
    parser.add_argument("--format", default="fp32", choices=("fp32", "fp16", "bf16"))
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[0, 8])
    parser.add_argument("--simulate", action="store_true",
                        help="also run every point in Verilator (slow for large memories)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    rows = []
    for checkpoint in args.checkpoints:
        params, row = figures(args.layers, args.hidden, args.tokens, args.lanes, args.format,
                              checkpoint)
        if args.simulate:
            inputs = UNIT.random_inputs(tokens=args.tokens, hidden=args.hidden,
                                        layers=args.layers, format=args.format)
            outcome = run(UNIT, inputs, {"relu": 1}, params=params,
                          progress=lambda text: print(f"  {text}", file=sys.stderr,
                                                      flush=True))
            row["simulated_cycles"] = outcome.cycles
            row["bit_exact"] = outcome.passed
        rows.append(row)
    print(f"scan_layers_backward: L={args.layers} H={args.hidden} S={args.tokens} "
          f"lanes={args.lanes} {args.format}; ideal = (2L - 1) * S * ceil(H/lanes) item "
          f"cycles (the forward and backward sweeps storing all)")
    head = ["checkpoint", "sweeps", "slabs", "cycles", "efficiency", "activation bits",
            "all memory bits"] + (["simulated", "bit-exact"] if args.simulate else [])
    lines = [head]
    for row in rows:
        line = [str(row["checkpoint"] or "all"), str(row["sweeps"]), str(row["slabs"]),
                str(row["cycles"]), f"{row['efficiency']:.4f}",
                str(row["activations_bits"]), str(row["memory_bits"])]
        if args.simulate:
            line += [str(row["simulated_cycles"]), str(row["bit_exact"])]
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths)))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)
    if args.simulate and not all(row["bit_exact"] and row["simulated_cycles"] == row["cycles"]
                                 for row in rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
