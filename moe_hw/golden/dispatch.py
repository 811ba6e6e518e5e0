"""Golden models of dispatch forward and backward (SPEC 1.1; tutel / MLU-OPS, seed 001).

Routing arrays ``gates``, ``indices``, ``locations`` have shape [S] or [k, S]; a [k, S] problem
is the same loop over every (k, i) pair in k-major order (all tokens of k = 0, then k = 1, ...).
A pair is *valid* when ``0 <= index < num_experts and 0 <= location < capacity``; its expert
buffer row is ``index * capacity + location``. Invalid pairs are dropped: nothing is written or
read for them.
"""

import numpy as np

from ._common import (add, check_count, check_length, float_array, mul, routing_arrays,
                      same_dtype, slot_rows)

__all__ = ["dispatch_forward", "dispatch_dropped", "dispatch_backward_data",
           "dispatch_backward_gate"]


def _routing(num_experts, capacity, indices, locations, gates=None):
    num_experts = check_count("num_experts", num_experts)
    capacity = check_count("capacity", capacity)
    indices, locations, gates = routing_arrays(indices, locations, gates)
    return num_experts, capacity, indices, locations, gates


def _tokens(name, data, num_tokens):
    data = float_array(name, data, ndim=2, what="[S, H]")
    check_length(name, data.shape[0], num_tokens, "rows (S, the length of indices)")
    return data


def _grad_dispatch(grad_dispatch, num_experts, capacity, ref_name, ref, hidden=None):
    grad_dispatch = float_array("grad_dispatch", grad_dispatch, ndim=2, what="[E*C, H]")
    expected = (num_experts * capacity, grad_dispatch.shape[1] if hidden is None else hidden)
    if grad_dispatch.shape != expected:
        raise ValueError(f"grad_dispatch must have shape {expected} "
                         f"(num_experts * capacity, H), not {grad_dispatch.shape}")
    same_dtype("grad_dispatch", grad_dispatch, ref_name, ref)
    return grad_dispatch


def dispatch_forward(gates, indices, locations, input, *, num_experts, capacity):
    """Scatter gated tokens into the expert buffer.

    ``dispatch`` ([num_experts * capacity, H], the dtype of ``input``) starts as +0.0; then for
    every (k, i) pair in k-major order, if valid,
    ``dispatch[index * capacity + location, :] = gates[k, i] * input[i, :]`` (each product
    rounded once to the format). A later pair overwrites an earlier one that shares its slot.
    ``gates`` and ``input`` must share a format; any S, H, E or C may be 0.
    """
    num_experts, capacity, indices, locations, gates = _routing(
        num_experts, capacity, indices, locations, gates)
    input = _tokens("input", input, indices.shape[1])
    same_dtype("gates", gates, "input", input)
    dispatch = np.zeros((num_experts * capacity, input.shape[1]), dtype=input.dtype)
    rows = slot_rows(indices, locations, num_experts, capacity)
    for k, i in zip(*np.nonzero(rows >= 0)):  # np.nonzero walks (k, i) in k-major order
        dispatch[rows[k, i]] = mul(gates[k, i], input[i])
    return dispatch


def dispatch_dropped(indices, locations, *, num_experts, capacity):
    """The number of (k, i) pairs that fail the mask (the hardware's dropped-token counter)."""
    num_experts, capacity, indices, locations, _ = _routing(
        num_experts, capacity, indices, locations)
    return int(np.count_nonzero(slot_rows(indices, locations, num_experts, capacity) < 0))


def dispatch_backward_data(gates, indices, locations, grad_dispatch, *, num_experts, capacity):
    """Gradient of dispatch with respect to ``input``: [S, H].

    For one routing row (``indices`` of shape [S]):
    ``grad_input[i, :] = gates[i] * grad_dispatch[index * capacity + location, :]`` for a valid
    pair, +0.0 otherwise. For [k, S], the per-k terms (each computed as above) are added in k
    order, ``term_0 + term_1 + ...`` with no leading +0.0, so k = 1 gives exactly the [S]
    result (a -0.0 product stays -0.0).
    """
    num_experts, capacity, indices, locations, gates = _routing(
        num_experts, capacity, indices, locations, gates)
    grad_dispatch = _grad_dispatch(grad_dispatch, num_experts, capacity, "gates", gates)
    rows = slot_rows(indices, locations, num_experts, capacity)
    hidden = grad_dispatch.shape[1]
    grad_input = np.zeros((rows.shape[1], hidden), dtype=gates.dtype)
    for k in range(rows.shape[0]):
        term = np.zeros((rows.shape[1], hidden), dtype=gates.dtype)
        valid = rows[k] >= 0
        term[valid] = mul(gates[k, valid, None], grad_dispatch[rows[k, valid]])
        grad_input = term if k == 0 else add(grad_input, term)
    return grad_input


def dispatch_backward_gate(input, indices, locations, grad_dispatch, *, num_experts, capacity,
                           lanes=1):
    """Gradient of dispatch with respect to ``gates``: the shape of ``indices``.

    ``grad_gates[k, i] = sum_j input[i, j] * grad_dispatch[index * capacity + location, j]``
    for a valid pair, +0.0 for an invalid one, in the format of ``input``. The sum follows the
    hardware's reduction order exactly (``lanes`` elements per beat, a power of two 1..16):

    1. each product is rounded to the format;
    2. element j goes to lane partial ``j % lanes``; every partial starts at +0.0 and adds its
       elements in ascending j, rounding after each addition;
    3. the ``lanes`` partials are reduced by a fixed pairwise tree: while more than one
       remains, ``p[m] = p[2m] + p[2m + 1]``.

    With lanes = 1 this is the plain left-to-right sum from +0.0.
    """
    lanes = check_count("lanes", lanes, minimum=1)
    if lanes > 16 or lanes & (lanes - 1):
        raise ValueError(f"lanes must be a power of two from 1 to 16, not {lanes}")
    shape = np.shape(indices)
    num_experts, capacity, indices, locations, _ = _routing(
        num_experts, capacity, indices, locations)
    input = _tokens("input", input, indices.shape[1])
    grad_dispatch = _grad_dispatch(grad_dispatch, num_experts, capacity, "input", input,
                                   hidden=input.shape[1])
    rows = slot_rows(indices, locations, num_experts, capacity)
    pair_k, pair_i = np.nonzero(rows >= 0)
    products = mul(input[pair_i], grad_dispatch[rows[pair_k, pair_i]])  # [pairs, H]
    partials = np.zeros((len(pair_i), lanes), dtype=input.dtype)
    for j in range(input.shape[1]):
        partials[:, j % lanes] = add(partials[:, j % lanes], products[:, j])
    while partials.shape[1] > 1:
        partials = add(partials[:, 0::2], partials[:, 1::2])
    grad_gates = np.zeros(rows.shape, dtype=input.dtype)
    grad_gates[pair_k, pair_i] = partials[:, 0]
    return grad_gates.reshape(shape)
