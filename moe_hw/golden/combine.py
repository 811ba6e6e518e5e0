"""Golden model of combine in gather form (SPEC 1.4; tutel decode)."""

import numpy as np

from ._common import add, check_count, float_array, mul, routing_arrays, same_dtype, slot_rows

__all__ = ["combine_gather"]


def combine_gather(gates, indices, locations, expert_out, *, capacity):
    """Gather every token's expert outputs and sum them, weighted by its gates: [S, H].

    ``expert_out`` is the expert buffer [E * capacity, H] (E = its rows // capacity; 0 when
    capacity is 0). ``gates``, ``indices``, ``locations`` are [S] or [k, S].
    ``combined[i, :]`` starts as +0.0 in the data format; then for k = 0, 1, ... in order, if
    the pair (k, i) is valid (``0 <= index < E and 0 <= location < capacity``),
    ``combined[i, :] += gates[k, i] * expert_out[index * capacity + location, :]`` (product
    rounded, then the sum rounded). Invalid pairs contribute nothing; +0.0 + -0.0 = +0.0.
    """
    capacity = check_count("capacity", capacity)
    indices, locations, gates = routing_arrays(indices, locations, gates)
    expert_out = float_array("expert_out", expert_out, ndim=2, what="[E*C, H]")
    same_dtype("gates", gates, "expert_out", expert_out)
    rows = expert_out.shape[0]
    if (capacity == 0 and rows) or (capacity and rows % capacity):
        raise ValueError(f"expert_out must have a multiple of capacity ({capacity}) rows "
                         f"[E*C, H], not {rows}")
    num_experts = rows // capacity if capacity else 0
    slots = slot_rows(indices, locations, num_experts, capacity)
    combined = np.zeros((slots.shape[1], expert_out.shape[1]), dtype=expert_out.dtype)
    for k in range(slots.shape[0]):
        valid = slots[k] >= 0
        combined[valid] = add(combined[valid],
                              mul(gates[k, valid, None], expert_out[slots[k, valid]]))
    return combined
