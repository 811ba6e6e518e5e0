"""cocotb bench for the dispatch unit behind its AXI wrapper (``--set interface=axi``), driven
with cocotbext-axi: ``AxiLiteMaster`` programs the sizes and the base address and starts the
run, ``AxiStreamSource`` sends the headers (one frame each) and the token rows (one frame a
row, so ``tlast`` ends a row and ``tkeep`` trims its last beat), ``AxiRamWrite`` (the write
half of ``AxiRam``) holds the expert buffer, with its write response delayed by ``latency``
cycles. With ``stall`` > 0, every stream source and the RAM's AW and W channels pause at
random. A monitor records every AW and W handshake; the bench checks the bursts (INCR, at
most ``max_burst`` beats, ``wlast`` on each burst's last beat only, none crossing 4 KiB)
and records the element addresses each burst's strobes enable, and the memory image."""

import logging

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import (AxiLiteBus, AxiLiteMaster, AxiRamWrite, AxiStreamBus,
                           AxiStreamFrame, AxiStreamSource, AxiWriteBus)
from harness import Layout, Run, high


def pauses(p, seed):
    rng = np.random.default_rng(seed)
    while True:
        for value in rng.random(4096) < p:
            yield bool(value)


def delay_responses(ram, clock, latency):
    """Answer each write burst ``latency`` cycles after the RAM took it (in order)."""
    send = ram.b_channel.send
    ram.b_channel.queue_occupancy_limit = -1

    async def later(b):
        await ClockCycles(clock, latency)
        await send(b)

    async def delayed(b):
        cocotb.start_soon(later(b))

    ram.b_channel.send = delayed


class BusMonitor:
    """Every AW (address, length) and W (data, strobes, last) handshake, and the cycle."""

    def __init__(self, dut, prefix):
        self.dut, self.prefix = dut, prefix
        self.cycle = 0
        self.aw, self.w = [], []
        self.irq_cycle = None

    def sig(self, name):
        return getattr(self.dut, f"{self.prefix}_{name}")

    async def run(self):
        aw_valid, aw_ready = self.sig("awvalid"), self.sig("awready")
        w_valid, w_ready = self.sig("wvalid"), self.sig("wready")
        while True:
            await RisingEdge(self.dut.aclk)
            self.cycle += 1
            if high(aw_valid) and high(aw_ready):
                self.aw.append((self.sig("awaddr").value.to_unsigned(),
                                self.sig("awlen").value.to_unsigned(),
                                self.sig("awsize").value.to_unsigned(),
                                self.sig("awburst").value.to_unsigned()))
            if high(w_valid) and high(w_ready):
                self.w.append((self.sig("wdata").value.to_unsigned(),
                               self.sig("wstrb").value.to_unsigned(),
                               int(high(self.sig("wlast")))))
            if self.irq_cycle is None and high(self.dut.irq):
                self.irq_cycle = self.cycle


@cocotb.test()
async def dispatch_axi(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    hidden, pairs = s["hidden"], s["pairs"]
    reg = {r["name"]: r["offset"] for r in s["registers"]}
    bus = s["bus"]                              # "m_axi_dispatch"
    elem_bytes = width // 8
    base, size = s["base"], s["buffer_elements"] * elem_bytes

    header = Layout(s["header_layout"])
    header_bytes = s["header_bytes"]
    frames = [header.pack(gate=g, index=i, location=l).to_bytes(header_bytes, "little")
              for g, i, l in zip(st["gate"].tolist(), st["index"].tolist(),
                                 st["location"].tolist())]
    dtype = {16: "<u2", 32: "<u4"}[width]
    rows = [st["input"][row].astype(dtype).tobytes() for row in st["row"].tolist()]
    if not s["feed"]:
        frames, rows = [], []

    Clock(dut.aclk, 10, unit="ns").start(start_high=False)
    dut.aresetn.value = 0
    kwargs = dict(reset=dut.aresetn, reset_active_level=False)
    # The models log every burst and frame at INFO: warnings only.
    logging.getLogger(f"cocotb.{dut._name}").setLevel(logging.WARNING)
    axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.aclk, **kwargs)
    ram = AxiRamWrite(AxiWriteBus.from_prefix(dut, bus), dut.aclk, size=s["ram_size"],
                      **kwargs)
    headers = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_header"), dut.aclk,
                              **kwargs)
    data = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_data"), dut.aclk, **kwargs)
    delay_responses(ram, dut.aclk, s["latency"])
    if s["stall"] > 0:
        headers.set_pause_generator(pauses(s["stall"], s["seed"]))
        data.set_pause_generator(pauses(s["stall"], s["seed"] + 1))
        ram.aw_channel.set_pause_generator(pauses(s["stall"], s["seed"] + 2))
        ram.w_channel.set_pause_generator(pauses(s["stall"], s["seed"] + 3))
    # The buffer starts zeroed (as the golden model's output) inside a guard pattern.
    ram.write(0, b"\xa5" * s["ram_size"])
    ram.write(base, bytes(size))

    monitor = BusMonitor(dut, bus)
    cocotb.start_soon(monitor.run())
    for _ in range(4):
        await RisingEdge(dut.aclk)
    dut.aresetn.value = 1
    for _ in range(2):
        await RisingEdge(dut.aclk)

    info = await axil.read_dword(reg["INFO"])
    assert info == lanes | width << 8, f"INFO reads {info:#x}"
    for name in ("pairs", "hidden", "capacity", "num_experts"):
        await axil.write_dword(reg[name.upper()], s[name])
        got = await axil.read_dword(reg[name.upper()])
        assert got == s[name], f"{name} reads back {got}, not {s[name]}"
    await axil.write_dword(reg["DISPATCH_BASE"], base)
    for frame in frames:
        headers.send_nowait(AxiStreamFrame(frame))
    for row in rows:
        data.send_nowait(AxiStreamFrame(row))
    await axil.write_dword(reg["CTRL"], 0b10)           # irq_enable
    await axil.write_dword(reg["CTRL"], 0b11)           # irq_enable, start
    start = monitor.cycle
    limit = 40 * (pairs * -(-hidden // lanes) + pairs) + 2000
    while not high(dut.irq):
        await RisingEdge(dut.aclk)
        assert monitor.cycle - start < limit, f"no irq within {limit} cycles (hang?)"
    cycles = monitor.irq_cycle - start
    status = await axil.read_dword(reg["STATUS"])
    dropped = await axil.read_dword(reg["DROPPED"])
    assert headers.empty() and data.empty(), "a stream was not read to its end"
    await axil.write_dword(reg["IRQ"], 1)               # clear the interrupt
    for _ in range(4):
        await RisingEdge(dut.aclk)
    assert not high(dut.irq), "irq still high after IRQ.done was cleared"
    irq_after = await axil.read_dword(reg["IRQ"])

    # ---- bursts: INCR, lengths, wlast, 4 KiB, strobes -> element addresses ----------------
    bus_bytes = lanes * elem_bytes
    beats = iter(monitor.w)
    strobed = []
    for addr, length, awsize, burst in monitor.aw:
        assert burst == 1 and 1 << awsize == bus_bytes, f"burst {burst}, size {awsize}"
        assert length + 1 <= s["max_burst"], f"burst of {length + 1} beats"
        assert addr % bus_bytes == 0, f"unaligned burst at {addr:#x}"
        assert addr // 4096 == (addr + (length + 1) * bus_bytes - 1) // 4096, \
            f"burst at {addr:#x} of {length + 1} beats crosses a 4 KiB boundary"
        for beat in range(length + 1):
            word, strb, last = next(beats)
            assert last == (beat == length), f"wlast {last} on beat {beat} of {length + 1}"
            for lane in range(lanes):
                lane_strb = (strb >> (lane * elem_bytes)) & ((1 << elem_bytes) - 1)
                assert lane_strb in (0, (1 << elem_bytes) - 1), f"partial strobes {strb:#x}"
                if lane_strb:
                    byte = addr + beat * bus_bytes + lane * elem_bytes
                    strobed.append((byte - base) // elem_bytes)
    assert next(beats, None) is None, "W beats without a burst"

    memory = np.frombuffer(ram.read(base, size), dtype=dtype).astype(np.uint64)
    guard = ram.read(0, base) + ram.read(base + size, s["ram_size"] - base - size)
    run.save(memory=memory, cycles=cycles, status=status, dropped=dropped,
             strobed=np.array(strobed, dtype=np.int64), bursts=len(monitor.aw),
             burst_beats=np.array([a[1] + 1 for a in monitor.aw], dtype=np.int64),
             burst_addr=np.array([a[0] for a in monitor.aw], dtype=np.int64),
             guard_ok=int(guard == b"\xa5" * len(guard)), irq_after=irq_after)
