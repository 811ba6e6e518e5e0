"""Golden models of dispatch forward / backward (SPEC 1.1)."""

import math

import ml_dtypes
import numpy as np
import pytest

from moe_hw.golden import (dispatch_backward_data, dispatch_backward_gate, dispatch_dropped,
                           dispatch_forward)
from moe_hw.golden.testing import bit_equal, random_floats

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]


def random_routing(rng, top_k, samples, num_experts, capacity):
    """Indices and locations with some out-of-range values on both sides."""
    indices = rng.integers(-1, num_experts + 2, (top_k, samples)).astype(np.int32)
    locations = rng.integers(-1, capacity + 2, (top_k, samples)).astype(np.int32)
    return indices, locations


def reference_forward(gates, indices, locations, input, num_experts, capacity):
    """SPEC 1.1's loop, literally: flat addresses, one element at a time."""
    samples, hidden = input.shape
    dispatch = np.zeros(num_experts * capacity * hidden, dtype=input.dtype)
    with np.errstate(all="ignore"):
        for k in range(indices.shape[0]):
            for i in range(samples):
                if 0 <= indices[k, i] < num_experts and 0 <= locations[k, i] < capacity:
                    slot = int(indices[k, i]) * capacity + int(locations[k, i])
                    for j in range(hidden):
                        dispatch[slot * hidden + j] = gates[k, i] * input[i, j]
    return dispatch.reshape(num_experts * capacity, hidden)


def test_forward_worked_example():
    gates = np.float32([0.5, 2.0, -1.0, 3.0, 4.0])
    indices = np.int32([1, 0, 1, 7, 1])
    locations = np.int32([0, 1, 0, 0, 2])  # token 2 overwrites token 0; 3 and 4 are dropped
    input = np.float32([[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]])
    dispatch = dispatch_forward(gates, indices, locations, input, num_experts=2, capacity=2)
    expected = np.float32([[0, 0], [6, 8], [-5, -6], [0, 0]])
    assert bit_equal(dispatch, expected)
    assert dispatch_dropped(indices, locations, num_experts=2, capacity=2) == 2


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_forward_matches_loop(dtype, top_k):
    rng = np.random.default_rng(top_k)
    samples, hidden, num_experts, capacity = 23, 5, 3, 4
    indices, locations = random_routing(rng, top_k, samples, num_experts, capacity)
    gates = random_floats(rng, (top_k, samples), dtype)
    input = random_floats(rng, (samples, hidden), dtype)
    dispatch = dispatch_forward(gates, indices, locations, input,
                                num_experts=num_experts, capacity=capacity)
    assert bit_equal(dispatch, reference_forward(gates, indices, locations, input,
                                                 num_experts, capacity))
    if top_k == 1:  # an [S] problem is the same as a [1, S] one
        flat = dispatch_forward(gates[0], indices[0], locations[0], input,
                                num_experts=num_experts, capacity=capacity)
        assert bit_equal(flat, dispatch)
    dropped = sum(not (0 <= e < num_experts and 0 <= c < capacity)
                  for e, c in zip(indices.flat, locations.flat))
    assert dispatch_dropped(indices, locations, num_experts=num_experts,
                            capacity=capacity) == dropped


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_forward_ieee_specials(dtype):
    inf, nan = float("inf"), float("nan")
    gates = np.array([-0.0, 0.0, inf, nan], dtype=dtype)
    input = np.array([[1, -2], [-1, 0], [0, 2], [1, 1]], dtype=dtype)
    dispatch = dispatch_forward(gates, [0, 1, 2, 3], [0, 0, 0, 0], input,
                                num_experts=4, capacity=1)
    expected = np.array([[-0.0, 0.0], [-0.0, 0.0], [nan, inf], [nan, nan]], dtype=dtype)
    assert bit_equal(dispatch, expected)
    assert not bit_equal(dispatch, np.abs(expected))  # the -0.0s are really there


def test_forward_any_bit_pattern_is_dropped_not_written():
    info = np.iinfo(np.int32)
    indices = np.int32([info.min, info.max, -1, 2, 0, 1])
    locations = np.int32([0, 0, 0, 0, info.max, info.min])
    gates = np.ones(6, np.float32)
    input = np.ones((6, 3), np.float32)
    dispatch = dispatch_forward(gates, indices, locations, input, num_experts=2, capacity=3)
    assert bit_equal(dispatch, np.zeros((6, 3), np.float32))
    assert dispatch_dropped(indices, locations, num_experts=2, capacity=3) == 6
    unsigned = np.array([2**32 - 1, 0], np.uint32)
    assert dispatch_dropped(unsigned, np.uint32([0, 2**31]), num_experts=2, capacity=3) == 2


@pytest.mark.parametrize("samples, capacity, hidden, num_experts", [
    (0, 8, 16, 2),    # the MLU-OPS zero-element cases, scaled down
    (8, 8, 0, 2),
    (8, 0, 16, 2),
    (8, 4, 16, 0),
    (0, 0, 0, 0),
])
def test_zero_sized(samples, capacity, hidden, num_experts):
    rng = np.random.default_rng(0)
    indices = rng.integers(0, max(num_experts, 1), samples).astype(np.int32)
    locations = np.arange(samples, dtype=np.int32) % max(capacity, 1)
    gates = np.ones(samples, np.float32)
    input = np.ones((samples, hidden), np.float32)
    kwargs = dict(num_experts=num_experts, capacity=capacity)
    dispatch = dispatch_forward(gates, indices, locations, input, **kwargs)
    assert dispatch.shape == (num_experts * capacity, hidden) and dispatch.dtype == np.float32
    assert not dispatch.any()
    grad_dispatch = np.ones((num_experts * capacity, hidden), np.float32)
    assert dispatch_backward_data(gates, indices, locations, grad_dispatch,
                                  **kwargs).shape == (samples, hidden)
    assert dispatch_backward_gate(input, indices, locations, grad_dispatch,
                                  **kwargs).shape == (samples,)
    expected_dropped = samples if capacity == 0 or num_experts == 0 else 0
    assert dispatch_dropped(indices, locations, **kwargs) == expected_dropped


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_backward_data_matches_loop(dtype, top_k):
    rng = np.random.default_rng(10 + top_k)
    samples, hidden, num_experts, capacity = 19, 4, 3, 5
    indices, locations = random_routing(rng, top_k, samples, num_experts, capacity)
    gates = random_floats(rng, (top_k, samples), dtype)
    grad_dispatch = random_floats(rng, (num_experts * capacity, hidden), dtype)
    grad_input = dispatch_backward_data(gates, indices, locations, grad_dispatch,
                                        num_experts=num_experts, capacity=capacity)
    expected = np.zeros((samples, hidden), dtype)
    with np.errstate(all="ignore"):
        for i in range(samples):
            for j in range(hidden):
                total = None
                for k in range(top_k):
                    term = dtype(0)
                    if 0 <= indices[k, i] < num_experts and 0 <= locations[k, i] < capacity:
                        term = gates[k, i] * grad_dispatch[indices[k, i] * capacity
                                                           + locations[k, i], j]
                    total = term if total is None else total + term
                expected[i, j] = total
    assert bit_equal(grad_input, expected)


def test_backward_data_single_row_is_the_plain_product():
    grad_input = dispatch_backward_data(np.float32([-1.0, 2.0]), [0, 5], [0, 0],
                                        np.float32([[0.0, 3.0]]), num_experts=1, capacity=1)
    assert bit_equal(grad_input, np.float32([[-0.0, -3.0], [0.0, 0.0]]))


def reference_backward_gate(input, indices, locations, grad_dispatch, num_experts, capacity,
                            lanes):
    """The documented order, written out with scalars: lane partials, then a pairwise tree."""
    dtype = input.dtype.type
    grad_gates = np.zeros(indices.shape, input.dtype)
    with np.errstate(all="ignore"):
        for k, i in np.ndindex(indices.shape):
            if not (0 <= indices[k, i] < num_experts and 0 <= locations[k, i] < capacity):
                continue
            row = grad_dispatch[indices[k, i] * capacity + locations[k, i]]
            partials = [dtype(0.0)] * lanes
            for j in range(input.shape[1]):
                partials[j % lanes] = partials[j % lanes] + input[i, j] * row[j]
            while len(partials) > 1:
                partials = [partials[m] + partials[m + 1] for m in range(0, len(partials), 2)]
            grad_gates[k, i] = partials[0]
    return grad_gates


@pytest.mark.parametrize("lanes", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_backward_gate_matches_loop(dtype, lanes):
    rng = np.random.default_rng(lanes)
    samples, hidden, num_experts, capacity, top_k = 13, 21, 3, 4, 2
    indices, locations = random_routing(rng, top_k, samples, num_experts, capacity)
    input = random_floats(rng, (samples, hidden), dtype, specials=0.02)
    grad_dispatch = random_floats(rng, (num_experts * capacity, hidden), dtype, specials=0.02)
    grad_gates = dispatch_backward_gate(input, indices, locations, grad_dispatch,
                                        num_experts=num_experts, capacity=capacity, lanes=lanes)
    assert bit_equal(grad_gates, reference_backward_gate(
        input, indices, locations, grad_dispatch, num_experts, capacity, lanes))
    flat = dispatch_backward_gate(input, indices[0], locations[0], grad_dispatch,
                                  num_experts=num_experts, capacity=capacity, lanes=lanes)
    assert bit_equal(flat, grad_gates[0])


@pytest.mark.parametrize("lanes", [1, 4, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_backward_gate_error_bound_against_float64(dtype, lanes):
    rng = np.random.default_rng(100 + lanes)
    samples, hidden, num_experts, capacity = 32, 64, 2, 16
    indices = rng.integers(0, num_experts, samples)
    locations = rng.permutation(samples) % capacity
    input = random_floats(rng, (samples, hidden), dtype, specials=0.0)
    grad_dispatch = random_floats(rng, (num_experts * capacity, hidden), dtype, specials=0.0)
    grad_gates = dispatch_backward_gate(input, indices, locations, grad_dispatch,
                                        num_experts=num_experts, capacity=capacity, lanes=lanes)
    rows = grad_dispatch.astype(np.float64)[indices * capacity + locations]
    products = input.astype(np.float64) * rows
    exact = products.sum(axis=1)
    unit_roundoff = 2.0 ** -(ml_dtypes.finfo(dtype).nmant + 1)
    depth = hidden / lanes + math.log2(lanes) + 1  # roundings on any path of the reduction
    bound = 1.01 * depth * unit_roundoff * np.abs(products).sum(axis=1)
    assert np.all(np.abs(grad_gates.astype(np.float64) - exact) <= bound)


def test_backward_gate_signed_zero_sum_is_positive():
    input = np.float32([[-0.0, 0.0, -0.0]])
    grad_dispatch = np.float32([[1.0, -1.0, 1.0]])  # every product is -0.0
    for lanes in (1, 2, 4):
        grad_gates = dispatch_backward_gate(input, [0], [0], grad_dispatch, num_experts=1,
                                            capacity=1, lanes=lanes)
        assert bit_equal(grad_gates, np.float32([0.0]))


def test_backward_gate_nan_and_inf():
    input = np.float16([[np.inf, 1.0], [np.inf, 1.0]])
    grad_dispatch = np.float16([[1.0, 2.0], [-1.0, np.inf]])
    grad_gates = dispatch_backward_gate(input, [0, 1], [0, 0], grad_dispatch, num_experts=2,
                                        capacity=1, lanes=2)
    assert bit_equal(grad_gates, np.float16([np.inf, np.nan]))


GOOD = dict(gates=np.ones(2, np.float32), indices=np.int32([0, 1]),
            locations=np.int32([0, 0]), input=np.ones((2, 3), np.float32))


@pytest.mark.parametrize("change, error, match", [
    (dict(capacity=-3), ValueError, r"capacity must be a non-negative integer, not -3"),
    (dict(capacity=2.0), TypeError, r"capacity must be a non-negative integer, not 2.0"),
    (dict(num_experts=-1), ValueError, r"num_experts must be a non-negative integer, not -1"),
    (dict(num_experts=True), TypeError, r"num_experts must be"),
    (dict(indices=np.float32([0, 1])), TypeError, r"indices must have an integer dtype"),
    (dict(locations=np.int32([0, 0, 0])), ValueError, r"locations has shape \(3,\)"),
    (dict(gates=np.ones(3, np.float32)), ValueError, r"gates has shape \(3,\)"),
    (dict(gates=np.ones(2, np.float16)), TypeError, r"gates has dtype float16"),
    (dict(gates=np.ones(2, np.float64)), TypeError, r"gates must have dtype float32"),
    (dict(input=np.ones((3, 3), np.float32)), ValueError, r"input must have 2 rows"),
    (dict(input=np.ones(2, np.float32)), ValueError, r"input must have 2 dimension"),
    (dict(indices=np.zeros((1, 1, 2), np.int32)), ValueError, r"indices must have 1 or 2"),
])
def test_forward_bad_arguments(change, error, match):
    args = {**GOOD, "num_experts": 2, "capacity": 2, **change}
    with pytest.raises(error, match=match):
        dispatch_forward(args["gates"], args["indices"], args["locations"], args["input"],
                         num_experts=args["num_experts"], capacity=args["capacity"])


def test_backward_bad_arguments():
    grad = np.ones((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"grad_dispatch must have shape \(4, 3\)"):
        dispatch_backward_gate(GOOD["input"], GOOD["indices"], GOOD["locations"], grad[:3],
                               num_experts=2, capacity=2)
    with pytest.raises(ValueError, match=r"grad_dispatch must have shape \(6, 3\)"):
        dispatch_backward_data(GOOD["gates"], GOOD["indices"], GOOD["locations"], grad,
                               num_experts=2, capacity=3)
    with pytest.raises(TypeError, match=r"grad_dispatch has dtype bfloat16"):
        dispatch_backward_data(GOOD["gates"], GOOD["indices"], GOOD["locations"],
                               grad.astype(ml_dtypes.bfloat16), num_experts=2, capacity=2)
    for lanes, error in ((3, ValueError), (32, ValueError), (0, ValueError), (2.0, TypeError)):
        with pytest.raises(error, match=r"lanes must be"):
            dispatch_backward_gate(GOOD["input"], GOOD["indices"], GOOD["locations"], grad,
                                   num_experts=2, capacity=2, lanes=lanes)
    with pytest.raises(ValueError, match=r"capacity must be a non-negative integer, not -1"):
        dispatch_dropped(GOOD["indices"], GOOD["locations"], num_experts=2, capacity=-1)
