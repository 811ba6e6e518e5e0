"""Golden models of scan and scan_layers (SPEC 1.7, seed 003)."""

import numpy as np
import pytest

from moe_hw import golden
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


# ---- the integer layer: exact product and sum, one saturation, then relu --------------------

EDGES = [-128, -127, -2, -1, 0, 1, 2, 126, 127]


def _int_layer_reference(h, a, b, relu):
    """The rule on Python ints: exact, clamped once to [-128, 127], relu after."""
    return max(0 if relu else -128, min(127, a * h + b))


@pytest.mark.parametrize("relu", [False, True])
def test_int8_layer_matches_the_rule_on_every_edge(relu):
    grid = np.array(np.meshgrid(EDGES, EDGES, EDGES, indexing="ij"), np.int8).reshape(3, -1)
    h, a, b = grid
    y = golden.affine_layer(h, {"scale": a, "bias": b}, relu)
    assert y.dtype == np.int8
    want = [_int_layer_reference(int(x), int(s), int(c), relu) for x, s, c in zip(h, a, b)]
    assert y.tolist() == want


def test_int8_layer_saturates_at_both_ends_and_once():
    h = np.int8([-128, -128, 127, -128, 100, 100, 64])
    scale = np.int8([-128, 127, 127, 1, 2, 2, 2])
    bias = np.int8([127, 0, 127, -1, -100, -73, -1])
    y = golden.affine_layer(h, {"scale": scale, "bias": bias})
    # -128 * -128 = 16384 (no int8 or int16 wrap), + 127, saturates to 127
    assert y[0] == 127
    assert y[1] == -128 and y[2] == 127 and y[3] == -128
    # the product alone (200) is out of range, the sum (100) is not: one saturation, at the end
    assert y[4] == 100
    assert y[5] == 127 and y[6] == 127
    relu = golden.affine_layer(h, {"scale": scale, "bias": bias}, relu=True)
    assert relu.tolist() == [127, 0, 127, 0, 100, 127, 127]


def test_int8_scan_layers_saturates_per_layer():
    """Saturation happens at the end of every layer, not once at the end of the stack: 100 * 2
    saturates to 127 in layer 0, then 127 - 100 = 27 in layer 1 (an exact stack gives 100)."""
    stacked = {"scale": np.int8([[2], [1]]), "bias": np.int8([[0], [-100]])}
    h = np.int8([[100]])
    out = scan_layers(lambda x, p: golden.affine_layer(x, p), stacked, h)
    assert out.tolist() == [[27]] and out.dtype == np.int8


def test_int_layer_zero_sized_and_wider_dtypes():
    empty = np.zeros((0, 4), np.int8)
    params = {"scale": np.ones(4, np.int8), "bias": np.ones(4, np.int8)}
    y = golden.affine_layer(empty, params, relu=True)
    assert y.shape == (0, 4) and y.dtype == np.int8
    h = np.zeros((3, 0), np.int8)
    assert golden.affine_layer(h, {"scale": h[:1], "bias": h[:1]}).shape == (3, 0)
    # int16 follows the same rule with its own range
    y16 = golden.affine_layer(np.int16([-32768, 300]), {"scale": np.int16([-32768, 300]),
                                                 "bias": np.int16([0, -1])})
    assert y16.tolist() == [32767, 32767]


def test_int_layer_rejects_mixed_and_unsupported_dtypes():
    h = np.int8([1, 2])
    with pytest.raises(TypeError, match="scale has dtype int16, but h has int8"):
        golden.affine_layer(h, {"scale": np.int16([1, 1]), "bias": np.int8([0, 0])})
    with pytest.raises(TypeError, match="bias has dtype float32, but h has int8"):
        golden.affine_layer(h, {"scale": h, "bias": np.float32([0, 0])})
    with pytest.raises(TypeError, match="an integer h must have dtype int8, int16 or int32, "
                                        "not uint8"):
        golden.affine_layer(h.view(np.uint8), {"scale": h, "bias": h})


def test_float_layer_unchanged_by_the_integer_rule():
    """A float layer still rounds twice with no saturation (fp32 overflows to Inf)."""
    h = np.float32([3e38, -2.0])
    y = golden.affine_layer(h, {"scale": np.float32([2.0, 1.0]), "bias": np.float32([0.0, 1.0])},
                     relu=True)
    assert np.isinf(y[0]) and y[1] == 0 and not np.signbit(y[1])
