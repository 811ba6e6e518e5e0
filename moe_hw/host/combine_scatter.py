"""The combine_scatter unit's declaration and host adapter (SPEC 1.3 ``combine``): a gate
matrix (or an explicit slot order) and the stitched expert outputs in, the token buffer out,
scored against ``golden.sparse_combine`` with a scoreboard over the read and write logs.

npz inputs: ``gates`` [S, E] and ``expert_out`` [slots, ...] (the slot order is
``golden.sparse_dispatch_indices(gates)``'s); or, for a hand-made slot order,
``batch_index`` [slots] and ``nonzero_gates`` [slots] with ``expert_out`` and the run-time
value ``tokens``. Run-time ``memory_latency`` (the bench memory's, default 2). Output:
``combined`` [S, ...].
"""

import numpy as np

from .. import golden
from ..flows.fastsim import FastBench, MemoryReader, MemoryWriter, Source, lane_beats
from ..formats import FORMATS, from_bits, to_bits
from ..golden._common import add, mul
from ..units.combine_scatter import CombineScatterParams, CombineScatterUnit
from .checks import (HostError, check_dtype, check_fits_field, check_maxima, compare_bits,
                     compare_log, compare_values, format_of, memory_latency, runtime_int)
from ..problems import topk_gates
from .unit import Unit

__all__ = ["UNIT", "CombineScatter", "scatter_add_reference",
           "expected_transactions"]

def _rows(expert_out):
    """``expert_out`` [n, ...] as [n, H] (H = the product of the trailing dims)."""
    expert_out = np.asarray(expert_out)
    if expert_out.ndim < 1:
        raise HostError(f"expert_out must have at least 1 dimension [slots, ...], not shape "
                        f"{expert_out.shape}")
    return expert_out.reshape(expert_out.shape[0], int(np.prod(expert_out.shape[1:])))


def scatter_add_reference(batch_index, nonzero_gates, expert_out, *, tokens, history=False):
    """``out[batch_index[s]] += nonzero_gates[s] * expert_out[s]`` for every slot s in order
    with ``0 <= batch_index[s] < tokens``, from +0.0: the loop of
    ``golden.sparse_combine`` for any slot order (a hand-made one included). With
    ``history``, also the row written by every applied slot."""
    rows = _rows(expert_out)
    out = np.zeros((tokens, rows.shape[1]), dtype=rows.dtype)
    written = []
    for s, token in enumerate(np.asarray(batch_index).tolist()):
        if 0 <= token < tokens:
            out[token] = add(out[token], mul(rows[s], nonzero_gates[s]))
            if history:
                written.append(out[token].copy())
    return (out, written) if history else out


def expected_transactions(batch_index, nonzero_gates, expert_out, *, tokens, lanes):
    """The scoreboard: the exact read requests ``{addr, enable}`` and writes ``{addr, enable,
    data bits}`` the unit must issue, valid slots in order, each slot's beats in ascending
    address. Returns ``(reads, writes)``."""
    rows = _rows(expert_out)
    fmt = FORMATS[format_of(rows)]
    hidden = rows.shape[1]
    beats = -(-hidden // lanes)
    _, written = scatter_add_reference(batch_index, nonzero_gates, rows, tokens=tokens,
                                       history=True)
    addrs, enables, datas = [], [], []
    valid = [t for t in np.asarray(batch_index).tolist() if 0 <= t < tokens]
    if hidden:
        for token, row in zip(valid, written):
            padded = np.zeros(beats * lanes, dtype=np.uint64)
            padded[:hidden] = to_bits(row, fmt)
            for b in range(beats):
                count = min(lanes, hidden - b * lanes)
                addrs.append(token * hidden + b * lanes)
                enables.append((1 << count) - 1)
                datas.append(np.where(np.arange(lanes) < count,
                                      padded[b * lanes:(b + 1) * lanes], 0))
    addr, enable = np.array(addrs, np.int64), np.array(enables, np.int64)
    return ({"addr": addr, "enable": enable},
            {"addr": addr, "enable": enable,
             "data": np.array(datas, np.uint64).reshape(len(addrs), lanes)})


class CombineScatter(Unit):
    name = "combine_scatter"
    summary = ("DUET sparse-dispatcher combine: gate multiply and scatter-add into a token "
               "buffer behind read/write ports, read-modify-write hazard tracker (SPEC 1.3)")
    golden = "golden.sparse_combine"
    params = CombineScatterParams
    inputs = ("gates", "expert_out")
    optional = ("batch_index", "nonzero_gates")    # a hand-made slot order instead of gates
    outputs = ("combined",)
    runtime = ("memory_latency", "tokens")
    ideal = "one beat per cycle: slots*ceil(H/lanes)"

    def build(self, params):
        return CombineScatterUnit(params)

    # ---- the problem -------------------------------------------------------------------
    def problem(self, inputs, runtime):
        if "expert_out" not in inputs or not ("gates" in inputs or "batch_index" in inputs):
            raise HostError(f"the input file for {self.name} needs gates and expert_out (or, "
                            "for a hand-made slot order, batch_index, nonzero_gates and "
                            "expert_out with the run-time value tokens)")
        expert_out = np.asarray(inputs["expert_out"])
        gates = None
        if "gates" in inputs:
            gates = inputs["gates"]
            try:
                batch_index, _, nonzero_gates = golden.sparse_dispatch_indices(gates)
            except (TypeError, ValueError) as error:
                raise HostError(str(error)) from None
            gates = np.asarray(gates)
            tokens = gates.shape[0]
            if expert_out.dtype != nonzero_gates.dtype:
                raise HostError(f"expert_out has dtype {expert_out.dtype}, but gates has "
                                f"{nonzero_gates.dtype}; they must share one format")
            if "tokens" in runtime and runtime["tokens"] != tokens:
                raise HostError(f"tokens = {runtime['tokens']}, but gates has S = {tokens} rows")
        else:
            if "nonzero_gates" not in inputs:
                raise HostError("a hand-made slot order (batch_index) needs nonzero_gates too")
            batch_index, nonzero_gates = inputs["batch_index"], inputs["nonzero_gates"]
            tokens = runtime_int("tokens", runtime, inputs)
        rows = _rows(expert_out)
        batch_index = np.asarray(batch_index)
        if batch_index.ndim != 1 or (batch_index.size and batch_index.dtype.kind not in "iu"):
            raise HostError(f"batch_index must be a 1-D integer array, not {batch_index.dtype} "
                            f"of shape {batch_index.shape}")
        nonzero_gates = np.asarray(nonzero_gates)
        if nonzero_gates.shape != batch_index.shape:
            raise HostError(f"nonzero_gates has shape {nonzero_gates.shape}, but batch_index "
                            f"has {batch_index.shape}; they must match")
        if rows.shape[0] != batch_index.size:
            raise HostError(f"expert_out has {rows.shape[0]} rows, but there are "
                            f"{batch_index.size} slots (one row per nonzero of gates)")
        format_of(rows)
        latency = memory_latency(runtime, inputs)
        return {"gates": gates, "batch_index": batch_index.astype(np.int64),
                "nonzero_gates": nonzero_gates, "expert_out": expert_out, "rows": rows,
                "tokens": int(tokens), "memory_latency": latency}

    def params_for(self, problem, settings):
        slots, hidden = problem["rows"].shape
        params = self.sized(settings, format=format_of(problem["rows"]),
                            max_tokens=max(1, problem["tokens"]), max_slots=max(1, slots),
                            max_hidden=max(1, hidden))
        self.fits(problem, params)
        return params

    def fits(self, problem, params):
        slots, hidden = problem["rows"].shape
        check_dtype(params.format, nonzero_gates=problem["nonzero_gates"],
                    expert_out=problem["rows"])
        check_maxima(params, tokens=(problem["tokens"], "max_tokens"),
                     slots=(slots, "max_slots"), hidden=(hidden, "max_hidden"))
        check_fits_field("batch_index", problem["batch_index"], params.index_width)

    @staticmethod
    def _feed(problem):
        """Whether the unit reads anything: no zero-sized dimension."""
        slots, hidden = problem["rows"].shape
        return slots > 0 and problem["tokens"] > 0 and hidden > 0

    # ---- the simulation ----------------------------------------------------------------
    def pack(self, problem, params, *, stall, seed):
        self.fits(problem, params)
        fmt = params.fmt
        slots, hidden = problem["rows"].shape
        stimulus = {
            "token": problem["batch_index"],
            "gate": to_bits(problem["nonzero_gates"], fmt).astype(np.uint64),
            "expert_out": to_bits(problem["rows"], fmt).astype(np.uint64),
        }
        settings = {"lanes": params.lanes, "width": fmt.width, "tokens": problem["tokens"],
                    "slots": int(slots), "hidden": int(hidden), "feed": self._feed(problem),
                    "memory_latency": problem["memory_latency"]}
        return stimulus, settings

    def fast(self, stimulus, settings):
        """sim/bench_combine_scatter.py on the fast path: the same streams and results (the
        token buffer is one memory behind the read and the write port)."""
        slots, hidden = settings["slots"], settings["hidden"]
        headers = slots if settings["feed"] else 0
        rows = stimulus["expert_out"].reshape(slots, hidden)[:headers]
        beats = lane_beats(rows, settings["lanes"])
        # Scatter-add: a token's row is read and rewritten once per valid slot naming it.
        tokens = np.asarray(stimulus["token"][:headers], dtype=np.int64)
        valid = tokens[(tokens >= 0) & (tokens < settings["tokens"])]
        most = int(np.bincount(valid).max()) if len(valid) else 1
        return FastBench(
            streams={"header": Source({name: stimulus[name][:headers]
                                       for name in ("token", "gate")}, all_taken=True),
                     "data": Source({"data": beats}, all_taken=True),
                     "read": MemoryReader("read_data", "write", settings["memory_latency"],
                                          requests=2 * len(beats) + 16, all_taken=True),
                     "write": MemoryWriter(size=settings["tokens"] * hidden,
                                           depth=2 * len(beats) + 16, max_writes=most)},
            sizes={name: settings[name] for name in ("tokens", "slots", "hidden")},
            results={"memory": "write.memory", "write_addr": "write.addr",
                     "write_enable": "write.enable", "write_data": "write.data",
                     "read_addr": "read.addr", "read_enable": "read.enable",
                     "out_of_bounds": lambda get: get("read.out_of_bounds")
                     + get("write.out_of_bounds"),
                     "dropped": "dropped", "error": "error", "busy_after": "busy"},
            limit=60 * (len(beats) + headers) + 2000, what="combine_scatter")

    def unpack(self, problem, params, results):
        shape = (problem["tokens"],) + problem["expert_out"].shape[1:]
        return {"combined": from_bits(results["memory"], params.fmt).reshape(shape)}

    def score(self, problem, params, outputs, results):
        fmt, rows, tokens = params.fmt, problem["rows"], problem["tokens"]
        args = (problem["batch_index"], problem["nonzero_gates"], rows)
        if problem["gates"] is not None:
            want = golden.sparse_combine(problem["gates"], problem["expert_out"])
        else:
            want = scatter_add_reference(*args, tokens=tokens).reshape(
                outputs["combined"].shape)
        findings = compare_bits("combined", outputs["combined"], want, fmt)
        batch_index = problem["batch_index"]
        want_dropped = int(np.count_nonzero((batch_index < 0) | (batch_index >= tokens))) \
            if rows.shape[1] else 0
        findings += compare_values("dropped", int(results["dropped"]), want_dropped)
        if int(results["out_of_bounds"]):
            findings.append(f"{int(results['out_of_bounds'])} lanes read or written out of "
                            "bounds")
        if int(results["error"]):
            findings.append("error flag set")
        if int(results["busy_after"]):
            findings.append("busy after done")
        reads, writes = expected_transactions(*args, tokens=tokens, lanes=params.lanes)
        findings += compare_log("reads", {"addr": results["read_addr"],
                                          "enable": results["read_enable"]}, reads)
        on = (results["write_enable"][:, None] >> np.arange(params.lanes)) & 1 == 1
        findings += compare_log("writes", {"addr": results["write_addr"],
                                           "enable": results["write_enable"],
                                           "data": np.where(on, results["write_data"], 0)},
                                writes, fmt)
        return findings

    # ---- cycles ----------------------------------------------------------------------------
    def ideal_cycles(self, problem, params):
        if not self._feed(problem):
            return 0
        slots, hidden = problem["rows"].shape
        return slots * -(-hidden // params.lanes)

    def cycles(self, problem, params):
        """The exact stall-free count of this slot order, hazard stalls included
        (:meth:`CombineScatterParams.replay_cycles`)."""
        tokens = problem["tokens"]
        order = [t if 0 <= t < tokens else None for t in problem["batch_index"].tolist()] \
            if self._feed(problem) else []
        return params.replay_cycles(order, problem["rows"].shape[1], problem["memory_latency"])

    def describe(self, problem, params):
        slots, hidden = problem["rows"].shape
        return (f"combine_scatter: {slots} slots into S={problem['tokens']} tokens, H={hidden}, "
                f"lanes={params.lanes}, {params.format}, memory read latency "
                f"{problem['memory_latency']}")

    # ---- benchmark ---------------------------------------------------------------------------
    def bench_problems(self, shape, seed=0):
        """Two slot orders at ``shape``: ``random`` (tutel-style top-k routing, the slot order
        of the gate matrix) and ``back_to_back`` (hand-made: every token's k slots one after
        the other, the worst case for the read-modify-write hazard)."""
        fmt = FORMATS[shape.format]
        rng = np.random.default_rng(seed)
        k = shape.top_k
        gates = topk_gates(rng, shape.tokens, shape.experts, k, fmt.dtype)
        slots = int(np.count_nonzero(gates))
        random = ({"gates": gates,
                   "expert_out": rng.standard_normal((slots, shape.hidden)).astype(fmt.dtype)},
                  {"lanes": shape.lanes})
        order = np.repeat(np.arange(shape.tokens), k)
        back_to_back = (
            {"batch_index": order,
             "nonzero_gates": rng.uniform(0.05, 1, order.size).astype(fmt.dtype),
             "expert_out": rng.standard_normal((order.size, shape.hidden)).astype(fmt.dtype)},
            {"lanes": shape.lanes, "tokens": shape.tokens})
        return {"random": random, "back_to_back": back_to_back}


UNIT = CombineScatter()
