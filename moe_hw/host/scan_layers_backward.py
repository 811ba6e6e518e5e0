"""The scan_layers_backward unit's declaration and host adapter: the backward pass of L layers
``h = relu?(scale[l] * h + bias[l])`` on one layer datapath (SPEC 1.7, backward), checked bit
for bit against ``golden.scan_layers_backward``.

npz inputs: ``input`` [S, H], ``scale`` [L, H], ``bias`` [L, H], ``grad_output`` [S, H] (one
float dtype: float32, float16 or bfloat16, which picks the format); run-time ``relu`` (0 or
1, ``--set`` or an npz scalar; default 0). Outputs: ``grad_input`` [S, H], ``grad_scale``
[L, H], ``grad_bias`` [L, H]. The generation-time ``checkpoint`` (``--set checkpoint=8``)
chooses between storing every activation (0) and recomputing from every c-th.
"""

import numpy as np

from .. import golden
from ..arith.params import FORMAT_NAMES
from ..flows.fastsim import FastBench, Sink, Source
from ..formats import FORMATS, from_bits
from ..golden.testing import random_floats
from ..units.scan_layers_backward import ScanLayersBackwardParams, ScanLayersBackwardUnit
from .checks import check_dtype, check_maxima, compare_bits, format_of
from .scan_layers import UNIT as FORWARD, ScanLayers, layer_problem
from .unit import Unit

__all__ = ["UNIT", "ScanLayersBackward"]


class ScanLayersBackward(Unit):
    name = "scan_layers_backward"
    summary = ("the backward pass of scan_layers: grad_input, grad_scale, grad_bias of L "
               "layers relu?(a_l * h + b_l) on ONE layer datapath run in reverse layer order, "
               "activations stored or recomputed from checkpoints (SPEC 1.7)")
    golden = "golden.scan_layers_backward"
    params = ScanLayersBackwardParams
    inputs = ("input", "scale", "bias", "grad_output")
    outputs = ("grad_input", "grad_scale", "grad_bias")
    runtime = ("relu",)
    ideal = "one item per cycle in each of the 2L - 1 sweeps: (2L - 1)*S*ceil(H/lanes)"
    bench = "bench_scan_layers_backward"
    #: The formats the npz dtypes may pick (no integer format).
    formats = FORMAT_NAMES
    #: The run-time values driven on the unit's ports.
    ports = ("tokens", "hidden", "layers", "relu")

    def build(self, params):
        return ScanLayersBackwardUnit(params)

    def problem(self, inputs, runtime):
        return layer_problem(self, inputs, runtime)

    def smallest(self, problem):
        return dict(max_tokens=max(1, problem["tokens"]), max_hidden=max(1, problem["hidden"]),
                    max_layers=problem["layers"])

    def params_for(self, problem, settings):
        settings = {"format": format_of(problem["input"]), **settings}
        params = self.sized(settings, **self.smallest(problem))
        self.fits(problem, params)
        return params

    def fits(self, problem, params):
        check_dtype(params.format, input=problem["input"], scale=problem["scale"],
                    bias=problem["bias"], grad_output=problem["grad_output"])
        check_maxima(params, tokens=(problem["tokens"], "max_tokens"),
                     hidden=(problem["hidden"], "max_hidden"),
                     layers=(problem["layers"], "max_layers"))

    def beats(self, problem, params):
        return -(-problem["hidden"] // params.lanes)

    def pack(self, problem, params, *, stall, seed):
        self.fits(problem, params)
        stimulus = {name: FORWARD.lane_bits(problem[name], params)
                    for name in ("input", "scale", "bias", "grad_output")}
        runtime = {name: problem[name] for name in self.ports}
        empty = not (problem["tokens"] and problem["hidden"])
        items = 0 if empty else problem["tokens"] * self.beats(problem, params)
        sweeps = len(params.sweeps(problem["layers"]))
        return stimulus, {"lanes": params.lanes, "width": params.fmt.width, "runtime": runtime,
                          "feed": not empty,
                          "work": sweeps * (items * max(1, params.add_latency + 1)
                                            + params.drain + 4) + 3 * items
                          + len(stimulus["scale"])}

    def fast(self, stimulus, settings):
        """sim/bench_scan_layers_backward.py on the fast path: the same streams and results."""
        feed = settings["feed"]

        def fed(name):
            return stimulus[name][:len(stimulus[name]) if feed else 0]

        beats = len(fed("input"))
        return FastBench(
            streams={"layer_params": Source({name: fed(name) for name in ("scale", "bias")}),
                     "input": Source({"data": fed("input")}),
                     "grad_output": Source({"data": fed("grad_output")}),
                     "grad_input": Sink(depth=2 * beats + 16),
                     "param_grad": Sink(depth=2 * len(fed("scale")) + 16)},
            sizes=settings["runtime"],
            results={"grad": "grad_input.data", "sum_scale": "param_grad.scale",
                     "sum_bias": "param_grad.bias", "params_taken": "layer_params.sent",
                     "input_taken": "input.sent", "grad_taken": "grad_output.sent",
                     "error": "error", "busy_after": "busy"},
            limit=20 * settings["work"] + 2000, what="scan_layers_backward")

    def _rows(self, beats_bits, rows, hidden, params):
        bits = np.asarray(beats_bits, dtype=np.uint64).reshape(rows, -1)[:, :hidden]
        return from_bits(bits.astype(params.fmt.uint_dtype), params.fmt)

    def unpack(self, problem, params, results):
        tokens, hidden, layers = problem["tokens"], problem["hidden"], problem["layers"]
        dtype = params.fmt.dtype
        if not (tokens and hidden):
            # the sums of no tokens: +0.0 (the hardware does nothing)
            return {"grad_input": np.zeros((tokens, hidden), dtype=dtype),
                    "grad_scale": np.zeros((layers, hidden), dtype=dtype),
                    "grad_bias": np.zeros((layers, hidden), dtype=dtype)}
        beats = self.beats(problem, params)
        outputs = {}
        grad = np.asarray(results["grad"], dtype=np.uint64)
        outputs["grad_input"] = (self._rows(grad, tokens, hidden, params)
                                 if len(grad) == tokens * beats          # else: lost beats
                                 else np.zeros((0, hidden), dtype=dtype))
        for name in ("scale", "bias"):
            sums = np.asarray(results[f"sum_{name}"], dtype=np.uint64)
            if len(sums) != layers * beats:
                outputs[f"grad_{name}"] = np.zeros((0, hidden), dtype=dtype)
                continue
            # the beats leave layer L-1 first
            outputs[f"grad_{name}"] = self._rows(sums, layers, hidden, params)[::-1].copy()
        return outputs

    def score(self, problem, params, outputs, results):
        want = golden.scan_layers_backward(problem["scale"], problem["bias"], problem["relu"],
                                           problem["input"], problem["grad_output"])
        findings = []
        for name, wanted in zip(self.outputs, want):
            findings += compare_bits(name, outputs[name], wanted, params.fmt)
        items = problem["tokens"] * self.beats(problem, params) if problem["hidden"] else 0
        layer_beats = problem["layers"] * self.beats(problem, params) if items else 0
        for name, got, expected in (("grad_input", len(results["grad"]), items),
                                    ("param_grad", len(results["sum_scale"]), layer_beats)):
            if got != expected:
                findings.append(f"{name}: {got} beats, expected {expected} (lost or "
                                "duplicated)")
        for name, taken, expected in (("input", results["input_taken"], items),
                                      ("grad_output", results["grad_taken"], items),
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
        return ((2 * problem["layers"] - 1) * problem["tokens"]
                * self.beats(problem, params))

    def cycles(self, problem, params):
        return params.cycles(problem["tokens"], problem["hidden"], problem["layers"])

    def describe(self, problem, params):
        return (f"{self.name}: S={problem['tokens']} H={problem['hidden']} "
                f"L={problem['layers']} relu={problem['relu']}, lanes={params.lanes}, "
                f"{params.format}, checkpoint={params.checkpoint} "
                f"({len(params.sweeps(problem['layers']))} sweeps), activation memory "
                f"{params.memory_bits()['activations']} bits, all memories "
                f"{sum(params.memory_bits().values())} bits")

    def random_inputs(self, *, tokens, hidden, layers, format="fp32", seed=0):
        """Seeded random ``input``, ``scale``, ``bias`` (as the forward unit's) and
        ``grad_output`` (specials among them)."""
        inputs = FORWARD.random_inputs(tokens=tokens, hidden=hidden, layers=layers,
                                       format=format, seed=seed)
        rng = np.random.default_rng(seed + 1000)
        inputs["grad_output"] = random_floats(rng, (tokens, hidden), FORMATS[format].dtype)
        return inputs

    point_inputs = ScanLayers.point_inputs        # the forward's table, this random_inputs

    def bench_problems(self, shape, seed=0):
        # 256 tokens at the default shape (the README's figures); fewer when the shape is smaller.
        inputs = self.random_inputs(tokens=min(shape.tokens, 256), hidden=shape.hidden, layers=32,
                                    format=shape.format, seed=seed)
        return {"L=32 store all": (inputs, {"lanes": shape.lanes, "relu": 1, "checkpoint": 0}),
                "L=32 checkpoint 8": (inputs, {"lanes": shape.lanes, "relu": 1,
                                               "checkpoint": 8})}


UNIT = ScanLayersBackward()
