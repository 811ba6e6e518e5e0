"""The host's checks, one helper per kind: of a user's tensors and run-time values before a
run (each error names the argument and the value), and of a run's results after it."""

import numpy as np

from ..formats import FORMATS, bits_equal, format_of_dtype, to_bits
from ..golden._common import check_count, float_array, routing_arrays, same_dtype

__all__ = ["MEMORY_LATENCY", "MAX_MEMORY_LATENCY", "memory_latency", "HostError", "format_of", "routing", "check_keys",
           "check_stall_seed", "need", "runtime_int", "check_maxima",
           "check_fits_field", "check_dtype", "compare_bits", "compare_values",
           "compare_log", "check_count"]


class HostError(ValueError):
    """A tensor or run-time size handed to the hardware is unusable (names the argument)."""


# ---- before a run --------------------------------------------------------------------------

def format_of(array, name=None):
    """The format name (fp32, fp16, bf16) of a float array's dtype; ``name``: the argument,
    for the error."""
    try:
        return format_of_dtype(np.asarray(array).dtype).name
    except TypeError as error:
        raise HostError(f"{name}: {error}" if name else str(error)) from None


def check_dtype(params_format, **arrays):
    """Every array has the dtype of the unit's ``format``."""
    fmt = FORMATS[params_format]
    for name, array in arrays.items():
        if np.asarray(array).dtype != fmt.dtype:
            raise HostError(f"{name} has dtype {np.asarray(array).dtype}, but the unit's format "
                            f"is {fmt.name} ({fmt.dtype})")


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


def check_keys(inputs, unit, keys, optional=(), runtime=()):
    """The input file holds only the arrays ``keys`` and ``optional`` and the run-time scalars
    ``runtime``: an unknown (extra or misspelled) key is an error naming it and the known
    ones, rather than an input silently left out."""
    if not hasattr(inputs, "keys"):
        raise HostError(f"the inputs of {unit} must be a dict of arrays (npz keys), not "
                        f"{type(inputs).__name__}")
    known = [*keys, *optional, *runtime]
    unknown = [key for key in inputs if key not in known]
    if unknown:
        missing = [key for key in keys if key not in inputs]
        lacks = f"; it lacks {', '.join(missing)}" if missing else ""
        raise HostError(f"the input file for {unit} has unknown key(s) "
                        f"{', '.join(map(repr, unknown))}{lacks} (its keys: "
                        f"{', '.join(keys)}; optional: {', '.join(optional) or 'none'}; "
                        f"run-time scalars: {', '.join(runtime) or 'none'})")


def check_stall_seed(stall, seed):
    """A run's pause probability (a number in [0, 1)) and seed (a non-negative integer)."""
    if isinstance(stall, (bool, np.bool_)) or not isinstance(stall, (int, float, np.integer,
                                                                     np.floating)) \
            or not 0.0 <= float(stall) < 1.0:
        raise HostError(f"stall must be a probability in [0, 1), not {stall!r}")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) \
            or seed < 0:
        raise HostError(f"seed must be a non-negative integer, not {seed!r}")


def need(inputs, unit, keys):
    """The arrays ``keys`` of an npz dict, or an error naming the missing ones."""
    missing = [key for key in keys if key not in inputs]
    if missing:
        raise HostError(f"the input file for {unit} lacks {', '.join(missing)} "
                        f"(it needs {', '.join(keys)})")
    return [inputs[key] for key in keys]


def runtime_int(name, runtime, inputs, default=None):
    """A run-time size from ``--set`` (``runtime``) or a scalar in the npz."""
    if name in runtime:
        value = runtime[name]
    elif name in inputs and np.ndim(inputs[name]) == 0:
        value = inputs[name].item()
    elif default is not None:
        value = default
    else:
        raise HostError(f"run-time value {name} is missing: give --set {name}=N or a scalar "
                        f"'{name}' in the input file")
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise HostError(f"{name} must be a non-negative integer, not {value!r}")
    return int(value)


#: The bench memory models' default latency: a request taken at the end of cycle u is
#: answered from cycle u + ``memory_latency``.
MEMORY_LATENCY = 2
#: The longest latency the memory models take: far beyond a DRAM's, and short enough that a
#: run's cycle limit (a hang check) stays meaningful.
MAX_MEMORY_LATENCY = 4096


def memory_latency(runtime, inputs):
    """The run-time ``memory_latency`` of the bench's memory models (1 to
    :data:`MAX_MEMORY_LATENCY`), :data:`MEMORY_LATENCY` by default."""
    latency = runtime_int("memory_latency", runtime, inputs, default=MEMORY_LATENCY)
    if latency < 1:
        raise HostError(f"memory_latency must be at least 1, not {latency}")
    if latency > MAX_MEMORY_LATENCY:
        raise HostError(f"memory_latency must be at most {MAX_MEMORY_LATENCY} cycles, not "
                        f"{latency}")
    return latency


def check_maxima(params, **sizes):
    """Each run-time size ``name=(value, maximum parameter name)`` fits the unit."""
    for name, (value, maximum_name) in sizes.items():
        maximum = getattr(params, maximum_name)
        if value > maximum:
            raise HostError(f"{name} = {value} exceeds the unit's {maximum_name} of {maximum}")


def check_fits_field(name, array, width, param_name="index_width"):
    """Every value of ``array`` fits a signed field of ``width`` bits."""
    array = np.asarray(array)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    bad = np.flatnonzero((array < lo) | (array > hi))
    if bad.size:
        raise HostError(f"{name}.flat[{bad[0]}] = {array.flat[bad[0]]} does not fit the "
                        f"{width}-bit header field ({param_name})")


# ---- after a run ---------------------------------------------------------------------------

def compare_bits(what, got, want, fmt):
    """Findings (a list) where the float arrays ``got`` and ``want`` differ bit for bit (any
    NaN equals any NaN; +0 and -0 differ): the count and the first place."""
    got_bits, want_bits = to_bits(got, fmt), to_bits(want, fmt)
    if got_bits.shape != want_bits.shape:
        return [f"{what}: shape {got_bits.shape}, golden {want_bits.shape}"]
    bad = np.argwhere(~bits_equal(got_bits, want_bits, fmt))
    if not bad.size:
        return []
    where = tuple(int(i) for i in bad[0])
    return [f"{what}: {len(bad)} elements differ from golden; first at {list(where)}: "
            f"got {got_bits[where]:#x}, want {want_bits[where]:#x}"]


def compare_values(what, got, want):
    """Findings where the integer arrays (or scalars) ``got`` and ``want`` differ."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return [f"{what}: shape {got.shape}, golden {want.shape}"]
    if got.ndim == 0:
        return [] if got == want else [f"{what} = {got}, golden {want}"]
    bad = np.argwhere(got != want)
    if not bad.size:
        return []
    where = tuple(int(i) for i in bad[0])
    return [f"{what}: {len(bad)} values differ from golden; first at {list(where)}: "
            f"got {got[where]}, want {want[where]}"]


def compare_log(what, got, want, fmt=None):
    """Findings where a log of beats (dict of equal-length arrays, e.g. addr / enable / data)
    differs from the expected log: a count mismatch (lost or duplicated beats) or the first
    beat that differs (reordered or wrong). ``fmt``: compare ``data`` as float bits."""
    names = list(want)
    count, expected = len(got[names[0]]), len(want[names[0]])
    if count != expected:
        return [f"{what}: {count} beats, expected {expected} (lost or duplicated)"]
    for name in names:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        same = bits_equal(g, w, fmt) if (fmt is not None and name == "data") else g == w
        bad = np.flatnonzero(~same.reshape(expected, -1).all(axis=1)) if expected else []
        if len(bad):
            beat = bad[0]
            if g[beat].ndim:                # a row of lanes: name the first lane that differs
                lane = int(np.flatnonzero(~same.reshape(expected, -1)[beat])[0])
                return [f"{what} beat {beat}: {name} lane {lane} got "
                        f"{int(g[beat].reshape(-1)[lane]):#x}, expected "
                        f"{int(w[beat].reshape(-1)[lane]):#x} (reordered or wrong; beat "
                        f"{g[beat]} != expected {w[beat]})"]
            return [f"{what} beat {beat}: {name} {g[beat]} != expected {w[beat]} "
                    "(reordered or wrong)"]
    return []
