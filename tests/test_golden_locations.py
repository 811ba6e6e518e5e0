"""Golden models of location generation and capacity (SPEC 1.2)."""

from fractions import Fraction

import numpy as np
import pytest

from moe_hw.golden import capacity_from_factor, compute_locations, expert_counts


def reference_locations(indices, num_experts):
    """One (k, i) pair per step in k-major order, a bank of per-expert counters."""
    counters = [0] * num_experts
    locations = np.full(indices.shape, -1, dtype=np.int32)
    for k, i in np.ndindex(indices.shape):
        expert = indices[k, i]
        if 0 <= expert < num_experts:
            locations[k, i] = counters[expert]
            counters[expert] += 1
    return locations, counters


def test_worked_example():
    indices = np.int32([[0, 1, 0, 2],
                        [1, 0, 2, 2]])
    # k = 0 counts per expert over tokens; k = 1 starts from the k = 0 totals (2, 1, 1).
    expected = np.int32([[0, 0, 1, 0],
                         [1, 2, 1, 2]])
    locations = compute_locations(indices, num_experts=3)
    assert locations.dtype == np.int32
    assert np.array_equal(locations, expected)
    assert np.array_equal(expert_counts(indices, 3), [3, 2, 3])


def test_single_row_keeps_its_shape():
    locations = compute_locations([2, 2, 0, 2], num_experts=3)
    assert locations.shape == (4,)
    assert np.array_equal(locations, [0, 1, 0, 2])


def test_out_of_range_index_is_not_routed():
    indices = np.int64([[0, -1, 3, 0], [7, 0, -5, 1]])
    locations = compute_locations(indices, num_experts=2)
    assert np.array_equal(locations, [[0, -1, -1, 1], [-1, 2, -1, 0]])
    assert np.array_equal(expert_counts(indices, num_experts=2), [3, 1])


@pytest.mark.parametrize("top_k", [1, 2, 4])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64, np.uint8])
def test_matches_counter_loop(top_k, index_dtype):
    rng = np.random.default_rng(top_k)
    num_experts = 5
    indices = rng.integers(0, num_experts + 2, (top_k, 40)).astype(index_dtype)
    expected, counters = reference_locations(indices, num_experts)
    assert np.array_equal(compute_locations(indices, num_experts=num_experts), expected)
    counts = expert_counts(indices, num_experts)
    assert counts.dtype == np.int64 and np.array_equal(counts, counters)


def test_zero_sized():
    assert compute_locations(np.zeros((2, 0), np.int32), num_experts=4).shape == (2, 0)
    assert compute_locations([], num_experts=4).shape == (0,)
    assert np.array_equal(compute_locations([0, 1], num_experts=0), [-1, -1])
    assert expert_counts([], 3).tolist() == [0, 0, 0]
    assert expert_counts([0, 1], 0).shape == (0,)


@pytest.mark.parametrize("args, capacity", [
    ((1.0, 8, 2), 4),
    ((1.0, 8, 2, 2), 8),
    ((1.25, 10, 4), 4),             # ceil(3.125)
    ((1.25, 10, 4, 2), 8),
    ((1.25, 10, 4, 1, 8), 8),      # aligned up
    ((2.0, 18432, 2, 1, 8192), 24576),
    ((1.1, 10, 1), 11),             # 1.1 is read as 11/10, not as its binary value
    ((Fraction(1, 3), 9, 1), 3),
    ((0, 100, 4), 0),
    ((1, 0, 4), 0),
    ((3, 5, 2), 8),                 # an integer factor: ceil(15 / 2)
])
def test_capacity_from_factor(args, capacity):
    assert capacity_from_factor(*args) == capacity


def test_capacity_keywords():
    assert capacity_from_factor(capacity_factor=1.5, S=7, E=2, k=2, alignment=4) == 12


@pytest.mark.parametrize("call, error, match", [
    (lambda: compute_locations([0], num_experts=-2), ValueError,
     r"num_experts must be a non-negative integer, not -2"),
    (lambda: compute_locations([0.0, 1.0], num_experts=2), TypeError,
     r"indices must have an integer dtype, not float64"),
    (lambda: compute_locations(np.zeros((1, 1, 1), int), num_experts=2), ValueError,
     r"indices must have 1 or 2 dimension"),
    (lambda: expert_counts([0], -1), ValueError, r"num_experts must be"),
    (lambda: capacity_from_factor(-1.0, 8, 2), ValueError,
     r"capacity_factor must be a finite non-negative number, not -1.0"),
    (lambda: capacity_from_factor(float("nan"), 8, 2), ValueError, r"capacity_factor"),
    (lambda: capacity_from_factor("1", 8, 2), ValueError, r"capacity_factor"),
    (lambda: capacity_from_factor(1.0, -8, 2), ValueError, r"S must be a non-negative"),
    (lambda: capacity_from_factor(1.0, 8, 0), ValueError, r"E must be a positive integer, not 0"),
    (lambda: capacity_from_factor(1.0, 8, 2, k=0), ValueError, r"k must be a positive"),
    (lambda: capacity_from_factor(1.0, 8, 2, alignment=0), ValueError, r"alignment must be"),
    (lambda: capacity_from_factor(1.0, 8.0, 2), TypeError, r"S must be"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()
