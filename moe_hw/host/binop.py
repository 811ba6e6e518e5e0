"""Host side of the two-operand float units ``fmul`` and ``fadd``."""

import numpy as np

from ..formats import float_format, from_bits, to_bits
from .common import HostError, format_of

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
