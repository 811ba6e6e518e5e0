"""The chained golden of a whole MoE layer (SPEC 1.8)."""

import ml_dtypes
import numpy as np
import pytest

from moe_hw.golden import moe_layer, top_k_routing
from moe_hw.golden.testing import bit_equal, random_floats

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]


def test_worked_example():
    gates = np.float32([[0.5, 0.0],
                        [0.0, 0.25],
                        [1.0, 0.0]])   # token 2 is expert 0's second token: over capacity 1
    input = np.float32([[1, 2], [3, 4], [5, 6]])
    output, dropped = moe_layer(gates, input, capacity=1, scale=np.float32([2, 3]),
                                bias=np.float32([1, -1]))
    assert bit_equal(output, np.float32([[0.5 * 3, 0.5 * 5], [0.25 * 8, 0.25 * 11], [0, 0]]))
    assert dropped == 1
    identity, dropped = moe_layer(gates, input, capacity=2)
    assert bit_equal(identity, np.float32([[0.5, 1], [0.75, 1], [5, 6]])) and dropped == 0


def test_top_k_routing_is_k_major_by_ascending_expert():
    gates = np.float16([[0, 0.25, 0, 0.5],
                        [0.75, 0, 0.125, 0]])
    gates_k, indices = top_k_routing(gates)
    assert indices.dtype == np.int32 and indices.tolist() == [[1, 0], [3, 2]]
    assert bit_equal(gates_k, np.float16([[0.25, 0.75], [0.5, 0.125]]))


def reference_layer(gates, input, capacity, scale, bias, postscore):
    """Token by token, without the unit goldens: counters, capacity, affine expert, sum."""
    samples, num_experts = gates.shape
    choices = [[e for e in range(num_experts) if gates[i, e] != 0] for i in range(samples)]
    top_k = len(choices[0]) if samples else 0
    counters, kept, dropped = [0] * num_experts, {}, 0
    for k in range(top_k):
        for i in range(samples):
            expert = choices[i][k]
            kept[k, i] = counters[expert] < capacity
            dropped += not kept[k, i]
            counters[expert] += 1
    dtype = input.dtype.type
    output = np.zeros(input.shape, input.dtype)
    with np.errstate(all="ignore"):
        for i in range(samples):
            for j in range(input.shape[1]):
                total = dtype(0.0)
                for k in range(top_k):
                    if not kept[k, i]:
                        continue
                    e, g = choices[i][k], gates[i, choices[i][k]]
                    x = input[i, j] if postscore else g * input[i, j]
                    y = x * (scale[e] if scale.ndim == 1 else scale[e, j])
                    y = y + (bias[e] if bias.ndim == 1 else bias[e, j])
                    total = total + (g * y if postscore else dtype(1.0) * y)
                output[i, j] = total
    return output, dropped


def random_top_k_gates(rng, samples, num_experts, top_k, dtype):
    gates = np.zeros((samples, num_experts), dtype)
    for i in range(samples):
        gates[i, rng.choice(num_experts, top_k, replace=False)] = \
            rng.uniform(0.05, 1, top_k).astype(np.float32).astype(dtype)
    return gates


@pytest.mark.parametrize("postscore", [True, False])
@pytest.mark.parametrize("top_k, capacity", [(1, 3), (2, 4), (2, 100)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_matches_token_loop(dtype, top_k, capacity, postscore):
    rng = np.random.default_rng(top_k * capacity)
    samples, hidden, num_experts = 12, 5, 4
    gates = random_top_k_gates(rng, samples, num_experts, top_k, dtype)
    input = random_floats(rng, (samples, hidden), dtype)
    scale = random_floats(rng, (num_experts,), dtype, specials=0.0)
    bias = random_floats(rng, (num_experts, hidden), dtype, specials=0.0)
    output, dropped = moe_layer(gates, input, capacity=capacity, scale=scale, bias=bias,
                                postscore=postscore)
    expected, expected_dropped = reference_layer(gates, input, capacity, scale, bias, postscore)
    assert bit_equal(output, expected)
    assert dropped == expected_dropped
    assert (dropped > 0) == (capacity < 100)


def test_zero_sized():
    output, dropped = moe_layer(np.zeros((0, 3), np.float16), np.zeros((0, 4), np.float16),
                                capacity=2)
    assert output.shape == (0, 4) and dropped == 0
    gates = np.float32([[1.0, 0.0], [0.0, 1.0]])
    output, dropped = moe_layer(gates, np.ones((2, 3), np.float32), capacity=0)
    assert bit_equal(output, np.zeros((2, 3), np.float32)) and dropped == 2
    output, dropped = moe_layer(gates, np.ones((2, 0), np.float32), capacity=1)
    assert output.shape == (2, 0) and dropped == 0


def test_bad_arguments():
    gates = np.float32([[1.0, 0.0], [0.5, 0.5]])
    with pytest.raises(ValueError, match=r"gates must have the same number of nonzeros in "
                                         r"every row \(k\), not 2 in row 1 and 1 in row 0"):
        moe_layer(gates, np.ones((2, 3), np.float32), capacity=2)
    gates = np.float32([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"capacity must be a non-negative integer, not -1"):
        moe_layer(gates, np.ones((2, 3), np.float32), capacity=-1)
    with pytest.raises(ValueError, match=r"input must have 2 rows"):
        moe_layer(gates, np.ones((3, 3), np.float32), capacity=2)
    with pytest.raises(TypeError, match=r"gates has dtype float32, but input has float16"):
        moe_layer(gates, np.ones((2, 3), np.float16), capacity=2)
    with pytest.raises(ValueError, match=r"scale must have shape \(2,\) or \(2, 3\)"):
        moe_layer(gates, np.ones((2, 3), np.float32), capacity=2, scale=np.ones(3, np.float32))
    with pytest.raises(TypeError, match=r"bias has dtype bfloat16"):
        moe_layer(gates, np.ones((2, 3), np.float32), capacity=2,
                  bias=np.ones(2, ml_dtypes.bfloat16))
    with pytest.raises(ValueError, match=r"gates must be non-negative"):
        moe_layer(-gates, np.ones((2, 3), np.float32), capacity=2)
