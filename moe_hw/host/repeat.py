"""The repeat unit's declaration and host adapter (SPEC 1.6, OneFlow ``repeat``): repeat runs
on the expand hardware. The host planner maps it to reshape + expand + reshape as seed 002
does (``golden.repeat``'s own mapping): a dim of size n > 1 repeated r > 1 times becomes the
pair (1, n) expanded to (r, n), a size-1 dim is expanded to r, new dims are expanded to their
repeat. The unit streams the expand's output, which in C order is the repeat's output.

npz inputs: ``input`` (any shape; float32, float16, bfloat16 or int8) and ``repeat_size`` (an
integer array, each entry >= 1, at least as many as the input's dims). Output: ``output``.

Split across parallel units (``parts``, ``split_dim``: :mod:`moe_hw.host.expand`): only an
input dim repeated once (``repeat_size`` 1 there) can be split; it is one dim of the expand,
whose split the parts run, and the parts' outputs concatenate along it.
"""

import numpy as np

from .. import golden
from ..golden.expand import _plan as expand_plan, _repeat_plan as repeat_plan
from .checks import HostError, memory_latency, need
from .expand import (UNIT as EXPAND, Expand, element_array, format_of_elements, size_list,
                     split_dim_of)

__all__ = ["UNIT", "Repeat"]


class Repeat(Expand):
    name = "repeat"
    summary = ("OneFlow repeat on the expand unit's hardware: reshape + expand + reshape "
               "planned on the host (SPEC 1.6)")
    golden = "golden.repeat"
    inputs = ("input", "repeat_size")

    def problem(self, inputs, runtime):
        input, repeat_size = need(inputs, self.name, self.inputs)
        input = element_array(input)
        format_of_elements(input)
        repeat_size = size_list("repeat_size", repeat_size)
        try:
            input_reshape, expand_size, output_shape = repeat_plan(input.shape, repeat_size)
            expand_output, out_stride = expand_plan(input_reshape, expand_size)
        except (TypeError, ValueError) as error:
            raise HostError(str(error)) from None
        problem = self.expand_problem(input.reshape(input_reshape), expand_size, expand_output,
                                      out_stride, sizes=("repeat_size", repeat_size))
        return {**problem, "repeat_size": repeat_size, "repeat_input": input,
                "repeat_output_shape": output_shape,
                "split_dim": expand_split_dim(input.shape, repeat_size,
                                              split_dim_of(inputs, runtime)),
                "memory_latency": memory_latency(runtime, inputs)}

    @staticmethod
    def output_shape(problem):
        return problem["repeat_output_shape"]

    def want(self, problem):
        return golden.repeat(problem["repeat_input"], problem["repeat_size"])

    def describe(self, problem, params):
        return (f"repeat: input {list(problem['repeat_input'].shape)} by "
                f"{problem['repeat_size']} -> output {problem['repeat_output_shape']} (expand "
                f"{list(problem['input'].shape)} -> {problem['output_shape']}, out_stride "
                f"{problem['out_stride']}), {params.format}, lanes={params.lanes}, "
                f"max_rank={params.max_rank}, max_input={params.max_input}")

    def simulate(self, params, stimulus, settings, **kwargs):
        # The very same hardware and bench as expand (one Verilator model for both).
        return EXPAND.simulate(params, stimulus, settings, **kwargs)

    def bench_problems(self, shape, seed=0):
        rng = np.random.default_rng(seed)
        from .expand import ELEMENT_DTYPES, random_elements
        fmt = shape.format if shape.format in ELEMENT_DTYPES else "fp32"
        # The on-chip path holds lanes copies of the input: a few token rows, not all S.
        tokens = random_elements(rng, (min(shape.tokens, 8), shape.hidden), fmt)
        # The external path reads the input from memory: every token row.
        all_tokens = random_elements(rng, (shape.tokens, shape.hidden), fmt)
        size = np.array([shape.top_k, 1], np.int64)
        return {f"k{shape.top_k}": ({"input": tokens, "repeat_size": size},
                                    {"lanes": shape.lanes}),
                f"k{shape.top_k}_external": ({"input": all_tokens, "repeat_size": size},
                                             {"lanes": shape.lanes, "memory": "external"})}


def expand_split_dim(input_shape, repeat_size, split_dim):
    """The expand's input dim of the repeat's input dim ``split_dim`` (None stays None): a
    dim repeated more than once is an error (its output is copies of it, not a slice)."""
    if split_dim is None:
        return None
    if split_dim >= len(input_shape):
        raise HostError(f"split_dim must be an input dim, 0 to {len(input_shape) - 1}, not "
                        f"{split_dim}")
    new = len(repeat_size) - len(input_shape)
    if repeat_size[new + split_dim] != 1:
        raise HostError(f"split_dim {split_dim} is repeated by repeat_size[{new + split_dim}] "
                        f"= {repeat_size[new + split_dim]}; only a dim repeated once can be "
                        "split")
    # Each earlier input dim of size n != 1 repeated r > 1 times became two dims (1, n).
    return split_dim + sum(1 for n, r in zip(input_shape[:split_dim], repeat_size[new:])
                           if r > 1 and n != 1)


UNIT = Repeat()
