"""The re-routing unit's declaration and host adapter (SPEC 1.5, Ascend ``MoeReRouting``): a
user's tokens and count matrix in, the permuted tokens, scales and indices and the per-expert
counts out, scored bit for bit against ``golden.moe_re_routing`` with scoreboards over every
token write, every read and every per-token write.

npz inputs: ``tokens`` [A, H] (int8, float16 or bfloat16), ``expert_token_num_per_rank``
[N, E] (int32 or int64; uint32 / uint64 too), optionally ``per_token_scales`` [A] float32;
run-time ``expert_token_num_type`` (default 1), ``idx_type`` (default 0) and
``memory_latency``. Outputs: ``permute_tokens``, ``permute_per_token_scales`` (when scales
were given), ``permute_token_idx``, ``expert_token_num``.
"""

import ml_dtypes
import numpy as np

from .. import golden
from ..blocks.row_reader import last_enable, row_beats
from ..flows.fastsim import FastBench, MemoryReader, MemoryWriter, Sink, Source
from ..golden.rerouting import check_re_routing_inputs
from ..units.moe_re_routing import COUNT_TYPES, MoeReRoutingParams, MoeReRoutingUnit
from .checks import (HostError, check_maxima, compare_log, compare_values, memory_latency,
                     need, runtime_int)
from .unit import AXI_READ_PARAMS, Unit

__all__ = ["UNIT", "MoeReRouting", "TOKEN_DTYPES", "stimulus", "simulate_raw",
           "random_counts"]

#: Token dtypes by format name.
TOKEN_DTYPES = {"int8": np.dtype(np.int8), "fp16": np.dtype(np.float16),
                "bf16": np.dtype(ml_dtypes.bfloat16)}
_UINT = {8: np.uint8, 16: np.uint16}


def format_of_tokens(tokens):
    for name, dtype in TOKEN_DTYPES.items():
        if tokens.dtype == dtype:
            return name
    raise HostError(f"tokens must have dtype int8, float16 or bfloat16, not {tokens.dtype}")


def token_bits(tokens, params):
    """The tokens' bit patterns as unsigned integers of the element width."""
    return np.ascontiguousarray(tokens).view(_UINT[params.element_width])


class MoeReRouting(Unit):
    name = "moe_re_routing"
    summary = ("Ascend MoeReRouting: rank-major tokens after all-to-all to expert-major, with "
               "scales and gather/scatter indices; counter bank + prefix sum, then a block "
               "mover at one beat per cycle (SPEC 1.5)")
    golden = "golden.moe_re_routing"
    params = MoeReRoutingParams
    inputs = ("tokens", "expert_token_num_per_rank", "per_token_scales")
    outputs = ("permute_tokens", "permute_per_token_scales", "permute_token_idx",
               "expert_token_num")
    runtime = ("expert_token_num_type", "idx_type", "memory_latency")
    ideal = "one beat per cycle: A*ceil(H/lanes)"
    axi_names = {"read": "tokens", "write": "permute_tokens"}
    axi_params = AXI_READ_PARAMS

    def build(self, params):
        return MoeReRoutingUnit(params)

    def problem(self, inputs, runtime):
        tokens, counts = need(inputs, self.name, self.inputs[:2])
        counts = np.asarray(counts)
        if counts.dtype.name not in COUNT_TYPES:
            raise HostError(f"expert_token_num_per_rank must have dtype int32, int64, uint32 "
                            f"or uint64, not {counts.dtype}")
        scales = inputs.get("per_token_scales")
        try:        # the golden model's checks: shapes, and counts summing to A
            tokens, _, scales = check_re_routing_inputs(tokens, counts, scales)
        except (TypeError, ValueError) as error:
            raise HostError(str(error)) from None
        format_of_tokens(tokens)
        num_tokens, hidden = tokens.shape
        if scales is not None and scales.dtype != np.float32:
            raise HostError(f"per_token_scales must have dtype float32, not {scales.dtype}")
        values = {}
        for name, default in (("expert_token_num_type", 1), ("idx_type", 0)):
            values[name] = runtime_int(name, runtime, inputs, default=default)
            if values[name] not in (0, 1):
                raise HostError(f"{name} must be 0 or 1, not {values[name]}")
        return {"tokens": tokens, "expert_token_num_per_rank": counts,
                "per_token_scales": scales, **values, "num_tokens": num_tokens,
                "hidden": hidden, "num_ranks": counts.shape[0], "num_experts": counts.shape[1],
                "memory_latency": memory_latency(runtime, inputs)}

    def params_for(self, problem, settings):
        """Sized to the problem; ``lanes`` 16, ``scales`` when scales were given."""
        settings = {"format": format_of_tokens(problem["tokens"]),
                    "count_type": problem["expert_token_num_per_rank"].dtype.name,
                    "scales": problem["per_token_scales"] is not None, **settings}
        blocks = int(np.count_nonzero(problem["expert_token_num_per_rank"]))
        params = self.sized(settings, max_tokens=max(1, problem["num_tokens"]),
                            max_hidden=max(1, problem["hidden"]),
                            max_ranks=max(1, problem["num_ranks"]),
                            max_experts=max(1, problem["num_experts"]),
                            max_blocks=max(1, blocks))
        self.fits(problem, params)
        return params

    def fits(self, problem, params):
        fmt = format_of_tokens(problem["tokens"])
        if fmt != params.format:
            raise HostError(f"tokens has dtype {problem['tokens'].dtype}, but the unit's "
                            f"format is {params.format}")
        count_type = problem["expert_token_num_per_rank"].dtype.name
        if count_type != params.count_type:
            raise HostError(f"expert_token_num_per_rank has dtype {count_type}, but the unit's "
                            f"count_type is {params.count_type}")
        if problem["per_token_scales"] is not None and not params.scales:
            raise HostError("per_token_scales were given, but the unit was built with "
                            "scales=False")
        check_maxima(params, tokens=(problem["num_tokens"], "max_tokens"),
                     hidden=(problem["hidden"], "max_hidden"),
                     num_ranks=(problem["num_ranks"], "max_ranks"),
                     num_experts=(problem["num_experts"], "max_experts"))
        counts = problem["expert_token_num_per_rank"]
        nonempty = np.argwhere(counts != 0)
        if len(nonempty) > params.max_blocks:
            r, e = nonempty[params.max_blocks]
            raise HostError(f"expert_token_num_per_rank has {len(nonempty)} non-empty blocks, "
                            f"above the unit's max_blocks of {params.max_blocks} (the first "
                            f"past it: rank {r}, expert {e})")

    def pack(self, problem, params, *, stall, seed):
        self.fits(problem, params)
        return stimulus(problem, params)

    def fast(self, stimulus, settings):
        """sim/bench_moe_re_routing.py on the fast path: the same streams and results."""
        runtime, beats = settings["runtime"], settings["expected_beats"]
        tokens, scales = runtime["tokens"], settings["scales"]
        streams = {
            "counts": Source({"count": stimulus["counts"]}),
            "read_request": MemoryReader("read_response", stimulus["memory"],
                                         settings["memory_latency"], requests=2 * beats + 16),
            # Every token moves to its own output row: each element written once.
            "write": MemoryWriter(size=settings["out_elements"], depth=2 * beats + 16),
            "row_write": Sink(depth=2 * tokens + 16),
            "expert_token_num": Sink(depth=2 * runtime["num_experts"] + 16)}
        if scales:
            streams["scales"] = Source({"scale": stimulus["scales"]})
        fields = {name: f"row_write.{name}" for name in ("row", "idx_addr", "idx")}
        return FastBench(
            streams=streams, sizes=runtime,
            results={"memory": "write.memory", "write_addr": "write.addr",
                     "write_enable": "write.enable", "write_data": "write.data",
                     "write_out_of_bounds": "write.out_of_bounds",
                     "request_addr": "read_request.addr",
                     "request_enable": "read_request.enable",
                     "read_out_of_bounds": "read_request.out_of_bounds",
                     "expert_token_num": "expert_token_num.value",
                     "counts_taken": "counts.sent",
                     "scales_taken": "scales.sent" if scales else np.int64(0),
                     "error": "error", "busy_after": "busy", **fields,
                     "scale": "row_write.scale" if scales else
                     (lambda get: np.zeros(len(get("row_write.row")), np.int64))},
            limit=40 * (len(stimulus["counts"]) + runtime["num_experts"] + beats + tokens)
            + 2000, what="moe_re_routing")

    def unpack(self, problem, params, results):
        num_tokens, hidden = problem["num_tokens"], problem["hidden"]
        bits = results["memory"].astype(_UINT[params.element_width])
        permuted = bits.view(problem["tokens"].dtype).reshape(num_tokens, hidden)
        idx = np.zeros(num_tokens, np.int32)
        scales = np.zeros(num_tokens, np.uint32)
        rows, idx_addr = results["row"], results["idx_addr"]
        inside = (idx_addr >= 0) & (idx_addr < num_tokens)
        idx[idx_addr[inside]] = results["idx"][inside]
        inside = (rows >= 0) & (rows < num_tokens)
        scales[rows[inside]] = results["scale"][inside]
        outputs = {"permute_tokens": permuted, "permute_token_idx": idx,
                   "expert_token_num": results["expert_token_num"].astype(np.int64)}
        if problem["per_token_scales"] is not None:
            outputs["permute_per_token_scales"] = scales.view(np.float32)
        return outputs

    def expected(self, problem):
        return golden.moe_re_routing(
            problem["tokens"], problem["expert_token_num_per_rank"],
            per_token_scales=problem["per_token_scales"],
            expert_token_num_type=problem["expert_token_num_type"],
            idx_type=problem["idx_type"])

    def output_findings(self, problem, params, outputs):
        """The four outputs against the golden model's, bit for bit."""
        permuted, scales, idx, expert_num = self.expected(problem)
        findings = compare_values("permute_tokens (bits)",
                                  token_bits(outputs["permute_tokens"], params),
                                  token_bits(permuted, params))
        findings += compare_values("permute_token_idx", outputs["permute_token_idx"], idx)
        findings += compare_values("expert_token_num", outputs["expert_token_num"], expert_num)
        if scales is not None:
            findings += compare_values("permute_per_token_scales (bits)",
                                       outputs["permute_per_token_scales"].view(np.uint32),
                                       scales.view(np.uint32))
        return findings

    def score(self, problem, params, outputs, results):
        """The four outputs bit for bit; the write, read and per-token logs in source order
        (nothing lost, duplicated, reordered or out of bounds); every count taken; no
        error."""
        findings = self.output_findings(problem, params, outputs)
        want = expected_logs(problem, params)
        findings += compare_log("write log", {name: results[f"write_{name}"]
                                              for name in ("addr", "enable", "data")},
                                want["write"])
        findings += compare_log("read log", {"addr": results["request_addr"],
                                             "enable": results["request_enable"]},
                                want["read"])
        got_rows = {"row": results["row"], "idx_addr": results["idx_addr"],
                    "idx": results["idx"]}
        if params.scales:
            got_rows["scale"] = results["scale"]
        findings += compare_log("per-token log", got_rows,
                                {name: want["row"][name] for name in got_rows})
        for what in ("write_out_of_bounds", "read_out_of_bounds"):
            if int(results[what]):
                findings.append(f"{int(results[what])} lanes {what.replace('_', ' ')}")
        for what, got, want_value in (
                ("counts taken", results["counts_taken"], count_beats(problem)),
                ("error", results["error"], 0)):
            findings += compare_values(what, [int(got)], [int(want_value)])
        return findings

    def ideal_cycles(self, problem, params):
        if not problem["hidden"]:
            return 0
        return problem["num_tokens"] * row_beats(problem["hidden"], params.lanes)

    def cycles(self, problem, params):
        return params.cycles(problem["num_tokens"], problem["hidden"], problem["num_ranks"],
                             problem["num_experts"], problem["memory_latency"])

    def describe(self, problem, params):
        scales = "with" if problem["per_token_scales"] is not None else "without"
        return (f"moe_re_routing: A={problem['num_tokens']}, H={problem['hidden']}, "
                f"N={problem['num_ranks']}, E={problem['num_experts']}, {params.format} "
                f"{scales} scales, lanes={params.lanes}, expert_token_num_type="
                f"{problem['expert_token_num_type']}, idx_type={problem['idx_type']}")

    def point_inputs(self, problem, seed=0):
        """Random tokens, counts and scales at the table's ``tokens`` (A), ``hidden``,
        ``num_ranks``, ``num_experts``, ``format`` (default bf16) and ``scales``."""
        needed = ("tokens", "hidden", "num_ranks", "num_experts")
        sizes, runtime = self.point_table(problem, (*needed, "format", "scales"), needed)
        inputs = random_problem(np.random.default_rng(seed), *(sizes[name] for name in needed),
                                sizes.get("format", "bf16"), scales=sizes.get("scales", False))
        return inputs, runtime

    def bench_problems(self, shape, seed=0):
        rng = np.random.default_rng(seed)
        fmt = shape.format if shape.format in TOKEN_DTYPES else "bf16"
        inputs = random_problem(rng, shape.tokens, shape.hidden, 16, shape.experts, fmt)
        return {"": (inputs, {"lanes": shape.lanes})}


def count_beats(problem):
    """The ``counts`` stream's beats: N*E."""
    return problem["num_ranks"] * problem["num_experts"]


def random_counts(rng, num_tokens, num_ranks, num_experts, *, zeros=0.0):
    """A random [N, E] int64 count matrix summing to ``num_tokens`` (a fraction ``zeros`` of
    the blocks forced empty when any block is left)."""
    blocks = num_ranks * num_experts
    if blocks == 0:
        return np.zeros((num_ranks, num_experts), np.int64)
    weights = rng.random(blocks) * (rng.random(blocks) >= zeros)
    if not weights.any():
        weights[rng.integers(blocks)] = 1.0
    counts = rng.multinomial(num_tokens, weights / weights.sum())
    return counts.reshape(num_ranks, num_experts).astype(np.int64)


def random_tokens(rng, shape, fmt):
    if fmt == "int8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    from ..golden.testing import random_floats
    return random_floats(rng, shape, TOKEN_DTYPES[fmt], specials=0.2)


def random_problem(rng, num_tokens, hidden, num_ranks, num_experts, fmt, *, scales=False,
                   zeros=0.3, count_dtype=np.int32):
    """Random npz inputs: tokens, a count matrix with empty blocks, optional scales."""
    inputs = {"tokens": random_tokens(rng, (num_tokens, hidden), fmt),
              "expert_token_num_per_rank": random_counts(rng, num_tokens, num_ranks,
                                                         num_experts, zeros=zeros)
              .astype(count_dtype)}
    if scales:
        from ..golden.testing import random_floats
        inputs["per_token_scales"] = random_floats(rng, num_tokens, np.float32)
    return inputs


def expected_logs(problem, params):
    """The scoreboards' expected logs, every one in source order: the token writes (one per
    beat: element address, lane enables, data), the reads (row ``src`` front to back) and the
    per-token writes (destination row, index address and value, scale bits)."""
    tokens, counts = problem["tokens"], problem["expert_token_num_per_rank"]
    num_tokens, hidden, lanes = problem["num_tokens"], problem["hidden"], params.lanes
    beats = row_beats(hidden, lanes) if hidden else 0
    totals = counts.sum(axis=0).astype(np.int64)
    base = np.concatenate([[0], np.cumsum(totals)[:-1]]).astype(np.int64) if totals.size \
        else np.zeros(0, np.int64)
    dst = np.zeros(num_tokens, np.int64)          # dst[src]
    src = 0
    for r, e in np.ndindex(counts.shape):
        n = int(counts[r, e])
        dst[src:src + n] = base[e] + np.arange(n)
        base[e] += n
        src += n
    full = (1 << lanes) - 1
    enables = np.full(beats, full, np.int64)
    if beats:
        enables[-1] = last_enable(hidden, lanes)
    padded = np.zeros((num_tokens, beats * lanes), np.uint64)
    padded[:, :hidden] = token_bits(tokens, params) if num_tokens else 0
    offsets = np.arange(beats, dtype=np.int64) * lanes
    write = {"addr": (dst[:, None] * hidden + offsets).reshape(-1),
             "enable": np.tile(enables, num_tokens),
             "data": padded.reshape(num_tokens * beats, lanes)}
    read = {"addr": (np.arange(num_tokens, dtype=np.int64)[:, None] * hidden +
                     offsets).reshape(-1),
            "enable": np.tile(enables, num_tokens)}
    srcs = np.arange(num_tokens, dtype=np.int64)
    scatter = problem["idx_type"] == 1
    scales = problem["per_token_scales"]
    row = {"row": dst, "idx_addr": srcs if scatter else dst, "idx": dst if scatter else srcs,
           "scale": np.zeros(num_tokens, np.int64) if scales is None
           else scales.view(np.uint32).astype(np.int64)}
    return {"write": write, "read": read, "row": row}


def stimulus(problem, params, *, counts=None, sizes=None):
    """The bench's ``(stimulus, settings)``. ``counts`` replaces the count matrix sent to the
    hardware (any values: how the error flag is tested); ``sizes`` overrides the run-time size
    ports."""
    tokens = problem["tokens"]
    counts = problem["expert_token_num_per_rank"] if counts is None else np.asarray(counts)
    mask = (1 << params.count_bits) - 1
    count_words = np.array([int(c) & mask for c in counts.reshape(-1).tolist()],
                           dtype=np.uint64)
    scales = problem["per_token_scales"]
    scale_words = (np.zeros(problem["num_tokens"], np.uint64) if scales is None
                   else scales.view(np.uint32).astype(np.uint64))
    runtime = {"tokens": problem["num_tokens"], "hidden": problem["hidden"],
               "num_ranks": counts.shape[0], "num_experts": counts.shape[1],
               "expert_token_num_type": problem["expert_token_num_type"],
               "idx_type": problem["idx_type"], **(sizes or {})}
    stim = {"counts": count_words, "memory": token_bits(tokens, params).reshape(-1)
            .astype(np.uint64), "scales": scale_words}
    beats = row_beats(problem["hidden"], params.lanes) if problem["hidden"] else 0
    return stim, {"lanes": params.lanes, "width": params.element_width,
                  "runtime": {k: int(v) for k, v in runtime.items()},
                  "scales": bool(params.scales), "memory_latency": problem["memory_latency"],
                  "out_elements": int(problem["num_tokens"] * problem["hidden"]),
                  "expected_beats": int(problem["num_tokens"] * beats)}


def simulate_raw(problem, params, *, counts=None, sizes=None, sim="verilator", stall=0.0,
                 seed=0):
    """Drive the unit with ``problem`` (from :meth:`MoeReRouting.problem`) and, as given, a
    hostile ``counts`` matrix or size ports: no checks. Returns the raw bench results."""
    stim, settings = stimulus(problem, params, counts=counts, sizes=sizes)
    return UNIT.simulate(params, stim, settings, sim=sim, stall=stall, seed=seed)


UNIT = MoeReRouting()


def run_axi(inputs, runtime, params, axi=None, *, sim="verilator", stall=0.0, seed=0,
            latency=20, bases=(0x3000, 0x9040), progress=None):
    """Run the npz ``inputs`` (``tokens``, ``expert_token_num_per_rank``, optionally
    ``per_token_scales``) with ``runtime`` (``expert_token_num_type``, ``idx_type``)
    through moe_re_routing behind its AXI wrapper, on the cocotbext-axi bench
    ``sim/bench_moe_re_routing_axi.py``: one ``AxiRam`` holds ``tokens`` at ``bases[0]``
    (read through ``m_axi_tokens``, data ``latency`` cycles after each burst's address) and
    ``permute_tokens`` at ``bases[1]`` (written through ``m_axi_permute_tokens``, answered
    ``latency`` cycles late), the counts and scales come in and the counts and the per-token
    writes go out on AXI4-Streams. Returns ``(outputs, results, findings)``: the golden
    model's outputs, the bench's results (``cycles`` from the start write to ``irq``), and
    what disagrees with ``golden.moe_re_routing`` (empty when all is well)."""
    from ..axi.streams import tdata_width
    from ..flows.emit import describe_shape
    from .axi_run import check_base, ram_size, simulate_axi, status_findings
    problem = UNIT.problem(inputs, runtime)
    UNIT.fits(problem, params)
    stim, settings = UNIT.pack(problem, params, stall=stall, seed=seed)
    elements = problem["num_tokens"] * problem["hidden"]
    buffer_bytes = elements * params.element_width // 8
    bus_bytes = params.lanes * params.element_width // 8
    for name, base in zip(("bases[0]", "bases[1]"), bases):
        check_base(name, base, bus_bytes)
    if abs(bases[1] - bases[0]) < buffer_bytes + bus_bytes:
        raise ValueError(f"bases {bases[0]:#x} and {bases[1]:#x} are closer than a buffer "
                         f"({buffer_bytes} bytes) and a bus word")
    settings.update(
        stall=stall, seed=seed, latency=latency, bases=list(bases), buffer_bytes=buffer_bytes,
        ram_size=ram_size(*(base + buffer_bytes for base in bases)),
        buses={port: f"m_axi_{UNIT.axi_names[port]}" for port in ("read", "write")},
        count_bytes=tdata_width(params.count_layout()) // 8,
        row_write_layout=describe_shape(params.row_write_layout()))
    results, _ = simulate_axi(UNIT, params, axi, stim, settings, sim=sim, progress=progress)
    outputs = UNIT.unpack(problem, params, results)
    findings = UNIT.output_findings(problem, params, outputs)
    counts = [int(results["counts_taken"]), int(results["scales_taken"])]
    want_counts = [count_beats(problem), problem["num_tokens"] if params.scales else 0]
    findings += compare_values("counts and scales taken", counts, want_counts)
    if not int(results["guard_ok"]):
        findings.append("bytes outside permute_tokens were written")
    if not int(results["reads_inside"]):
        findings.append("a read burst reaches outside tokens")
    findings += status_findings(results)
    return outputs, results, findings
