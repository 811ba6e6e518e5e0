"""The sparse gather unit (DUET ``SparseDispatcher.dispatch()``) on its emitted Verilog (cocotb,
Verilator and Icarus), every case with and without random valid/ready stalls on the header
stream, the read port's request and response streams and the output, scored bit for bit
against ``input[batch_index]`` (and ``golden.sparse_dispatch``) with scoreboards over every
output beat and every read; stall-free runs must take exactly the documented cycle count."""

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from moe_hw import golden
from moe_hw.golden.testing import random_floats
from moe_hw.host.common import HostError
from moe_hw.host.gather import MEMORY_LATENCY, run_sparse_gather, score_sparse_gather
from moe_hw.params import ParameterError
from moe_hw.units.sparse_gather import SparseGatherParams, SparseGatherUnit

from conftest import STALLS, simulator_params

# One generous build serves every stream case.
PARAMS = SparseGatherParams(width=32, lanes=4, max_slots=128, max_tokens=64, max_hidden=64)


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
    run = run_sparse_gather(input, batch_index, params=params, sim=sim, stall=stall,
                            seed=seed, strict=strict, memory_latency=latency)
    problems = score_sparse_gather(run, input, batch_index)
    assert not problems, "\n".join(problems)
    if "gates" in prob and batch_index.size:
        want = np.concatenate(golden.sparse_dispatch(prob["gates"], input))
        assert np.array_equal(run.output.view(np.uint32), want.view(np.uint32))
    if stall == 0.0:
        slots, hidden = batch_index.size, int(np.prod(input.shape[1:]))
        if slots and hidden:
            overhead = SparseGatherUnit(params).overhead(latency)
            assert run.ideal_cycles == slots * -(-hidden // params.lanes)
            assert run.cycles == run.ideal_cycles + overhead == run.expected_cycles
        else:
            assert run.cycles == 1, "a zero-element problem must finish at once"
    return run


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("sim", simulator_params("verilator", "icarus"))
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
    run = check(dict(input=input, batch_index=batch_index), sim, stall, strict=False)
    assert run.dropped == 6 and run.error
    assert not run.output[[1, 2, 5, 6, 7, 9]].view(np.uint32).any()


def test_sparse_gather_memory_latency():
    """Full rate for any memory latency up to ``outstanding - 1``; slower, still exact, past it."""
    prob = case("one_beat_rows")
    for latency in (1, PARAMS.outstanding - 1):
        check(prob, "verilator", 0.0, latency=latency)
    run = check(prob, "verilator", 0.3, latency=3 * PARAMS.outstanding)
    assert run.cycles > run.expected_cycles


@pytest.mark.parametrize("stall", STALLS)
def test_sparse_gather_narrow_elements(stall):
    """Any element width is moved, never changed: bfloat16 rows (NaN payloads included) on a
    16-bit, 16-lane build."""
    rng = np.random.default_rng(12)
    params = SparseGatherParams(width=16, lanes=16, max_slots=64, max_tokens=32, max_hidden=64)
    for hidden in (1, 16, 37):
        data = random_floats(rng, (20, hidden), ml_dtypes.bfloat16, specials=0.4)
        batch_index = rng.integers(0, 20, 45)
        run = run_sparse_gather(data, batch_index, params=params, stall=stall, seed=hidden)
        problems = score_sparse_gather(run, data, batch_index)
        assert not problems, "\n".join(problems)
        assert np.array_equal(run.output.view(np.uint16), data[batch_index].view(np.uint16))
        if stall == 0.0:
            assert run.cycles == run.expected_cycles


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
    with pytest.raises(HostError, match=r"batch_index\[2\] = 4 is outside \[0, 4\)"):
        run_sparse_gather(input, np.array([0, 3, 4]))
    with pytest.raises(HostError, match=r"batch_index\[0\] = -1 is outside"):
        run_sparse_gather(input, np.array([-1]))
    with pytest.raises(HostError, match="input has 32-bit elements .* moves 16-bit"):
        run_sparse_gather(input, np.array([0]), params=SparseGatherParams(width=16))
    with pytest.raises(HostError, match="hidden = 8 exceeds the unit's maximum of 4"):
        run_sparse_gather(input, np.array([0]), params=SparseGatherParams(max_hidden=4))
    with pytest.raises(HostError, match="does not fit the 8-bit header field"):
        run_sparse_gather(input, np.array([1000]), strict=False,
                          params=SparseGatherParams(index_width=8, max_tokens=4))
    with pytest.raises(HostError, match="batch_index must have an integer dtype"):
        run_sparse_gather(input, np.array([0.5]))
    with pytest.raises(HostError, match="input must have a numeric dtype"):
        run_sparse_gather(np.zeros((2, 2), np.complex128), np.array([0]))


@pytest.mark.parametrize("settings,message", [
    (dict(lanes=3), "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (dict(width=12), "width must be 8, 16, 32 or 64, not 12"),
    (dict(max_slots=0), "max_slots must be an integer between 1 and"),
    (dict(outstanding=2), "outstanding must be an integer between 4 and"),
    (dict(index_width=8, max_tokens=4096), "Index width must hold max_tokens"),
])
def test_sparse_gather_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        SparseGatherParams(**settings)
