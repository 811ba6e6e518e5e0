"""Golden model of the whole MoE layer data path (SPEC 1.8), chained from the unit goldens."""

import numpy as np

from ._common import add, check_count, float_array, mul, same_dtype
from .combine import combine_gather
from .dispatch import dispatch_dropped, dispatch_forward
from .locations import compute_locations
from .scan import affine_layer, scan_layers
from .sparse import check_gate_matrix

__all__ = ["top_k_routing", "moe_layer", "expert_stacks"]


def top_k_routing(gates):
    """``(gates_k, indices)``, both [k, S], of a top-k gate matrix [S, E].

    Every row must have the same number k of nonzero gates (negative gates are rejected).
    Token i's nonzero experts in ascending expert order are its choices k = 0, 1, ...;
    ``indices[k, i]`` is the expert (int32) and ``gates_k[k, i]`` its gate.
    """
    gates = check_gate_matrix(gates)
    routed = gates != 0
    per_row = np.count_nonzero(routed, axis=1)
    top_k = int(per_row[0]) if len(per_row) else 0
    if np.any(per_row != top_k):
        i = int(np.argmax(per_row != top_k))
        raise ValueError(f"gates must have the same number of nonzeros in every row (k), "
                         f"not {per_row[i]} in row {i} and {top_k} in row 0")
    tokens, experts = np.nonzero(routed)  # row-major: token, then ascending expert
    indices = experts.reshape(-1, top_k).T.astype(np.int32) if top_k else \
        np.zeros((0, gates.shape[0]), dtype=np.int32)
    return gates[np.arange(gates.shape[0]), indices], indices


def moe_layer(gates, input, *, capacity, scale=None, bias=None, postscore=True, relu=False):
    """The chained golden of one MoE layer: ``(output [S, H], dropped)``.

    1. :func:`top_k_routing`: the gate matrix ``gates[S, E]`` -> ``gates_k``, ``indices``
       [k, S];
    2. :func:`compute_locations` -> ``locations`` [k, S];
    3. :func:`dispatch_forward` with capacity C -> the expert buffer [E * C, H]
       (``dropped`` = :func:`dispatch_dropped`, the pairs whose location is >= C);
    4. expert e's rows become ``scale[e] * x + bias[e]`` in the data format (product rounded,
       then the sum rounded, no FMA; ``scale``/``bias`` are [E] or [E, H]; either may be None:
       no multiply / no add; both None is the identity expert); or, with ``scale`` and
       ``bias`` both [E, L, H], expert e is a scan_layers stack of its own: its rows go
       through ``scan_layers(affine_layer(relu), {"scale": scale[e], "bias": bias[e]})``,
       L layers ``relu?(a_l * x + b_l)`` (SPEC 1.7; ``relu`` applies to this form only);
    5. :func:`combine_gather` -> ``output``.

    ``postscore`` follows tutel's ``is_postscore``: True (the default) dispatches with gates of
    1.0 and weights the combine by the gates; False weights the dispatch and combines with
    gates of 1.0. ``gates``, ``input``, ``scale`` and ``bias`` share one format.
    """
    capacity = check_count("capacity", capacity)
    gates_k, indices = top_k_routing(gates)
    num_experts = np.shape(gates)[1]
    input = float_array("input", input, ndim=2, what="[S, H]")
    same_dtype("gates", gates_k, "input", input)
    if input.shape[0] != indices.shape[1]:
        raise ValueError(f"input must have {indices.shape[1]} rows (S, the rows of gates), "
                         f"not {input.shape[0]}")
    ones = np.ones_like(gates_k)
    locations = compute_locations(indices, num_experts=num_experts)
    experts = dispatch_forward(ones if postscore else gates_k, indices, locations, input,
                               num_experts=num_experts, capacity=capacity)
    dropped = dispatch_dropped(indices, locations, num_experts=num_experts, capacity=capacity)
    experts = experts.reshape(num_experts, capacity, input.shape[1])
    if np.ndim(scale) == 3 or np.ndim(bias) == 3:
        experts = expert_stacks(experts, scale, bias, relu, input)
    for name, operand, op in (("scale", scale, mul), ("bias", bias, add)):
        if operand is None or np.ndim(operand) == 3:
            continue
        operand = float_array(name, operand, ndim=(1, 2), what="[E] or [E, H]")
        same_dtype(name, operand, "input", input)
        if operand.shape not in ((num_experts,), (num_experts, input.shape[1])):
            raise ValueError(f"{name} must have shape ({num_experts},) or "
                             f"({num_experts}, {input.shape[1]}) [E] or [E, H], "
                             f"not {operand.shape}")
        operand = operand.reshape(num_experts, 1, -1)
        experts = op(experts, np.broadcast_to(operand, experts.shape))
    output = combine_gather(gates_k if postscore else ones, indices, locations,
                            experts.reshape(num_experts * capacity, input.shape[1]),
                            capacity=capacity)
    return output, dropped


def expert_stacks(experts, scale, bias, relu, input):
    """Each expert's rows [E, C, H] through its own scan_layers stack (scale, bias [E, L, H])."""
    num_experts, _, hidden = experts.shape
    if scale is None or bias is None:
        raise ValueError("an expert stack needs both scale and bias [E, L, H]")
    scale = float_array("scale", scale, ndim=3, what="[E, L, H]")
    bias = float_array("bias", bias, ndim=3, what="[E, L, H]")
    for name, operand in (("scale", scale), ("bias", bias)):
        same_dtype(name, operand, "input", input)
        if operand.shape[0] != num_experts or operand.shape[2] != hidden:
            raise ValueError(f"{name} must have shape ({num_experts}, L, {hidden}) [E, L, H], "
                             f"not {operand.shape}")
    if scale.shape != bias.shape:
        raise ValueError(f"scale and bias must have one shape [E, L, H], not {scale.shape} "
                         f"and {bias.shape}")
    if scale.shape[1] == 0:
        raise ValueError("an expert stack must have at least one layer (L = 0)")
    return np.stack([scan_layers(lambda h, p: affine_layer(h, p, relu),
                                 {"scale": scale[e], "bias": bias[e]}, experts[e])
                     for e in range(num_experts)]) if num_experts else experts
