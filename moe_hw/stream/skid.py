"""The stream skid buffer: a register slice that cuts both the payload and the ready path."""

from amaranth.hdl import Assert, Cat, Module, Mux, Shape, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ALTERNATE_GROUP_BITS", "SkidBuffer", "alternate_groups"]

#: Bits of an alternate field per copy of its pointers and load flags.
ALTERNATE_GROUP_BITS = 64


def alternate_groups(width, group_bits=ALTERNATE_GROUP_BITS):
    """The ``(start, stop)`` bit ranges of ``width`` alternate bits that get their own copy
    of the pointers: as even as can be, at most ``group_bits`` bits each."""
    count = max(1, -(-width // group_bits))
    bounds = [width * group // count for group in range(count + 1)]
    return list(zip(bounds, bounds[1:]))


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
    field on ``o`` is then one LUT from registers rather than a register. With
    ``group_bits`` (e.g. :data:`ALTERNATE_GROUP_BITS`), every ``group_bits`` bits of those
    fields have their own copy of the pointers (:func:`alternate_groups`), and each
    register's clock enable is one gate of a pointer copy and the skid slot's flag instead
    (see the code): for a bus-wide field whose handshakes are early (registers or a gate of
    them), since they then reach every copy. ``group_flags`` (with ``group_bits``): each
    group has its own copy of the skid slot's flag as well, for its clock enables and its
    write pointer's take, so that no single flag reaches every group; ``o.ready`` then
    reaches every copy's next value, so it is for a consumer whose ready is a register.
    The cycle behaviour is the same either way.

    The copies always equal the registers they copy (each starts at the same value and
    forms its next value the same way from its own), and the alternate entry written next
    never holds an item. Elaborated for a platform whose ``formal_invariants`` is true (the
    formal harness's), the buffer states both as ``Assert`` statements, so that a
    k-induction may use them: without them the induction starts from states no run
    reaches, with copies that disagree.

    ``keep`` names a one-bit field of a :class:`~amaranth.lib.data.StructLayout` payload:
    an item whose ``keep`` is 0 vanishes at the output (a partial sum, the beat of a dropped
    pair). It takes its turn in the output register like any other item, for one cycle, but
    ``o.valid`` stays low and it leaves without waiting for ``o.ready``: the same cycles as an
    item shown on ``o`` and taken by a consumer whose ready is ``o.ready | ~keep``. Here
    ``o.valid`` is a register of its own (the output item is held and kept), so that the
    consumer's ``ready`` meets only registers in the flags' logic; a consumer that forms the
    ``o.ready | ~keep`` itself puts the output register's ``valid`` and ``keep`` through a
    LUT near wherever its ``ready`` comes from, and back.

    ``held`` (out) is high while the output register holds an item, shown or vanishing.

    ``ready_next``: the buffer has an output ``ready_next`` as well, the value ``i.ready``
    takes at the next clock edge (its flag's next value, a function of this cycle's
    handshakes). A producer that feeds several buffers at once registers the AND of theirs
    and so takes its items on one register, not on a gate of the buffers' flags.

    ``reset_held``: the registers of the fields that are not alternate are reset to 0 (else
    they have no reset). With the output register loading the input whenever it holds no
    item, a field whose producer drives 0 while ``i.valid`` is low then reads 0 on ``o``
    whenever ``o.valid`` is low, reset included: a consumer can read such a field without
    ``o.valid`` beside it.
    """

    def __init__(self, shape, *, alternate=(), keep=None, reset_held=False, group_bits=None,
                 group_flags=False, ready_next=False):
        if group_bits is not None and (not isinstance(group_bits, int) or group_bits < 1):
            raise ValueError(f"group_bits must be a positive integer or None, not "
                             f"{group_bits!r}")
        if group_bits is not None and not alternate:
            raise ValueError("group_bits is for alternate fields")
        if group_flags and group_bits is None:
            raise ValueError("group_flags is for group_bits groups")
        self._group_bits = group_bits
        self._group_flags = bool(group_flags)
        self._shape = shape
        self._reset_held = reset_held
        self._alternate = tuple(alternate)
        self._keep = keep
        fields = (*self._alternate, *(() if keep is None else (keep,)))
        if fields:
            if not isinstance(shape, data.StructLayout):
                raise TypeError(f"alternate and keep fields need a StructLayout payload, not "
                                f"{shape!r}")
            unknown = [name for name in fields if name not in shape.members]
            if unknown:
                raise ValueError(f"no field {unknown[0]!r} in {shape!r}")
        if keep is not None and Shape.cast(shape.members[keep]).width != 1:
            raise ValueError(f"keep: field {keep!r} must be one bit wide")
        if keep is not None and keep in self._alternate:
            raise ValueError(f"keep: field {keep!r} cannot also be an alternate field")
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape)),
                          "held": Out(1), **({"ready_next": Out(1)} if ready_next else {})})

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

        # The payload registers are read only beside their valid flags: no reset (unless
        # asked for).
        main = Signal(len(held), reset_less=not self._reset_held)
        main_valid = Signal()
        skid = Signal(len(held), reset_less=not self._reset_held)
        skid_valid = Signal()

        # ``shown``: the output register holds an item that waits for ``o.ready`` (without
        # ``keep``, every item it holds).
        shown = main_valid
        if self._keep is not None:
            shown = Signal()
            i_keep = self.i.payload[self._keep]
            # The skid slot's own copy of the keep bit (its place among the held fields:
            # the held ranges before it, and its offset within its own range).
            offset = self._shape[self._keep].offset
            position = 0
            for start, stop, alt in ranges:
                if alt:
                    continue
                if start <= offset < stop:
                    position += offset - start
                    break
                position += stop - start
            skid_keep = skid[position]
        m.d.comb += [
            self.i.ready.eq(~skid_valid),
            self.o.valid.eq(shown),
            self.held.eq(main_valid),
        ]
        # Written out in the smallest form (each flag a 4-input function of registers and
        # the two handshake inputs), so that synthesis keeps it at one LUT after o.ready.
        free = self.o.ready | ~shown                 # the output register loads this cycle
        with m.If(free):
            m.d.sync += main.eq(Mux(skid_valid, skid, held))

        def skid_next(flag):
            """The skid slot's flag at the next edge, from its value ``flag`` (the flag's own
            or a group's copy of it: each copy forms it from itself)."""
            return shown & ~self.o.ready & (flag | self.i.valid)

        next_skid_valid = skid_next(skid_valid)
        if "ready_next" in self.signature.members:
            m.d.comb += self.ready_next.eq(~next_skid_valid)
        m.d.sync += [
            main_valid.eq(skid_valid | self.i.valid | (shown & ~self.o.ready)),
            skid_valid.eq(next_skid_valid),
        ]
        if self._keep is not None:
            # Loaded with the output register: the next item is there and kept.
            with m.If(free):
                m.d.sync += shown.eq(Mux(skid_valid, skid_keep, self.i.valid & i_keep))
        # The skid slot follows the input while it is empty: its wide clock enable is then a
        # register, not a function of both handshakes.
        with m.If(~skid_valid):
            m.d.sync += skid.eq(held)

        if len(turns):
            # The alternate fields: entry ``written`` is the next to be written (it follows
            # the input while the buffer is not full), entry ``read`` the oldest held.
            # Without ``group_bits``, an entry's clock enable is a register (``follows``,
            # the next state's: the handshakes reach it through a few gates). With
            # ``group_bits``, each group of that many bits (or fewer) has its own copy of
            # both pointers, so that no one register drives the choice or the clock enables
            # of a whole bus-wide field (at 8 lanes the read pointer's net to 256 choices
            # took 2.1 ns), and the entry ``written`` loads the input in every cycle the
            # skid slot is empty (then it holds no item, or takes the one taken now): its
            # clock enable is one gate of two registers near the group, and the handshakes
            # reach only the pointers. The pointers toggle, each copy from its own value, so
            # the copies' next-state logic differs and Yosys keeps them apart. With
            # ``group_flags`` each group has its own copy of the skid slot's flag too,
            # formed the same way from its own value (so also kept apart), for its clock
            # enables and its input take: with one flag, its net to the far groups' clock
            # enables, then the take's net to their write pointers, was the critical path of
            # dispatch at 16 lanes (2.7 and 2.5 ns). (The AXI read master, whose consumer's
            # ready is a few gates deep, lost 10 % with them: that ready then reaches every
            # group's copy.)
            leaves = main_valid & free                 # an item leaves
            chosen = []
            invariants = getattr(platform, "formal_invariants", False)
            groups = (alternate_groups(len(turns), self._group_bits) if self._group_bits
                      else [(0, len(turns))])
            for group, (start, stop) in enumerate(groups):
                suffix = f"_{group}" if group else ""
                written = Signal(name=f"written{suffix}")
                read = Signal(name=f"read{suffix}")
                # The skid flag the group reads (``i.ready`` is its inverse), and the take.
                flag, taken = skid_valid, self.i.valid & self.i.ready
                if self._group_flags:
                    flag = Signal(name=f"skid_valid_copy{suffix}")
                    m.d.sync += flag.eq(skid_next(flag))
                    taken = self.i.valid & ~flag
                next_written = written ^ taken
                m.d.sync += [written.eq(next_written), read.eq(read ^ leaves)]
                if invariants:
                    # Every copy equals the skid flag and group 0's pointers.
                    if not group:
                        first_written, first_read = written, read
                    m.d.comb += [Assert(flag == skid_valid), Assert(written == first_written),
                                 Assert(read == first_read)]
                entries = []
                for k in range(2):
                    entry = Signal(stop - start, name=f"entry{k}{suffix}", reset_less=True)
                    if self._group_bits:
                        load = (written == k) & ~flag
                    else:
                        load = Signal(name=f"follows{k}", init=int(k == 0))
                        m.d.sync += load.eq((next_written == k) & ~next_skid_valid)
                        if invariants:
                            m.d.comb += Assert(load == ((written == k) & ~skid_valid))
                    with m.If(load):
                        m.d.sync += entry.eq(turns[start:stop])
                    entries.append(entry)
                chosen.append(Mux(read, entries[1], entries[0]))
            chosen = Cat(chosen)
            if invariants:
                # The next entry to write is the held item's (none held, or both slots full)
                # or the other one (the output register's item only), so it never overwrites
                # an item held.
                m.d.comb += [Assert(~skid_valid | main_valid),
                             Assert(first_written == first_read ^ (main_valid & ~skid_valid))]
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
