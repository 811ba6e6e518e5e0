"""Helpers for checking hardware and models against the goldens (SPEC 1 and 3).

- :func:`bit_equal` is SPEC 1's comparison rule: floats match bit for bit, except that any NaN
  equals any NaN (+0.0 and -0.0 differ);
- :func:`random_floats` draws seeded test values in a format, mixing ordinary numbers with
  the special ones SPEC 3 asks for (NaN, +-Inf, subnormals, +-0.0).
"""

import numpy as np

from ..formats import bits_equal, to_bits
from ..formats import format_of_dtype as format_of

__all__ = ["bit_equal", "format_of", "random_floats"]


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
    return bool(bits_equal(to_bits(actual, fmt), to_bits(expected, fmt), fmt).all())


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
