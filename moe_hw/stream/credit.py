"""A free-running pipeline with a credit-counted output queue: the wide datapath never stalls.

:class:`~moe_hw.stream.PipelineControl` stalls a pipeline with one enable that reaches every
register of it. At 8 or 16 float lanes that is thousands of clock enables on one net, driven
from the consumer's ``ready``: the net's routing alone is longer than a clock period at 250 MHz.

:class:`CreditPipeline` never stalls its pipeline. The datapath's registers load every
cycle (``en`` is constant 1; bubbles travel as invalid items) and every item that leaves it is
written into a queue (a ring in distributed RAM, first-word fall-through, whose write
enable is a register: the credits guarantee room), which feeds a
:class:`~moe_hw.stream.SkidBuffer`: the queue's read enable
is the skid buffer's registered ``ready``, so the consumer's ``ready`` reaches only the skid
buffer's output register. An
item may enter only when the queue is sure to have room for it when it arrives: the block
counts the items in the pipeline and the queue (its credits), and ``i_ready`` is a register,
high while fewer than ``depth`` items are counted. With ``depth = latency + 3`` the input
never waits while the consumer takes one item per cycle, so the stream runs at one item per
cycle; a consumer stall of n cycles stops the input after at most ``depth + 2`` items and
costs n cycles.

Ports:

``i_valid`` (in), ``i_ready`` (out, a register)
    An item enters the pipeline in a cycle both are high (``take``).
``take`` (out)
    ``i_valid & i_ready``: the unit's datapath registers its inputs this cycle.
``payload`` (in)
    The datapath's output, ``latency`` cycles after its item's ``take``.
``o`` (out stream)
    The items, in order; ``payload`` as it was ``latency`` cycles after each ``take``.
``busy`` (out, a register)
    An item is in the pipeline or in the queue; it falls two cycles after the last item
    has left ``o``.

Latency, stall-free: ``latency`` (the datapath) + 2 (the queue's write, the skid buffer's
output register) cycles from ``take`` to ``o.valid``.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .pipeline import delay
from .skid import SkidBuffer

__all__ = ["CreditPipeline"]


class CreditPipeline(wiring.Component):
    """See the module docstring. ``latency``: the datapath's cycles from ``take`` to
    ``payload``; ``shape``: the payload's shape; ``depth``: the queue's, at least
    ``latency + 3`` for one item per cycle (the default)."""

    #: Cycles the queue adds from the datapath's output to ``o.valid``.
    QUEUE_LATENCY = 2
    #: Cycles from the last item leaving ``o`` to ``busy`` low, beyond the one of a
    #: combinational flag (``busy`` is a register).
    IDLE_LATENCY = 1

    def __init__(self, latency, shape, *, depth=None):
        if not isinstance(latency, int) or latency < 0:
            raise ValueError(f"latency must be a non-negative integer, not {latency!r}")
        self.latency = latency
        self.depth = latency + 3 if depth is None else depth
        if self.depth < 2:
            raise ValueError(f"depth must be at least 2, not {self.depth!r}")
        super().__init__({
            "i_valid": In(1), "i_ready": Out(1), "take": Out(1),
            "payload": In(shape),
            "o": Out(stream.Signature(shape)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        out = m.submodules.out = SkidBuffer(self.payload.shape())
        m.d.comb += self.take.eq(self.i_valid & self.i_ready)
        arrives = delay(m, self.take, self.latency, 1, name="arrives")

        # The queue: a distributed-RAM ring written straight from the pipeline (the credits
        # guarantee room, so the write enable is the ``arrives`` register itself) and read
        # into the skid buffer whenever it has room (its ``ready`` is a register too).
        slots = 1 << ceil_log2(self.depth)
        storage = m.submodules.queue = memory.Memory(
            shape=len(self.payload.as_value()), depth=slots, init=[])
        w_port = storage.write_port()
        r_port = storage.read_port(domain="comb")
        w_ptr = Signal(range(slots), name="w_ptr")
        r_ptr = Signal(range(slots), name="r_ptr")
        items = Signal(range(slots + 1), name="items")
        ready = Signal(name="queue_ready")        # the queue holds an item
        reads = ready & out.i.ready
        m.d.comb += [
            w_port.addr.eq(w_ptr), w_port.data.eq(self.payload.as_value()),
            w_port.en.eq(arrives),
            r_port.addr.eq(r_ptr),
            out.i.valid.eq(ready), out.i.payload.eq(r_port.data),
        ]
        with m.If(arrives):
            m.d.sync += w_ptr.eq(w_ptr + 1)
        with m.If(reads):
            m.d.sync += r_ptr.eq(r_ptr + 1)
        fills = arrives & ~reads
        drains = ~arrives & reads
        m.d.sync += [
            items.eq(Mux(fills, items + 1, Mux(drains, items - 1, items))),
            ready.eq(Mux(fills, 1, Mux(drains, items > 1, items != 0))),
        ]
        wiring.connect(m, out.o, wiring.flipped(self.o))
        # The credits: items taken and not yet out of the queue. An item that leaves the
        # queue is subtracted a cycle later (the count is then one too high for a cycle,
        # never too low), and the next ``i_ready`` is a choice between two compares of the
        # count register, so that no carry chain sits between the handshakes and ``i_ready``.
        left = delay(m, reads, 1, 1, name="left")
        count = Signal(range(self.depth + 2))
        grows = self.take & ~left
        shrinks = ~self.take & left
        m.d.sync += count.eq(Mux(grows, count + 1, Mux(shrinks, count - 1, count)))
        m.d.sync += self.i_ready.eq(Mux(grows, count < self.depth - 1,
                                        Mux(shrinks, count < self.depth + 1, count < self.depth)))
        # busy: a register (the count is zero, or about to be, and nothing waits in the
        # skid buffer), a cycle behind the items.
        idle = Signal()
        m.d.sync += idle.eq(((count == 0) | ((count == 1) & shrinks)) & ~grows & ~out.o.valid)
        m.d.comb += self.busy.eq(~idle)
        return m
