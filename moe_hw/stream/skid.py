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
        i_take = self.i.valid & self.i.ready
        o_take = self.o.valid & self.o.ready
        with m.If(o_take | ~main_valid):
            # The output register is free this cycle: fill it from the skid slot first.
            m.d.sync += [
                main.eq(Mux(skid_valid, skid, self.i.payload)),
                main_valid.eq(skid_valid | i_take),
                skid_valid.eq(0),
            ]
        with m.Elif(i_take):
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m
