"""Stream plumbing: the skid buffer, the ring queue, the credit pipeline, the registered
FIFO and the register copies in Amaranth's simulator and, as emitted Verilog, under cocotb in
Verilator and Icarus; with and without random valid/ready stalls."""

import re

import numpy as np
import pytest
from amaranth._toolchain.yosys import find_yosys
from amaranth.back import rtlil
from amaranth.hdl import ClockDomain, Module, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.lib.fifo import SyncFIFO
from amaranth.sim import Simulator

from moe_hw.flows.simulate import _build, _design, _verilator_opt, simulate
from moe_hw.stream import (CreditPipeline, RegisteredFIFO, RingQueue, SkidBuffer, delay,
                           lut_increment)
from moe_hw.stream.skid import alternate_groups
from moe_hw.stream.pipeline import RegisterCopies, replicated
from moe_hw.stream.credit import ring_groups

from conftest import STALLS, comb_outputs, run_pysim, simulator_params


def run_skid_pysim(items, p_valid, p_ready, seed, dut=None):
    dut = SkidBuffer(16) if dut is None else dut
    i_bits, o_bits = Value.cast(dut.i.payload), Value.cast(dut.o.payload)
    rng = np.random.default_rng(seed)
    got, cycles = [], []

    async def producer(ctx):
        for item in items:
            while rng.random() < p_valid:
                await ctx.tick()
            ctx.set(i_bits, item)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        cycle = 0
        while len(got) < len(items):
            ready = not rng.random() < p_ready
            ctx.set(dut.o.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(dut.o.valid, o_bits)
            if valid and ready:
                got.append(payload)
                cycles.append(cycle)
            cycle += 1
            assert cycle < 20 * len(items) + 100

    run_pysim(dut, producer, consumer)
    return got, cycles


@pytest.mark.parametrize("p", [0.0, 0.3, 0.7])
def test_skid_buffer_order(p):
    items = list(range(1, 301))
    got, cycles = run_skid_pysim(items, p, p, seed=4)
    assert got == items
    if p == 0.0:
        # Full throughput: one item per cycle after a one-cycle latency.
        assert cycles == list(range(1, len(items) + 1))


@pytest.mark.parametrize("p", [0.0, 0.3, 0.7])
def test_skid_buffer_alternate_fields(p):
    """Fields held in two registers written in turn: the same items, in the same cycles, as
    the plain skid buffer under the same stalls."""
    layout = data.StructLayout({"low": 5, "wide": 8, "high": 3})
    items = [(k * 2654435761) % (1 << 16) for k in range(1, 301)]
    plain = run_skid_pysim(items, p, p, seed=5, dut=SkidBuffer(layout))
    alternate = run_skid_pysim(items, p, p, seed=5,
                               dut=SkidBuffer(layout, alternate=("wide", "high")))
    assert plain[0] == items
    assert alternate == plain


@pytest.mark.parametrize("group_flags", [False, True], ids=["shared_flag", "group_flags"])
@pytest.mark.parametrize("p", [0.0, 0.5])
def test_skid_buffer_alternate_groups(p, group_flags):
    """A wide alternate field is held in groups, each with its own pointer copies (and,
    with ``group_flags``, its own copy of the skid flag): the same items in the same cycles
    as the plain skid buffer."""
    layout = data.StructLayout({"low": 3, "wide": 150})
    assert len(alternate_groups(150)) == 3
    items = [(k * 0x9E3779B97F4A7C15_C2B2AE3D27D4EB4F) % (1 << 153) for k in range(1, 201)]
    plain = run_skid_pysim(items, p, p, seed=7, dut=SkidBuffer(layout))
    grouped = run_skid_pysim(items, p, p, seed=7,
                             dut=SkidBuffer(layout, alternate=("wide",), group_bits=64,
                                            group_flags=group_flags))
    assert plain[0] == items
    assert grouped == plain


@pytest.mark.parametrize("group_flags", [False, True], ids=["shared_flag", "group_flags"])
def test_skid_buffer_alternate_copies_are_kept(group_flags):
    """Yosys keeps each group's copies of the pointers, and with ``group_flags`` of the skid
    flag (opt_merge would undo copies whose next-state logic were the same)."""
    yosys = find_yosys(lambda version: True)
    dut = SkidBuffer(data.StructLayout({"wide": 150}), alternate=("wide",), group_bits=64,
                     group_flags=group_flags)
    text = rtlil.convert(dut, name="top")
    script = f"read_rtlil <<rtlil\n{text}\nrtlil\nproc\nopt\nopt_clean\nwrite_rtlil"
    netlist = yosys.run(["-q", "-"], script, ignore_warnings=True)
    # the registers' outputs: the Q connection of every flip-flop cell
    cells = re.findall(r"^\s*cell \$\w*dff\w* .*?^\s*end$", netlist, re.MULTILINE | re.DOTALL)
    outputs = [re.search(r"connect \\Q (\S+)", cell).group(1) for cell in cells]
    # 3 groups x (written, read), and with group_flags a skid flag copy each
    copies = [name for name in outputs if re.fullmatch(r"\\(written|read)(_\d)?", name)]
    assert len(copies) == 6, outputs
    flags = [name for name in outputs if re.fullmatch(r"\\skid_valid_copy(_\d)?", name)]
    assert len(flags) == (3 if group_flags else 0), outputs


def _replicated_design(apart):
    """A counter register and one copy of its next value."""
    m = Module()
    count = Signal(4)
    following = count + 1
    m.d.sync += count.eq(following)
    copy, = replicated(m, following[:4], name="copy", copies=1, apart=apart)
    out = Signal(4)
    m.d.comb += out.eq(copy)
    return m, count, out


@pytest.mark.parametrize("apart", [False, True])
def test_replicated_copy_follows(apart):
    """A copy reads the register's value: 0 from reset, then the value a cycle late."""
    m, count, out = _replicated_design(apart)
    m.domains.sync = ClockDomain()
    seen = []

    async def bench(ctx):
        for _ in range(6):
            seen.append((ctx.get(count), ctx.get(out)))
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen == [(c, c) for c in range(6)]


def test_replicated_apart_is_not_merged():
    """``apart``: Yosys keeps the copy apart from the register that loads the same value
    (copy 0 merges with it: opt_merge), so the copy's fan-out stays its own."""
    yosys = find_yosys(lambda version: True)
    counts = {}
    for apart in (False, True):
        m, count, out = _replicated_design(apart)
        text = rtlil.convert(m, ports=[out, count])
        script = f"read_rtlil <<rtlil\n{text}\nrtlil\nproc\nopt\nopt_clean\nwrite_rtlil"
        netlist = yosys.run(["-q", "-"], script, ignore_warnings=True)
        counts[apart] = len(re.findall(r"^\s*cell \$\w*dff\w* ", netlist, re.MULTILINE))
    assert counts == {False: 1, True: 2}, counts


def _copies_design():
    """A 3-bit register set and stepped in two places, and three copies taking its loads."""
    m = Module()
    start = Signal()
    step = Signal()
    count = Signal(3)
    copies = RegisterCopies(3, name="count_copy")
    with m.If(start):
        m.d.sync += [count.eq(5), *copies.eq(5)]
    with m.Elif(step):
        m.d.sync += [count.eq(count + 1), *copies.eq(count + 1)]
    outs = [Signal(3, name=f"out{k}") for k in range(3)]
    m.d.comb += [out.eq(value) for out, value in zip(outs, copies.values)]
    return m, start, step, count, outs


def test_register_copies_follow():
    """Every copy reads the register's value once loaded (copy 3, the first, from reset)."""
    m, start, step, count, outs = _copies_design()
    m.domains.sync = ClockDomain()
    seen = []

    async def bench(ctx):
        seen.append([ctx.get(out) for out in outs])
        for cycle in range(12):
            ctx.set(start, cycle == 1)
            ctx.set(step, cycle % 3 != 0)
            await ctx.tick()
            seen.append([ctx.get(count)] + [ctx.get(out) for out in outs])

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen[0] == [0, 7, 7]                 # copy 3 reads 0 from reset, the others ones
    assert all(row[1:] == [row[0]] * 3 for row in seen[2:]), seen
    assert len({row[0] for row in seen[2:]}) > 3


@pytest.mark.parametrize("width", [1, 2, 3, 5, 6])
def test_lut_increment_is_plus_one(width):
    """``lut_increment`` is ``value + 1`` modulo ``2**width`` for every value."""
    value = Signal(width)
    out = Signal(width)
    m = Module()
    m.d.comb += out.eq(lut_increment(value))
    seen = comb_outputs(m, [value], [out], [(v,) for v in range(1 << width)])
    assert seen == [((v + 1) % (1 << width),) for v in range(1 << width)]


def test_register_copies_are_kept():
    """Yosys keeps the register and its three copies apart (4 x 3 flip-flop bits)."""
    yosys = find_yosys(lambda version: True)
    m, start, step, count, outs = _copies_design()
    text = rtlil.convert(m, ports=[start, step, count, *outs])
    script = f"read_rtlil <<rtlil\n{text}\nrtlil\nproc\nopt\nopt_clean\nwrite_rtlil"
    netlist = yosys.run(["-q", "-"], script, ignore_warnings=True)
    widths = [int(w) for w in re.findall(r"parameter \\WIDTH (\d+)\n(?:(?!\n\s*end\n).)*?"
                                         r"connect \\Q", netlist, re.DOTALL)]
    assert sum(widths) == 12, netlist
    with pytest.raises(ValueError, match="copies must be 1 to 3, not 4"):
        RegisterCopies(1, name="x", copies=4)


def test_skid_buffer_ready_next_is_the_next_ready():
    """``ready_next``: in every cycle of a run with random stalls on both sides, the value
    ``i.ready`` has after the clock edge (and the buffer is full and empty at times)."""
    dut = SkidBuffer(8, ready_next=True)
    rng = np.random.default_rng(3)
    seen = []

    async def bench(ctx):
        pending = False
        for _ in range(400):
            pending = pending or rng.random() < 0.7
            ctx.set(dut.i.valid, pending)
            ctx.set(dut.o.ready, rng.random() < 0.4)
            _, _, ahead, ready = await ctx.tick().sample(dut.ready_next, dut.i.ready)
            pending = pending and not ready
            seen.append((ahead, ctx.get(dut.i.ready)))

    run_pysim(dut, bench)
    assert all(ahead == after for ahead, after in seen), seen
    assert {after for _, after in seen} == {0, 1}


def test_skid_buffer_reset_held():
    """``reset_held``: with a producer that drives 0 while not valid, the held fields read 0
    whenever ``o.valid`` is low, also in the cycles right after a reset that hit a held item
    (without it, the held item's payload stays on ``o``); the alternate field is left as it
    was."""
    layout = data.StructLayout({"low": 5, "wide": 8})
    for reset_held in (False, True):
        dut = SkidBuffer(layout, alternate=("wide",), reset_held=reset_held)
        top = Module()
        top.submodules.dut = dut
        top.domains.sync = domain = ClockDomain()
        seen = []

        async def bench(ctx):
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload.low, 21)
            ctx.set(dut.i.payload.wide, 200)
            ctx.set(dut.o.ready, 0)
            await ctx.tick().repeat(2)                  # held, and one more in the skid
            ctx.set(dut.i.valid, 0)
            ctx.set(dut.i.payload.low, 0)
            ctx.set(dut.i.payload.wide, 0)
            assert ctx.get(dut.o.valid) and ctx.get(dut.o.payload.low) == 21
            ctx.set(domain.rst, 1)
            await ctx.tick()
            ctx.set(domain.rst, 0)
            for _ in range(3):
                assert not ctx.get(dut.o.valid)
                seen.append(ctx.get(dut.o.payload.low))
                await ctx.tick()

        sim = Simulator(top)
        sim.add_clock(1e-6)
        sim.add_testbench(bench)
        sim.run()
        if reset_held:
            assert seen == [0, 0, 0]
        else:
            assert seen[0] == 21


def run_keep_pysim(dut, items, p, seed, *, emulate):
    """Items of ``{"keep": 1, "value": 8}`` through ``dut`` with random stalls: ``(kept items
    with the cycle each was taken, the cycle each item entered)``. ``emulate``: ``dut`` is a
    plain skid buffer and the consumer drops the items without ``keep`` itself, its ready
    ``ready | ~keep``."""
    rng = np.random.default_rng(seed)
    i_bits, o_bits = Value.cast(dut.i.payload), Value.cast(dut.o.payload)
    got, entered = [], []

    async def bench(ctx):
        cycle, sent = 0, 0
        while len(got) < sum(item & 1 for item in items):
            valid = sent < len(items) and not rng.random() < p
            ready = not rng.random() < p
            ctx.set(dut.i.valid, valid)
            ctx.set(i_bits, items[sent] if valid else 0)
            o_valid, payload = ctx.get(dut.o.valid), ctx.get(o_bits)
            if emulate and o_valid and not payload & 1:
                ready = True
            ctx.set(dut.o.ready, ready)
            if o_valid and ready and payload & 1:
                got.append((payload, cycle))
            if valid and ctx.get(dut.i.ready):
                entered.append(cycle)
                sent += 1
            await ctx.tick()
            cycle += 1
            assert cycle < 20 * len(items) + 100

    run_pysim(dut, bench)
    return got, entered


@pytest.mark.parametrize("alternate", [(), ("value",)])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.6])
def test_skid_buffer_keep_field(p, alternate):
    """Items without ``keep`` vanish at the output: the kept items come out in order, and
    every item enters and leaves in the same cycle as through a plain skid buffer whose
    consumer takes the unkept items at once (also with the value in alternate registers)."""
    layout = data.StructLayout({"keep": 1, "value": 8})
    rng = np.random.default_rng(9)
    items = [(value << 1) | int(rng.random() < 0.6) for value in range(1, 256)]
    plain = run_keep_pysim(SkidBuffer(layout), items, p, 6, emulate=True)
    keep = run_keep_pysim(SkidBuffer(layout, keep="keep", alternate=alternate), items, p, 6,
                          emulate=False)
    assert [value for value, _ in keep[0]] == [item for item in items if item & 1]
    assert keep == plain


def test_skid_buffer_alternate_needs_a_field():
    with pytest.raises(ValueError, match="no field 'data'"):
        SkidBuffer(data.StructLayout({"a": 4}), alternate=("data",))
    with pytest.raises(TypeError, match="StructLayout"):
        SkidBuffer(8, alternate=("data",))
    with pytest.raises(ValueError, match="group_flags is for group_bits groups"):
        SkidBuffer(data.StructLayout({"a": 4}), alternate=("a",), group_flags=True)
    with pytest.raises(ValueError, match="keep: field 'a' must be one bit wide"):
        SkidBuffer(data.StructLayout({"a": 4}), keep="a")
    with pytest.raises(ValueError, match="keep: field 'a' cannot also be an alternate field"):
        SkidBuffer(data.StructLayout({"a": 1}), keep="a", alternate=("a",))
    with pytest.raises(ValueError, match="keep and alternate need the skid buffer"):
        CreditPipeline(2, data.StructLayout({"a": 1}), skid=False, keep="a")


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim", simulator_params("verilator", "icarus"))
def test_skid_buffer_verilog(sim, stall):
    items = (np.arange(500, dtype=np.uint64) * 7919) % 4096
    result = simulate(SkidBuffer(12), "skid", "bench_passthrough", {"items": items}, sim=sim,
                      settings={"stall": stall, "seed": 3})
    assert list(result["items"]) == list(items)
    if stall == 0.0:
        assert result["cycles"] == len(items) + 2


class _TwoSkidBuffers(wiring.Component):
    """Two skid buffers in a row, each a module of its own inside the top."""

    def __init__(self):
        super().__init__({"i": In(stream.Signature(12)), "o": Out(stream.Signature(12))})

    def elaborate(self, platform):
        m = Module()
        first = m.submodules.first = SkidBuffer(12)
        second = m.submodules.second = SkidBuffer(12)
        wiring.connect(m, wiring.flipped(self.i), first.i)
        wiring.connect(m, first.o, second.i)
        wiring.connect(m, second.o, wiring.flipped(self.o))
        return m


def test_verilator_model_makes_only_the_top_public():
    # The cocotb benches drive and read the top's ports alone, so the Verilator model keeps
    # no symbol-table entries for the signals inside its submodules (every signal public
    # made moe_layer's model four times the C++); the bench still reaches every port.
    items = (np.arange(200, dtype=np.uint64) * 31) % 4096
    result = simulate(_TwoSkidBuffers(), "two_skids", "bench_passthrough", {"items": items},
                      sim="verilator", settings={"stall": 0.3, "seed": 5},
                      key="two skid buffers")
    assert list(result["items"]) == list(items)
    text, _, _ = _design(_TwoSkidBuffers(), "two skid buffers", "two_skids")    # emitted above
    _, build_dir = _build("verilator", text, "two_skids", None)
    symbols = "".join(path.read_text() for path in build_dir.glob("Vtop__Syms*.cpp"))
    assert 'varInsert("i__valid"' in symbols and 'varInsert("o__payload"' in symbols
    assert "two_skids.first" not in symbols and "two_skids.second" not in symbols
    # At one C++ level (the suite's -O0) the model is one compile, with no precompiled header.
    one = bool(_verilator_opt())
    assert (build_dir / "Vtop__ALL.o").is_file() == one
    assert bool(list(build_dir.glob("*.gch"))) == (not one)


def test_ring_groups_cover_the_payload():
    # Whole 4-bit RAM columns, at most one group per slot (the distinct XOR constants).
    for width, slots in [(1, 1), (7, 2), (163, 32), (559, 32), (559, 16), (600, 4)]:
        groups = ring_groups(width, slots)
        assert groups[0][0] == 0 and groups[-1][1] == width
        assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))
        assert all(start % 4 == 0 and stop > start for start, stop in groups)
        assert len(groups) <= slots
    assert len(ring_groups(163, 32)) == 6


@pytest.mark.parametrize("depth", [1, 5, 17])
def test_ring_queue_order_and_latency(depth):
    # A 200-bit ring (several pointer copies) under a writer that keeps at most ``depth``
    # entries in it and a consumer that stalls at random: every entry leaves in order, and
    # with the consumer ready an entry written in cycle c is on ``o`` in cycle c + LATENCY.
    dut = RingQueue(200, depth)
    rng = np.random.default_rng(depth)
    items = [int.from_bytes(rng.bytes(25), "little") for _ in range(400)]
    written, got = [], []

    async def bench(ctx):
        held, cycle = 0, 0
        while len(got) < len(items):
            stalls = cycle >= 150
            ready = not (stalls and rng.random() < 0.4)
            write = len(written) < len(items) and held < depth and rng.random() < 0.8
            ctx.set(dut.o.ready, ready)
            ctx.set(dut.w_en, write)
            ctx.set(dut.w_data, items[len(written)] if write else 0)
            if ctx.get(dut.o.valid) and ready:
                got.append((ctx.get(dut.o.payload), cycle))
            held += write - ctx.get(dut.read)
            if write:
                written.append(cycle)
            await ctx.tick()
            cycle += 1
            assert cycle < 5000

    run_pysim(dut, bench)
    assert [value for value, _ in got] == items
    for (_, out_cycle), in_cycle in zip(got, written):
        if out_cycle < 150:
            assert out_cycle == in_cycle + RingQueue.LATENCY


@pytest.mark.parametrize("skid,late_read", [(True, False), (False, False), (False, True)],
                         ids=["skid", "ring", "late-read"])
@pytest.mark.parametrize("latency", [1, 3])
def test_credit_pipeline_order_and_throughput(latency, skid, late_read):
    # A 40-bit datapath of ``latency`` free-running registers between take and payload, with
    # the queue's skid buffer or the bare ring on ``o`` (read in the take's cycle, or in the
    # cycle after it with ``late_read``): every item leaves in order; while the producer and
    # the consumer never wait, one item per cycle, each ``latency`` + the queue's latency
    # after its take; with random stalls later, no item is lost.
    m = Module()
    dut = m.submodules.dut = CreditPipeline(latency, 40, skid=skid, late_read=late_read)
    data = Signal(40)
    m.d.comb += dut.payload.eq(delay(m, data, latency, 1, name="datapath"))
    rng = np.random.default_rng(latency)
    items = [int.from_bytes(rng.bytes(5), "little") for _ in range(300)]
    taken, got = [], []

    async def bench(ctx):
        cycle = 0
        late = None                     # the cycle of a take whose payload is read now
        while len(got) < len(items):
            if late is not None:
                got.append((ctx.get(dut.o.payload), late))
                late = None
            stalls = cycle >= 100
            valid = len(taken) < len(items) and not (stalls and rng.random() < 0.3)
            ready = not (stalls and rng.random() < 0.4)
            ctx.set(dut.i_valid, valid)
            ctx.set(data, items[len(taken)] if valid else 0)
            ctx.set(dut.o.ready, ready)
            if ctx.get(dut.o.valid) and ready:
                if late_read:
                    late = cycle
                else:
                    got.append((ctx.get(dut.o.payload), cycle))
            if ctx.get(dut.take):
                taken.append(cycle)
            await ctx.tick()
            cycle += 1
            assert cycle < 5000

    run_pysim(m, bench)
    assert [value for value, _ in got] == items
    assert taken[:90] == list(range(taken[0], taken[0] + 90))
    for (_, out_cycle), in_cycle in zip(got[:80], taken):
        assert out_cycle == in_cycle + latency + dut.queue_latency


@pytest.mark.parametrize("late_count", [False, True], ids=["count", "late_count"])
@pytest.mark.parametrize("skid", [True, False], ids=["skid", "ring"])
def test_credit_pipeline_ready_ahead_flags(skid, late_count):
    # ``ready_ahead`` (i_ready decided as if an item were taken in every cycle): every item
    # leaves in order, ``busy`` is high while an item is inside and falls once all have
    # left, and (with the ring on ``o``, whose reads are the consumer's takes) ``i_ready`` is
    # in every cycle the credit rule on every take so far: the takes minus the reads of all
    # cycles before the last, plus one for a take in this cycle, below ``depth``. Random
    # stalls on both sides, then lone items, then a stretch with no stall.
    latency = 2
    m = Module()
    dut = m.submodules.dut = CreditPipeline(latency, 16, skid=skid, ready_ahead=True,
                                            late_count=late_count)
    data = Signal(16)
    m.d.comb += dut.payload.eq(delay(m, data, latency, 1, name="datapath"))
    rng = np.random.default_rng(7)
    sent, got = [], []

    async def bench(ctx):
        count, left, inside, expected_ready = 0, 0, 0, 0
        quiet = None
        for cycle in range(900):
            stalls = cycle < 400
            sparse = 400 <= cycle < 550 and cycle % 7 != 0   # lone items
            valid = cycle < 700 and not (stalls and rng.random() < 0.3) and not sparse
            ready = not (stalls and rng.random() < 0.5)
            ctx.set(dut.i_valid, valid)
            ctx.set(data, len(sent) & 0xFFFF)
            ctx.set(dut.o.ready, ready)
            assert skid or ctx.get(dut.i_ready) == expected_ready, cycle
            take = ctx.get(dut.take)
            read = ctx.get(dut.o.valid) and ready
            if take:
                sent.append(len(sent) & 0xFFFF)
            if read:
                got.append(ctx.get(dut.o.payload))
            expected_ready = int(count + 1 - left < dut.depth)
            count += take - left
            left = int(read)
            inside += take - read
            await ctx.tick()
            if take or inside:
                assert ctx.get(dut.busy), cycle
                quiet = None
            elif quiet is None:
                quiet = cycle
        assert quiet is not None and not ctx.get(dut.busy)

    run_pysim(m, bench)
    assert got == sent and len(sent) > 300


@pytest.mark.parametrize("skid", [True, False], ids=["skid", "ring"])
def test_credit_pipeline_late_count_same_flags(skid):
    # ``late_count`` (the count a cycle behind the takes) changes no flag: beside a
    # ``ready_ahead`` queue on the same stimulus, ``i_ready``, ``busy`` and ``o`` are equal
    # in every cycle, under random stalls on both sides, lone items and an idle stretch.
    latency = 3
    m = Module()
    duts = [CreditPipeline(latency, 16, skid=skid, ready_ahead=True, late_count=late)
            for late in (False, True)]
    valid, ready = Signal(), Signal()
    for n, dut in enumerate(duts):
        m.submodules[f"dut{n}"] = dut
        data = Signal(16, name=f"data{n}")
        m.d.sync += data.eq(data + dut.take)
        m.d.comb += [dut.i_valid.eq(valid), dut.o.ready.eq(ready),
                     dut.payload.eq(delay(m, data, latency, 1, name=f"datapath{n}"))]
    rng = np.random.default_rng(11)

    async def bench(ctx):
        busy_seen = 0
        for cycle in range(800):
            stalls = cycle < 400
            sparse = 400 <= cycle < 550 and cycle % 5 != 0
            ctx.set(valid, cycle < 650 and not sparse and not (stalls and rng.random() < 0.3))
            ctx.set(ready, not (stalls and rng.random() < 0.5))
            flags = [(ctx.get(d.i_ready), ctx.get(d.busy), ctx.get(d.o.valid),
                      ctx.get(d.o.valid) and ctx.get(d.o.payload)) for d in duts]
            assert flags[0] == flags[1], (cycle, flags)
            busy_seen += flags[0][1]
            await ctx.tick()
        assert busy_seen > 300 and not ctx.get(duts[1].busy)

    run_pysim(m, bench)


def test_credit_pipeline_late_read_needs_the_ring():
    with pytest.raises(ValueError, match="late_read is for a ring that drives the output"):
        CreditPipeline(2, 8, late_read=True)


def test_credit_pipeline_late_count_needs_ready_ahead():
    with pytest.raises(ValueError, match="late_count needs ready_ahead"):
        CreditPipeline(2, 8, late_count=True)


@pytest.mark.parametrize("depth", sorted({1, 2, 3, 5, RegisteredFIFO.THERMOMETER,
                                          RegisteredFIFO.THERMOMETER + 1, 40}))
def test_registered_fifo_matches_sync_fifo(depth):
    # Cycle for cycle the same as Amaranth's SyncFIFO under random writes and reads (both
    # sometimes asserted against a full or an empty FIFO): flags, level and head alike, with
    # the fill as a thermometer code and (deeper than THERMOMETER) as a binary count.
    m = Module()
    dut = m.submodules.dut = RegisteredFIFO(12, depth)
    ref = m.submodules.ref = SyncFIFO(width=12, depth=depth)
    rng = np.random.default_rng(depth)
    writes = 0

    async def bench(ctx):
        nonlocal writes
        for cycle in range(3000):
            # Phases: fill (reads rare), drain (writes rare), then both at random.
            p_write, p_read = [(0.9, 0.2), (0.2, 0.9), (0.6, 0.6)][cycle // 200 % 3]
            w_en, r_en = rng.random() < p_write, rng.random() < p_read
            w_data = int(rng.integers(1 << 12))
            for fifo in (dut, ref):
                ctx.set(fifo.w_en, w_en)
                ctx.set(fifo.w_data, w_data)
                ctx.set(fifo.r_en, r_en)
            assert ctx.get(dut.w_rdy) == ctx.get(ref.w_rdy), cycle
            assert ctx.get(dut.r_rdy) == ctx.get(ref.r_rdy), cycle
            assert ctx.get(dut.level) == ctx.get(ref.level), cycle
            if ctx.get(ref.r_rdy):
                assert ctx.get(dut.r_data) == ctx.get(ref.r_data), cycle
            writes += w_en and ctx.get(ref.w_rdy)
            await ctx.tick()

    run_pysim(m, bench)
    assert writes > 500
