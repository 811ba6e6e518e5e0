"""What the two float stream units ``fmul`` and ``fadd`` share as declarations: arrays
``a`` and ``b`` of one shape and float dtype in, the result out, bit for bit against NumPy
(one bench, ``sim/bench_binop.py``, drives both)."""

import numpy as np

from ..flows.fastsim import FastBench, Sink, Source
from ..formats import FORMATS, from_bits, to_bits
from ..golden.testing import random_floats
from .checks import HostError, check_dtype, compare_bits, format_of, need
from .unit import Unit

__all__ = ["FloatBinop"]


class FloatBinop(Unit):
    """Base of the ``fmul`` and ``fadd`` declarations; subclasses set ``result`` (the output
    name), ``component`` (the stream unit class), ``numpy`` (the reference operation) and
    ``stages_name``."""

    inputs = ("a", "b")
    result = None
    component = None
    numpy = None
    stages_name = None
    bench = "bench_binop"
    ideal = "one operation per cycle"

    @property
    def outputs(self):
        return (self.result,)

    def build(self, params):
        return self.component(params.format, getattr(params, self.stages_name))

    def problem(self, inputs, runtime):
        a, b = (np.asarray(x) for x in need(inputs, self.name, self.inputs))
        if a.shape != b.shape:
            raise HostError(f"a has shape {a.shape} but b has shape {b.shape}; they must match")
        if a.dtype != b.dtype:
            raise HostError(f"a has dtype {a.dtype} but b has dtype {b.dtype}; they must match")
        format_of(a)
        return {"a": a, "b": b}

    def params_for(self, problem, settings):
        params = self.make_params(settings, base={"format": format_of(problem["a"])})
        check_dtype(params.format, a=problem["a"], b=problem["b"])
        return params

    def latency(self, params):
        return params.mul_latency if self.stages_name == "mul_stages" else params.add_latency

    def pack(self, problem, params, *, stall, seed):
        stimulus = {name: to_bits(problem[name].reshape(-1), params.fmt).astype(np.uint64)
                    for name in self.inputs}
        return stimulus, {"unit": self.name, "result": self.result}

    def fast(self, stimulus, settings):
        """sim/bench_binop.py on the fast path: the same streams, results and cycle count
        (the unit has no start or done: the run ends with the last result)."""
        count = len(stimulus["a"])
        return FastBench(
            streams={"i": Source({"a": stimulus["a"], "b": stimulus["b"]}),
                     "o": Sink(depth=count + 64)},
            sizes={}, finish=("o", count), settle=64,
            results={"result": lambda get: get(f"o.{settings['result']}").astype(np.uint64)},
            limit=40 * count + 1000, what=settings["unit"])

    def unpack(self, problem, params, results):
        return {self.result: from_bits(results["result"], params.fmt)
                .reshape(problem["a"].shape)}

    def score(self, problem, params, outputs, results):
        with np.errstate(all="ignore"):
            want = self.numpy(problem["a"], problem["b"]).astype(params.fmt.dtype)
        return compare_bits(self.result, outputs[self.result], want, params.fmt)

    def ideal_cycles(self, problem, params):
        return problem["a"].size

    def cycles(self, problem, params):
        """From the edge that takes the first operands to the one that takes the last
        result, both counted: count + latency."""
        return problem["a"].size + self.latency(params) if problem["a"].size else None

    def describe(self, problem, params):
        return (f"{self.name}: {problem['a'].size} operations, {params.format}, "
                f"{self.latency(params)} stages")

    def point_inputs(self, problem, seed=0):
        """Random operands: ``elements`` pairs in ``format`` (default fp32)."""
        sizes, runtime = self.point_table(problem, ("elements", "format"), ("elements",))
        rng = np.random.default_rng(seed)
        dtype = FORMATS[sizes.get("format", "fp32")].dtype
        a, b = (random_floats(rng, sizes["elements"], dtype) for _ in range(2))
        return {"a": a, "b": b}, runtime

    def bench_problems(self, shape, seed=0):
        rng = np.random.default_rng(seed)
        dtype = FORMATS[shape.format].dtype
        a, b = (random_floats(rng, shape.tokens * shape.top_k, dtype) for _ in range(2))
        return {"": ({"a": a, "b": b}, {})}
