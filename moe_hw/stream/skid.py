"""The stream skid buffer: a register slice that cuts both the payload and the ready path."""

from amaranth.hdl import Cat, Module, Mux, Shape, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer"]


class SkidBuffer(wiring.Component):
    """Two-entry register slice between ``i`` and ``o``.

    Full throughput (one transfer per cycle) with registered ``o.valid``/``o.payload`` and a
    registered ``i.ready``: ``i.ready`` does not depend combinationally on ``o.ready``.
    Latency one cycle. ``o.valid`` never depends on ``o.ready``.

    ``alternate`` names fields of a :class:`~amaranth.lib.data.StructLayout` payload that are
    held differently, for a wide field whose consumer registers it anyway (a beat's data in
    front of the multipliers' operand registers): the two entries are two registers written
    in turn, and the field on ``o`` is a choice between them by a read pointer. Each register
    loads whenever it is the next to be written (a register as its clock enable), so
    ``o.ready`` reaches only the pointer and the flags, not the field's clock enables; the
    field on ``o`` is then one LUT from registers rather than a register. The cycle behaviour
    is the same either way.
    """

    def __init__(self, shape, *, alternate=()):
        self._shape = shape
        self._alternate = tuple(alternate)
        if self._alternate:
            if not isinstance(shape, data.StructLayout):
                raise TypeError(f"alternate fields need a StructLayout payload, not {shape!r}")
            unknown = [name for name in self._alternate if name not in shape.members]
            if unknown:
                raise ValueError(f"alternate: no field {unknown[0]!r} in {shape!r}")
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def _ranges(self):
        """``(start, stop, alternate)`` bit ranges of the payload, in order."""
        if not self._alternate:
            return [(0, Shape.cast(self._shape).width, False)]
        ranges = [(field.offset, field.offset + Shape.cast(field.shape).width,
                   name in self._alternate) for name, field in self._shape]
        return sorted(ranges)

    def elaborate(self, platform):
        m = Module()
        ranges = self._ranges()
        i_bits, o_bits = Value.cast(self.i.payload), Value.cast(self.o.payload)
        held = Cat(i_bits[start:stop] for start, stop, alt in ranges if not alt)
        turns = Cat(i_bits[start:stop] for start, stop, alt in ranges if alt)

        # The payload registers are read only beside their valid flags: no reset.
        main = Signal(len(held), reset_less=True)
        main_valid = Signal()
        skid = Signal(len(held), reset_less=True)
        skid_valid = Signal()

        m.d.comb += [
            self.i.ready.eq(~skid_valid),
            self.o.valid.eq(main_valid),
        ]
        # Written out in the smallest form (each flag a 4-input function of registers and
        # the two handshake inputs), so that synthesis keeps it at one LUT after o.ready.
        free = self.o.ready | ~main_valid            # the output register loads this cycle
        with m.If(free):
            m.d.sync += main.eq(Mux(skid_valid, skid, held))
        next_skid_valid = main_valid & ~self.o.ready & (skid_valid | self.i.valid)
        m.d.sync += [
            main_valid.eq(skid_valid | self.i.valid | (main_valid & ~self.o.ready)),
            skid_valid.eq(next_skid_valid),
        ]
        # The skid slot follows the input while it is empty: its wide clock enable is then a
        # register, not a function of both handshakes.
        with m.If(~skid_valid):
            m.d.sync += skid.eq(held)

        if len(turns):
            # The alternate fields: entry ``written`` is the next to be written (it follows
            # the input while the buffer is not full), entry ``read`` the oldest held.
            written, read = Signal(), Signal()
            next_written = written ^ (self.i.valid & self.i.ready)
            m.d.sync += [written.eq(next_written),
                         read.eq(read ^ (self.o.valid & self.o.ready))]
            entries = []
            for k in range(2):
                entry = Signal(len(turns), name=f"entry{k}", reset_less=True)
                follows = Signal(name=f"follows{k}", init=int(k == 0))
                m.d.sync += follows.eq((next_written == k) & ~next_skid_valid)
                with m.If(follows):
                    m.d.sync += entry.eq(turns)
                entries.append(entry)
            chosen = Mux(read, entries[1], entries[0])
        held_at = turns_at = 0
        for start, stop, alt in ranges:
            width = stop - start
            if alt:
                m.d.comb += o_bits[start:stop].eq(chosen[turns_at:turns_at + width])
                turns_at += width
            else:
                m.d.comb += o_bits[start:stop].eq(main[held_at:held_at + width])
                held_at += width
        return m
