"""The figures of README.md's expand section for the split across P parallel units (SPEC 1.6,
OneFlow SBP ``split(d)``, issue 7 part 4): total stall-free cycles for P = 1, 2, 4 on a gate
broadcast [S, 1] -> [S, H] (split over the tokens, dim 0) and a row broadcast [1, H] ->
[S, H] (split along the row, dim 1; dim 0 is broadcast and cannot be split).

    python benchmarks/expand_parts.py [--tokens 1024] [--hidden 512] [--lanes 16]
        [--parts 1 2 4] [--simulate] [--sim-tokens 128] [--sim-hidden 256] [--json FILE]

The full-size figures are the unit's exact stall-free formula (``ExpandParams.split_cycles``:
the slowest part's ``ExpandParams.cycles`` plus 1 for P > 1), which
``tests/test_expand.py`` asserts against Verilator and Icarus. ``--simulate`` also runs a
mid-size gate [sim_tokens, 1] -> [sim_tokens, sim_hidden] and row [1, sim_tokens] ->
[sim_hidden, sim_tokens] for every P in Verilator (one build per P, both shapes on it:
``max_input`` = sim_tokens / P and ``max_output`` = sim_tokens * sim_hidden / P per part),
bit-exact against ``golden.expand``, and prints the simulated cycles beside the formula.
"""

import argparse
import json
import sys

import numpy as np

from moe_hw.host.expand import UNIT, random_elements, split
from moe_hw.host.unit import run


def problems(tokens, hidden, seed=0):
    """``{name: inputs}``: the gate and the row broadcast at [tokens, hidden]."""
    rng = np.random.default_rng(seed)
    size = np.array([tokens, hidden], np.int64)
    return {"gate": {"input": random_elements(rng, (tokens, 1), "fp32"), "expand_size": size},
            "row": {"input": random_elements(rng, (1, hidden), "fp32"), "expand_size": size}}


def figure(name, inputs, parts, settings, *, simulate=False):
    problem = UNIT.problem(inputs, {})
    params = UNIT.params_for(problem, {"parts": parts, **settings})
    cut = split(problem, parts)
    row = {"case": name, "shape": f"{list(problem['input'].shape)} -> "
                                  f"{problem['output_shape']}",
           "parts": parts, "split_dim": cut.split_dim,
           "part_output": cut.parts[0]["output_shape"],
           "ideal": UNIT.ideal_cycles(problem, params), "cycles": UNIT.cycles(problem, params)}
    if simulate:
        outcome = run(UNIT, inputs, {"parts": parts, **settings})
        row.update(simulated=outcome.cycles, passed=outcome.passed)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--lanes", type=int, default=16)
    parser.add_argument("--parts", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--simulate", action="store_true")
    parser.add_argument("--sim-tokens", type=int, default=128)
    parser.add_argument("--sim-hidden", type=int, default=256)
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    rows = []
    print(f"formula (ExpandParams.split_cycles), lanes {args.lanes}, fp32, stall-free:")
    for name, inputs in problems(args.tokens, args.hidden).items():
        base = None
        for parts in args.parts:
            row = figure(name, inputs, parts, {"lanes": args.lanes})
            base = base or row["cycles"]
            rows.append(row)
            print(f"  {name:4} {row['shape']:28} P={parts}  split_dim {row['split_dim']}  "
                  f"part output {row['part_output']}  cycles {row['cycles']:6}  "
                  f"ideal {row['ideal']:6}  efficiency {row['ideal'] / row['cycles']:.4f}  "
                  f"x{base / row['cycles']:.3f} of P=1")
    if args.simulate:
        tokens, hidden = args.sim_tokens, args.sim_hidden
        print(f"simulated (Verilator), lanes {args.lanes}, fp32, stall-free, bit-exact check:")
        sim_problems = problems(tokens, hidden, seed=1)
        # The row broadcast [1, tokens] -> [hidden, tokens]: the same per-part sizes as the
        # gate, so both run on one build per P.
        rng = np.random.default_rng(2)
        sim_problems["row"] = {"input": random_elements(rng, (1, tokens), "fp32"),
                               "expand_size": np.array([hidden, tokens], np.int64)}
        for parts in args.parts:
            settings = {"lanes": args.lanes, "max_input": -(-tokens // parts),
                        "max_output": -(-tokens * hidden // parts)}
            for name, inputs in sim_problems.items():
                row = figure(name, inputs, parts, settings, simulate=True)
                rows.append(row)
                print(f"  {name:4} {row['shape']:28} P={parts}  split_dim {row['split_dim']}  "
                      f"simulated {row['simulated']:6}  formula {row['cycles']:6}  "
                      f"{'equal' if row['simulated'] == row['cycles'] else 'DIFFER'}  "
                      f"{'bit-exact' if row['passed'] else 'NOT BIT-EXACT'}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    bad = [row for row in rows if "simulated" in row
           and (row["simulated"] != row["cycles"] or not row["passed"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
