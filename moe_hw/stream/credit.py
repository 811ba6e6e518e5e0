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
``ready_next`` (out)
    The value ``i_ready`` takes at the next edge: for a producer that keeps copies of
    ``i_ready`` (:func:`~moe_hw.stream.replicated`) to form its take per group of lanes.
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

With ``skid=False`` the ring itself drives ``o`` (``o.valid`` is its ``nonempty`` register,
``o.payload`` the asynchronous read at its read pointer, ``o.ready`` advances the pointer
copies): a cycle less (:attr:`CreditPipeline.RING_LATENCY`), and the consumer's take reaches
a few pointer registers instead of the clock enable of a register as wide as the payload.
For a consumer inside the unit that loads the payload into registers of its own every cycle
(a free-running datapath behind the queue), not for a unit's output port.

The queue on its own is :class:`RingQueue`, for a writer that guarantees room by other means
(combine_scatter's in-flight count bounds what its product and write queues hold).

The ring's read is asynchronous (a distributed-RAM read, LUTs addressed by the read pointer)
and goes straight into the skid buffer's registers, so the read pointer's net is on the
queue's critical path, and a single pointer fans out to every RAM cell of the payload: at
4 fp32 lanes and 32 slots, 163 bits in 82 16x4 cells, a net that alone took 1.5-2.3 ns to
route. The ring is therefore cut into groups of about :data:`GROUP_BITS` payload bits
(:func:`ring_groups`), each a RAM of its own with its own copy of the read and the write
pointer, so that each pointer drives the cells of its group only. Yosys merges registers with
the same inputs bit by bit, so the copies are kept apart by construction: copy k holds the
pointer XOR k (its own reset value and its own increment logic) and writes its group's
entries at that address too, so each group's slots are a fixed permutation of the others'
and the FIFO order is unchanged. The copies add no logic between a pointer and its RAM, and
no cycle: every latency is the one of a single ring.

A wide ring's groups sit beside the lanes they feed, across the chip, and the take (a gate
of the consumer's flags) reaches every group's read pointer in the cycle it is made. With
``late_read=True`` (``skid=False`` only) the pointer copies advance a cycle after the take,
on a register of their own that the placer puts between the take and the groups: the item
taken in cycle c is on ``o.payload`` in cycle c + 1 (not c), and the consumer loads it a
cycle later. ``o.valid`` and the credits are unchanged, and so are the ring's slots: the
taken entry is still there a cycle after its take (see :class:`Ring`).
"""

from amaranth.hdl import Module, Mux, Signal, Value
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .pipeline import delay
from .skid import SkidBuffer

__all__ = ["CreditPipeline", "Ring", "RingQueue"]


class Ring(wiring.Component):
    """The ring of :class:`RingQueue` and :class:`~moe_hw.stream.RegisteredFIFO`: a ring in
    distributed RAM with no full check (the writer guarantees room), written at the write
    pointer whenever ``w_en`` is high, read asynchronously at the read pointer (``r_data``,
    the oldest entry), which ``r_en`` advances. ``nonempty`` (a register) is high while the
    ring holds an entry. ``r_en`` with ``nonempty`` low in a cycle ``w_en`` is high skips the
    entry being written (the reader has taken it from ``w_data``). ``depth``: the entries the
    writer may have in the ring at once (rounded up to a power of two).

    The ring is cut into :func:`ring_groups` of payload bits, each a RAM of its own with its
    own copy of both pointers (see the module docstring): the read pointer is the address of
    an asynchronous read, so its fan-out is on the reader's path, and one pointer for the
    whole payload is a net to every RAM cell of it.

    When ``depth`` is below the slots (the power of two), the RAM is written at the write
    pointer in every cycle, with ``w_data`` (an entry when ``w_en`` is high, else whatever
    it holds): that slot is never an entry then (the ring holds at most ``depth`` of them),
    and ``w_en`` reaches only the pointers, not the write enable of every RAM cell (at 16
    lanes, 300 cells on one net).

    Latency: an entry written in cycle c is on ``r_data``, with ``nonempty`` high, from
    cycle c + 1.

    ``late``: the read pointers advance a cycle after ``r_en`` (see the module docstring): the
    entry read in cycle c (``r_en`` high) stays on ``r_data`` in cycle c + 1. No write has
    reached its slot by then: the write in cycle c is at the read pointer plus the entries
    held, which are at least one (the entry read) and, with the one written, at most
    ``depth`` (less than the slots, or the write would overwrite an entry), so it is
    elsewhere; a write in cycle c + 1 lands at the clock edge that ends it. (Skipping an entry
    that is being written, with ``nonempty`` low, is not for a late reader.)
    """

    def __init__(self, shape, depth, *, late=False):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self.depth = depth
        self.late = bool(late)
        super().__init__({"w_en": In(1), "w_data": In(shape),
                          "r_en": In(1), "r_data": Out(shape), "nonempty": Out(1)})

    def elaborate(self, platform):
        m = Module()
        slots = 1 << ceil_log2(self.depth)
        w_data = Value.cast(self.w_data)
        advance = delay(m, self.r_en, 1, 1, name="r_advance") if self.late else self.r_en
        r_data = Value.cast(self.r_data)
        write_always = slots > self.depth
        for group, (start, stop) in enumerate(ring_groups(len(w_data), slots)):
            # Copy ``group`` of the pointers holds the pointer XOR ``group`` (a distinct
            # constant per copy: there are at most as many copies as slots): the group's
            # entries sit at slot ``entry XOR group``, and each copy has D logic of its own.
            storage = m.submodules[f"storage{group}"] = memory.Memory(
                shape=stop - start, depth=slots, init=[])
            w_port = storage.write_port()
            r_port = storage.read_port(domain="comb")
            w_ptr = Signal(range(slots), name=f"w_ptr{group}", init=group)
            r_ptr = Signal(range(slots), name=f"r_ptr{group}", init=group)
            m.d.comb += [
                w_port.addr.eq(w_ptr), w_port.data.eq(w_data[start:stop]),
                w_port.en.eq(1 if write_always else self.w_en),
                r_port.addr.eq(r_ptr), r_data[start:stop].eq(r_port.data),
            ]
            with m.If(self.w_en):
                m.d.sync += w_ptr.eq(_next_slot(w_ptr, group))
            with m.If(advance):
                m.d.sync += r_ptr.eq(_next_slot(r_ptr, group))
        items = Signal(range(slots + 1), name="items")
        fills = self.w_en & ~self.r_en
        drains = ~self.w_en & self.r_en
        m.d.sync += [
            items.eq(Mux(fills, items + 1, Mux(drains, items - 1, items))),
            self.nonempty.eq(Mux(fills, 1, Mux(drains, items > 1, items != 0))),
        ]
        return m


class RingQueue(wiring.Component):
    """The queue of :class:`CreditPipeline`, for a writer that guarantees room by other
    means: a :class:`Ring`, written whenever ``w_en`` is high (no full check: the write
    enable goes straight to the RAM, so it should be a register), first-word fall-through
    into a :class:`~moe_hw.stream.SkidBuffer` that drives ``o``. The ring's read enable is
    the skid buffer's registered ``ready``, so ``o.ready`` reaches only the skid buffer's
    output register. ``read`` (out) is high in a cycle an entry leaves the ring for the skid
    buffer. ``depth``: the entries the writer may have in the ring at once (rounded up to a
    power of two); the skid buffer holds two more. ``keep``: the skid buffer's (entries
    whose ``keep`` field is 0 vanish at the output); ``held`` (out): its output register
    holds an entry. ``alternate``, ``group_bits``, ``group_flags``: the skid buffer's (wide
    fields held in two registers written in turn, so that ``o.ready`` reaches no wide clock
    enable).

    Latency: an entry written in cycle c is on ``o`` from cycle c + :attr:`LATENCY`.
    """

    #: Cycles from a write to ``o.valid``.
    LATENCY = 2

    def __init__(self, shape, depth, *, keep=None, alternate=(), group_bits=None,
                 group_flags=False):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self.depth = depth
        self._out = SkidBuffer(shape, keep=keep, alternate=alternate, group_bits=group_bits,
                               group_flags=group_flags)
        super().__init__({"w_en": In(1), "w_data": In(shape),
                          "o": Out(stream.Signature(shape)), "read": Out(1), "held": Out(1)})

    def elaborate(self, platform):
        m = Module()
        out = m.submodules.out = self._out
        ring = m.submodules.ring = Ring(self.w_data.shape(), self.depth)
        m.d.comb += [
            ring.w_en.eq(self.w_en), ring.w_data.eq(self.w_data),
            self.read.eq(ring.nonempty & out.i.ready), ring.r_en.eq(self.read),
            out.i.valid.eq(ring.nonempty), out.i.payload.eq(ring.r_data),
            self.held.eq(out.held),
        ]
        wiring.connect(m, out.o, wiring.flipped(self.o))
        return m


#: Payload bits per copy of the ring's pointers: eight columns of ECP5's 16x4 distributed RAM
#: cell (sixteen cells, and a 2:1 mux per bit, at 32 slots).
GROUP_BITS = 32
#: The RAM cell's width: groups are cut at multiples of it, so that no cell is half empty.
_COLUMN_BITS = 4


def ring_groups(width, slots, *, group_bits=GROUP_BITS):
    """The ``(start, stop)`` bit ranges of a ``width``-bit ring of ``slots`` slots that get a
    copy of the pointers each: about ``group_bits`` bits each, cut at multiples of
    :data:`_COLUMN_BITS`, and at most ``slots`` groups (the distinct XOR constants)."""
    columns = -(-width // _COLUMN_BITS)
    count = max(1, min(slots, -(-width // group_bits), columns))
    bounds = [min(width, _COLUMN_BITS * (columns * group // count))
              for group in range(count + 1)]
    return list(zip(bounds, bounds[1:]))


def _next_slot(ptr, constant):
    """The slot after ``ptr`` in a copy of a pointer held XOR ``constant``."""
    return ((ptr ^ constant) + 1)[:len(ptr)] ^ constant


class CreditPipeline(wiring.Component):
    """See the module docstring. ``latency``: the datapath's cycles from ``take`` to
    ``payload``; ``shape``: the payload's shape; ``depth``: the queue's, at least
    ``latency + 3`` for one item per cycle (the default); ``skid``: whether a
    :class:`~moe_hw.stream.SkidBuffer` drives ``o`` (the default) or the ring itself;
    ``keep``: a one-bit payload field, items with 0 in it vanish at the output (the skid
    buffer's ``keep``; with ``skid`` only); ``alternate``, ``group_bits``, ``group_flags``:
    payload fields the skid buffer holds in two registers written in turn (its
    ``alternate``, in groups of pointer copies, and of flag copies; with ``skid`` only);
    ``ready_ahead``: ``i_ready`` is decided from registers alone, as if an item were taken
    in every cycle, so that the take does not reach it (no loop from the flag through the
    producer's valid back to it: dispatch's data input at 16 lanes, where the flag's nets
    run across the wide datapath). It costs a credit in a cycle nothing is taken, so its
    default depth is one more, ``latency + 4``: it is then never less ready than the exact
    flag at ``latency + 3``. ``late_count`` (with ``ready_ahead`` only): the credit count
    follows the take a cycle late, from a register of it, and ``i_ready`` adds that
    register back (the same flag, cycle for cycle), so that the take reaches two registers'
    data inputs (that one and the first stage of the arrivals), not the count's choice and
    clock enable: a producer whose take is a wide function of other streams' flags
    (dispatch_backward_gate's join). ``late_read``: the ring's read pointers follow the take
    a cycle late (with ``skid=False`` only; see the module docstring): the item taken in
    cycle c is on ``o.payload`` in cycle c + 1."""

    #: Cycles the queue adds from the datapath's output to ``o.valid``.
    QUEUE_LATENCY = RingQueue.LATENCY
    #: The same with ``skid=False`` (the ring's write).
    RING_LATENCY = 1
    #: Cycles from the last item leaving ``o`` to ``busy`` low, beyond the one of a
    #: combinational flag (``busy`` is a register).
    IDLE_LATENCY = 1

    def __init__(self, latency, shape, *, depth=None, skid=True, keep=None, alternate=(),
                 group_bits=None, group_flags=False, ready_ahead=False, late_count=False,
                 late_read=False):
        if not isinstance(latency, int) or latency < 0:
            raise ValueError(f"latency must be a non-negative integer, not {latency!r}")
        if (keep is not None or alternate) and not skid:
            raise ValueError("keep and alternate need the skid buffer (skid=True)")
        if late_count and not ready_ahead:
            raise ValueError("late_count needs ready_ahead")
        if late_read and skid:
            raise ValueError("late_read is for a ring that drives the output (skid=False)")
        self.late_read = bool(late_read)
        self.latency = latency
        self.skid = bool(skid)
        self._keep = keep
        self._alternate = tuple(alternate)
        self._group_bits = group_bits
        self._group_flags = group_flags
        #: Cycles from the datapath's output to ``o.valid``.
        self.queue_latency = self.QUEUE_LATENCY if self.skid else self.RING_LATENCY
        self.ready_ahead = bool(ready_ahead)
        self.late_count = bool(late_count)
        self.depth = latency + 3 + self.ready_ahead if depth is None else depth
        if self.depth < 2:
            raise ValueError(f"depth must be at least 2, not {self.depth!r}")
        super().__init__({
            "i_valid": In(1), "i_ready": Out(1), "i_full": Out(1, init=1), "take": Out(1),
            "ready_next": Out(1),
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
        if self.skid:
            queue = m.submodules.queue = RingQueue(self.payload.shape(), self.depth,
                                                   keep=self._keep, alternate=self._alternate,
                                                   group_bits=self._group_bits,
                                                   group_flags=self._group_flags)
            m.d.comb += [queue.w_en.eq(arrives), queue.w_data.eq(self.payload)]
            wiring.connect(m, queue.o, wiring.flipped(self.o))
            reads = queue.read
            held = queue.held
        else:
            # The ring holds every counted item (at most ``depth``); it is read only while
            # it holds one.
            ring = m.submodules.ring = Ring(self.payload.shape(), self.depth,
                                            late=self.late_read)
            reads = self.o.valid & self.o.ready
            m.d.comb += [
                ring.w_en.eq(arrives), ring.w_data.eq(self.payload), ring.r_en.eq(reads),
                self.o.valid.eq(ring.nonempty), self.o.payload.eq(ring.r_data),
            ]
            held = self.o.valid
        # The credits: items taken and not yet out of the queue. An item that leaves the
        # queue is subtracted a cycle later (the count is then one too high for a cycle,
        # never too low), and the next ``i_ready`` is a choice between two compares of the
        # count register, so that no carry chain sits between the handshakes and ``i_ready``.
        left = delay(m, reads, 1, 1, name="left")
        count = Signal(range(self.depth + 2))
        if self.late_count:
            # ``count`` lags the takes by a cycle: the items counted are ``count + took``.
            took = delay(m, self.take, 1, 1, name="took")
            m.d.sync += count.eq(count + took - left)
            # No item counted after this cycle.
            drains = Mux(took, (count == 0) & left,
                         (count == 0) | ((count == 1) & left)) & ~self.take
            # As with ``ready_ahead``: as if an item were taken this cycle.
            ready_next = Mux(took, Mux(left, count < self.depth - 1, count < self.depth - 2),
                             Mux(left, count < self.depth, count < self.depth - 1))
        else:
            grows = self.take & ~left
            shrinks = ~self.take & left
            m.d.sync += count.eq(Mux(grows, count + 1, Mux(shrinks, count - 1, count)))
            drains = ((count == 0) | ((count == 1) & shrinks)) & ~grows
            if self.ready_ahead:
                # As if an item were taken this cycle: the next count is at most
                # ``count + 1 - left``, so the take does not reach ``i_ready``.
                ready_next = Mux(left, count < self.depth, count < self.depth - 1)
            else:
                ready_next = Mux(grows, count < self.depth - 1,
                                 Mux(shrinks, count < self.depth + 1, count < self.depth))
        # ``i_full`` is ``~i_ready``, a register of its own: a second copy of the flag for a
        # producer whose take fans out widely (kept apart from ``i_ready`` by the inversion).
        m.d.sync += [self.i_ready.eq(ready_next), self.i_full.eq(~ready_next)]
        m.d.comb += self.ready_next.eq(ready_next)
        # busy: a register (the count is zero, or about to be, and nothing waits in the
        # skid buffer), a cycle behind the items.
        idle = Signal()
        m.d.sync += idle.eq(drains & ~held)
        m.d.comb += self.busy.eq(~idle)
        return m
