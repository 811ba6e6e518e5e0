"""Golden model of combine in gather form (SPEC 1.4)."""

import ml_dtypes
import numpy as np
import pytest

from moe_hw.golden import combine_gather, compute_locations, dispatch_forward
from moe_hw.golden.testing import bit_equal, random_floats

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]


def reference_combine(gates, indices, locations, expert_out, capacity):
    num_experts = expert_out.shape[0] // capacity
    combined = np.zeros((indices.shape[1], expert_out.shape[1]), expert_out.dtype)
    with np.errstate(all="ignore"):
        for i in range(indices.shape[1]):
            for j in range(expert_out.shape[1]):
                total = expert_out.dtype.type(0.0)
                for k in range(indices.shape[0]):
                    if 0 <= indices[k, i] < num_experts and 0 <= locations[k, i] < capacity:
                        row = indices[k, i] * capacity + locations[k, i]
                        total = total + gates[k, i] * expert_out[row, j]
                combined[i, j] = total
    return combined


def test_worked_example():
    # token 0: experts 1 (slot 0) and 0 (slot 1); token 1: expert 0 (slot 0), 2nd choice dropped
    gates = np.float32([[0.5, 2.0], [0.25, 1.0]])
    indices = np.int32([[1, 0], [0, 0]])
    locations = np.int32([[0, 0], [1, 2]])
    expert_out = np.float32([[1, 2], [3, 4],      # expert 0, slots 0 and 1
                             [5, 6], [7, 8]])     # expert 1
    combined = combine_gather(gates, indices, locations, expert_out, capacity=2)
    assert bit_equal(combined, np.float32([[0.5 * 5 + 0.25 * 3, 0.5 * 6 + 0.25 * 4],
                                           [2 * 1, 2 * 2]]))


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_matches_loop(dtype, top_k):
    rng = np.random.default_rng(top_k)
    samples, hidden, num_experts, capacity = 17, 6, 4, 3
    indices = rng.integers(-1, num_experts + 1, (top_k, samples)).astype(np.int32)
    locations = rng.integers(-1, capacity + 1, (top_k, samples)).astype(np.int64)
    gates = random_floats(rng, (top_k, samples), dtype)
    expert_out = random_floats(rng, (num_experts * capacity, hidden), dtype)
    combined = combine_gather(gates, indices, locations, expert_out, capacity=capacity)
    assert bit_equal(combined, reference_combine(gates, indices, locations, expert_out,
                                                 capacity))
    if top_k == 1:
        assert bit_equal(combine_gather(gates[0], indices[0], locations[0], expert_out,
                                        capacity=capacity), combined)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_inverts_dispatch_with_unit_gates(dtype):
    rng = np.random.default_rng(5)
    indices = rng.integers(0, 3, (2, 10))
    locations = compute_locations(indices, num_experts=3)
    input = random_floats(rng, (10, 4), dtype, specials=0.0)
    ones = np.ones((2, 10), dtype)
    expert_out = dispatch_forward(ones, indices, locations, input, num_experts=3, capacity=20)
    half = np.full((2, 10), 0.5, dtype)  # 0.5 x + 0.5 x = x exactly
    assert bit_equal(combine_gather(half, indices, locations, expert_out, capacity=20), input)


def test_signed_zero_nan_inf():
    gates = np.float16([[1.0, 1.0, 1.0], [1.0, -1.0, 1.0]])
    indices = np.int32([[0, 0, 0], [0, 0, 0]])
    locations = np.int32([[0, 1, 2], [0, 1, 2]])
    expert_out = np.float16([[-0.0], [np.inf], [np.nan]])
    combined = combine_gather(gates, indices, locations, expert_out, capacity=3)
    # +0.0 + -0.0 + -0.0 = +0.0; inf + -inf = NaN; NaN stays NaN
    assert bit_equal(combined, np.float16([[0.0], [np.nan], [np.nan]]))


def test_zero_sized():
    assert bit_equal(combine_gather(np.ones(3, np.float32), [0, 1, 2], [0, 0, 0],
                                    np.zeros((0, 4), np.float32), capacity=0),
                     np.zeros((3, 4), np.float32))
    assert combine_gather(np.ones((2, 0), np.float16), np.zeros((2, 0), np.int32),
                          np.zeros((2, 0), np.int32), np.ones((6, 4), np.float16),
                          capacity=3).shape == (0, 4)
    assert combine_gather([1.0], [0], [0], np.ones((2, 0), np.float32),
                          capacity=1).shape == (1, 0)


def test_bad_arguments():
    expert_out = np.ones((6, 2), np.float32)
    args = (np.ones(2, np.float32), [0, 1], [0, 0])
    with pytest.raises(ValueError, match=r"capacity must be a non-negative integer, not -3"):
        combine_gather(*args, expert_out, capacity=-3)
    with pytest.raises(ValueError, match=r"expert_out must have a multiple of capacity \(4\)"):
        combine_gather(*args, expert_out, capacity=4)
    with pytest.raises(ValueError, match=r"expert_out must have a multiple of capacity \(0\)"):
        combine_gather(*args, expert_out, capacity=0)
    with pytest.raises(TypeError, match=r"gates has dtype float32, but expert_out has bfloat16"):
        combine_gather(*args, expert_out.astype(ml_dtypes.bfloat16), capacity=3)
    with pytest.raises(ValueError, match=r"expert_out must have 2 dimension"):
        combine_gather(*args, np.ones(6, np.float32), capacity=3)
    with pytest.raises(ValueError, match=r"locations has shape \(1,\)"):
        combine_gather(args[0], args[1], [0], expert_out, capacity=3)
