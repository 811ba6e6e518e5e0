"""Number formats shared by the golden models, the hardware and the testbenches.

A format is named ``fp32``, ``fp16`` or ``bf16``. Hardware sees raw bit patterns; NumPy sees
``float32``, ``float16`` or ``ml_dtypes.bfloat16`` arrays. ``to_bits`` / ``from_bits`` convert
between the two without touching the bits (NaN payloads and -0.0 survive).
"""

from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = ["FloatFormat", "FORMATS", "float_format", "to_bits", "from_bits", "is_nan_bits",
           "bits_equal", "format_of_dtype"]


@dataclass(frozen=True)
class FloatFormat:
    """An IEEE-754 binary interchange format (or bfloat16, which follows the same rules)."""

    name: str
    exp_bits: int
    mant_bits: int  # fraction bits, without the hidden bit

    @property
    def width(self):
        return 1 + self.exp_bits + self.mant_bits

    @property
    def bias(self):
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def exp_max(self):
        """The all-ones biased exponent (Inf and NaN)."""
        return (1 << self.exp_bits) - 1

    @property
    def dtype(self):
        return {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16),
                "bf16": np.dtype(ml_dtypes.bfloat16)}[self.name]

    @property
    def uint_dtype(self):
        return np.dtype(np.uint32) if self.width == 32 else np.dtype(np.uint16)

    @property
    def quiet_nan(self):
        """The canonical quiet NaN the hardware produces: positive, top fraction bit set."""
        return (self.exp_max << self.mant_bits) | (1 << (self.mant_bits - 1))

    def __str__(self):
        return self.name


FORMATS = {
    "fp32": FloatFormat("fp32", 8, 23),
    "fp16": FloatFormat("fp16", 5, 10),
    "bf16": FloatFormat("bf16", 8, 7),
}


def float_format(name):
    """Look a format up by name, with an error that names the parameter and the value."""
    if isinstance(name, FloatFormat):
        return name
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        from .params import ParameterError, check_choice
        check_choice("format", name, tuple(FORMATS))
        raise ParameterError(f"format must be a format name, not {name!r}") from None


def to_bits(array, fmt):
    """The raw bit patterns of ``array`` (cast to the format's dtype) as unsigned integers."""
    fmt = float_format(fmt)
    array = np.asarray(array).astype(fmt.dtype)
    return np.ascontiguousarray(array).view(fmt.uint_dtype).reshape(array.shape)


def from_bits(bits, fmt):
    """The floats whose raw bit patterns are ``bits``."""
    fmt = float_format(fmt)
    bits = np.asarray(bits).astype(fmt.uint_dtype)
    return np.ascontiguousarray(bits).view(fmt.dtype).reshape(bits.shape)


def is_nan_bits(bits, fmt):
    """Which raw bit patterns are NaNs."""
    fmt = float_format(fmt)
    bits = np.asarray(bits).astype(np.uint64)
    exponent = (bits >> np.uint64(fmt.mant_bits)) & np.uint64(fmt.exp_max)
    fraction = bits & np.uint64((1 << fmt.mant_bits) - 1)
    return (exponent == fmt.exp_max) & (fraction != 0)


def bits_equal(x, y, fmt):
    """Element-wise equality of raw bit patterns where any NaN equals any NaN (+0 != -0):
    the comparison every hardware-against-golden check uses."""
    fmt = float_format(fmt)
    x, y = np.broadcast_arrays(np.asarray(x), np.asarray(y))
    if x.dtype != y.dtype:
        x, y = x.astype(np.uint64), y.astype(np.uint64)
    same = np.array(x == y)
    differ = ~same                       # only these can still be two NaNs
    if differ.any():
        same[differ] = is_nan_bits(x[differ], fmt) & is_nan_bits(y[differ], fmt)
    return same


def format_of_dtype(dtype):
    """The :class:`FloatFormat` of a float32, float16 or bfloat16 dtype."""
    for fmt in FORMATS.values():
        if fmt.dtype == np.dtype(dtype):
            return fmt
    raise TypeError(f"dtype must be float32, float16 or bfloat16, not {np.dtype(dtype)}")
