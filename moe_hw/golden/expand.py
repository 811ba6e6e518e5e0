"""Golden models of expand and repeat (SPEC 1.6; OneFlow, seed 002).

The hardware is an N-D stride address generator: output element (x0, .., xn), visited in C
order, reads ``input_flat[sum_d x_d * out_stride[d]]``, where ``out_stride[d]`` is the input's
contiguous stride for a kept dim and 0 for a broadcast or new dim.

Rules for ``expand_size`` against ``input_shape`` (aligned at the right):
- a new dim (in front of the input's dims) must be >= 1, and may not be -1;
- an input dim of size 1 may be expanded to any size >= 1, or kept (1 or -1);
- any other input dim may only be kept (its size or -1).
"""

import operator
from typing import NamedTuple

import numpy as np

from ._common import add, check_count, float_array

__all__ = ["expand", "expand_backward", "expand_backward_hw", "expand_backward_banks",
           "backward_mode", "BACKWARD_MODES", "merged_dims", "repeat", "expand_strides",
           "physical_expand", "PhysicalExpand", "contiguous_strides"]


def _sizes(name, sizes):
    try:
        sizes = list(sizes)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of integers, not {sizes!r}") from None
    for d, size in enumerate(sizes):
        if isinstance(size, (bool, np.bool_)):
            raise TypeError(f"{name}[{d}] must be an integer, not {size!r}")
        try:
            sizes[d] = operator.index(size)
        except TypeError:
            raise TypeError(f"{name}[{d}] must be an integer, not {size!r}") from None
    return sizes


def _shape(name, shape):
    shape = _sizes(name, shape)
    for d, size in enumerate(shape):
        if size < 0:
            raise ValueError(f"{name}[{d}] must be a non-negative size, not {size}")
    return shape


def contiguous_strides(shape):
    """The element strides of a C-contiguous array of ``shape``: [6, 3, 4, 5] -> [60, 20, 5, 1]."""
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return strides


def _plan(input_shape, expand_size):
    """``(output_shape, out_stride)`` of an expand, or an error naming the offending dim."""
    input_shape = _shape("input_shape", input_shape)
    expand_size = _sizes("expand_size", expand_size)
    new = len(expand_size) - len(input_shape)
    if new < 0:
        raise ValueError(f"expand_size must have at least as many dims as the input "
                         f"({len(input_shape)}), not {len(expand_size)}")
    strides = contiguous_strides(input_shape)
    output_shape, out_stride = [], []
    for d, size in enumerate(expand_size):
        if d < new:
            if size < 1:
                raise ValueError(f"expand_size[{d}] is a new dim and must be >= 1, not {size}")
            output_shape.append(size)
            out_stride.append(0)
            continue
        in_size = input_shape[d - new]
        if size == -1 or size == in_size:
            output_shape.append(in_size)
            out_stride.append(strides[d - new])
        elif in_size == 1 and size >= 1:
            output_shape.append(size)
            out_stride.append(0)
        elif in_size == 1:
            raise ValueError(f"expand_size[{d}] must be >= 1 or -1 (input dim {d - new} has "
                             f"size 1), not {size}")
        else:
            raise ValueError(f"expand_size[{d}] must be {in_size} or -1 (input dim {d - new} "
                             f"has size {in_size} and can only be kept), not {size}")
    return output_shape, out_stride


def expand_strides(input_shape, expand_size):
    """``out_stride``, a list of ints.

    Example (seed 002): input [4, 1, 3, 5] by [2, 1, 4, 4, 3, 5] gives [0, 0, 15, 0, 5, 1].
    """
    return _plan(input_shape, expand_size)[1]


def _addresses(output_shape, out_stride):
    """The input address of every output element, in C order: the address generator."""
    if not output_shape:  # a 0-dim tensor: one element at address 0
        return np.zeros(1, dtype=np.int64)
    coords = np.indices(output_shape, dtype=np.int64).reshape(len(output_shape), -1)
    return np.asarray(out_stride, dtype=np.int64) @ coords


def expand(input, expand_size):
    """``output[x] = input_flat[sum_d x_d * out_stride[d]]``; any dtype (elements are copied)."""
    input = np.asarray(input)
    output_shape, out_stride = _plan(input.shape, expand_size)
    return input.reshape(-1)[_addresses(output_shape, out_stride)].reshape(output_shape)


def expand_backward(grad_output, input_shape, expand_size):
    """``input_grad_flat[addr(x)] += grad_output[x]`` for every output element x in C order.

    ``input_grad`` starts as +0.0 in the format of ``grad_output``; each input element adds its
    contributions in the C order of the output elements that read it, rounding after each
    addition (+0.0 + -0.0 = +0.0).
    """
    output_shape, out_stride = _plan(input_shape, expand_size)
    grad_output = float_array("grad_output", grad_output)
    if list(grad_output.shape) != output_shape:
        raise ValueError(f"grad_output must have the expanded shape {tuple(output_shape)}, "
                         f"not {grad_output.shape}")
    input_shape = _shape("input_shape", input_shape)
    input_grad = np.zeros(int(np.prod(input_shape)), dtype=grad_output.dtype)
    if input_grad.size:
        # Every input element is read by the same number of output elements; a stable sort by
        # address lists each element's readers in output order, one row per element.
        addresses = _addresses(output_shape, out_stride)
        readers = np.argsort(addresses, kind="stable").reshape(input_grad.size, -1)
        grads = grad_output.reshape(-1)[readers]
        for r in range(readers.shape[1]):
            input_grad = add(input_grad, grads[:, r])
    return input_grad.reshape(input_shape)


def merged_dims(output_shape, out_stride):
    """The address dims of an expand, ``[(size, stride), ...]`` outermost first: the size-1
    dims dropped, and neighbouring dims that are one run of addresses merged (a dim
    ``(s0, t0)`` followed by ``(s, t)`` with ``t0 == s*t``: a kept dim over a contiguous kept
    dim, or two broadcast dims). Kept and broadcast dims then alternate. An empty output has
    no dims. Example: [2, 1, 4, 4, 3, 5] with strides [0, 0, 15, 0, 5, 1] gives
    [(2, 0), (4, 15), (4, 0), (15, 1)]."""
    merged = []
    walk = zip(output_shape, out_stride) if int(np.prod(output_shape, dtype=np.int64)) else ()
    for s, t in walk:
        if s == 1:
            continue
        if merged and merged[-1][1] == s * t:
            merged[-1] = (merged[-1][0] * s, t)
        else:
            merged.append((s, t))
    return merged


#: The backward unit's modes, by their code on its ``mode`` port.
BACKWARD_MODES = ("elements", "reduce", "rows", "stream")


def backward_mode(output_shape, out_stride, lanes, banks=None):
    """How the backward unit takes the output gradient, from the address dims
    ``[.., (s0, t0)]`` (:func:`merged_dims`):

    ``"reduce"``
        a broadcast innermost dim (t0 = 0) with ``s0 % lanes == 0``: every lane of a beat
        goes to the same input element, so a beat is one item, the pairwise sum of its lanes;
    ``"rows"``
        a kept innermost dim (t0 = 1) with ``s0 % lanes == 0``: lane j of a beat goes to input
        element ``a + j``, a a multiple of ``lanes``, so a beat is one item, a row of
        ``lanes`` elements;
    ``"stream"``
        ``"rows"`` where the whole input is one kept run under at most one broadcast dim
        (dims ``[(s0, 1)]`` or ``[(s1, 0), (s0, 1)]``: a repeat of whole rows, a row
        broadcast over tokens) and a pass over it is at least ``banks`` items
        (``s0 / lanes >= banks``; only when ``banks``, the unit's G, is given): a row is
        added to again only a whole pass later, so one bank holds the sum without a hazard,
        and the last pass is the last ``s0 / lanes`` items, in row order: each row leaves as
        soon as its last item is added, with no drain;
    ``"elements"``
        anything else (a beat's lanes go to several, possibly repeated, elements): every
        output element is an item of its own.
    """
    dims = merged_dims(output_shape, out_stride)
    if not dims or dims[-1][0] % lanes:
        return "elements"
    if dims[-1][1] == 0:
        return "reduce"
    # Kept and broadcast dims alternate: two dims ending in a kept one are [broadcast, kept].
    if banks is not None and len(dims) <= 2 and dims[-1][0] // lanes >= banks:
        return "stream"
    return "rows"


def expand_backward_banks(adder_latency):
    """G, the backward unit's accumulator banks: item k adds into bank ``k % G``. A bank's
    read-modify-write takes the memory's two-cycle read, the adder and the write, so the
    same bank is read again only after its last write has landed: ``G = adder_latency + 3``."""
    return check_count("adder_latency", adder_latency, minimum=1) + 3


def _pairwise(values):
    """The fixed pairwise tree over the last axis (a power of two): while more than one
    remains, ``p[m] = p[2m] + p[2m + 1]``, rounding after each addition."""
    while values.shape[-1] > 1:
        values = add(values[..., 0::2], values[..., 1::2])
    return values[..., 0]


def expand_backward_hw(grad_output, input_shape, expand_size, lanes, adder_latency):
    """:func:`expand_backward` in exactly the hardware's summation order (the unit
    ``expand_backward`` with ``lanes`` lanes and an adder of latency ``adder_latency``).

    1. The output gradient, flat in C order, becomes a sequence of items k = 0, 1, .. by the
       :func:`backward_mode`: in ``"reduce"`` mode item k is beat k (elements ``k*lanes`` ..
       ``k*lanes + lanes - 1``, all read from one input element), its value the fixed
       pairwise tree over its lanes (``p[m] = p[2m] + p[2m + 1]``); in ``"rows"`` mode item
       k is beat k, lane j adding to input element ``a_k + j``; in ``"elements"`` mode item
       k is output element k.
    2. G = :func:`expand_backward_banks` ``(adder_latency)`` banks each hold a partial
       ``input_grad``, starting at +0.0: item k adds into bank ``k % G``, each element in
       item order, rounding after each addition.
    3. the banks are summed in pairs, and the pairs in order: ``input_grad = ((+0.0 +
       (bank_0 + bank_1)) + (bank_2 + bank_3)) + ..``, rounding after each addition (when
       G is odd the last pair is ``bank_{G-1} + +0.0``).

    In ``"stream"`` mode (:func:`backward_mode` with G) the items are rows as in ``"rows"``
    and there is one bank, which is the result: each element sums its contributions in
    output order from +0.0, the order of :func:`expand_backward`.

    Every addition rounds to nearest even in the format of ``grad_output`` (+0.0 + -0.0 =
    +0.0). With integer-valued data small enough to be exact, every order gives the bits of
    :func:`expand_backward`.
    """
    lanes = check_count("lanes", lanes, minimum=1)
    if lanes > 16 or lanes & (lanes - 1):
        raise ValueError(f"lanes must be a power of two from 1 to 16, not {lanes}")
    banks = expand_backward_banks(adder_latency)
    output_shape, out_stride = _plan(input_shape, expand_size)
    grad_output = float_array("grad_output", grad_output)
    if list(grad_output.shape) != output_shape:
        raise ValueError(f"grad_output must have the expanded shape {tuple(output_shape)}, "
                         f"not {grad_output.shape}")
    input_shape = _shape("input_shape", input_shape)
    n_in = int(np.prod(input_shape, dtype=np.int64))
    grads = grad_output.reshape(-1)
    addresses = _addresses(output_shape, out_stride)[:grads.size]
    mode = backward_mode(output_shape, out_stride, lanes, banks)
    if mode == "stream":
        banks = 1
    if mode == "elements":
        item_addr, item_value = addresses[:, None], grads[:, None]
    elif mode == "reduce":
        item_addr = addresses[::lanes, None]
        item_value = _pairwise(grads.reshape(-1, lanes))[:, None]
    else:
        item_addr, item_value = addresses.reshape(-1, lanes), grads.reshape(-1, lanes)
    partial = np.zeros((banks, max(1, n_in)), dtype=grad_output.dtype)
    # Items k .. k + G - 1 add into different banks, and an item's elements are distinct:
    # each chunk of G items is one vectorised addition.
    for first in range(0, len(item_addr), banks):
        addr = item_addr[first:first + banks]
        bank = np.arange(len(addr))[:, None]
        partial[bank, addr] = add(partial[bank, addr], item_value[first:first + banks])
    if mode == "stream":
        return partial[0, :n_in].reshape(input_shape)
    if banks % 2:
        partial = np.concatenate([partial, np.zeros_like(partial[:1])])
    input_grad = np.zeros(max(1, n_in), dtype=grad_output.dtype)
    for s in range(0, banks, 2):
        input_grad = add(input_grad, add(partial[s], partial[s + 1]))
    return input_grad[:n_in].reshape(input_shape)


def _repeat_plan(input_shape, repeat_size):
    """``(input_reshape, expand_size, output_shape)`` of repeat as reshape + expand + reshape.

    The seed's mapping, from the last dim backwards: a dim repeated r > 1 times whose input
    size n is not 1 becomes two dims (1, n) expanded to (r, n) and merged back into r * n; a
    dim of size 1 is expanded to r; a dim repeated once is kept; a new dim is expanded to r.
    """
    input_shape = _shape("input_shape", input_shape)
    repeat_size = _sizes("repeat_size", repeat_size)
    new = len(repeat_size) - len(input_shape)
    if new < 0:
        raise ValueError(f"repeat_size must have at least as many dims as the input "
                         f"({len(input_shape)}), not {len(repeat_size)}")
    input_reshape, expand_size, output_shape = [], [], []
    for d, r in enumerate(repeat_size):
        if r < 1:
            raise ValueError(f"repeat_size[{d}] must be >= 1, not {r}")
        if d < new:
            expand_size.append(r)
            output_shape.append(r)
            continue
        n = input_shape[d - new]
        if r > 1 and n != 1:
            input_reshape += [1, n]
            expand_size += [r, n]
        else:
            input_reshape.append(n)
            expand_size.append(r if r > 1 else n)
        output_shape.append(n * r)
    return input_reshape, expand_size, output_shape


def repeat(input, repeat_size):
    """Tile ``input`` ``repeat_size[d]`` times along every dim (new dims in front), like np.tile.

    Built exactly as the hardware runs it: reshape, expand, reshape.
    """
    input = np.asarray(input)
    input_reshape, expand_size, output_shape = _repeat_plan(input.shape, repeat_size)
    return expand(input.reshape(input_reshape), expand_size).reshape(output_shape)


class PhysicalExpand(NamedTuple):
    """What one of P parallel expand units runs with (all sizes resolved, no -1)."""
    input_shape: list
    expand_size: list
    out_stride: list


def physical_expand(input_shape, expand_size, split_dim, parts):
    """Per-unit expand plans when the input is split along ``split_dim`` over ``parts`` units.

    OneFlow SBP ``split(split_dim)``: unit p holds a contiguous slice of input dim
    ``split_dim``, the first ``size % parts`` units one element longer (OneFlow's balanced
    split). Each unit's expand_size is its physical output shape and its out_stride is
    recomputed from its physical input shape; the units' outputs, concatenated along the
    corresponding output dim, form the logical output. The split dim may not be a broadcast
    one (that would replicate, not split, the output).

    Example (seed 002): input [4, 3, 1, 2], expand_size [2, 4, 3, 4, 2], split_dim 3, 2 parts:
    each unit gets input [4, 3, 1, 1], expand_size [2, 4, 3, 4, 1], out_stride [0, 3, 1, 0, 1].
    """
    output_shape, out_stride = _plan(input_shape, expand_size)
    input_shape = _shape("input_shape", input_shape)
    parts = check_count("parts", parts, minimum=1)
    split_dim = check_count("split_dim", split_dim)
    if split_dim >= len(input_shape):
        raise ValueError(f"split_dim must be an input dim, 0 to {len(input_shape) - 1}, "
                         f"not {split_dim}")
    out_dim = split_dim + len(output_shape) - len(input_shape)
    if input_shape[split_dim] == 1 and output_shape[out_dim] != 1:
        raise ValueError(f"split_dim {split_dim} is broadcast by expand_size[{out_dim}] = "
                         f"{output_shape[out_dim]}; only a kept dim can be split")
    size = input_shape[split_dim]
    plans = []
    for p in range(parts):
        physical_input = list(input_shape)
        physical_input[split_dim] = size // parts + (p < size % parts)
        physical_size = list(output_shape)
        physical_size[out_dim] = physical_input[split_dim]
        plans.append(PhysicalExpand(physical_input, physical_size,
                                    expand_strides(physical_input, physical_size)))
    return plans
