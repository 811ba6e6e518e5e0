"""Host side of the location generator: check a user's expert choices, run them through the
emitted Verilog, and score the locations, the per-expert totals and the would-drop count
against the golden model (``golden.compute_locations``, ``golden.expert_counts``)."""

from dataclasses import dataclass

import numpy as np

from .. import golden
from ..golden._common import check_count, index_array
from ..registry import Unit
from ..units.locations import LocationsParams, LocationsUnit
from .common import HostError, need, runtime_int

__all__ = ["LocationsRun", "locations_params_for", "run_locations", "simulate_locations",
           "score_locations", "benchmark"]


@dataclass
class LocationsRun:
    locations: np.ndarray      # int32, the shape of indices
    expert_counts: np.ndarray  # int64 [E], as the counts stream delivered them
    dropped: int               # routed pairs with location >= capacity
    error: bool
    cycles: int
    ideal_cycles: int          # one pair per cycle
    location_beats: int        # beats on the location stream (must be the number of pairs)
    pairs_taken: int           # index beats the unit took


def locations_params_for(indices, *, num_experts, capacity, **overrides):
    """The smallest :class:`LocationsParams` that holds this problem (overrides win)."""
    fields = dict(max_pairs=max(1, int(np.asarray(indices).size)),
                  max_experts=max(1, num_experts), max_capacity=max(1, capacity))
    fields.update(overrides)
    return LocationsParams(**fields)


def _check(indices, num_experts, capacity):
    num_experts = check_count("num_experts", num_experts)
    capacity = check_count("capacity", capacity)
    indices = index_array("indices", indices, ndim=(1, 2), what="[S] or [k, S]")
    return indices, num_experts, capacity


def simulate_locations(index_values, *, num_experts, capacity, params, pairs=None,
                       sim="verilator", stall=0.0, seed=0, progress=None):
    """Drive the unit with the flat pair indices ``index_values`` and the run-time values as
    given (``pairs`` defaults to their number), with no checks: the raw bench results."""
    from ..flows.simulate import simulate

    index_values = np.asarray(index_values, dtype=np.int64).reshape(-1)
    pairs = index_values.size if pairs is None else pairs
    too_big = (pairs > params.max_pairs or num_experts > params.max_experts or
               capacity > params.max_capacity)
    settings = {"pairs": int(pairs), "num_experts": int(num_experts),
                "capacity": int(capacity), "stall": float(stall), "seed": int(seed),
                "expect_error": bool(too_big)}
    return simulate(LocationsUnit(params), "locations", "bench_locations",
                    {"index": index_values}, sim=sim, settings=settings, progress=progress)


def run_locations(indices, *, num_experts, capacity, params=None, sim="verilator", stall=0.0,
                  seed=0, progress=None):
    """Run ``compute_locations`` (and ``expert_counts``) on the hardware.

    ``indices`` is [S] or [k, S] (k-major pairs); ``capacity`` only feeds the would-drop
    count ``dropped``.
    """
    indices, num_experts, capacity = _check(indices, num_experts, capacity)
    if params is None:
        params = locations_params_for(indices, num_experts=num_experts, capacity=capacity)
    for name, value, maximum in (("pairs (k*S)", indices.size, params.max_pairs),
                                 ("num_experts", num_experts, params.max_experts),
                                 ("capacity", capacity, params.max_capacity)):
        if value > maximum:
            raise HostError(f"{name} = {value} exceeds the unit's maximum of {maximum}")
    lo, hi = -(1 << (params.index_width - 1)), (1 << (params.index_width - 1)) - 1
    bad = np.flatnonzero((indices < lo) | (indices > hi))
    if bad.size:
        raise HostError(f"indices.flat[{bad[0]}] = {indices.flat[bad[0]]} does not fit the "
                        f"{params.index_width}-bit index field (index_width)")

    res = simulate_locations(indices.reshape(-1).astype(np.int64), num_experts=num_experts,
                             capacity=capacity, params=params, sim=sim, stall=stall,
                             seed=seed, progress=progress)
    got = res["location"]
    locations = np.full(indices.size, -1, dtype=np.int32)
    locations[:min(got.size, indices.size)] = got[:indices.size]
    return LocationsRun(
        locations=locations.reshape(indices.shape), expert_counts=res["counts"].astype(np.int64),
        dropped=int(res["dropped"]), error=bool(res["error"]), cycles=int(res["cycles"]),
        ideal_cycles=int(indices.size), location_beats=int(got.size),
        pairs_taken=int(res["pairs_taken"]))


def score_locations(run, indices, *, num_experts, capacity):
    """Problems of ``run`` (a LocationsRun) against the golden model, [] when it is exact:
    every location in order (nothing lost, duplicated or reordered), every total, the
    would-drop count, no error."""
    indices, num_experts, capacity = _check(indices, num_experts, capacity)
    problems = []
    want = golden.compute_locations(indices, num_experts=num_experts)
    if run.location_beats != indices.size:
        problems.append(f"{run.location_beats} location beats for {indices.size} pairs "
                        "(lost or duplicated)")
    if run.pairs_taken != indices.size:
        problems.append(f"the unit took {run.pairs_taken} of {indices.size} pairs")
    if run.locations.dtype != want.dtype or run.locations.shape != want.shape:
        problems.append(f"locations {run.locations.dtype}{run.locations.shape} != golden "
                        f"{want.dtype}{want.shape}")
    else:
        bad = np.flatnonzero(run.locations.reshape(-1) != want.reshape(-1))
        if bad.size:
            problems.append(f"{bad.size} locations differ from golden; first pair {bad[0]}: "
                            f"got {run.locations.flat[bad[0]]}, want {want.flat[bad[0]]}")
    counts = golden.expert_counts(indices, num_experts)
    if run.expert_counts.shape != counts.shape or \
            not np.array_equal(run.expert_counts, counts):
        problems.append(f"expert_counts {run.expert_counts.tolist()} != golden "
                        f"{counts.tolist()}")
    want_dropped = int(np.count_nonzero(want >= capacity))
    if run.dropped != want_dropped:
        problems.append(f"dropped = {run.dropped}, golden {want_dropped}")
    if run.error:
        problems.append("error flag set")
    return problems


def random_indices(rng, tokens, experts, k):
    """Top-k style choices [k, S]: k distinct experts per token when k <= experts."""
    if k <= experts:
        return np.stack([rng.permutation(experts)[:k] for _ in range(tokens)], axis=1) \
            .reshape(k, tokens).astype(np.int32)
    return rng.integers(0, experts, (k, tokens)).astype(np.int32)


def benchmark(tokens=1024, experts=8, k=2, sim="verilator", *, capacity_factor=1.25, seed=0,
              stall=0.0, **params):
    """Run a seeded random top-k problem of ``k*tokens`` pairs; return the figures.

    Ideal: one pair per cycle (``k*tokens``). The unit adds one cycle per expert (the
    read-out of the totals) and :attr:`LocationsUnit.OVERHEAD`. ``params`` override the
    generation-time parameters (by default sized to the problem).
    """
    rng = np.random.default_rng(seed)
    indices = random_indices(rng, tokens, experts, k)
    capacity = golden.capacity_from_factor(capacity_factor, tokens, experts, k)
    params = locations_params_for(indices, num_experts=experts, capacity=capacity, **params)
    run = run_locations(indices, num_experts=experts, capacity=capacity, params=params,
                        sim=sim, stall=stall, seed=seed)
    problems = score_locations(run, indices, num_experts=experts, capacity=capacity)
    return {"unit": "locations", "tokens": tokens, "experts": experts, "k": k,
            "pairs": int(indices.size), "capacity": capacity, "sim": sim, "stall": stall,
            "ideal_cycles": run.ideal_cycles, "cycles": run.cycles,
            "formula_cycles": LocationsUnit.stall_free_cycles(indices.size, experts),
            "efficiency": run.ideal_cycles / run.cycles if run.cycles else float("nan"),
            "dropped": run.dropped, "passed": not problems, "problems": problems}


def _run(inputs, params, runtime, *, sim, stall, seed, check, progress):
    (indices,) = need(inputs, "locations", ("indices",))
    num_experts = runtime_int("num_experts", runtime, inputs)
    capacity = runtime_int("capacity", runtime, inputs)
    params = locations_params_for(indices, num_experts=num_experts, capacity=capacity,
                                  **params)
    run = run_locations(indices, num_experts=num_experts, capacity=capacity, params=params,
                        sim=sim, stall=stall, seed=seed, progress=progress)
    outputs = {"locations": run.locations, "expert_counts": run.expert_counts,
               "dropped": np.int64(run.dropped), "cycles": np.int64(run.cycles)}
    eff = run.ideal_cycles / run.cycles if run.cycles else 0.0
    report = [f"locations: {np.size(indices)} pairs, E={num_experts}, C={capacity}",
              f"cycles: {run.cycles} (ideal {run.ideal_cycles}, one pair per cycle; "
              f"efficiency {eff:.4f}); pairs at or past capacity: {run.dropped}"]
    if check:
        problems = score_locations(run, indices, num_experts=num_experts, capacity=capacity)
        if problems:
            raise AssertionError("hardware differs from golden.compute_locations:\n  " +
                                 "\n  ".join(problems))
        report.append(f"check: exact against golden.compute_locations and expert_counts "
                      f"({np.size(indices)} locations, {num_experts} totals)")
    return outputs, report


UNITS = [Unit(
    "locations", "tutel location generation: per-expert counter bank, one (k, i) pair per "
    "cycle, then the per-expert totals (SPEC 1.2)", LocationsParams, LocationsUnit, _run,
    runtime=("num_experts", "capacity"), inputs=("indices",),
    outputs=("locations", "expert_counts", "dropped"))]
