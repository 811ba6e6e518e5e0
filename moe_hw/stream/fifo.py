"""A first-word fall-through FIFO whose flags and head are registers.

Amaranth's ``SyncFIFO`` derives ``w_rdy`` and ``r_rdy`` from its level register by compares,
and ``r_data`` is an asynchronous read of its RAM at the read pointer. A reader that looks at
the head entry to decide whether to take it (the row reader joins the head with a response
only if the head is a read) therefore has the read pointer's net, the RAM, its own decision,
the level update and the compares in one cycle, and a writer gated by ``w_rdy`` starts behind
the level's compare. :class:`RegisteredFIFO` has the same ports and the same cycle behaviour,
but ``r_data``, ``r_rdy`` and ``w_rdy`` are each a register.

The flags' next values are compares of the fill (how many entries the FIFO holds), chosen by
the handshakes. A FIFO of up to :attr:`RegisteredFIFO.THERMOMETER` entries holds its fill as
a thermometer code, one register per entry (bit k: more than k entries), so that a step is a
shift and every compare one bit: no carry chain from the fill into itself (the row reader's
in-flight level was such a chain on moe_re_routing's critical path). A deeper one (behind an
AXI master: 256) holds a binary count. ``level`` is the binary count either way, a sum of
the code's bits in the first case: read it off the critical path only (``r_rdy`` is
``level != 0``).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .credit import Ring
from .pipeline import thermometer_down, thermometer_up

__all__ = ["RegisteredFIFO"]


class RegisteredFIFO(wiring.Component):
    """A ``depth``-entry first-word fall-through FIFO of ``shape`` entries, with the ports of
    Amaranth's ``SyncFIFO`` (``w_data``, ``w_en``, ``w_rdy``; ``r_data``, ``r_en``,
    ``r_rdy``; ``level``): an entry is written in a cycle ``w_en & w_rdy``, and read (taken
    off the head) in a cycle ``r_en & r_rdy``.

    ``r_data`` and ``r_rdy`` are the head register and its valid flag, ``w_rdy`` a register
    (``level != depth`` one cycle ahead). The entries behind the head wait in a
    :class:`~moe_hw.stream.credit.Ring`; an entry written while the ring is empty and the head
    is free (empty, or read in the same cycle) goes straight to the head, so that, as with
    ``SyncFIFO``, an entry written in cycle c is on ``r_data`` from cycle c + 1 and the FIFO
    holds ``depth`` entries. The fill is a thermometer code up to :attr:`THERMOMETER`
    entries, else a binary count (see the module docstring).
    """

    #: The deepest FIFO whose fill is a thermometer code (one register per entry).
    THERMOMETER = 16

    def __init__(self, shape, depth):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self.depth = depth
        super().__init__({"w_en": In(1), "w_data": In(shape), "w_rdy": Out(1, init=1),
                          "r_en": In(1), "r_data": Out(shape), "r_rdy": Out(1),
                          "level": Out(range(depth + 1))})

    def elaborate(self, platform):
        m = Module()
        write = self.w_en & self.w_rdy
        read = self.r_en & self.r_rdy

        # The head loads whenever it is free: from the ring if that holds an entry, else the
        # entry being written (which the ring then skips).
        ring = m.submodules.ring = Ring(self.w_data.shape(), max(1, self.depth - 1))
        in_ring = Signal()                  # the ring holds an entry (a register, see below)
        free = ~self.r_rdy | read
        loads = free & (in_ring | write)
        m.d.comb += [
            ring.w_en.eq(write), ring.w_data.eq(self.w_data),
            ring.r_en.eq(loads),
        ]
        with m.If(loads):
            m.d.sync += self.r_data.eq(Mux(in_ring, ring.r_data, self.w_data))
        m.d.sync += self.r_rdy.eq(in_ring | write | ~free)

        # The fill. The head holds an entry whenever the FIFO does, so the ring holds one when
        # the FIFO holds two: ``in_ring`` says so (rather than the ring's own count, which the
        # head's load, a LUT after both handshakes, would update).
        grows = write & ~read
        shrinks = read & ~write
        if self.depth <= self.THERMOMETER:
            # A step is a shift, and ``in_ring`` is a bit of the code. ``w_rdy`` is a register
            # of its own (the top bit's inverse, so that Yosys keeps it apart), beside the
            # writer's logic, not the code's.
            fill = Signal(self.depth)                   # bit k: more than k entries
            m.d.sync += [
                fill.eq(Mux(grows, thermometer_up(fill),
                            Mux(shrinks, thermometer_down(fill), fill))),
                self.w_rdy.eq(Mux(grows, ~fill[-2] if self.depth > 1 else 0,
                                  Mux(shrinks, 1, ~fill[-1]))),
            ]
            m.d.comb += [
                self.level.eq(sum(fill[k] for k in range(self.depth))),
                in_ring.eq(fill[1] if self.depth > 1 else 0),
            ]
        else:
            # The flags are compares of the next level, chosen by the handshakes (no carry
            # chain between them and the register).
            m.d.sync += [
                self.level.eq(Mux(grows, self.level + 1,
                                  Mux(shrinks, self.level - 1, self.level))),
                self.w_rdy.eq(Mux(grows, self.level != self.depth - 1,
                                  Mux(shrinks, 1, self.level != self.depth))),
                in_ring.eq(Mux(grows, self.level >= 1, Mux(shrinks, self.level >= 3,
                                                           self.level >= 2))),
            ]
        return m
