"""A bank of counters with one increment-and-read per cycle (SPEC 1.2's per-expert counters).

Used by the location generator (one counter per expert, the pair's location is the counter's
value before its increment) and by the sparse dispatcher (nonzeros per expert, then the rank of
each nonzero within its expert).

Interface (a one-stage pipeline with a global stall, to be driven like
:class:`~moe_hw.stream.PipelineControl` with latency 1):

``en`` (in)
    The pipeline advances this cycle: the request at the inputs enters, and the request in
    the stage leaves. While ``en`` is low everything holds (the request in the stage keeps its
    ``value`` and its increment is not repeated).
``valid``, ``index``, ``increment`` (in)
    A request: with ``increment`` high, counter ``index`` is read and incremented; with it
    low, the counter is only read (this is the read-out port: the same port, so that the bank
    is one simple-dual-port memory).
``value`` (out)
    The counter's value before the request's increment, in the cycle after the request entered
    and for as long as ``en`` stays low after that (latency 1).
``clear`` (in)
    Every counter reads 0 from the next request on, including a request entering in the same
    cycle. Assert it only when no incrementing request is in the stage. Reset clears too.

Throughput: one request per cycle, any sequence of indices. A request that hits the counter
the request in the stage is incrementing (back-to-back hits on one counter) takes the
forwarded sum instead of the memory's stale word, so a counter hit every cycle counts every
hit.

Hardware: the counters live in an ``amaranth.lib.memory`` simple-dual-port memory (LUT RAM or
block RAM: one synchronous read port, one write port); a ``count``-bit register of "live" flags
(a counter not written since the last clear reads 0) makes ``clear`` a one-cycle operation and
makes reset clear the bank without a walk over the memory.
"""

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from ..params import check_int

__all__ = ["CounterBank"]


class CounterBank(wiring.Component):
    """``count`` counters of ``width`` bits, one increment-and-read per cycle. See the module
    docstring for the protocol."""

    latency = 1

    def __init__(self, count, width):
        self.count = check_int("count", count, minimum=1, maximum=1 << 20)
        self.width = check_int("width", width, minimum=1, maximum=64)
        super().__init__({
            "en": In(1),
            "valid": In(1),
            "index": In(range(self.count)),
            "increment": In(1),
            "value": Out(self.width),
            "clear": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = mem = memory.Memory(shape=self.width, depth=self.count, init=[])
        read = mem.read_port(domain="sync")
        write = mem.write_port()
        live = Signal(self.count)          # counter written since the last clear

        # The request in the stage.
        busy = Signal()                    # a request is in the stage
        stage_inc = Signal()
        stage_index = Signal.like(self.index)
        hit = Signal()                     # it read the counter its predecessor incremented
        forwarded = Signal(self.width)     # ... whose new value is this
        was_live = Signal()

        m.d.comb += self.value.eq(Mux(hit, forwarded,
                                      Mux(was_live, read.data, Const(0, self.width))))
        incrementing = busy & stage_inc
        m.d.comb += [
            read.addr.eq(self.index),
            read.en.eq(self.en),
            # Written every cycle the request sits in the stage: the same word each time,
            # because ``value`` holds while ``en`` is low.
            write.addr.eq(stage_index),
            write.data.eq(self.value + 1),
            write.en.eq(incrementing),
        ]
        with m.If(incrementing):
            m.d.sync += live.bit_select(stage_index, 1).eq(1)
        with m.If(self.en):
            m.d.sync += [
                busy.eq(self.valid),
                stage_inc.eq(self.increment),
                stage_index.eq(self.index),
                hit.eq(incrementing & (stage_index == self.index) & ~self.clear),
                forwarded.eq(self.value + 1),
                was_live.eq(live.bit_select(self.index, 1) & ~self.clear),
            ]
        with m.If(self.clear):
            m.d.sync += live.eq(0)
        return m
