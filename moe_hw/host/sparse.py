"""Host side of the sparse dispatcher's index unit (``sparse_index``): check a user's gate
matrix, stream it through the emitted Verilog (twice: the unit's count and place passes), build
``batch_index`` / ``nonzero_gates`` from the unit's slot writes, and score them, ``part_sizes``
and the write log against the golden model (``golden.sparse_dispatch_indices``)."""

from dataclasses import dataclass

import numpy as np

from .. import golden
from ..formats import FORMATS, bits_equal, from_bits, to_bits
from ..golden.sparse import check_gate_matrix
from ..registry import Unit
from ..units.sparse_index import SparseIndexParams, SparseIndexUnit, place_cycles
from .common import HostError, format_of, need

__all__ = ["SparseIndexRun", "sparse_params_for", "row_beats", "run_sparse_index",
           "simulate_sparse_index", "score_sparse_index", "expected_writes", "random_gates",
           "benchmark"]


@dataclass
class SparseIndexRun:
    batch_index: np.ndarray     # int64 [n]: the token written to each slot (-1: never written)
    part_sizes: np.ndarray      # int64 [E], from the part_sizes stream
    nonzero_gates: np.ndarray   # [n], the gates' dtype: the gate written to each slot
    offsets: np.ndarray         # int64 [E], the part_sizes stream's offsets
    nonzeros: int               # the unit's count of routed gates
    error: bool
    cycles: int
    formula_cycles: int         # SparseIndexUnit.stall_free_cycles for this problem
    ideal_cycles: int           # the three passes at their rates, without fixed overhead
    single_pass_cycles: int     # S * ceil(E / lanes): one read of the matrix, one beat/cycle
    writes: dict                # the write log in order: addr, token, gate (bits)
    duplicates: int             # slots written more than once
    out_of_bounds: int          # writes outside [0, n)
    beats_taken: int
    beats_offered: int


def _next_pow2(n):
    return 1 << max(0, (n - 1).bit_length())


def sparse_params_for(gates, **overrides):
    """The smallest :class:`SparseIndexParams` that holds ``gates`` [S, E] (overrides win);
    ``lanes`` defaults to one beat per row (up to 16)."""
    gates = np.asarray(gates)
    tokens, experts = gates.shape if gates.ndim == 2 else (0, 0)
    fields = dict(format=format_of(gates), lanes=min(16, _next_pow2(max(1, experts))),
                  max_tokens=max(1, tokens), max_experts=max(1, experts))
    fields.update(overrides)
    return SparseIndexParams(**fields)


def row_beats(gate_bits, lanes):
    """The ``rows`` stream's beats for a [S, E] array of bit patterns: [S*ceil(E/lanes),
    lanes], row-major, each row zero-padded to whole beats."""
    tokens, experts = gate_bits.shape
    beats = -(-experts // lanes)
    padded = np.zeros((tokens, beats * lanes), dtype=np.uint64)
    padded[:, :experts] = gate_bits
    return padded.reshape(tokens * beats, lanes)


def _routed_per_beat(gates, lanes):
    nonzero = (np.asarray(gates) != 0).astype(np.int64)    # NaN != 0; -0.0 == 0
    return row_beats(nonzero, lanes).sum(axis=1)


def simulate_sparse_index(gates, *, params, tokens=None, num_experts=None, second=None,
                          sim="verilator", stall=0.0, seed=0, progress=None):
    """Drive the unit with the [S, E] float array ``gates`` as given, with no checks (negative
    gates reach the hardware: this is how its error flag is tested). ``tokens`` and
    ``num_experts`` default to the shape; ``second`` replaces the pass-3 copy of the matrix.
    Returns the raw bench results."""
    from ..flows.simulate import simulate

    fmt = FORMATS[params.format]
    gates = np.asarray(gates)
    tokens = gates.shape[0] if tokens is None else tokens
    num_experts = gates.shape[1] if num_experts is None else num_experts
    stimulus = {"beats": row_beats(to_bits(gates, fmt).astype(np.uint64), params.lanes)}
    if second is not None:
        stimulus["second"] = row_beats(to_bits(np.asarray(second), fmt).astype(np.uint64),
                                       params.lanes)
    settings = {"lanes": params.lanes, "width": fmt.width, "tokens": int(tokens),
                "num_experts": int(num_experts), "stall": float(stall), "seed": int(seed)}
    return simulate(SparseIndexUnit(params), "sparse_index", "bench_sparse_index", stimulus,
                    sim=sim, settings=settings, progress=progress)


def run_sparse_index(gates, *, params=None, sim="verilator", stall=0.0, seed=0,
                     progress=None):
    """Run ``sparse_dispatch_indices(gates)`` on the hardware; ``gates`` [S, E] as the golden
    model takes it (negative gates are rejected here with the golden model's message)."""
    try:
        gates = check_gate_matrix(gates)
    except ValueError as error:
        raise HostError(str(error)) from None
    if params is None:
        params = sparse_params_for(gates)
    fmt = FORMATS[params.format]
    if gates.dtype != fmt.dtype:
        raise HostError(f"gates has dtype {gates.dtype}, but the unit's format is {fmt.name} "
                        f"({fmt.dtype})")
    tokens, experts = gates.shape
    for name, value, maximum in (("tokens (S)", tokens, params.max_tokens),
                                 ("num_experts (E)", experts, params.max_experts)):
        if value > maximum:
            raise HostError(f"{name} = {value} exceeds the unit's maximum of {maximum}")
    res = simulate_sparse_index(gates, params=params, sim=sim, stall=stall, seed=seed,
                                progress=progress)
    return collect(res, gates, params)


def collect(res, gates, params):
    """A :class:`SparseIndexRun` from the bench results: the slot arrays the writes built."""
    fmt = FORMATS[params.format]
    tokens, experts = gates.shape
    n = int(res["nonzeros"])
    batch_index = np.full(n, -1, dtype=np.int64)
    gate_bits = np.zeros(n, dtype=fmt.uint_dtype)
    written = np.zeros(n, dtype=np.int64)
    inside = (res["addr"] >= 0) & (res["addr"] < n)
    for addr, token, gate in zip(res["addr"][inside], res["token"][inside],
                                 res["gate"][inside]):
        batch_index[addr], gate_bits[addr] = token, gate
        written[addr] += 1
    routed = _routed_per_beat(gates, params.lanes)
    single = tokens * -(-experts // params.lanes)
    return SparseIndexRun(
        batch_index=batch_index, part_sizes=res["part_size"], offsets=res["offset"],
        nonzero_gates=from_bits(gate_bits, fmt), nonzeros=n, error=bool(res["error"]),
        cycles=int(res["cycles"]),
        formula_cycles=SparseIndexUnit.stall_free_cycles(tokens, experts, params.lanes,
                                                          place_cycles(routed)),
        ideal_cycles=single + experts + place_cycles(routed) if tokens else experts,
        single_pass_cycles=single,
        writes={"addr": res["addr"], "token": res["token"], "gate": res["gate"]},
        duplicates=int(np.count_nonzero(written > 1)),
        out_of_bounds=int(np.count_nonzero(~inside)),
        beats_taken=int(res["beats_taken"]), beats_offered=int(res["beats_offered"]))


def expected_writes(batch_index, part_sizes):
    """The scoreboard: the unit's write order, (addr, token) per routed gate, row-major (token
    ascending, then expert ascending), from the golden slot arrays."""
    experts = np.repeat(np.arange(len(part_sizes)), part_sizes)
    order = np.lexsort((experts, batch_index))
    return order.astype(np.int64), batch_index[order]


def score_sparse_index(run, gates, *, expected=None):
    """Problems of ``run`` (a SparseIndexRun) against the golden model, [] when it is exact:
    the three outputs bit for bit, the offsets, and the write log (every slot written once,
    in the documented order, nothing out of bounds). ``expected`` replaces the golden result
    ``(batch_index, part_sizes, nonzero_gates)`` (for inputs the golden model rejects)."""
    gates = np.asarray(gates)
    if expected is None:
        expected = golden.sparse_dispatch_indices(gates)
    batch_index, part_sizes, nonzero_gates = expected
    fmt = FORMATS[format_of(gates)]
    problems = []
    if run.part_sizes.shape != part_sizes.shape or \
            not np.array_equal(run.part_sizes, part_sizes):
        problems.append(f"part_sizes {run.part_sizes.tolist()} != golden {part_sizes.tolist()}")
    offsets = np.concatenate([[0], np.cumsum(part_sizes)[:-1]]).astype(np.int64) \
        if len(part_sizes) else np.zeros(0, np.int64)
    if run.offsets.shape != offsets.shape or not np.array_equal(run.offsets, offsets):
        problems.append(f"offsets {run.offsets.tolist()} != exclusive prefix sum "
                        f"{offsets.tolist()}")
    if run.nonzeros != len(batch_index):
        problems.append(f"nonzeros = {run.nonzeros}, golden {len(batch_index)}")
    if run.batch_index.shape != batch_index.shape or \
            not np.array_equal(run.batch_index, batch_index):
        problems.append(f"batch_index differs from golden: got {run.batch_index[:16].tolist()}"
                        f"..., want {batch_index[:16].tolist()}...")
    if run.nonzero_gates.dtype != nonzero_gates.dtype or \
            run.nonzero_gates.shape != nonzero_gates.shape:
        problems.append(f"nonzero_gates {run.nonzero_gates.dtype}{run.nonzero_gates.shape} != "
                        f"golden {nonzero_gates.dtype}{nonzero_gates.shape}")
    else:
        same = bits_equal(to_bits(run.nonzero_gates, fmt), to_bits(nonzero_gates, fmt), fmt)
        if not same.all():
            s = int(np.flatnonzero(~same)[0])
            problems.append(f"{np.count_nonzero(~same)} nonzero_gates differ from golden; "
                            f"first slot {s}: got {to_bits(run.nonzero_gates, fmt)[s]:#x}, "
                            f"want {to_bits(nonzero_gates, fmt)[s]:#x}")
    if run.duplicates or run.out_of_bounds:
        problems.append(f"{run.duplicates} slots written twice, {run.out_of_bounds} writes out "
                        "of bounds")
    addr, token = expected_writes(batch_index, part_sizes)
    got = run.writes
    if len(got["addr"]) != len(addr):
        problems.append(f"{len(got['addr'])} writes, expected {len(addr)} (lost or duplicated)")
    elif len(addr):
        want_gate = to_bits(nonzero_gates, fmt)[addr]
        for name, g, w in (("addr", got["addr"], addr), ("token", got["token"], token)):
            bad = np.flatnonzero(np.asarray(g) != w)
            if bad.size:
                problems.append(f"write {bad[0]}: {name} {g[bad[0]]} != expected {w[bad[0]]} "
                                "(reordered or wrong)")
        bad = np.flatnonzero(~bits_equal(got["gate"], want_gate, fmt))
        if bad.size:
            problems.append(f"write {bad[0]}: gate {got['gate'][bad[0]]:#x} != expected "
                            f"{want_gate[bad[0]]:#x}")
    if run.beats_taken != run.beats_offered:
        problems.append(f"the unit took {run.beats_taken} of {run.beats_offered} row beats")
    if run.error and expected is None:
        problems.append("error flag set")
    return problems


def random_gates(rng, tokens, experts, k, dtype=np.float32):
    """Softmax-top-k-like gates [S, E]: k distinct experts per row, gates in (0.05, 1)."""
    gates = np.zeros((tokens, experts), dtype)
    for i in range(tokens):
        chosen = rng.choice(experts, min(k, experts), replace=False)
        gates[i, chosen] = rng.uniform(0.05, 1.0, len(chosen)).astype(np.float32).astype(dtype)
    return gates


def benchmark(tokens=1024, experts=8, k=2, sim="verilator", *, lanes=None, seed=0, stall=0.0):
    """Run a seeded random [tokens, experts] gate matrix with k nonzeros per row; return the
    figures.

    The unit makes three passes, so there is no single-pass ideal to reach: ``ideal_cycles``
    is the multi-pass ideal at one beat (pass 1), one expert (pass 2) and one beat or one
    routed gate (pass 3) per cycle, ``S*ceil(E/lanes) + E + sum(max(1, routed per beat))``,
    i.e. ``S + E + k*S`` with one beat per row; ``efficiency`` is against it.
    ``single_pass_cycles`` (``S*ceil(E/lanes)``, one read of the matrix) and
    ``output_bound`` (``k*S``, one slot write per cycle) are given for comparison.
    """
    rng = np.random.default_rng(seed)
    gates = random_gates(rng, tokens, experts, k)
    overrides = {} if lanes is None else {"lanes": lanes}
    params = sparse_params_for(gates, **overrides)
    run = run_sparse_index(gates, params=params, sim=sim, stall=stall, seed=seed)
    problems = score_sparse_index(run, gates)
    return {"unit": "sparse_index", "tokens": tokens, "experts": experts, "k": k,
            "lanes": params.lanes, "nonzeros": run.nonzeros, "sim": sim, "stall": stall,
            "ideal_cycles": run.ideal_cycles, "cycles": run.cycles,
            "formula_cycles": run.formula_cycles,
            "efficiency": run.ideal_cycles / run.cycles if run.cycles else float("nan"),
            "single_pass_cycles": run.single_pass_cycles,
            "efficiency_vs_single_pass": run.single_pass_cycles / run.cycles
            if run.cycles else float("nan"),
            "output_bound": run.nonzeros, "passed": not problems, "problems": problems}


def _run(inputs, params, runtime, *, sim, stall, seed, check, progress):
    (gates,) = need(inputs, "sparse_index", ("gates",))
    params = sparse_params_for(gates, **params)
    run = run_sparse_index(gates, params=params, sim=sim, stall=stall, seed=seed,
                           progress=progress)
    outputs = {"batch_index": run.batch_index, "part_sizes": run.part_sizes,
               "nonzero_gates": run.nonzero_gates, "cycles": np.int64(run.cycles)}
    shape = np.shape(gates)
    eff = run.ideal_cycles / run.cycles if run.cycles else 0.0
    report = [f"sparse_index: S={shape[0]}, E={shape[1]}, {run.nonzeros} nonzeros, "
              f"lanes={params.lanes}, {params.format}",
              f"cycles: {run.cycles} (three-pass ideal {run.ideal_cycles}, efficiency "
              f"{eff:.4f}; one read of the matrix would be {run.single_pass_cycles})"]
    if check:
        problems = score_sparse_index(run, gates)
        if problems:
            raise AssertionError("hardware differs from golden.sparse_dispatch_indices:\n  " +
                                 "\n  ".join(problems))
        report.append(f"check: bit-exact against golden.sparse_dispatch_indices "
                      f"({run.nonzeros} slots, {shape[1]} part sizes); write log in order, "
                      "every slot once, no out-of-bounds write")
    return outputs, report


UNITS = [Unit(
    "sparse_index", "DUET SparseDispatcher indices: stable counting sort of the gate matrix's "
    "nonzeros by expert (count, prefix-sum, place passes; SPEC 1.3)", SparseIndexParams,
    SparseIndexUnit, _run, inputs=("gates",),
    outputs=("batch_index", "part_sizes", "nonzero_gates"))]
