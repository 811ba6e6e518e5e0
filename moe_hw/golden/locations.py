"""Golden models of location generation and capacity (SPEC 1.2; tutel routing).

Hardware: a bank of per-expert counters that sees one (k, i) pair per cycle in k-major order.
"""

import math
from fractions import Fraction
from numbers import Real

import numpy as np

from ._common import check_count, index_array

__all__ = ["compute_locations", "expert_counts", "capacity_from_factor"]


def compute_locations(indices, *, num_experts):
    """The slot of every (k, i) pair within its expert: same shape as ``indices``.

    ``indices`` is [S] or [k, S] (an [S] array is one routing row, k = 1, and gets an [S]
    result). ``locations[k, i]`` is the number of pairs before (k, i) in k-major order that
    chose the same expert: the value of that expert's counter, which the pair then increments.
    For k = 0 it is the running per-expert count over tokens; for k >= 1 it starts from the
    per-expert totals of all earlier k.

    A pair whose index is out of range (negative or >= ``num_experts``) is not routed: it gets
    location -1 and no counter moves. Locations >= capacity are left for dispatch's mask to
    drop. The result is int32 (tutel's ``int``).
    """
    num_experts = check_count("num_experts", num_experts)
    indices = index_array("indices", indices, ndim=(1, 2), what="[S] or [k, S]")
    pairs = indices.reshape(-1)  # k-major
    locations = np.full(pairs.shape, -1, dtype=np.int32)
    for expert in range(num_experts):
        chosen = pairs == expert
        locations[chosen] = np.arange(np.count_nonzero(chosen))
    return locations.reshape(indices.shape)


def expert_counts(indices, num_experts):
    """The per-expert totals of ``indices`` ([S] or [k, S]): int64 [num_experts].

    These are the counter values after the last pair; out-of-range indices are not counted.
    """
    num_experts = check_count("num_experts", num_experts)
    indices = index_array("indices", indices, ndim=(1, 2), what="[S] or [k, S]")
    pairs = indices.reshape(-1)
    routed = pairs[(pairs >= 0) & (pairs < num_experts)].astype(np.int64)
    return np.bincount(routed, minlength=num_experts).astype(np.int64)


def capacity_from_factor(capacity_factor, S, E, k=1, alignment=1):
    """``C = k * ceil(capacity_factor * S / E)``, rounded up to a multiple of ``alignment``.

    ``capacity_factor`` is a non-negative real; a float is taken as the decimal it prints as
    (1.1 means 11/10, so 1.1 * 10 / 1 gives 11, not 12 as binary floating point would).
    """
    if isinstance(capacity_factor, (bool, np.bool_)) or not isinstance(capacity_factor, Real) \
            or not math.isfinite(capacity_factor) or capacity_factor < 0:
        raise ValueError(f"capacity_factor must be a finite non-negative number, "
                         f"not {capacity_factor!r}")
    S = check_count("S", S)
    E = check_count("E", E, minimum=1)
    k = check_count("k", k, minimum=1)
    alignment = check_count("alignment", alignment, minimum=1)
    if isinstance(capacity_factor, (float, np.floating)):
        factor = Fraction(repr(float(capacity_factor)))
    else:
        factor = Fraction(capacity_factor)
    capacity = k * math.ceil(factor * S / E)
    return -(-capacity // alignment) * alignment
