"""Host side of the whole MoE layer (SPEC 1.8, ``moe_hw.units.moe_layer``): turn a gate matrix
and token rows into the unit's streams, run the emitted Verilog with the expert buffer modelled
behind a read port and a write port, and score the result against the chained golden model
``golden.moe_layer`` (tutel's ``postscore=True``), with scoreboards over every output beat,
every expert-buffer write and every read.

``benchmark()`` measures each phase against its ideal.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from .. import golden
from ..formats import FORMATS, bits_equal, from_bits, to_bits
from ..golden._common import add, float_array, mul, slot_rows
from ..registry import Unit
from ..units.combine_gather import gather_schedule
from ..units.moe_layer import PHASES, MoELayer, MoELayerParams
from ..blocks.row_reader import last_enable, row_beats
from .common import HostError, format_of, need, runtime_int
from .dispatch import expected_writes

__all__ = ["MoELayerRun", "MoELayerProblem", "moe_layer_problem", "moe_layer_params_for",
           "run_moe_layer", "score_moe_layer", "benchmark", "MEMORY_LATENCY",
           "DEFAULT_CAPACITY_FACTOR", "random_gate_matrix"]

#: The memory model's latency: a request taken at the end of cycle u is answered from cycle
#: u + 2 (an on-chip RAM with a registered output).
MEMORY_LATENCY = 2
#: The capacity factor used when no capacity is given: C = k * ceil(1.25 * S / E).
DEFAULT_CAPACITY_FACTOR = 1.25

PHASE_NAMES = ("route_dispatch", "experts", "combine")


@dataclass
class MoELayerProblem:
    """A checked problem: the golden's inputs and the hardware's view of them."""

    gates: np.ndarray         # [S, E]
    input: np.ndarray         # [S, H]
    capacity: int
    scale: np.ndarray | None  # [E]
    bias: np.ndarray | None   # [E]
    gates_k: np.ndarray       # [k, S]
    indices: np.ndarray       # [k, S]
    locations: np.ndarray     # [k, S]
    fmt: object

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
    def k(self):
        return self.indices.shape[0]

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


@dataclass
class MoELayerRun:
    output: np.ndarray        # [S, H]
    dropped: int
    error: bool
    cycles: int
    phase_cycles: dict        # measured cycles per phase (they sum to ``cycles``)
    expected_cycles: int      # the unit's stall-free formula
    expected_phase_cycles: dict
    ideal_cycles: dict        # one beat (or pair) per cycle per phase, and "total"
    buffer: np.ndarray        # [E*C, H]: the expert buffer after the run
    beats: dict               # output log: data [B, lanes] (bits), enable [B], last [B]
    writes: dict              # write log: addr [W], enable [W], data [W, lanes] (bits)
    requests: dict            # read log: addr [R], enable [R]
    out_of_bounds: int        # enabled lanes read or written outside the buffer
    taken: dict               # beats the unit took: pairs, data, params
    lanes: int
    window: int               # the combine unit's window (its read order)
    extra: dict = field(default_factory=dict)


def _problem(gates, input, capacity=None, expert_scale=None, expert_bias=None):
    try:
        gates = float_array("gates", gates, ndim=2, what="[S, E]")
        gates_k, indices = golden.top_k_routing(gates)
        input = float_array("input", input, ndim=2, what="[S, H]")
    except (TypeError, ValueError) as error:
        raise HostError(str(error)) from None
    if gates.dtype != input.dtype:
        raise HostError(f"gates has dtype {gates.dtype}, but input has {input.dtype}; they "
                        "must share one format")
    tokens, experts = gates.shape
    if input.shape[0] != tokens:
        raise HostError(f"input must have {tokens} rows (S, the rows of gates), not "
                        f"{input.shape[0]}")
    k = indices.shape[0]
    if capacity is None:
        capacity = golden.capacity_from_factor(DEFAULT_CAPACITY_FACTOR, tokens,
                                               max(experts, 1), max(k, 1))
    capacity = runtime_int("capacity", {"capacity": capacity}, {})
    operands = []
    for name, operand in (("expert_scale", expert_scale), ("expert_bias", expert_bias)):
        if operand is not None:
            try:
                operand = float_array(name, operand, ndim=(1, 2), what="[E]")
            except (TypeError, ValueError) as error:
                raise HostError(str(error)) from None
            if operand.ndim == 2:
                raise HostError(f"{name} must have shape ({experts},) [E]: the hardware's "
                                f"experts apply one {name[7:]} per expert, not per element "
                                f"(shape {operand.shape})")
            if operand.shape != (experts,):
                raise HostError(f"{name} must have shape ({experts},) [E], not "
                                f"{operand.shape}")
            if operand.dtype != input.dtype:
                raise HostError(f"{name} has dtype {operand.dtype}, but input has "
                                f"{input.dtype}; they must share one format")
        operands.append(operand)
    locations = golden.compute_locations(indices, num_experts=experts)
    return MoELayerProblem(gates, input, capacity, operands[0], operands[1], gates_k, indices,
                           locations, FORMATS[format_of(input)])


def moe_layer_problem(gates, input, *, capacity=None, expert_scale=None, expert_bias=None):
    """Check a problem as :func:`run_moe_layer` does (``capacity`` None: the default factor)."""
    return _problem(gates, input, capacity, expert_scale, expert_bias)


def moe_layer_params_for(gates, input, *, capacity, **overrides):
    """The smallest :class:`MoELayerParams` that holds this problem (overrides win)."""
    prob = _problem(gates, input, capacity)
    fields = dict(format=prob.fmt.name, max_tokens=max(1, prob.tokens),
                  max_hidden=max(1, prob.hidden), max_experts=max(1, prob.num_experts),
                  max_capacity=max(1, prob.capacity), max_k=max(1, prob.k))
    fields.update(overrides)
    return MoELayerParams(**fields)


def _chain(prob):
    """The golden chain's intermediate: the expert buffer after the experts [E*C, H] (every
    slot, as golden.moe_layer computes it), and the buffer right after dispatch."""
    experts, capacity = prob.num_experts, prob.capacity
    dispatched = golden.dispatch_forward(np.ones_like(prob.gates_k), prob.indices,
                                         prob.locations, prob.input, num_experts=experts,
                                         capacity=capacity)
    buffer = dispatched.reshape(experts, capacity, prob.hidden)
    for operand, op in ((prob.scale, mul), (prob.bias, add)):
        if operand is not None:
            buffer = op(buffer, np.broadcast_to(operand.reshape(experts, 1, 1), buffer.shape))
    return buffer.reshape(experts * capacity, prob.hidden), dispatched


def run_moe_layer(gates, input, *, capacity=None, expert_scale=None, expert_bias=None,
                  params=None, sim="verilator", stall=0.0, seed=0,
                  memory_latency=MEMORY_LATENCY, progress=None):
    """``golden.moe_layer(gates, input, capacity=capacity, scale=expert_scale,
    bias=expert_bias)`` on the hardware.

    ``gates`` [S, E] (k nonzero gates per row), ``input`` [S, H], optional ``expert_scale`` and
    ``expert_bias`` [E] (both None: identity experts), all in one format; ``capacity`` None
    takes ``golden.capacity_from_factor(1.25, S, E, k)``.
    """
    prob = _problem(gates, input, capacity, expert_scale, expert_bias)
    if params is None:
        params = moe_layer_params_for(prob.gates, prob.input, capacity=prob.capacity)
    fmt = FORMATS[params.format]
    if prob.fmt != fmt:
        raise HostError(f"the data has dtype {prob.input.dtype}, but the unit's format is "
                        f"{fmt.name} ({fmt.dtype})")
    for name, value, maximum in (("tokens (S)", prob.tokens, params.max_tokens),
                                 ("hidden", prob.hidden, params.max_hidden),
                                 ("num_experts", prob.num_experts, params.max_experts),
                                 ("capacity", prob.capacity, params.max_capacity),
                                 ("k", prob.k, params.max_k)):
        if value > maximum:
            raise HostError(f"{name} = {value} exceeds the unit's maximum of {maximum}")

    unit = MoELayer(params)
    tokens, hidden, experts, k = prob.tokens, prob.hidden, prob.num_experts, prob.k
    pairs = k * tokens
    beats = row_beats(hidden, params.lanes)
    one, minus_zero = np.ones(experts, fmt.dtype), np.full(experts, -0.0, fmt.dtype)
    scale = one if prob.scale is None else prob.scale
    bias = minus_zero if prob.bias is None else prob.bias   # x + -0.0 == x, bit for bit
    feed_data = pairs > 0 and hidden > 0 and prob.capacity > 0 and experts > 0
    rows = prob.filled_rows
    valid = slot_rows(prob.indices, prob.locations, experts, prob.capacity) >= 0
    expert_rows = int(rows.sum()) if prob.runs_experts else 0
    stimulus = {
        "pair_gate": to_bits(prob.gates_k.reshape(-1), fmt).astype(np.uint64),
        "pair_index": prob.indices.reshape(-1).astype(np.int64),
        "row": np.tile(np.arange(tokens), k),          # k-major: pair -> token row
        "input": to_bits(prob.input, fmt).astype(np.uint64),
        "scale": to_bits(scale, fmt).astype(np.uint64),
        "bias": to_bits(bias, fmt).astype(np.uint64),
    }
    settings = {
        "lanes": params.lanes, "width": fmt.width,
        "runtime": {"tokens": tokens, "hidden": hidden, "k": k, "num_experts": experts,
                    "capacity": prob.capacity, "affine": int(prob.affine)},
        "feed_pairs": tokens > 0, "feed_data": feed_data,
        "feed_params": prob.affine and tokens > 0, "stall": float(stall), "seed": int(seed),
        "memory_latency": int(memory_latency), "memory_size": experts * prob.capacity * hidden,
        "expected_beats": tokens * beats,
        "expected_reads": (expert_rows + int(valid.sum())) * beats,
    }
    from ..flows.simulate import simulate
    res = simulate(unit, "moe_layer", "bench_moe_layer", stimulus, sim=sim, settings=settings,
                   progress=progress)

    data = res["data"]
    if tokens and hidden and len(data) == tokens * beats:
        output = data.reshape(tokens, beats * params.lanes)[:, :hidden]
    else:
        output = np.zeros((tokens, hidden), dtype=np.uint64)
    cycles = int(res["cycles"])
    measured = _phase_durations(res["phase_log"], cycles)
    expected = unit.phase_cycles(tokens=tokens, hidden=hidden, k=k, num_experts=experts,
                                 capacity=prob.capacity, rows=expert_rows, affine=prob.affine,
                                 reads=bool(valid.any()), memory_latency=memory_latency)
    ideal = {"route_dispatch": max(pairs, pairs * beats if feed_data else 0) if tokens else 0,
             "experts": expert_rows * beats,
             "combine": max(k, 1) * tokens * beats}
    ideal["total"] = sum(ideal.values())
    return MoELayerRun(
        output=from_bits(output.astype(fmt.uint_dtype), fmt), dropped=int(res["dropped"]),
        error=bool(res["error"]), cycles=cycles, phase_cycles=measured,
        expected_cycles=unit.stall_free_cycles(
            tokens=tokens, hidden=hidden, k=k, num_experts=experts, capacity=prob.capacity,
            rows=expert_rows, affine=prob.affine, reads=bool(valid.any()),
            memory_latency=memory_latency),
        expected_phase_cycles=expected, ideal_cycles=ideal,
        buffer=from_bits(res["memory"].astype(fmt.uint_dtype), fmt).reshape(
            experts * prob.capacity, hidden),
        beats={"data": data, "enable": res["enable"], "last": res["last"]},
        writes={"addr": res["write_addr"], "enable": res["write_enable"],
                "data": res["write_data"]},
        requests={"addr": res["request_addr"], "enable": res["request_enable"]},
        out_of_bounds=int(res["read_out_of_bounds"]) + int(res["write_out_of_bounds"]),
        taken={"pairs": int(res["pairs_taken"]), "data": int(res["data_taken"]),
               "params": int(res["params_taken"])},
        lanes=params.lanes, window=params.combine.window_items,
        extra={"busy_after": int(res["busy_after"])})


def _phase_durations(phase_log, cycles):
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


def _compare(problems, what, got, want, fmt, on=None):
    """Bitwise comparison of two bit-pattern arrays (NaN equals NaN) on the lanes ``on``."""
    same = bits_equal(np.asarray(got, np.uint64), np.asarray(want, np.uint64), fmt)
    if on is not None:
        same = same | ~on
    bad = np.argwhere(~same)
    if bad.size:
        where = tuple(int(x) for x in bad[0])
        problems.append(f"{what}: {len(bad)} elements differ; first at {where}: got "
                        f"{int(np.asarray(got)[where]):#x}, want {int(np.asarray(want)[where]):#x}")


def _expected_expert_log(prob, buffer, lanes):
    """The expert phase's exact read/write sequence: every filled row of every expert, in
    expert then slot order, each row's beats in ascending address."""
    hidden, capacity = prob.hidden, prob.capacity
    beats = row_beats(hidden, lanes)
    addrs, enables, datas = [], [], []
    if not prob.runs_experts:
        return (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, lanes), np.uint64))
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


def score_moe_layer(run, gates, input, *, capacity=None, expert_scale=None, expert_bias=None):
    """Problems (a list of strings, empty when right) of ``run`` against ``golden.moe_layer``
    and the chain's intermediate buffer, with scoreboards: every output beat (count, order,
    enables, ``last``), every write (the dispatch rows, then the expert rows, in order) and
    every read (the expert rows, then the combine's gathers in its schedule), nothing out of
    bounds, every input beat taken, no error."""
    prob = _problem(gates, input, capacity, expert_scale, expert_bias)
    fmt, lanes = prob.fmt, run.lanes
    tokens, hidden, k = prob.tokens, prob.hidden, prob.k
    beats = row_beats(hidden, lanes)
    problems = []

    want, want_dropped = golden.moe_layer(prob.gates, prob.input, capacity=prob.capacity,
                                          scale=prob.scale, bias=prob.bias)
    if run.output.shape != want.shape:
        problems.append(f"output shape {run.output.shape} != golden {want.shape}")
    else:
        _compare(problems, "output vs golden.moe_layer", to_bits(run.output, fmt),
                 to_bits(want, fmt), fmt)
    if run.dropped != want_dropped:
        problems.append(f"dropped = {run.dropped}, golden {want_dropped}")
    if run.error:
        problems.append("error flag set")
    if run.out_of_bounds:
        problems.append(f"{run.out_of_bounds} lanes read or written out of bounds")

    # Output beats: S * B in token order, enables and last flags.
    enable = np.tile([(1 << lanes) - 1] * (beats - 1) + [last_enable(hidden, lanes)], tokens) \
        if beats else np.zeros(0, np.int64)
    last = np.tile([0] * (beats - 1) + [1], tokens) if beats else np.zeros(0, np.int64)
    if len(run.beats["enable"]) != len(enable):
        problems.append(f"{len(run.beats['enable'])} output beats, expected {len(enable)} "
                        "(lost or duplicated)")
    else:
        for name, got, exp in (("enable", run.beats["enable"], enable),
                               ("last", run.beats["last"], last)):
            bad = np.flatnonzero(np.asarray(got) != exp)
            if bad.size:
                problems.append(f"output beat {bad[0]}: {name} {got[bad[0]]}, expected "
                                f"{exp[bad[0]]}")

    # The buffer: filled slots as the chain computes them; every other slot never written.
    chained, dispatched = _chain(prob)
    filled = np.zeros(chained.shape[0], dtype=bool)
    for expert, count in enumerate(prob.filled_rows.tolist()):
        filled[expert * prob.capacity: expert * prob.capacity + count] = True
    if run.buffer.shape != chained.shape:
        problems.append(f"buffer shape {run.buffer.shape} != {chained.shape}")
    else:
        got_bits = to_bits(run.buffer, fmt)
        _compare(problems, "expert buffer (filled slots)", got_bits[filled],
                 to_bits(chained, fmt)[filled], fmt)
        if np.any(got_bits[~filled] != 0):
            problems.append("an unfilled expert-buffer slot was written")

    # Writes: dispatch rows (gate 1.0) in pair order, then the expert rows.
    d_addr, d_enable, d_data = expected_writes(
        np.ones_like(prob.gates_k), prob.indices, prob.locations, prob.input,
        num_experts=prob.num_experts, capacity=prob.capacity, lanes=lanes)
    if not (k * tokens and hidden and prob.capacity and prob.num_experts):
        d_addr, d_enable, d_data = d_addr[:0], d_enable[:0], d_data[:0]
    x_addr, x_enable, x_data = _expected_expert_log(prob, chained, lanes)
    w_addr = np.concatenate([d_addr, x_addr])
    w_enable = np.concatenate([d_enable, x_enable])
    w_data = np.concatenate([d_data.reshape(-1, lanes), x_data.reshape(-1, lanes)])
    got = run.writes
    if len(got["addr"]) != len(w_addr):
        problems.append(f"{len(got['addr'])} writes, expected {len(w_addr)} (lost or "
                        "duplicated)")
    elif len(w_addr):
        bad = np.flatnonzero((got["addr"] != w_addr) | (got["enable"] != w_enable))
        if bad.size:
            problems.append(f"write {bad[0]}: addr {got['addr'][bad[0]]} enable "
                            f"{got['enable'][bad[0]]:#x}, expected addr {w_addr[bad[0]]} "
                            f"enable {w_enable[bad[0]]:#x} (reordered or wrong)")
        else:
            on = (w_enable[:, None] >> np.arange(lanes)) & 1 == 1
            _compare(problems, "write data", got["data"], w_data, fmt, on)

    # Reads: the expert rows, then the combine's gathers (valid pairs, in its schedule).
    rows = slot_rows(prob.indices, prob.locations, prob.num_experts, prob.capacity)
    c_addr, c_enable = [], []
    if hidden and tokens:
        for p, i, b in gather_schedule(tokens, beats, k, run.window):
            if k and rows[p, i] >= 0:
                c_addr.append(int(rows[p, i]) * hidden + b * lanes)
                c_enable.append(last_enable(hidden, lanes) if b == beats - 1 else
                                (1 << lanes) - 1)
    r_addr = np.concatenate([x_addr, np.array(c_addr, np.int64)])
    r_enable = np.concatenate([x_enable, np.array(c_enable, np.int64)])
    got = run.requests
    if len(got["addr"]) != len(r_addr):
        problems.append(f"{len(got['addr'])} reads, expected {len(r_addr)} (lost or "
                        "duplicated)")
    elif len(r_addr):
        bad = np.flatnonzero((got["addr"] != r_addr) | (got["enable"] != r_enable))
        if bad.size:
            problems.append(f"read {bad[0]}: addr {got['addr'][bad[0]]} enable "
                            f"{got['enable'][bad[0]]:#x}, expected addr {r_addr[bad[0]]} "
                            f"enable {r_enable[bad[0]]:#x} (reordered or wrong)")

    # Every input beat taken.
    want_taken = {"pairs": k * tokens if tokens else 0,
                  "data": k * tokens * beats if (k * tokens and hidden and prob.capacity and
                                                 prob.num_experts) else 0,
                  "params": prob.num_experts if prob.affine and tokens else 0}
    for name, count in want_taken.items():
        if run.taken[name] != count:
            problems.append(f"the unit took {run.taken[name]} {name} beats, expected {count}")
    if run.extra.get("busy_after"):
        problems.append("busy after done")
    return problems


# ---- python -m moe_hw.run ------------------------------------------------------------------

def _report_lines(prob, run, params):
    eff = run.ideal_cycles["total"] / run.cycles if run.cycles else 0.0
    phases = ", ".join(f"{name} {run.phase_cycles[name]} (ideal {run.ideal_cycles[name]})"
                       for name in PHASE_NAMES)
    return [f"moe_layer: S={prob.tokens}, E={prob.num_experts}, k={prob.k}, H={prob.hidden}, "
            f"C={prob.capacity}, {'affine' if prob.affine else 'identity'} experts, "
            f"lanes={params.lanes}, {params.format}",
            f"cycles: {run.cycles} (ideal {run.ideal_cycles['total']}, efficiency {eff:.4f}, "
            f"stall-free formula {run.expected_cycles}); dropped pairs: {run.dropped}",
            f"phases: {phases}"]


def _run(inputs, params, runtime, *, sim, stall, seed, check, progress):
    gates, input = need(inputs, "moe_layer", ("gates", "input"))
    scale, bias = inputs.get("expert_scale"), inputs.get("expert_bias")
    if "capacity" in runtime or "capacity" in inputs:
        capacity = runtime_int("capacity", runtime, inputs)
    else:
        capacity = None
    prob = _problem(gates, input, capacity, scale, bias)
    params = moe_layer_params_for(prob.gates, prob.input, capacity=prob.capacity, **params)
    run = run_moe_layer(prob.gates, prob.input, capacity=prob.capacity, expert_scale=scale,
                        expert_bias=bias, params=params, sim=sim, stall=stall, seed=seed,
                        progress=progress)
    report = _report_lines(prob, run, params)
    if check:
        problems = score_moe_layer(run, prob.gates, prob.input, capacity=prob.capacity,
                                   expert_scale=scale, expert_bias=bias)
        if problems:
            raise AssertionError("hardware differs from golden.moe_layer:\n  " +
                                 "\n  ".join(problems))
        report.append(f"check: bit-exact against golden.moe_layer ({run.output.size} "
                      "elements, postscore); every output beat, write and read in order, "
                      "none lost, duplicated or out of bounds")
    return {"output": run.output, "dropped": np.int64(run.dropped),
            "cycles": np.int64(run.cycles)}, report


UNITS = [Unit(
    "moe_layer", "the whole MoE layer (postscore): locations -> dispatch -> affine experts -> "
    "combine over one external expert buffer (SPEC 1.8)", MoELayerParams, MoELayer, _run,
    runtime=("capacity",), inputs=("gates", "input", "expert_scale", "expert_bias"),
    outputs=("output", "dropped"))]


# ---- benchmark -------------------------------------------------------------------------------

def random_gate_matrix(rng, tokens, experts, k, dtype=np.float32, *, experts_used=None,
                       specials=0.0):
    """A top-k gate matrix [S, E]: k distinct experts per token (drawn from ``experts_used``,
    default all) with gates in (0, 1], the rest +0.0 or -0.0 (not routed). ``specials``: the
    fraction of routed gates replaced by NaN, +Inf or a subnormal."""
    used = np.arange(experts) if experts_used is None else np.asarray(experts_used)
    if k > len(used):
        raise HostError(f"k ({k}) must not exceed the experts used ({len(used)})")
    gates = np.where(rng.random((tokens, experts)) < 0.5, 0.0, -0.0).astype(np.float32)
    gates = gates.astype(dtype)
    fmt = FORMATS[format_of(gates)]
    for i in range(tokens):
        chosen = used[rng.permutation(len(used))[:k]]
        values = rng.uniform(0.05, 1.0, k).astype(np.float32).astype(dtype)
        for j, expert in enumerate(chosen):
            if rng.random() < specials:
                bits = rng.choice([fmt.quiet_nan, fmt.exp_max << fmt.mant_bits,
                                   int(rng.integers(1, 1 << fmt.mant_bits))])
                values[j] = np.array(bits, fmt.uint_dtype).view(fmt.dtype)
            gates[i, expert] = values[j]
    return gates


def benchmark(tokens=1024, hidden=512, experts=8, k=2, lanes=16, sim="verilator", *, seed=0,
              capacity_factor=DEFAULT_CAPACITY_FACTOR, affine=True, stall=0.0,
              memory_latency=MEMORY_LATENCY, **params):
    """Run a seeded random top-k layer (affine experts by default) and return the figures:
    ideal, stall-free formula and measured cycles per phase and in total, and the check.

    Ideals: route and dispatch overlap, one data beat per cycle (k*S*B); experts one beat per
    cycle over the filled rows (R*B); combine one read beat per cycle (k*S*B)."""
    rng = np.random.default_rng(seed)
    gates = random_gate_matrix(rng, tokens, experts, k)
    input = rng.standard_normal((tokens, hidden)).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, experts).astype(np.float32) if affine else None
    bias = rng.standard_normal(experts).astype(np.float32) if affine else None
    capacity = golden.capacity_from_factor(capacity_factor, tokens, experts, k)
    params = moe_layer_params_for(gates, input, capacity=capacity, lanes=lanes, **params)
    run = run_moe_layer(gates, input, capacity=capacity, expert_scale=scale, expert_bias=bias,
                        params=params, sim=sim, stall=stall, seed=seed,
                        memory_latency=memory_latency)
    problems = score_moe_layer(run, gates, input, capacity=capacity, expert_scale=scale,
                               expert_bias=bias)
    phases = {name: {"ideal": run.ideal_cycles[name], "formula":
                     run.expected_phase_cycles[name], "measured": run.phase_cycles[name]}
              for name in PHASE_NAMES}
    phases["total"] = {"ideal": run.ideal_cycles["total"], "formula": run.expected_cycles,
                       "measured": run.cycles}
    return {"unit": "moe_layer", "tokens": tokens, "hidden": hidden, "experts": experts, "k": k,
            "lanes": lanes, "capacity": capacity, "sim": sim, "stall": stall,
            "dropped": run.dropped, "filled_rows": int(_problem(gates, input, capacity)
                                                       .filled_rows.sum()),
            "phases": phases,
            "efficiency": run.ideal_cycles["total"] / run.cycles if run.cycles else math.nan,
            "passed": not problems, "problems": problems}
