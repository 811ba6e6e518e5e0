"""The moe_layer unit's declaration and host adapter (SPEC 1.8, ``moe_hw.units.moe_layer``):
a gate matrix and token rows in, the unit's streams driven with the expert buffer modelled
behind a read port and a write port, the output scored against the chained golden model
``golden.moe_layer`` (tutel's ``postscore=True``), with scoreboards over every output beat,
every expert-buffer write and every read.

npz inputs: ``gates`` [S, E], ``input`` [S, H], optionally ``expert_scale`` and
``expert_bias`` [E] (neither: identity experts), or both [E, L, H]: every expert a scan_layers
stack of L layers ``relu?(a_l * x + b_l)`` (built with ``experts=scan_layers``; run-time
``relu``, default 0); run-time ``capacity`` (default:
``golden.capacity_from_factor(1.25, S, E, k)``) and ``memory_latency`` (the memory model's,
default 2). Outputs: ``output`` [S, H], ``dropped``.

The run's cycles are the whole run's (the three phases together); the bench also logs when
each phase began, and :meth:`MoELayer.phase_cycles` gives the exact stall-free count of each.
"""

from dataclasses import dataclass

import numpy as np

from .. import golden
from ..blocks.row_reader import last_enable, row_beats
from ..flows.fastsim import (FastBench, MemoryReader, MemoryWriter, Sink, Source,
                             lane_beats)
from ..formats import FORMATS, from_bits, to_bits
from ..golden._common import add, float_array, mul, slot_rows
from ..units.combine_gather import gather_schedule
from ..units.moe_layer import PHASES, MoELayer as MoELayerUnit, MoELayerParams
from .checks import (MEMORY_LATENCY, HostError, check_dtype, check_maxima, compare_bits, compare_log,
                     compare_values, format_of, need, memory_latency, runtime_int)
from .dispatch import expected_writes
from ..problems import layer_gates
from .unit import AXI_READ_PARAMS, Unit

__all__ = ["UNIT", "MoELayer", "MoELayerProblem", "DEFAULT_CAPACITY_FACTOR",
           "PHASE_NAMES", "layer_problem", "phase_durations"]

#: The memory model's latency unless told otherwise: a request taken at the end of cycle u
#: is answered from cycle u + 2 (an on-chip RAM with a registered output).
#: The capacity factor used when no capacity is given: C = k * ceil(1.25 * S / E).
DEFAULT_CAPACITY_FACTOR = 1.25

PHASE_NAMES = ("route_dispatch", "experts", "combine")


@dataclass
class MoELayerProblem:
    """A checked problem: the golden's inputs and the hardware's view of them."""

    gates: np.ndarray         # [S, E]
    input: np.ndarray         # [S, H]
    capacity: int
    scale: np.ndarray | None  # [E], or [E, L, H] for expert stacks
    bias: np.ndarray | None   # [E], or [E, L, H]
    gates_k: np.ndarray       # [k, S]
    indices: np.ndarray       # [k, S]
    locations: np.ndarray     # [k, S]
    fmt: object
    memory_latency: int = MEMORY_LATENCY
    relu: int = 0

    @property
    def stacked(self):
        """Whether the experts are scan_layers stacks (scale and bias [E, L, H])."""
        return self.scale is not None and self.scale.ndim == 3

    @property
    def layers(self):
        """L of the expert stacks (0 for affine or identity experts)."""
        return self.scale.shape[1] if self.stacked else 0

    @property
    def tokens(self):
        return self.input.shape[0]

    @property
    def hidden(self):
        return self.input.shape[1]

    @property
    def num_experts(self):
        return self.gates.shape[1]

    @property
    def top_k(self):
        return self.indices.shape[0]

    @property
    def pairs(self):
        return self.top_k * self.tokens

    @property
    def affine(self):
        return self.scale is not None or self.bias is not None

    @property
    def filled_rows(self):
        """``min(count[e], C)`` per expert: the slots dispatch fills."""
        counts = golden.expert_counts(self.indices, self.num_experts)
        return np.minimum(counts, self.capacity)

    @property
    def runs_experts(self):
        return self.affine and self.hidden > 0 and self.filled_rows.sum() > 0

    @property
    def expert_rows(self):
        """The rows the expert phase reads and writes (R; 0 when it is skipped)."""
        return int(self.filled_rows.sum()) if self.runs_experts else 0

    @property
    def valid(self):
        """[k, S]: the pairs that pass the capacity mask."""
        return slot_rows(self.indices, self.locations, self.num_experts, self.capacity) >= 0

    @property
    def feeds_data(self):
        """Whether the token rows are streamed in (something can be dispatched)."""
        return self.pairs > 0 and self.hidden > 0 and self.capacity > 0 and self.num_experts > 0


def _float(name, value, **kwargs):
    try:
        return float_array(name, value, **kwargs)
    except (TypeError, ValueError) as error:
        raise HostError(str(error)) from None


def layer_problem(gates, input, capacity=None, expert_scale=None, expert_bias=None,
                  memory_latency=MEMORY_LATENCY, relu=0):
    """Check a problem (``capacity`` None: the default factor); a :class:`MoELayerProblem`."""
    gates = _float("gates", gates, ndim=2, what="[S, E]")
    try:
        gates_k, indices = golden.top_k_routing(gates)
    except (TypeError, ValueError) as error:
        raise HostError(str(error)) from None
    input = _float("input", input, ndim=2, what="[S, H]")
    if gates.dtype != input.dtype:
        raise HostError(f"gates has dtype {gates.dtype}, but input has {input.dtype}; they "
                        "must share one format")
    tokens, experts = gates.shape
    if input.shape[0] != tokens:
        raise HostError(f"input must have {tokens} rows (S, the rows of gates), not "
                        f"{input.shape[0]}")
    top_k = indices.shape[0]
    if capacity is None:
        capacity = golden.capacity_from_factor(DEFAULT_CAPACITY_FACTOR, tokens,
                                               max(experts, 1), max(top_k, 1))
    capacity = runtime_int("capacity", {"capacity": capacity}, {})
    stacked = np.ndim(expert_scale) == 3 or np.ndim(expert_bias) == 3
    operands = (_stack_operands if stacked else _affine_operands)(expert_scale, expert_bias,
                                                                  experts, input)
    locations = golden.compute_locations(indices, num_experts=experts)
    relu = runtime_int("relu", {"relu": relu}, {})
    if relu not in (0, 1):
        raise HostError(f"relu must be 0 or 1, not {relu}")
    return MoELayerProblem(gates, input, capacity, operands[0], operands[1], gates_k, indices,
                           locations, FORMATS[format_of(input)], memory_latency, relu)


def _same_format(name, operand, input):
    if operand.dtype != input.dtype:
        raise HostError(f"{name} has dtype {operand.dtype}, but input has {input.dtype}; they "
                        "must share one format")
    return operand


def _affine_operands(expert_scale, expert_bias, experts, input):
    """``[scale, bias]`` of affine experts, each [E] in the input's format, or None."""
    operands = []
    for name, operand in (("expert_scale", expert_scale), ("expert_bias", expert_bias)):
        if operand is not None:
            operand = _float(name, operand, ndim=(1, 2), what="[E]")
            if operand.ndim == 2:
                raise HostError(f"{name} must have shape ({experts},) [E]: the hardware's "
                                f"experts apply one {name[7:]} per expert, not per element "
                                f"(shape {operand.shape})")
            if operand.shape != (experts,):
                raise HostError(f"{name} must have shape ({experts},) [E], not "
                                f"{operand.shape}")
            operand = _same_format(name, operand, input)
        operands.append(operand)
    return operands


def _stack_operands(expert_scale, expert_bias, experts, input):
    """``[scale, bias]`` of expert stacks, both [E, L, H] in the input's format, L > 0."""
    operands = []
    for name, operand in (("expert_scale", expert_scale), ("expert_bias", expert_bias)):
        if operand is None:
            raise HostError(f"{name} is missing: expert stacks need expert_scale and "
                            f"expert_bias, both [E, L, H]")
        operand = _float(name, operand, ndim=3, what="[E, L, H]")
        if operand.shape[0] != experts or operand.shape[2] != input.shape[1]:
            raise HostError(f"{name} must have shape ({experts}, L, {input.shape[1]}) "
                            f"[E, L, H], not {operand.shape}")
        operands.append(_same_format(name, operand, input))
    if operands[0].shape != operands[1].shape:
        raise HostError(f"expert_scale and expert_bias must have one shape [E, L, H], not "
                        f"{operands[0].shape} and {operands[1].shape}")
    if operands[0].shape[1] == 0:
        raise HostError("expert_scale has L = 0 layers: an expert stack needs at least one")
    return operands


def _chain(prob):
    """The golden chain's intermediate: the expert buffer after the experts [E*C, H] (every
    slot, as golden.moe_layer computes it)."""
    experts, capacity = prob.num_experts, prob.capacity
    dispatched = golden.dispatch_forward(np.ones_like(prob.gates_k), prob.indices,
                                         prob.locations, prob.input, num_experts=experts,
                                         capacity=capacity)
    buffer = dispatched.reshape(experts, capacity, prob.hidden)
    if prob.stacked:
        buffer = golden.expert_stacks(buffer, prob.scale, prob.bias, bool(prob.relu),
                                      prob.input)
    else:
        for operand, op in ((prob.scale, mul), (prob.bias, add)):
            if operand is not None:
                buffer = op(buffer, np.broadcast_to(operand.reshape(experts, 1, 1),
                                                    buffer.shape))
    return buffer.reshape(experts * capacity, prob.hidden)


def phase_durations(phase_log, cycles):
    """Cycles spent in each phase, from the bench's (cycle, phase) change log: a phase lasts
    from the cycle the previous one ended (the start cycle for the first) to its own end."""
    durations = dict.fromkeys(PHASE_NAMES, 0)
    names = {value: name for name, value in PHASES.items()}
    begin, current = 0, "route_dispatch"
    for cycle, phase in np.asarray(phase_log).reshape(-1, 2).tolist():
        if names[phase] == current:
            continue
        if current in durations:
            durations[current] += cycle - begin
        begin, current = cycle, names[phase]
    if current in durations:
        durations[current] += cycles - begin
    return durations


def _expected_expert_log(prob, buffer, lanes):
    """The expert phase's exact read/write sequence: every filled row of every expert, in
    expert then slot order, each row's beats in ascending address: ``(addr, enable, data
    bits)``."""
    hidden, capacity = prob.hidden, prob.capacity
    beats = row_beats(hidden, lanes)
    addrs, enables, datas = [], [], []
    if prob.runs_experts:
        bits = to_bits(buffer, prob.fmt).astype(np.uint64)
        padded = np.zeros((bits.shape[0], beats * lanes), dtype=np.uint64)
        padded[:, :hidden] = bits
        for expert, filled in enumerate(prob.filled_rows.tolist()):
            for slot in range(filled):
                row = expert * capacity + slot
                for b in range(beats):
                    addrs.append(row * hidden + b * lanes)
                    enables.append(last_enable(hidden, lanes) if b == beats - 1 else
                                   (1 << lanes) - 1)
                    datas.append(padded[row, b * lanes:(b + 1) * lanes])
    return (np.array(addrs, np.int64), np.array(enables, np.int64),
            np.array(datas, np.uint64).reshape(len(addrs), lanes))


class MoELayer(Unit):
    name = "moe_layer"
    summary = ("the whole MoE layer (postscore): locations -> dispatch -> affine experts -> "
               "combine over one external expert buffer (SPEC 1.8)")
    golden = "golden.moe_layer"
    params = MoELayerParams
    axi_params = AXI_READ_PARAMS
    inputs = ("gates", "input", "expert_scale", "expert_bias")
    outputs = ("output", "dropped")
    runtime = ("capacity", "memory_latency", "relu")
    ideal = ("one beat per cycle on the busiest port in every phase: "
             "k*S*B + R*B + max(k, 1)*S*B (expert stacks: (E + R)*L*B in place of R*B)")

    def build(self, params):
        return MoELayerUnit(params)

    # ---- the problem -------------------------------------------------------------------
    def problem(self, inputs, runtime):
        gates, input = need(inputs, self.name, ("gates", "input"))
        capacity = runtime_int("capacity", runtime, inputs) \
            if "capacity" in runtime or "capacity" in inputs else None
        latency = memory_latency(runtime, inputs)
        relu = runtime_int("relu", runtime, inputs) \
            if "relu" in runtime or "relu" in inputs else 0
        return {"layer": layer_problem(gates, input, capacity, inputs.get("expert_scale"),
                                       inputs.get("expert_bias"), latency, relu)}

    def params_for(self, problem, settings):
        prob = problem["layer"]
        params = self.sized(settings, format=prob.fmt.name, max_tokens=max(1, prob.tokens),
                            max_hidden=max(1, prob.hidden),
                            max_experts=max(1, prob.num_experts),
                            max_capacity=max(1, prob.capacity), max_top_k=max(1, prob.top_k),
                            **({"experts": "scan_layers", "max_layers": prob.layers}
                               if prob.stacked else {}))
        self.fits(problem, params)
        return params

    def fits(self, problem, params):
        prob = problem["layer"]
        check_dtype(params.format, input=prob.input)
        check_maxima(params, tokens=(prob.tokens, "max_tokens"),
                     hidden=(prob.hidden, "max_hidden"),
                     num_experts=(prob.num_experts, "max_experts"),
                     capacity=(prob.capacity, "max_capacity"),
                     top_k=(prob.top_k, "max_top_k"))
        if prob.stacked and not params.stacked:
            raise HostError("expert_scale and expert_bias are [E, L, H] (expert stacks), but "
                            "the unit has experts=affine; build it with experts=scan_layers")
        if prob.stacked:
            check_maxima(params, layers=(prob.layers, "max_layers"))
        if prob.relu and not prob.stacked:
            raise HostError("relu=1 applies to expert stacks only (expert_scale and "
                            "expert_bias [E, L, H])")

    # ---- the simulation ----------------------------------------------------------------
    def pack(self, problem, params, *, stall, seed):
        self.fits(problem, params)
        prob, fmt = problem["layer"], params.fmt
        tokens, hidden, experts = prob.tokens, prob.hidden, prob.num_experts
        beats = row_beats(hidden, params.lanes)
        one, minus_zero = np.ones(experts, fmt.dtype), np.full(experts, -0.0, fmt.dtype)
        scale = one if prob.scale is None else prob.scale
        bias = minus_zero if prob.bias is None else prob.bias   # x + -0.0 == x, bit for bit
        if params.stacked:
            # A stack unit runs affine experts as one-layer stacks (the same two roundings).
            if not prob.stacked:
                scale, bias = (np.broadcast_to(v.reshape(experts, 1, 1), (experts, 1, hidden))
                               for v in (scale, bias))
            scale, bias = (lane_beats(to_bits(v.reshape(experts * v.shape[1], hidden), fmt),
                                      params.lanes)
                           for v in (scale, bias))
        stimulus = {
            "pair_gate": to_bits(prob.gates_k.reshape(-1), fmt).astype(np.uint64),
            "pair_index": prob.indices.reshape(-1).astype(np.int64),
            "row": np.tile(np.arange(tokens), prob.top_k),   # k-major: pair -> token row
            "input": to_bits(prob.input, fmt).astype(np.uint64),
            "scale": to_bits(scale, fmt).astype(np.uint64) if not params.stacked else scale,
            "bias": to_bits(bias, fmt).astype(np.uint64) if not params.stacked else bias,
        }
        settings = {
            "lanes": params.lanes, "width": fmt.width,
            "runtime": {"tokens": tokens, "hidden": hidden, "top_k": prob.top_k,
                        "num_experts": experts, "capacity": prob.capacity,
                        "affine": int(prob.affine),
                        **({"layers": max(prob.layers, 1), "relu": prob.relu}
                           if params.stacked else {})},
            "feed_pairs": tokens > 0, "feed_data": prob.feeds_data,
            "feed_params": prob.affine and tokens > 0,
            "memory_latency": prob.memory_latency,
            "memory_size": experts * prob.capacity * hidden,
            "expected_beats": tokens * beats,
            "expected_reads": (prob.expert_rows + int(prob.valid.sum())) * beats,
        }
        return stimulus, settings

    def fast(self, stimulus, settings):
        """sim/bench_moe_layer.py on the fast path: the same streams and results (the expert
        buffer is one memory behind the read and the write port)."""
        pairs = len(stimulus["pair_gate"]) if settings["feed_pairs"] else 0
        beats = lane_beats(stimulus["input"][stimulus["row"]], settings["lanes"]) \
            if settings["feed_data"] else np.zeros((0, settings["lanes"]), np.uint64)
        experts = len(stimulus["scale"]) if settings["feed_params"] else 0
        expected = settings["expected_beats"] + settings["expected_reads"]
        return FastBench(
            streams={"pair": Source({"gate": stimulus["pair_gate"][:pairs],
                                     "index": stimulus["pair_index"][:pairs]}),
                     "data": Source({"data": beats}),
                     "expert_params": Source({name: stimulus[name][:experts]
                                              for name in ("scale", "bias")}),
                     "read_request": MemoryReader("read_response", "write",
                                                  settings["memory_latency"],
                                                  requests=2 * expected + 16),
                     # Dispatch writes an element once; the expert phase (affine or
                     # stacked) rewrites each filled row in place once more.
                     "write": MemoryWriter(size=settings["memory_size"],
                                           depth=2 * len(beats) + 16,
                                           max_writes=1 + settings["runtime"]["affine"]),
                     "output": Sink(depth=2 * settings["expected_beats"] + 16)},
            sizes=settings["runtime"], monitors={"phase": 64},
            results={"data": "output.data", "enable": "output.enable", "last": "output.last",
                     "request_addr": "read_request.addr",
                     "request_enable": "read_request.enable", "write_addr": "write.addr",
                     "write_enable": "write.enable", "write_data": "write.data",
                     "memory": "write.memory",
                     "read_out_of_bounds": "read_request.out_of_bounds",
                     "write_out_of_bounds": "write.out_of_bounds", "pairs_taken": "pair.sent",
                     "data_taken": "data.sent", "params_taken": "expert_params.sent",
                     "phase_log": "phase.log", "dropped": "dropped", "error": "error",
                     "busy_after": "busy"},
            limit=40 * (expected + len(beats) + pairs) + 4000, what="moe_layer")

    def unpack(self, problem, params, results):
        prob, fmt = problem["layer"], params.fmt
        tokens, hidden = prob.tokens, prob.hidden
        beats = row_beats(hidden, params.lanes)
        data = results["data"]
        if tokens and hidden and len(data) == tokens * beats:
            output = data.reshape(tokens, beats * params.lanes)[:, :hidden]
        else:
            output = np.zeros((tokens, hidden), dtype=np.uint64)
        results["phase_cycles"] = phase_durations(results["phase_log"], int(results["cycles"]))
        results["buffer"] = from_bits(results["memory"].astype(fmt.uint_dtype), fmt).reshape(
            prob.num_experts * prob.capacity, hidden)
        return {"output": from_bits(output.astype(fmt.uint_dtype), fmt),
                "dropped": np.int64(results["dropped"])}

    def score(self, problem, params, outputs, results):
        """Against ``golden.moe_layer`` and the chain's intermediate buffer, with scoreboards:
        every output beat (count, order, enables, ``last``), every write (the dispatch rows,
        then the expert rows, in order) and every read (the expert rows, then the combine's
        gathers in its schedule), nothing out of bounds, every input beat taken, no error."""
        prob, fmt, lanes = problem["layer"], params.fmt, params.lanes
        tokens, hidden, k = prob.tokens, prob.hidden, prob.top_k
        beats = row_beats(hidden, lanes)
        want, want_dropped = golden.moe_layer(prob.gates, prob.input, capacity=prob.capacity,
                                              scale=prob.scale, bias=prob.bias,
                                              relu=bool(prob.relu))
        findings = compare_bits("output vs golden.moe_layer", outputs["output"], want, fmt)
        findings += compare_values("dropped", outputs["dropped"], want_dropped)
        if int(results["error"]):
            findings.append("error flag set")
        out_of_bounds = int(results["read_out_of_bounds"]) + int(results["write_out_of_bounds"])
        if out_of_bounds:
            findings.append(f"{out_of_bounds} lanes read or written out of bounds")

        # Output beats: S * B in token order, enables and last flags.
        enable = np.tile([(1 << lanes) - 1] * (beats - 1) + [last_enable(hidden, lanes)],
                         tokens) if beats else np.zeros(0, np.int64)
        last = np.tile([0] * (beats - 1) + [1], tokens) if beats else np.zeros(0, np.int64)
        findings += compare_log("output beats", {"enable": results["enable"],
                                                 "last": results["last"]},
                                {"enable": enable, "last": last})

        # The buffer: filled slots as the chain computes them; every other slot never written.
        chained = _chain(prob)
        filled = np.zeros(chained.shape[0], dtype=bool)
        for expert, count in enumerate(prob.filled_rows.tolist()):
            filled[expert * prob.capacity: expert * prob.capacity + count] = True
        buffer = results["buffer"]
        findings += compare_bits("expert buffer (filled slots)", buffer[filled],
                                 chained[filled], fmt)
        if np.any(to_bits(buffer, fmt)[~filled] != 0):
            findings.append("an unfilled expert-buffer slot was written")

        # Writes: dispatch rows (gate 1.0) in pair order, then the expert rows.
        dispatched = expected_writes(np.ones_like(prob.gates_k), prob.indices, prob.locations,
                                     prob.input, num_experts=prob.num_experts,
                                     capacity=prob.capacity, lanes=lanes)
        if not prob.feeds_data:
            dispatched = {name: value[:0] for name, value in dispatched.items()}
        x_addr, x_enable, x_data = _expected_expert_log(prob, chained, lanes)
        on = (results["write_enable"][:, None] >> np.arange(lanes)) & 1 == 1
        findings += compare_log(
            "writes", {"addr": results["write_addr"], "enable": results["write_enable"],
                       "data": np.where(on, results["write_data"], 0)},
            {"addr": np.concatenate([dispatched["addr"], x_addr]),
             "enable": np.concatenate([dispatched["enable"], x_enable]),
             "data": np.concatenate([dispatched["data"].reshape(-1, lanes), x_data])}, fmt)

        # Reads: the expert rows, then the combine's gathers (valid pairs, in its schedule).
        rows = slot_rows(prob.indices, prob.locations, prob.num_experts, prob.capacity)
        c_addr, c_enable = [], []
        if hidden and tokens:
            for p, i, b in gather_schedule(tokens, beats, k, params.combine.window_items):
                if k and rows[p, i] >= 0:
                    c_addr.append(int(rows[p, i]) * hidden + b * lanes)
                    c_enable.append(last_enable(hidden, lanes) if b == beats - 1 else
                                    (1 << lanes) - 1)
        findings += compare_log(
            "reads", {"addr": results["request_addr"], "enable": results["request_enable"]},
            {"addr": np.concatenate([x_addr, np.array(c_addr, np.int64)]),
             "enable": np.concatenate([x_enable, np.array(c_enable, np.int64)])})

        # Every input beat taken.
        want_taken = {"pairs": k * tokens if tokens else 0,
                      "data": k * tokens * beats if prob.feeds_data else 0,
                      "params": self._param_beats(prob, params)}
        for name, count in want_taken.items():
            taken = int(results[f"{name}_taken"])
            if taken != count:
                findings.append(f"the unit took {taken} {name} beats, expected {count}")
        if int(results["busy_after"]):
            findings.append("busy after done")
        return findings

    @staticmethod
    def _param_beats(prob, params):
        """The expert_params beats a run takes: E (affine experts), E*L*B (stacks; none
        when H = 0)."""
        if not (prob.affine and prob.tokens):
            return 0
        if params.stacked:
            return prob.num_experts * max(prob.layers, 1) * row_beats(prob.hidden, params.lanes)
        return prob.num_experts

    # ---- cycles ----------------------------------------------------------------------------
    def phase_ideals(self, problem, params):
        """One beat (or pair) per cycle per phase: route and dispatch overlap (k*S*B, at
        least one cycle per pair); experts R*B (stacks: E*L*B parameter beats and R*L*B
        layer beats); combine one read beat per cycle
        (max(k, 1)*S*B)."""
        prob = problem["layer"]
        beats = row_beats(prob.hidden, params.lanes)
        experts = prob.expert_rows * beats
        if params.stacked:     # every expert's L*B parameter beats, then L passes per row
            experts = self._param_beats(prob, params) + \
                prob.expert_rows * max(prob.layers, 1) * beats
        return {"route_dispatch": max(prob.pairs, prob.pairs * beats if prob.feeds_data
                                      else 0) if prob.tokens else 0,
                "experts": experts,
                "combine": max(prob.top_k, 1) * prob.tokens * beats}

    def ideal_cycles(self, problem, params):
        """The whole run's: the sum of :meth:`phase_ideals`."""
        return sum(self.phase_ideals(problem, params).values())

    def _timing(self, problem):
        prob = problem["layer"]
        return dict(tokens=prob.tokens, hidden=prob.hidden, top_k=prob.top_k,
                    num_experts=prob.num_experts, capacity=prob.capacity,
                    rows=prob.expert_rows, affine=prob.affine, reads=bool(prob.valid.any()),
                    memory_latency=prob.memory_latency,
                    filled=tuple(prob.filled_rows.tolist()), layers=max(prob.layers, 1))

    def phase_cycles(self, problem, params):
        """The exact stall-free cycles of each phase (:meth:`MoELayerParams.phase_cycles`)."""
        return params.phase_cycles(**self._timing(problem))

    def cycles(self, problem, params):
        """The whole run's exact stall-free cycles, the three phases together
        (:meth:`MoELayerParams.cycles`)."""
        return params.cycles(**self._timing(problem))

    def describe(self, problem, params):
        prob = problem["layer"]
        return (f"moe_layer: S={prob.tokens}, E={prob.num_experts}, k={prob.top_k}, "
                f"H={prob.hidden}, C={prob.capacity}, "
                f"{self._expert_kind(prob)} experts, lanes={params.lanes}, "
                f"{params.format}, memory latency {prob.memory_latency}")

    @staticmethod
    def _expert_kind(prob):
        if prob.stacked:
            return f"scan_layers (L={prob.layers}{', relu' if prob.relu else ''})"
        return "affine" if prob.affine else "identity"

    # ---- benchmark ---------------------------------------------------------------------------
    def bench_problems(self, shape, seed=0):
        """A seeded random top-k layer with affine experts at ``shape``, its capacity by
        default from the factor 1.25."""
        rng = np.random.default_rng(seed)
        dtype = FORMATS[shape.format].dtype
        gates = layer_gates(rng, shape.tokens, shape.experts, shape.top_k, dtype)
        inputs = {
            "gates": gates,
            "input": rng.standard_normal((shape.tokens, shape.hidden)).astype(dtype),
            "expert_scale": rng.uniform(0.5, 2.0, shape.experts).astype(dtype),
            "expert_bias": rng.standard_normal(shape.experts).astype(dtype),
        }
        capacity = shape.capacity if shape.capacity is not None else \
            golden.capacity_from_factor(DEFAULT_CAPACITY_FACTOR, shape.tokens, shape.experts,
                                        shape.top_k)
        return {"": (inputs, {"capacity": capacity, "lanes": shape.lanes})}


UNIT = MoELayer()
