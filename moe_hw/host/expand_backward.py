"""The expand_backward unit's declaration and host adapter (SPEC 1.6 backward):
``input_grad_flat[addr(x)] += output_grad[x]``, scored bit for bit against
``golden.expand_backward_hw`` (the hardware's summation order: :mod:`moe_hw.units.
expand_backward`) with a scoreboard over every output beat.

npz inputs: ``output_grad`` (the expanded shape; float32, float16 or bfloat16),
``input_shape`` (an integer array, the forward input's shape) and optionally ``expand_size``
(an integer array, as for ``expand``; by default the expanded shape). Output: ``input_grad``
(of ``input_shape``).

The plan is the forward's (:func:`moe_hw.host.expand.plan_of`, the same checks and errors),
with two odometers that take the items in turn (an item is a beat, ``lanes`` elements, in the
``reduce``, ``rows`` and ``stream`` modes and one element in ``elements`` mode:
:func:`golden.expand.backward_mode <moe_hw.golden.expand.backward_mode>`), each advancing two
items per step from its start (element 0, and one item on).
"""

import math

import numpy as np

from .. import golden
from ..formats import FORMATS
from ..golden.expand import BACKWARD_MODES, _plan as expand_plan, backward_mode
from ..golden.testing import random_floats
from ..params import check_choice
from ..units.expand_backward import ExpandBackwardParams, ExpandBackwardUnit
from .checks import HostError, compare_bits, compare_log, compare_values, need
from .expand import (ELEMENT_DTYPES, RANK5_INPUT, beat_log, check_rank, element_array,
                     expected_beats, fast_bench, plan_of, rank5_size_of, size_list)
from .unit import Unit

__all__ = ["UNIT", "ExpandBackward"]

_UINT = {16: np.uint16, 32: np.uint32}


def format_of_grad(array):
    for name in ("fp32", "fp16", "bf16"):
        if array.dtype == ELEMENT_DTYPES[name]:
            return name
    raise HostError(f"output_grad must have dtype float32, float16 or bfloat16, not "
                    f"{array.dtype}")


class ExpandBackward(Unit):
    name = "expand_backward"
    summary = ("the gradient of expand: input_grad[addr(x)] += output_grad[x] on the stride "
               "address generator, a lane tree and G = L + 3 latency-interleaved accumulator "
               "banks; one beat per cycle when the innermost dim is broadcast or kept in "
               "whole beats, one element per cycle otherwise (SPEC 1.6)")
    golden = "golden.expand_backward_hw"
    params = ExpandBackwardParams
    inputs = ("output_grad", "input_shape")
    optional = ("expand_size",)
    outputs = ("input_grad",)
    runtime = ()
    ideal = "one beat per cycle: ceil(output_grad elements / lanes)"

    @property
    def bench(self):
        return "bench_expand"

    def build(self, params):
        return ExpandBackwardUnit(params)

    # ---- adapter ---------------------------------------------------------------------
    def problem(self, inputs, runtime):
        output_grad, input_shape = need(inputs, self.name, self.inputs)
        output_grad = element_array(output_grad)
        format_of_grad(output_grad)
        input_shape = size_list("input_shape", input_shape)
        # The expanded shape names every size, so expand_size is optional: by default it is
        # that shape (new dims in front, broadcast dims at their size, kept dims as they are).
        expand_size = size_list("expand_size", inputs.get("expand_size",
                                                          np.array(output_grad.shape)))
        try:
            output_shape, out_stride = expand_plan(input_shape, expand_size)
        except (TypeError, ValueError) as error:
            if "expand_size" in inputs:
                raise HostError(str(error)) from None
            raise HostError(f"output_grad's shape {list(output_grad.shape)} is not an expand "
                            f"of input_shape {input_shape}: {error}") from None
        if list(output_grad.shape) != output_shape:
            raise HostError(f"output_grad must have the expanded shape {output_shape}, not "
                            f"{list(output_grad.shape)}")
        return {"output_grad": output_grad, "input_shape": input_shape,
                "expand_size": expand_size, "output_shape": output_shape,
                "out_stride": out_stride, "input_elements": math.prod(input_shape),
                "output_elements": math.prod(output_shape)}

    def params_for(self, problem, settings):
        settings = {"format": format_of_grad(problem["output_grad"]), **settings}
        params = self.sized(settings, max_input=max(1, problem["input_elements"]),
                            max_output=max(1, problem["output_elements"]))
        self.plan(problem, params)
        return params

    @staticmethod
    def mode(problem, params):
        return backward_mode(problem["output_shape"], problem["out_stride"], params.lanes,
                             params.banks)

    def plan(self, problem, params):
        """The problem's plan on ``params``; errors name the parameter and its value."""
        if FORMATS[params.format].dtype != problem["output_grad"].dtype:
            raise HostError(f"output_grad has dtype {problem['output_grad'].dtype}, but the "
                            f"unit's format is {params.format}")
        check_rank("expand_size", problem["expand_size"], params.max_rank)
        for what, value, maximum in (
                ("input elements", problem["input_elements"], "max_input"),
                ("output elements", problem["output_elements"], "max_output")):
            if value > getattr(params, maximum):
                raise HostError(f"{what} ({value}) exceed the unit's {maximum} of "
                                f"{getattr(params, maximum)}")
        step = 1 if self.mode(problem, params) == "elements" else params.lanes
        return plan_of(problem["output_shape"], problem["out_stride"], params, step=step,
                       odometers=2)

    def fast(self, stimulus, settings):
        return fast_bench(self, stimulus, settings)

    def pack(self, problem, params, *, stall, seed):
        the_plan = self.plan(problem, params)
        lanes, width = params.lanes, params.fmt.width
        n_out = problem["output_elements"]
        beats = -(-n_out // lanes)
        bits = np.zeros(beats * lanes, np.uint64)
        if beats:
            bits[:n_out] = np.ascontiguousarray(problem["output_grad"]).reshape(-1).view(
                _UINT[width])
        runtime = {"input_elements": problem["input_elements"], "output_elements": n_out,
                   "mode": BACKWARD_MODES.index(self.mode(problem, params))}
        return ({"input": bits.reshape(beats, lanes)},
                {"lanes": lanes, "width": width, "streams": ["grad_output", "input_grad"],
                 "runtime": {k: int(v) for k, v in runtime.items()},
                 "plan": the_plan.beats(params) if n_out else [],
                 "expected_beats": int(-(-problem["input_elements"] // lanes)
                                       + params.drain_cycles(problem["input_elements"]))})

    def unpack(self, problem, params, results):
        n = problem["input_elements"]
        data = results["data"].reshape(-1)
        bits = np.zeros(n, _UINT[params.fmt.width])
        if data.size >= n:
            bits[:] = data[:n]
        dtype = problem["output_grad"].dtype
        return {"input_grad": bits.view(dtype).reshape(problem["input_shape"])}

    def want(self, problem, params):
        return golden.expand_backward_hw(problem["output_grad"], problem["input_shape"],
                                         problem["expand_size"], params.lanes,
                                         params.add_latency)

    def score(self, problem, params, outputs, results):
        want = self.want(problem, params)
        findings = compare_bits("input_grad", outputs["input_grad"], want, params.fmt)
        log = beat_log(results, params)
        expected = expected_beats({"output_elements": problem["input_elements"]}, params, want)
        findings += compare_log("input_grad beats", log, expected, params.fmt)
        plan_beats = params.plan_beats if problem["output_elements"] else 0
        grad_beats = -(-problem["output_elements"] // params.lanes)
        for what, got, want_value in (
                ("plan beats taken", results["plan_taken"], plan_beats),
                ("output_grad beats taken", results["input_taken"], grad_beats),
                ("error", results["error"], 0), ("busy after done", results["busy_after"], 0)):
            findings += compare_values(what, [int(got)], [int(want_value)])
        return findings

    def ideal_cycles(self, problem, params):
        return -(-problem["output_elements"] // params.lanes)

    def cycles(self, problem, params):
        return params.cycles(problem["input_elements"], problem["output_elements"],
                             self.mode(problem, params))

    def describe(self, problem, params):
        return (f"{self.name}: output_grad {problem['output_shape']} -> input_grad "
                f"{problem['input_shape']} (out_stride {problem['out_stride']}, "
                f"{self.mode(problem, params)} mode), {params.format}, lanes={params.lanes}, "
                f"G={params.banks}, max_input={params.max_input}")

    def point_inputs(self, problem, seed=0):
        """A random ``output_grad`` (``format``, default fp32) of the expand of the table's
        ``input_shape`` by its ``expand_size``."""
        needed = ("input_shape", "expand_size")
        sizes, runtime = self.point_table(problem, (*needed, "format"), needed)
        try:
            output_shape, _ = expand_plan(sizes["input_shape"], sizes["expand_size"])
        except (TypeError, ValueError) as error:
            raise HostError(str(error)) from None
        fmt = check_choice("format", sizes.get("format", "fp32"), ["fp32", "fp16", "bf16"])
        grad = random_floats(np.random.default_rng(seed), math.prod(output_shape),
                             ELEMENT_DTYPES[fmt], specials=0.0)
        return {"output_grad": grad.reshape(output_shape),
                "input_shape": np.array(sizes["input_shape"], np.int64),
                "expand_size": np.array(sizes["expand_size"], np.int64)}, runtime

    def bench_problems(self, shape, seed=0):
        """The forward bench's shapes backwards: the gate [S, 1] and the row [1, H] broadcast
        to [S, H], the tokens repeated twice (repeat [2, 1]: [1, S, H] -> [2, S, H]) and the
        rank-5 expand [4, 1, 8, 1, 16] -> [4, 3S/128, 8, 5H/128, 16]."""
        rng = np.random.default_rng(seed)
        fmt = shape.format if shape.format in ("fp32", "fp16", "bf16") else "fp32"
        s, h = shape.tokens, shape.hidden
        cases = {"gate": ([s, 1], [s, h]), "row": ([1, h], [s, h]),
                 "repeat": ([1, s, h], [2, s, h]),
                 "rank5": (list(RANK5_INPUT), rank5_size_of(shape))}
        problems = {}
        for name, (input_shape, size) in cases.items():
            n = int(np.prod(size))
            grad = random_floats(rng, n, ELEMENT_DTYPES[fmt], specials=0.0).reshape(size)
            problems[name] = ({"output_grad": grad, "input_shape": np.array(input_shape),
                               "expand_size": np.array(size)}, {"lanes": shape.lanes})
        return problems


UNIT = ExpandBackward()
