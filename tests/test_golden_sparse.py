"""Golden model of the sparse dispatcher (SPEC 1.3, seed 000)."""

import ml_dtypes
import numpy as np
import pytest

from moe_hw.golden import (expert_to_gates, sparse_combine, sparse_dispatch,
                           sparse_dispatch_indices)
from moe_hw.golden.testing import bit_equal, random_floats

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]

SEED_GATES = np.float32([[0, 0, .7],
                         [.9, 0, 0],
                         [0, 0, .5],
                         [0, .8, 0]])


def random_gate_matrix(rng, samples, num_experts, top_k, dtype):
    """Softmax-like top-k gates: k distinct experts per row with positive gates."""
    gates = np.zeros((samples, num_experts), dtype)
    for i in range(samples):
        experts = rng.choice(num_experts, top_k, replace=False)
        gates[i, experts] = rng.uniform(0.05, 1.0, top_k).astype(np.float32).astype(dtype)
    return gates


def test_seed_worked_example():
    batch_index, part_sizes, nonzero_gates = sparse_dispatch_indices(SEED_GATES)
    assert batch_index.tolist() == [1, 3, 0, 2]
    assert part_sizes.tolist() == [1, 1, 2]
    assert bit_equal(nonzero_gates, np.float32([.9, .8, .7, .5]))
    assert [g.tolist() for g in expert_to_gates(SEED_GATES)] == \
        [[np.float32(.9)], [np.float32(.8)], [np.float32(.7), np.float32(.5)]]

    inp = np.arange(4 * 3).reshape(4, 3, 1)  # [B*N, L, 1]: token t holds 3t, 3t+1, 3t+2
    expert_inputs = sparse_dispatch(SEED_GATES, inp)
    assert [x.shape for x in expert_inputs] == [(1, 3, 1), (1, 3, 1), (2, 3, 1)]
    assert np.array_equal(expert_inputs[0], inp[[1]])
    assert np.array_equal(expert_inputs[1], inp[[3]])
    assert np.array_equal(expert_inputs[2], inp[[0, 2]])

    # combine: slot s holds y_s; token batch_index[s] gets nonzero_gates[s] * y_s.
    expert_out = [np.float32([[1, 2]]), np.float32([[3, 4]]), np.float32([[5, 6], [7, 8]])]
    combined = sparse_combine(SEED_GATES, expert_out)
    expected = np.float32([[.7 * 5, .7 * 6], [.9 * 1, .9 * 2],
                           [.5 * 7, .5 * 8], [.8 * 3, .8 * 4]])
    assert bit_equal(combined, (np.float32([.7, .9, .5, .8])[:, None]
                                * np.float32([[5, 6], [1, 2], [7, 8], [3, 4]])))
    assert np.allclose(combined, expected)
    assert bit_equal(sparse_combine(SEED_GATES, expert_out, multiply_by_gates=False),
                     np.float32([[5, 6], [1, 2], [7, 8], [3, 4]]))


def reference_combine(gates, stitched, multiply_by_gates):
    """index_add written out: slots in expert-major, token-ascending order, from +0.0."""
    out = np.zeros((gates.shape[0],) + stitched.shape[1:], stitched.dtype)
    s = 0
    with np.errstate(all="ignore"):
        for expert in range(gates.shape[1]):
            for token in range(gates.shape[0]):
                if gates[token, expert] != 0:
                    for j in np.ndindex(stitched.shape[1:]):
                        term = stitched[(s,) + j]
                        if multiply_by_gates:
                            term = term * gates[token, expert]
                        out[(token,) + j] = out[(token,) + j] + term
                    s += 1
    return out


@pytest.mark.parametrize("multiply_by_gates", [True, False])
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_combine_matches_loop(dtype, top_k, multiply_by_gates):
    rng = np.random.default_rng(top_k)
    gates = random_gate_matrix(rng, 11, 5, top_k, dtype)
    stitched = random_floats(rng, (11 * top_k, 3, 2), dtype)
    combined = sparse_combine(gates, stitched, multiply_by_gates)
    assert bit_equal(combined, reference_combine(gates, stitched, multiply_by_gates))
    _, part_sizes, _ = sparse_dispatch_indices(gates)
    as_list = np.split(stitched, np.cumsum(part_sizes)[:-1])
    assert bit_equal(sparse_combine(gates, as_list, multiply_by_gates), combined)


def test_combine_signed_zero_and_specials():
    gates = np.float16([[0.5, 0.25], [1.0, 0], [0, 2.0]])
    # slots: expert 0 -> tokens 0, 1; expert 1 -> tokens 0, 2
    stitched = np.float16([[-0.0], [-0.0], [-0.0], [np.inf]])
    combined = sparse_combine(gates, stitched)
    assert bit_equal(combined, np.float16([[0.0], [0.0], [np.inf]]))  # +0.0 + -0.0 = +0.0
    stitched = np.float16([[np.inf], [np.nan], [-np.inf], [1]])
    assert bit_equal(sparse_combine(gates, stitched), np.float16([[np.nan], [np.nan], [2]]))


def test_toy_scale_round_trip():
    """The seed's toy scale: S = 21, E = 6, k = 1, inputs (L, 1) with L = 16, d_model = 8."""
    rng = np.random.default_rng(21)
    gates = random_gate_matrix(rng, 21, 6, 1, np.float32)
    inp = rng.standard_normal((21, 16, 1)).astype(np.float32)
    expert_inputs = sparse_dispatch(gates, inp)
    _, part_sizes, _ = sparse_dispatch_indices(gates)
    assert [len(x) for x in expert_inputs] == part_sizes.tolist() and sum(part_sizes) == 21
    weights = rng.standard_normal((6, 16, 8)).astype(np.float32)
    expert_out = [np.einsum("nl,ld->nd", x[:, :, 0], w)[:, :, None]
                  for x, w in zip(expert_inputs, weights)]
    combined = sparse_combine(gates, expert_out)
    assert combined.shape == (21, 8, 1) and combined.dtype == np.float32
    experts = gates.argmax(axis=1)
    for i in range(21):
        direct = np.einsum("l,ld->d", inp[i, :, 0], weights[experts[i]])
        assert np.allclose(combined[i, :, 0], gates[i, experts[i]] * direct, rtol=1e-5)


def test_empty_experts_and_nan_gates():
    gates = np.float32([[0, 0.5, 0], [0, np.nan, 0]])
    batch_index, part_sizes, nonzero_gates = sparse_dispatch_indices(gates)
    assert batch_index.tolist() == [0, 1] and part_sizes.tolist() == [0, 2, 0]
    assert bit_equal(nonzero_gates, np.float32([0.5, np.nan]))
    parts = sparse_dispatch(gates, np.ones((2, 4), np.int8))
    assert [p.shape for p in parts] == [(0, 4), (2, 4), (0, 4)]
    # -0.0 is zero: not routed
    assert sparse_dispatch_indices(np.float32([[-0.0, 1.0]]))[1].tolist() == [0, 1]


def test_zero_sized():
    batch_index, part_sizes, nonzero_gates = sparse_dispatch_indices(np.zeros((0, 3), np.float16))
    assert batch_index.shape == (0,) and part_sizes.tolist() == [0, 0, 0]
    assert nonzero_gates.dtype == np.float16
    combined = sparse_combine(np.zeros((2, 3), np.float32), np.zeros((0, 5), np.float32))
    assert bit_equal(combined, np.zeros((2, 5), np.float32))


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"gates must be non-negative .*not -0.5 at \[1, 2\]"):
        sparse_dispatch_indices(np.float32([[0, 0, 1], [0, 0, -0.5]]))
    with pytest.raises(ValueError, match=r"gates must have 2 dimension"):
        sparse_dispatch_indices(np.float32([1, 0]))
    with pytest.raises(TypeError, match=r"gates must have dtype"):
        sparse_dispatch_indices(np.ones((2, 2), np.float64))
    with pytest.raises(ValueError, match=r"inp must have 4 rows"):
        sparse_dispatch(SEED_GATES, np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"expert_out has 2 per-expert outputs"):
        sparse_combine(SEED_GATES, [np.zeros((1, 2), np.float32)] * 2)
    with pytest.raises(ValueError, match=r"expert_out\[2\] must have 2 rows"):
        sparse_combine(SEED_GATES, [np.zeros((1, 2), np.float32)] * 3)
    with pytest.raises(ValueError, match=r"expert_out must have 4 rows"):
        sparse_combine(SEED_GATES, np.zeros((5, 2), np.float32))
    with pytest.raises(TypeError, match=r"gates has dtype float32, but expert_out has float16"):
        sparse_combine(SEED_GATES, np.zeros((4, 2), np.float16))
