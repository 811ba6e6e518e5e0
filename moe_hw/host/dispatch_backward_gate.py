"""The dispatch_backward_gate unit's declaration and host adapter (SPEC 1.1 backward, gate
gradient): the routing, the token rows and the dispatch gradient in, one gate gradient per
pair out, scored against ``golden.dispatch_backward_gate`` (its lane/tree order) with a
scoreboard over both read logs; plus the float64 error check of the hardware's sum order.

npz inputs: ``input`` [S, H], ``indices``, ``locations`` ([S] or [k, S]), ``grad_dispatch``
[E*C, H]; run-time ``num_experts``, ``capacity`` and ``memory_latency`` (the bench memories',
default 2). Outputs: ``grad_gates`` (the shape of ``indices``), ``dropped``.
"""

import math

import numpy as np

from .. import golden
from ..flows.fastsim import FastBench, MemoryReader, Sink, Source
from ..formats import FORMATS, from_bits, to_bits
from ..golden._common import routing_arrays, slot_rows
from ..units.dispatch_backward_gate import (DispatchBackwardGateParams,
                                            DispatchBackwardGateUnit)
from .checks import (HostError, check_dtype, check_fits_field, check_maxima, compare_bits,
                     compare_log, compare_values, format_of, need, memory_latency, runtime_int)
from ..problems import backward_gate_problem
from .unit import AXI_READ_PARAMS, Unit

__all__ = ["UNIT", "DispatchBackwardGate", "expected_reads",
           "float64_error", "run_axi"]

def expected_reads(indices, locations, *, tokens, hidden, num_experts, capacity, lanes,
                   interleave):
    """The scoreboard: the exact request sequences of both read ports, ``(input log, grad
    log)``, each ``{addr, enable}``. Pairs go in groups of ``interleave`` in k-major order;
    within a group, beat b of every member before beat b + 1; only valid pairs read, and
    nothing is read when H is 0."""
    indices, locations, _ = routing_arrays(indices, locations)
    rows = slot_rows(indices, locations, num_experts, capacity).reshape(-1)
    token_of = np.tile(np.arange(tokens), indices.shape[0])
    beats = -(-hidden // lanes)
    input_addr, grad_addr, enable = [], [], []
    for first in range(0, rows.size, interleave):
        members = range(first, min(first + interleave, rows.size))
        for b in range(beats):
            count = min(lanes, hidden - b * lanes)
            for pair in members:
                if rows[pair] >= 0:
                    input_addr.append(token_of[pair] * hidden + b * lanes)
                    grad_addr.append(rows[pair] * hidden + b * lanes)
                    enable.append((1 << count) - 1)
    enable = np.array(enable, np.int64)
    return ({"addr": np.array(input_addr, np.int64), "enable": enable},
            {"addr": np.array(grad_addr, np.int64), "enable": enable})


def float64_error(grad_gates, input, indices, locations, grad_dispatch, *, num_experts,
                  capacity, lanes):
    """How far the hardware's sums are from the float64 dot products, over the valid pairs
    whose float64 result is finite.

    Returns ``{worst_relative, worst_normalised, bound, pairs}``: the worst
    ``|hw - ref| / |ref|`` (pairs with ref != 0), the worst ``|hw - ref| / sum_j |x_j y_j|``,
    and the classical bound on the latter for this order, ``gamma_m = m*u / (1 - m*u)`` with
    ``m = ceil(H / lanes) + log2(lanes) + 1`` roundings on any product's path (one product,
    its lane's additions, the tree) and ``u`` the unit roundoff (no underflow or overflow
    assumed)."""
    indices, locations, _ = routing_arrays(indices, locations)
    rows = slot_rows(indices, locations, num_experts, capacity)
    pair_k, pair_i = np.nonzero(rows >= 0)
    x = np.asarray(input, dtype=np.float64)[pair_i]
    y = np.asarray(grad_dispatch, dtype=np.float64)[rows[pair_k, pair_i]]
    with np.errstate(all="ignore"):
        ref = (x * y).sum(axis=1)
        magnitude = np.abs(x * y).sum(axis=1)
        got = np.asarray(grad_gates, dtype=np.float64).reshape(rows.shape)[pair_k, pair_i]
        error = np.abs(got - ref)
        finite = np.isfinite(ref) & np.isfinite(magnitude) & np.isfinite(got)
        relative = error[finite & (ref != 0)] / np.abs(ref[finite & (ref != 0)])
        normalised = error[finite & (magnitude != 0)] / magnitude[finite & (magnitude != 0)]
    fmt = FORMATS[format_of(input)]
    u = 2.0 ** -(fmt.mant_bits + 1)
    m = -(-np.shape(input)[1] // lanes) + int(math.log2(lanes)) + 1
    return {"worst_relative": float(relative.max()) if relative.size else 0.0,
            "worst_normalised": float(normalised.max()) if normalised.size else 0.0,
            "bound": m * u / (1 - m * u), "pairs": int(finite.sum())}


class DispatchBackwardGate(Unit):
    name = "dispatch_backward_gate"
    summary = ("tutel / MLU-OPS dispatch backward, gate gradient: per-pair dot product over H "
               "in lane/tree order, G pairs interleaved through the adders (SPEC 1.1)")
    golden = "golden.dispatch_backward_gate"
    params = DispatchBackwardGateParams
    inputs = ("input", "indices", "locations", "grad_dispatch")
    outputs = ("grad_gates", "dropped")
    runtime = ("num_experts", "capacity", "memory_latency")
    ideal = "one beat per cycle: k*S*ceil(H/lanes)"
    # Behind AXI: two read masters, m_axi_input and m_axi_grad.
    axi_reads = {"input": ("input_read", "input_data"), "grad": ("grad_read", "grad_data")}
    axi_params = AXI_READ_PARAMS

    def build(self, params):
        return DispatchBackwardGateUnit(params)

    # ---- the problem -------------------------------------------------------------------
    def problem(self, inputs, runtime):
        input, indices, locations, grad_dispatch = need(inputs, self.name, self.inputs)
        num_experts = runtime_int("num_experts", runtime, inputs)
        capacity = runtime_int("capacity", runtime, inputs)
        latency = memory_latency(runtime, inputs)
        shape = np.shape(indices)
        try:
            indices, locations, _ = routing_arrays(indices, locations)
        except (TypeError, ValueError) as error:
            raise HostError(str(error)) from None
        input, grad_dispatch = np.asarray(input), np.asarray(grad_dispatch)
        format_of(input, "input")
        if input.ndim != 2:
            raise HostError(f"input must have 2 dimensions [S, H], not shape {input.shape}")
        if input.shape[0] != indices.shape[1]:
            raise HostError(f"input has {input.shape[0]} rows, but indices has S = "
                            f"{indices.shape[1]} tokens")
        expected = (num_experts * capacity, input.shape[1])
        if grad_dispatch.shape != expected:
            raise HostError(f"grad_dispatch must have shape {expected} (num_experts * "
                            f"capacity, H), not {grad_dispatch.shape}")
        if grad_dispatch.dtype != input.dtype:
            raise HostError(f"grad_dispatch has dtype {grad_dispatch.dtype}, but input has "
                            f"{input.dtype}; they must share one format")
        return {"input": input, "indices": indices, "locations": locations,
                "grad_dispatch": grad_dispatch, "shape": shape, "num_experts": num_experts,
                "capacity": capacity, "memory_latency": latency}

    def params_for(self, problem, settings):
        top_k, (tokens, hidden) = problem["indices"].shape[0], problem["input"].shape
        params = self.sized(settings, format=format_of(problem["input"]),
                            max_tokens=max(1, tokens), max_top_k=max(1, top_k),
                            max_hidden=max(1, hidden),
                            max_capacity=max(1, problem["capacity"]),
                            max_experts=max(1, problem["num_experts"]))
        self.fits(problem, params)
        return params

    def fits(self, problem, params):
        top_k, (tokens, hidden) = problem["indices"].shape[0], problem["input"].shape
        check_dtype(params.format, input=problem["input"])
        check_maxima(params, tokens=(tokens, "max_tokens"), top_k=(top_k, "max_top_k"),
                     hidden=(hidden, "max_hidden"),
                     capacity=(problem["capacity"], "max_capacity"),
                     num_experts=(problem["num_experts"], "max_experts"))
        for name in ("indices", "locations"):
            check_fits_field(name, problem[name], params.index_width)

    @staticmethod
    def _pairs(problem):
        return int(problem["indices"].size)

    @staticmethod
    def _reads(problem):
        """Whether any pair reads: H > 0 and some pair is valid."""
        return problem["input"].shape[1] > 0 and bool(
            (slot_rows(problem["indices"], problem["locations"], problem["num_experts"],
                       problem["capacity"]) >= 0).any())

    # ---- the simulation ----------------------------------------------------------------
    def pack(self, problem, params, *, stall, seed):
        self.fits(problem, params)
        fmt = params.fmt
        top_k, (tokens, hidden) = problem["indices"].shape[0], problem["input"].shape
        stimulus = {
            "index": problem["indices"].reshape(-1).astype(np.int64),
            "location": problem["locations"].reshape(-1).astype(np.int64),
            "input": to_bits(problem["input"], fmt).astype(np.uint64),
            "grad_dispatch": to_bits(problem["grad_dispatch"], fmt).astype(np.uint64),
        }
        settings = {"lanes": params.lanes, "width": fmt.width, "tokens": int(tokens),
                    "top_k": int(top_k), "hidden": int(hidden),
                    "capacity": problem["capacity"], "num_experts": problem["num_experts"],
                    "feed": self._pairs(problem) > 0, "memory_latency": problem["memory_latency"]}
        return stimulus, settings

    def fast(self, stimulus, settings):
        """sim/bench_dispatch_backward_gate.py on the fast path: the same streams and
        results."""
        pairs = len(stimulus["index"]) if settings["feed"] else 0
        beats = max(1, -(-settings["hidden"] // settings["lanes"]))
        latency, reads = settings["memory_latency"], 2 * pairs * beats + 16
        sizes = ("tokens", "top_k", "hidden", "capacity", "num_experts")
        return FastBench(
            streams={"header": Source({name: stimulus[name][:pairs]
                                       for name in ("index", "location")}, all_taken=True),
                     "input_read": MemoryReader("input_data", stimulus["input"].reshape(-1),
                                                latency, requests=reads, all_taken=True),
                     "grad_read": MemoryReader("grad_data",
                                               stimulus["grad_dispatch"].reshape(-1), latency,
                                               requests=reads, all_taken=True),
                     "grad_gate": Sink(depth=2 * pairs + 16)},
            sizes={name: settings[name] for name in sizes},
            results={"grad_gate": lambda get: get("grad_gate.value").astype(np.uint64),
                     "input_addr": "input_read.addr", "input_enable": "input_read.enable",
                     "grad_addr": "grad_read.addr", "grad_enable": "grad_read.enable",
                     "out_of_bounds": lambda get: get("input_read.out_of_bounds")
                     + get("grad_read.out_of_bounds"),
                     "dropped": "dropped", "error": "error", "busy_after": "busy"},
            limit=40 * (pairs * beats + 16) + 2000, what="dispatch_backward_gate")

    def unpack(self, problem, params, results):
        pairs = self._pairs(problem)
        got = results["grad_gate"]
        grad_gates = np.zeros(pairs, dtype=params.fmt.uint_dtype)
        grad_gates[:min(len(got), pairs)] = got[:pairs]
        return {"grad_gates": from_bits(grad_gates, params.fmt).reshape(problem["shape"]),
                "dropped": np.int64(results["dropped"])}

    def output_findings(self, problem, params, outputs, results):
        """The results against the golden model: one gradient per pair (none lost or
        duplicated), bit for bit, and the dropped count. (The AXI run shares these.)"""
        args = [problem[name] for name in self.inputs]
        sizes = {"num_experts": problem["num_experts"], "capacity": problem["capacity"]}
        pairs = self._pairs(problem)
        findings = []
        if len(results["grad_gate"]) != pairs:
            findings.append(f"{len(results['grad_gate'])} results, expected {pairs} (lost or "
                            "duplicated)")
        want = golden.dispatch_backward_gate(*args, **sizes, lanes=params.lanes)
        findings += compare_bits("grad_gates", outputs["grad_gates"],
                                 want.reshape(problem["shape"]), params.fmt)
        findings += compare_values("dropped", outputs["dropped"],
                                   golden.dispatch_dropped(problem["indices"],
                                                           problem["locations"], **sizes))
        return findings

    def score(self, problem, params, outputs, results):
        sizes = {"num_experts": problem["num_experts"], "capacity": problem["capacity"]}
        findings = self.output_findings(problem, params, outputs, results)
        if int(results["out_of_bounds"]):
            findings.append(f"{int(results['out_of_bounds'])} lanes read out of bounds")
        if int(results["error"]):
            findings.append("error flag set")
        if int(results["busy_after"]):
            findings.append("busy after done")
        input_log, grad_log = expected_reads(
            problem["indices"], problem["locations"], tokens=problem["input"].shape[0],
            hidden=problem["input"].shape[1], **sizes, lanes=params.lanes,
            interleave=params.interleave)
        findings += compare_log("input reads", {"addr": results["input_addr"],
                                                "enable": results["input_enable"]}, input_log)
        findings += compare_log("grad_dispatch reads", {"addr": results["grad_addr"],
                                                        "enable": results["grad_enable"]},
                                grad_log)
        return findings

    # ---- cycles ----------------------------------------------------------------------------
    def ideal_cycles(self, problem, params):
        return self._pairs(problem) * -(-problem["input"].shape[1] // params.lanes)

    def cycles(self, problem, params):
        """:meth:`DispatchBackwardGateParams.cycles` (groups of G pairs and the pipeline;
        ``EMPTY_CYCLES`` without pairs)."""
        return params.cycles(self._pairs(problem), problem["input"].shape[1],
                             problem["memory_latency"], reads=self._reads(problem))

    def describe(self, problem, params):
        return (f"dispatch_backward_gate: {self._pairs(problem)} pairs, "
                f"H={problem['input'].shape[1]}, E={problem['num_experts']}, "
                f"C={problem['capacity']}, lanes={params.lanes}, {params.format}, memory read "
                f"latency {problem['memory_latency']}")

    # ---- benchmark ---------------------------------------------------------------------------
    def bench_problems(self, shape, seed=0):
        """A random top-k problem (tutel routing: distinct experts per token, locations from
        the routing counters, the shape's capacity, by default from the factor 1.25)."""
        inputs, runtime = backward_gate_problem(
            tokens=shape.tokens, hidden=shape.hidden, experts=shape.experts,
            top_k=shape.top_k, format=shape.format, capacity=shape.capacity, seed=seed)
        return {"": (inputs, {**runtime, "lanes": shape.lanes})}


UNIT = DispatchBackwardGate()


def run_axi(inputs, runtime, params, axi=None, *, sim="verilator", stall=0.0, seed=0,
            latency=20, bases=(0x3000, 0x3000), progress=None):
    """Run the npz ``inputs`` (``input``, ``indices``, ``locations``, ``grad_dispatch``) with
    ``runtime`` (``num_experts``, ``capacity``; as
    :func:`~moe_hw.problems.backward_gate_problem` gives them) through
    dispatch_backward_gate behind its AXI wrapper, on the cocotbext-axi bench
    ``sim/bench_dispatch_backward_gate_axi.py``: ``input`` in one ``AxiRam`` at ``bases[0]``
    (read through ``m_axi_input``), ``grad_dispatch`` in another at ``bases[1]`` (through
    ``m_axi_grad``), each burst's data ``latency`` cycles after its address; the headers in
    and the gate gradients out on AXI4-Streams. Returns ``(outputs, results, findings)``: the
    golden model's outputs, the bench's results (``cycles`` from the start write to ``irq``,
    the bursts) and what disagrees with ``golden.dispatch_backward_gate`` (empty when all is
    well)."""
    from ..axi.streams import tdata_width
    from ..flows.emit import describe_shape
    from .axi_run import check_base, ram_size, simulate_axi, status_findings
    problem = UNIT.problem(inputs, runtime)
    UNIT.fits(problem, params)
    stimulus, settings = UNIT.pack(problem, params, stall=stall, seed=seed)
    bus_bytes = params.lanes * params.fmt.width // 8
    sizes = [problem[name].size * params.fmt.width // 8 for name in ("input", "grad_dispatch")]
    for name, base in zip(("bases[0]", "bases[1]"), bases):
        check_base(name, base, bus_bytes)
    settings.update(stall=stall, seed=seed, latency=latency, bases=list(bases),
                    buffer_bytes=sizes,
                    ram_sizes=[ram_size(base + size) for base, size in zip(bases, sizes)],
                    header_layout=describe_shape(params.header_layout()),
                    header_bytes=tdata_width(params.header_layout()) // 8,
                    result_layout=describe_shape(params.result_layout()))
    results, _ = simulate_axi(UNIT, params, axi, stimulus, settings, sim=sim,
                              progress=progress)
    outputs = UNIT.unpack(problem, params, results)
    findings = UNIT.output_findings(problem, params, outputs, results)
    if not int(results["reads_inside"]):
        findings.append("a read burst reaches outside its buffer")
    if not int(results["headers_taken"]):
        findings.append("the header stream was not read to its end")
    findings += status_findings(results)
    return outputs, results, findings
