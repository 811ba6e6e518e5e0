"""The sparse_gather unit's declaration and host adapter: ``expert_input = input[batch_index]``
(SPEC 1.3, the DUET ``SparseDispatcher.dispatch()`` move, before the split by
``part_sizes``), with the beat and read scoreboards.

npz inputs: ``input`` [S, ...] (float32, float16 or bfloat16; moved, never changed),
``batch_index`` [n]; run-time ``memory_latency`` (the memory model's, default 2) and
``strict`` (default 1: a ``batch_index`` outside ``[0, S)`` is an error; 0: it is handed to
the hardware, which reads nothing for it, returns a zero row, counts it in ``dropped`` and
sets ``error``). Output: ``expert_input`` [n, ...].
"""

import numpy as np

from .. import golden
from ..formats import format_of_dtype, from_bits, to_bits
from ..golden._common import index_array
from ..blocks.row_reader import row_beats
from ..problems import routed_problem
from ..units.sparse_gather import SparseGatherParams, SparseGatherUnit
from .checks import (HostError, check_dtype, check_fits_field, check_maxima, compare_values,
                     format_of, need, runtime_int)
from .checks import memory_latency
from .row_gather import RowGather

__all__ = ["UNIT", "SparseGather"]


class SparseGather(RowGather):
    name = "sparse_gather"
    summary = ("DUET SparseDispatcher dispatch(): expert_input = input[batch_index], row reads "
               "on a memory port, one beat per cycle (SPEC 1.3)")
    golden = "input[batch_index] (golden.sparse_dispatch before its split)"
    params = SparseGatherParams
    inputs = ("input", "batch_index")
    outputs = ("expert_input",)
    runtime = ("memory_latency", "strict")
    ideal = "one beat per cycle: n*ceil(H/lanes)"

    def build(self, params):
        return SparseGatherUnit(params)

    def problem(self, inputs, runtime):
        input, batch_index = need(inputs, self.name, self.inputs)
        input = np.asarray(input)
        if input.ndim < 1:
            raise HostError(f"input must have at least 1 dimension [S, ...], not shape "
                            f"{input.shape}")
        try:
            format_of_dtype(input.dtype)
        except TypeError:
            raise HostError(f"input must have dtype float32, float16 or bfloat16, not "
                            f"{input.dtype}") from None
        try:
            batch_index = index_array("batch_index", batch_index, ndim=1, what="[n]")
        except (TypeError, ValueError) as error:
            raise HostError(str(error)) from None
        tokens = input.shape[0]
        strict = runtime_int("strict", runtime, inputs, default=1)
        if strict not in (0, 1):
            raise HostError(f"strict must be 0 or 1, not {strict}")
        valid = (batch_index >= 0) & (batch_index < tokens)
        bad = np.flatnonzero(~valid)
        if strict and bad.size:
            raise HostError(f"batch_index[{bad[0]}] = {batch_index[bad[0]]} is outside [0, "
                            f"{tokens}) (the rows of input); with strict=0 the hardware drops "
                            "it and returns a zero row")
        return {"input": input, "batch_index": batch_index, "tokens": tokens,
                "slots": batch_index.size, "hidden": int(np.prod(input.shape[1:])),
                "valid": valid, "memory_latency": memory_latency(runtime, inputs)}

    def params_for(self, problem, settings):
        # (``format`` defaults here, not in ``sized``: an old ``width`` value is an int)
        settings = {"format": format_of(problem["input"]), **settings}
        params = self.sized(settings, max_slots=max(1, problem["slots"]),
                            max_tokens=max(1, problem["tokens"]),
                            max_hidden=max(1, problem["hidden"]))
        self.fits(problem, params)
        return params

    def fits(self, problem, params):
        check_dtype(params.format, input=problem["input"])
        check_maxima(params, slots=(problem["slots"], "max_slots"),
                     tokens=(problem["tokens"], "max_tokens"),
                     hidden=(problem["hidden"], "max_hidden"))
        check_fits_field("batch_index", problem["batch_index"], params.index_width)

    def pack(self, problem, params, *, stall, seed):
        self.fits(problem, params)
        slots, hidden = problem["slots"], problem["hidden"]
        bits = to_bits(problem["input"], params.fmt).reshape(problem["tokens"], hidden)
        stimulus = {"header_index": problem["batch_index"].astype(np.int64),
                    "memory": bits.reshape(-1).astype(np.uint64)}
        settings = self.bench_settings(
            params, {"slots": slots, "tokens": problem["tokens"], "hidden": hidden},
            feed=slots > 0 and hidden > 0, memory_latency=problem["memory_latency"],
            rows=slots, reads=int(problem["valid"].sum()))
        return stimulus, settings

    def unpack(self, problem, params, results):
        slots, hidden = problem["slots"], problem["hidden"]
        bits = self.output_bits(results, slots, hidden, params.lanes, params.fmt)
        return {"expert_input": from_bits(bits, params.fmt).reshape(
            (slots,) + problem["input"].shape[1:])}

    def want_bits(self, problem, params):
        """``input[batch_index]`` as bit patterns [n, H], zero rows for dropped slots."""
        bits = to_bits(problem["input"], params.fmt).reshape(problem["tokens"],
                                                             problem["hidden"])
        valid = problem["valid"]
        want = np.zeros((problem["slots"], problem["hidden"]), dtype=params.fmt.uint_dtype)
        want[valid] = bits[problem["batch_index"][valid]]
        return want

    def score(self, problem, params, outputs, results):
        slots, hidden, lanes = problem["slots"], problem["hidden"], params.lanes
        want = self.want_bits(problem, params)
        got = to_bits(outputs["expert_input"], params.fmt).reshape(slots, hidden)
        findings = compare_values("expert_input (bits)", got, want)
        findings += self.beat_findings(results, want, lanes)
        valid_rows = problem["batch_index"][problem["valid"]] if slots and hidden else []
        findings += self.read_findings(
            results, [(int(row), beat) for row in valid_rows
                      for beat in range(row_beats(hidden, lanes))], hidden, lanes)
        dropped = int(np.count_nonzero(~problem["valid"])) if hidden else 0
        findings += self.status_findings(results, dropped=dropped, error=dropped > 0,
                                         headers=slots if hidden else 0)
        return findings

    def ideal_cycles(self, problem, params):
        if not (problem["slots"] and problem["hidden"]):
            return 0
        return problem["slots"] * row_beats(problem["hidden"], params.lanes)

    def cycles(self, problem, params):
        return params.cycles(problem["slots"], problem["hidden"], problem["memory_latency"],
                             reads=bool(problem["valid"].any()))

    def describe(self, problem, params):
        return (f"sparse_gather: {problem['slots']} slots from {problem['tokens']} rows, "
                f"H={problem['hidden']}, lanes={params.lanes}, {params.format}, memory latency "
                f"{problem['memory_latency']}")

    def bench_problems(self, shape, seed=0):
        """The k*S slots of a random top-k routing (k distinct experts per token), in expert
        order: one read beat per cycle is the ideal, k*S*ceil(H/lanes) cycles."""
        problem = routed_problem(tokens=shape.tokens, hidden=shape.hidden,
                                 experts=shape.experts, top_k=shape.top_k, format=shape.format,
                                 seed=seed)
        batch_index = golden.sparse_dispatch_indices(gate_matrix(problem))[0]
        return {"": ({"input": problem["input"], "batch_index": batch_index},
                     {"lanes": shape.lanes})}


def gate_matrix(problem):
    """The gate matrix [S, E] of a top-k routing (``problems.routed_problem``): token i's
    gate k at column ``indices[k, i]``, zeros elsewhere."""
    gates, indices = problem["gates"], problem["indices"]
    matrix = np.zeros((gates.shape[1], problem["num_experts"]), dtype=gates.dtype)
    for k in range(gates.shape[0]):
        matrix[np.arange(gates.shape[1]), indices[k]] = gates[k]
    return matrix


UNIT = SparseGather()
