"""Helpers for checking hardware and models against the goldens (SPEC 1 and 3).

- :func:`bit_equal` is SPEC 1's comparison rule: floats match bit for bit, except that any NaN
  equals any NaN (+0.0 and -0.0 differ);
- :func:`random_floats` draws seeded test values in a format, mixing ordinary numbers with
  the special ones SPEC 3 asks for (NaN, +-Inf, subnormals, +-0.0).
"""

import numpy as np

from ..formats import FORMATS

__all__ = ["bit_equal", "format_of", "random_floats"]


def format_of(dtype):
    """The :class:`~moe_hw.formats.FloatFormat` of a float32/float16/bfloat16 dtype."""
    for fmt in FORMATS.values():
        if fmt.dtype == np.dtype(dtype):
            return fmt
    raise TypeError(f"dtype must be float32, float16 or bfloat16, not {np.dtype(dtype)}")


def bit_equal(actual, expected):
    """True when both arrays have the same shape, dtype and bits (any NaN equals any NaN).

    Integer arrays are compared by value.
    """
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    if actual.dtype.kind in "iub":
        return bool(np.array_equal(actual, expected))
    fmt = format_of(actual.dtype)
    nan_actual = np.isnan(actual.astype(np.float32))
    nan_expected = np.isnan(expected.astype(np.float32))
    bits_actual = np.where(nan_actual, 0, actual.view(fmt.uint_dtype))
    bits_expected = np.where(nan_expected, 0, expected.view(fmt.uint_dtype))
    return bool(np.array_equal(nan_actual, nan_expected)
                and np.array_equal(bits_actual, bits_expected))


def random_floats(rng, shape, dtype, *, specials=0.1, scale=4.0):
    """Seeded random values in ``dtype``: normal-ish numbers of magnitude about 1/scale..scale,
    with a fraction ``specials`` replaced by NaN, +-Inf, +-0.0, +-subnormals and +-max."""
    fmt = format_of(dtype)
    values = rng.standard_normal(shape) * np.exp2(rng.uniform(-np.log2(scale), np.log2(scale),
                                                              shape))
    values = values.astype(np.float32).astype(fmt.dtype)
    max_bits = ((fmt.exp_max - 1) << fmt.mant_bits) | ((1 << fmt.mant_bits) - 1)
    subnormal_bits = rng.integers(1, 1 << fmt.mant_bits, 4)
    special = np.concatenate([
        [0, 1 << (fmt.width - 1), fmt.quiet_nan, fmt.exp_max << fmt.mant_bits,
         (fmt.exp_max << fmt.mant_bits) | 1 << (fmt.width - 1), max_bits,
         max_bits | 1 << (fmt.width - 1)],
        subnormal_bits, subnormal_bits | 1 << (fmt.width - 1)]).astype(fmt.uint_dtype)
    mask = rng.random(shape) < specials
    bits = np.ascontiguousarray(values).view(fmt.uint_dtype).copy()
    bits[mask] = rng.choice(special, size=int(np.count_nonzero(mask)))
    return bits.view(fmt.dtype)
