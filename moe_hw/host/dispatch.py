"""The dispatch unit's declaration and host adapter: its tensors in, the memory image and
the write log out, scored against ``golden.dispatch_forward`` and ``golden.dispatch_dropped``.

npz inputs: ``gates``, ``indices``, ``locations`` ([S] or [k, S]), ``input`` [S, H]; run-time
``num_experts``, ``capacity``. Outputs: ``dispatch`` [E*C, H], ``dropped``.
"""

import numpy as np

from .. import golden
from ..blocks.run_control import EMPTY_CYCLES
from ..golden._common import mul, slot_rows
from ..problems import routed_problem
from ..flows.fastsim import FastBench, MemoryWriter, Source, lane_beats
from ..formats import FORMATS, from_bits, to_bits
from ..units.dispatch import DispatchParams, DispatchUnit
from .checks import (check_dtype, check_fits_field, check_maxima, compare_bits, compare_log,
                     compare_values, format_of, need, routing, runtime_int)
from .unit import Unit

__all__ = ["UNIT", "Dispatch", "expected_writes", "memory_image"]


def memory_image(results, size, lanes, fmt):
    """Replay a write log (``addr``, ``enable``, ``data`` bits per beat) into a zeroed memory
    of ``size`` elements; returns ``(memory bits, enabled lanes written outside it)``."""
    memory = np.zeros(size, dtype=fmt.uint_dtype)
    lane = np.arange(lanes)
    addr = np.asarray(results["addr"], dtype=np.int64).reshape(-1)
    enable = np.asarray(results["enable"], dtype=np.int64).reshape(-1)
    on = (enable[:, None] >> lane) & 1 == 1
    where = addr[:, None] + lane                       # in write order
    data = np.asarray(results["data"]).reshape(len(addr), lanes)
    where, data = (where.reshape(-1), data.reshape(-1)) if on.all() else (where[on], data[on])
    inside = where < size
    outside = len(where) - int(np.count_nonzero(inside))
    if outside:
        where, data = where[inside], data[inside]
    written = np.zeros(size, dtype=bool)
    written[where] = True
    if np.count_nonzero(written) < len(where):        # some element written twice
        # A later write to an element wins: keep each element's last write.
        last = np.full(size, -1, dtype=np.int64)
        np.maximum.at(last, where, np.arange(len(where)))
        where = np.flatnonzero(last >= 0)
        data = data[last[where]]
    memory[where] = data                               # each element written once
    return memory, outside


def expected_writes(gates, indices, locations, input, *, num_experts, capacity, lanes):
    """The scoreboard: the exact write sequence the unit must issue, (addr, enable, data bits)
    per beat, valid pairs in k-major order, each pair's beats in ascending address."""
    fmt = FORMATS[format_of(input)]
    hidden = input.shape[1]
    beats = -(-hidden // lanes)
    rows = slot_rows(indices, locations, num_experts, capacity)
    k, i = np.nonzero(rows >= 0)
    # Each valid pair's row of products, as golden.dispatch_forward forms it, padded with
    # +0.0 (bits 0) to whole beats.
    products = np.zeros((len(k), beats * lanes), dtype=input.dtype)
    products[:, :hidden] = mul(gates[k, i][:, None], input[i])
    offsets = np.arange(beats) * lanes
    valid = np.minimum(lanes, hidden - offsets)
    return {"addr": (rows[k, i][:, None] * hidden + offsets).reshape(-1),
            "enable": np.tile(np.array([(1 << int(v)) - 1 for v in valid], np.int64), len(k)),
            "data": to_bits(products, fmt).astype(np.uint64).reshape(len(k) * beats, lanes)}


class Dispatch(Unit):
    name = "dispatch"
    summary = ("tutel / MLU-OPS dispatch forward: (index*C+location)*H address generation, "
               "bounds masks, gate multiply (SPEC 1.1)")
    golden = "golden.dispatch_forward"
    params = DispatchParams
    inputs = ("gates", "indices", "locations", "input")
    outputs = ("dispatch", "dropped")
    runtime = ("num_experts", "capacity")
    ideal = "one beat per cycle: k*S*ceil(H/lanes)"
    axi_rows = {"data": "hidden"}
    axi_names = {"write": "dispatch"}

    def build(self, params):
        return DispatchUnit(params)

    def problem(self, inputs, runtime):
        gates, indices, locations, input = need(inputs, self.name, self.inputs)
        gates, indices, locations, input, num_experts, capacity = routing(
            gates, indices, locations, input,
            num_experts=runtime_int("num_experts", runtime, inputs),
            capacity=runtime_int("capacity", runtime, inputs))
        return {"gates": gates, "indices": indices, "locations": locations, "input": input,
                "num_experts": num_experts, "capacity": capacity}

    def params_for(self, problem, settings):
        params = self.sized(settings, format=format_of(problem["input"]),
                            max_pairs=max(1, problem["gates"].size),
                            max_hidden=max(1, problem["input"].shape[1]),
                            max_capacity=max(1, problem["capacity"]),
                            max_experts=max(1, problem["num_experts"]))
        self.fits(problem, params)
        return params

    def fits(self, problem, params):
        check_dtype(params.format, gates=problem["gates"], input=problem["input"])
        check_maxima(params, pairs=(problem["gates"].size, "max_pairs"),
                     hidden=(problem["input"].shape[1], "max_hidden"),
                     capacity=(problem["capacity"], "max_capacity"),
                     num_experts=(problem["num_experts"], "max_experts"))
        for name in ("indices", "locations"):
            check_fits_field(name, problem[name], params.index_width)

    @staticmethod
    def _feed(problem):
        """Whether the unit reads anything: no zero-sized dimension."""
        return (problem["gates"].size > 0 and problem["input"].shape[1] > 0 and
                problem["capacity"] > 0 and problem["num_experts"] > 0)

    def pack(self, problem, params, *, stall, seed):
        self.fits(problem, params)
        fmt = params.fmt
        gates, input = problem["gates"], problem["input"]
        stimulus = {
            "gate": to_bits(gates.reshape(-1), fmt).astype(np.uint64),
            "index": problem["indices"].reshape(-1).astype(np.int64),
            "location": problem["locations"].reshape(-1).astype(np.int64),
            "row": np.tile(np.arange(input.shape[0]), gates.shape[0]),  # k-major pair -> row
            "input": to_bits(input, fmt).astype(np.uint64),
        }
        settings = {"lanes": params.lanes, "width": fmt.width, "pairs": int(gates.size),
                    "hidden": int(input.shape[1]), "capacity": problem["capacity"],
                    "num_experts": problem["num_experts"], "feed": self._feed(problem)}
        return stimulus, settings

    def fast(self, stimulus, settings):
        """sim/bench_dispatch.py on the fast path: the same streams and results."""
        pairs = len(stimulus["gate"]) if settings["feed"] else 0
        beats = lane_beats(stimulus["input"][stimulus["row"][:pairs]], settings["lanes"])
        sizes = ("pairs", "hidden", "capacity", "num_experts")
        # Each (expert, slot) row is written by every pair that names it, the last one winning
        # (SPEC 1.1): once, unless pairs share a slot.
        experts, capacity = settings["num_experts"], settings["capacity"]
        rows = slot_rows(stimulus["index"][:pairs], stimulus["location"][:pairs], experts,
                         capacity)
        rows = rows[rows >= 0]
        most = int(np.bincount(rows).max()) if len(rows) else 1
        return FastBench(
            streams={"header": Source({name: stimulus[name][:pairs]
                                       for name in ("gate", "index", "location")},
                                      all_taken=True),
                     "data": Source({"data": beats}, all_taken=True),
                     "write": MemoryWriter(size=experts * capacity * settings["hidden"],
                                           depth=len(beats), max_writes=most)},
            sizes={name: settings[name] for name in sizes},
            results={"addr": "write.addr", "enable": "write.enable", "data": "write.data",
                     "dropped": "dropped", "error": "error", "busy_after": "busy"},
            limit=40 * (len(beats) + pairs) + 1000, what="dispatch")

    def unpack(self, problem, params, results):
        hidden = problem["input"].shape[1]
        rows = problem["num_experts"] * problem["capacity"]
        memory, results["out_of_bounds"] = memory_image(results, rows * hidden, params.lanes,
                                                        params.fmt)
        return {"dispatch": from_bits(memory, params.fmt).reshape(rows, hidden),
                "dropped": np.int64(results["dropped"])}

    def score(self, problem, params, outputs, results):
        args = [problem[name] for name in self.inputs]
        if params.gate_one:                     # the unit reads no gate: every one is 1.0
            args[0] = np.ones_like(args[0])
        sizes = {"num_experts": problem["num_experts"], "capacity": problem["capacity"]}
        want = golden.dispatch_forward(*args, **sizes)
        findings = compare_bits("dispatch", outputs["dispatch"], want, params.fmt)
        want_dropped = golden.dispatch_dropped(problem["indices"], problem["locations"],
                                               **sizes) if problem["input"].shape[1] else 0
        findings += compare_values("dropped", outputs["dropped"], want_dropped)
        if results["out_of_bounds"]:
            findings.append(f"{results['out_of_bounds']} lanes written out of bounds")
        if int(results["error"]):
            findings.append("error flag set")
        got = {"addr": results["addr"], "enable": results["enable"],
               "data": np.where((results["enable"][:, None] >> np.arange(params.lanes)) & 1,
                                results["data"], 0)}
        findings += compare_log("write log", got, expected_writes(*args, **sizes,
                                                                  lanes=params.lanes),
                                params.fmt)
        return findings

    def ideal_cycles(self, problem, params):
        if not self._feed(problem):
            return 0
        return problem["gates"].size * -(-problem["input"].shape[1] // params.lanes)

    def cycles(self, problem, params):
        if not self._feed(problem):
            return EMPTY_CYCLES
        return self.ideal_cycles(problem, params) + params.overhead

    def describe(self, problem, params):
        return (f"dispatch: {problem['gates'].size} pairs, H={problem['input'].shape[1]}, "
                f"E={problem['num_experts']}, C={problem['capacity']}, lanes={params.lanes}, "
                f"{params.format}")

    def bench_problems(self, shape, seed=0):
        inputs, settings = self.inputs_of(routed_problem(
            tokens=shape.tokens, hidden=shape.hidden, experts=shape.experts,
            top_k=shape.top_k, format=shape.format, capacity=shape.capacity, seed=seed))
        return {"": (inputs, {**settings, "lanes": shape.lanes})}


UNIT = Dispatch()


def run_axi(problem, params, axi=None, *, sim="verilator", stall=0.0, seed=0, latency=20,
            base=0x3000, progress=None):
    """Run ``problem`` (the golden model's arguments: ``gates``, ``indices``, ``locations``,
    ``input``, ``num_experts``, ``capacity``) through dispatch behind its AXI wrapper, on the
    cocotbext-axi bench ``sim/bench_dispatch_axi.py``: the expert buffer in an ``AxiRam`` at
    ``base`` whose write responses come ``latency`` cycles after each burst. Returns
    ``(outputs, results, findings)``: the golden model's outputs read from the RAM, the
    bench's results (``cycles`` from the start write to ``irq``, the bursts), and what
    disagrees with the golden model and the scoreboard (empty when all is well)."""
    from ..axi.streams import tdata_width
    from ..flows.emit import describe_shape
    from .axi_run import check_base, ram_size, simulate_axi, status_findings
    problem = UNIT.problem({name: problem[name] for name in UNIT.inputs},
                           {name: problem[name] for name in UNIT.runtime})
    UNIT.fits(problem, params)
    stimulus, settings = UNIT.pack(problem, params, stall=stall, seed=seed)
    hidden = problem["input"].shape[1]
    rows = problem["num_experts"] * problem["capacity"]
    elements = rows * hidden
    check_base("base", base, params.lanes * params.fmt.width // 8)
    settings.update(stall=stall, seed=seed, latency=latency, base=base,
                    ram_size=ram_size(base + elements * params.fmt.width // 8),
                    buffer_elements=elements, bus=f"m_axi_{UNIT.axi_names['write']}",
                    header_layout=describe_shape(params.header_layout()),
                    header_bytes=tdata_width(params.header_layout()) // 8)
    results, _ = simulate_axi(UNIT, params, axi, stimulus, settings, sim=sim,
                              progress=progress)
    fmt = params.fmt
    outputs = {"dispatch": from_bits(results["memory"].astype(fmt.uint_dtype),
                                     fmt).reshape(rows, hidden),
               "dropped": np.int64(results["dropped"])}
    args = [problem[name] for name in UNIT.inputs]
    sizes = {"num_experts": problem["num_experts"], "capacity": problem["capacity"]}
    want = golden.dispatch_forward(*args, **sizes)
    findings = compare_bits("dispatch", outputs["dispatch"], want, fmt)
    want_dropped = golden.dispatch_dropped(problem["indices"], problem["locations"],
                                           **sizes) if hidden else 0
    findings += compare_values("dropped", outputs["dropped"], want_dropped)
    writes = expected_writes(*args, **sizes, lanes=params.lanes)
    lane = np.arange(params.lanes)
    on = (writes["enable"][:, None] >> lane) & 1 == 1
    want_strobed = (writes["addr"][:, None] + lane)[on]
    if not np.array_equal(results["strobed"], want_strobed):
        findings.append(f"write strobes enable {len(results['strobed'])} elements, the lane "
                        f"enables {len(want_strobed)} (or in another order)")
    if not int(results["guard_ok"]):
        findings.append("bytes outside the expert buffer were written")
    findings += status_findings(results)
    return outputs, results, findings
