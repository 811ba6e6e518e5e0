"""Golden models of expand and repeat (SPEC 1.6, seed 002)."""

import itertools

import ml_dtypes
import numpy as np
import pytest

from moe_hw.golden import (contiguous_strides, expand, expand_backward, expand_strides,
                           physical_expand, repeat)
from moe_hw.golden._common import add
from moe_hw.golden.expand import (_repeat_plan, backward_mode, expand_backward_hw,
                                  merged_dims)
from moe_hw.golden.testing import bit_equal, random_floats

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]


def test_seed_strides():
    assert contiguous_strides([6, 3, 4, 5]) == [60, 20, 5, 1]
    assert contiguous_strides([4, 1, 3, 5]) == [15, 15, 5, 1]
    assert expand_strides([4, 1, 3, 5], [2, 1, 4, 4, 3, 5]) == [0, 0, 15, 0, 5, 1]
    assert expand_strides([4, 3, 1, 2], [2, 4, 3, 4, 2]) == [0, 6, 2, 0, 1]


@pytest.mark.parametrize("input_shape, sizes, output_shape", [
    ([4, 3, 1, 2], [[4, 3, 5, 2], [-1, 3, 5, 2], [-1, -1, 5, 2], [-1, -1, 5, -1],
                    [4, -1, 5, 2], [4, -1, 5, -1], [4, 3, 5, -1]], [4, 3, 5, 2]),
    ([1, 4, 3, 5], [[2, 1, 2, 4, 3, 5], [2, 1, 2, -1, 3, 5], [2, 1, 2, -1, -1, 5],
                    [2, 1, 2, -1, -1, -1], [2, 1, 2, 4, -1, 5], [2, 1, 2, 4, -1, -1],
                    [2, 1, 2, 4, 3, -1]], [2, 1, 2, 4, 3, 5]),
])
def test_seed_legal_expand_sizes(input_shape, sizes, output_shape):
    input = np.arange(np.prod(input_shape)).reshape(input_shape)
    for expand_size in sizes:
        output = expand(input, expand_size)
        assert list(output.shape) == output_shape
        assert np.array_equal(output, np.broadcast_to(input, output_shape))


def test_address_generator_reads_input_flat():
    """output[x] == input_flat[sum_d x_d * out_stride[d]], element by element."""
    input = np.arange(4 * 1 * 3 * 5).reshape(4, 1, 3, 5)
    out_stride = expand_strides(input.shape, [2, 1, 4, 4, 3, 5])
    output = expand(input, [2, 1, 4, 4, 3, 5])
    for x in np.ndindex(output.shape):
        assert output[x] == input.reshape(-1)[sum(a * s for a, s in zip(x, out_stride))]


@pytest.mark.parametrize("seed", range(8))
def test_expand_matches_broadcast(seed):
    rng = np.random.default_rng(seed)
    input_shape = [int(n) for n in rng.choice([1, 1, 2, 3], rng.integers(0, 4))]
    expand_size = [int(n) for n in rng.integers(1, 4, rng.integers(0, 3))]  # new dims
    for n in input_shape:
        expand_size.append(int(rng.integers(1, 4)) if n == 1 else int(rng.choice([n, -1])))
    input = rng.standard_normal(input_shape).astype(np.float16)
    output = expand(input, expand_size)
    shape = [n if n != -1 else input_shape[d - len(expand_size) + len(input_shape)]
             for d, n in enumerate(expand_size)]
    assert bit_equal(output, np.broadcast_to(input, shape).copy())


@pytest.mark.parametrize("input_shape, repeat_size, output_shape", [
    ([5], [3], [15]),                                    # seed example 1
    ([3, 1, 5], [5, 3, 1], [15, 3, 5]),                  # seed example 2
    ([3, 1, 5], [2, 5, 3, 1], [2, 15, 3, 5]),            # seed example 3
    ([4, 1, 3, 5], [2, 1, 2, 4, 1, 1], [2, 1, 8, 4, 3, 5]),
    ([2, 0, 3], [2, 3, 1], [4, 0, 3]),                   # a 0-sized dim repeats to 0
    ([], [2, 3], [2, 3]),
])
def test_repeat_matches_tile(input_shape, repeat_size, output_shape):
    input = np.arange(int(np.prod(input_shape)), dtype=np.int32).reshape(input_shape)
    output = repeat(input, repeat_size)
    assert list(output.shape) == output_shape
    assert np.array_equal(output, np.tile(input, repeat_size))


def test_seed_repeat_plans():
    assert _repeat_plan([5], [3]) == ([1, 5], [3, 5], [15])
    assert _repeat_plan([3, 1, 5], [5, 3, 1]) == ([1, 3, 1, 5], [5, 3, 3, 5], [15, 3, 5])
    assert _repeat_plan([3, 1, 5], [2, 5, 3, 1]) == ([1, 3, 1, 5], [2, 5, 3, 3, 5],
                                                     [2, 15, 3, 5])


@pytest.mark.parametrize("expand_size", [[2, 4, 3, 4, 2], [2, 4, 3, 4, -1], [2, -1, -1, 4, 2]])
def test_seed_physical_expand(expand_size):
    plans = physical_expand([4, 3, 1, 2], expand_size, split_dim=3, parts=2)
    assert plans == [([4, 3, 1, 1], [2, 4, 3, 4, 1], [0, 3, 1, 0, 1])] * 2
    assert plans[0].out_stride == [0, 3, 1, 0, 1]
    input = np.arange(24).reshape(4, 3, 1, 2)
    pieces = np.split(input, 2, axis=3)
    outputs = [expand(piece, plan.expand_size) for piece, plan in zip(pieces, plans)]
    assert np.array_equal(np.concatenate(outputs, axis=4), expand(input, expand_size))


@pytest.mark.parametrize("input_shape, expand_size, split_dim, parts", [
    ([5, 1, 3], [2, 5, 4, 3], 0, 2),   # uneven: 3 + 2
    ([5, 1, 3], [5, 4, -1], 2, 3),     # 1 + 1 + 1
    ([2, 1, 3], [2, 2, 1, 3], 1, 2),   # a kept size-1 dim: 1 + 0
    ([3, 2], [3, 2], 0, 4),            # more units than rows: 1 + 1 + 1 + 0
])
def test_physical_expand_concatenates_to_logical(input_shape, expand_size, split_dim, parts):
    input = np.arange(int(np.prod(input_shape))).reshape(input_shape)
    plans = physical_expand(input_shape, expand_size, split_dim, parts)
    sizes = [plan.input_shape[split_dim] for plan in plans]
    assert sum(sizes) == input_shape[split_dim] and max(sizes) - min(sizes) <= 1
    pieces = np.split(input, np.cumsum(sizes)[:-1], axis=split_dim)
    outputs = []
    for piece, plan in zip(pieces, plans):
        assert list(piece.shape) == plan.input_shape
        assert expand_strides(plan.input_shape, plan.expand_size) == plan.out_stride
        outputs.append(expand(piece, plan.expand_size))
    out_dim = split_dim + len(expand_size) - len(input_shape)
    assert np.array_equal(np.concatenate(outputs, axis=out_dim), expand(input, expand_size))


def reference_expand_backward(grad_output, input_shape, expand_size):
    out_stride = expand_strides(input_shape, expand_size)
    input_grad = np.zeros(int(np.prod(input_shape)), grad_output.dtype)
    with np.errstate(all="ignore"):
        for x in np.ndindex(grad_output.shape):  # C order
            address = sum(a * s for a, s in zip(x, out_stride))
            input_grad[address] = input_grad[address] + grad_output[x]
    return input_grad.reshape(input_shape)


@pytest.mark.parametrize("input_shape, expand_size", [
    ([4, 1, 3, 5], [2, 1, 4, 4, 3, 5]),
    ([3, 1], [3, 7]),
    ([1], [5, 2, 9]),
    ([2, 3], [2, 3]),
    ([], [4]),
])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_expand_backward_matches_loop(dtype, input_shape, expand_size):
    rng = np.random.default_rng(len(expand_size))
    output_shape = expand(np.zeros(input_shape), expand_size).shape
    grad_output = random_floats(rng, output_shape, dtype)
    input_grad = expand_backward(grad_output, input_shape, expand_size)
    assert bit_equal(input_grad, reference_expand_backward(grad_output, input_shape,
                                                           expand_size))


def test_expand_backward_against_float64_and_signed_zero():
    rng = np.random.default_rng(3)
    grad_output = random_floats(rng, (6, 4, 5), np.float32, specials=0.0)
    input_grad = expand_backward(grad_output, [4, 1], [6, 4, 5])
    exact = grad_output.astype(np.float64).sum(axis=(0, 2)).reshape(4, 1)
    bound = 30 * 2.0 ** -24 * np.abs(grad_output.astype(np.float64)).sum(axis=(0, 2))
    assert np.all(np.abs(input_grad.astype(np.float64) - exact) <= bound.reshape(4, 1))
    negative = np.full((3, 2), -0.0, np.float16)
    assert bit_equal(expand_backward(negative, [1, 2], [3, 2]), np.zeros((1, 2), np.float16))
    assert bit_equal(expand_backward(negative, [3, 2], [3, 2]), np.zeros((3, 2), np.float16))


def reference_expand_backward_hw(grad_output, input_shape, expand_size, lanes, latency):
    """The hardware order written out as loops: items by mode, bank k % (latency + 3), then
    the banks summed in pairs, the pairs in order from +0.0; in stream mode one bank, the
    result."""
    out_stride = expand_strides(input_shape, expand_size)
    mode = backward_mode(grad_output.shape, out_stride, lanes, latency + 3)
    flat = grad_output.reshape(-1)
    address = [sum(a * s for a, s in zip(x, out_stride)) for x in np.ndindex(grad_output.shape)]
    n_in = int(np.prod(input_shape))
    banks = 1 if mode == "stream" else latency + 3
    partial = np.zeros((banks, n_in), grad_output.dtype)
    items = []
    if mode == "elements":
        items = [[(address[e], flat[e])] for e in range(flat.size)]
    elif mode in ("rows", "stream"):
        items = [[(address[e], flat[e]) for e in range(b, b + lanes)]
                 for b in range(0, flat.size, lanes)]
    else:
        for b in range(0, flat.size, lanes):
            values = list(flat[b:b + lanes])
            while len(values) > 1:
                values = [add(values[2 * m], values[2 * m + 1]) for m in range(len(values) // 2)]
            items.append([(address[b], values[0])])
    for k, item in enumerate(items):
        for a, v in item:
            partial[k % banks, a] = add(partial[k % banks, a], v)
    if mode == "stream":
        return partial[0].reshape(input_shape), mode
    result = np.zeros(n_in, grad_output.dtype)
    for s in range(0, banks, 2):
        pair = add(partial[s], partial[s + 1]) if s + 1 < banks else \
            add(partial[s], np.zeros(n_in, grad_output.dtype))
        result = add(result, pair)
    return result.reshape(input_shape), mode


@pytest.mark.parametrize("input_shape, expand_size, lanes, mode", [
    ([3, 1], [3, 8], 4, "reduce"),          # a gate broadcast across H
    ([1, 8], [5, 8], 4, "rows"),            # a row broadcast over tokens
    ([4, 1, 3, 5], [2, 1, 4, 4, 3, 5], 4, "elements"),
    ([2, 1], [3, 2, 16], 16, "reduce"),
    ([1, 4], [9, 4], 8, "elements"),        # a beat goes to each element twice
    ([], [5, 3], 2, "elements"),
    ([1], [6], 1, "reduce"),
    ([0, 1], [3, -1, 4], 4, "elements"),
    ([1, 64], [3, 64], 4, "stream"),       # a row broadcast, 16 items a pass >= G
    ([2, 32], [3, 2, 32], 4, "stream"),    # a repeat of whole rows
    ([4, 16], [4, 16], 2, "stream"),        # no broadcast: every row once
    ([1, 32], [3, 32], 4, {1: "stream", 4: "stream", 11: "rows"}),   # 8 items a pass
    ([2, 1, 32], [2, 3, 32], 4, "rows"),   # kept rows outside the broadcast: not a pass
])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("latency", [1, 4, 11])
def test_expand_backward_hw_matches_loop(dtype, latency, input_shape, expand_size, lanes, mode):
    rng = np.random.default_rng(lanes + latency)
    output_shape = expand(np.zeros(input_shape), expand_size).shape
    grad_output = random_floats(rng, output_shape, dtype)
    got = expand_backward_hw(grad_output, input_shape, expand_size, lanes, latency)
    want, want_mode = reference_expand_backward_hw(grad_output, input_shape, expand_size,
                                                   lanes, latency)
    assert want_mode == (mode if isinstance(mode, str) else mode[latency])
    assert bit_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_expand_backward_hw_integers_match_sequential(dtype):
    """Integer-valued data small enough to be exact: every summation order gives the bits of
    the sequential expand_backward; random data does not (the order is visible)."""
    rng = np.random.default_rng(5)
    for input_shape, expand_size in (([6, 1], [6, 64]), ([1, 16], [12, 16]),
                                     ([3, 1, 2], [4, 3, 5, 2])):
        output_shape = expand(np.zeros(input_shape), expand_size).shape
        grad_output = rng.integers(-4, 5, output_shape).astype(dtype)
        for lanes, latency in ((4, 1), (16, 11), (8, 2)):
            assert bit_equal(expand_backward_hw(grad_output, input_shape, expand_size, lanes,
                                                latency),
                             expand_backward(grad_output, input_shape, expand_size))
    grad_output = random_floats(rng, (6, 64), np.float32, specials=0.0)
    assert not bit_equal(expand_backward_hw(grad_output, [6, 1], [6, 64], 16, 11),
                         expand_backward(grad_output, [6, 1], [6, 64]))


def test_expand_backward_hw_bad_arguments():
    grad = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="lanes must be a power of two from 1 to 16, not 3"):
        expand_backward_hw(grad, [3, 1], [3, 4], 3, 4)
    with pytest.raises(ValueError, match="adder_latency must be a positive integer, not 0"):
        expand_backward_hw(grad, [3, 1], [3, 4], 4, 0)
    with pytest.raises(ValueError, match=r"expand_size\[1\] must be >= 1 or -1"):
        expand_backward_hw(grad, [3, 1], [3, -4], 4, 2)


def test_merged_dims_seed():
    assert merged_dims([2, 1, 4, 4, 3, 5], [0, 0, 15, 0, 5, 1]) == \
        [(2, 0), (4, 15), (4, 0), (15, 1)]
    assert merged_dims([3, 0], [0, 1]) == []


def test_zero_sized():
    assert expand(np.zeros((0, 1)), [3, -1, 4]).shape == (3, 0, 4)
    assert bit_equal(expand_backward(np.zeros((3, 0, 4), np.float32), [0, 1], [3, -1, 4]),
                     np.zeros((0, 1), np.float32))
    assert expand(np.float32(7), [2, 2]).tolist() == [[7, 7], [7, 7]]


@pytest.mark.parametrize("input_shape, expand_size, match", [
    ([4, 1], [4], r"expand_size must have at least as many dims as the input \(2\), not 1"),
    ([4, 1], [-1, 4, 1], r"expand_size\[0\] is a new dim and must be >= 1, not -1"),
    ([4, 1], [0, 4, 1], r"expand_size\[0\] is a new dim and must be >= 1, not 0"),
    ([4, 1], [5, 1], r"expand_size\[0\] must be 4 or -1 \(input dim 0 has size 4"),
    ([4, 1], [4, 0], r"expand_size\[1\] must be >= 1 or -1 \(input dim 1 has size 1\), not 0"),
    ([4, 1], [4, -2], r"expand_size\[1\] must be >= 1 or -1"),
    ([4, -1], [4, 1], r"input_shape\[1\] must be a non-negative size, not -1"),
])
def test_expand_bad_sizes(input_shape, expand_size, match):
    with pytest.raises(ValueError, match=match):
        expand_strides(input_shape, expand_size)


def test_other_bad_arguments():
    with pytest.raises(TypeError, match=r"expand_size\[1\] must be an integer, not 2.5"):
        expand(np.zeros(3), [3, 2.5])
    with pytest.raises(TypeError, match=r"expand_size must be a sequence of integers"):
        expand(np.zeros(3), 3)
    with pytest.raises(ValueError, match=r"repeat_size\[1\] must be >= 1, not 0"):
        repeat(np.zeros((2, 3)), [1, 0])
    with pytest.raises(ValueError, match=r"repeat_size must have at least as many dims"):
        repeat(np.zeros((2, 3)), [2])
    with pytest.raises(ValueError, match=r"grad_output must have the expanded shape \(3, 4\)"):
        expand_backward(np.zeros((4, 3), np.float32), [1, 4], [3, 4])
    with pytest.raises(TypeError, match=r"grad_output must have dtype"):
        expand_backward(np.zeros((3, 4), np.float64), [1, 4], [3, 4])
    with pytest.raises(ValueError, match=r"split_dim 1 is broadcast by expand_size\[2\] = 4"):
        physical_expand([2, 1], [3, 2, 4], split_dim=1, parts=2)
    with pytest.raises(ValueError, match=r"split_dim must be an input dim, 0 to 1, not 2"):
        physical_expand([2, 1], [2, 1], split_dim=2, parts=2)
    with pytest.raises(ValueError, match=r"parts must be a positive integer, not 0"):
        physical_expand([2, 1], [2, 1], split_dim=0, parts=0)
    with pytest.raises(ValueError, match=r"split_dim must be a non-negative integer, not -1"):
        physical_expand([2, 1], [2, 1], split_dim=-1, parts=2)


def test_legality_agrees_with_numpy_broadcasting():
    """Every expand_size over small shapes: legal exactly when NumPy can broadcast to it
    (with -1 resolved to the input size, and never -1 in a new dim)."""
    for input_shape in itertools.product([1, 2], repeat=2):
        input = np.arange(int(np.prod(input_shape))).reshape(input_shape)
        for expand_size in itertools.product([-1, 1, 2, 3], repeat=3):
            new = len(expand_size) - len(input_shape)
            shape = list(expand_size[:new]) + [n if e == -1 else e for e, n in
                                               zip(expand_size[new:], input_shape)]
            try:
                reference = None if -1 in shape else np.broadcast_to(input, shape)
            except ValueError:
                reference = None
            if reference is None:
                with pytest.raises(ValueError, match=r"expand_size\[\d\]"):
                    expand(input, expand_size)
            else:
                assert np.array_equal(expand(input, expand_size), reference)
