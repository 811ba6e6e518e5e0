"""The stream skid buffer: a register slice that cuts both the payload and the ready path."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer"]


class SkidBuffer(wiring.Component):
    """Two-entry register slice between ``i`` and ``o``.

    Full throughput (one transfer per cycle) with registered ``o.valid``/``o.payload`` and a
    registered ``i.ready``: ``i.ready`` does not depend combinationally on ``o.ready``.
    Latency one cycle. ``o.valid`` never depends on ``o.ready``.
    """

    def __init__(self, shape):
        self._shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        main = Signal(self.o.payload.shape())
        main_valid = Signal()
        skid = Signal(self.o.payload.shape())
        skid_valid = Signal()

        m.d.comb += [
            self.i.ready.eq(~skid_valid),
            self.o.valid.eq(main_valid),
            self.o.payload.eq(main),
        ]
        # Written out in the smallest form (each flag a 4-input function of registers and
        # the two handshake inputs), so that synthesis keeps it at one LUT after o.ready.
        free = self.o.ready | ~main_valid            # the output register loads this cycle
        with m.If(free):
            m.d.sync += main.eq(Mux(skid_valid, skid, self.i.payload))
        m.d.sync += [
            main_valid.eq(skid_valid | self.i.valid | (main_valid & ~self.o.ready)),
            skid_valid.eq(main_valid & ~self.o.ready & (skid_valid | self.i.valid)),
        ]
        # The skid slot follows the input while it is empty: its wide clock enable is then a
        # register, not a function of both handshakes.
        with m.If(~skid_valid):
            m.d.sync += skid.eq(self.i.payload)
        return m
