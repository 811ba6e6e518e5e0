"""``python -m moe_hw.run``: push arrays through a unit's emitted Verilog in simulation.

    python -m moe_hw.run UNIT --in inputs.npz --out outputs.npz [--set NAME=VALUE ...]
                         [--sim verilator|icarus] [--stall P] [--seed N] [--no-check]
    python -m moe_hw.run POINT [--out outputs.npz]      # a design point from gen/, random data

Input keys are the golden model's arguments, output keys its results, plus ``cycles``:

    dispatch   in: gates, indices, locations, input   out: dispatch, dropped, cycles
               run-time num_experts and capacity from --set or the npz
    fmul       in: a, b                                out: product, cycles
    fadd       in: a, b                                out: sum, cycles

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
from .host.common import HostError, format_of
from .params import ParameterError
from .registry import make_params, unit_or_point

__all__ = ["main", "run_unit", "random_problem"]

RUNTIME = {"dispatch": ("num_experts", "capacity")}


def _progress(text):
    print(f"[moe_hw.run] {text}", file=sys.stderr, flush=True)


def _split_settings(unit, settings):
    names = {f.name for f in dataclasses.fields(unit.params)}
    runtime = RUNTIME.get(unit.name, ())
    params, run_values = {}, {}
    for name, value in settings.items():
        if name in names:
            params[name] = value
        elif name in runtime:
            run_values[name] = value
        else:
            known = sorted(names) + list(runtime)
            raise ParameterError(f"{unit.name} has no parameter or run-time value {name!r}; "
                                 f"known: {', '.join(known)}")
    return params, run_values


def _need(inputs, unit, keys):
    missing = [key for key in keys if key not in inputs]
    if missing:
        raise HostError(f"the input file for {unit} lacks {', '.join(missing)} "
                        f"(it needs {', '.join(keys)})")
    return [inputs[key] for key in keys]


def _runtime_int(name, run_values, inputs):
    if name in run_values:
        value = run_values[name]
    elif name in inputs:
        value = inputs[name].item() if np.ndim(inputs[name]) == 0 else None
    else:
        raise HostError(f"run-time value {name} is missing: give --set {name}=N or a scalar "
                        f"'{name}' in the input file")
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise HostError(f"{name} must be a non-negative integer, not {value!r}")
    return int(value)


def run_unit(name, inputs, settings=None, *, sim="verilator", stall=0.0, seed=0, check=True,
             progress=None):
    """Run unit (or design point) ``name`` on ``inputs`` (a dict of arrays).

    Returns ``(outputs, report)``: the output arrays (golden result names plus ``cycles``) and
    a list of report lines. Raises AssertionError when ``check`` finds a mismatch.
    """
    unit, point = unit_or_point(name)
    params_set, run_values = _split_settings(unit, settings or {})
    base = dict(point.params) if point else {}
    report = []
    if unit.name == "dispatch":
        from .host.dispatch import dispatch_params_for, run_dispatch, score_dispatch
        gates, indices, locations, input = _need(
            inputs, "dispatch", ("gates", "indices", "locations", "input"))
        num_experts = _runtime_int("num_experts", run_values, inputs)
        capacity = _runtime_int("capacity", run_values, inputs)
        params = dispatch_params_for(gates, input, num_experts=num_experts, capacity=capacity,
                                     **{**base, **params_set})
        result = run_dispatch(gates, indices, locations, input, num_experts=num_experts,
                              capacity=capacity, params=params, sim=sim, stall=stall,
                              seed=seed, progress=progress)
        outputs = {"dispatch": result.dispatch, "dropped": np.int64(result.dropped),
                   "cycles": np.int64(result.cycles)}
        eff = result.ideal_cycles / result.cycles if result.cycles else 0.0
        report += [f"dispatch: {np.asarray(gates).size} pairs, H={np.shape(input)[-1]}, "
                   f"E={num_experts}, C={capacity}, lanes={params.lanes}, {params.format}",
                   f"cycles: {result.cycles} (ideal {result.ideal_cycles}, efficiency "
                   f"{eff:.4f}); dropped pairs: {result.dropped}"]
        if check:
            problems = score_dispatch(result, gates, indices, locations, input,
                                      num_experts=num_experts, capacity=capacity,
                                      lanes=params.lanes)
            if problems:
                raise AssertionError("hardware differs from golden.dispatch_forward:\n  " +
                                     "\n  ".join(problems))
            report.append(f"check: bit-exact against golden.dispatch_forward "
                          f"({result.dispatch.size} elements); write log in order, no loss, "
                          "no duplicate, no out-of-bounds write")
        return outputs, report
    if unit.name in ("fmul", "fadd"):
        from .host.binop import run_binop
        a, b = _need(inputs, unit.name, ("a", "b"))
        fmt = params_set.get("format", base.get("format")) or format_of(a)
        if FORMATS.get(fmt) is None or np.asarray(a).dtype != FORMATS[fmt].dtype:
            raise HostError(f"a has dtype {np.asarray(a).dtype}, but format is {fmt!r}")
        params = make_params(unit, params_set, base=base)
        result, cycles = run_binop(unit.name, a, b, stages=params.stages, sim=sim, stall=stall,
                                   seed=seed, progress=progress)
        key = "product" if unit.name == "fmul" else "sum"
        outputs = {key: result, "cycles": np.int64(cycles)}
        report.append(f"{unit.name}: {np.size(a)} operations in {cycles} cycles, {fmt}")
        if check:
            from .golden.testing import bit_equal
            with np.errstate(all="ignore"):
                want = (np.asarray(a) * np.asarray(b)) if key == "product" else \
                    (np.asarray(a) + np.asarray(b))
            if not bit_equal(result, want.astype(np.asarray(a).dtype)):
                raise AssertionError(f"hardware {key} differs from NumPy")
            report.append(f"check: bit-exact against NumPy ({np.size(a)} results; NaN == NaN)")
        return outputs, report
    raise AssertionError(unit.name)


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
