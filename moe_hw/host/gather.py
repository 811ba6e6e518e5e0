"""Host side of the read-side gather units: check a user's tensors, run them through the
emitted Verilog (``sim/bench_gather.py``), and score the result against the golden models,
with a scoreboard over every output beat and every memory read.

- ``sparse_gather``: ``expert_input = input[batch_index]`` (SPEC 1.3, the DUET
  ``SparseDispatcher.dispatch()`` move, before the split by ``part_sizes``);
- ``combine_gather``: ``golden.combine_gather`` (SPEC 1.4);
- ``dispatch_backward_data``: ``golden.dispatch_backward_data`` (SPEC 1.1 backward).

The ``benchmark_*`` functions measure each unit against its natural ideal (one read beat per
cycle).
"""

import math
from dataclasses import dataclass

import numpy as np

from .. import golden
from ..formats import FORMATS, bits_equal, from_bits, to_bits
from ..golden._common import float_array, index_array, routing_arrays, slot_rows
from ..registry import Unit
from ..units.combine_gather import CombineGatherParams, CombineGatherUnit, gather_schedule
from ..units.dispatch_backward_data import DispatchBackwardDataParams, DispatchBackwardDataUnit
from ..blocks.row_reader import last_enable, row_beats
from ..units.sparse_gather import ELEMENT_WIDTHS, SparseGatherParams, SparseGatherUnit
from .common import HostError, format_of, need, runtime_int

__all__ = ["GatherRun", "sparse_gather_params_for", "run_sparse_gather", "score_sparse_gather",
           "gather_accumulate_params_for", "run_combine_gather", "score_combine_gather",
           "run_dispatch_backward_data", "score_dispatch_backward_data",
           "benchmark_sparse_gather", "benchmark_combine_gather",
           "benchmark_dispatch_backward_data", "MEMORY_LATENCY", "routing_problem"]

#: The memory model's latency unless told otherwise: a request taken at the end of cycle u
#: is answered from cycle u + 2 (an on-chip RAM with a registered output).
MEMORY_LATENCY = 2


@dataclass
class GatherRun:
    output: np.ndarray        # [rows, H]: expert_input, combined or grad_input
    dropped: int
    error: bool
    cycles: int
    beats: dict               # the output log: data [B, lanes] (bits), enable [B], last [B]
    requests: dict            # the read log: addr [R], enable [R]
    out_of_bounds: int        # enabled lanes read outside the memory
    headers_taken: int
    ideal_cycles: int         # one beat per cycle on the read port (natural ideal)
    expected_cycles: int      # the unit's documented stall-free cycle count
    lanes: int
    window: int = 0           # combine / backward: items per window (the read order)


def _as_rows(output_rows, beats_log, hidden, lanes):
    """The output rows from the beat log (lanes past H dropped)."""
    beats = row_beats(hidden, lanes)
    data = beats_log["data"]
    if output_rows == 0 or hidden == 0 or len(data) != output_rows * beats:
        return None
    return data.reshape(output_rows, beats * lanes)[:, :hidden]


def _check_fits(name, array, index_width):
    lo, hi = -(1 << (index_width - 1)), (1 << (index_width - 1)) - 1
    flat = np.asarray(array).reshape(-1)
    bad = np.flatnonzero((flat < lo) | (flat > hi)) if flat.dtype.kind == "i" else \
        np.flatnonzero(flat > hi)
    if bad.size:
        raise HostError(f"{name}.flat[{bad[0]}] = {flat[bad[0]]} does not fit the "
                        f"{index_width}-bit header field (index_width)")


def _check_maxima(values):
    for name, value, maximum in values:
        if value > maximum:
            raise HostError(f"{name} = {value} exceeds the unit's maximum of {maximum}")


def _expected_beats(rows, hidden, lanes):
    beats = row_beats(hidden, lanes)
    enable = np.full(beats, (1 << lanes) - 1, dtype=np.int64)
    last = np.zeros(beats, dtype=np.int64)
    if beats:
        enable[-1] = last_enable(hidden, lanes)
        last[-1] = 1
    return np.tile(enable, rows), np.tile(last, rows)


def _score_log(run, want_bits, fmt, want_requests, problems):
    """Scoreboard shared by the units: output beats (count, order, enables, last flags, data on
    the enabled lanes) and the read log (exact addresses and enables, in order)."""
    rows, hidden = want_bits.shape
    lanes = run.lanes
    enable, last = _expected_beats(rows, hidden, lanes)
    got = run.beats
    if len(got["enable"]) != len(enable):
        problems.append(f"{len(got['enable'])} output beats, expected {len(enable)} "
                        "(lost or duplicated)")
    elif len(enable):
        for name, g, w in (("enable", got["enable"], enable), ("last", got["last"], last)):
            bad = np.flatnonzero(g != w)
            if bad.size:
                problems.append(f"output beat {bad[0]}: {name} {g[bad[0]]} != expected "
                                f"{w[bad[0]]}")
        beats = row_beats(hidden, lanes)
        padded = np.zeros((rows, beats * lanes), dtype=np.uint64)
        padded[:, :hidden] = want_bits
        want = padded.reshape(rows * beats, lanes)
        on = (enable[:, None] >> np.arange(lanes)) & 1 == 1
        same = bits_equal(got["data"], want, fmt) if fmt is not None else got["data"] == want
        bad = np.argwhere(~same & on)
        if bad.size:
            b, lane = bad[0]
            problems.append(f"{len(bad)} output elements differ from golden; first at row "
                            f"{b // beats}, element {(b % beats) * lanes + lane}: got "
                            f"{got['data'][b, lane]:#x}, want {want[b, lane]:#x}")
    addr, en = want_requests
    got_addr, got_en = run.requests["addr"], run.requests["enable"]
    if run.out_of_bounds:
        problems.append(f"{run.out_of_bounds} lanes read out of bounds")
    if len(got_addr) != len(addr):
        problems.append(f"{len(got_addr)} reads, expected {len(addr)} (lost or duplicated)")
    else:
        bad = np.flatnonzero((got_addr != addr) | (got_en != en))
        if bad.size:
            problems.append(f"read {bad[0]}: addr {got_addr[bad[0]]} enable "
                            f"{got_en[bad[0]]:#x}, expected addr {addr[bad[0]]} enable "
                            f"{en[bad[0]]:#x} (reordered or wrong)")


def _simulate(unit, top, stimulus, settings, sim, progress):
    from ..flows.simulate import simulate
    return simulate(unit, top, "bench_gather", stimulus, sim=sim, settings=settings,
                    progress=progress)


def _log(res):
    beats = {"data": res["data"], "enable": res["enable"], "last": res["last"]}
    requests = {"addr": res["request_addr"], "enable": res["request_enable"]}
    return beats, requests


# ---- sparse_gather ------------------------------------------------------------------------

def _sparse_inputs(input, batch_index):
    input = np.asarray(input)
    if input.ndim < 1:
        raise HostError(f"input must have at least 1 dimension [S, ...], not shape "
                        f"{input.shape}")
    numeric = input.dtype.kind in "fiub" or input.dtype in (f.dtype for f in FORMATS.values())
    if input.dtype.itemsize * 8 not in ELEMENT_WIDTHS or not numeric:
        raise HostError(f"input must have a numeric dtype of 8, 16, 32 or 64 bits, not "
                        f"{input.dtype}")
    try:
        batch_index = index_array("batch_index", batch_index, ndim=1, what="[n]")
    except (TypeError, ValueError) as error:
        raise HostError(str(error)) from None
    return input, batch_index


def sparse_gather_params_for(input, batch_index, **overrides):
    """The smallest :class:`SparseGatherParams` that holds this problem (overrides win)."""
    input, batch_index = _sparse_inputs(input, batch_index)
    hidden = int(np.prod(input.shape[1:], dtype=np.int64))
    fields = dict(width=input.dtype.itemsize * 8, max_slots=max(1, batch_index.size),
                  max_tokens=max(1, input.shape[0]), max_hidden=max(1, hidden))
    fields.update(overrides)
    return SparseGatherParams(**fields)


def run_sparse_gather(input, batch_index, *, params=None, sim="verilator", stall=0.0, seed=0,
                      strict=True, memory_latency=MEMORY_LATENCY, progress=None):
    """``input[batch_index]`` ([n, ...]) on the hardware.

    ``input`` is [S, ...] of any 8/16/32/64-bit dtype (moved, never changed); ``batch_index``
    [n] integers in ``[0, S)``. With ``strict=False`` out-of-range indices are handed to the
    hardware (which flags them, counts them and returns zero rows) instead of rejected.
    """
    input, batch_index = _sparse_inputs(input, batch_index)
    tokens, slots = input.shape[0], batch_index.size
    hidden = int(np.prod(input.shape[1:], dtype=np.int64))
    bad = np.flatnonzero((batch_index < 0) | (batch_index >= tokens))
    if strict and bad.size:
        raise HostError(f"batch_index[{bad[0]}] = {batch_index[bad[0]]} is outside [0, "
                        f"{tokens}) (the rows of input)")
    if params is None:
        params = sparse_gather_params_for(input, batch_index)
    if input.dtype.itemsize * 8 != params.width:
        raise HostError(f"input has {input.dtype.itemsize * 8}-bit elements ({input.dtype}), "
                        f"but the unit moves {params.width}-bit elements (width)")
    _check_maxima([("slots (n)", slots, params.max_slots),
                   ("tokens (S)", tokens, params.max_tokens),
                   ("hidden", hidden, params.max_hidden)])
    _check_fits("batch_index", batch_index, params.index_width)

    unit = SparseGatherUnit(params)
    uint = np.dtype(f"u{params.width // 8}")
    bits = np.ascontiguousarray(input).view(uint).reshape(tokens, hidden)
    feed = slots > 0 and hidden > 0
    valid = (batch_index >= 0) & (batch_index < tokens)
    beats = row_beats(hidden, params.lanes)
    stimulus = {"header_index": batch_index.astype(np.int64),
                "memory": bits.reshape(-1).astype(np.uint64)}
    settings = {"lanes": params.lanes, "width": params.width,
                "runtime": {"slots": slots, "tokens": tokens, "hidden": hidden},
                "feed": feed, "stall": float(stall), "seed": int(seed),
                "memory_latency": int(memory_latency),
                "expected_beats": slots * beats, "expected_reads": int(valid.sum()) * beats}
    res = _simulate(unit, "sparse_gather", stimulus, settings, sim, progress)
    beats_log, requests = _log(res)
    rows = _as_rows(slots, beats_log, hidden, params.lanes)
    output = np.zeros((slots, hidden), dtype=uint) if rows is None else rows.astype(uint)
    return GatherRun(
        output=output.view(input.dtype).reshape((slots,) + input.shape[1:]),
        dropped=int(res["dropped"]), error=bool(res["error"]), cycles=int(res["cycles"]),
        beats=beats_log, requests=requests, out_of_bounds=int(res["out_of_bounds"]),
        headers_taken=int(res["headers_taken"]),
        ideal_cycles=slots * beats if feed else 0,
        expected_cycles=unit.cycles(slots, hidden, memory_latency, reads=bool(valid.any())),
        lanes=params.lanes)


def score_sparse_gather(run, input, batch_index):
    """Problems (a list of strings; empty when right) of ``run`` against ``input[batch_index]``
    (zero rows for out-of-range indices), with the beat and read scoreboards."""
    input, batch_index = _sparse_inputs(input, batch_index)
    tokens, slots = input.shape[0], batch_index.size
    hidden = int(np.prod(input.shape[1:], dtype=np.int64))
    uint = np.dtype(f"u{input.dtype.itemsize}")
    bits = np.ascontiguousarray(input).view(uint).reshape(tokens, hidden)
    valid = (batch_index >= 0) & (batch_index < tokens)
    want = np.zeros((slots, hidden), dtype=uint)
    want[valid] = bits[batch_index[valid]]
    problems = []
    got = np.ascontiguousarray(run.output).view(uint).reshape(slots, hidden)
    if got.shape != want.shape or not np.array_equal(got, want):
        problems.append("expert_input differs from input[batch_index]")
    if valid.all() and slots and hidden:
        reference = input[batch_index].view(uint).reshape(slots, hidden)
        if not np.array_equal(reference, want):
            problems.append("scoreboard model differs from input[batch_index]")
    lanes = run.lanes
    beats = row_beats(hidden, lanes)
    addr, en = [], []
    if hidden and slots:
        for index in batch_index[valid]:
            for b in range(beats):
                addr.append(int(index) * hidden + b * lanes)
                en.append(last_enable(hidden, lanes) if b == beats - 1 else (1 << lanes) - 1)
    _score_log(run, want.astype(np.uint64), None, (np.array(addr, np.int64),
                                                   np.array(en, np.int64)), problems)
    want_dropped = int(np.count_nonzero(~valid)) if hidden else 0
    if run.dropped != want_dropped:
        problems.append(f"dropped = {run.dropped}, expected {want_dropped}")
    if run.error != (want_dropped > 0):
        problems.append(f"error flag {run.error}, expected {want_dropped > 0}")
    want_headers = slots if hidden else 0
    if run.headers_taken != want_headers:
        problems.append(f"{run.headers_taken} headers taken, expected {want_headers}")
    return problems


# ---- combine_gather and dispatch_backward_data ---------------------------------------------

def _accumulate_inputs(gates, indices, locations, buffer, buffer_name):
    try:
        indices, locations, gates = routing_arrays(indices, locations, gates)
        buffer = float_array(buffer_name, buffer, ndim=2, what="[E*C, H]")
    except (TypeError, ValueError) as error:
        raise HostError(str(error)) from None
    if gates.dtype != buffer.dtype:
        raise HostError(f"gates has dtype {gates.dtype}, but {buffer_name} has "
                        f"{buffer.dtype}; they must share one format")
    return gates, indices, locations, buffer


def gather_accumulate_params_for(gates, buffer, *, num_experts, capacity, **overrides):
    """The smallest :class:`CombineGatherParams` that holds this problem (overrides win)."""
    gates = np.asarray(gates)
    k, tokens = (1, gates.shape[0]) if gates.ndim == 1 else gates.shape
    fields = dict(format=format_of(buffer), max_tokens=max(1, tokens),
                  max_hidden=max(1, np.shape(buffer)[1]), max_capacity=max(1, capacity),
                  max_experts=max(1, num_experts), max_k=max(1, k))
    fields.update(overrides)
    return CombineGatherParams(**fields)


def _run_accumulate(unit_class, top, gates, indices, locations, buffer, *, num_experts,
                    capacity, params, sim, stall, seed, memory_latency, progress):
    k, tokens = gates.shape
    hidden = buffer.shape[1]
    if params is None:
        params = gather_accumulate_params_for(gates, buffer, num_experts=num_experts,
                                              capacity=capacity)
    if not isinstance(params, unit_class.PARAMS):
        params = unit_class.PARAMS(**{f: getattr(params, f)
                                      for f in params.__dataclass_fields__})
    fmt = FORMATS[params.format]
    if buffer.dtype != fmt.dtype:
        raise HostError(f"the data has dtype {buffer.dtype}, but the unit's format is "
                        f"{fmt.name} ({fmt.dtype})")
    _check_maxima([("tokens (S)", tokens, params.max_tokens), ("hidden", hidden,
                   params.max_hidden), ("capacity", capacity, params.max_capacity),
                   ("num_experts", num_experts, params.max_experts),
                   ("k", k, params.max_k)])
    _check_fits("indices", indices, params.index_width)
    _check_fits("locations", locations, params.index_width)

    unit = unit_class(params)
    feed = tokens > 0 and hidden > 0
    pad = params.max_k - k

    def per_token(array, fill):
        return np.concatenate([array.T, np.full((tokens, pad), fill, dtype=array.dtype)],
                              axis=1)

    stimulus = {
        "header_gate": per_token(to_bits(gates, fmt).astype(np.uint64), 0),
        "header_index": per_token(indices.astype(np.int64), 0),
        "header_location": per_token(locations.astype(np.int64), 0),
        "memory": to_bits(buffer, fmt).reshape(-1).astype(np.uint64),
    }
    rows = slot_rows(indices, locations, num_experts, capacity)
    beats = row_beats(hidden, params.lanes)
    settings = {"lanes": params.lanes, "width": fmt.width,
                "runtime": {"tokens": tokens, "hidden": hidden, "k": k, "capacity": capacity,
                            "num_experts": num_experts},
                "feed": feed, "stall": float(stall), "seed": int(seed),
                "memory_latency": int(memory_latency),
                "expected_beats": tokens * beats,
                "expected_reads": int((rows >= 0).sum()) * beats}
    res = _simulate(unit, top, stimulus, settings, sim, progress)
    beats_log, requests = _log(res)
    out = _as_rows(tokens, beats_log, hidden, params.lanes)
    output = np.zeros((tokens, hidden), dtype=fmt.uint_dtype) if out is None else out
    return GatherRun(
        output=from_bits(output, fmt), dropped=int(res["dropped"]), error=bool(res["error"]),
        cycles=int(res["cycles"]), beats=beats_log, requests=requests,
        out_of_bounds=int(res["out_of_bounds"]), headers_taken=int(res["headers_taken"]),
        ideal_cycles=max(k, 1) * tokens * beats if feed else 0,
        expected_cycles=unit.cycles(tokens, hidden, k, memory_latency,
                                    reads=bool((rows >= 0).any())),
        lanes=params.lanes,
        window=params.window_items)


def _score_accumulate(run, want, gates, indices, locations, *, num_experts, capacity):
    problems = []
    fmt = FORMATS[format_of(want)]
    k, tokens = indices.shape
    hidden = want.shape[1]
    got_bits, want_bits = to_bits(run.output, fmt), to_bits(want, fmt)
    if got_bits.shape != want_bits.shape:
        problems.append(f"output shape {got_bits.shape} != golden {want_bits.shape}")
        return problems
    bad = np.argwhere(~bits_equal(got_bits, want_bits, fmt))
    if bad.size:
        r, c = bad[0]
        problems.append(f"{len(bad)} elements differ from golden; first at [{r}, {c}]: got "
                        f"{got_bits[r, c]:#x}, want {want_bits[r, c]:#x}")
    lanes = run.lanes
    beats = row_beats(hidden, lanes)
    rows = slot_rows(indices, locations, num_experts, capacity) if k else np.zeros((0, tokens))
    addr, en = [], []
    for p, i, b in gather_schedule(tokens, beats, k, run.window):
        if k and rows[p, i] >= 0:
            addr.append(int(rows[p, i]) * hidden + b * lanes)
            en.append(last_enable(hidden, lanes) if b == beats - 1 else (1 << lanes) - 1)
    _score_log(run, want_bits.astype(np.uint64), fmt,
               (np.array(addr, np.int64), np.array(en, np.int64)), problems)
    want_dropped = int(np.count_nonzero(rows < 0)) if hidden else 0
    if run.dropped != want_dropped:
        problems.append(f"dropped = {run.dropped}, golden {want_dropped}")
    if run.error:
        problems.append("error flag set")
    want_headers = tokens if hidden else 0
    if run.headers_taken != want_headers:
        problems.append(f"{run.headers_taken} headers taken, expected {want_headers}")
    return problems


def _combine_experts(expert_out, capacity):
    rows = expert_out.shape[0]
    if (capacity == 0 and rows) or (capacity and rows % capacity):
        raise HostError(f"expert_out must have a multiple of capacity ({capacity}) rows "
                        f"[E*C, H], not {rows}")
    return rows // capacity if capacity else 0


def run_combine_gather(gates, indices, locations, expert_out, *, capacity, params=None,
                       sim="verilator", stall=0.0, seed=0, memory_latency=MEMORY_LATENCY,
                       progress=None):
    """``golden.combine_gather`` on the hardware; arguments as the golden model's (E is the
    rows of ``expert_out`` over ``capacity``)."""
    capacity = runtime_int("capacity", {"capacity": capacity}, {})
    gates, indices, locations, expert_out = _accumulate_inputs(gates, indices, locations,
                                                               expert_out, "expert_out")
    num_experts = _combine_experts(expert_out, capacity)
    return _run_accumulate(CombineGatherUnit, "combine_gather", gates, indices, locations,
                           expert_out, num_experts=num_experts, capacity=capacity,
                           params=params, sim=sim, stall=stall, seed=seed,
                           memory_latency=memory_latency, progress=progress)


def score_combine_gather(run, gates, indices, locations, expert_out, *, capacity):
    """Problems of ``run`` against ``golden.combine_gather``, with the scoreboards."""
    want = golden.combine_gather(gates, indices, locations, expert_out, capacity=capacity)
    gates, indices, locations, expert_out = _accumulate_inputs(gates, indices, locations,
                                                               expert_out, "expert_out")
    return _score_accumulate(run, want, gates, indices, locations,
                             num_experts=_combine_experts(expert_out, capacity),
                             capacity=capacity)


def run_dispatch_backward_data(gates, indices, locations, grad_dispatch, *, num_experts,
                               capacity, params=None, sim="verilator", stall=0.0, seed=0,
                               memory_latency=MEMORY_LATENCY, progress=None):
    """``golden.dispatch_backward_data`` on the hardware; arguments as the golden model's."""
    num_experts = runtime_int("num_experts", {"num_experts": num_experts}, {})
    capacity = runtime_int("capacity", {"capacity": capacity}, {})
    gates, indices, locations, grad_dispatch = _accumulate_inputs(
        gates, indices, locations, grad_dispatch, "grad_dispatch")
    if grad_dispatch.shape[0] != num_experts * capacity:
        raise HostError(f"grad_dispatch must have num_experts * capacity = "
                        f"{num_experts * capacity} rows [E*C, H], not {grad_dispatch.shape[0]}")
    return _run_accumulate(DispatchBackwardDataUnit, "dispatch_backward_data", gates, indices,
                           locations, grad_dispatch, num_experts=num_experts,
                           capacity=capacity, params=params, sim=sim, stall=stall, seed=seed,
                           memory_latency=memory_latency, progress=progress)


def score_dispatch_backward_data(run, gates, indices, locations, grad_dispatch, *,
                                 num_experts, capacity):
    """Problems of ``run`` against ``golden.dispatch_backward_data``, with the scoreboards."""
    want = golden.dispatch_backward_data(gates, indices, locations, grad_dispatch,
                                         num_experts=num_experts, capacity=capacity)
    gates, indices, locations, grad_dispatch = _accumulate_inputs(
        gates, indices, locations, grad_dispatch, "grad_dispatch")
    return _score_accumulate(run, want, gates, indices, locations, num_experts=num_experts,
                             capacity=capacity)


# ---- python -m moe_hw.run ------------------------------------------------------------------

def _report(name, run, shape_text, params):
    eff = run.ideal_cycles / run.cycles if run.cycles else 0.0
    return [f"{name}: {shape_text}, lanes={params.lanes}",
            f"cycles: {run.cycles} (ideal {run.ideal_cycles}, efficiency {eff:.4f}, formula "
            f"{run.expected_cycles}); dropped: {run.dropped}"]


def _check(problems, name):
    if problems:
        raise AssertionError(f"hardware differs from {name}:\n  " + "\n  ".join(problems))


def _run_sparse(inputs, params, runtime, *, sim, stall, seed, check, progress):
    input, batch_index = need(inputs, "sparse_gather", ("input", "batch_index"))
    params = sparse_gather_params_for(input, batch_index, **params)
    run = run_sparse_gather(input, batch_index, params=params, sim=sim, stall=stall,
                            seed=seed, progress=progress)
    report = _report("sparse_gather", run, f"{np.size(batch_index)} slots from "
                     f"{np.shape(input)[0]} rows, {np.asarray(input).dtype}", params)
    if check:
        _check(score_sparse_gather(run, input, batch_index), "input[batch_index]")
        report.append("check: bit-exact against input[batch_index]; every beat and every read "
                      "in order, none lost, duplicated or out of bounds")
    return {"expert_input": run.output, "cycles": np.int64(run.cycles)}, report


def _run_combine(inputs, params, runtime, *, sim, stall, seed, check, progress):
    gates, indices, locations, expert_out = need(
        inputs, "combine_gather", ("gates", "indices", "locations", "expert_out"))
    capacity = runtime_int("capacity", runtime, inputs)
    g, _, _, e = _accumulate_inputs(gates, indices, locations, expert_out, "expert_out")
    params = gather_accumulate_params_for(g, e, num_experts=_combine_experts(e, capacity),
                                          capacity=capacity, **params)
    run = run_combine_gather(gates, indices, locations, expert_out, capacity=capacity,
                             params=params, sim=sim, stall=stall, seed=seed, progress=progress)
    report = _report("combine_gather", run, f"k={g.shape[0]}, S={g.shape[1]}, "
                     f"H={e.shape[1]}, C={capacity}, {params.format}", params)
    if check:
        _check(score_combine_gather(run, gates, indices, locations, expert_out,
                                    capacity=capacity),
               "golden.combine_gather")
        report.append("check: bit-exact against golden.combine_gather; every beat and every "
                      "read in order, none lost, duplicated or out of bounds")
    return {"combined": run.output, "cycles": np.int64(run.cycles)}, report


def _run_backward(inputs, params, runtime, *, sim, stall, seed, check, progress):
    gates, indices, locations, grad_dispatch = need(
        inputs, "dispatch_backward_data", ("gates", "indices", "locations", "grad_dispatch"))
    num_experts = runtime_int("num_experts", runtime, inputs)
    capacity = runtime_int("capacity", runtime, inputs)
    g, _, _, d = _accumulate_inputs(gates, indices, locations, grad_dispatch, "grad_dispatch")
    params = gather_accumulate_params_for(g, d, num_experts=num_experts, capacity=capacity,
                                          **params)
    run = run_dispatch_backward_data(gates, indices, locations, grad_dispatch,
                                     num_experts=num_experts, capacity=capacity, params=params,
                                     sim=sim, stall=stall, seed=seed, progress=progress)
    report = _report("dispatch_backward_data", run, f"k={g.shape[0]}, S={g.shape[1]}, "
                     f"H={d.shape[1]}, E={num_experts}, C={capacity}, {params.format}", params)
    if check:
        _check(score_dispatch_backward_data(run, gates, indices, locations, grad_dispatch,
                                            num_experts=num_experts, capacity=capacity),
               "golden.dispatch_backward_data")
        report.append("check: bit-exact against golden.dispatch_backward_data; every beat and "
                      "every read in order, none lost, duplicated or out of bounds")
    return {"grad_input": run.output, "cycles": np.int64(run.cycles)}, report


UNITS = [
    Unit("sparse_gather", "DUET SparseDispatcher dispatch(): expert_input = input[batch_index], "
         "row reads on a memory port, one beat per cycle (SPEC 1.3)", SparseGatherParams,
         SparseGatherUnit, _run_sparse, inputs=("input", "batch_index"),
         outputs=("expert_input",)),
    Unit("combine_gather", "tutel combine (gather form): sum over k of gate * "
         "expert_out[index*C+location], from +0.0, tokens in order (SPEC 1.4)",
         CombineGatherParams, CombineGatherUnit, _run_combine, runtime=("capacity",),
         inputs=("gates", "indices", "locations", "expert_out"), outputs=("combined",)),
    Unit("dispatch_backward_data", "dispatch backward, data: gates * grad_dispatch[index*C+"
         "location], term_0 + term_1 + ... over k (SPEC 1.1)", DispatchBackwardDataParams,
         DispatchBackwardDataUnit, _run_backward, runtime=("num_experts", "capacity"),
         inputs=("gates", "indices", "locations", "grad_dispatch"), outputs=("grad_input",)),
]


# ---- benchmarks ----------------------------------------------------------------------------

def _top_k_routing(rng, tokens, experts, k):
    """[k, S] distinct experts per token (uniform), k-major."""
    if k > experts:
        raise HostError(f"k ({k}) must not exceed experts ({experts})")
    return np.argsort(rng.random((tokens, experts)), axis=1)[:, :k].T.astype(np.int64)


def _figures(unit, run, problems, **extra):
    return {"unit": unit, **extra, "ideal_cycles": run.ideal_cycles, "cycles": run.cycles,
            "expected_cycles": run.expected_cycles,
            "efficiency": run.ideal_cycles / run.cycles if run.cycles else math.nan,
            "passed": not problems, "problems": problems}


def benchmark_sparse_gather(tokens=1024, hidden=512, experts=8, k=2, lanes=16,
                            sim="verilator", seed=0):
    """Gather the k*S slots of a random top-k gate matrix; one read beat per cycle is the
    ideal (k*S*ceil(H/lanes) cycles)."""
    rng = np.random.default_rng(seed)
    choice = _top_k_routing(rng, tokens, experts, k)
    gates = np.zeros((tokens, experts), dtype=np.float32)
    for row in choice:
        gates[np.arange(tokens), row] = rng.uniform(0.1, 1.0, tokens).astype(np.float32)
    batch_index, part_sizes, _ = golden.sparse_dispatch_indices(gates)
    input = rng.standard_normal((tokens, hidden)).astype(np.float32)
    params = sparse_gather_params_for(input, batch_index, lanes=lanes)
    run = run_sparse_gather(input, batch_index, params=params, sim=sim)
    problems = score_sparse_gather(run, input, batch_index)
    if not np.array_equal(run.output, np.concatenate(golden.sparse_dispatch(gates, input))):
        problems.append("expert_input differs from golden.sparse_dispatch")
    return _figures("sparse_gather", run, problems, slots=int(batch_index.size),
                    tokens=tokens, hidden=hidden, experts=experts, k=k, lanes=lanes)


def routing_problem(seed, *, tokens, hidden, experts, capacity=None, k=1, dtype=np.float32,
                    specials=0.0, index_range=None, location_range=None, experts_used=None):
    """A seeded gather problem: ``(gates, indices, locations, buffer, capacity)``.

    Indices are k distinct experts per token drawn from ``experts_used`` (default: all), with
    locations from the routing counters (``golden.compute_locations``), unless
    ``index_range`` / ``location_range`` ask for uniform (possibly out-of-range) values.
    ``capacity`` defaults to ``golden.capacity_from_factor(1.0, S, E, k)``. Gates and the
    [E*C, H] buffer are ``random_floats`` with ``specials`` NaN/Inf/subnormal/+-0.0.
    """
    from ..golden.testing import random_floats
    rng = np.random.default_rng(seed)
    used = np.arange(experts) if experts_used is None else np.asarray(experts_used)
    if index_range is None:
        indices = used[_top_k_routing(rng, tokens, len(used), k)] if len(used) else \
            np.zeros((k, tokens), np.int64)
    else:
        indices = rng.integers(*index_range, (k, tokens))
    if capacity is None:
        capacity = golden.capacity_from_factor(1.0, tokens, max(experts, 1), k=k)
    if location_range is None:
        locations = golden.compute_locations(np.clip(indices, 0, max(experts - 1, 0)),
                                             num_experts=max(experts, 1)).astype(np.int64)
    else:
        locations = rng.integers(*location_range, (k, tokens))
    gates = random_floats(rng, (k, tokens), dtype, specials=specials)
    buffer = random_floats(rng, (experts * capacity, hidden), dtype, specials=specials)
    return gates, indices.astype(np.int64), locations, buffer, capacity


def benchmark_combine_gather(tokens=1024, hidden=512, experts=8, k=2, lanes=16,
                             sim="verilator", seed=0):
    """combine_gather on a random top-k routing (capacity factor 1.0, so some pairs drop);
    the ideal is one read beat per cycle, k*S*ceil(H/lanes) cycles."""
    gates, indices, locations, buffer, capacity = routing_problem(
        seed, tokens=tokens, hidden=hidden, experts=experts, k=k)
    params = gather_accumulate_params_for(gates, buffer, num_experts=experts,
                                          capacity=capacity, lanes=lanes)
    run = run_combine_gather(gates, indices, locations, buffer, capacity=capacity,
                             params=params, sim=sim)
    problems = score_combine_gather(run, gates, indices, locations, buffer,
                                    capacity=capacity)
    return _figures("combine_gather", run, problems, tokens=tokens, hidden=hidden,
                    experts=experts, k=k, lanes=lanes, capacity=capacity,
                    dropped=run.dropped)


def benchmark_dispatch_backward_data(tokens=1024, hidden=512, experts=8, k=2, lanes=16,
                                     sim="verilator", seed=0):
    """dispatch_backward_data on a random top-k routing; ideal k*S*ceil(H/lanes) cycles."""
    gates, indices, locations, buffer, capacity = routing_problem(
        seed, tokens=tokens, hidden=hidden, experts=experts, k=k)
    params = gather_accumulate_params_for(gates, buffer, num_experts=experts,
                                          capacity=capacity, lanes=lanes)
    run = run_dispatch_backward_data(gates, indices, locations, buffer, num_experts=experts,
                                     capacity=capacity, params=params, sim=sim)
    problems = score_dispatch_backward_data(run, gates, indices, locations, buffer,
                                            num_experts=experts, capacity=capacity)
    return _figures("dispatch_backward_data", run, problems, tokens=tokens, hidden=hidden,
                    experts=experts, k=k, lanes=lanes, capacity=capacity,
                    dropped=run.dropped)
