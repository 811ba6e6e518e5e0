"""Golden models of scan and scan_layers (SPEC 1.7; PyTorch/XLA, JAX ``lax.scan``; seed 003).

Hardware: one instance of the step (or layer) datapath, a carry register, and a parameter
memory of depth L indexed by a loop counter.
"""

import numpy as np

from ._common import add, float_array, mul

__all__ = ["scan", "scan_layers", "stack_layer_params", "prefix_sum", "affine_layer",
           "scan_layers_backward", "token_sum", "INT_LAYER_DTYPES"]


def _length(name, xs):
    if isinstance(xs, dict):
        if not xs:
            raise ValueError(f"{name} must hold at least one array")
        lengths = {key: np.shape(value)[0] if np.ndim(value) else None
                   for key, value in xs.items()}
        for key, length in lengths.items():
            if length is None:
                raise ValueError(f"{name}[{key!r}] must have a leading axis to scan over, "
                                 f"not shape {np.shape(xs[key])}")
        first = next(iter(xs))
        for key, length in lengths.items():
            if length != lengths[first]:
                raise ValueError(f"{name}[{key!r}] has leading axis {length}, but "
                                 f"{name}[{first!r}] has {lengths[first]}; they must match")
        return lengths[first]
    if np.ndim(xs) == 0:
        raise ValueError(f"{name} must have a leading axis to scan over, not {xs!r}")
    return len(xs)


def _item(xs, n):
    return {key: value[n] for key, value in xs.items()} if isinstance(xs, dict) else xs[n]


def scan(fn, init, xs):
    """``carry = init; for x in xs: carry, y = fn(carry, x); ys.append(y)``.

    ``xs`` is an array or sequence scanned along its leading axis, or a dict of arrays sharing
    a leading axis (each step gets the dict of their slices). Returns ``(carry, ys)``, where
    ``ys`` is the ys stacked along a new leading axis (a NumPy array), or None when every y is
    None; for an empty ``xs``, ys is an empty float32 array of shape (0,).

    Example (seed 003): ``scan(lambda c, x: (c + 1, x + c), 0, [1, 2, 3])`` gives
    ``(3, [1, 3, 5])``.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {fn!r}")
    carry, ys = init, []
    for n in range(_length("xs", xs)):
        step = fn(carry, _item(xs, n))
        if not (isinstance(step, tuple) and len(step) == 2):
            raise ValueError(f"fn must return a (carry, y) pair, not {step!r}")
        carry, y = step
        ys.append(y)
    if not ys:
        return carry, np.zeros(0, dtype=np.float32)
    if all(y is None for y in ys):
        return carry, None
    return carry, np.stack([np.asarray(y) for y in ys])


def prefix_sum(xs, init=0):
    """Exclusive prefix sum as a scan, ``fn(c, x) = (c + x, c)``: returns (total, offsets).

    The offsets of SPEC 1.5 and the counters of SPEC 1.2 are this scan.
    """
    return scan(lambda carry, x: (carry + x, carry), init, xs)


def stack_layer_params(layers):
    """Stack L structurally identical layers' parameters: dict name -> array [L, ...].

    ``layers`` is a sequence of dicts name -> array. Every layer must have the same parameter
    names, and each parameter the same shape and dtype in every layer.
    """
    layers = list(layers)
    if not layers:
        raise ValueError("layers must hold at least one layer, not 0")
    for n, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise TypeError(f"layers[{n}] must be a dict of parameter name -> array, "
                            f"not {type(layer).__name__}")
    first = {name: np.asarray(value) for name, value in layers[0].items()}
    for n, layer in enumerate(layers[1:], start=1):
        if sorted(layer) != sorted(first):
            raise ValueError(f"layers[{n}] has parameters {sorted(layer)}, but layers[0] has "
                             f"{sorted(first)}; all layers must have the same names")
        for name, value in layer.items():
            value = np.asarray(value)
            if value.shape != first[name].shape or value.dtype != first[name].dtype:
                raise ValueError(f"layers[{n}][{name!r}] has shape {value.shape} and dtype "
                                 f"{value.dtype}, but layers[0][{name!r}] has shape "
                                 f"{first[name].shape} and dtype {first[name].dtype}")
    return {name: np.stack([np.asarray(layer[name]) for layer in layers]) for name in first}


def scan_layers(layer_fn, stacked_params, h):
    """Apply L layers in sequence with one loop body: ``h = layer_fn(h, params_l)``.

    ``stacked_params`` is a dict name -> array [L, ...] (see :func:`stack_layer_params`);
    ``params_l`` is the dict of their slices at layer l (the parameter memory read at loop
    count l). ``layer_fn(h, params)`` returns the next h. Returns the final h.
    """
    if not callable(layer_fn):
        raise TypeError(f"layer_fn must be callable, not {layer_fn!r}")
    if not isinstance(stacked_params, dict):
        raise TypeError(f"stacked_params must be a dict of parameter name -> array [L, ...], "
                        f"not {type(stacked_params).__name__}")
    _length("stacked_params", stacked_params)
    h, _ = scan(lambda carry, params: (layer_fn(carry, params), None), h, stacked_params)
    return h


#: The integer dtypes of :func:`affine_layer` (saturating arithmetic; the units build int8).
INT_LAYER_DTYPES = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32))


def affine_layer(h, params, relu=False):
    """The layer of the ``scan_layers`` units: ``relu?(scale * h + bias)`` elementwise, in the
    format of ``h``. ``params`` holds ``scale`` and ``bias`` (broadcast against ``h``).

    Float (float32, float16, bfloat16): the product rounded, then the sum rounded (no FMA).
    relu keeps a NaN and a positive value and gives +0 for anything else (-0 included).

    Integer (int8; int16 and int32 follow the same rule, but no unit builds them):
    ``sat(scale * h + bias)``, where the product and the sum are exact (a wide accumulator:
    for int8 the product is in [-16256, 16384] and the sum in [-16384, 16511], 17 bits) and
    ``sat`` clamps the sum once, at the end of the layer, to the dtype's range ([-128, 127]
    for int8): no rounding, no shift, no saturation of the product alone. relu then gives 0
    for a negative result, so a relu layer's result is in [0, 127]. ``scale`` and ``bias``
    must have the dtype of ``h``.

    ``scan_layers(lambda h, p: affine_layer(h, p, relu), {"scale": a, "bias": b}, h)`` with
    ``a``, ``b`` [L, H] and ``h`` [S, H] is the units' golden model.
    """
    h = np.asarray(h)
    if h.dtype.kind in "iu":
        return _affine_layer_int(h, params, relu)
    y = add(mul(h, params["scale"]), params["bias"])
    if relu:
        with np.errstate(invalid="ignore"):       # ml_dtypes warns on a NaN compare
            y = np.where(np.isnan(y) | (y > 0), y, np.zeros((), dtype=y.dtype))
    return y


def _affine_layer_int(h, params, relu):
    """:func:`affine_layer` on integers: exact in int64, one saturation, then relu."""
    if h.dtype not in INT_LAYER_DTYPES:
        raise TypeError(f"an integer h must have dtype int8, int16 or int32, not {h.dtype}")
    scale, bias = (np.asarray(params[name]) for name in ("scale", "bias"))
    for name, array in (("scale", scale), ("bias", bias)):
        if array.dtype != h.dtype:
            raise TypeError(f"{name} has dtype {array.dtype}, but h has {h.dtype}; an integer "
                            f"layer takes one dtype")
    limits = np.iinfo(h.dtype)
    y = h.astype(np.int64) * scale.astype(np.int64) + bias.astype(np.int64)
    y = np.clip(y, 0 if relu else limits.min, limits.max)
    return y.astype(h.dtype)


def token_sum(values):
    """The sum over tokens of ``values`` [S, H] as the backward unit adds it: per element,
    from +0.0, the tokens in order 0, 1, ..., S-1, rounded after every add (a sequential sum;
    +0.0 for S = 0). Returns [H] in the format of ``values``."""
    values = np.asarray(values)
    total = np.zeros(values.shape[1:], dtype=values.dtype)
    for row in values:
        total = add(total, row)
    return total


def scan_layers_backward(scale, bias, relu, input, grad_output):
    """The backward pass of ``scan_layers(affine_layer)`` (SPEC 1.7, backward): returns
    ``(grad_input [S, H], grad_scale [L, H], grad_bias [L, H])``.

    Forward: ``h_0 = input``, ``h_{l+1} = relu?(a_l * h_l + b_l)`` (:func:`affine_layer`,
    ``a_l = scale[l]``, ``b_l = bias[l]``). Backward, for l = L-1 down to 0, with ``g`` the
    gradient with respect to ``h_{l+1}`` (``grad_output`` for l = L-1)::

        g_pre          = g, or with relu +0.0 where the pre-activation a_l*h_l + b_l <= 0
        grad_bias[l]   = token_sum(g_pre)
        grad_scale[l]  = token_sum(g_pre * h_l)
        g (for h_l)    = g_pre * a_l

    relu's derivative at a pre-activation of exactly 0 (+0 or -0) is 0, as in PyTorch;
    a NaN pre-activation passes the gradient, as PyTorch's ``threshold_backward`` on the
    relu result does (``result <= 0`` is false for NaN). Both follow from the rule used
    here and in the hardware: g_pre is +0.0 where ``h_{l+1}`` (the relu's result, never
    -0) is +0.0.

    Arithmetic: in the format of ``input`` (float32, float16 or bfloat16), every product
    and every sum rounded once to nearest even (no FMA), as the unit's multipliers and
    adders do. The sums over tokens are :func:`token_sum`: per element, sequential in
    token order from +0.0. The forward activations are recomputed here with the same
    rounding, so storing all of them or recomputing them from checkpoints gives the same
    bits.
    """
    input = float_array("input", input, ndim=2, what="[S, H]")
    grad_output = float_array("grad_output", grad_output, ndim=2, what="[S, H]")
    scale = float_array("scale", scale, ndim=2, what="[L, H]")
    bias = float_array("bias", bias, ndim=2, what="[L, H]")
    for name, array in (("grad_output", grad_output), ("scale", scale), ("bias", bias)):
        if array.dtype != input.dtype:
            raise TypeError(f"{name} has dtype {array.dtype}, but input has {input.dtype}; "
                            f"they must share one format")
    if grad_output.shape != input.shape:
        raise ValueError(f"grad_output has shape {grad_output.shape}, but input has shape "
                         f"{input.shape}; they must match")
    if scale.shape != bias.shape:
        raise ValueError(f"bias has shape {bias.shape}, but scale has shape {scale.shape}; "
                         f"they must match")
    if scale.shape[1] != input.shape[1]:
        raise ValueError(f"scale has shape {scale.shape}, but input has H = {input.shape[1]}: "
                         f"it must be [L, {input.shape[1]}]")
    if scale.shape[0] == 0:
        raise ValueError("scale and bias must hold at least one layer, not 0")
    if relu not in (0, 1, False, True):
        raise ValueError(f"relu must be 0 or 1, not {relu!r}")
    layers = scale.shape[0]
    zero = np.zeros((), dtype=input.dtype)
    activations = [input]
    for layer in range(layers - 1):
        activations.append(affine_layer(activations[-1], {"scale": scale[layer],
                                                          "bias": bias[layer]}, relu))
    grad_scale = np.zeros(scale.shape, dtype=input.dtype)
    grad_bias = np.zeros(scale.shape, dtype=input.dtype)
    grad = grad_output
    for layer in reversed(range(layers)):
        h = activations[layer]
        if relu:
            out = affine_layer(h, {"scale": scale[layer], "bias": bias[layer]}, relu=True)
            with np.errstate(invalid="ignore"):
                grad = np.where(out == 0, zero, grad)
        grad_bias[layer] = token_sum(grad)
        grad_scale[layer] = token_sum(mul(grad, h))
        grad = mul(grad, scale[layer])
    return grad, grad_scale, grad_bias
