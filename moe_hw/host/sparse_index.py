"""The sparse dispatcher's index unit's declaration and host adapter: a user's gate matrix in
(streamed through the unit twice: its count and place passes), ``batch_index`` /
``nonzero_gates`` built from the unit's slot writes and ``part_sizes`` out, scored with the
offsets and the write log against ``golden.sparse_dispatch_indices``.

npz inputs: ``gates`` [S, E]. Outputs: ``batch_index``, ``part_sizes``, ``nonzero_gates``.
"""

import numpy as np

from .. import golden
from ..flows.fastsim import FastBench, Sink, Source, lane_beats
from ..formats import FORMATS, from_bits, to_bits
from ..golden.sparse import check_gate_matrix
from ..units.sparse_index import SparseIndexParams, SparseIndexUnit, place_cycles
from .checks import (HostError, check_dtype, check_maxima, compare_bits, compare_log,
                     compare_values, format_of, need)
from ..problems import softmax_gates
from .unit import Unit

__all__ = ["UNIT", "SparseIndex", "row_beats", "expected_writes",
           "simulate_raw"]


def _next_pow2(n):
    return 1 << max(0, (n - 1).bit_length())


def row_beats(gate_bits, lanes):
    """The ``rows`` stream's beats for a [S, E] array of bit patterns: [S*ceil(E/lanes),
    lanes], row-major, each row zero-padded to whole beats."""
    return lane_beats(gate_bits, lanes)


def routed_per_beat(gates, lanes):
    """The routed gates (nonzero: NaN yes, -0.0 no) in each beat of the ``rows`` stream."""
    nonzero = (np.asarray(gates) != 0).astype(np.int64)
    return row_beats(nonzero, lanes).sum(axis=1)


def expected_writes(batch_index, part_sizes):
    """The scoreboard: the unit's write order, (addr, token) per routed gate, row-major (token
    ascending, then expert ascending), from the golden slot arrays."""
    experts = np.repeat(np.arange(len(part_sizes)), part_sizes)
    order = np.lexsort((experts, batch_index))
    return order.astype(np.int64), batch_index[order]


class SparseIndex(Unit):
    name = "sparse_index"
    summary = ("DUET SparseDispatcher indices: stable counting sort of the gate matrix's "
               "nonzeros by expert (count, prefix-sum, place passes; SPEC 1.3)")
    golden = "golden.sparse_dispatch_indices"
    params = SparseIndexParams
    inputs = ("gates",)
    outputs = ("batch_index", "part_sizes", "nonzero_gates")
    runtime = ()
    ideal = ("three passes: S*ceil(E/lanes) row beats + E offsets + one beat or one routed "
             "gate per cycle (S + E + k*S with one beat per row)")

    def build(self, params):
        return SparseIndexUnit(params)

    def problem(self, inputs, runtime):
        (gates,) = need(inputs, self.name, self.inputs)
        try:
            return {"gates": check_gate_matrix(gates)}
        except ValueError as error:        # a negative gate, with the golden model's message
            raise HostError(str(error)) from None

    def params_for(self, problem, settings):
        """Sized to the matrix; ``lanes`` defaults to one beat per row (up to 16)."""
        tokens, experts = problem["gates"].shape
        settings = {"format": format_of(problem["gates"]),
                    "lanes": min(16, _next_pow2(max(1, experts))), **settings}
        params = self.sized(settings, max_tokens=max(1, tokens), max_experts=max(1, experts))
        self.fits(problem, params)
        return params

    def fits(self, problem, params):
        check_dtype(params.format, gates=problem["gates"])
        tokens, experts = problem["gates"].shape
        check_maxima(params, tokens=(tokens, "max_tokens"),
                     num_experts=(experts, "max_experts"))

    def pack(self, problem, params, *, stall, seed):
        self.fits(problem, params)
        return stimulus(problem["gates"], params)

    def fast(self, stimulus, settings):
        """sim/bench_sparse_index.py on the fast path: the same streams and results."""
        beats = stimulus["beats"]
        rows = np.concatenate([beats, stimulus.get("second", beats)])   # pass 3 re-reads
        experts, lanes = settings["num_experts"], settings["lanes"]
        return FastBench(
            streams={"rows": Source({"gates": rows}),
                     "part_sizes": Sink(depth=2 * experts + 16),
                     "write": Sink(depth=2 * lanes * len(beats) + 16)},
            sizes={"tokens": settings["tokens"], "num_experts": experts},
            results={"part_size": "part_sizes.part_size", "offset": "part_sizes.offset",
                     "addr": "write.addr", "token": "write.token",
                     "gate": lambda get: get("write.gate").astype(np.uint64),
                     "beats_taken": "rows.sent", "beats_offered": np.int64(len(rows)),
                     "nonzeros": "nonzeros", "error": "error", "busy_after": "busy"},
            limit=40 * (len(rows) + experts + lanes * len(beats)) + 1000, what="sparse_index")

    def unpack(self, problem, params, results):
        """The slot arrays the writes built; the offsets and the write log's defects (slots
        written twice, writes out of bounds) go into ``results``."""
        fmt = params.fmt
        n = int(results["nonzeros"])
        batch_index = np.full(n, -1, dtype=np.int64)
        gate_bits = np.zeros(n, dtype=fmt.uint_dtype)
        written = np.zeros(n, dtype=np.int64)
        inside = (results["addr"] >= 0) & (results["addr"] < n)
        for addr, token, gate in zip(results["addr"][inside], results["token"][inside],
                                     results["gate"][inside]):
            batch_index[addr], gate_bits[addr] = token, gate
            written[addr] += 1
        results["duplicates"] = int(np.count_nonzero(written > 1))
        results["out_of_bounds"] = int(np.count_nonzero(~inside))
        return {"batch_index": batch_index, "part_sizes": results["part_size"],
                "nonzero_gates": from_bits(gate_bits, fmt)}

    def score(self, problem, params, outputs, results, *, expected=None):
        """The three outputs bit for bit, the offsets and the write log (every slot written
        once, in the documented order, nothing out of bounds), every beat taken, no error.
        ``expected`` replaces the golden result ``(batch_index, part_sizes, nonzero_gates)``
        (for inputs the golden model rejects; the error flag is then not a finding)."""
        gates = problem["gates"]
        fmt = FORMATS[format_of(gates)]
        batch_index, part_sizes, nonzero_gates = \
            golden.sparse_dispatch_indices(gates) if expected is None else expected
        findings = compare_values("part_sizes", outputs["part_sizes"], part_sizes)
        offsets = np.concatenate([[0], np.cumsum(part_sizes)[:-1]]).astype(np.int64) \
            if len(part_sizes) else np.zeros(0, np.int64)
        findings += compare_values("offsets (exclusive prefix sum)", results["offset"],
                                   offsets)
        findings += compare_values("nonzeros", int(results["nonzeros"]), len(batch_index))
        findings += compare_values("batch_index", outputs["batch_index"], batch_index)
        if outputs["nonzero_gates"].dtype != nonzero_gates.dtype:
            findings.append(f"nonzero_gates dtype {outputs['nonzero_gates'].dtype}, golden "
                            f"{nonzero_gates.dtype}")
        else:
            findings += compare_bits("nonzero_gates", outputs["nonzero_gates"], nonzero_gates,
                                     fmt)
        if results["duplicates"] or results["out_of_bounds"]:
            findings.append(f"{results['duplicates']} slots written twice, "
                            f"{results['out_of_bounds']} writes out of bounds")
        addr, token = expected_writes(batch_index, part_sizes)
        want = {"addr": addr, "token": token, "gate": to_bits(nonzero_gates, fmt)[addr]}
        # The gate is the input's bit pattern, unchanged: compared bit for bit.
        findings += compare_log("write log", {name: results[name] for name in want}, want)
        if int(results["beats_taken"]) != int(results["beats_offered"]):
            findings.append(f"the unit took {int(results['beats_taken'])} of "
                            f"{int(results['beats_offered'])} row beats")
        if int(results["error"]) and expected is None:
            findings.append("error flag set")
        return findings

    def single_pass_cycles(self, problem, params):
        """One read of the matrix at one beat per cycle, ``S*ceil(E/lanes)``: for comparison
        (the unit reads it twice and adds a pass over the experts)."""
        tokens, experts = problem["gates"].shape
        return tokens * -(-experts // params.lanes)

    def place_cycles(self, problem, params):
        return place_cycles(routed_per_beat(problem["gates"], params.lanes))

    def ideal_cycles(self, problem, params):
        tokens, experts = problem["gates"].shape
        if not tokens:
            return experts
        return (self.single_pass_cycles(problem, params) + experts +
                self.place_cycles(problem, params))

    def cycles(self, problem, params):
        tokens, experts = problem["gates"].shape
        return params.stall_free_cycles(tokens, experts, self.place_cycles(problem, params))

    def describe(self, problem, params):
        tokens, experts = problem["gates"].shape
        nonzeros = int(np.count_nonzero(problem["gates"] != 0))
        return (f"sparse_index: S={tokens}, E={experts}, {nonzeros} nonzeros, "
                f"lanes={params.lanes}, {params.format}; one read of the matrix would be "
                f"{self.single_pass_cycles(problem, params)} cycles")

    def bench_problems(self, shape, seed=0):
        gates = softmax_gates(np.random.default_rng(seed), shape.tokens, shape.experts,
                             shape.top_k, FORMATS[shape.format].dtype)
        return {"": ({"gates": gates}, {"lanes": shape.lanes})}


def stimulus(gates, params, *, tokens=None, num_experts=None, second=None):
    """The bench's ``(stimulus, settings)`` for the [S, E] float array ``gates`` as given,
    with no checks. ``tokens`` and ``num_experts`` default to the shape; ``second`` replaces
    the pass-3 copy of the matrix."""
    fmt = params.fmt
    gates = np.asarray(gates)
    tokens = gates.shape[0] if tokens is None else tokens
    num_experts = gates.shape[1] if num_experts is None else num_experts
    stim = {"beats": row_beats(to_bits(gates, fmt).astype(np.uint64), params.lanes)}
    if second is not None:
        stim["second"] = row_beats(to_bits(np.asarray(second), fmt).astype(np.uint64),
                                   params.lanes)
    return stim, {"lanes": params.lanes, "width": fmt.width, "tokens": int(tokens),
                  "num_experts": int(num_experts)}


def simulate_raw(gates, *, params, tokens=None, num_experts=None, second=None,
                 sim="verilator", stall=0.0, seed=0):
    """Drive the unit with ``gates`` as given, with no checks (negative gates and sizes
    above the maxima reach the hardware: this is how its error flag is tested); arguments
    as :func:`stimulus`. Returns the raw bench results."""
    stim, settings = stimulus(gates, params, tokens=tokens, num_experts=num_experts,
                              second=second)
    return UNIT.simulate(params, stim, settings, sim=sim, stall=stall, seed=seed)


UNIT = SparseIndex()
