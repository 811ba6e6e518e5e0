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


def test_expert_stacks_worked_example():
    """Each expert's rows through its own scan_layers stack: expert 0 (2 layers) turns a row
    x into relu(3 * (2x + 1) - 10), expert 1 into relu(-x + 0) then + 4."""
    gates = np.float32([[1.0, 0.0], [0.0, 0.5], [1.0, 0.0]])
    input = np.float32([[1, 2], [3, -4], [5, 6]])
    scale = np.float32([[[2, 2], [3, 3]], [[-1, -1], [1, 1]]])
    bias = np.float32([[[1, 1], [-10, -10]], [[0, 0], [4, 4]]])
    output, dropped = moe_layer(gates, input, capacity=2, scale=scale, bias=bias, relu=True)
    expert0 = lambda x: np.maximum(3 * (2 * x + 1) - 10, 0)        # noqa: E731
    expert1 = lambda x: np.maximum(np.maximum(-x, 0) + 4, 0)       # noqa: E731
    want = np.float32([expert0(input[0]), 0.5 * expert1(input[1]), expert0(input[2])])
    assert bit_equal(output, want) and dropped == 0
    plain, _ = moe_layer(gates, input, capacity=2, scale=scale, bias=bias)
    assert bit_equal(plain[0], np.float32([-1, 5]))     # 3 * (2x + 1) - 10 without relu


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_one_layer_stacks_are_affine_experts(dtype):
    """A one-layer stack of broadcast vectors is the affine expert, bit for bit (specials
    included): the same two roundings."""
    rng = np.random.default_rng(4)
    gates = np.zeros((12, 4), dtype)
    gates[np.arange(12), rng.integers(0, 4, 12)] = 1
    input = random_floats(rng, (12, 5), dtype, specials=0.3)
    scale, bias = (random_floats(rng, (4,), dtype, specials=0.3) for _ in range(2))
    affine, _ = moe_layer(gates, input, capacity=3, scale=scale, bias=bias)
    stacked, _ = moe_layer(gates, input, capacity=3,
                           scale=np.repeat(scale.reshape(4, 1, 1), 5, axis=2),
                           bias=np.repeat(bias.reshape(4, 1, 1), 5, axis=2))
    assert bit_equal(affine, stacked)


def test_expert_stack_errors():
    gates = np.float32([[1.0, 0.0], [0.0, 1.0]])
    input = np.ones((2, 3), np.float32)
    ones = np.ones((2, 2, 3), np.float32)
    with pytest.raises(ValueError, match="an expert stack needs both scale and bias"):
        moe_layer(gates, input, capacity=2, scale=ones)
    with pytest.raises(ValueError, match=r"bias must have shape \(2, L, 3\) \[E, L, H\]"):
        moe_layer(gates, input, capacity=2, scale=ones, bias=np.ones((2, 2, 4), np.float32))
    with pytest.raises(ValueError, match="scale and bias must have one shape"):
        moe_layer(gates, input, capacity=2, scale=ones, bias=np.ones((2, 1, 3), np.float32))
    with pytest.raises(ValueError, match="at least one layer"):
        moe_layer(gates, input, capacity=2, scale=ones[:, :0], bias=ones[:, :0])
    with pytest.raises(TypeError, match="bias has dtype float16"):
        moe_layer(gates, input, capacity=2, scale=ones, bias=ones.astype(np.float16))
