"""What the AXI benches share (``bench_*_axi.py``): pause generators for cocotbext-axi's
channels, a memory's write responses and read data delayed by a fixed latency, a monitor
of an AXI4 master's bursts, the reset and the AXI-Lite set-up of a wrapped unit, and the
checks every burst must pass (INCR, the bus size, at most ``max_burst`` beats, aligned, no
4 KiB crossing)."""

import logging

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiStreamBus
from harness import high


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


def delay_reads(ram, clock, latency, monitor):
    """A read burst's data starts ``latency`` cycles after its AR handshake (``monitor``
    records them): the memory is pipelined, so bursts in flight overlap their latencies."""
    send = ram.r_channel.send
    burst = [0]

    async def delayed(r):
        n = burst[0]
        while len(monitor.ar) <= n or monitor.cycle < monitor.ar_cycles[n] + latency:
            await RisingEdge(clock)
        await send(r)
        if r.rlast:
            burst[0] += 1

    ram.r_channel.send = delayed


class BusMonitor:
    """Every AW (address, length, size, burst) and W (data, strobes, last) handshake of an
    AXI4 master ``prefix`` (``writes``), every AR and the cycle of each (``reads``), the
    cycle count and the cycle ``irq`` first rose."""

    def __init__(self, dut, prefix, *, writes=True, reads=False):
        self.dut, self.prefix = dut, prefix
        self.writes, self.reads = writes, reads
        self.cycle = 0
        self.aw, self.w, self.ar, self.ar_cycles = [], [], [], []
        self.irq_cycle = None

    def sig(self, name):
        return getattr(self.dut, f"{self.prefix}_{name}")

    def _address(self, channel):
        return tuple(self.sig(f"{channel}{name}").value.to_unsigned()
                     for name in ("addr", "len", "size", "burst"))

    async def run(self):
        while True:
            await RisingEdge(self.dut.aclk)
            self.cycle += 1
            if self.writes:
                if high(self.sig("awvalid")) and high(self.sig("awready")):
                    self.aw.append(self._address("aw"))
                if high(self.sig("wvalid")) and high(self.sig("wready")):
                    self.w.append((self.sig("wdata").value.to_unsigned(),
                                   self.sig("wstrb").value.to_unsigned(),
                                   int(high(self.sig("wlast")))))
            if self.reads and high(self.sig("arvalid")) and high(self.sig("arready")):
                self.ar.append(self._address("ar"))
                self.ar_cycles.append(self.cycle)
            if self.irq_cycle is None and high(self.dut.irq):
                self.irq_cycle = self.cycle


def check_bursts(bursts, bus_bytes, max_burst):
    """Every burst (address, length, size, burst) is INCR of the bus's size, at most
    ``max_burst`` beats, aligned, within one 4 KiB page."""
    for addr, length, size, burst in bursts:
        assert burst == 1 and 1 << size == bus_bytes, f"burst {burst}, size {size}"
        assert length + 1 <= max_burst, f"burst of {length + 1} beats"
        assert addr % bus_bytes == 0, f"unaligned burst at {addr:#x}"
        assert addr // 4096 == (addr + (length + 1) * bus_bytes - 1) // 4096, \
            f"burst at {addr:#x} of {length + 1} beats crosses a 4 KiB boundary"


def begin(dut):
    """Start the clock of a wrapped unit and hold it in reset (the models are built next, so
    that they drive the bus from the first cycle); returns an ``AxiLiteMaster``."""
    Clock(dut.aclk, 10, unit="ns").start(start_high=False)
    dut.aresetn.value = 0
    # The models log every burst and frame at INFO: warnings only.
    logging.getLogger(f"cocotb.{dut._name}").setLevel(logging.WARNING)
    return AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.aclk, **reset_of(dut))


async def release(dut, monitors):
    """Start ``monitors``, then take the wrapped unit out of reset."""
    for monitor in monitors:
        cocotb.start_soon(monitor.run())
    for _ in range(4):
        await RisingEdge(dut.aclk)
    dut.aresetn.value = 1
    for _ in range(2):
        await RisingEdge(dut.aclk)


def reset_of(dut):
    """The keyword arguments that tie a cocotbext-axi model to the wrapper's reset."""
    return dict(reset=dut.aresetn, reset_active_level=False)


async def program(axil, reg, values):
    """Write each register ``values[name]`` (``reg``: name -> offset) and read it back."""
    for name, value in values.items():
        await axil.write_dword(reg[name.upper()], value)
        got = await axil.read_dword(reg[name.upper()])
        assert got == value, f"{name} reads back {got}, not {value}"


async def run_to_irq(dut, axil, reg, monitor, limit):
    """Start the run (``irq_enable`` too), wait for ``irq``; returns the cycles from the
    start write to ``irq``, ``STATUS`` and ``IRQ`` after it was cleared, and checks that
    ``irq`` falls when it is."""
    await axil.write_dword(reg["CTRL"], 0b10)           # irq_enable
    await axil.write_dword(reg["CTRL"], 0b11)           # irq_enable, start
    start = monitor.cycle
    while not high(dut.irq):
        await RisingEdge(dut.aclk)
        assert monitor.cycle - start < limit, f"no irq within {limit} cycles (hang?)"
    cycles = monitor.irq_cycle - start
    status = await axil.read_dword(reg["STATUS"])
    await axil.write_dword(reg["IRQ"], 1)               # clear the interrupt
    for _ in range(4):
        await RisingEdge(dut.aclk)
    assert not high(dut.irq), "irq still high after IRQ.done was cleared"
    irq_after = await axil.read_dword(reg["IRQ"])
    return cycles, status, irq_after


class ItemBus(AxiStreamBus):
    """An AXI4-Stream seen without ``tlast`` and ``tkeep``: a sink on it takes every beat as a
    frame of its own (a stream of items, such as counts, whose ``tlast`` is always 0)."""

    _optional_signals = ["tvalid", "tready"]


def take_items(sink, layout=None, name=None):
    """Every beat a sink on an :class:`ItemBus` took, as integers (or their field ``name``
    of ``layout``)."""
    items = []
    while not sink.empty():
        word = int.from_bytes(bytes(sink.recv_nowait().tdata), "little")
        items.append(word if layout is None else layout.unpack(word, name))
    return items
