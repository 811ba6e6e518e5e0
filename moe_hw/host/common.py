"""Checks shared by the host-side runners."""

import numpy as np

from ..formats import format_of_dtype
from ..golden._common import check_count, float_array, routing_arrays, same_dtype

__all__ = ["HostError", "format_of", "routing", "need", "runtime_int"]


class HostError(ValueError):
    """A tensor or run-time size handed to the hardware is unusable (names the argument)."""


def format_of(array):
    """The format name (fp32, fp16, bf16) of a float array's dtype."""
    try:
        return format_of_dtype(np.asarray(array).dtype).name
    except TypeError as error:
        raise HostError(str(error)) from None


def routing(gates, indices, locations, input, *, num_experts, capacity):
    """Validate a dispatch-style problem as the golden model does; return it with the routing
    arrays viewed as [k, S]."""
    num_experts = check_count("num_experts", num_experts)
    capacity = check_count("capacity", capacity)
    indices, locations, gates = routing_arrays(indices, locations, gates)
    input = float_array("input", input, ndim=2, what="[S, H]")
    if input.shape[0] != indices.shape[1]:
        raise HostError(f"input has {input.shape[0]} rows, but indices has S = "
                        f"{indices.shape[1]} tokens")
    same_dtype("gates", gates, "input", input)
    return gates, indices, locations, input, num_experts, capacity


def need(inputs, unit, keys):
    """The arrays ``keys`` of an npz dict, or an error naming the missing ones."""
    missing = [key for key in keys if key not in inputs]
    if missing:
        raise HostError(f"the input file for {unit} lacks {', '.join(missing)} "
                        f"(it needs {', '.join(keys)})")
    return [inputs[key] for key in keys]


def runtime_int(name, runtime, inputs):
    """A run-time size from ``--set`` (``runtime``) or a scalar in the npz."""
    if name in runtime:
        value = runtime[name]
    elif name in inputs:
        value = inputs[name].item() if np.ndim(inputs[name]) == 0 else None
    else:
        raise HostError(f"run-time value {name} is missing: give --set {name}=N or a scalar "
                        f"'{name}' in the input file")
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise HostError(f"{name} must be a non-negative integer, not {value!r}")
    return int(value)
