"""Golden models of scan and scan_layers (SPEC 1.7, seed 003)."""

import numpy as np
import pytest

from moe_hw.golden import prefix_sum, scan, scan_layers, stack_layer_params


def test_seed_example():
    carry, ys = scan(lambda c, x: (c + 1, x + c), 0, np.array([1, 2, 3]))
    assert carry == 3
    assert ys.tolist() == [1, 3, 5]
    carry, ys = scan(lambda c, x: (c + 1, x + c), 0, [1, 2, 3])
    assert (carry, ys.tolist()) == (3, [1, 3, 5])


def test_prefix_sum_is_a_scan():
    counts = np.array([3, 0, 2, 5, 1])
    total, offsets = prefix_sum(counts)
    assert total == 11
    assert offsets.tolist() == [0, 3, 3, 5, 10]
    assert np.array_equal(offsets, np.cumsum(counts) - counts)
    # the per-expert destination offsets of re-routing: totals over ranks, then the scan
    per_rank = np.array([[1, 0, 2], [2, 1, 0]])
    assert prefix_sum(per_rank.sum(axis=0))[1].tolist() == [0, 3, 4]


def test_array_rows_and_dict_xs():
    xs = np.arange(12).reshape(4, 3)
    carry, ys = scan(lambda c, x: (c + x, c * 2), np.zeros(3, int), xs)
    assert carry.tolist() == xs.sum(axis=0).tolist()
    assert ys.shape == (4, 3) and ys[0].tolist() == [0, 0, 0]
    carry, ys = scan(lambda c, x: (c * x["a"] + x["b"], None), 1,
                     {"a": np.array([2, 3]), "b": np.array([1, 1])})
    assert carry == (1 * 2 + 1) * 3 + 1 and ys is None


def test_empty_xs():
    carry, ys = scan(lambda c, x: (c + x, c), 5, np.zeros(0))
    assert carry == 5 and ys.shape == (0,)


def affine_layer(h, params):
    return np.tanh(params["w"] @ h + params["b"])


def test_scan_layers_matches_unrolled_chain():
    rng = np.random.default_rng(0)
    layers = [{"w": rng.standard_normal((4, 4)), "b": rng.standard_normal(4)} for _ in range(6)]
    stacked = stack_layer_params(layers)
    assert stacked["w"].shape == (6, 4, 4) and stacked["b"].shape == (6, 4)
    h0 = rng.standard_normal(4)
    h = h0
    for layer in layers:
        h = affine_layer(h, layer)
    assert np.array_equal(scan_layers(affine_layer, stacked, h0), h)
    # one layer is one step
    assert np.array_equal(scan_layers(affine_layer, stack_layer_params(layers[:1]), h0),
                          affine_layer(h0, layers[0]))


def test_stack_layer_params_rejects_differing_layers():
    w = np.zeros((2, 2))
    with pytest.raises(ValueError, match=r"layers\[1\] has parameters \['b', 'w'\], but "
                                         r"layers\[0\] has \['w'\]"):
        stack_layer_params([{"w": w}, {"w": w, "b": w}])
    with pytest.raises(ValueError, match=r"layers\[2\]\['w'\] has shape \(3, 2\)"):
        stack_layer_params([{"w": w}, {"w": w}, {"w": np.zeros((3, 2))}])
    with pytest.raises(ValueError, match=r"layers\[1\]\['w'\] has shape \(2, 2\) and dtype "
                                         r"float32"):
        stack_layer_params([{"w": w}, {"w": w.astype(np.float32)}])
    with pytest.raises(ValueError, match=r"layers must hold at least one layer"):
        stack_layer_params([])
    with pytest.raises(TypeError, match=r"layers\[0\] must be a dict"):
        stack_layer_params([w])


def test_bad_arguments():
    with pytest.raises(TypeError, match=r"fn must be callable"):
        scan(3, 0, [1])
    with pytest.raises(ValueError, match=r"fn must return a \(carry, y\) pair"):
        scan(lambda c, x: c, 0, [1])
    with pytest.raises(ValueError, match=r"xs must have a leading axis"):
        scan(lambda c, x: (c, x), 0, 5)
    with pytest.raises(ValueError, match=r"stacked_params\['b'\] has leading axis 2, but "
                                         r"stacked_params\['w'\] has 3"):
        scan_layers(affine_layer, {"w": np.zeros((3, 2, 2)), "b": np.zeros((2, 2))}, 0)
    with pytest.raises(ValueError, match=r"stacked_params must hold at least one array"):
        scan_layers(affine_layer, {}, 0)
    with pytest.raises(TypeError, match=r"stacked_params must be a dict"):
        scan_layers(affine_layer, [np.zeros(3)], 0)
    with pytest.raises(TypeError, match=r"layer_fn must be callable"):
        scan_layers(None, {"w": np.zeros(3)}, 0)
