"""The scan_layers unit's declaration and host adapter: L layers ``h = relu?(scale[l] * h +
bias[l])`` on one layer datapath (SPEC 1.7, seed 003), checked bit for bit against
``golden.scan_layers(golden.affine_layer, ...)``.

npz inputs: ``input`` [S, H], ``scale`` [L, H], ``bias`` [L, H] (one dtype: float32,
float16, bfloat16 or int8, which picks the format; int8 layers saturate, see
``golden.affine_layer``); run-time ``relu`` (0 or 1, ``--set`` or an npz scalar; default 0).
Output: ``output`` [S, H], in the input's dtype. A list of per-layer parameter dicts is
stacked with :func:`stack_layers` (layers differing in names, shapes or dtypes are rejected,
as ``golden.stack_layer_params`` does).
"""

import numpy as np

from .. import golden
from ..flows.fastsim import FastBench, Sink, Source, lane_beats
from ..formats import FORMATS, from_bits, to_bits
from ..golden.testing import random_floats
from ..units.scan_layers import (INT_FORMATS, LAYER_FORMATS, ScanLayersParams, ScanLayersUnit,
                                 layer_dtype)
from .checks import HostError, check_maxima, compare_bits, compare_values, need, runtime_int
from .unit import Unit

__all__ = ["UNIT", "ScanLayers", "stack_layers", "scan_layers_golden"]


def stack_layers(layers):
    """``(scale [L, H], bias [L, H])`` from a list of per-layer dicts ``{"scale", "bias"}``,
    through ``golden.stack_layer_params`` (its structure errors become HostErrors)."""
    try:
        stacked = golden.stack_layer_params(layers)
    except (TypeError, ValueError) as error:
        raise HostError(str(error)) from None
    if sorted(stacked) != ["bias", "scale"]:
        raise HostError(f"a layer must have the parameters ['bias', 'scale'], not "
                        f"{sorted(stacked)}")
    return stacked["scale"], stacked["bias"]


def scan_layers_golden(input, scale, bias, relu):
    """The golden model of both units: ``golden.scan_layers`` with ``golden.affine_layer``."""
    return golden.scan_layers(lambda h, params: golden.affine_layer(h, params, relu),
                              {"scale": scale, "bias": bias}, input)


def layer_format(name, array, formats=LAYER_FORMATS):
    """The format (of ``formats``) that the dtype of npz array ``name`` picks."""
    for format in formats:
        if array.dtype == layer_dtype(format):
            return format
    dtypes = [str(layer_dtype(format)) for format in formats]
    raise HostError(f"{name} must have dtype {', '.join(dtypes[:-1])} or {dtypes[-1]}, not "
                    f"{array.dtype}")


def check_layer_dtype(params, **arrays):
    """Every array has the dtype of the unit's ``format``."""
    want = layer_dtype(params.format)
    for name, array in arrays.items():
        if np.asarray(array).dtype != want:
            raise HostError(f"{name} has dtype {np.asarray(array).dtype}, but the unit's "
                            f"format is {params.format} ({want})")


def element_bits(array, format):
    """The raw bit patterns of ``array`` in ``format`` as unsigned integers."""
    if format in INT_FORMATS:
        array = np.ascontiguousarray(np.asarray(array).astype(layer_dtype(format)))
        return array.view(f"uint{INT_FORMATS[format]}")
    return to_bits(array, format)


def bits_to_elements(bits, format):
    """The values of ``format`` whose raw bit patterns are ``bits``."""
    if format in INT_FORMATS:
        width = INT_FORMATS[format]
        return np.ascontiguousarray(np.asarray(bits).astype(f"uint{width}")).view(f"int{width}")
    return from_bits(bits, format)


def compare_elements(what, got, want, format):
    """Findings where ``got`` and ``want`` differ: values for an integer format, bit patterns
    (any NaN equals any NaN) for a float one."""
    if format in INT_FORMATS:
        return compare_values(what, got, want)
    return compare_bits(what, got, want, FORMATS[format])


def layer_problem(unit, inputs, runtime):
    """A scan_layers unit's checked npz arrays and run-time values: ``input`` [S, H], ``scale``
    and ``bias`` [L, H], and any further inputs of ``unit.inputs`` as [S, H] arrays (the
    backward pass's ``grad_output``), all of one dtype of ``unit.formats``; ``relu`` 0 or
    1."""
    arrays = {name: np.asarray(array)
              for name, array in zip(unit.inputs, need(inputs, unit.name, unit.inputs))}
    input, scale, bias = arrays["input"], arrays["scale"], arrays["bias"]
    streams = [name for name in arrays if name not in ("input", "scale", "bias")]
    for name, array in arrays.items():
        what = "[L, H]" if name in ("scale", "bias") else "[S, H]"
        if array.ndim != 2:
            raise HostError(f"{name} must have 2 dimensions {what}, not shape {array.shape}")
        layer_format(name, array, unit.formats)
    for name, array in arrays.items():
        if name != "input" and array.dtype != input.dtype:
            raise HostError(f"{name} has dtype {array.dtype}, but input has {input.dtype}; "
                            "they must match (the dtype picks the format)")
    for name in streams:
        if arrays[name].shape != input.shape:
            raise HostError(f"{name} has shape {arrays[name].shape}, but input has shape "
                            f"{input.shape}; they must match ([S, H])")
    if scale.shape[0] != bias.shape[0]:
        raise HostError(f"scale has {scale.shape[0]} layers but bias has {bias.shape[0]}; "
                        "every layer must have both (layers must have the same structure)")
    for name, array in (("scale", scale), ("bias", bias)):
        if array.shape[1] != input.shape[1]:
            raise HostError(f"{name} has shape {array.shape}, but input has H = "
                            f"{input.shape[1]}: it must be [L, {input.shape[1]}]")
    if scale.shape[0] == 0:
        raise HostError("scale and bias must hold at least one layer, not 0 (as "
                        "golden.stack_layer_params)")
    relu = runtime_int("relu", runtime, inputs, default=0)
    if relu not in (0, 1):
        raise HostError(f"relu must be 0 or 1, not {relu}")
    return {**arrays, "relu": relu, "tokens": input.shape[0], "hidden": input.shape[1],
            "layers": scale.shape[0]}


class ScanLayers(Unit):
    name = "scan_layers"
    summary = ("PyTorch/XLA scan_layers: L layers relu?(a_l * h + b_l) on ONE layer datapath, "
               "a parameter memory of depth L and a loop counter (SPEC 1.7)")
    golden = "golden.scan_layers(golden.affine_layer)"
    params = ScanLayersParams
    inputs = ("input", "scale", "bias")
    outputs = ("output",)
    runtime = ("relu",)
    ideal = "one layer-beat per cycle: S*L*ceil(H/lanes)"
    bench = "bench_scan_layers"
    #: The formats the npz dtypes may pick.
    formats = LAYER_FORMATS
    #: The run-time values driven on the unit's ports.
    ports = ("tokens", "hidden", "layers", "relu")

    def build(self, params):
        return ScanLayersUnit(params)

    def problem(self, inputs, runtime):
        return layer_problem(self, inputs, runtime)

    def smallest(self, problem):
        return dict(max_tokens=max(1, problem["tokens"]), max_hidden=max(1, problem["hidden"]),
                    max_layers=problem["layers"])

    def params_for(self, problem, settings):
        settings = {"format": layer_format("input", problem["input"]), **settings}
        params = self.sized(settings, **self.smallest(problem))
        self.fits(problem, params)
        return params

    def fits(self, problem, params):
        check_layer_dtype(params, input=problem["input"], scale=problem["scale"],
                          bias=problem["bias"])
        check_maxima(params, tokens=(problem["tokens"], "max_tokens"),
                     hidden=(problem["hidden"], "max_hidden"),
                     layers=(problem["layers"], "max_layers"))

    def beats(self, problem, params):
        return -(-problem["hidden"] // params.lanes)

    def lane_bits(self, array, params):
        """``array`` [R, H] as bit patterns [R * B, lanes] (beats, zero padded)."""
        return lane_beats(element_bits(array, params.format), params.lanes)

    def pack(self, problem, params, *, stall, seed):
        self.fits(problem, params)
        stimulus = {name: self.lane_bits(problem[name], params)
                    for name in ("input", "scale", "bias")}
        runtime = {name: problem[name] for name in self.ports}
        empty = not (problem["tokens"] and problem["hidden"])
        beats = 0 if empty else problem["tokens"] * self.beats(problem, params)
        return stimulus, {"lanes": params.lanes, "width": params.width, "runtime": runtime,
                          "feed": not empty, "work": beats * problem["layers"]
                          + len(stimulus["scale"])}

    def fast(self, stimulus, settings):
        """sim/bench_scan_layers.py on the fast path: the same streams and results."""
        feed = settings["feed"]
        layers = {name: stimulus[name][:len(stimulus[name]) if feed else 0]
                  for name in ("scale", "bias")}
        beats = stimulus["input"][:len(stimulus["input"]) if feed else 0]
        return FastBench(
            streams={"layer_params": Source(layers), "input": Source({"data": beats}),
                     "output": Sink(depth=2 * len(beats) + 16)},
            sizes=settings["runtime"],
            results={"data": "output.data", "params_taken": "layer_params.sent",
                     "input_taken": "input.sent", "error": "error", "busy_after": "busy"},
            limit=40 * settings["work"] + 2000, what="scan_layers")

    def unpack(self, problem, params, results):
        tokens, hidden = problem["tokens"], problem["hidden"]
        data = np.asarray(results["data"], dtype=np.uint64)
        if not (tokens and hidden):
            return {"output": np.zeros((tokens, hidden), dtype=params.dtype)}
        if data.shape[0] != tokens * self.beats(problem, params):   # scored as lost beats
            return {"output": np.zeros((0, hidden), dtype=params.dtype)}
        return {"output": bits_to_elements(data.reshape(tokens, -1)[:, :hidden],
                                           params.format)}

    def score(self, problem, params, outputs, results):
        want = scan_layers_golden(problem["input"], problem["scale"], problem["bias"],
                                  problem["relu"])
        findings = compare_elements("output", outputs["output"], want, params.format)
        beats = problem["tokens"] * self.beats(problem, params) if problem["hidden"] else 0
        got = len(results["data"])
        if got != beats:
            findings.append(f"output: {got} beats, expected {beats} (lost or duplicated)")
        layer_beats = problem["layers"] * self.beats(problem, params) if beats else 0
        for name, taken, expected in (("input", results["input_taken"], beats),
                                      ("layer parameter", results["params_taken"],
                                       layer_beats)):
            if int(taken) != expected:
                findings.append(f"{int(taken)} {name} beats taken, expected {expected}")
        if int(results["error"]):
            findings.append("the unit raised error")
        if int(results["busy_after"]):
            findings.append("the unit is still busy after done")
        return findings

    def ideal_cycles(self, problem, params):
        return problem["tokens"] * problem["layers"] * self.beats(problem, params)

    def cycles(self, problem, params):
        return params.cycles(problem["tokens"], problem["hidden"], problem["layers"])

    def describe(self, problem, params):
        return (f"{self.name}: S={problem['tokens']} H={problem['hidden']} "
                f"L={problem['layers']} relu={problem['relu']}, lanes={params.lanes}, "
                f"{params.format}, layer latency {params.latency}")

    def random_inputs(self, *, tokens, hidden, layers, format="fp32", seed=0):
        """Seeded random ``input``, ``scale`` and ``bias``. Floats: values near 1 in scale, so
        that a deep stack stays finite; specials among the inputs. int8: inputs over the whole
        range, scales mostly 1 (else -2, -1 or 2; one in 25 the extreme -128 or 127) and
        biases in [-16, 16]: both ends saturate, and in-range values that still depend on the
        input remain after several layers."""
        rng = np.random.default_rng(seed)
        dtype = layer_dtype(format)
        if format in INT_FORMATS:
            low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
            input = rng.integers(low, high + 1, (tokens, hidden))
            scale = rng.choice([-2, -1, 1, 2], (layers, hidden), p=[0.05, 0.1, 0.7, 0.15])
            extreme = rng.random(scale.shape) < 0.04
            scale[extreme] = rng.choice([low, high], int(extreme.sum()))
            bias = rng.integers(-16, 17, (layers, hidden))
            return {name: array.astype(dtype) for name, array in
                    (("input", input), ("scale", scale), ("bias", bias))}
        input = random_floats(rng, (tokens, hidden), dtype)
        scale = (1.0 + 0.25 * rng.standard_normal((layers, hidden))).astype(dtype)
        bias = (0.5 * rng.standard_normal((layers, hidden))).astype(dtype)
        return {"input": input, "scale": scale, "bias": bias}

    def point_inputs(self, problem, seed=0):
        """:meth:`random_inputs` at the table's ``tokens``, ``hidden``, ``layers`` and
        ``format`` (default fp32); ``relu`` is run-time."""
        needed = ("tokens", "hidden", "layers")
        sizes, runtime = self.point_table(problem, (*needed, "format"), needed)
        return self.random_inputs(**sizes, seed=seed), runtime

    def bench_problems(self, shape, seed=0):
        inputs = self.random_inputs(tokens=shape.tokens, hidden=shape.hidden, layers=8,
                                    format=shape.format, seed=seed)
        int8 = self.random_inputs(tokens=shape.tokens, hidden=shape.hidden, layers=8,
                                  format="int8", seed=seed)
        return {"L=8": (inputs, {"lanes": shape.lanes, "relu": 1}),
                "L=8 int8": (int8, {"lanes": shape.lanes, "relu": 1})}


UNIT = ScanLayers()
