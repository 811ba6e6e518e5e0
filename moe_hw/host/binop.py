"""Host side of the two-operand float units ``fmul`` and ``fadd``."""

import numpy as np

from ..formats import FORMATS, bits_equal, float_format, from_bits, to_bits
from ..registry import ArithParams, Unit
from .common import HostError, format_of, need

__all__ = ["run_binop"]


def run_binop(unit, a, b, *, stages=None, sim="verilator", stall=0.0, seed=0, progress=None):
    """Push arrays ``a`` and ``b`` (same shape and float dtype) through the float unit
    ``unit`` ("fmul" or "fadd"); return ``(result array, cycles)``."""
    from ..arith.fadd import FloatAdder
    from ..arith.fmul import FloatMultiplier
    from ..flows.simulate import simulate

    classes = {"fmul": (FloatMultiplier, "product"), "fadd": (FloatAdder, "sum")}
    if unit not in classes:
        raise HostError(f"unit must be one of {', '.join(classes)}, not {unit!r}")
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise HostError(f"a has shape {a.shape} but b has shape {b.shape}; they must match")
    if a.dtype != b.dtype:
        raise HostError(f"a has dtype {a.dtype} but b has dtype {b.dtype}; they must match")
    fmt = float_format(format_of(a))
    cls, field = classes[unit]
    component = cls(fmt.name, stages)
    stimulus = {"a": to_bits(a.reshape(-1), fmt).astype(np.uint64),
                "b": to_bits(b.reshape(-1), fmt).astype(np.uint64)}
    settings = {"stall": float(stall), "seed": int(seed), "unit": unit, "result": field}
    res = simulate(component, unit, "bench_binop", stimulus, sim=sim, settings=settings,
                   progress=progress)
    return from_bits(res["result"], fmt).reshape(a.shape), int(res["cycles"])


def _runner(unit):
    key = "product" if unit == "fmul" else "sum"

    def run(inputs, params, runtime, *, sim, stall, seed, check, progress):
        a, b = need(inputs, unit, ("a", "b"))
        fmt = params.get("format") or format_of(a)
        if FORMATS.get(fmt) is None or np.asarray(a).dtype != FORMATS[fmt].dtype:
            raise HostError(f"a has dtype {np.asarray(a).dtype}, but format is {fmt!r}")
        params = ArithParams(**{**params, "format": fmt})
        result, cycles = run_binop(unit, a, b, stages=params.stages, sim=sim, stall=stall,
                                   seed=seed, progress=progress)
        report = [f"{unit}: {np.size(a)} operations in {cycles} cycles, {fmt}"]
        if check:
            with np.errstate(all="ignore"):
                want = np.asarray(a) * np.asarray(b) if unit == "fmul" else \
                    np.asarray(a) + np.asarray(b)
            fmt_ = float_format(fmt)
            same = bits_equal(to_bits(result, fmt_), to_bits(want.astype(fmt_.dtype), fmt_),
                              fmt_)
            if not same.all():
                raise AssertionError(f"hardware {key} differs from NumPy in "
                                     f"{np.count_nonzero(~same)} of {same.size} results")
            report.append(f"check: bit-exact against NumPy ({np.size(a)} results; NaN == NaN)")
        return {key: result, "cycles": np.int64(cycles)}, report

    return run


def _build(cls_name):
    def build(params):
        from ..arith import fadd, fmul
        cls = {"fmul": fmul.FloatMultiplier, "fadd": fadd.FloatAdder}[cls_name]
        return cls(params.format, params.stages)
    return build


UNITS = [
    Unit("fmul", "IEEE-754 multiplier, round to nearest even, subnormals; stream of "
         "(a, b) -> product", ArithParams, _build("fmul"), _runner("fmul"),
         inputs=("a", "b"), outputs=("product",)),
    Unit("fadd", "IEEE-754 adder, round to nearest even, subnormals; stream of "
         "(a, b) -> sum", ArithParams, _build("fadd"), _runner("fadd"),
         inputs=("a", "b"), outputs=("sum",)),
]
