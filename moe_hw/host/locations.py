"""The location generator's declaration and host adapter: a user's expert choices in, the
locations, the per-expert totals and the would-drop count out, scored against
``golden.compute_locations`` and ``golden.expert_counts``.

npz inputs: ``indices`` ([S] or [k, S], k-major pairs); run-time ``num_experts``,
``capacity`` (``capacity`` only feeds the would-drop count ``dropped``). Outputs:
``locations`` (the shape of ``indices``), ``expert_counts`` [E], ``dropped``.
"""

import numpy as np

from .. import golden
from ..golden._common import index_array
from ..problems import routed_problem
from ..units.locations import LocationsParams, LocationsUnit
from .checks import check_fits_field, check_maxima, compare_values, need, runtime_int
from ..flows.fastsim import FastBench, Sink, Source
from .unit import Unit

__all__ = ["UNIT", "Locations", "simulate_raw"]


class Locations(Unit):
    name = "locations"
    summary = ("tutel location generation: per-expert counter bank, one (k, i) pair per "
               "cycle, then the per-expert totals (SPEC 1.2)")
    golden = "golden.compute_locations and golden.expert_counts"
    params = LocationsParams
    inputs = ("indices",)
    outputs = ("locations", "expert_counts", "dropped")
    runtime = ("num_experts", "capacity")
    ideal = "one (k, i) pair per cycle: k*S"

    def build(self, params):
        return LocationsUnit(params)

    def problem(self, inputs, runtime):
        (indices,) = need(inputs, self.name, self.inputs)
        return {"indices": index_array("indices", indices, ndim=(1, 2), what="[S] or [k, S]"),
                "num_experts": runtime_int("num_experts", runtime, inputs),
                "capacity": runtime_int("capacity", runtime, inputs)}

    def params_for(self, problem, settings):
        params = self.sized(settings, max_pairs=max(1, problem["indices"].size),
                            max_experts=max(1, problem["num_experts"]),
                            max_capacity=max(1, problem["capacity"]))
        self.fits(problem, params)
        return params

    def fits(self, problem, params):
        check_maxima(params, pairs=(problem["indices"].size, "max_pairs"),
                     num_experts=(problem["num_experts"], "max_experts"),
                     capacity=(problem["capacity"], "max_capacity"))
        check_fits_field("indices", problem["indices"], params.index_width)

    def pack(self, problem, params, *, stall, seed):
        self.fits(problem, params)
        return stimulus(problem["indices"], num_experts=problem["num_experts"],
                        capacity=problem["capacity"], params=params)

    def fast(self, stimulus, settings):
        """sim/bench_locations.py on the fast path: the same streams and results."""
        index = stimulus["index"]
        experts = settings["num_experts"]
        return FastBench(
            streams={"index": Source({"index": index}, all_taken=not settings["expect_error"]),
                     "location": Sink(depth=2 * len(index) + 16),
                     "counts": Sink(depth=2 * experts + 16)},
            sizes={name: settings[name] for name in ("pairs", "num_experts", "capacity")},
            results={"location": "location.location:signed", "counts": "counts.count",
                     "pairs_taken": "index.sent", "dropped": "dropped", "error": "error",
                     "busy_after": "busy"},
            limit=40 * (len(index) + experts) + 1000, what="locations")

    def unpack(self, problem, params, results):
        indices = problem["indices"]
        got = results["location"]
        locations = np.full(indices.size, -1, dtype=np.int32)     # as the golden model
        locations[:min(got.size, indices.size)] = got[:indices.size]
        return {"locations": locations.reshape(indices.shape),
                "expert_counts": results["counts"].astype(np.int64),
                "dropped": np.int64(results["dropped"])}

    def score(self, problem, params, outputs, results):
        """Every location in order (nothing lost, duplicated or reordered), every total, the
        would-drop count, every pair taken, no error."""
        indices, num_experts = problem["indices"], problem["num_experts"]
        want = golden.compute_locations(indices, num_experts=num_experts)
        findings = []
        if results["location"].size != indices.size:
            findings.append(f"{results['location'].size} location beats for {indices.size} "
                            "pairs (lost or duplicated)")
        if int(results["pairs_taken"]) != indices.size:
            findings.append(f"the unit took {int(results['pairs_taken'])} of {indices.size} "
                            "pairs")
        findings += compare_values("locations", outputs["locations"], want)
        findings += compare_values("expert_counts", outputs["expert_counts"],
                                   golden.expert_counts(indices, num_experts))
        findings += compare_values("dropped", outputs["dropped"],
                                   np.count_nonzero(want >= problem["capacity"]))
        if int(results["error"]):
            findings.append("error flag set")
        return findings

    def ideal_cycles(self, problem, params):
        return problem["indices"].size

    def cycles(self, problem, params):
        return params.stall_free_cycles(problem["indices"].size, problem["num_experts"])

    def describe(self, problem, params):
        return (f"locations: {problem['indices'].size} pairs, E={problem['num_experts']}, "
                f"C={problem['capacity']}")

    def bench_problems(self, shape, seed=0):
        return {"": self.inputs_of(routed_problem(
            tokens=shape.tokens, hidden=0, experts=shape.experts, top_k=shape.top_k,
            capacity=shape.capacity, seed=seed))}



def stimulus(indices, *, num_experts, capacity, params, pairs=None):
    """The bench's ``(stimulus, settings)`` for the pair indices and run-time values as given
    (``pairs`` defaults to their number), with no checks."""
    index = np.asarray(indices, dtype=np.int64).reshape(-1)
    pairs = index.size if pairs is None else int(pairs)
    too_big = (pairs > params.max_pairs or num_experts > params.max_experts or
               capacity > params.max_capacity)
    return {"index": index}, {"pairs": pairs, "num_experts": int(num_experts),
                              "capacity": int(capacity), "expect_error": bool(too_big)}


def simulate_raw(indices, *, num_experts, capacity, params, pairs=None, sim="verilator",
                 stall=0.0, seed=0):
    """Drive the unit with ``indices`` and the run-time values as given, with no checks (a
    size above its maximum reaches the hardware: this is how its error flag is tested); the
    raw bench results."""
    stim, settings = stimulus(indices, num_experts=num_experts, capacity=capacity,
                              params=params, pairs=pairs)
    return UNIT.simulate(params, stim, settings, sim=sim, stall=stall, seed=seed)


UNIT = Locations()
