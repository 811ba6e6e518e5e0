"""The expert-parallel path (SPEC 1.8, "across devices"): ``golden.ep_dispatch`` against a
plain-loop reference written here and against a worked example, its bad inputs, and the
``ep_layer`` composition on the emitted Verilog of locations, dispatch and moe_re_routing
(Verilator's fast path, with and without random valid/ready stalls), bit for bit against
``golden.ep_dispatch``. One set of unit parameters serves both hardware runs (three model
builds)."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from moe_hw import golden
from moe_hw.golden.testing import bit_equal, random_floats
from moe_hw.host.checks import HostError
from moe_hw.host.ep_layer import COMPOSITION, PHASES
from moe_hw.run import run_unit
from moe_hw.units.dispatch import DispatchParams
from moe_hw.units.locations import LocationsParams
from moe_hw.units.moe_re_routing import MoeReRoutingParams

from conftest import SIM, simulator_params

BF16 = ml_dtypes.bfloat16
KEYS = ("locations", "dispatch", "dropped", "expert_token_num_per_rank", "received_per_rank",
        "received_tokens", "permute_tokens", "permute_token_idx", "expert_token_num")


def reference(gates, indices, input, *, num_experts, capacity, expert_token_num_type=1,
              idx_type=0):
    """The path as plain loops: one counter per (rank, expert), one product per element,
    the exchange and the re-routing token by token."""
    ranks, top_k, tokens = indices.shape
    hidden, local = input.shape[2], num_experts // ranks
    counter = np.zeros((ranks, num_experts), np.int64)
    locations = np.full(indices.shape, -1, np.int32)
    dispatch = np.zeros((ranks, num_experts * capacity, hidden), input.dtype)
    dropped = np.zeros(ranks, np.int64)
    for r in range(ranks):
        for k in range(top_k):                 # k-major
            for i in range(tokens):
                e = int(indices[r, k, i])
                if not 0 <= e < num_experts:
                    dropped[r] += 1
                    continue
                slot = int(counter[r, e])
                counter[r, e] += 1
                locations[r, k, i] = slot
                if slot >= capacity:
                    dropped[r] += 1
                    continue
                for j in range(hidden):        # the exact product, rounded once
                    dispatch[r, e * capacity + slot, j] = np.asarray(
                        float(gates[r, k, i]) * float(input[r, i, j])).astype(input.dtype)
    matrices = np.zeros((ranks, ranks, local), np.int64)
    received = [[] for _ in range(ranks)]
    for q in range(ranks):                     # receiving rank
        for r in range(ranks):                 # sending rank
            for l in range(local):
                e = q * local + l
                matrices[q, r, l] = min(counter[r, e], capacity)
                for slot in range(matrices[q, r, l]):
                    received[q].append(dispatch[r, e * capacity + slot])
    permuted, idx, expert_num = [], [], np.zeros((ranks, local), np.int64)
    for q in range(ranks):
        start = {}                             # block (r, l) -> its first row
        row = 0
        for r in range(ranks):
            for l in range(local):
                start[r, l] = row
                row += matrices[q, r, l]
        rank_idx = [0] * row
        dst = 0
        for l in range(local):
            for r in range(ranks):
                for t in range(matrices[q, r, l]):
                    src = start[r, l] + t
                    permuted.append(received[q][src])
                    if idx_type == 0:
                        rank_idx[dst] = src
                    else:
                        rank_idx[src] = dst
                    dst += 1
            expert_num[q, l] = matrices[q, :, l].sum()
            if expert_token_num_type == 0 and l:
                expert_num[q, l] += expert_num[q, l - 1]
        idx += rank_idx
    flat = [row for rows in received for row in rows]

    def rows(values):
        return np.array(values, input.dtype).reshape(len(values), hidden)

    return {"locations": locations, "dispatch": dispatch, "dropped": dropped,
            "expert_token_num_per_rank": matrices,
            "received_per_rank": np.array([len(rows) for rows in received], np.int64),
            "received_tokens": rows(flat), "permute_tokens": rows(permuted),
            "permute_token_idx": np.array(idx, np.int32), "expert_token_num": expert_num}


def assert_same(got, want):
    assert set(got) >= set(want)
    for key in want:
        assert bit_equal(got[key], want[key]), key


def routing(rng, ranks, tokens, top_k, num_experts, *, allowed=None, dtype=BF16, hidden=5):
    """gates, indices [N, k, S] (k distinct experts per token among ``allowed[r]``, default
    all), input [N, S, H]: normal values (the reference's products are exact in float64)."""
    indices = np.zeros((ranks, top_k, tokens), np.int64)
    for r in range(ranks):
        choices = np.arange(num_experts) if allowed is None else np.asarray(allowed[r])
        for i in range(tokens):
            indices[r, :, i] = rng.permutation(choices)[:top_k]
    gates = random_floats(rng, indices.shape, dtype, specials=0.0)
    input = random_floats(rng, (ranks, tokens, hidden), dtype, specials=0.0)
    return gates, indices, input


# ---- the golden model -----------------------------------------------------------------------

def test_worked_example():
    """N = 2 ranks, E = 4 (rank 0 holds experts 0, 1; rank 1 experts 2, 3), k = 1, C = 2.
    Rank 0's tokens 1, 2, 3, 4 choose experts 3, 2, 0, 1; rank 1's tokens 5, 6, 7, 8
    choose 2, 3, 2, 2 (token 8 is expert 2's third pair: dropped). Rank 1 sends rank 0
    nothing; rank 0 receives [3 | 4] from itself. Rank 1 receives, rank-major, [2 | 1] from
    rank 0 and [5, 7 | 6] from rank 1, and re-routes them expert-major to [2, 5, 7 | 1, 6]:
    gather indices [0, 2, 3, 1, 4], scatter indices [0, 3, 1, 2, 4]."""
    gates = np.ones((2, 1, 4), np.float32)
    indices = np.array([[[3, 2, 0, 1]], [[2, 3, 2, 2]]])
    input = np.arange(1, 9, dtype=np.float32).reshape(2, 4, 1)
    out = golden.ep_dispatch(gates, indices, input, num_experts=4, capacity=2)
    assert out["locations"].tolist() == [[[0, 0, 0, 0]], [[0, 0, 1, 2]]]
    assert out["dropped"].tolist() == [0, 1]
    assert out["dispatch"][:, :, 0].tolist() == [[3, 0, 4, 0, 2, 0, 1, 0],
                                                 [0, 0, 0, 0, 5, 7, 6, 0]]
    assert out["expert_token_num_per_rank"].tolist() == [[[1, 1], [0, 0]],
                                                         [[1, 1], [2, 1]]]
    assert out["received_per_rank"].tolist() == [2, 5]
    assert out["received_tokens"][:, 0].tolist() == [3, 4, 2, 1, 5, 7, 6]
    assert out["permute_tokens"][:, 0].tolist() == [3, 4, 2, 5, 7, 1, 6]
    assert out["permute_token_idx"].tolist() == [0, 1, 0, 2, 3, 1, 4]
    assert out["expert_token_num"].tolist() == [[1, 1], [3, 2]]
    other = golden.ep_dispatch(gates, indices, input, num_experts=4, capacity=2,
                               expert_token_num_type=0, idx_type=1)
    assert other["permute_token_idx"].tolist() == [0, 1, 0, 3, 1, 2, 4]
    assert other["expert_token_num"].tolist() == [[1, 2], [3, 5]]
    assert_same(out, reference(gates, indices, input, num_experts=4, capacity=2))
    assert_same(other, reference(gates, indices, input, num_experts=4, capacity=2,
                                 expert_token_num_type=0, idx_type=1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("ranks, experts, top_k, tokens, capacity", [
    (4, 8, 2, 16, 5),       # the issue's N, E, k; capacity drops pairs
    (1, 3, 2, 7, 8),        # one rank: the all-to-all is the identity
    (3, 6, 3, 10, 2),       # k = 3, heavy dropping
    (2, 8, 1, 9, 100),      # nothing dropped
    (8, 8, 2, 6, 1),        # one expert per rank, one slot per expert
])
@pytest.mark.parametrize("modes", [(1, 0), (0, 1)])
def test_matches_plain_loops(dtype, ranks, experts, top_k, tokens, capacity, modes):
    rng = np.random.default_rng(ranks * 100 + experts * 10 + top_k)
    gates, indices, input = routing(rng, ranks, tokens, top_k, experts, dtype=dtype)
    kwargs = {"num_experts": experts, "capacity": capacity,
              "expert_token_num_type": modes[0], "idx_type": modes[1]}
    out = golden.ep_dispatch(gates, indices, input, **kwargs)
    assert_same(out, reference(gates, indices, input, **kwargs))
    assert out["dispatch"].dtype == dtype and out["permute_tokens"].dtype == dtype
    assert out["received_per_rank"].sum() == len(out["received_tokens"])
    # Every pair is either sent once or dropped.
    assert out["received_per_rank"].sum() + out["dropped"].sum() == ranks * top_k * tokens


def test_rank_sends_nothing_to_some_ranks():
    """Rank 2 routes only to rank 0's experts and rank 3 only to rank 1's: their blocks in
    the other ranks' count matrices are zero, and what they send still arrives in order."""
    rng = np.random.default_rng(7)
    allowed = [range(8), range(8), [0, 1], [2, 3]]
    gates, indices, input = routing(rng, 4, 12, 2, 8, allowed=allowed)
    out = golden.ep_dispatch(gates, indices, input, num_experts=8, capacity=6)
    assert_same(out, reference(gates, indices, input, num_experts=8, capacity=6))
    counts = out["expert_token_num_per_rank"]          # [q, r, l]
    assert counts[1:, 2].sum() == 0 and counts[0, 2].sum() == 12   # 24 pairs, 2 x 6 slots
    assert counts[[0, 2, 3], 3].sum() == 0 and counts[1, 3].sum() == 12
    assert out["dropped"][2] == out["dropped"][3] == 12


def test_rank_receives_nothing():
    """Every rank routes to rank 0's experts only: ranks 1-3 receive A = 0 tokens and
    report zero counts; rank 0 receives everything that fits."""
    rng = np.random.default_rng(8)
    gates, indices, input = routing(rng, 4, 5, 2, 8, allowed=[[0, 1]] * 4)
    for num_type in (0, 1):
        out = golden.ep_dispatch(gates, indices, input, num_experts=8, capacity=4,
                                 expert_token_num_type=num_type)
        assert_same(out, reference(gates, indices, input, num_experts=8, capacity=4,
                                   expert_token_num_type=num_type))
        assert out["received_per_rank"].tolist() == [32, 0, 0, 0]
        assert out["expert_token_num"][1:].tolist() == [[0, 0]] * 3


def test_capacity_drops_and_zero_capacity():
    """n(r, e) = min(count, C): only the filled slots are sent; C = 0 sends nothing."""
    rng = np.random.default_rng(9)
    gates, indices, input = routing(rng, 2, 20, 2, 4)
    out = golden.ep_dispatch(gates, indices, input, num_experts=4, capacity=3)
    counts = np.stack([golden.expert_counts(indices[r], 4) for r in range(2)])
    assert (counts > 3).any()
    sent = out["expert_token_num_per_rank"].transpose(1, 0, 2).reshape(2, 4)   # [r, e]
    assert np.array_equal(sent, np.minimum(counts, 3))
    assert out["dropped"].tolist() == (counts - np.minimum(counts, 3)).sum(axis=1).tolist()
    none = golden.ep_dispatch(gates, indices, input, num_experts=4, capacity=0)
    assert_same(none, reference(gates, indices, input, num_experts=4, capacity=0))
    assert none["dispatch"].shape == (2, 0, 5) and none["received_tokens"].shape == (0, 5)
    assert none["dropped"].tolist() == [40, 40]


def test_out_of_range_indices_are_not_routed():
    gates, indices, input = routing(np.random.default_rng(10), 2, 6, 2, 4)
    indices[0, 1, :3] = [-1, 4, 1 << 40]
    out = golden.ep_dispatch(gates, indices, input, num_experts=4, capacity=8)
    assert_same(out, reference(gates, indices, input, num_experts=4, capacity=8))
    assert out["locations"][0, 1, :3].tolist() == [-1, -1, -1]
    assert out["dropped"].tolist() == [3, 0]


def test_bad_inputs():
    gates, indices, input = routing(np.random.default_rng(11), 4, 3, 2, 8)
    with pytest.raises(ValueError, match=r"num_experts must be a multiple of the number of "
                                         r"ranks N = 4 .*not 6"):
        golden.ep_dispatch(gates, indices, input, num_experts=6, capacity=2)
    with pytest.raises(ValueError, match=r"input must have shape \(4, 3, H\)"):
        golden.ep_dispatch(gates, indices, input[:3], num_experts=8, capacity=2)
    with pytest.raises(ValueError, match="gates has shape"):
        golden.ep_dispatch(gates[:, :1], indices, input, num_experts=8, capacity=2)
    with pytest.raises(ValueError, match="indices must have 3 dimension"):
        golden.ep_dispatch(gates[0], indices[0], input, num_experts=8, capacity=2)
    with pytest.raises(TypeError, match="gates has dtype float32, but input has bfloat16"):
        golden.ep_dispatch(gates.astype(np.float32), indices, input, num_experts=8,
                           capacity=2)
    with pytest.raises(ValueError, match="H >= 1"):
        golden.ep_dispatch(gates, indices, input[:, :, :0], num_experts=8, capacity=2)
    with pytest.raises(ValueError, match="capacity must be a non-negative integer, not -1"):
        golden.ep_dispatch(gates, indices, input, num_experts=8, capacity=-1)
    with pytest.raises(ValueError, match="idx_type must be one of 0, 1, not 2"):
        golden.ep_dispatch(gates, indices, input, num_experts=8, capacity=2, idx_type=2)


# ---- the composition's host side (no simulation) --------------------------------------------

def test_host_refuses_bad_problems():
    gates, indices, input = routing(np.random.default_rng(12), 4, 3, 2, 8)
    inputs = {"gates": gates, "indices": indices, "input": input}
    with pytest.raises(HostError, match="num_experts must be a multiple .* not 6"):
        COMPOSITION.run(inputs, {"num_experts": 6})
    with pytest.raises(HostError, match="ep_layer runs float16 or bfloat16"):
        COMPOSITION.run({name: value.astype(np.float32) if name != "indices" else value
                         for name, value in inputs.items()}, {"num_experts": 8})
    with pytest.raises(HostError, match="num_experts is missing"):
        COMPOSITION.run(inputs, {})
    with pytest.raises(HostError, match="lacks input"):
        COMPOSITION.run({"gates": gates, "indices": indices}, {"num_experts": 8})
    with pytest.raises(HostError, match="no parameter or run-time value 'tokens'"):
        COMPOSITION.run(inputs, {"num_experts": 8, "tokens": 3})
    with pytest.raises(HostError, match="no unit 'combine'"):
        COMPOSITION.run(inputs, {"num_experts": 8, "combine.lanes": 4})
    with pytest.raises(HostError, match="idx_type must be 0 or 1, not 3"):
        COMPOSITION.run(inputs, {"num_experts": 8, "idx_type": 3})
    with pytest.raises(HostError, match="max_pairs >= 6"):
        COMPOSITION.run(inputs, {"num_experts": 8, "dispatch.max_pairs": 4})


def test_settings_reach_the_units():
    gates, indices, input = routing(np.random.default_rng(13), 4, 10, 2, 8, hidden=7)
    prob = COMPOSITION.problem({"gates": gates, "indices": indices, "input": input},
                               {"num_experts": 8})
    capacity = prob["capacity"]
    assert capacity == golden.capacity_from_factor(1.25, 10, 8, 2) == 4
    per_unit, runtime = COMPOSITION.split_settings({"lanes": 8, "moe_re_routing.lanes": 2,
                                                    "capacity": 3})
    assert runtime == {"capacity": 3}
    params = COMPOSITION.params_for(prob, per_unit)
    assert params["dispatch"].lanes == 8 and params["moe_re_routing"].lanes == 2
    assert params["dispatch"].format == params["moe_re_routing"].format == "bf16"
    assert params["locations"].max_pairs == params["dispatch"].max_pairs == 20
    # At most min(N * E_local * C, N * k * S) tokens in N * E_local blocks reach a rank.
    assert params["moe_re_routing"].max_tokens == min(4 * 2 * capacity, 4 * 20) == 32
    assert params["moe_re_routing"].max_blocks == 8
    assert (params["moe_re_routing"].max_ranks, params["moe_re_routing"].max_experts) == (4, 2)


def test_random_problem_is_the_issue_point():
    inputs, settings = COMPOSITION.random_inputs({"seed_unused": 1}, seed=3)
    assert settings == {"seed_unused": 1, "num_experts": 8}
    assert inputs["indices"].shape == inputs["gates"].shape == (4, 2, 64)
    assert inputs["input"].shape == (4, 64, 256) and inputs["input"].dtype == BF16
    # k distinct experts per token.
    assert (inputs["indices"][:, 0] != inputs["indices"][:, 1]).all()
    small, rest = COMPOSITION.random_inputs({"num_ranks": 2, "tokens": 3, "hidden": 4,
                                             "format": "fp16", "capacity": 1}, seed=3)
    assert small["input"].shape == (2, 3, 4) and small["input"].dtype == np.float16
    assert rest == {"capacity": 1, "num_experts": 8}
    with pytest.raises(ValueError, match="format must be fp16 or bf16, not 'fp32'"):
        COMPOSITION.random_inputs({"format": "fp32"})


def test_score_finds_a_wrong_bit():
    gates, indices, input = routing(np.random.default_rng(14), 2, 6, 2, 4)
    prob = COMPOSITION.problem({"gates": gates, "indices": indices, "input": input},
                               {"num_experts": 4, "capacity": 3})
    outputs = COMPOSITION.expected(prob)
    assert COMPOSITION.score(prob, outputs) == []
    outputs["permute_tokens"].view(np.uint16)[3, 1] ^= 1
    outputs["expert_token_num_per_rank"][1, 0, 1] += 1
    findings = COMPOSITION.score(prob, outputs)
    assert len(findings) == 2
    assert {finding.split(":")[0] for finding in findings} == {"expert_token_num_per_rank",
                                                               "permute_tokens"}


# ---- the composition on the hardware --------------------------------------------------------

# One build of each unit for both runs (bf16, N <= 4, E <= 8, k*S <= 24, C <= 4, H <= 16).
PARAMS = {
    "locations": LocationsParams(max_pairs=24, max_experts=8, max_capacity=4),
    "dispatch": DispatchParams(format="bf16", lanes=4, max_pairs=24, max_hidden=16,
                               max_capacity=4, max_experts=8),
    "moe_re_routing": MoeReRoutingParams(format="bf16", lanes=4, max_tokens=64, max_hidden=16,
                                         max_ranks=4, max_experts=2, max_blocks=8,
                                         count_type="int32", scales=False),
}


def hardware_run(inputs, settings, *, sim, stall=0.0, seed=0):
    outcome = COMPOSITION.run(inputs, settings, params=PARAMS, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    out = outcome.outputs
    assert_same(out, golden.ep_dispatch(
        inputs["gates"], inputs["indices"], inputs["input"],
        **{name: settings[name] for name in ("num_experts", "capacity")},
        **{name: settings.get(name, default) for name, default in
           (("expert_token_num_type", 1), ("idx_type", 0))}))
    assert out["phase_cycles"].shape == (len(inputs["indices"]), len(PHASES))
    assert out["cycles"] == out["phase_cycles"].max(axis=0).sum()
    return outcome


@pytest.mark.parametrize("sim", simulator_params(SIM))
def test_ep_layer_stall_free(sim):
    """N = 4, E = 8, k = 2 (the issue's shape, small): capacity drops, H not a multiple of
    the lanes, NaN / Inf / subnormal values; rank 3 sends nothing to ranks 0 and 1. Every
    unit run takes exactly its formula's cycles."""
    rng = np.random.default_rng(20)
    gates, indices, input = routing(rng, 4, 10, 2, 8, hidden=13,
                                    allowed=[range(8), range(8), range(8), range(4, 8)])
    input = random_floats(rng, input.shape, BF16, specials=0.2)
    settings = {"num_experts": 8, "capacity": 4}
    outcome = hardware_run({"gates": gates, "indices": indices, "input": input}, settings,
                           sim=sim)
    out = outcome.outputs
    assert out["dropped"].sum() > 0
    assert out["expert_token_num_per_rank"][:2, 3].sum() == 0
    assert outcome.cycles == outcome.expected_cycles
    for r, runs in enumerate(outcome.results["runs"]):
        for unit in PHASES:
            assert runs[unit].cycles == runs[unit].expected_cycles == \
                out["phase_cycles"][r, PHASES.index(unit)]


@pytest.mark.parametrize("sim", simulator_params(SIM))
def test_ep_layer_with_stalls(sim):
    """Random valid/ready pauses on every stream of every unit; scatter indices and cumsum
    counts; N = 2 with every pair routed to rank 0's experts (rank 1 receives A = 0)."""
    rng = np.random.default_rng(21)
    gates, indices, input = routing(rng, 2, 12, 2, 4, hidden=9, allowed=[[0, 1], [0, 1]])
    settings = {"num_experts": 4, "capacity": 4, "idx_type": 1, "expert_token_num_type": 0}
    outcome = hardware_run({"gates": gates, "indices": indices, "input": input}, settings,
                           sim=sim, stall=0.3, seed=5)
    assert outcome.outputs["received_per_rank"].tolist() == [16, 0]
    assert outcome.cycles > outcome.expected_cycles      # the pauses cost cycles


def test_run_unit_finds_the_composition():
    """``moe_hw.run`` resolves ep_layer (here refused before anything is built)."""
    gates, indices, input = routing(np.random.default_rng(15), 4, 3, 2, 8)
    with pytest.raises(HostError, match="num_experts must be a multiple .* not 10"):
        run_unit("ep_layer", {"gates": gates, "indices": indices, "input": input},
                 {"num_experts": 10})


def test_run_command_errors_are_one_line():
    result = subprocess.run([sys.executable, "-m", "moe_hw.run", "ep_layer", "--set",
                             "num_experts=6"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "python -m moe_hw.run: error: num_experts must be a multiple of the number of ranks "
        "N = 4 (the experts are split evenly over the ranks), not 6")
