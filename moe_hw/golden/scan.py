"""Golden models of scan and scan_layers (SPEC 1.7; PyTorch/XLA, JAX ``lax.scan``; seed 003).

Hardware: one instance of the step (or layer) datapath, a carry register, and a parameter
memory of depth L indexed by a loop counter.
"""

import numpy as np

from ._common import add, mul

__all__ = ["scan", "scan_layers", "stack_layer_params", "prefix_sum", "affine_layer"]


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


def affine_layer(h, params, relu=False):
    """The layer of the ``scan_layers`` units: ``relu?(scale * h + bias)`` elementwise, in the
    format of ``h``: the product rounded, then the sum rounded (no FMA). ``params`` holds
    ``scale`` and ``bias`` (broadcast against ``h``). relu keeps a NaN and a positive value
    and gives +0 for anything else (-0 included).

    ``scan_layers(lambda h, p: affine_layer(h, p, relu), {"scale": a, "bias": b}, h)`` with
    ``a``, ``b`` [L, H] and ``h`` [S, H] is the units' golden model.
    """
    h = np.asarray(h)
    y = add(mul(h, params["scale"]), params["bias"])
    if relu:
        y = np.where(np.isnan(y) | (y > 0), y, np.zeros((), dtype=y.dtype))
    return y
