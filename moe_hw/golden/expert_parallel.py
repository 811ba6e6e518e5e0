"""Golden model of the expert-parallel path (SPEC 1.8, "across devices"): per-rank location
generation (1.2) and dispatch (1.1), the all-to-all exchange of the dispatch buffers, and
per-rank re-routing (1.5), composed from the unit goldens."""

import numpy as np

from ._common import check_choice, check_count, float_array, index_array, same_dtype
from .dispatch import dispatch_dropped, dispatch_forward
from .locations import compute_locations, expert_counts
from .rerouting import moe_re_routing

__all__ = ["ep_dispatch", "check_ep_inputs", "experts_per_rank", "sent_counts"]


def experts_per_rank(num_experts, num_ranks):
    """E_local = E / N, the experts each rank holds; E must be a multiple of N."""
    num_experts = check_count("num_experts", num_experts)
    num_ranks = check_count("num_ranks", num_ranks, minimum=1)
    if num_experts % num_ranks:
        raise ValueError(f"num_experts must be a multiple of the number of ranks N = "
                         f"{num_ranks} (the experts are split evenly over the ranks), "
                         f"not {num_experts}")
    return num_experts // num_ranks


def check_ep_inputs(gates, indices, input, *, num_experts):
    """``(gates, indices, input, num_experts)`` of an expert-parallel problem, or a ValueError
    (TypeError for a wrong dtype) naming the argument and the value. The host checks a
    user's tensors with this too."""
    indices = index_array("indices", indices, ndim=3, what="[N, k, S]")
    gates = float_array("gates", gates, ndim=3, what="[N, k, S]")
    input = float_array("input", input, ndim=3, what="[N, S, H]")
    num_ranks, _, tokens = indices.shape
    if num_ranks < 1:
        raise ValueError("indices must hold at least one rank (N >= 1), not 0")
    if gates.shape != indices.shape:
        raise ValueError(f"gates has shape {gates.shape}, but indices has shape "
                         f"{indices.shape}; they must match ([N, k, S])")
    if input.shape[:2] != (num_ranks, tokens):
        raise ValueError(f"input must have shape ({num_ranks}, {tokens}, H) [N, S, H] (N and S "
                         f"from indices), not {input.shape}")
    if input.shape[2] < 1:
        raise ValueError(f"input must have H >= 1 elements per token, not {input.shape[2]}")
    same_dtype("gates", gates, "input", input)
    experts_per_rank(num_experts, num_ranks)
    return gates, indices, input, int(num_experts)


def sent_counts(indices, *, num_experts, capacity):
    """n(r, e) = min(count, C) [N, E] (int64): the rows rank r sends for global expert e, the
    filled slots 0 .. n(r, e) - 1 of that expert in rank r's dispatch buffer (1.2 numbers an
    expert's pairs 0, 1, 2, ... in k-major order, and 1.1 keeps those below C)."""
    return np.stack([np.minimum(expert_counts(rank, num_experts), capacity)
                     for rank in index_array("indices", indices, ndim=3, what="[N, k, S]")])


def ep_dispatch(gates, indices, input, *, num_experts, capacity, expert_token_num_type=1,
                idx_type=0):
    """The expert-parallel path over N ranks: a dict of NumPy arrays.

    Arguments: ``gates`` and ``indices`` [N, k, S] (rank r's top-k choices, k-major as in 1.1,
    among the E = ``num_experts`` global experts), ``input`` [N, S, H] (rank r's S tokens;
    float32, float16 or bfloat16, the format of ``gates``; H >= 1); ``capacity`` C, the slots
    per expert in every rank's dispatch buffer; ``expert_token_num_type`` and ``idx_type`` as
    in 1.5. The experts are split evenly over the ranks: E must be a multiple of N (else a
    ValueError naming ``num_experts``), and rank q holds the E_local = E / N experts
    ``q*E_local .. (q+1)*E_local - 1``; its local expert l is global expert
    ``e = q*E_local + l``.

    1. Every rank r: ``locations[r] = compute_locations(indices[r], num_experts=E)`` (1.2).
    2. Every rank r: ``dispatch[r] = dispatch_forward(gates[r], indices[r], locations[r],
       input[r], num_experts=E, capacity=C)`` [E*C, H] (1.1); ``dropped[r]`` its pairs past
       capacity or out of range (``dispatch_dropped``).
    3. The all-to-all. ``n(r, e) = min(expert_counts(indices[r])[e], C)``: expert e's filled
       slots in rank r's buffer are exactly its slots 0 .. n(r, e) - 1. Rank r sends rank q,
       for each local expert l of q (``e = q*E_local + l``), the rows
       ``dispatch[r][e*C : e*C + n(r, e)]``, in slot order; nothing else is sent (no empty
       slot, no dropped pair). Rank q receives them as Ascend ``MoeReRouting`` takes its
       input: rank-major, for r = 0..N-1, for l = 0..E_local-1, the block of n(r, e) rows,
       A_q rows in all, with the count matrix ``expert_token_num_per_rank[q][r, l] =
       n(r, q*E_local + l)`` [N, E_local].
    4. Every rank q: ``moe_re_routing(received_q, expert_token_num_per_rank[q],
       expert_token_num_type=..., idx_type=...)`` (1.5): its tokens expert-major, and within
       an expert in source-rank order.

    Returns (the per-rank token arrays of steps 3 and 4 are the ranks' arrays one after
    another, rank 0 first: rank q's rows start at ``received_per_rank[:q].sum()``):

    - ``locations`` [N, k, S] int32, ``dispatch`` [N, E*C, H], ``dropped`` [N] int64;
    - ``expert_token_num_per_rank`` [N, N, E_local] int64: [q] is rank q's count matrix;
    - ``received_per_rank`` [N] int64: A_q, the rows rank q receives;
    - ``received_tokens`` [sum of A_q, H]: every rank's all-to-all receive buffer;
    - ``permute_tokens`` [sum of A_q, H], ``permute_token_idx`` [sum of A_q] int32 (rank q's
      indices count rows of rank q's own buffer, 0 .. A_q - 1), ``expert_token_num`` [N,
      E_local] int64: the re-routing outputs of every rank.
    """
    gates, indices, input, num_experts = check_ep_inputs(gates, indices, input,
                                                         num_experts=num_experts)
    capacity = check_count("capacity", capacity)
    expert_token_num_type = check_choice("expert_token_num_type", expert_token_num_type, (0, 1))
    idx_type = check_choice("idx_type", idx_type, (0, 1))
    num_ranks, hidden = indices.shape[0], input.shape[2]
    local = experts_per_rank(num_experts, num_ranks)
    sizes = {"num_experts": num_experts, "capacity": capacity}

    # 1, 2: every rank routes and dispatches its own tokens.
    locations = np.stack([compute_locations(indices[r], num_experts=num_experts)
                          for r in range(num_ranks)])
    dispatch = np.stack([dispatch_forward(gates[r], indices[r], locations[r], input[r], **sizes)
                         for r in range(num_ranks)])
    dropped = np.array([dispatch_dropped(indices[r], locations[r], **sizes)
                        for r in range(num_ranks)], dtype=np.int64)

    # 3: the all-to-all; rank q's count matrix is column block q of n.
    sent = sent_counts(indices, **sizes)                          # [N (from), E]
    counts = sent.reshape(num_ranks, num_ranks, local).transpose(1, 0, 2)   # [q, r, l]
    received = []
    for q in range(num_ranks):
        blocks = [dispatch[r][e * capacity: e * capacity + sent[r, e]]
                  for r in range(num_ranks) for e in range(q * local, (q + 1) * local)]
        received.append(np.concatenate(blocks) if blocks else
                        np.zeros((0, hidden), dtype=input.dtype))

    # 4: every rank re-routes what it received.
    rerouted = [moe_re_routing(received[q], counts[q], idx_type=idx_type,
                               expert_token_num_type=expert_token_num_type)
                for q in range(num_ranks)]
    return {
        "locations": locations,
        "dispatch": dispatch,
        "dropped": dropped,
        "expert_token_num_per_rank": np.ascontiguousarray(counts, dtype=np.int64),
        "received_per_rank": np.array([len(rows) for rows in received], dtype=np.int64),
        "received_tokens": np.concatenate(received),
        "permute_tokens": np.concatenate([out[0] for out in rerouted]),
        "permute_token_idx": np.concatenate([out[2] for out in rerouted]).astype(np.int32),
        "expert_token_num": np.stack([out[3] for out in rerouted]).astype(np.int64),
    }
