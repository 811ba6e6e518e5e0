"""Golden model of the sparse dispatcher (SPEC 1.3; DUET ``SparseDispatcher``, seed 000).

The gate matrix ``gates[S, E]`` routes token i to expert e when ``gates[i, e]`` is nonzero (NaN
counts as nonzero; +0.0 and -0.0 do not). A *slot* is one nonzero; slots are ordered by expert
ascending and, within an expert, by token ascending (a stable counting sort by expert).
"""

import numpy as np

from ._common import add, check_length, float_array, mul, same_dtype

__all__ = ["sparse_dispatch_indices", "sparse_dispatch", "sparse_combine", "expert_to_gates"]


def check_gate_matrix(gates):
    """``gates`` as a float [S, E] array, or an error naming the first negative gate."""
    gates = float_array("gates", gates, ndim=2, what="[S, E]")
    with np.errstate(invalid="ignore"):   # bfloat16 NaN compares warn; NaN is not negative
        negative = np.argwhere(gates < 0)
    if len(negative):
        i, e = negative[0]
        raise ValueError(f"gates must be non-negative (a gate is routed when nonzero), "
                         f"not {gates[i, e]} at [{i}, {e}]")
    return gates


def sparse_dispatch_indices(gates):
    """``(batch_index, part_sizes, nonzero_gates)`` of a gate matrix [S, E].

    - ``batch_index`` (int64 [n]): the token of every slot, in slot order;
    - ``part_sizes`` (int64 [E]): the number of nonzeros in each column (0 is legal);
    - ``nonzero_gates`` ([n], the gate dtype): ``gates[batch_index[s], expert of slot s]``.
    """
    return _slots(gates)[1:]


def _slots(gates):
    gates = check_gate_matrix(gates)
    experts, batch_index = np.nonzero(gates.T)  # row-major over [E, S]: expert, then token
    part_sizes = np.bincount(experts, minlength=gates.shape[1]).astype(np.int64)
    return gates, batch_index.astype(np.int64), part_sizes, gates[batch_index, experts]


def _rows(name, array):
    if array.ndim < 1:
        raise ValueError(f"{name} must have at least 1 dimension [rows, ...], "
                         f"not shape {array.shape}")
    return array


def _split(array, part_sizes):
    return np.split(array, np.cumsum(part_sizes)[:-1])


def sparse_dispatch(gates, inp):
    """``inp[batch_index]`` split into E per-expert arrays of ``part_sizes`` rows.

    ``inp`` is [S, ...] of any dtype; it is moved, never changed.
    """
    gates, batch_index, part_sizes, _ = _slots(gates)
    inp = _rows("inp", np.asarray(inp))
    check_length("inp", inp.shape[0], gates.shape[0], "rows (S, the rows of gates)")
    return _split(inp[batch_index], part_sizes)


def expert_to_gates(gates):
    """``nonzero_gates`` split into E per-expert arrays of ``part_sizes`` entries."""
    _, part_sizes, nonzero_gates = sparse_dispatch_indices(gates)
    return _split(nonzero_gates, part_sizes)


def sparse_combine(gates, expert_out, multiply_by_gates=True):
    """Scatter-add expert outputs back to their tokens: ``[S, ...]``.

    ``expert_out`` is the list of E per-expert outputs (expert e's has ``part_sizes[e]`` rows)
    or the stitched [n, ...] array in slot order. ``out`` starts as +0.0 in the data dtype (a
    plain list becomes float32, the original's ``.float()``); then for every slot s in order,
    ``out[batch_index[s]] += nonzero_gates[s] * expert_out[s]`` (product rounded, then the sum
    rounded; without ``multiply_by_gates`` the plain ``expert_out[s]`` is added). Note that
    +0.0 + -0.0 = +0.0, so a token whose only contribution is -0.0 gets +0.0.
    """
    gates, batch_index, part_sizes, nonzero_gates = _slots(gates)
    if isinstance(expert_out, (list, tuple)):
        if len(expert_out) != len(part_sizes):
            raise ValueError(f"expert_out has {len(expert_out)} per-expert outputs, but gates "
                             f"has {len(part_sizes)} experts")
        parts = [_rows(f"expert_out[{e}]", float_array(f"expert_out[{e}]", out))
                 for e, out in enumerate(expert_out)]
        for e, part in enumerate(parts):
            check_length(f"expert_out[{e}]", part.shape[0], part_sizes[e],
                         f"rows (the nonzeros in column {e} of gates)")
            same_dtype(f"expert_out[{e}]", part, "expert_out[0]", parts[0])
            if part.shape[1:] != parts[0].shape[1:]:
                raise ValueError(f"expert_out[{e}] has rows of shape {part.shape[1:]}, but "
                                 f"expert_out[0] has {parts[0].shape[1:]}")
        stitched = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    else:
        stitched = _rows("expert_out", float_array("expert_out", expert_out))
        check_length("expert_out", stitched.shape[0], len(batch_index),
                     "rows (one per nonzero of gates)")
    if multiply_by_gates:
        same_dtype("gates", nonzero_gates, "expert_out", stitched)
    out = np.zeros((gates.shape[0],) + stitched.shape[1:], dtype=stitched.dtype)
    for s, token in enumerate(batch_index):
        term = mul(stitched[s], nonzero_gates[s]) if multiply_by_gates else stitched[s]
        out[token] = add(out[token], term)
    return out
