"""The AXI wrapper's blocks in Amaranth's simulator: the AXI4-Lite register file (every
access kind, byte strobes, unmapped offsets), the AXI4-Stream output adapter (tlast, tkeep
on a row's last beat, order under random pauses) and the input adapter (tkeep zeroes bytes,
a wrong tlast is flagged), and the write realigner (unaligned beats onto bus words, nothing
lost or duplicated). dispatch's whole wrapper runs under cocotb in test_dispatch_axi.py."""

import numpy as np
import pytest
from amaranth.hdl import Value
from amaranth.lib import data
from amaranth.utils import exact_log2

from moe_hw.axi import (AxiLiteRegisters, AxisToStream, Field, Register, StreamToAxis,
                        WriteRealign)
from moe_hw.axi.registers import layout_registers

from conftest import STALLS, run_pysim


REGISTERS = [
    Register("CTRL", (Field("go", access="w1p"), Field("mode", 3, bit=4, value=5))),
    Register("STATUS", (Field("level", 12, "ro"), Field("ident", 8, "const", bit=16,
                                                          value=0xA7))),
    Register("IRQ", (Field("flag", access="w1c"),)),
    Register("SIZE", (Field("size", 20),), offset=0x20),
]


async def axil_write(ctx, dut, addr, value, strb=0xF):
    p = lambda name: getattr(dut, f"s_axil_{name}")     # noqa: E731
    ctx.set(p("awaddr"), addr)
    ctx.set(p("wdata"), value)
    ctx.set(p("wstrb"), strb)
    ctx.set(p("awvalid"), 1)
    ctx.set(p("wvalid"), 1)
    ctx.set(p("bready"), 1)
    await ctx.tick().until(p("awready"))
    ctx.set(p("awvalid"), 0)
    ctx.set(p("wvalid"), 0)
    await ctx.tick().until(p("bvalid"))


async def axil_read(ctx, dut, addr):
    p = lambda name: getattr(dut, f"s_axil_{name}")     # noqa: E731
    ctx.set(p("araddr"), addr)
    ctx.set(p("arvalid"), 1)
    ctx.set(p("rready"), 1)
    await ctx.tick().until(p("arready"))
    ctx.set(p("arvalid"), 0)
    *_, data_ = await ctx.tick().sample(p("rdata")).until(p("rvalid"))
    return data_


def test_register_file():
    dut = AxiLiteRegisters(REGISTERS)

    async def bench(ctx):
        ctx.set(dut.level, 0x123)
        assert await axil_read(ctx, dut, 0x0) == 5 << 4            # rw reset value
        assert await axil_read(ctx, dut, 0x4) == 0xA7 << 16 | 0x123
        await axil_write(ctx, dut, 0x0, 0x31)                      # go, mode = 3
        # A write lands at the end of the cycle bvalid rises in, so go pulses in the next,
        # the one axil_write returns in (it waits for the clock edge that ends a cycle with
        # bvalid high): one cycle later than a write landing at its handshake would.
        assert (ctx.get(dut.go), ctx.get(dut.mode)) == (1, 3)
        await ctx.tick()
        assert ctx.get(dut.go) == 0
        assert await axil_read(ctx, dut, 0x0) == 3 << 4            # go reads 0
        assert ctx.get(dut.mode) == 3
        await axil_write(ctx, dut, 0x20, 0xABCDE, strb=0b0001)     # low byte only
        assert ctx.get(dut.size) == 0xDE
        await axil_write(ctx, dut, 0x20, 0xABCDE, strb=0b0110)
        assert await axil_read(ctx, dut, 0x20) == 0xABCDE
        await axil_write(ctx, dut, 0x4, 0xFFFFFFFF)                # ro: ignored
        assert await axil_read(ctx, dut, 0x4) == 0xA7 << 16 | 0x123
        assert await axil_read(ctx, dut, 0x10) == 0                # unmapped
        ctx.set(dut.flag_set, 1)
        await ctx.tick()
        ctx.set(dut.flag_set, 0)
        assert await axil_read(ctx, dut, 0x8) == 1
        await axil_write(ctx, dut, 0x8, 0)                         # writing 0 keeps it
        assert await axil_read(ctx, dut, 0x8) == 1
        await axil_write(ctx, dut, 0x8, 1)
        assert await axil_read(ctx, dut, 0x8) == 0
        done.append(True)

    done = []
    run_pysim(dut, bench)
    assert done, "the bench did not run to its end"


def test_register_map_errors():
    with pytest.raises(ValueError, match="access of field 'x' must be one of"):
        Field("x", access="wo")
    with pytest.raises(ValueError, match="field 'a' overlaps another field of R"):
        layout_registers([Register("R", (Field("b", 4), Field("a", 2, bit=3)))])
    with pytest.raises(ValueError, match="register S cannot sit at offset 0x0"):
        layout_registers([Register("R", (Field("a"),)), Register("S", (Field("b"),),
                                                                offset=0)])


LANES = 4
ROW = data.StructLayout({"data": data.ArrayLayout(8, LANES)})


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("hidden", [1, 4, 7, 9])
def test_stream_to_axis_rows(hidden, stall):
    """Rows of ``hidden`` bytes, 4 lanes: tlast on each row's last beat, tkeep its bytes."""
    dut = StreamToAxis("m_axis_out", ROW, rows=LANES, row_beats_width=8)
    beats_per_row = -(-hidden // LANES)
    rows = 5
    items = list(range(1, rows * beats_per_row + 1))
    rng = np.random.default_rng(hidden)
    got = []

    async def producer(ctx):
        ctx.set(dut.row_beats, beats_per_row)
        ctx.set(dut.last_lanes, hidden - (beats_per_row - 1) * LANES)
        await ctx.tick().repeat(2)
        for item in items:
            while rng.random() < stall:
                await ctx.tick()
            ctx.set(Value.cast(dut.i.payload), item)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        for _ in range(40 * len(items)):
            ready = not rng.random() < stall
            ctx.set(dut.m_axis_out_tready, ready)
            _, _, valid, tdata, tkeep, tlast = await ctx.tick().sample(
                dut.m_axis_out_tvalid, dut.m_axis_out_tdata, dut.m_axis_out_tkeep,
                dut.m_axis_out_tlast)
            if valid and ready:
                got.append((tdata, tkeep, tlast))
            if len(got) == len(items):
                return

    run_pysim(dut, producer, consumer)
    last_keep = (1 << (hidden - (beats_per_row - 1) * LANES)) - 1
    want = [(item, last_keep if (n + 1) % beats_per_row == 0 else 0xF,
             int((n + 1) % beats_per_row == 0)) for n, item in enumerate(items)]
    assert got == want


def test_axis_to_stream_keep_and_tlast_error():
    dut = AxisToStream("s_axis_in", ROW, rows=LANES, row_beats_width=8)
    beats = [(0x44332211, 0xF, 0), (0x88776655, 0x3, 1),      # a row of 2 beats
             (0x11111111, 0xF, 1),                               # tlast one beat early
             (0x22222222, 0xF, 0)]
    got, errors = [], []

    async def producer(ctx):
        ctx.set(dut.row_beats, 2)
        ctx.set(dut.o.ready, 1)
        for tdata, tkeep, tlast in beats:
            ctx.set(dut.s_axis_in_tdata, tdata)
            ctx.set(dut.s_axis_in_tkeep, tkeep)
            ctx.set(dut.s_axis_in_tlast, tlast)
            ctx.set(dut.s_axis_in_tvalid, 1)
            await ctx.tick().until(dut.s_axis_in_tready)
        ctx.set(dut.s_axis_in_tvalid, 0)

    async def consumer(ctx):
        for _ in range(20):
            _, _, valid, payload, error = await ctx.tick().sample(
                dut.o.valid, Value.cast(dut.o.payload), dut.tlast_error)
            if valid:
                got.append(payload)
            errors.append(error)

    run_pysim(dut, producer, consumer)
    assert got == [0x44332211, 0x00006655, 0x11111111, 0x22222222]
    # The count follows row_beats, not tlast: the early tlast is flagged, and so is the beat
    # after it (the row's last by the count, without tlast).
    assert [n for n, error in enumerate(errors) if error] == [4, 5]


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_write_realign(lanes):
    """Beats at every offset, runs of consecutive beats and lone beats, some lanes off: the
    words out enable exactly the elements the beats enable, each with its value, once (at 4
    lanes one rotation stage, at 8 and 16 two)."""
    layout = data.StructLayout({"addr": 12, "data": data.ArrayLayout(8, lanes),
                                "enable": lanes})
    dut = WriteRealign(layout)
    rng = np.random.default_rng(1)
    beats, addr = [], 5
    for _ in range(60):
        if rng.random() < 0.3:
            addr = int(rng.integers(0, 200))
        enable = (1 << lanes) - 1 if rng.random() < 0.7 else int(rng.integers(0, 1 << lanes))
        beats.append((addr, [int(v) for v in rng.integers(0, 256, lanes)], enable))
        addr += lanes
    want = [(a + lane, v[lane]) for a, v, e in beats for lane in range(lanes) if e >> lane & 1]
    got = []

    async def producer(ctx):
        for addr, values, enable in beats:
            while rng.random() < 0.3:
                await ctx.tick()
            ctx.set(dut.i.payload.addr, addr)
            ctx.set(Value.cast(dut.i.payload.data), sum(v << (8 * n) for n, v in
                                                        enumerate(values)))
            ctx.set(dut.i.payload.enable, enable)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        stalls = np.random.default_rng(2)
        for _ in range(900):
            ctx.set(dut.o.ready, stalls.random() >= 0.3)
            _, _, valid, ready, word, bits, strb = await ctx.tick().sample(
                dut.o.valid, dut.o.ready, dut.o.payload.word, dut.o.payload.data,
                dut.o.payload.strb)
            if valid and ready:
                got.extend((word * lanes + lane, bits >> (8 * lane) & 0xFF)
                           for lane in range(lanes) if strb >> lane & 1)

    run_pysim(dut, producer, consumer)
    assert got == want


@pytest.mark.parametrize("lanes", [4, 16])
def test_write_realign_latency_and_rate(lanes):
    """Stall-free, aligned consecutive beats leave one word per cycle, the first
    ``latency`` cycles after its beat was taken."""
    layout = data.StructLayout({"addr": 12, "data": data.ArrayLayout(8, lanes),
                                "enable": lanes})
    dut = WriteRealign(layout)
    count = 40
    taken, out = [], []

    async def bench(ctx):
        ctx.set(dut.i.payload.enable, (1 << lanes) - 1)
        ctx.set(dut.o.ready, 1)
        n = 0
        for cycle in range(count + 20):
            ctx.set(dut.i.payload.addr, lanes * n)
            ctx.set(dut.i.valid, n < count)
            _, _, take, valid, word = await ctx.tick().sample(
                dut.i.valid & dut.i.ready, dut.o.valid, dut.o.payload.word)
            if take:
                taken.append(cycle)
                n += 1
            if valid:
                out.append((cycle, word))

    run_pysim(dut, bench)
    assert len(taken) == count and taken == list(range(taken[0], taken[0] + count))
    assert [word for _, word in out] == list(range(count))
    # the beat taken at the end of cycle c is a word on o from cycle c + latency
    assert [cycle for cycle, _ in out] == [taken[0] + dut.latency + n for n in range(count)]


def read_master_bench(dut, requests, memory, *, stall, seed, latency, error_burst=None):
    """Drive ``requests`` (element address, lane enables) into an AxiReadMaster of 8-bit
    elements, answer its AR/R channels from ``memory`` (one byte per element) after
    ``latency`` cycles with random pauses, and return (responses, bursts, bus_error cycles)."""
    rng = np.random.default_rng(seed)
    lanes, p = dut.lanes, lambda name: getattr(dut, f"m_axi_t_{name}")     # noqa: E731
    responses, bursts, errors, beats = [], [], [], []

    async def producer(ctx):
        for addr, enable in requests:
            while rng.random() < stall:
                await ctx.tick()
            ctx.set(dut.request.payload.addr, addr)
            ctx.set(dut.request.payload.enable, enable)
            ctx.set(dut.request.valid, 1)
            await ctx.tick().until(dut.request.ready)
            ctx.set(dut.request.valid, 0)

    async def memory_side(ctx):
        cycle = 0
        for _ in range(60 * len(requests) + 400):
            ctx.set(p("arready"), int(not rng.random() < stall))
            # R: the oldest due beat, unless paused
            due = beats and beats[0][0] <= cycle and not rng.random() < stall
            if due:
                _, word, last, resp = beats[0]
                ctx.set(p("rdata"), sum(int(memory[word * lanes + n]) << (8 * n)
                                        for n in range(lanes)))
                ctx.set(p("rlast"), last)
                ctx.set(p("rresp"), resp)
            ctx.set(p("rvalid"), int(bool(due)))
            _, _, arvalid, arready, addr, length, size, burst, error = await ctx.tick().sample(
                p("arvalid"), p("arready"), p("araddr"), p("arlen"), p("arsize"),
                p("arburst"), dut.bus_error)
            cycle += 1
            if due:
                beats.pop(0)
            if error:
                errors.append(cycle)
            if arvalid and arready:
                assert size == exact_log2(lanes) and burst == 1
                bursts.append((addr, length + 1))
                start = max([cycle + latency] + [b[0] + 1 for b in beats[-1:]])
                resp = 2 if len(bursts) - 1 == error_burst else 0
                for n in range(length + 1):
                    beats.append((start + n, addr // lanes + n, int(n == length), resp))

    async def consumer(ctx):
        for _ in range(60 * len(requests) + 400):
            ready = not rng.random() < stall
            ctx.set(dut.response.ready, ready)
            _, _, valid, value = await ctx.tick().sample(dut.response.valid,
                                                         Value.cast(dut.response.payload))
            if valid and ready:
                responses.append(value)
            if len(responses) == len(requests):
                return

    run_pysim(dut, producer, memory_side, consumer)
    return responses, bursts, errors


def read_requests(rng, lanes, count):
    """Rows of random length at random element addresses read beat by beat (the row reader's
    requests: the last beat of a row with its partial enables), some rows back to back."""
    # First a run of whole beats that crosses the 4 KiB boundary at byte 4096.
    requests, addr = [(4096 - 10 * lanes + n * lanes, (1 << lanes) - 1) for n in range(20)], 4001
    while len(requests) < count:
        hidden = int(rng.integers(1, 4 * lanes))
        if rng.random() < 0.5:
            addr = int(rng.integers(0, 8000))
        for b in range(-(-hidden // lanes)):
            left = min(lanes, hidden - b * lanes)
            requests.append((addr + b * lanes, (1 << left) - 1))
        addr += hidden
    return requests


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("lanes", [4, 16])
def test_read_master(lanes, stall):
    """Unaligned and aligned rows, runs that cross 4 KiB pages: every response is the
    memory at its request's address (enabled lanes), bursts are within max_burst and
    4 KiB, none reads past what the requests need. At 16 lanes the rotation back into the
    response's lane order takes two registered stages."""
    from moe_hw.axi import AxiReadMaster
    from moe_hw.blocks.row_reader import request_layout, response_layout
    dut = AxiReadMaster("m_axi_t", request_layout(lanes, 14), response_layout(lanes, 8),
                        max_burst=8, outstanding=3, fifo_depth=16)
    rng = np.random.default_rng(5)
    memory = rng.integers(0, 256, 1 << 14, dtype=np.uint8)
    requests = read_requests(rng, lanes, 150)
    got, bursts, errors = read_master_bench(dut, requests, memory, stall=stall, seed=2,
                                            latency=7)
    assert errors == []
    assert len(got) == len(requests)
    for (addr, enable), value in zip(requests, got):
        for n in range(lanes):
            if enable >> n & 1:
                assert value >> (8 * n) & 0xFF == memory[addr + n], (addr, n)
    needed = {(addr + n) // lanes for addr, enable in requests for n in range(lanes)
              if enable >> n & 1}
    read = [addr // lanes + n for addr, length in bursts for n in range(length)]
    assert set(read) == needed
    assert all(length <= 8 and addr // 4096 == (addr + length * lanes - 1) // 4096
               for addr, length in bursts)
    assert any((addr + length * lanes) % 4096 == 0 for addr, length in bursts), \
        "no burst ends at a page boundary"
    # An aligned run reads each word once; unaligned runs cost one word each beyond theirs.
    assert len(read) < 1.5 * len(requests)


def test_read_master_bus_error():
    from moe_hw.axi import AxiReadMaster
    from moe_hw.blocks.row_reader import request_layout, response_layout
    dut = AxiReadMaster("m_axi_t", request_layout(4, 12), response_layout(4, 8),
                        max_burst=4, outstanding=2, fifo_depth=8)
    memory = np.arange(1 << 12, dtype=np.int64) & 0xFF
    requests = [(4 * n, 0xF) for n in range(12)]
    got, bursts, errors = read_master_bench(dut, requests, memory, stall=0.0, seed=1,
                                            latency=3, error_burst=1)
    assert len(bursts) == 3 and len(errors) == 4            # the second burst's 4 beats
    assert got == [sum(((4 * n + k) & 0xFF) << (8 * k) for k in range(4)) for n in range(12)]
    with pytest.raises(ValueError, match=r"fifo_depth \(4\) must hold a whole burst"):
        AxiReadMaster("m_axi_t", request_layout(4, 12), response_layout(4, 8), max_burst=8,
                      fifo_depth=4)


def test_row_beat_count_holds_the_longest_row():
    """A row stream counts a row's beats in as many bits as the largest row its size register
    can hold needs (``ceil(size / lanes)`` at the register's all-ones value), not more: the
    count is as wide as the register allows and never wraps inside a row."""
    from moe_hw.axi.wrapper import _lanes_of
    from moe_hw.registry import units
    checked = []
    for name, unit in units().items():
        if name in ("fmul", "fadd"):
            continue
        wrapper = unit.build_axi(unit.make_params({}, interface="axi"))
        wrapper._MustUse__silence = wrapper.unit._MustUse__silence = True
        widths = {f["name"]: f["width"] for r in wrapper.register_map() for f in r["fields"]}
        for port, size in wrapper.rows.items():
            lanes = _lanes_of(wrapper._shape(port))[0]
            bits = wrapper._row_beats_width(port, lanes)
            longest = -(-((1 << widths[size]) - 1) // lanes)
            assert longest < 1 << bits <= 2 * longest, (name, port, bits, longest)
            checked.append(name)
    assert {"dispatch", "combine_gather", "dispatch_backward_data"} <= set(checked)


def test_every_unit_with_run_control_wraps():
    """Every unit with run control goes behind the wrapper: each run-time size is an rw
    register, a memory read or write port an AXI4 master with its base address register;
    a unit without run control (the float blocks) gets one line saying so."""
    from moe_hw.registry import units
    wrapped = []
    for name, unit in units().items():
        params = unit.make_params({}, interface="axi")
        if name in ("fmul", "fadd"):
            with pytest.raises(ValueError, match=f"unit {name} has no 'start' port"):
                unit.build_axi(params)
            continue
        wrapper = unit.build_axi(params)
        wrapper._MustUse__silence = wrapper.unit._MustUse__silence = True
        fields = {f["name"]: f["access"] for r in wrapper.register_map() for f in r["fields"]}
        for size in wrapper.unit.sizes:
            assert fields.get(size) == "rw", (name, size)
        masters = [bus["port"] for bus in wrapper.buses() if bus["kind"] == "axi4"]
        assert sorted(masters) == sorted(wrapper.reads + wrapper.writes), name
        for port in masters:
            assert fields.get(f"{wrapper.names.get(port, port)}_base") == "rw", (name, port)
        wrapped.append(name)
    assert {"dispatch", "locations", "sparse_index", "combine_gather", "moe_re_routing",
            "moe_layer", "expand_backward", "scan_layers"} <= set(wrapped)
