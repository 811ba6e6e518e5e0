"""Golden model of re-routing after all-to-all (SPEC 1.5; Ascend ``MoeReRouting``, seed 004).

Tokens arrive rank-major (rank r = 0..N-1, then expert e = 0..E-1, a block of n(r, e) tokens)
and leave expert-major, rank-ascending within an expert. Nothing is computed on a token: it is
moved bit for bit, so any dtype works (Ascend: float16, bfloat16, int8).
"""

import numpy as np

from ._common import check_choice, index_array

__all__ = ["moe_re_routing", "check_re_routing_inputs"]


def check_re_routing_inputs(tokens, expert_token_num_per_rank, per_token_scales=None):
    """``(tokens, counts as int64, per_token_scales)`` of a re-routing problem, or a ValueError
    (TypeError for a non-integer count dtype) that names the argument, the value and, for a
    count, its rank and expert. The host checks a user's tensors with this too."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have 2 dimensions [A, H], not {tokens.ndim} "
                         f"(shape {tokens.shape})")
    num_tokens, hidden = tokens.shape
    if num_tokens and hidden < 1:
        raise ValueError(f"tokens must have H >= 1 elements per token, not {hidden}")
    counts = index_array("expert_token_num_per_rank", expert_token_num_per_rank, ndim=2,
                         what="[N, E]")
    negative = np.argwhere(counts < 0)
    if negative.size:
        r, e = negative[0]
        raise ValueError(f"expert_token_num_per_rank[{r}, {e}] = {counts[r, e]} (rank {r}, "
                         f"expert {e}) is negative")
    # Python integers: a uint64 matrix's sum must not wrap.
    flat = counts.reshape(-1).astype(object)
    total = int(sum(flat))
    ends = np.cumsum(flat) if flat.size else np.zeros(0, object)
    past = np.flatnonzero(ends > num_tokens)
    if past.size:
        r, e = divmod(int(past[0]), counts.shape[1])
        raise ValueError(f"expert_token_num_per_rank sums to {total}, not A = {num_tokens} "
                         f"(the rows of tokens): the block of rank {r}, expert {e} "
                         f"({counts[r, e]} tokens) ends at row {ends[past[0]]}, past A")
    if total != num_tokens:
        where = ""
        if counts.size:
            r, e = counts.shape[0] - 1, counts.shape[1] - 1
            where = (f"; the last block (rank {r}, expert {e}) ends at row {total}, "
                     f"{num_tokens - total} short")
        raise ValueError(f"expert_token_num_per_rank sums to {total}, not A = {num_tokens} "
                         f"(the rows of tokens){where}")
    if per_token_scales is not None:
        per_token_scales = np.asarray(per_token_scales)
        if per_token_scales.shape != (num_tokens,):
            raise ValueError(f"per_token_scales must have shape ({num_tokens},) [A], "
                             f"not {per_token_scales.shape}")
    return tokens, counts.astype(np.int64), per_token_scales


def moe_re_routing(tokens, expert_token_num_per_rank, *, per_token_scales=None,
                   expert_token_num_type=1, idx_type=0):
    """Reorder ``tokens[A, H]`` from rank-major to expert-major.

    Returns ``(permute_tokens, permute_per_token_scales, permute_token_idx,
    expert_token_num)``:

    - ``permute_tokens`` [A, H] (the dtype of ``tokens``) and ``permute_per_token_scales`` [A]
      (None when ``per_token_scales`` is None): block (r, e) of the input, n(r, e) tokens
      starting at ``src = sum of n over the blocks before (r, e) in rank-major order``, goes to
      ``dst = sum over e' < e of (sum over r of n(r, e')) + sum over r' < r of n(r', e)``;
    - ``permute_token_idx`` (int32 [A]): idx_type 0 (gather) ``idx[dst + t] = src + t``;
      idx_type 1 (scatter) ``idx[src + t] = dst + t``;
    - ``expert_token_num`` (int64 [E]): expert_token_num_type 1 (count) the per-expert totals
      ``sum over r of n(r, e)``; type 0 (cumsum) their inclusive prefix sum over e.

    ``expert_token_num_per_rank`` is an integer [N, E] array of non-negative counts summing to
    A. H may be any size >= 1 (Ascend limits it to 1..16383; we do not); with A = 0 any H,
    including 0, is accepted.
    """
    tokens, counts, per_token_scales = check_re_routing_inputs(
        tokens, expert_token_num_per_rank, per_token_scales)
    num_tokens = tokens.shape[0]
    expert_token_num_type = check_choice("expert_token_num_type", expert_token_num_type, (0, 1))
    idx_type = check_choice("idx_type", idx_type, (0, 1))

    expert_totals = counts.sum(axis=0)
    dst_base = np.concatenate([[0], np.cumsum(expert_totals)[:-1]]).astype(np.int64)
    permute_tokens = np.zeros_like(tokens)
    permute_token_idx = np.zeros(num_tokens, dtype=np.int32)
    permute_scales = None if per_token_scales is None else np.zeros_like(per_token_scales)
    src = 0
    for r, e in np.ndindex(counts.shape):  # rank-major, as the tokens arrive
        n, dst = counts[r, e], dst_base[e]
        permute_tokens[dst:dst + n] = tokens[src:src + n]
        if permute_scales is not None:
            permute_scales[dst:dst + n] = per_token_scales[src:src + n]
        if idx_type == 0:
            permute_token_idx[dst:dst + n] = np.arange(src, src + n)
        else:
            permute_token_idx[src:src + n] = np.arange(dst, dst + n)
        src += n
        dst_base[e] += n
    expert_token_num = expert_totals if expert_token_num_type == 1 else np.cumsum(expert_totals)
    return permute_tokens, permute_scales, permute_token_idx, expert_token_num.astype(np.int64)
