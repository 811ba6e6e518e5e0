"""Host side of the dispatch unit: check a user's tensors, run them through the emitted
Verilog, and score the result (memory image and write log) against the golden model."""

from dataclasses import dataclass

import numpy as np

from .. import golden
from ..formats import FORMATS, bits_equal, from_bits, to_bits
from ..units.dispatch import DispatchParams, DispatchUnit
from ..registry import Unit
from .common import HostError, format_of, need, routing, runtime_int

__all__ = ["DispatchRun", "dispatch_params_for", "run_dispatch", "expected_writes",
           "score_dispatch"]


@dataclass
class DispatchRun:
    dispatch: np.ndarray      # [E*C, H], the memory image after the run
    dropped: int
    error: bool
    cycles: int
    writes: dict              # the write log: addr [W], enable [W], data [W, lanes] (bits)
    out_of_bounds: int        # enabled lanes written outside [0, E*C*H)
    ideal_cycles: int         # one beat per cycle: pairs * ceil(H / lanes)


def dispatch_params_for(gates, input, *, num_experts, capacity, **overrides):
    """The smallest :class:`DispatchParams` that holds this problem (overrides win)."""
    pairs = int(np.asarray(gates).size)
    hidden = int(np.asarray(input).shape[-1]) if np.asarray(input).ndim == 2 else 0
    fields = dict(format=format_of(input), max_tokens=max(1, pairs), max_hidden=max(1, hidden),
                  max_capacity=max(1, capacity), max_experts=max(1, num_experts))
    fields.update(overrides)
    return DispatchParams(**fields)


def run_dispatch(gates, indices, locations, input, *, num_experts, capacity, params=None,
                 sim="verilator", stall=0.0, seed=0, progress=None):
    """Run ``dispatch_forward`` on the hardware. Arguments as the golden model's."""
    gates, indices, locations, input, num_experts, capacity = routing(
        gates, indices, locations, input, num_experts=num_experts, capacity=capacity)
    if params is None:
        params = dispatch_params_for(gates, input, num_experts=num_experts, capacity=capacity)
    fmt = FORMATS[params.format]
    for name, array in (("gates", gates), ("input", input)):
        if array.dtype != fmt.dtype:
            raise HostError(f"{name} has dtype {array.dtype}, but the unit's format is "
                            f"{fmt.name} ({fmt.dtype})")
    pairs, (tokens, hidden) = gates.size, input.shape
    for name, value, maximum in (("tokens (k*S)", pairs, params.max_tokens),
                                 ("hidden", hidden, params.max_hidden),
                                 ("capacity", capacity, params.max_capacity),
                                 ("num_experts", num_experts, params.max_experts)):
        if value > maximum:
            raise HostError(f"{name} = {value} exceeds the unit's maximum of {maximum}")
    lo, hi = -(1 << (params.index_width - 1)), (1 << (params.index_width - 1)) - 1
    for name, array in (("indices", indices), ("locations", locations)):
        bad = np.flatnonzero((array < lo) | (array > hi))
        if bad.size:
            raise HostError(f"{name}.flat[{bad[0]}] = {array.flat[bad[0]]} does not fit the "
                            f"{params.index_width}-bit header field (index_width)")

    unit = DispatchUnit(params)
    feed = pairs > 0 and hidden > 0 and capacity > 0 and num_experts > 0
    stimulus = {
        "gate": to_bits(gates.reshape(-1), fmt).astype(np.uint64),
        "index": indices.reshape(-1).astype(np.int64),
        "location": locations.reshape(-1).astype(np.int64),
        "row": np.tile(np.arange(tokens), gates.shape[0]),   # k-major: pair -> token row
        "input": to_bits(input, fmt).astype(np.uint64),
    }
    settings = {"lanes": params.lanes, "width": fmt.width, "tokens": pairs, "hidden": hidden,
                "capacity": capacity, "num_experts": num_experts, "feed": feed,
                "stall": float(stall), "seed": int(seed)}
    from ..flows.simulate import simulate
    res = simulate(unit, "dispatch", "bench_dispatch", stimulus, sim=sim, settings=settings,
                   progress=progress)

    size = num_experts * capacity * hidden
    memory = np.zeros(size, dtype=fmt.uint_dtype)
    out_of_bounds = 0
    lanes = np.arange(params.lanes)
    for addr, enable, data in zip(res["addr"], res["enable"], res["data"]):
        on = (int(enable) >> lanes) & 1 == 1
        where = addr + lanes[on]
        inside = where < size
        out_of_bounds += int(np.count_nonzero(~inside))
        memory[where[inside]] = data[on][inside]
    return DispatchRun(
        dispatch=from_bits(memory, fmt).reshape(num_experts * capacity, hidden),
        dropped=int(res["dropped"]), error=bool(res["error"]), cycles=int(res["cycles"]),
        writes={"addr": res["addr"], "enable": res["enable"], "data": res["data"]},
        out_of_bounds=out_of_bounds,
        ideal_cycles=pairs * -(-hidden // params.lanes) if feed else 0)


def expected_writes(gates, indices, locations, input, *, num_experts, capacity, lanes):
    """The scoreboard: the exact write sequence the unit must issue, (addr, enable, data bits)
    per beat, valid pairs in k-major order, each pair's beats in ascending address."""
    gates, indices, locations, input, num_experts, capacity = routing(
        gates, indices, locations, input, num_experts=num_experts, capacity=capacity)
    fmt = format_of(input)
    hidden = input.shape[1]
    beats = -(-hidden // lanes)
    addrs, enables, datas = [], [], []
    if hidden == 0 or capacity == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, lanes), np.uint64)
    for k, i in np.ndindex(*gates.shape):
        e, loc = int(indices[k, i]), int(locations[k, i])
        if not (0 <= e < num_experts and 0 <= loc < capacity):
            continue
        row = np.zeros(beats * lanes, dtype=input.dtype)
        row[:hidden] = golden.dispatch_forward(
            gates[k, i:i + 1], np.zeros(1, np.int64), np.zeros(1, np.int64),
            input[i:i + 1], num_experts=1, capacity=1)[0]
        bits = to_bits(row, fmt).astype(np.uint64).reshape(beats, lanes)
        base = (e * capacity + loc) * hidden
        for b in range(beats):
            valid = min(lanes, hidden - b * lanes)
            addrs.append(base + b * lanes)
            enables.append((1 << valid) - 1)
            datas.append(np.where(np.arange(lanes) < valid, bits[b], 0))
    return (np.array(addrs, np.int64), np.array(enables, np.int64),
            np.array(datas, np.uint64).reshape(len(addrs), lanes))


def score_dispatch(run, gates, indices, locations, input, *, num_experts, capacity, lanes):
    """Assert that ``run`` (a DispatchRun) is the golden result, bit for bit, with nothing
    lost, duplicated, reordered or written out of bounds. Returns a list of problems."""
    problems = []
    want = golden.dispatch_forward(gates, indices, locations, input,
                                   num_experts=num_experts, capacity=capacity)
    fmt = format_of(input)
    got_bits, want_bits = to_bits(run.dispatch, fmt), to_bits(want, fmt)
    if got_bits.shape != want_bits.shape:
        problems.append(f"dispatch shape {got_bits.shape} != golden {want_bits.shape}")
    else:
        bad = np.argwhere(~bits_equal(got_bits, want_bits, fmt))
        if bad.size:
            r, c = bad[0]
            problems.append(f"{len(bad)} elements differ from golden; first at [{r}, {c}]: "
                            f"got {got_bits[r, c]:#x}, want {want_bits[r, c]:#x}")
    hidden = np.asarray(input).shape[1]
    want_dropped = golden.dispatch_dropped(indices, locations, num_experts=num_experts,
                                           capacity=capacity) if hidden > 0 else 0
    if run.dropped != want_dropped:
        problems.append(f"dropped = {run.dropped}, golden {want_dropped}")
    if run.out_of_bounds:
        problems.append(f"{run.out_of_bounds} lanes written out of bounds")
    if run.error:
        problems.append("error flag set")
    addr, enable, data = expected_writes(gates, indices, locations, input,
                                         num_experts=num_experts, capacity=capacity, lanes=lanes)
    got = run.writes
    if len(got["addr"]) != len(addr):
        problems.append(f"{len(got['addr'])} writes, expected {len(addr)} (lost or duplicated)")
    elif len(addr) == 0:
        pass
    else:
        got_data = np.where((got["enable"][:, None] >> np.arange(lanes)) & 1, got["data"], 0)
        for name, g, w in (("addr", got["addr"], addr), ("enable", got["enable"], enable),
                           ("data", got_data, data)):
            same = bits_equal(g, w, fmt) if name == "data" else np.asarray(g) == w
            bad = np.flatnonzero(~same.reshape(len(addr), -1).all(axis=1))
            if bad.size:
                problems.append(f"write {bad[0]}: {name} {g[bad[0]]} != expected {w[bad[0]]} "
                                "(reordered or wrong)")
    return problems


def _run(inputs, params, runtime, *, sim, stall, seed, check, progress):
    gates, indices, locations, input = need(inputs, "dispatch",
                                            ("gates", "indices", "locations", "input"))
    num_experts = runtime_int("num_experts", runtime, inputs)
    capacity = runtime_int("capacity", runtime, inputs)
    params = dispatch_params_for(gates, input, num_experts=num_experts, capacity=capacity,
                                 **params)
    result = run_dispatch(gates, indices, locations, input, num_experts=num_experts,
                          capacity=capacity, params=params, sim=sim, stall=stall, seed=seed,
                          progress=progress)
    outputs = {"dispatch": result.dispatch, "dropped": np.int64(result.dropped),
               "cycles": np.int64(result.cycles)}
    eff = result.ideal_cycles / result.cycles if result.cycles else 0.0
    report = [f"dispatch: {np.asarray(gates).size} pairs, H={np.shape(input)[-1]}, "
              f"E={num_experts}, C={capacity}, lanes={params.lanes}, {params.format}",
              f"cycles: {result.cycles} (ideal {result.ideal_cycles}, efficiency {eff:.4f}); "
              f"dropped pairs: {result.dropped}"]
    if check:
        problems = score_dispatch(result, gates, indices, locations, input,
                                  num_experts=num_experts, capacity=capacity, lanes=params.lanes)
        if problems:
            raise AssertionError("hardware differs from golden.dispatch_forward:\n  " +
                                 "\n  ".join(problems))
        report.append(f"check: bit-exact against golden.dispatch_forward "
                      f"({result.dispatch.size} elements); write log in order, no loss, "
                      "no duplicate, no out-of-bounds write")
    return outputs, report


UNITS = [Unit(
    "dispatch", "tutel / MLU-OPS dispatch forward: (index*C+location)*H address generation, "
    "bounds masks, gate multiply (SPEC 1.1)", DispatchParams, DispatchUnit, _run,
    runtime=("num_experts", "capacity"), inputs=("gates", "indices", "locations", "input"),
    outputs=("dispatch", "dropped"))]
