"""AXI4-Stream ports for a unit's streams, one adapter per direction, each through the
project's :class:`~moe_hw.stream.SkidBuffer` (registered ``tvalid``/``tdata`` and ``tready``,
one cycle of latency, one beat per cycle).

``tdata`` is the stream's payload padded to whole bytes (the payload's first field in the
least significant bits, as in the manifest's layout). A stream that carries rows (``rows``:
a row of ``row_beats`` beats, a token row of the unit) has ``tlast`` on the last beat of
each row. ``tkeep``:

* :class:`AxisToStream` (a unit's input): a byte whose ``tkeep`` is 0 reaches the unit as 0
  (the zero padding past H of a row's last beat); on a row stream, a beat whose ``tlast``
  does not agree with the row count raises ``tlast_error`` for one cycle (the beat is passed
  on as it is: the unit counts beats by the run-time size).
* :class:`StreamToAxis` (a unit's output): all ones except on a row's last beat, where it
  keeps the bytes of the ``last_lanes`` lanes that hold elements.
"""

from amaranth.hdl import Cat, Module, Mux, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import SkidBuffer

__all__ = ["AxisToStream", "StreamToAxis", "axis_members", "tdata_width"]


def tdata_width(shape):
    return -(-Shape.cast(shape).width // 8) * 8


def axis_members(prefix, shape, flow):
    """The AXI4-Stream ports of a stream of ``shape`` named ``prefix`` (``s_axis_header``),
    for a slave (``flow`` In: the stream comes in) or a master (Out)."""
    back = Out if flow is In else In
    width = tdata_width(shape)
    return {f"{prefix}_tdata": flow(width), f"{prefix}_tkeep": flow(width // 8),
            f"{prefix}_tlast": flow(1), f"{prefix}_tvalid": flow(1),
            f"{prefix}_tready": back(1)}


def row_position(m, row_beats, take, restart):
    """Whether the beat in hand is the last of its row (``row_beats`` beats a row, set a
    cycle before the first beat), counting the taken beats; ``restart`` (a new run) puts the
    count back to a row's first beat."""
    beat = Signal.like(row_beats, name="row_beat")      # the beat in hand, within its row
    penult = Signal.like(row_beats, name="row_penult")  # row_beats - 2, a register
    one_beat = Signal(name="row_one_beat")              # row_beats == 1, a register
    at_first = Signal(init=1, name="row_at_first")      # beat == 0
    next_last = Signal(name="row_next_last")            # beat is the row's last, past its first
    is_last = Signal()
    m.d.sync += [penult.eq(row_beats - 2), one_beat.eq(row_beats == 1)]
    # The beat's being the last is one choice between registers: the row's first beat is
    # its last when the row has one beat; a later beat's flag was worked out when the beat
    # before it was taken, as an equality of two registers (that beat was the row's last
    # but one), not in the take's path and with no adder before it.
    m.d.comb += is_last.eq(Mux(at_first, one_beat, next_last))
    with m.If(take):
        m.d.sync += [beat.eq(Mux(is_last, 0, beat + 1)), at_first.eq(is_last),
                     next_last.eq(beat == penult)]
    with m.If(restart):
        m.d.sync += [beat.eq(0), at_first.eq(1)]
    return is_last


class AxisToStream(wiring.Component):
    """``s_axis_<name>_*`` in, the unit's stream ``o`` out; see the module docstring.
    ``rows``: the lanes of a row stream (its payload's ``data`` array), or 0. A row stream
    takes ``row_beats`` (per run, held while it runs, set a cycle before its first beat) and
    has a ``tlast_error`` pulse."""

    def __init__(self, prefix, shape, *, rows=0, row_beats_width=16):
        self.prefix, self.shape, self.rows = prefix, shape, rows
        members = {**axis_members(prefix, shape, In), "o": Out(stream.Signature(shape))}
        if rows:
            members.update(row_beats=In(row_beats_width), restart=In(1), tlast_error=Out(1))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        p = lambda name: getattr(self, f"{self.prefix}_{name}")     # noqa: E731
        width = Shape.cast(self.shape).width
        skid = m.submodules.skid = SkidBuffer(width + 1)
        keep = Cat(p("tkeep")[i].replicate(8) for i in range(len(p("tkeep"))))
        m.d.comb += [
            skid.i.valid.eq(p("tvalid")), p("tready").eq(skid.i.ready),
            skid.i.payload.eq(Cat((p("tdata") & keep)[:width], p("tlast"))),
            self.o.valid.eq(skid.o.valid), skid.o.ready.eq(self.o.ready),
            self.o.payload.eq(skid.o.payload[:width]),
        ]
        if self.rows:
            take = self.o.valid & self.o.ready
            is_last = row_position(m, self.row_beats, take, self.restart)
            m.d.sync += self.tlast_error.eq(take & (skid.o.payload[width] != is_last))
        return m


class StreamToAxis(wiring.Component):
    """The unit's stream ``i`` in, ``m_axis_<name>_*`` out; see the module docstring.
    ``busy``: a beat is held. ``rows``: the lanes of a row stream, or 0. A row stream takes
    ``row_beats`` and ``last_lanes`` (the lanes of a row's last beat that hold elements,
    1 to ``rows``), per run (``row_beats`` set a cycle before the run's first beat)."""

    def __init__(self, prefix, shape, *, rows=0, row_beats_width=16):
        self.prefix, self.shape, self.rows = prefix, shape, rows
        members = {**axis_members(prefix, shape, Out), "i": In(stream.Signature(shape)),
                   "busy": Out(1)}
        if rows:
            members.update(row_beats=In(row_beats_width), last_lanes=In(range(rows + 1)),
                           restart=In(1))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        p = lambda name: getattr(self, f"{self.prefix}_{name}")     # noqa: E731
        width = Shape.cast(self.shape).width
        keep_width = tdata_width(self.shape) // 8
        layout = data.StructLayout({"tdata": width, "tkeep": keep_width, "tlast": 1})
        skid = m.submodules.skid = SkidBuffer(layout)
        take = self.i.valid & skid.i.ready
        m.d.comb += [
            skid.i.valid.eq(self.i.valid), self.i.ready.eq(skid.i.ready),
            skid.i.payload.tdata.eq(self.i.payload),
            p("tvalid").eq(skid.o.valid), skid.o.ready.eq(p("tready")),
            p("tdata").eq(skid.o.payload.tdata), p("tkeep").eq(skid.o.payload.tkeep),
            p("tlast").eq(skid.o.payload.tlast), self.busy.eq(skid.held),
        ]
        if not self.rows:
            m.d.comb += [skid.i.payload.tkeep.eq(-1), skid.i.payload.tlast.eq(0)]
            return m
        is_last = row_position(m, self.row_beats, take, self.restart)
        lane_bytes = width // self.rows // 8
        # The bytes of the first ``last_lanes`` lanes (a register per run: a table lookup).
        last_keep = Signal(keep_width)
        with m.Switch(self.last_lanes):
            for n in range(1, self.rows + 1):
                with m.Case(n):
                    m.d.sync += last_keep.eq((1 << (n * lane_bytes)) - 1)
        m.d.comb += [skid.i.payload.tlast.eq(is_last),
                     skid.i.payload.tkeep.eq(Mux(is_last, last_keep, -1))]
        return m
