"""Golden model of re-routing after all-to-all (SPEC 1.5, seed 004)."""

import ml_dtypes
import numpy as np
import pytest

from moe_hw.golden import moe_re_routing
from moe_hw.golden.testing import bit_equal, random_floats

# N = 2 ranks, E = 3 experts. Tokens arrive rank-major:
#   rank 0: expert 0 <- t0; expert 1 <- none; expert 2 <- t1, t2
#   rank 1: expert 0 <- t3, t4; expert 1 <- t5; expert 2 <- none
# and leave expert-major, rank-ascending within an expert:
#   expert 0: t0 (rank 0), t3, t4 (rank 1); expert 1: t5; expert 2: t1, t2
COUNTS = np.int32([[1, 0, 2],
                   [2, 1, 0]])
GATHER = [0, 3, 4, 5, 1, 2]   # permute_token_idx[dst] = src
SCATTER = [0, 4, 5, 1, 2, 3]  # permute_token_idx[src] = dst


def test_worked_example():
    tokens = np.arange(6 * 2, dtype=np.int8).reshape(6, 2)  # t = [2t, 2t+1]
    scales = np.float32([0.5, 1.5, 2.5, 3.5, 4.5, 5.5])
    permuted, permuted_scales, idx, counts = moe_re_routing(tokens, COUNTS,
                                                            per_token_scales=scales)
    assert np.array_equal(permuted, np.int8([[0, 1], [6, 7], [8, 9], [10, 11], [2, 3], [4, 5]]))
    assert permuted.dtype == np.int8
    assert bit_equal(permuted_scales, np.float32([0.5, 3.5, 4.5, 5.5, 1.5, 2.5]))
    assert idx.dtype == np.int32 and idx.tolist() == GATHER
    assert counts.dtype == np.int64 and counts.tolist() == [3, 1, 2]

    _, none, idx, cumsum = moe_re_routing(tokens, COUNTS, expert_token_num_type=0, idx_type=1)
    assert none is None
    assert idx.tolist() == SCATTER
    assert cumsum.tolist() == [3, 4, 6]


def reference(tokens, counts):
    """Independent form: sort the source tokens by (expert, rank), stably."""
    ranks, experts = np.indices(counts.shape)
    source_rank = np.repeat(ranks.reshape(-1), counts.reshape(-1))
    source_expert = np.repeat(experts.reshape(-1), counts.reshape(-1))
    gather = np.lexsort((source_rank, source_expert))  # expert first, then rank, then position
    return tokens[gather], gather


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.int8])
@pytest.mark.parametrize("ranks, experts", [(4, 3), (1, 1), (3, 8), (16, 16)])
def test_matches_sort(dtype, ranks, experts):
    rng = np.random.default_rng(ranks * experts)
    counts = rng.integers(0, 4, (ranks, experts)) * (rng.random((ranks, experts)) < 0.7)
    num_tokens = int(counts.sum())
    if dtype == np.int8:
        tokens = rng.integers(-128, 128, (num_tokens, 5)).astype(np.int8)
    else:
        tokens = random_floats(rng, (num_tokens, 5), dtype, specials=0.3)
    scales = random_floats(rng, num_tokens, np.float32)
    expected_tokens, gather = reference(tokens, counts)
    for index_dtype in (np.int32, np.int64):
        permuted, permuted_scales, idx, expert_num = moe_re_routing(
            tokens, counts.astype(index_dtype), per_token_scales=scales)
        assert bit_equal(permuted, expected_tokens)  # moved bit for bit, NaN payloads too
        assert np.array_equal(permuted.view(np.uint8), expected_tokens.view(np.uint8))
        assert bit_equal(permuted_scales, scales[gather])
        assert np.array_equal(idx, gather)
        assert np.array_equal(expert_num, counts.sum(axis=0))
    _, _, scatter, cumsum = moe_re_routing(tokens, counts, idx_type=1, expert_token_num_type=0)
    assert np.array_equal(scatter[gather], np.arange(num_tokens))  # the inverse permutation
    assert np.array_equal(cumsum, np.cumsum(counts.sum(axis=0)))


def test_zero_sized():
    permuted, scales, idx, counts = moe_re_routing(np.zeros((0, 0), np.float16),
                                                   np.zeros((2, 3), np.int32),
                                                   per_token_scales=np.zeros(0, np.float32))
    assert permuted.shape == (0, 0) and scales.shape == (0,) and idx.shape == (0,)
    assert counts.tolist() == [0, 0, 0]
    _, _, _, counts = moe_re_routing(np.zeros((0, 7), np.int8), np.zeros((0, 4), np.int64))
    assert counts.tolist() == [0, 0, 0, 0]


def test_wide_tokens():
    """Our H limit is only H >= 1; Ascend's 16383 does not apply."""
    tokens = np.ones((2, 16384), ml_dtypes.bfloat16)
    assert moe_re_routing(tokens, [[1, 1]])[0].shape == (2, 16384)


@pytest.mark.parametrize("tokens, counts, kwargs, error, match", [
    (np.ones((3, 2), np.float16), [[1, 1]], {}, ValueError,
     r"expert_token_num_per_rank sums to 2, not A = 3 .*\(rank 0, expert 1\) ends at row 2, "
     r"1 short"),
    (np.ones((1, 2), np.float16), [[2, -1]], {}, ValueError,
     r"expert_token_num_per_rank\[0, 1\] = -1 \(rank 0, expert 1\) is negative"),
    (np.ones((1, 2), np.float16), [1], {}, ValueError,
     r"expert_token_num_per_rank must have 2 dimension"),
    (np.ones((1, 2), np.float16), [[1.0]], {}, TypeError,
     r"expert_token_num_per_rank must have an integer dtype"),
    (np.ones(2, np.float16), [[2]], {}, ValueError, r"tokens must have 2 dimensions"),
    (np.ones((2, 0), np.float16), [[2]], {}, ValueError,
     r"tokens must have H >= 1 elements per token, not 0"),
    (np.ones((2, 1), np.float16), [[2]], dict(per_token_scales=np.ones(3, np.float32)),
     ValueError, r"per_token_scales must have shape \(2,\)"),
    (np.ones((2, 1), np.float16), [[2]], dict(idx_type=2), ValueError,
     r"idx_type must be one of 0, 1, not 2"),
    (np.ones((2, 1), np.float16), [[2]], dict(expert_token_num_type=-1), ValueError,
     r"expert_token_num_type must be one of 0, 1, not -1"),
])
def test_bad_arguments(tokens, counts, kwargs, error, match):
    with pytest.raises(error, match=match):
        moe_re_routing(tokens, counts, **kwargs)
