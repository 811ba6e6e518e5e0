"""The combine_gather unit's declaration and host adapter (SPEC 1.4, tutel decode): gather
the expert rows of every token's top-k pairs, gate-multiply, sum in k order from +0.0,
scored against ``golden.combine_gather`` with the beat and read scoreboards (the reads must be
exactly the valid pairs' rows, in the unit's window order).

npz inputs: ``gates``, ``indices``, ``locations`` ([S] or [k, S]), ``expert_out`` [E*C, H];
run-time ``capacity`` (E is the rows of ``expert_out`` over it) and ``memory_latency`` (the
memory model's, default 2). Output: ``combined`` [S, H].

:class:`CombineGather` is also the base of the ``dispatch_backward_data`` declaration (the
same hardware with the other summation start rule).
"""

import numpy as np

from .. import golden
from ..blocks.row_reader import row_beats
from ..formats import FORMATS, from_bits, to_bits
from ..golden._common import float_array, routing_arrays, same_dtype, slot_rows
from ..units.combine_gather import CombineGatherParams, CombineGatherUnit, gather_schedule
from ..problems import gather_problem
from .checks import (HostError, check_dtype, check_fits_field, check_maxima, compare_bits,
                     format_of, memory_latency, need, runtime_int)
from .row_gather import RowGather

__all__ = ["UNIT", "CombineGather"]


class CombineGather(RowGather):
    """The combine_gather declaration; subclasses (dispatch_backward_data) set ``component``,
    ``buffer`` (the [E*C, H] input's name), ``result`` and override :meth:`expert_sizes` and
    :meth:`reference`."""

    name = "combine_gather"
    summary = ("tutel combine (gather form): sum over k of gate * expert_out[index*C+location], "
               "from +0.0, tokens in order (SPEC 1.4)")
    golden = "golden.combine_gather"
    params = CombineGatherParams
    component = CombineGatherUnit
    buffer = "expert_out"
    result = "combined"
    inputs = ("gates", "indices", "locations", "expert_out")
    outputs = ("combined",)
    runtime = ("capacity", "memory_latency")
    ideal = "one read beat per cycle: max(top_k, 1)*S*ceil(H/lanes)"
    axi_rows = {"data": "hidden"}

    @property
    def axi_names(self):
        """The read port's bus is named after the buffer it reads."""
        return {"read": self.buffer}

    def build(self, params):
        return self.component(params)

    # ---- the problem -----------------------------------------------------------------
    def expert_sizes(self, buffer, runtime, inputs):
        """``(num_experts, capacity)``: E is the buffer's rows over the run-time capacity."""
        capacity = runtime_int("capacity", runtime, inputs)
        rows = buffer.shape[0]
        if (capacity == 0 and rows) or (capacity and rows % capacity):
            raise HostError(f"{self.buffer} must have a multiple of capacity ({capacity}) rows "
                            f"[E*C, H], not {rows}")
        return (rows // capacity if capacity else 0), capacity

    def reference(self, problem):
        """The golden model's output for ``problem``."""
        return golden.combine_gather(problem["gates"], problem["indices"],
                                     problem["locations"], problem["buffer"],
                                     capacity=problem["capacity"])

    def problem(self, inputs, runtime):
        gates, indices, locations, buffer = need(inputs, self.name, self.inputs)
        try:
            indices, locations, gates = routing_arrays(indices, locations, gates)
            buffer = float_array(self.buffer, buffer, ndim=2, what="[E*C, H]")
            same_dtype("gates", gates, self.buffer, buffer)
        except (TypeError, ValueError) as error:
            raise HostError(str(error)) from None
        num_experts, capacity = self.expert_sizes(buffer, runtime, inputs)
        top_k, tokens = gates.shape
        rows = slot_rows(indices, locations, num_experts, capacity) if top_k else \
            np.zeros((0, tokens), np.int64)
        return {"gates": gates, "indices": indices, "locations": locations, "buffer": buffer,
                "num_experts": num_experts, "capacity": capacity, "top_k": top_k,
                "tokens": tokens, "hidden": buffer.shape[1], "rows": rows,
                "memory_latency": memory_latency(runtime, inputs)}

    def params_for(self, problem, settings):
        params = self.sized(settings, format=format_of(problem["buffer"]),
                            max_tokens=max(1, problem["tokens"]),
                            max_hidden=max(1, problem["hidden"]),
                            max_capacity=max(1, problem["capacity"]),
                            max_experts=max(1, problem["num_experts"]),
                            max_top_k=max(1, problem["top_k"]))
        self.fits(problem, params)
        return params

    def fits(self, problem, params):
        check_dtype(params.format, gates=problem["gates"], **{self.buffer: problem["buffer"]})
        check_maxima(params, tokens=(problem["tokens"], "max_tokens"),
                     hidden=(problem["hidden"], "max_hidden"),
                     capacity=(problem["capacity"], "max_capacity"),
                     num_experts=(problem["num_experts"], "max_experts"),
                     top_k=(problem["top_k"], "max_top_k"))
        for name in ("indices", "locations"):
            check_fits_field(name, problem[name], params.index_width)

    # ---- the run -----------------------------------------------------------------------
    def pack(self, problem, params, *, stall, seed):
        self.fits(problem, params)
        fmt = params.fmt
        top_k, tokens = problem["gates"].shape
        pad = np.zeros((tokens, params.max_top_k - top_k), dtype=np.int64)

        def per_token(array):          # [k, S] -> [S, max_top_k], entries past k zero
            return np.concatenate([array.T.astype(np.int64), pad], axis=1)

        stimulus = {
            "header_gate": per_token(to_bits(problem["gates"], fmt)).astype(np.uint64),
            "header_index": per_token(problem["indices"]),
            "header_location": per_token(problem["locations"]),
            "memory": to_bits(problem["buffer"], fmt).reshape(-1).astype(np.uint64),
        }
        sizes = {"tokens": tokens, "hidden": problem["hidden"], "top_k": top_k,
                 "capacity": problem["capacity"], "num_experts": problem["num_experts"]}
        settings = self.bench_settings(
            params, sizes, feed=tokens > 0 and problem["hidden"] > 0,
            memory_latency=problem["memory_latency"], rows=tokens,
            reads=int((problem["rows"] >= 0).sum()))
        return stimulus, settings

    def unpack(self, problem, params, results):
        bits = self.output_bits(results, problem["tokens"], problem["hidden"], params.lanes,
                                params.fmt)
        return {self.result: from_bits(bits, params.fmt)}

    def score(self, problem, params, outputs, results):
        fmt, lanes = params.fmt, params.lanes
        tokens, hidden, top_k, rows = (problem[name] for name in
                                       ("tokens", "hidden", "top_k", "rows"))
        want = self.reference(problem)
        findings = compare_bits(self.result, outputs[self.result], want, fmt)
        findings += self.beat_findings(results, to_bits(want, fmt), lanes, fmt)
        reads = [(int(rows[k, i]), beat) for k, i, beat in
                 gather_schedule(tokens, row_beats(hidden, lanes), top_k, params.window_items)
                 if top_k and rows[k, i] >= 0]
        findings += self.read_findings(results, reads, hidden, lanes)
        findings += self.status_findings(
            results, dropped=int(np.count_nonzero(rows < 0)) if hidden else 0, error=False,
            headers=tokens if hidden else 0)
        return findings

    def ideal_cycles(self, problem, params):
        if not (problem["tokens"] and problem["hidden"]):
            return 0
        return max(problem["top_k"], 1) * problem["tokens"] * row_beats(problem["hidden"],
                                                                         params.lanes)

    def cycles(self, problem, params):
        return params.cycles(problem["tokens"], problem["hidden"], problem["top_k"],
                             problem["memory_latency"],
                             reads=bool((problem["rows"] >= 0).any()))

    def describe(self, problem, params):
        return (f"{self.name}: top_k={problem['top_k']}, S={problem['tokens']}, "
                f"H={problem['hidden']}, E={problem['num_experts']}, C={problem['capacity']}, "
                f"lanes={params.lanes}, {params.format}, window {params.window_items}, memory "
                f"latency {problem['memory_latency']}")

    # ---- problems ----------------------------------------------------------------------
    def inputs_of(self, problem):
        """``(inputs, run-time values)`` for :func:`~moe_hw.host.unit.run` from a
        :func:`gather_problem`."""
        inputs = {"gates": problem["gates"], "indices": problem["indices"],
                  "locations": problem["locations"], self.buffer: problem["buffer"]}
        return inputs, {name: problem[name] for name in self.runtime if name in problem}

    def bench_problems(self, shape, seed=0):
        """A random top-k routing at the shape's capacity, by default factor 1.0 (so some
        pairs drop); the ideal is one read beat per cycle, top_k*S*ceil(H/lanes) cycles."""
        inputs, runtime = self.inputs_of(gather_problem(
            seed, tokens=shape.tokens, hidden=shape.hidden, experts=shape.experts,
            k=shape.top_k, capacity=shape.capacity, dtype=FORMATS[shape.format].dtype))
        return {"": (inputs, {**runtime, "lanes": shape.lanes})}


UNIT = CombineGather()


def run_axi(problem, params, axi=None, *, sim="verilator", stall=0.0, seed=0, latency=20,
            base=0x3000, progress=None, unit=None):
    """Run ``problem`` (a :func:`~moe_hw.problems.gather_problem` dict: ``gates``,
    ``indices``, ``locations``, ``buffer``, ``capacity``) through combine_gather behind its
    AXI wrapper, on the cocotbext-axi bench ``sim/bench_combine_gather_axi.py``: the expert
    buffer in an ``AxiRam`` at ``base`` whose read data comes ``latency`` cycles after each
    burst's address, the headers and the combined rows on AXI4-Streams. Returns ``(outputs,
    results, findings)``: ``combined`` as read off the stream, the bench's results
    (``cycles`` from the start write to ``irq``, the bursts), and what disagrees with
    ``golden.combine_gather`` (empty when all is well). ``unit``: a unit with this one's ports
    and run (``dispatch_backward_data``; its result and golden model), on the same bench."""
    from ..axi.streams import tdata_width
    from ..flows.emit import describe_shape
    from .axi_run import check_base, ram_size, simulate_axi, status_findings
    unit = unit or UNIT
    inputs, runtime = unit.inputs_of(problem)
    problem = unit.problem(inputs, runtime)
    unit.fits(problem, params)
    stimulus, settings = unit.pack(problem, params, stall=stall, seed=seed)
    fmt = params.fmt
    buffer_bytes = problem["buffer"].size * fmt.width // 8
    check_base("base", base, params.lanes * fmt.width // 8)
    settings.update(stall=stall, seed=seed, latency=latency, base=base,
                    buffer_bytes=buffer_bytes, ram_size=ram_size(base + buffer_bytes),
                    bus=f"m_axi_{unit.axi_names['read']}",
                    header_layout=describe_shape(params.header_layout()),
                    header_bytes=tdata_width(params.header_layout()) // 8)
    results, _ = simulate_axi(unit, params, axi, stimulus, settings, sim=sim,
                              progress=progress, bench="bench_combine_gather_axi")
    tokens, hidden = problem["tokens"], problem["hidden"]
    outputs = {unit.result: from_bits(results["combined"].astype(fmt.uint_dtype),
                                      fmt).reshape(tokens, hidden)}
    findings = compare_bits(unit.result, outputs[unit.result], unit.reference(problem), fmt)
    rows = problem["rows"]
    want_dropped = int(np.count_nonzero(rows < 0)) if hidden and tokens else 0
    if int(results["dropped"]) != want_dropped:
        findings.append(f"DROPPED reads {int(results['dropped'])}, not {want_dropped}")
    if int(results["frames"]) != (tokens if hidden else 0):
        findings.append(f"{int(results['frames'])} rows on m_axis_data, not {tokens}")
    if not int(results["frames_ok"]):
        findings.append("a row on m_axis_data is not H elements long (tlast or tkeep)")
    if not int(results["reads_inside"]):
        findings.append("a read burst reaches outside the expert buffer")
    findings += status_findings(results)
    return outputs, results, findings
