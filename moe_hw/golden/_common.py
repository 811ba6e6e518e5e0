"""Argument checks and format arithmetic shared by the golden models.

Arithmetic: every float operation is done in the data's own format (float32, float16 or
bfloat16), one IEEE-754 round-to-nearest-even per operation, no fused multiply-add. NumPy and
ml_dtypes compute a float16/bfloat16 product or sum in float32 and round once to the format; for
these formats that double rounding is innocuous (float32 has at least 2p+2 bits and the exact
product of two halves or bfloats is representable in float32), so the result is the correctly
rounded one a hardware multiplier or adder produces. (Casting float64 to bfloat16 is *not*
innocuous, so nothing here computes in float64.)

Array conventions: an argument that already has a dtype keeps it and must be of the right kind;
a plain Python list or number is converted (floats to float32, the reference format; integers to
int64), which keeps small hand-written examples short.
"""

import operator

import numpy as np

from ..formats import FORMATS

__all__ = []

FLOAT_DTYPES = tuple(fmt.dtype for fmt in FORMATS.values())
_FLOAT_NAMES = "float32, float16 or bfloat16"


def check_count(name, value, *, minimum=0):
    """``value`` as a Python int, or an error naming ``name`` (e.g. negative capacity)."""
    what = "a non-negative integer" if minimum == 0 else \
           "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be {what}, not {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {what}, not {value!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be {what}, not {value}")
    return value


def check_choice(name, value, choices):
    """An integer flag restricted to ``choices`` (e.g. ``idx_type`` in (0, 1))."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, not {value!r}")
    return int(value)


def _ndim(name, array, ndim, what):
    if ndim is None:
        return array
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if array.ndim not in allowed:
        dims = " or ".join(map(str, allowed))
        shape = f" {what}" if what else ""
        raise ValueError(f"{name} must have {dims} dimension(s){shape}, "
                         f"not {array.ndim} (shape {array.shape})")
    return array


def float_array(name, value, *, ndim=None, what=""):
    """``value`` as a float32/float16/bfloat16 array (plain lists become float32)."""
    if hasattr(value, "dtype"):
        array = np.asarray(value)
        if array.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must have dtype {_FLOAT_NAMES}, not {array.dtype}")
    else:
        array = np.asarray(value)
        if array.dtype.kind not in "iuf" and array.size:
            raise TypeError(f"{name} must be an array of numbers, not {value!r}")
        array = array.astype(np.float32)
    return _ndim(name, array, ndim, what)


def index_array(name, value, *, ndim=None, what=""):
    """``value`` as an integer array of any width and signedness (plain lists become int64)."""
    array = np.asarray(value)
    if not hasattr(value, "dtype") and array.size == 0:
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, not {array.dtype}")
    return _ndim(name, array, ndim, what)


def same_dtype(name, array, ref_name, ref):
    """Gate and data share one format: reject a mix with both dtypes named."""
    if array.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {array.dtype}, but {ref_name} has {ref.dtype}; "
                        f"they must share one format")


def check_length(name, length, expected, what):
    """E.g. "input must have 4 rows (S, the length of indices), not 5"."""
    if length != expected:
        raise ValueError(f"{name} must have {expected} {what}, not {length}")


def routing_arrays(indices, locations, gates=None):
    """Validate top-k routing arrays of shape [S] or [k, S] and view them as [k, S].

    Returns ``(indices, locations, gates)`` (``gates`` None when not given), all 2-D; the caller
    restores the caller's shape with ``reshape(original_shape)``.
    """
    indices = index_array("indices", indices, ndim=(1, 2), what="[S] or [k, S]")
    locations = index_array("locations", locations, ndim=(1, 2), what="[S] or [k, S]")
    if locations.shape != indices.shape:
        raise ValueError(f"locations has shape {locations.shape}, but indices has shape "
                         f"{indices.shape}; they must match")
    if gates is not None:
        gates = float_array("gates", gates, ndim=(1, 2), what="[S] or [k, S]")
        if gates.shape != indices.shape:
            raise ValueError(f"gates has shape {gates.shape}, but indices has shape "
                             f"{indices.shape}; they must match")
        gates = _rows_of_pairs(gates)
    return _rows_of_pairs(indices), _rows_of_pairs(locations), gates


def _rows_of_pairs(array):
    return array if array.ndim == 2 else array[np.newaxis]


def slot_rows(indices, locations, num_experts, capacity):
    """The expert-buffer row of every (k, i) pair, ``index * capacity + location``, or -1.

    -1 marks a pair that fails the mask ``0 <= index < num_experts and 0 <= location <
    capacity`` (a dropped pair); any bit pattern in ``indices``/``locations`` gives a row in
    ``[0, num_experts * capacity)`` or -1, never anything else.
    """
    valid = (indices >= 0) & (indices < num_experts) & (locations >= 0) & (locations < capacity)
    rows = np.full(indices.shape, -1, dtype=np.int64)
    rows[valid] = indices[valid].astype(np.int64) * capacity + locations[valid].astype(np.int64)
    return rows


def mul(a, b):
    """``a * b`` rounded once to the format of ``a`` (IEEE, NaN/Inf by IEEE rules, no warnings)."""
    a = np.asarray(a)
    with np.errstate(all="ignore"):
        return np.multiply(a, np.asarray(b, dtype=a.dtype), dtype=a.dtype)


def add(a, b):
    """``a + b`` rounded once to the format of ``a``; +0.0 + -0.0 = +0.0 as IEEE says."""
    a = np.asarray(a)
    with np.errstate(all="ignore"):
        return np.add(a, np.asarray(b, dtype=a.dtype), dtype=a.dtype)
