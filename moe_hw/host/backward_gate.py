"""Host side of the dispatch_backward_gate unit (SPEC 1.1 backward, gate gradient): check a
user's tensors, run them through the emitted Verilog, and score the results and both read
logs against the golden model; plus the float64 error check of the hardware's sum order."""

import math
from dataclasses import dataclass

import numpy as np

from .. import golden
from ..formats import FORMATS, bits_equal, from_bits, to_bits
from ..golden._common import routing_arrays, slot_rows
from ..registry import Unit
from ..units.dispatch_backward_gate import BackwardGateParams, DispatchBackwardGateUnit
from .common import HostError, format_of, need, runtime_int

__all__ = ["BackwardGateRun", "backward_gate_params_for", "run_backward_gate",
           "run_backward_gate_batch",
           "expected_reads", "score_backward_gate", "float64_error",
           "benchmark_backward_gate"]

DEFAULT_READ_LATENCY = 2      # the bench memories' read latency unless told otherwise


@dataclass
class BackwardGateRun:
    grad_gates: np.ndarray    # the shape of indices
    results: int              # result beats the unit sent (must be k*S)
    dropped: int
    error: bool
    cycles: int
    input_reads: dict         # the input read-request log: addr [R], enable [R]
    grad_reads: dict          # the grad_dispatch read-request log
    out_of_bounds: int        # enabled lanes read outside either memory
    ideal_cycles: int         # one beat per cycle: pairs * ceil(H / lanes)
    expected_cycles: int      # the exact stall-free count
    read_latency: int


def _check(input, indices, locations, grad_dispatch, num_experts, capacity):
    """The problem as arrays ([k, S] routing), or a HostError naming the bad argument."""
    for name, value in (("num_experts", num_experts), ("capacity", capacity)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise HostError(f"{name} must be a non-negative integer, not {value!r}")
    try:
        indices, locations, _ = routing_arrays(indices, locations)
    except (TypeError, ValueError) as error:
        raise HostError(str(error)) from None
    input, grad_dispatch = np.asarray(input), np.asarray(grad_dispatch)
    fmt_name = format_of(input)
    if input.ndim != 2:
        raise HostError(f"input must have 2 dimensions [S, H], not shape {input.shape}")
    if input.shape[0] != indices.shape[1]:
        raise HostError(f"input has {input.shape[0]} rows, but indices has S = "
                        f"{indices.shape[1]} tokens")
    expected = (int(num_experts) * int(capacity), input.shape[1])
    if grad_dispatch.shape != expected:
        raise HostError(f"grad_dispatch must have shape {expected} (num_experts * capacity, "
                        f"H), not {grad_dispatch.shape}")
    if grad_dispatch.dtype != input.dtype:
        raise HostError(f"grad_dispatch has dtype {grad_dispatch.dtype}, but input has "
                        f"{input.dtype}; they must share one format")
    return input, indices, locations, grad_dispatch, int(num_experts), int(capacity), fmt_name


def backward_gate_params_for(input, indices, *, num_experts, capacity, **overrides):
    """The smallest :class:`BackwardGateParams` that holds this problem (overrides win)."""
    input, shape = np.asarray(input), np.shape(indices)
    k = shape[0] if len(shape) == 2 else 1
    fields = dict(format=format_of(input), max_tokens=max(1, input.shape[0]),
                  max_top_k=max(1, k), max_hidden=max(1, input.shape[1]),
                  max_capacity=max(1, capacity), max_experts=max(1, num_experts))
    fields.update(overrides)
    return BackwardGateParams(**fields)


def run_backward_gate(input, indices, locations, grad_dispatch, *, num_experts, capacity,
                      params=None, sim="verilator", stall=0.0, seed=0,
                      read_latency=DEFAULT_READ_LATENCY, progress=None):
    """Run ``dispatch_backward_gate`` on the hardware. Arguments as the golden model's;
    ``run.grad_gates`` has the shape of ``indices``."""
    problem = dict(input=input, indices=indices, locations=locations,
                   grad_dispatch=grad_dispatch, num_experts=num_experts, capacity=capacity)
    if params is None:
        checked = _check(input, indices, locations, grad_dispatch, num_experts, capacity)
        params = backward_gate_params_for(checked[0], checked[1], num_experts=checked[4],
                                          capacity=checked[5])
    return run_backward_gate_batch([problem], params=params, sim=sim, stall=stall, seed=seed,
                                   read_latency=read_latency, progress=progress)[0]


def run_backward_gate_batch(problems, *, params, sim="verilator", stall=0.0, seed=0,
                            read_latency=DEFAULT_READ_LATENCY, progress=None):
    """Run several problems back to back on ONE simulated unit (each started after the
    previous one's ``done``, without a reset): one Verilog emission and one simulator start
    for all. ``problems`` are dicts with the arguments of :func:`run_backward_gate`
    (``input``, ``indices``, ``locations``, ``grad_dispatch``, ``num_experts``,
    ``capacity``) and optionally their own ``stall``, ``seed``, ``read_latency``. Returns one
    :class:`BackwardGateRun` each."""
    fmt = FORMATS[params.format]
    stimulus, settings, checked = {}, [], []
    for number, problem in enumerate(problems):
        shape = np.shape(problem["indices"])
        input, indices, locations, grad_dispatch, num_experts, capacity, _ = _check(
            problem["input"], problem["indices"], problem["locations"],
            problem["grad_dispatch"], problem["num_experts"], problem["capacity"])
        if input.dtype != fmt.dtype:
            raise HostError(f"input has dtype {input.dtype}, but the unit's format is "
                            f"{fmt.name} ({fmt.dtype})")
        top_k, (tokens, hidden) = indices.shape[0], input.shape
        for name, value, maximum in (("tokens", tokens, params.max_tokens),
                                     ("top_k", top_k, params.max_top_k),
                                     ("hidden", hidden, params.max_hidden),
                                     ("capacity", capacity, params.max_capacity),
                                     ("num_experts", num_experts, params.max_experts)):
            if value > maximum:
                raise HostError(f"{name} = {value} exceeds the unit's maximum of {maximum}")
        lo, hi = -(1 << (params.index_width - 1)), (1 << (params.index_width - 1)) - 1
        for name, array in (("indices", indices), ("locations", locations)):
            bad = np.flatnonzero((array < lo) | (array > hi))
            if bad.size:
                raise HostError(f"{name}.flat[{bad[0]}] = {array.flat[bad[0]]} does not fit "
                                f"the {params.index_width}-bit header field (index_width)")
        latency = problem.get("read_latency", read_latency)
        if isinstance(latency, bool) or not isinstance(latency, int) or latency < 1:
            raise HostError(f"read_latency must be a positive integer, not {latency!r}")
        pairs = top_k * tokens
        reads = hidden > 0 and bool((slot_rows(indices, locations, num_experts,
                                               capacity) >= 0).any())
        prefix = f"p{number}_"
        stimulus.update({
            prefix + "index": indices.reshape(-1).astype(np.int64),
            prefix + "location": locations.reshape(-1).astype(np.int64),
            prefix + "input": to_bits(input, fmt).astype(np.uint64),
            prefix + "grad_dispatch": to_bits(grad_dispatch, fmt).astype(np.uint64),
        })
        settings.append({"tokens": tokens, "top_k": top_k, "hidden": hidden,
                         "capacity": capacity, "num_experts": num_experts,
                         "feed": pairs > 0, "stall": float(problem.get("stall", stall)),
                         "seed": int(problem.get("seed", seed)), "read_latency": latency})
        checked.append((shape, pairs, hidden, reads, latency))

    from ..flows.simulate import simulate
    res = simulate(DispatchBackwardGateUnit(params), "dispatch_backward_gate",
                   "bench_dispatch_backward_gate", stimulus, sim=sim,
                   settings={"lanes": params.lanes, "width": fmt.width, "problems": settings},
                   progress=progress)
    runs = []
    for number, (shape, pairs, hidden, reads, latency) in enumerate(checked):
        r = {key[len(f"p{number}_"):]: value for key, value in res.items()
             if key.startswith(f"p{number}_")}
        results = len(r["grad_gate"])
        grad_gates = np.zeros(pairs, dtype=fmt.uint_dtype)
        grad_gates[:min(results, pairs)] = r["grad_gate"][:pairs]
        runs.append(BackwardGateRun(
            grad_gates=from_bits(grad_gates, fmt).reshape(shape), results=results,
            dropped=int(r["dropped"]), error=bool(r["error"]), cycles=int(r["cycles"]),
            input_reads={"addr": r["input_addr"], "enable": r["input_enable"]},
            grad_reads={"addr": r["grad_addr"], "enable": r["grad_enable"]},
            out_of_bounds=int(r["out_of_bounds"]),
            ideal_cycles=pairs * -(-hidden // params.lanes),
            expected_cycles=params.cycles(pairs, hidden, latency, reads=reads),
            read_latency=latency))
    return runs


def expected_reads(indices, locations, *, tokens, hidden, num_experts, capacity, lanes,
                   interleave):
    """The scoreboard: the exact request sequences of both read ports,
    ``(input_addr, grad_addr, enable)``. Pairs go in groups of ``interleave`` in k-major
    order; within a group, beat b of every member before beat b + 1; only valid pairs read,
    and nothing is read when H is 0."""
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
    return (np.array(input_addr, np.int64), np.array(grad_addr, np.int64),
            np.array(enable, np.int64))


def score_backward_gate(run, input, indices, locations, grad_dispatch, *, num_experts, capacity,
                        lanes, interleave):
    """Check ``run`` against ``golden.dispatch_backward_gate`` bit for bit (one result per
    pair, in order) and both read logs against the exact expected sequences: nothing lost,
    duplicated, reordered, or out of bounds. Returns a list of problems."""
    problems = []
    want = golden.dispatch_backward_gate(input, indices, locations, grad_dispatch,
                                         num_experts=num_experts, capacity=capacity,
                                         lanes=lanes)
    fmt = format_of(input)
    pairs = int(np.size(indices))
    if run.results != pairs:
        problems.append(f"{run.results} results, expected {pairs} (lost or duplicated)")
    got_bits, want_bits = to_bits(run.grad_gates, fmt), to_bits(want, fmt)
    if got_bits.shape != want_bits.shape:
        problems.append(f"grad_gates shape {got_bits.shape} != golden {want_bits.shape}")
    else:
        bad = np.flatnonzero(~bits_equal(got_bits, want_bits, fmt).reshape(-1))
        if bad.size:
            problems.append(f"{bad.size} results differ from golden; first at pair {bad[0]}: "
                            f"got {got_bits.flat[bad[0]]:#x}, want {want_bits.flat[bad[0]]:#x}")
    want_dropped = golden.dispatch_dropped(indices, locations, num_experts=num_experts,
                                           capacity=capacity)
    if run.dropped != want_dropped:
        problems.append(f"dropped = {run.dropped}, golden {want_dropped}")
    if run.out_of_bounds:
        problems.append(f"{run.out_of_bounds} lanes read out of bounds")
    if run.error:
        problems.append("error flag set")
    input_addr, grad_addr, enable = expected_reads(
        indices, locations, tokens=np.shape(input)[0], hidden=np.shape(input)[1],
        num_experts=num_experts, capacity=capacity, lanes=lanes, interleave=interleave)
    for port, log, addr in (("input", run.input_reads, input_addr),
                            ("grad_dispatch", run.grad_reads, grad_addr)):
        if len(log["addr"]) != len(addr):
            problems.append(f"{len(log['addr'])} {port} reads, expected {len(addr)} "
                            "(lost or duplicated)")
            continue
        for name, got, expected in (("addr", log["addr"], addr),
                                    ("enable", log["enable"], enable)):
            bad = np.flatnonzero(np.asarray(got) != expected)
            if bad.size:
                problems.append(f"{port} read {bad[0]}: {name} {got[bad[0]]} != expected "
                                f"{expected[bad[0]]} (reordered or wrong)")
    return problems


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


# ---- benchmark -------------------------------------------------------------------------------

def benchmark_backward_gate(tokens=1024, hidden=512, experts=8, k=2, lanes=16,
                            sim="verilator", read_latency=DEFAULT_READ_LATENCY, seed=0,
                            format="fp32", capacity_factor=1.25, params=None,
                            progress=None):
    """Cycles of the unit on a random top-k problem (tutel routing: distinct experts per
    token, locations from the routing counters, capacity from ``capacity_factor``), scored bit
    for bit, with the float64 error of its sums (``params``, optional, must hold the
    problem). Returns a dict: ``ideal_cycles`` (pairs x
    ceil(H / lanes)), ``cycles``, ``expected_cycles`` (the exact formula), ``efficiency``,
    ``beats_per_cycle``, ``float64`` (see :func:`float64_error`), ``passed``, ``problems``."""
    if params is not None:
        lanes, format = params.lanes, params.format
    fmt = FORMATS[format]
    rng = np.random.default_rng(seed)
    indices = np.stack([rng.permutation(experts)[:k] for _ in range(tokens)], axis=1) \
        if k <= experts else rng.integers(0, experts, (k, tokens))
    locations = golden.compute_locations(indices, num_experts=experts)
    capacity = golden.capacity_from_factor(capacity_factor, tokens, experts)
    input = rng.standard_normal((tokens, hidden)).astype(fmt.dtype)
    grad_dispatch = rng.standard_normal((experts * capacity, hidden)).astype(fmt.dtype)
    if params is None:
        params = backward_gate_params_for(input, indices, num_experts=experts,
                                          capacity=capacity, lanes=lanes)
    if progress:
        progress(f"backward_gate benchmark: {k * tokens} pairs x H={hidden}, lanes={lanes}")
    run = run_backward_gate(input, indices, locations, grad_dispatch, num_experts=experts,
                            capacity=capacity, params=params, sim=sim, seed=seed,
                            read_latency=read_latency, progress=progress)
    problems = score_backward_gate(run, input, indices, locations, grad_dispatch,
                                   num_experts=experts, capacity=capacity, lanes=lanes,
                                   interleave=params.interleave)
    if run.cycles != run.expected_cycles:
        problems.append(f"{run.cycles} cycles, the formula says {run.expected_cycles}")
    return {
        "unit": "dispatch_backward_gate", "format": format, "lanes": lanes, "sim": sim,
        "pairs": k * tokens, "hidden": hidden, "experts": experts, "capacity": capacity,
        "dropped": run.dropped, "read_latency": read_latency,
        "interleave": params.interleave, "overhead": params.overhead(read_latency),
        "ideal_cycles": run.ideal_cycles, "cycles": run.cycles,
        "expected_cycles": run.expected_cycles,
        "efficiency": run.ideal_cycles / run.cycles if run.cycles else math.nan,
        "beats_per_cycle": run.ideal_cycles / run.cycles if run.cycles else math.nan,
        "float64": float64_error(run.grad_gates, input, indices, locations, grad_dispatch,
                                 num_experts=experts, capacity=capacity, lanes=lanes),
        "passed": not problems, "problems": problems,
    }


# ---- python -m moe_hw.run ----------------------------------------------------------------------

def _run(inputs, params, runtime, *, sim, stall, seed, check, progress):
    input, indices, locations, grad_dispatch = need(
        inputs, "dispatch_backward_gate", ("input", "indices", "locations", "grad_dispatch"))
    num_experts = runtime_int("num_experts", runtime, inputs)
    capacity = runtime_int("capacity", runtime, inputs)
    read_latency = runtime.get("read_latency", DEFAULT_READ_LATENCY)
    params = backward_gate_params_for(input, indices, num_experts=num_experts,
                                      capacity=capacity, **params)
    result = run_backward_gate(input, indices, locations, grad_dispatch,
                               num_experts=num_experts, capacity=capacity, params=params,
                               sim=sim, stall=stall, seed=seed, read_latency=read_latency,
                               progress=progress)
    outputs = {"grad_gates": result.grad_gates, "dropped": np.int64(result.dropped),
               "cycles": np.int64(result.cycles)}
    eff = result.ideal_cycles / result.cycles if result.cycles else 0.0
    report = [f"dispatch_backward_gate: {np.size(indices)} pairs, H={np.shape(input)[-1]}, "
              f"E={num_experts}, C={capacity}, lanes={params.lanes}, {params.format}",
              f"cycles: {result.cycles} (ideal {result.ideal_cycles}, efficiency {eff:.4f}; "
              f"stall-free formula {result.expected_cycles}); dropped pairs: {result.dropped}"]
    if check:
        problems = score_backward_gate(result, input, indices, locations, grad_dispatch,
                                       num_experts=num_experts, capacity=capacity,
                                       lanes=params.lanes, interleave=params.interleave)
        if problems:
            raise AssertionError("hardware differs from golden.dispatch_backward_gate:\n  " +
                                 "\n  ".join(problems))
        report.append(f"check: bit-exact against golden.dispatch_backward_gate "
                      f"(lanes={params.lanes} order, {np.size(indices)} results); both read "
                      "logs in order, no loss, no duplicate, no out-of-bounds read")
    return outputs, report


UNITS = [Unit(
    "dispatch_backward_gate", "tutel / MLU-OPS dispatch backward, gate gradient: per-pair dot "
    "product over H in lane/tree order, G pairs interleaved through the adders (SPEC 1.1)",
    BackwardGateParams, DispatchBackwardGateUnit, _run,
    runtime=("num_experts", "capacity", "read_latency"),
    inputs=("input", "indices", "locations", "grad_dispatch"),
    outputs=("grad_gates", "dropped"))]
