"""The combine-gather unit (SPEC 1.4, tutel decode) on its emitted Verilog (every case on
Verilator's fast path; a few also through the cocotb bench in Verilator and Icarus), with and
without random valid/ready stalls on the header stream, the
read port's request and response streams and the output, scored bit for bit against
``golden.combine_gather`` with scoreboards over every output beat and every read (the reads
must be exactly the valid pairs' rows, in the unit's window order, none out of bounds);
stall-free runs must take exactly the documented cycle count. Plus a mid-run reset in
Amaranth's simulator, and parameter and host errors."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.blocks.slot_address import slot_latency
from moe_hw import golden
from moe_hw.formats import from_bits, to_bits
from moe_hw.golden._common import slot_rows
from moe_hw.golden.testing import bit_equal, random_floats
from moe_hw.host.checks import HostError
from moe_hw import problems
from moe_hw.host.combine_gather import UNIT
from moe_hw.host.checks import MEMORY_LATENCY
from moe_hw.host.unit import run
from moe_hw.params import ParameterError
from moe_hw.units.combine_gather import CombineGatherParams, CombineGatherUnit, gather_schedule
from moe_hw.units.dispatch_backward_data import DispatchBackwardDataUnit

from conftest import SIM, STALLS, simulator_cases

# One generous build serves every stream case (window = add_stages + 2 = 13 items for fp32).
PARAMS = CombineGatherParams(format="fp32", lanes=4, max_tokens=64, max_hidden=64,
                             max_capacity=32, max_experts=8, max_top_k=3)

CASES = {
    # DUET toy scale (S=21, E=6, H=16), top-1, every token fits.
    "duet_toy": dict(tokens=21, hidden=16, experts=6, capacity=21, k=1),
    # top-2 with capacity drops; H not a multiple of the lanes.
    "k2_drops": dict(tokens=37, hidden=29, experts=5, capacity=9, k=2),
    # Out-of-range and negative indices and locations (the field extremes are added below).
    "out_of_range": dict(tokens=30, hidden=7, experts=6, capacity=5, k=2,
                         index_range=(-3, 9), location_range=(-2, 8)),
    # NaN, Inf, subnormals and -0.0 in gates and expert outputs.
    "special_values": dict(tokens=24, hidden=13, experts=4, capacity=12, k=2, specials=0.4),
    # top-3, two-beat rows (windows span tokens), experts 1 and 3 get no tokens.
    "k3_empty_experts": dict(tokens=25, hidden=5, experts=5, capacity=20, k=3,
                             experts_used=[0, 2, 4]),
    # One-beat rows: a window is five tokens, every pass one segment per token.
    "one_beat_rows": dict(tokens=40, hidden=4, experts=3, capacity=30, k=2),
    # Rows longer than a window: each row read in segments across windows.
    "long_rows": dict(tokens=6, hidden=64, experts=2, capacity=6, k=2, specials=0.1),
    "zero_tokens": dict(tokens=0, hidden=16, experts=2, capacity=4, k=2),
}


def gather_problem(cases, name, *, extremes_k):
    """Case ``name`` of ``cases`` (a :func:`gather_problem` dict); the ``out_of_range`` case
    gets the field extremes in its indices of choice ``extremes_k`` and its locations of the
    other choice. (Shared with the dispatch_backward_data tests.)"""
    prob = problems.gather_problem(sorted(cases).index(name), **cases[name])
    if name == "out_of_range":
        prob["indices"][extremes_k, :4] = [-(1 << 31), (1 << 31) - 1, 6, -1]
        prob["locations"][1 - extremes_k, 4:8] = [(1 << 31) - 1, -(1 << 31), 5, -1]
    return prob


def problem(name):
    return gather_problem(CASES, name, extremes_k=0)


def check(prob, sim, stall, *, unit=UNIT, params=PARAMS, seed=7, latency=MEMORY_LATENCY):
    """Run ``prob`` on ``unit`` (combine_gather or dispatch_backward_data): bit-exact, clean
    scoreboards, and stall-free exactly the documented cycle count. (Shared with the
    dispatch_backward_data tests.)"""
    inputs, runtime = unit.inputs_of(prob)
    outcome = run(unit, inputs, {**runtime, "memory_latency": latency}, params=params,
                  sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        gates = np.asarray(prob["gates"])
        top_k, tokens = (1, gates.shape[0]) if gates.ndim == 1 else gates.shape
        reads = bool((slot_rows(prob["indices"], prob["locations"], prob["num_experts"],
                                prob["capacity"]) >= 0).any()) and top_k > 0
        want = params.cycles(tokens, prob["buffer"].shape[1], top_k, latency, reads=reads)
        assert outcome.cycles == want == outcome.expected_cycles, \
            f"{outcome.cycles} cycles, the documented formula gives {want}"
    return outcome


def variant(prob, **changes):
    """``prob`` with some arrays or sizes replaced."""
    return {**prob, **changes}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, name", simulator_cases(
    CASES, cocotb=["duet_toy", "out_of_range", "zero_tokens"]))
def test_combine_gather_cases(sim, name, stall):
    check(problem(name), sim, stall)


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("name, latency, bram", [
    ("k2_drops", 40, "generic"), ("one_beat_rows", 40, "generic"), ("k2_drops", 40, "ecp5"),
    ("k2_drops", 1, "generic"), ("out_of_range", 40, "generic")])
def test_combine_gather_deep_inflight_queue(name, latency, bram, stall):
    """64 beats in flight (behind an AXI master 256: the row reader's in-flight entries and
    tags then wait in a block RAM FIFO, not in LUT RAM): bit-exact, clean scoreboards and,
    stall-free, exactly the formula's cycles: full rate at a memory latency of 40 (L < 64);
    with a memory quicker than the FIFO (L = 1), or no read at all (every pair out of range),
    the FIFO's latency in its place (``RowReader.join_latency``)."""
    check(problem(name), SIM, stall,
          params=dataclasses.replace(PARAMS, max_outstanding=64, bram=bram), latency=latency)


def test_combine_gather_cycle_formula():
    """The documented count, worked by hand for the window schedule: K*S*B read beats, plus
    the last window's wait for its partial sums when it is shorter than add_stages + 2."""
    # a partial sum is written back from the adder's output register, and read a cycle later
    # into the adder's operand register
    loop = PARAMS.add_latency + 2
    assert PARAMS.accumulate_loop == PARAMS.window_items == loop
    assert PARAMS.accumulate_latency == 1 + PARAMS.mul_latency + 1 + PARAMS.add_latency
    overhead = PARAMS.overhead(MEMORY_LATENCY)
    # start, decide and setup (tokens * beats), ring write, ring read, the pass's pair
    # register and slot address, command queue (write, skid buffer), reader command, memory,
    # reader skid buffer, operand registers, multiplier, adder operand registers, adder,
    # output queue (write, skid buffer), its idle register, done
    assert PARAMS.setup == 4
    assert overhead == (PARAMS.setup + 1 + 1 + 1 + 1 + slot_latency(PARAMS) + 2 + 1 + MEMORY_LATENCY
                        + 1 + 1 + PARAMS.mul_latency + 1 + PARAMS.add_latency + 2 + 1 + 1)
    # 37 tokens x 8 beats = 296 items: whole windows and a last, short one, whose second
    # pass waits for its partial sums: loop - (296 % loop) more cycles.
    assert 296 % loop
    assert PARAMS.cycles(37, 29, 2, MEMORY_LATENCY) == 2 * 296 + (loop - 296 % loop) + overhead
    # Whole windows only (one beat per token): exactly the ideal.
    whole = 4 * loop
    assert PARAMS.cycles(whole, 4, 2, MEMORY_LATENCY) == 2 * whole + overhead
    assert PARAMS.cycles(0, 4, 2) == PARAMS.cycles(4, 0, 2) == EMPTY_CYCLES
    # top_k = 0 is one pass of dropped pairs; a run that reads nothing waits for no memory.
    assert PARAMS.cycles(40, 4, 0, MEMORY_LATENCY) == 40 + overhead
    assert PARAMS.cycles(40, 4, 0, MEMORY_LATENCY, reads=False) == 40 + PARAMS.overhead(1)
    schedule = gather_schedule(3, 2, 2, 5)
    assert schedule[:10] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (0, 2, 0),
                             (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1), (1, 2, 0)]
    assert schedule[10:] == [(0, 2, 1), (1, 2, 1)]


def test_combine_gather_edge_sizes():
    """top_k = 0 (every output +0.0), zero capacity (every pair dropped), zero hidden, short
    windows and a memory latency at the edge of full rate, all on the one build."""
    prob = problem("k2_drops")
    gates, indices, locations, expert_out = (prob[name] for name in
                                             ("gates", "indices", "locations", "buffer"))
    outcome = check(variant(prob, gates=gates[:0], indices=indices[:0],
                            locations=locations[:0]), SIM, 0.0)
    assert not outcome.outputs["combined"].view(np.uint32).any()
    assert outcome.results["dropped"] == 0
    outcome = check(variant(prob, buffer=expert_out[:0], capacity=0, num_experts=0),
                    SIM, 0.0)
    assert not outcome.outputs["combined"].view(np.uint32).any()
    assert outcome.results["dropped"] == gates.size
    outcome = check(variant(prob, buffer=expert_out[:, :0]), SIM, 0.0)
    assert outcome.cycles == EMPTY_CYCLES and outcome.outputs["combined"].shape == (37, 0)
    for tokens in (1, 2, 3):     # a single, short window
        check(variant(prob, gates=gates[:, :tokens], indices=indices[:, :tokens],
                      locations=locations[:, :tokens], buffer=expert_out[:, :3]),
              SIM, 0.0)
    for latency in (1, PARAMS.max_outstanding - 1):
        check(problem("one_beat_rows"), SIM, 0.0, latency=latency)
    outcome = check(problem("one_beat_rows"), SIM, 0.3,
                    latency=3 * PARAMS.max_outstanding)
    assert outcome.cycles > outcome.expected_cycles


@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
def test_combine_gather_expert_lanes_pysim(fmt):
    """With ``expert_lanes`` (moe_layer's affine experts), the idle unit's lanes give
    ``scale * x + bias`` per lane (the product rounded, then the sum:
    ``golden.affine_layer``) ``accumulate_latency`` cycles after each cycle's operands, bit
    for bit, specials included (Amaranth's simulator)."""
    params = CombineGatherParams(format=fmt, lanes=2, max_tokens=8, max_hidden=8,
                                 max_capacity=4, max_experts=2, max_top_k=2)
    dut = CombineGatherUnit(params, expert_lanes=True)
    top = Module()
    top.domains.sync = ClockDomain()
    top.submodules.dut = dut
    dtype = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16}[fmt]
    rng = np.random.default_rng(11)
    count = 48
    scale = random_floats(rng, (count,), dtype, specials=0.2)
    elements = random_floats(rng, (count, 2), dtype, specials=0.2)
    bias = random_floats(rng, (count,), dtype, specials=0.2)
    want = golden.affine_layer(elements, {"scale": scale[:, None], "bias": bias[:, None]})
    latency = params.accumulate_latency
    got = []

    async def bench(ctx):
        ctx.set(dut.expert.on, 1)
        await ctx.tick()                        # (``on`` held a cycle before the operands)
        for cycle in range(count + latency):
            if cycle < count:
                ctx.set(dut.expert.scale, int(to_bits(scale[cycle], fmt)))
                ctx.set(dut.expert.bias, int(to_bits(bias[cycle], fmt)))
                for lane in range(2):
                    ctx.set(dut.expert.data[lane], int(to_bits(elements[cycle, lane], fmt)))
            if cycle >= latency:
                got.append([ctx.get(dut.sums[lane]) for lane in range(2)])
            await ctx.tick()

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert bit_equal(from_bits(np.array(got, np.uint32), fmt), want)


def test_combine_gather_reset_mid_run():
    """Reset in the middle of a run returns the unit to idle with no stale output; a run
    after that is right (Amaranth's simulator, a zero-latency memory model)."""
    params = CombineGatherParams(lanes=2, max_tokens=8, max_hidden=8, max_capacity=4,
                                 max_experts=2, max_top_k=2)
    dut = CombineGatherUnit(params)
    top = Module()
    top.domains.sync = sync = ClockDomain()
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-6)
    two = int(to_bits(np.float32(2.0), "fp32"))
    three = int(to_bits(np.float32(3.0), "fp32"))
    outputs = []

    async def start(ctx, tokens):
        for port, value in (("tokens", tokens), ("hidden", 4), ("top_k", 2), ("capacity", 4),
                            ("num_experts", 2), ("start", 1)):
            ctx.set(getattr(dut, port), value)
        await ctx.tick()
        ctx.set(dut.start, 0)

    async def bench(ctx):
        ctx.set(dut.data.ready, 1)
        ctx.set(dut.header.valid, 1)
        for k in range(2):            # both choices: expert 1, location 2, gate 2.0
            ctx.set(dut.header.payload.gate[k], two)
            ctx.set(dut.header.payload.index[k], 1)
            ctx.set(dut.header.payload.location[k], 2)
        ctx.set(dut.read_response.payload.data[0], three)
        ctx.set(dut.read_response.payload.data[1], three)
        ctx.set(dut.read_request.ready, 1)
        ctx.set(dut.read_response.valid, 1)     # every response 3.0, always there
        await start(ctx, 8)
        for _ in range(12):
            await ctx.tick()
        assert ctx.get(dut.busy)
        ctx.set(sync.rst, 1)
        await ctx.tick()
        ctx.set(sync.rst, 0)
        for _ in range(20):
            assert not ctx.get(dut.busy) and not ctx.get(dut.data.valid)
            assert not ctx.get(dut.read_request.valid) and not ctx.get(dut.header.ready)
            assert not ctx.get(dut.done) and ctx.get(dut.dropped) == 0
            assert not ctx.get(dut.read_response.ready)
            await ctx.tick()
        await start(ctx, 1)
        for _ in range(params.cycles(1, 4, 2) + 10):
            if ctx.get(dut.data.valid):
                outputs.append([ctx.get(dut.data.payload.data[0]),
                                ctx.get(dut.data.payload.data[1])])
            if ctx.get(dut.done):
                break
            await ctx.tick()
        assert ctx.get(dut.done) and not ctx.get(dut.error)

    sim.add_testbench(bench)
    sim.run()
    want = int(to_bits(np.float32(12.0), "fp32"))   # 2*3 + 2*3, one token of two beats
    assert outputs == [[want, want], [want, want]]


def pysim_run(unit, gates, indices, locations, buffer, *, num_experts, capacity):
    """Run ``unit`` in Amaranth's simulator, stall-free, memory latency 1; return the output
    rows (bit patterns), the read log and the cycle count (counted as the cocotb bench does)."""
    p = unit.params
    k, tokens = gates.shape
    hidden = buffer.shape[1]
    beats = -(-hidden // p.lanes)
    memory = to_bits(buffer, p.format).reshape(-1)
    gate_bits = to_bits(gates, p.format)
    top = Module()
    top.domains.sync = ClockDomain()
    top.submodules.dut = dut = unit
    sim = Simulator(top)
    sim.add_clock(1e-6)
    out, reads, result = [], [], {}

    async def bench(ctx):
        for port, value in (("tokens", tokens), ("hidden", hidden), ("top_k", k),
                            ("capacity", capacity), ("num_experts", num_experts), ("start", 1)):
            ctx.set(getattr(dut, port), value)
        ctx.set(dut.read_request.ready, 1)
        ctx.set(dut.data.ready, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        queue, sent, cycles = [], 0, 0
        while True:
            ctx.set(dut.header.valid, sent < tokens)
            if sent < tokens:
                for j in range(k):
                    ctx.set(dut.header.payload.gate[j], int(gate_bits[j, sent]))
                    ctx.set(dut.header.payload.index[j], int(indices[j, sent]))
                    ctx.set(dut.header.payload.location[j], int(locations[j, sent]))
            ctx.set(dut.read_response.valid, bool(queue))
            if queue:
                for lane, value in enumerate(queue[0]):
                    ctx.set(dut.read_response.payload.data[lane], value)
            header_taken = sent < tokens and ctx.get(dut.header.ready)
            request = None
            if ctx.get(dut.read_request.valid):
                request = (ctx.get(dut.read_request.payload.addr),
                           ctx.get(dut.read_request.payload.enable))
            response_taken = bool(queue) and ctx.get(dut.read_response.ready)
            if ctx.get(dut.data.valid):
                out.append([ctx.get(dut.data.payload.data[lane]) for lane in range(p.lanes)])
            done = ctx.get(dut.done)
            await ctx.tick()
            cycles += 1
            sent += bool(header_taken)
            if response_taken:
                queue.pop(0)
            if request is not None:
                reads.append(request)
                addr, enable = request
                queue.append([int(memory[addr + lane]) if enable >> lane & 1 else 0
                              for lane in range(p.lanes)])
            if done:        # the bench counts the edge that ends the first done cycle
                break
            assert cycles < 20000
        result["cycles"] = cycles

    sim.add_testbench(bench)
    sim.run()
    rows = np.array(out, dtype=np.uint64).reshape(tokens, beats * p.lanes)[:, :hidden]
    return rows, reads, result["cycles"]


@pytest.mark.parametrize("unit_class,settings,build", [
    (CombineGatherUnit, dict(window=1), {}),
    (CombineGatherUnit, dict(window=2, add_stages=2, mul_stages=0), {}),
    (CombineGatherUnit, dict(window=7, add_stages=1, mul_stages=1), {}),
    (CombineGatherUnit, dict(window=2, add_stages=2, mul_stages=0), dict(expert_lanes=True)),
    (DispatchBackwardDataUnit, dict(window=3), {}),
    (DispatchBackwardDataUnit, dict(format="bf16", add_stages=1), {}),
])
def test_combine_gather_windows_pysim(unit_class, settings, build):
    """Windows shorter and longer than the adder loop, other pipeline depths, both start
    rules, and moe_layer's build (the expert lanes idle): bit-exact, the exact read order,
    and the documented cycle count (Amaranth's simulator; the emitted-Verilog benches use
    the default window)."""
    params = unit_class.PARAMS(lanes=2, max_tokens=8, max_hidden=8, max_capacity=8,
                               max_experts=4, max_top_k=3, **settings)
    dtype = params.fmt.dtype
    for seed, (tokens, hidden, k) in enumerate([(5, 3, 3), (4, 1, 2), (3, 6, 1)]):
        prob = problems.gather_problem(
            seed, tokens=tokens, hidden=hidden, experts=3, capacity=4, k=k, dtype=dtype,
            specials=0.3, index_range=(-1, 4), location_range=(0, 5))
        gates, indices, locations, buffer, capacity = (
            prob[name] for name in ("gates", "indices", "locations", "buffer", "capacity"))
        unit = unit_class(params, **build)
        rows, reads, cycles = pysim_run(unit, gates, indices, locations, buffer,
                                        num_experts=3, capacity=capacity)
        model = golden.combine_gather if unit.SUM_START == "zero" else \
            (lambda *a, capacity: golden.dispatch_backward_data(*a, num_experts=3,
                                                                capacity=capacity))
        want = model(gates, indices, locations, buffer, capacity=capacity)
        assert bit_equal(from_bits(rows, params.format), want)
        slots = slot_rows(indices, locations, 3, capacity)
        want_reads = [(int(slots[p, i]) * hidden + b * 2) for p, i, b in
                      gather_schedule(tokens, -(-hidden // 2), k, params.window_items)
                      if slots[p, i] >= 0]
        assert [addr for addr, _ in reads] == want_reads
        assert cycles == params.cycles(tokens, hidden, k, 1, reads=bool(want_reads))


def test_combine_gather_host_errors():
    prob = problem("k2_drops")
    inputs, runtime = UNIT.inputs_of(prob)

    def attempt(settings=None, params=None, **changes):
        run(UNIT, {**inputs, **changes}, {**runtime, **(settings or {})}, params=params)

    with pytest.raises(HostError, match=r"expert_out must have a multiple of capacity \(8\)"):
        attempt({"capacity": 8})
    with pytest.raises(HostError, match="hidden = 29 exceeds the unit's max_hidden of 16"):
        attempt(params=CombineGatherParams(max_hidden=16, max_tokens=64))
    with pytest.raises(HostError, match="the problem needs max_hidden >= 29, but "
                                        "max_hidden = 16"):
        attempt({"max_hidden": 16})
    with pytest.raises(HostError, match="top_k = 2 exceeds the unit's max_top_k of 1"):
        attempt(params=CombineGatherParams(max_top_k=1))
    with pytest.raises(HostError, match="gates has dtype float16, but expert_out has float32"):
        attempt(gates=inputs["gates"].astype(np.float16))
    with pytest.raises(HostError, match="gates has dtype float32, but the unit's format is "
                                        "fp16"):
        attempt(params=CombineGatherParams(format="fp16"))
    bad = inputs["indices"].copy()
    bad[1, 3] = 1 << 40
    with pytest.raises(HostError, match=r"indices.flat\[40\] = 1099511627776 does not fit"):
        attempt(indices=bad)
    with pytest.raises(HostError, match="locations has shape"):
        attempt(locations=inputs["locations"][:1])
    with pytest.raises(HostError, match="capacity must be a non-negative integer"):
        attempt({"capacity": -1})
    with pytest.raises(HostError, match="the input file for combine_gather lacks expert_out"):
        run(UNIT, {name: inputs[name] for name in ("gates", "indices", "locations")}, runtime)


@pytest.mark.parametrize("settings,message", [
    (dict(lanes=3), "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (dict(format="fp64"), "format must be fp32, fp16 or bf16, not 'fp64'"),
    (dict(max_top_k=0), "max_top_k must be an integer between 1 and 16, not 0"),
    (dict(add_stages=0), "add_stages must be an integer between 1 and 16, not 0"),
    (dict(window=0), "window must be an integer between 1 and 256, not 0"),
    (dict(max_outstanding=3), "max_outstanding must be an integer between 4 and 4096, not 3"),
    (dict(index_width=8, max_capacity=4096), "index_width must hold max_capacity"),
])
def test_combine_gather_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        CombineGatherParams(**settings)


def test_combine_gather_old_names():
    """``max_k`` and ``outstanding`` are accepted, with a deprecation warning."""
    with pytest.warns(DeprecationWarning, match="'max_k' is deprecated"):
        params = UNIT.make_params({"max_k": 3})
    with pytest.warns(DeprecationWarning, match="'outstanding' is deprecated"):
        params = UNIT.make_params({"outstanding": 8}, base={"max_top_k": params.max_top_k})
    assert (params.max_top_k, params.max_outstanding) == (3, 8)
