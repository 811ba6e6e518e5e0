"""Host side of the combine_scatter unit (SPEC 1.3 ``combine``): check a user's tensors, run
them through the emitted Verilog, and score the token buffer and the read/write logs against
the golden model."""

import math
from dataclasses import dataclass

import numpy as np

from .. import golden
from ..formats import FORMATS, bits_equal, from_bits, to_bits
from ..golden._common import add, mul
from ..registry import Unit
from ..units.combine_scatter import CombineScatterParams, CombineScatterUnit
from .common import HostError, format_of, need

__all__ = ["CombineScatterRun", "combine_scatter_params_for", "run_combine_scatter",
           "run_combine_slots", "run_combine_batch", "gate_problem", "scatter_add_reference",
           "expected_transactions", "score_combine_scatter", "adversarial_gates",
           "benchmark_combine_scatter"]

DEFAULT_READ_LATENCY = 2      # the bench memory's read latency unless told otherwise


@dataclass
class CombineScatterRun:
    combined: np.ndarray      # [S, ...], the token buffer after the run
    dropped: int
    error: bool
    cycles: int
    writes: dict              # the write log: addr [W], enable [W], data [W, lanes] (bits)
    reads: dict               # the read-request log: addr [R], enable [R]
    out_of_bounds: int        # enabled lanes read or written outside [0, S*H)
    ideal_cycles: int         # one beat per cycle: slots * ceil(H / lanes)
    expected_cycles: int      # the exact stall-free count (formula incl. hazard stalls)
    read_latency: int


def _rows(expert_out):
    """``expert_out`` [n, ...] as [n, H] (H = the product of the trailing dims)."""
    expert_out = np.asarray(expert_out)
    if expert_out.ndim < 1:
        raise HostError(f"expert_out must have at least 1 dimension [slots, ...], not shape "
                        f"{expert_out.shape}")
    return expert_out.reshape(expert_out.shape[0], int(np.prod(expert_out.shape[1:])))


def combine_scatter_params_for(slots, tokens, hidden, format, **overrides):
    """The smallest :class:`CombineScatterParams` that holds this problem (overrides win)."""
    fields = dict(format=format, max_tokens=max(1, tokens), max_slots=max(1, slots),
                  max_hidden=max(1, hidden))
    fields.update(overrides)
    return CombineScatterParams(**fields)


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
    """The scoreboard: the exact read requests ``(addr, enable)`` and writes
    ``(addr, enable, data bits)`` the unit must issue, valid slots in order, each slot's beats
    in ascending address."""
    rows = _rows(expert_out)
    fmt = format_of(rows)
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
    return (np.array(addrs, np.int64), np.array(enables, np.int64),
            np.array(datas, np.uint64).reshape(len(addrs), lanes))


def _check_slots(batch_index, nonzero_gates, rows, tokens, params):
    batch_index = np.asarray(batch_index)
    if batch_index.ndim != 1 or (batch_index.size and batch_index.dtype.kind not in "iu"):
        raise HostError(f"batch_index must be a 1-D integer array, not {batch_index.dtype} "
                        f"of shape {batch_index.shape}")
    batch_index = batch_index.astype(np.int64)
    nonzero_gates = np.asarray(nonzero_gates)
    if nonzero_gates.shape != batch_index.shape:
        raise HostError(f"nonzero_gates has shape {nonzero_gates.shape}, but batch_index has "
                        f"{batch_index.shape}; they must match")
    if rows.shape[0] != batch_index.size:
        raise HostError(f"expert_out has {rows.shape[0]} rows, but there are "
                        f"{batch_index.size} slots (one row per nonzero gate)")
    if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 0:
        raise HostError(f"tokens must be a non-negative integer, not {tokens!r}")
    fmt = FORMATS[params.format]
    for name, array in (("nonzero_gates", nonzero_gates), ("expert_out", rows)):
        if array.dtype != fmt.dtype:
            raise HostError(f"{name} has dtype {array.dtype}, but the unit's format is "
                            f"{fmt.name} ({fmt.dtype})")
    for name, value, maximum in (("tokens", tokens, params.max_tokens),
                                 ("slots", batch_index.size, params.max_slots),
                                 ("hidden", rows.shape[1], params.max_hidden)):
        if value > maximum:
            raise HostError(f"{name} = {value} exceeds the unit's maximum of {maximum}")
    lo, hi = -(1 << (params.index_width - 1)), (1 << (params.index_width - 1)) - 1
    bad = np.flatnonzero((batch_index < lo) | (batch_index > hi))
    if bad.size:
        raise HostError(f"batch_index[{bad[0]}] = {batch_index[bad[0]]} does not fit the "
                        f"{params.index_width}-bit header field (index_width)")
    return batch_index, nonzero_gates


def run_combine_slots(batch_index, nonzero_gates, expert_out, *, tokens, params=None,
                      sim="verilator", stall=0.0, seed=0, read_latency=DEFAULT_READ_LATENCY,
                      progress=None):
    """Run the unit on an explicit slot order: slot s adds ``nonzero_gates[s] *
    expert_out[s]`` into token ``batch_index[s]`` of an [tokens, H] buffer that starts at
    +0.0 (any order, so hand-made adversarial ones too). Returns a
    :class:`CombineScatterRun`."""
    problem = dict(batch_index=batch_index, nonzero_gates=nonzero_gates,
                   expert_out=expert_out, tokens=tokens)
    if params is None:
        rows = _rows(expert_out)
        params = combine_scatter_params_for(len(rows), tokens, rows.shape[1], format_of(rows))
    return run_combine_batch([problem], params=params, sim=sim, stall=stall, seed=seed,
                             read_latency=read_latency, progress=progress)[0]


def run_combine_batch(problems, *, params, sim="verilator", stall=0.0, seed=0,
                      read_latency=DEFAULT_READ_LATENCY, progress=None):
    """Run several problems back to back on ONE simulated unit (each started after the
    previous one's ``done``, without a reset): one Verilog emission and one simulator start
    for all. ``problems`` are dicts with the arguments of :func:`run_combine_slots`
    (``batch_index``, ``nonzero_gates``, ``expert_out``, ``tokens``) and optionally their
    own ``stall``, ``seed``, ``read_latency``. Returns one :class:`CombineScatterRun` each."""
    if isinstance(read_latency, bool) or not isinstance(read_latency, int) or read_latency < 1:
        raise HostError(f"read_latency must be a positive integer, not {read_latency!r}")
    fmt = FORMATS[params.format]
    stimulus, settings, checked = {}, [], []
    for number, problem in enumerate(problems):
        rows = _rows(problem["expert_out"])
        tokens = problem["tokens"]
        batch_index, nonzero_gates = _check_slots(problem["batch_index"],
                                                  problem["nonzero_gates"], rows, tokens,
                                                  params)
        slots, hidden = rows.shape
        latency = problem.get("read_latency", read_latency)
        feed = slots > 0 and tokens > 0 and hidden > 0
        prefix = f"p{number}_"
        stimulus.update({
            prefix + "token": batch_index,
            prefix + "gate": to_bits(nonzero_gates, fmt).astype(np.uint64),
            prefix + "expert_out": to_bits(rows, fmt).astype(np.uint64),
            prefix + "initial": np.zeros(tokens * hidden, dtype=np.uint64),
        })
        settings.append({"tokens": int(tokens), "slots": slots, "hidden": hidden,
                         "feed": feed, "stall": float(problem.get("stall", stall)),
                         "seed": int(problem.get("seed", seed)), "read_latency": latency})
        checked.append((batch_index, tokens, slots, hidden, feed, latency))

    from ..flows.simulate import simulate
    res = simulate(CombineScatterUnit(params), "combine_scatter", "bench_combine_scatter",
                   stimulus, sim=sim, settings={"lanes": params.lanes, "width": fmt.width,
                                                "problems": settings},
                   progress=progress)
    runs = []
    for number, (batch_index, tokens, slots, hidden, feed, latency) in enumerate(checked):
        r = {key[len(f"p{number}_"):]: value for key, value in res.items()
             if key.startswith(f"p{number}_")}
        order = [t if 0 <= t < tokens else None for t in batch_index.tolist()] if feed else []
        runs.append(CombineScatterRun(
            combined=from_bits(r["memory"], fmt).reshape(tokens, hidden),
            dropped=int(r["dropped"]), error=bool(r["error"]), cycles=int(r["cycles"]),
            writes={"addr": r["write_addr"], "enable": r["write_enable"],
                    "data": r["write_data"]},
            reads={"addr": r["read_addr"], "enable": r["read_enable"]},
            out_of_bounds=int(r["out_of_bounds"]),
            ideal_cycles=slots * -(-hidden // params.lanes) if feed else 0,
            expected_cycles=params.replay_cycles(order, hidden, latency),
            read_latency=latency))
    return runs


def _gate_slots(gates, expert_out):
    try:
        batch_index, _, nonzero_gates = golden.sparse_dispatch_indices(gates)
    except (TypeError, ValueError) as error:
        raise HostError(str(error)) from None
    expert_out = np.asarray(expert_out)
    if expert_out.dtype != nonzero_gates.dtype:
        raise HostError(f"expert_out has dtype {expert_out.dtype}, but gates has "
                        f"{nonzero_gates.dtype}; they must share one format")
    return batch_index, nonzero_gates, np.asarray(gates).shape[0]


def gate_problem(gates, expert_out):
    """A :func:`run_combine_batch` problem from a gate matrix and the stitched expert
    outputs."""
    batch_index, nonzero_gates, tokens = _gate_slots(gates, expert_out)
    return dict(batch_index=batch_index, nonzero_gates=nonzero_gates, expert_out=expert_out,
                tokens=tokens)


def run_combine_scatter(gates, expert_out, *, params=None, sim="verilator", stall=0.0, seed=0,
                        read_latency=DEFAULT_READ_LATENCY, progress=None):
    """Run ``sparse_combine(gates, expert_out)`` on the hardware. ``gates`` is the [S, E]
    gate matrix (``batch_index`` and ``nonzero_gates`` are derived with
    ``golden.sparse_dispatch_indices``), ``expert_out`` the stitched [slots, ...] expert
    outputs in slot order. ``run.combined`` has the shape [S, ...]."""
    batch_index, nonzero_gates, tokens = _gate_slots(gates, expert_out)
    expert_out = np.asarray(expert_out)
    run = run_combine_slots(batch_index, nonzero_gates, expert_out, tokens=tokens,
                            params=params, sim=sim, stall=stall, seed=seed,
                            read_latency=read_latency, progress=progress)
    run.combined = run.combined.reshape((tokens,) + expert_out.shape[1:])
    return run


def score_combine_scatter(run, batch_index, nonzero_gates, expert_out, *, tokens, lanes,
                          want=None):
    """Check ``run`` against the golden result ``want`` (default: the scatter-add of this
    slot order) bit for bit, and its read and write logs against the exact expected
    sequences: nothing lost, duplicated, reordered, or out of bounds. Returns a list of
    problems (empty when all is well)."""
    problems = []
    rows = _rows(expert_out)
    fmt = format_of(rows)
    if want is None:
        want = scatter_add_reference(batch_index, nonzero_gates, rows, tokens=tokens)
    got_bits = to_bits(run.combined, fmt).reshape(tokens, rows.shape[1])
    want_bits = to_bits(want, fmt).reshape(tokens, rows.shape[1])
    if got_bits.shape != want_bits.shape:
        problems.append(f"combined shape {got_bits.shape} != golden {want_bits.shape}")
    else:
        bad = np.argwhere(~bits_equal(got_bits, want_bits, fmt))
        if bad.size:
            r, c = bad[0]
            problems.append(f"{len(bad)} elements differ from golden; first at [{r}, {c}]: "
                            f"got {got_bits[r, c]:#x}, want {want_bits[r, c]:#x}")
    want_dropped = int(np.count_nonzero((np.asarray(batch_index) < 0) |
                                        (np.asarray(batch_index) >= tokens))) \
        if rows.shape[1] else 0
    if run.dropped != want_dropped:
        problems.append(f"dropped = {run.dropped}, expected {want_dropped}")
    if run.out_of_bounds:
        problems.append(f"{run.out_of_bounds} lanes read or written out of bounds")
    if run.error:
        problems.append("error flag set")
    addr, enable, data = expected_transactions(batch_index, nonzero_gates, rows,
                                               tokens=tokens, lanes=lanes)
    for what, got, expected in (("reads", run.reads, (addr, enable)),
                                ("writes", run.writes, (addr, enable, data))):
        if len(got["addr"]) != len(addr):
            problems.append(f"{len(got['addr'])} {what}, expected {len(addr)} "
                            "(lost or duplicated)")
            continue
        if not len(addr):
            continue
        checks = [("addr", got["addr"], addr), ("enable", got["enable"], enable)]
        if what == "writes":
            on = (got["enable"][:, None] >> np.arange(lanes)) & 1 == 1
            checks.append(("data", np.where(on, got["data"], 0), data))
        for name, g, w in checks:
            same = bits_equal(g, w, fmt) if name == "data" else np.asarray(g) == w
            bad = np.flatnonzero(~same.reshape(len(addr), -1).all(axis=1))
            if bad.size:
                problems.append(f"{what[:-1]} {bad[0]}: {name} {g[bad[0]]} != expected "
                                f"{w[bad[0]]} (reordered or wrong)")
    return problems


def adversarial_gates(tokens, experts, dtype=np.float32, seed=0):
    """A gate matrix whose slot order repeats a token on back-to-back slots at every expert
    boundary: expert e takes tokens e .. e + tokens - experts (a sliding window), so the last
    token of expert e is the first of expert e + 1 whenever the window is one token wide, and
    with ``tokens == 1`` every slot is the same token."""
    rng = np.random.default_rng(seed)
    gates = np.zeros((tokens, experts), dtype=dtype)
    width = max(1, tokens - experts + 1)
    for e in range(experts):
        first = min(e, tokens - 1)
        gates[first:first + width, e] = rng.uniform(0.1, 1.0, min(width, tokens - first))
    return gates


# ---- benchmark -------------------------------------------------------------------------------

def _random_topk_gates(tokens, experts, k, dtype, rng):
    gates = np.zeros((tokens, experts), dtype=dtype)
    for i in range(tokens):
        chosen = rng.permutation(experts)[:k]
        gates[i, chosen] = rng.uniform(0.05, 1.0, len(chosen)).astype(dtype)
    return gates


def benchmark_combine_scatter(tokens=1024, hidden=512, experts=8, k=2, lanes=16,
                              sim="verilator", read_latency=DEFAULT_READ_LATENCY, seed=0,
                              format="fp32", params=None, progress=None):
    """Cycles of the unit on a random top-k order and on adversarial orders, scored bit for
    bit. Returns ``{order: {ideal_cycles, cycles, expected_cycles, efficiency,
    beats_per_cycle, slots, beats, hazard_stalls, passed, problems}}``; ``hazard_window`` and
    the parameters at the top level.

    Orders: ``random`` (tutel-style top-k routing, slot order from the gate matrix),
    ``back_to_back`` (hand-made: every token's k slots on consecutive slots, the worst case
    for the hazard), ``back_to_back_short`` (the same with H = lanes, one beat per slot, so
    every repeat stalls for ``hazard_window - 1`` cycles) and ``all_experts`` (a gate matrix
    with every token routed to every expert, on ``experts`` tokens so that the token repeats
    ``experts`` slots apart). ``params`` (optional) must hold every case."""
    rng = np.random.default_rng(seed)
    if params is None:
        params = CombineScatterParams(format=format, lanes=lanes, max_tokens=max(tokens, 1),
                                      max_slots=max(tokens * max(k, experts), 1),
                                      max_hidden=max(hidden, 1))
    lanes, format = params.lanes, params.format
    fmt = FORMATS[format]
    cases = {}
    gates = _random_topk_gates(tokens, experts, k, fmt.dtype, rng)
    batch_index, _, nonzero_gates = golden.sparse_dispatch_indices(gates)
    cases["random"] = (batch_index, nonzero_gates, tokens, hidden, gates)
    order = np.repeat(np.arange(tokens), k)
    cases["back_to_back"] = (order, rng.uniform(0.05, 1, order.size).astype(fmt.dtype),
                             tokens, hidden, None)
    cases["back_to_back_short"] = (order, rng.uniform(0.05, 1, order.size).astype(fmt.dtype),
                                   tokens, lanes, None)
    all_gates = rng.uniform(0.05, 1.0, (experts, experts)).astype(fmt.dtype)
    batch_index, _, nonzero_gates = golden.sparse_dispatch_indices(all_gates)
    cases["all_experts"] = (batch_index, nonzero_gates, experts, hidden, all_gates)

    result = {"unit": "combine_scatter", "format": format, "lanes": lanes,
              "read_latency": read_latency, "sim": sim,
              "hazard_window": params.hazard_window(read_latency),
              "overhead": params.overhead(read_latency)}
    problems = []
    for index, gate_values, rows_tokens, rows_hidden, _ in cases.values():
        expert_out = rng.standard_normal((index.size, rows_hidden)).astype(fmt.dtype)
        problems.append(dict(batch_index=index, nonzero_gates=gate_values,
                             expert_out=expert_out, tokens=rows_tokens))
    if progress:
        progress(f"combine_scatter benchmark: orders {', '.join(cases)} in one simulation")
    runs = run_combine_batch(problems, params=params, sim=sim, read_latency=read_latency,
                             seed=seed, progress=progress)
    for (name, case), problem, run in zip(cases.items(), problems, runs):
        index, gate_values, rows_tokens, rows_hidden, gate_matrix = case
        want = golden.sparse_combine(gate_matrix, problem["expert_out"]) \
            if gate_matrix is not None else None
        problems_found = score_combine_scatter(run, index, gate_values, problem["expert_out"],
                                               tokens=rows_tokens, lanes=lanes, want=want)
        if run.cycles != run.expected_cycles:
            problems_found.append(f"{run.cycles} cycles, the formula says "
                                  f"{run.expected_cycles}")
        beats = index.size * -(-rows_hidden // lanes)
        result[name] = {
            "slots": int(index.size), "hidden": rows_hidden, "beats": beats,
            "ideal_cycles": run.ideal_cycles, "cycles": run.cycles,
            "expected_cycles": run.expected_cycles,
            "no_hazard_cycles": params.cycles(index.size, rows_hidden, read_latency),
            "hazard_stalls": run.expected_cycles - params.cycles(index.size, rows_hidden,
                                                                 read_latency),
            "efficiency": run.ideal_cycles / run.cycles if run.cycles else math.nan,
            "beats_per_cycle": beats / run.cycles if run.cycles else math.nan,
            "passed": not problems_found, "problems": problems_found,
        }
    return result


# ---- python -m moe_hw.run ----------------------------------------------------------------------

def _run(inputs, params, runtime, *, sim, stall, seed, check, progress):
    gates, expert_out = need(inputs, "combine_scatter", ("gates", "expert_out"))
    batch_index, nonzero_gates, tokens = _gate_slots(gates, expert_out)
    rows = _rows(expert_out)
    read_latency = runtime.get("read_latency", DEFAULT_READ_LATENCY)
    params = combine_scatter_params_for(len(rows), tokens, rows.shape[1], format_of(rows),
                                        **params)
    result = run_combine_scatter(gates, expert_out, params=params, sim=sim, stall=stall,
                                 seed=seed, read_latency=read_latency, progress=progress)
    outputs = {"combined": result.combined, "cycles": np.int64(result.cycles)}
    eff = result.ideal_cycles / result.cycles if result.cycles else 0.0
    report = [f"combine_scatter: {len(rows)} slots into S={tokens} tokens, H={rows.shape[1]}, "
              f"lanes={params.lanes}, {params.format}, memory read latency {read_latency}",
              f"cycles: {result.cycles} (ideal {result.ideal_cycles}, efficiency {eff:.4f}; "
              f"stall-free formula {result.expected_cycles})"]
    if check:
        problems = score_combine_scatter(result, batch_index, nonzero_gates, rows,
                                         tokens=tokens, lanes=params.lanes,
                                         want=golden.sparse_combine(gates, expert_out))
        if problems:
            raise AssertionError("hardware differs from golden.sparse_combine:\n  " +
                                 "\n  ".join(problems))
        report.append(f"check: bit-exact against golden.sparse_combine "
                      f"({result.combined.size} elements); read and write logs in order, no "
                      "loss, no duplicate, no out-of-bounds access")
    return outputs, report


UNITS = [Unit(
    "combine_scatter", "DUET sparse-dispatcher combine: gate multiply and scatter-add into a "
    "token buffer behind read/write ports, read-modify-write hazard tracker (SPEC 1.3)",
    CombineScatterParams, CombineScatterUnit, _run, runtime=("read_latency",),
    inputs=("gates", "expert_out"), outputs=("combined",))]
