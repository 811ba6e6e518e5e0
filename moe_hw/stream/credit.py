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

The queue on its own is :class:`RingQueue`, for a writer that guarantees room by other means
(combine_scatter's in-flight count bounds what its product and write queues hold).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .pipeline import delay
from .skid import SkidBuffer

__all__ = ["CreditPipeline", "RingQueue"]


class RingQueue(wiring.Component):
    """The queue of :class:`CreditPipeline`, for a writer that guarantees room by other
    means: a ring in distributed RAM, written whenever ``w_en`` is high (no full check: the
    write enable goes straight to the RAM, so it should be a register), first-word
    fall-through into a :class:`~moe_hw.stream.SkidBuffer` that drives ``o``. The ring's read
    enable is the skid buffer's registered ``ready``, so ``o.ready`` reaches only the skid
    buffer's output register. ``read`` (out) is high in a cycle an entry leaves the ring for
    the skid buffer. ``depth``: the entries the writer may have in the ring at once (rounded
    up to a power of two); the skid buffer holds two more.

    Latency: an entry written in cycle c is on ``o`` from cycle c + :attr:`LATENCY`.
    """

    #: Cycles from a write to ``o.valid``.
    LATENCY = 2

    def __init__(self, shape, depth):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self.depth = depth
        super().__init__({"w_en": In(1), "w_data": In(shape),
                          "o": Out(stream.Signature(shape)), "read": Out(1)})

    def elaborate(self, platform):
        m = Module()
        out = m.submodules.out = SkidBuffer(self.w_data.shape())
        slots = 1 << ceil_log2(self.depth)
        storage = m.submodules.storage = memory.Memory(
            shape=len(self.w_data.as_value()), depth=slots, init=[])
        w_port = storage.write_port()
        r_port = storage.read_port(domain="comb")
        w_ptr = Signal(range(slots), name="w_ptr")
        r_ptr = Signal(range(slots), name="r_ptr")
        items = Signal(range(slots + 1), name="items")
        ready = Signal(name="queue_ready")        # the ring holds an entry
        m.d.comb += [
            self.read.eq(ready & out.i.ready),
            w_port.addr.eq(w_ptr), w_port.data.eq(self.w_data.as_value()),
            w_port.en.eq(self.w_en),
            r_port.addr.eq(r_ptr),
            out.i.valid.eq(ready), out.i.payload.eq(r_port.data),
        ]
        with m.If(self.w_en):
            m.d.sync += w_ptr.eq(w_ptr + 1)
        with m.If(self.read):
            m.d.sync += r_ptr.eq(r_ptr + 1)
        fills = self.w_en & ~self.read
        drains = ~self.w_en & self.read
        m.d.sync += [
            items.eq(Mux(fills, items + 1, Mux(drains, items - 1, items))),
            ready.eq(Mux(fills, 1, Mux(drains, items > 1, items != 0))),
        ]
        wiring.connect(m, out.o, wiring.flipped(self.o))
        return m


class CreditPipeline(wiring.Component):
    """See the module docstring. ``latency``: the datapath's cycles from ``take`` to
    ``payload``; ``shape``: the payload's shape; ``depth``: the queue's, at least
    ``latency + 3`` for one item per cycle (the default)."""

    #: Cycles the queue adds from the datapath's output to ``o.valid``.
    QUEUE_LATENCY = RingQueue.LATENCY
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
        m.d.comb += self.take.eq(self.i_valid & self.i_ready)
        arrives = delay(m, self.take, self.latency, 1, name="arrives")

        # The queue, written straight from the pipeline (the credits guarantee room, so the
        # write enable is the ``arrives`` register itself).
        queue = m.submodules.queue = RingQueue(self.payload.shape(), self.depth)
        m.d.comb += [queue.w_en.eq(arrives), queue.w_data.eq(self.payload)]
        wiring.connect(m, queue.o, wiring.flipped(self.o))
        reads = queue.read
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
        m.d.sync += idle.eq(((count == 0) | ((count == 1) & shrinks)) & ~grows & ~self.o.valid)
        m.d.comb += self.busy.eq(~idle)
        return m
