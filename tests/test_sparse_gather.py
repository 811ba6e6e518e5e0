"""The sparse gather unit (DUET ``SparseDispatcher.dispatch()``) on its emitted Verilog (every
case on Verilator's fast path; a few also through the cocotb bench in Verilator and Icarus),
with and without random valid/ready stalls on the header
stream, the read port's request and response streams and the output, scored bit for bit
against ``input[batch_index]`` (and ``golden.sparse_dispatch``) with scoreboards over every
output beat and every read; stall-free runs must take exactly the documented cycle count."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from moe_hw.blocks.block_fifo import BLOCK_FIFO_LATENCY
from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw import golden
from moe_hw.formats import to_bits
from moe_hw.golden.testing import random_floats
from moe_hw.host.checks import HostError
from moe_hw.host.checks import MEMORY_LATENCY
from moe_hw.host.sparse_gather import UNIT
from moe_hw.host.unit import run
from moe_hw.params import ParameterError, resolve_params
from moe_hw.units.sparse_gather import SparseGatherParams, SparseGatherUnit

from conftest import SIM, STALLS, simulator_cases, simulator_params

# One generous build serves every stream case.
PARAMS = SparseGatherParams(format="fp32", lanes=4, max_slots=128, max_tokens=64, max_hidden=64)


def gate_matrix(seed, tokens, experts, k, *, experts_used=None):
    """A softmax-like top-k gate matrix [S, E]: k nonzero gates per row, in the experts of
    ``experts_used`` only (the others get no tokens)."""
    rng = np.random.default_rng(seed)
    used = np.arange(experts) if experts_used is None else np.asarray(experts_used)
    gates = np.zeros((tokens, experts), dtype=np.float32)
    for i in range(tokens):
        gates[i, rng.choice(used, k, replace=False)] = rng.uniform(0.05, 1.0, k)
    return gates


def routed(gates, data):
    batch_index, _, _ = golden.sparse_dispatch_indices(gates)
    return dict(input=data, batch_index=batch_index, gates=gates)


def case(name):
    rng = np.random.default_rng(sorted(CASES).index(name))
    return CASES[name](rng)


CASES = {
    # DUET toy scale: S=21, E=6, k=1, input rows of shape (L=16, 1).
    "duet_toy": lambda rng: routed(gate_matrix(1, 21, 6, 1),
                                   rng.standard_normal((21, 16, 1)).astype(np.float32)),
    # The seed-000 worked example: batch_index [1, 3, 0, 2].
    "worked_example": lambda rng: routed(
        np.array([[0, 0, .7], [.9, 0, 0], [0, 0, .5], [0, .8, 0]], dtype=np.float32),
        rng.standard_normal((4, 5)).astype(np.float32)),
    # top-2, experts 1 and 4 get no tokens, H not a multiple of the lanes.
    "k2_empty_experts": lambda rng: routed(gate_matrix(2, 37, 6, 2, experts_used=[0, 2, 3, 5]),
                                           rng.standard_normal((37, 29)).astype(np.float32)),
    # One-beat rows back to back (H < lanes): still one beat per cycle.
    "one_beat_rows": lambda rng: routed(gate_matrix(3, 30, 4, 2),
                                        rng.standard_normal((30, 3)).astype(np.float32)),
    # NaN (with payloads), Inf, subnormals, -0.0: moved bit for bit.
    "special_values": lambda rng: routed(gate_matrix(4, 16, 4, 2),
                                         random_floats(rng, (16, 13), np.float32, specials=0.5)),
    # Zero tokens; and tokens routed nowhere (no slots at all).
    "zero_tokens": lambda rng: routed(np.zeros((0, 4), np.float32),
                                      np.zeros((0, 8), np.float32)),
    "zero_slots": lambda rng: routed(np.zeros((5, 4), np.float32),
                                     rng.standard_normal((5, 8)).astype(np.float32)),
    "zero_hidden": lambda rng: routed(gate_matrix(5, 8, 3, 1), np.zeros((8, 0), np.float32)),
}


def check(prob, sim, stall, *, params=PARAMS, seed=7, strict=True, latency=MEMORY_LATENCY):
    input, batch_index = prob["input"], prob["batch_index"]
    outcome = run(UNIT, {"input": input, "batch_index": batch_index},
                  {"strict": int(strict), "memory_latency": latency}, params=params, sim=sim,
                  stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    output = outcome.outputs["expert_input"]
    if "gates" in prob and batch_index.size:
        want = np.concatenate(golden.sparse_dispatch(prob["gates"], input))
        assert np.array_equal(to_bits(output, params.format), to_bits(want, params.format))
    if stall == 0.0:
        slots, hidden = batch_index.size, int(np.prod(input.shape[1:]))
        if slots and hidden:
            assert outcome.ideal_cycles == slots * -(-hidden // params.lanes)
            assert outcome.cycles == params.cycles(slots, hidden, latency) == \
                outcome.expected_cycles
        else:
            assert outcome.cycles == EMPTY_CYCLES, "a zero-element problem must finish at once"
    return outcome


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, name", simulator_cases(
    CASES, cocotb=["worked_example", "k2_empty_experts", "zero_tokens"]))
def test_sparse_gather_cases(sim, name, stall):
    check(case(name), sim, stall)


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim", simulator_params("verilator", "icarus"))
def test_sparse_gather_out_of_range(sim, stall):
    """Out-of-range and negative batch_index values (down to the field's extremes) read
    nothing, give zero rows, are counted and raise the error flag."""
    rng = np.random.default_rng(9)
    input = rng.standard_normal((10, 6)).astype(np.float32)
    batch_index = np.array([3, -1, 10, 0, 9, 11, -(1 << 31), (1 << 31) - 1, 4, -5, 2])
    outcome = check(dict(input=input, batch_index=batch_index), sim, stall, strict=False)
    assert outcome.results["dropped"] == 6 and outcome.results["error"]
    assert not outcome.outputs["expert_input"][[1, 2, 5, 6, 7, 9]].view(np.uint32).any()


@pytest.mark.parametrize("latency, bram", [(40, "generic"), (40, "ecp5"), (1, "generic")])
def test_sparse_gather_deep_inflight_queue(latency, bram):
    """64 beats in flight (behind an AXI master 256): the row reader's queue is then a block
    RAM FIFO, whose head comes 6 cycles after a beat's issue. Bit-exact, and stall-free
    exactly the formula's cycles, with that latency in place of a quicker memory's."""
    params = dataclasses.replace(PARAMS, max_outstanding=64, bram=bram)
    prob = case("k2_empty_experts")
    outcome = check(prob, SIM, 0.0, params=params, latency=latency)
    assert outcome.cycles == (outcome.ideal_cycles +
                              params.overhead(max(latency, BLOCK_FIFO_LATENCY)))
    check(prob, SIM, 0.3, params=params, latency=latency)


def test_sparse_gather_memory_latency():
    """Full rate for any memory latency up to ``max_outstanding - 1``; slower, still exact,
    past it."""
    prob = case("one_beat_rows")
    for latency in (1, PARAMS.max_outstanding - 1):
        check(prob, SIM, 0.0, latency=latency)
    outcome = check(prob, SIM, 0.3, latency=3 * PARAMS.max_outstanding)
    assert outcome.cycles > outcome.expected_cycles


@pytest.mark.parametrize("stall", STALLS)
def test_sparse_gather_narrow_elements(stall):
    """16-bit elements are moved, never changed: bfloat16 rows (NaN payloads included) on a
    bf16, 16-lane build."""
    rng = np.random.default_rng(12)
    params = SparseGatherParams(format="bf16", lanes=16, max_slots=64, max_tokens=32,
                                max_hidden=64)
    for hidden in (1, 16, 37):
        data = random_floats(rng, (20, hidden), ml_dtypes.bfloat16, specials=0.4)
        batch_index = rng.integers(0, 20, 45)
        outcome = run(UNIT, {"input": data, "batch_index": batch_index}, params=params,
                      sim=SIM, stall=stall, seed=hidden)
        assert outcome.passed, outcome.problems
        assert np.array_equal(outcome.outputs["expert_input"].view(np.uint16),
                              data[batch_index].view(np.uint16))
        if stall == 0.0:
            assert outcome.cycles == params.cycles(45, hidden, MEMORY_LATENCY)


def test_sparse_gather_reset_mid_run():
    """Reset in the middle of a run returns the unit to idle with no stale output; a run
    after that is right (Amaranth's simulator, a memory that always has data ready)."""
    dut = SparseGatherUnit(SparseGatherParams(lanes=2, max_slots=8, max_tokens=4, max_hidden=4))
    top = Module()
    top.domains.sync = sync = ClockDomain()
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-6)
    beats, requests = [], []

    async def start(ctx, slots):
        for port, value in (("slots", slots), ("tokens", 4), ("hidden", 3), ("start", 1)):
            ctx.set(getattr(dut, port), value)
        await ctx.tick()
        ctx.set(dut.start, 0)

    async def bench(ctx):
        ctx.set(dut.data.ready, 1)
        ctx.set(dut.header.valid, 1)
        ctx.set(dut.header.payload.index, 2)
        ctx.set(dut.read_request.ready, 1)
        ctx.set(dut.read_response.valid, 1)
        ctx.set(dut.read_response.payload.data[0], 0x11)
        ctx.set(dut.read_response.payload.data[1], 0x22)
        await start(ctx, 8)
        for _ in range(6):
            await ctx.tick()
        assert ctx.get(dut.busy)
        ctx.set(sync.rst, 1)
        await ctx.tick()
        ctx.set(sync.rst, 0)
        for _ in range(20):
            assert not ctx.get(dut.busy) and not ctx.get(dut.data.valid)
            assert not ctx.get(dut.read_request.valid) and not ctx.get(dut.header.ready)
            assert not ctx.get(dut.done) and ctx.get(dut.dropped) == 0
            await ctx.tick()
        await start(ctx, 1)
        for _ in range(30):
            if ctx.get(dut.read_request.valid):
                requests.append((ctx.get(dut.read_request.payload.addr),
                                 ctx.get(dut.read_request.payload.enable)))
            if ctx.get(dut.data.valid):
                beats.append((ctx.get(dut.data.payload.enable), ctx.get(dut.data.payload.last)))
            if ctx.get(dut.done):
                break
            await ctx.tick()
        assert ctx.get(dut.done) and not ctx.get(dut.error)

    sim.add_testbench(bench)
    sim.run()
    assert requests == [(6, 0b11), (8, 0b01)]        # row 2 of H = 3: two beats
    assert beats == [(0b11, 0), (0b01, 1)]


def test_sparse_gather_host_errors():
    input = np.zeros((4, 8), np.float32)

    def attempt(batch_index, settings=None, params=None, data=input):
        run(UNIT, {"input": data, "batch_index": np.asarray(batch_index)}, settings,
            params=params)

    with pytest.raises(HostError, match=r"batch_index\[2\] = 4 is outside \[0, 4\)"):
        attempt([0, 3, 4])
    with pytest.raises(HostError, match=r"batch_index\[0\] = -1 is outside"):
        attempt([-1])
    with pytest.raises(HostError, match="input has dtype float32, but the unit's format is fp16"):
        attempt([0], params=SparseGatherParams(format="fp16"))
    with pytest.raises(HostError, match="hidden = 8 exceeds the unit's max_hidden of 4"):
        attempt([0], params=SparseGatherParams(max_hidden=4))
    with pytest.raises(HostError, match="the problem needs max_hidden >= 8, but max_hidden = 4"):
        attempt([0], {"max_hidden": 4})
    with pytest.raises(HostError, match="does not fit the 8-bit header field"):
        attempt([1000], {"strict": 0}, params=SparseGatherParams(index_width=8, max_tokens=4))
    with pytest.raises(HostError, match="batch_index must have an integer dtype"):
        attempt([0.5])
    with pytest.raises(HostError, match="input must have dtype float32, float16 or bfloat16, "
                                        "not complex128"):
        attempt([0], data=np.zeros((2, 2), np.complex128))
    with pytest.raises(HostError, match="memory_latency must be at least 1, not 0"):
        attempt([0], {"memory_latency": 0})
    with pytest.raises(HostError, match="strict must be 0 or 1, not 2"):
        attempt([0], {"strict": 2})


@pytest.mark.parametrize("settings,message", [
    (dict(lanes=3), "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (dict(format="fp8"), "format must be fp32, fp16 or bf16, not 'fp8'"),
    (dict(max_slots=0), "max_slots must be an integer between 1 and"),
    (dict(max_outstanding=2), "max_outstanding must be an integer between 4 and"),
    (dict(index_width=8, max_tokens=4096), "index_width must hold max_tokens"),
])
def test_sparse_gather_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        SparseGatherParams(**settings)


def test_sparse_gather_old_names():
    """``width`` (bits per element) is accepted for ``format`` (32: fp32, 16: fp16), and
    ``outstanding`` for ``max_outstanding``, with a deprecation warning; other widths have
    no format."""
    with pytest.warns(DeprecationWarning, match="'width' is deprecated"):
        assert UNIT.make_params({"width": 16}).format == "fp16"
    with pytest.warns(DeprecationWarning, match="'width' is deprecated"):
        params = resolve_params(SparseGatherParams, None, {"width": 32, "lanes": 8})
    assert (params.format, params.lanes) == ("fp32", 8)
    with pytest.warns(DeprecationWarning, match="'outstanding' is deprecated"):
        assert UNIT.make_params({"outstanding": 8}).max_outstanding == 8
    with pytest.warns(DeprecationWarning), \
            pytest.raises(ParameterError, match="format must be fp32, fp16 or bf16, not 8"):
        UNIT.make_params({"width": 8})


def test_sparse_gather_scoreboard():
    """The scoreboard catches a lost beat, a wrong element, a wrong or extra read and a wrong
    status (results built by hand from the expected logs; no simulation)."""
    input = np.arange(12, dtype=np.float32).reshape(4, 3)
    problem = UNIT.problem({"input": input, "batch_index": np.array([2, 0, 3])}, {})
    params = SparseGatherParams(lanes=2, max_slots=4, max_tokens=4, max_hidden=4)
    bits = UNIT.want_bits(problem, params).astype(np.uint64)
    data = np.zeros((6, 2), np.uint64)
    data.reshape(3, 4)[:, :3] = bits
    reads = [(row * 3 + beat * 2, 0b11 if beat == 0 else 0b01) for row in (2, 0, 3)
             for beat in range(2)]
    good = {"data": data, "enable": np.tile([0b11, 0b01], 3), "last": np.tile([0, 1], 3),
            "request_addr": np.array([a for a, _ in reads]),
            "request_enable": np.array([e for _, e in reads]), "out_of_bounds": 0,
            "headers_taken": 3, "dropped": 0, "error": 0}

    def findings(**changes):
        results = {**good, **changes}
        return UNIT.score(problem, params, UNIT.unpack(problem, params, results), results)

    assert findings() == []
    assert any("lost or duplicated" in f for f in findings(
        data=data[:-1], enable=good["enable"][:-1], last=good["last"][:-1]))
    wrong = data.copy()
    wrong[2, 1] ^= 1
    assert any("output beat 2" in f for f in findings(data=wrong))
    assert any("expert_input" in f for f in findings(data=wrong))
    addr = good["request_addr"].copy()
    addr[3] += 2
    assert any("read log beat 3" in f for f in findings(request_addr=addr))
    assert any("read log: 7 beats" in f for f in findings(
        request_addr=np.append(addr, 0), request_enable=np.append(good["request_enable"], 3)))
    assert any("error" in f for f in findings(error=1))
    assert any("out of bounds" in f for f in findings(out_of_bounds=1))
