"""``python -m moe_hw.run``: push arrays through a unit's emitted Verilog in simulation.

    python -m moe_hw.run UNIT --in inputs.npz --out outputs.npz [--set NAME=VALUE ...]
                         [--sim verilator|icarus] [--stall P] [--seed N] [--no-check]
    python -m moe_hw.run POINT [--out outputs.npz]      # a design point from gen/, random data

Input keys are the golden model's arguments, output keys its results, plus ``cycles``:

    dispatch                in: gates, indices, locations, input; num_experts, capacity
                            out: dispatch, dropped, cycles
    locations               in: indices; num_experts, capacity
                            out: locations, expert_counts, dropped, cycles
    sparse_index            in: gates [S, E]      out: batch_index, part_sizes, nonzero_gates
    sparse_gather           in: input, batch_index                 out: expert_input
    combine_gather          in: gates, indices, locations, expert_out; capacity
                            out: combined
    combine_scatter         in: gates [S, E], expert_out [slots, H]  out: combined
    dispatch_backward_data  in: gates, indices, locations, grad_dispatch; num_experts,
                            capacity                               out: grad_input
    dispatch_backward_gate  in: input, indices, locations, grad_dispatch; num_experts,
                            capacity                               out: grad_gates
    moe_layer               in: gates [S, E], input, [expert_scale, expert_bias]; capacity
                            out: output, dropped
    fmul / fadd             in: a, b                               out: product / sum

Every output file also holds ``cycles``. Run-time values (after the ``;``) come from --set or
from scalars in the npz.

Generation-time parameters (``python -m moe_hw.gen list``) come from --set; the ones not given
are sized to the problem, and the number format follows the arrays' dtype. The result is
checked bit for bit against the golden model unless --no-check is given.
"""

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from . import golden
from .cli import parse_sets, run_main
from .formats import FORMATS
from .host.common import HostError
from .params import ParameterError
from .registry import unit_or_point

__all__ = ["main", "run_unit", "random_problem"]

def _progress(text):
    print(f"[moe_hw.run] {text}", file=sys.stderr, flush=True)


def _split_settings(unit, settings):
    names = {f.name for f in dataclasses.fields(unit.params)}
    params, runtime = {}, {}
    for name, value in settings.items():
        if name in names:
            params[name] = value
        elif name in unit.runtime:
            runtime[name] = value
        else:
            known = sorted(names) + list(unit.runtime)
            raise ParameterError(f"{unit.name} has no parameter or run-time value {name!r}; "
                                 f"known: {', '.join(known)}")
    return params, runtime


def run_unit(name, inputs, settings=None, *, sim="verilator", stall=0.0, seed=0, check=True,
             progress=None):
    """Run unit (or design point) ``name`` on ``inputs`` (a dict of arrays).

    Returns ``(outputs, report)``: the output arrays (golden result names plus ``cycles``) and
    a list of report lines. Raises AssertionError when ``check`` finds a mismatch.
    """
    unit, point = unit_or_point(name)
    params, runtime = _split_settings(unit, settings or {})
    if point:
        params = {**point.params, **params}
    return unit.run(inputs, params, runtime, sim=sim, stall=stall, seed=seed, check=check,
                    progress=progress)


def random_problem(point, seed=0):
    """Seeded random inputs at a design point's problem scale (see gen/*.toml)."""
    rng = np.random.default_rng(seed)
    prob = point.problem
    dtype = FORMATS[point.params.get("format", "fp32")].dtype
    if point.unit == "dispatch":
        tokens, k = prob["tokens"], prob.get("top_k", 1)
        experts, hidden = prob["num_experts"], prob["hidden"]
        indices = np.stack([rng.permutation(experts)[:k] for _ in range(tokens)], axis=1) \
            if k <= experts else rng.integers(0, experts, (k, tokens))
        gates = rng.random((k, tokens)).astype(np.float32).astype(dtype)
        return {"gates": gates, "indices": indices,
                "locations": golden.compute_locations(indices, num_experts=experts),
                "input": rng.standard_normal((tokens, hidden)).astype(np.float32).astype(dtype),
                "num_experts": np.int64(experts), "capacity": np.int64(prob["capacity"])}
    raise HostError(f"design point {point.name} has no random problem generator")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m moe_hw.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("unit", help="a unit (python -m moe_hw.gen list) or a design point")
    parser.add_argument("--in", dest="inputs", type=Path,
                        help="input .npz (optional for a design point: random data)")
    parser.add_argument("--out", type=Path, help="output .npz")
    parser.add_argument("--set", action="append", metavar="NAME=VALUE", default=[],
                        help="generation-time parameter or run-time value (repeatable)")
    parser.add_argument("--sim", default="verilator", choices=("verilator", "icarus"))
    parser.add_argument("--stall", type=float, default=0.0,
                        help="probability of a random valid/ready pause per stream per cycle")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-check", action="store_true",
                        help="do not compare against the golden model")
    args = parser.parse_args(argv)

    def body():
        unit, point = unit_or_point(args.unit)
        if args.inputs is not None:
            with np.load(args.inputs) as npz:
                inputs = {key: npz[key] for key in npz.files}
        elif point is not None:
            inputs = random_problem(point, args.seed)
            _progress(f"design point {point.name}: {point.description}; random inputs "
                      f"(seed {args.seed})")
        else:
            raise HostError(f"unit {unit.name} needs --in FILE.npz")
        if not 0.0 <= args.stall < 1.0:
            raise HostError(f"--stall must be in [0, 1), not {args.stall}")
        start = time.perf_counter()
        try:
            outputs, report = run_unit(args.unit, inputs, parse_sets(args.set), sim=args.sim,
                                       stall=args.stall, seed=args.seed,
                                       check=not args.no_check, progress=_progress)
        except AssertionError as error:
            print(f"{parser.prog}: MISMATCH: {error}", file=sys.stderr)
            return 1
        for line in report:
            print(line)
        print(f"wall time: {time.perf_counter() - start:.1f} s ({args.sim})")
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            np.savez(args.out, **outputs)
            print(f"wrote {args.out} ({', '.join(outputs)})")
        return 0

    return run_main(parser.prog, body)


if __name__ == "__main__":
    sys.exit(main())
