"""A unit's memory write port as an AXI4 master write channel set (AW, W, B).

A unit's write port (a stream of ``addr``: the element address of lane 0, ``data``:
``lanes`` elements, ``enable``: the lane enables) becomes AXI4 write bursts in two blocks:

:class:`WriteRealign` puts each beat onto the bus's words: the bus is ``lanes`` elements
wide, and a beat whose address is not a multiple of ``lanes`` (a row of H elements, H not a
multiple of the lanes) straddles two words. Its elements are rotated onto their byte lanes;
the first word takes the beat's low lanes (and, below them, the part of the previous beat
that spilled over, when this beat continues it at the next address), and the part that
spills into the next word waits in a carry register. The carry leaves on its own (one word)
when the next beat does not continue it or when no beat is waiting. Aligned beats pass one
per cycle; an unaligned run of consecutive beats costs one word more than its beats. The
rotation is a registered stage of its own (a skid buffer), so that the merge with the carry
starts from registers: latency two cycles.

:class:`AxiWriteMaster` groups consecutive words into INCR bursts and issues them:

* A burst grows while words arrive one after another at consecutive addresses; it closes
  (its address and length go to the command queue) when a word does not continue it, when it
  holds ``max_burst`` beats, when the next word would start a new 4 KiB page, or in a cycle
  in which no word arrives. Its words wait in a data FIFO (``fifo_depth`` words, a block
  RAM); a full FIFO stops the input, which then closes the burst: nothing waits on a burst
  that cannot grow.
* AW is issued from the command queue while fewer than ``outstanding`` bursts await their
  write response (B); each issued burst's length goes to the W side, which sends its words
  from the FIFO with ``wlast`` on the last, going on to the next burst without a gap.
* B is always accepted (``bready`` is 1); a response other than OKAY raises
  ``bus_error`` for one cycle.

``idle`` is high when nothing is held: no open burst, the FIFO and the command queue empty,
and every issued burst answered. ``base_word`` (the buffer's base address in bus words) is
added to every word address; it must hold while the master is not idle.

Every AXI output is a register (skid buffers on AW and W, constants elsewhere).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..stream import RegisteredFIFO, SkidBuffer

__all__ = ["WriteRealign", "AxiWriteMaster", "axi_write_members", "beat_position",
           "check_bus", "form_bursts", "rotate", "word_layout"]

#: AXI4 constants of every burst: INCR, normal access, bufferable and modifiable.
AWBURST_INCR = 0b01
AWCACHE = 0b0011


def word_layout(word_width, lanes, width):
    """A bus word: its address in words, the data (lane 0 least significant) and the lane
    enables."""
    return data.StructLayout({"word": word_width, "data": lanes * width, "strb": lanes})


def axi_write_members(prefix, *, addr_width, data_width, id_width=1):
    """The AXI4 master write channels ``<prefix>_aw*``, ``_w*``, ``_b*`` as signature
    members."""
    return {
        f"{prefix}_awid": Out(id_width), f"{prefix}_awaddr": Out(addr_width),
        f"{prefix}_awlen": Out(8), f"{prefix}_awsize": Out(3), f"{prefix}_awburst": Out(2),
        f"{prefix}_awlock": Out(1), f"{prefix}_awcache": Out(4), f"{prefix}_awprot": Out(3),
        f"{prefix}_awvalid": Out(1), f"{prefix}_awready": In(1),
        f"{prefix}_wdata": Out(data_width), f"{prefix}_wstrb": Out(data_width // 8),
        f"{prefix}_wlast": Out(1), f"{prefix}_wvalid": Out(1), f"{prefix}_wready": In(1),
        f"{prefix}_bid": In(id_width), f"{prefix}_bresp": In(2), f"{prefix}_bvalid": In(1),
        f"{prefix}_bready": Out(1),
    }


def check_bus(master, *, lanes, width, addr_width, max_burst, outstanding, fifo_depth):
    """Check an AXI4 master's parameters and set its bus facts on ``master``:
    ``data_width``, ``bus_bytes``, ``size`` (AxSIZE), ``addr_width``, ``bus_word_width`` (a
    bus word's address), ``max_burst``, ``outstanding``, ``fifo_depth``."""
    for name, value, low, high in (("max_burst", max_burst, 1, 256),
                                   ("outstanding", outstanding, 1, 64),
                                   ("fifo_depth", fifo_depth, 2, 1 << 16),
                                   ("addr_width", addr_width, 12, 64)):
        if not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name} must be an integer between {low} and {high}, "
                             f"not {value!r}")
    master.data_width = lanes * width
    if master.data_width % 8 or master.data_width & (master.data_width - 1) or \
            master.data_width < 8:
        raise ValueError(f"the bus width (lanes x element width) must be a power of two "
                         f"of at least 8 bits, not {master.data_width}")
    master.bus_bytes = master.data_width // 8
    master.size = exact_log2(master.bus_bytes)
    master.addr_width = addr_width
    master.bus_word_width = addr_width - master.size
    master.max_burst, master.outstanding, master.fifo_depth = max_burst, outstanding, fifo_depth


def beat_position(m, addr, lanes, take):
    """Where an element-addressed beat of ``lanes`` elements at ``addr`` falls on the bus
    words: ``offset`` (its lane 0's lane in the word), ``turn`` (``lanes - offset``: the
    rotation that puts element l on lane ``(l + offset) mod lanes``), ``low`` (the lanes
    below the offset: those of the next word) and ``follows`` (the beat's address is the
    previous taken beat's plus ``lanes``: it continues that beat). ``take``: the beat is
    taken this cycle."""
    shift = exact_log2(lanes)
    offset = addr[:shift] if shift else Const(0, 1)
    turn = Signal(range(lanes + 1))
    m.d.comb += turn.eq(lanes - offset)
    previous = Signal.like(addr)              # the address of the last beat taken, + lanes
    with m.If(take):
        m.d.sync += previous.eq(addr + lanes)
    low = ((Const(1, lanes + 1) << offset) - 1)[:lanes]
    return offset, turn, low, addr == previous


def rotate(value, amount, lanes, width):
    """``value`` (``lanes`` fields of ``width`` bits) rotated: field n of the result is field
    ``(n + amount) mod lanes`` of ``value``."""
    return Cat(value, value).bit_select(amount * width, lanes * width)


def form_bursts(m, *, valid, word, room, commands, max_burst, size, continues=None):
    """Group bus words arriving in order (``word``, absolute, when ``valid``) into INCR
    bursts: a burst grows while words arrive one after another at consecutive addresses and
    closes (its ``word`` and ``len`` written to ``commands``, a FIFO) when a word does not
    continue it, when it holds ``max_burst`` beats, when the next word would start a new
    4 KiB page (``size``: log2 of the bus bytes), or in a cycle in which no word arrives.
    ``room``: the caller can take a word. ``continues`` (optional, a register): the word is
    the previous word plus one and starts no new page, worked out by the caller a stage
    earlier, so that the choice to extend is made from registers alone. Returns ``(ready,
    take, is_open)``: a word can be taken, a word is taken, a burst is open."""
    is_open = Signal()
    start = Signal.like(word)
    length = Signal(8)                          # AxLEN: beats - 1
    full = Signal()                             # the open burst holds max_burst beats
    next_word = None
    if continues is None:
        next_word = Signal.like(word)
        page_bits = 12 - size
        new_page = (word[:page_bits] == 0) if page_bits > 0 else Const(1)
        continues = (word == next_word) & ~new_page
    extend = is_open & continues & ~full
    ready = room & (extend | ~is_open | commands.w_rdy)
    take = valid & ready
    close = is_open & Mux(take, ~extend, commands.w_rdy)
    m.d.comb += [commands.w_en.eq(close), commands.w_data.word.eq(start),
                 commands.w_data.len.eq(length)]
    with m.If(take):
        with m.If(extend):
            m.d.sync += [length.eq(length + 1), full.eq(length == max_burst - 2)]
        with m.Else():
            m.d.sync += [is_open.eq(1), start.eq(word), length.eq(0), full.eq(max_burst == 1)]
        if next_word is not None:
            m.d.sync += next_word.eq(word + 1)
    with m.Elif(close):
        m.d.sync += is_open.eq(0)
    return ready, take, is_open


class WriteRealign(wiring.Component):
    """Element-addressed write beats (``i``: ``addr``, ``data``, ``enable``) onto bus words
    (``o``: :func:`word_layout`); see the module docstring. ``busy``: a word is held."""

    def __init__(self, write_layout):
        self.write_layout = write_layout
        array = write_layout["data"].shape
        self.lanes, self.width = array.length, Shape.cast(array.elem_shape).width
        if self.lanes & (self.lanes - 1):
            raise ValueError(f"lanes must be a power of two, not {self.lanes}")
        self.shift = exact_log2(self.lanes)
        addr_width = Shape.cast(write_layout["addr"].shape).width
        self.word_width = max(1, addr_width - self.shift)
        super().__init__({"i": In(stream.Signature(write_layout)),
                          "o": Out(stream.Signature(word_layout(self.word_width, self.lanes,
                                                                self.width))),
                          "busy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        lanes, width, shift = self.lanes, self.width, self.shift
        beat = self.i.payload
        skid = m.submodules.skid = SkidBuffer(self.o.payload.shape())
        wiring.connect(m, skid.o, wiring.flipped(self.o))

        # ---- stage 1: rotate each beat onto the byte lanes (registered) -------------------
        # Element l of the beat goes to lane group (l + offset) mod lanes; ``low``: the lanes
        # below the offset, which a continuing beat takes from the carry; ``follows``: the
        # beat's address is the previous beat's plus ``lanes`` (it continues that beat).
        rotation = data.StructLayout({"word": self.word_width, "data": lanes * width,
                                      "strb": lanes, "low": lanes, "follows": 1})
        rot = m.submodules.rotate = SkidBuffer(rotation)
        addr = beat.addr
        offset, turn, low, follows = beat_position(m, addr, lanes, self.i.valid & self.i.ready)
        flat = Cat(beat.data[n] for n in range(lanes))
        m.d.comb += [
            rot.i.valid.eq(self.i.valid), self.i.ready.eq(rot.i.ready),
            rot.i.payload.word.eq(addr[shift:]),
            rot.i.payload.data.eq(rotate(flat, turn, lanes, width)),
            rot.i.payload.strb.eq(rotate(beat.enable, turn, lanes, 1)),
            rot.i.payload.low.eq(low),
            rot.i.payload.follows.eq(follows),
        ]

        # ---- stage 2: merge with the carry, or let the carry out alone ---------------------
        r = rot.o.payload
        carry_valid = Signal()                    # set only by the beat just before
        carry_data = Signal(lanes * width, reset_less=True)
        carry_en = Signal(lanes)
        carry_word = Signal(self.word_width)
        continues = carry_valid & r.follows
        flush = carry_valid & ~(rot.o.valid & continues)
        merged = Cat(Mux(r.low[n], carry_data.word_select(n, width), r.data.word_select(n, width))
                     for n in range(lanes))
        merged_en = (r.low & carry_en & continues.replicate(lanes)) | (~r.low & r.strb)
        m.d.comb += [
            skid.i.valid.eq(flush | rot.o.valid),
            rot.o.ready.eq(skid.i.ready & ~flush),
            skid.i.payload.word.eq(Mux(flush, carry_word, r.word)),
            skid.i.payload.data.eq(Mux(flush, carry_data, merged)),
            skid.i.payload.strb.eq(Mux(flush, carry_en, merged_en)),
            self.busy.eq(carry_valid | rot.held | skid.held),
        ]
        with m.If(skid.i.ready):
            with m.If(flush):
                m.d.sync += carry_valid.eq(0)
            with m.Elif(rot.o.valid):
                m.d.sync += [carry_valid.eq((r.strb & r.low).any()),
                             carry_data.eq(r.data), carry_en.eq(r.strb & r.low),
                             carry_word.eq(r.word + 1)]
        return m


class AxiWriteMaster(wiring.Component):
    """Bus words (``i``: :func:`word_layout`) as AXI4 write bursts on ``<prefix>_*``; see the
    module docstring."""

    def __init__(self, prefix, *, lanes, width, word_width, addr_width=32, max_burst=256,
                 outstanding=4, fifo_depth=512, id_width=1):
        check_bus(self, lanes=lanes, width=width, addr_width=addr_width, max_burst=max_burst,
                  outstanding=outstanding, fifo_depth=fifo_depth)
        self.prefix = prefix
        self.lanes, self.width = lanes, width
        self.id_width = id_width
        super().__init__({
            "i": In(stream.Signature(word_layout(word_width, lanes, width))),
            "base_word": In(self.bus_word_width),
            "idle": Out(1), "bus_error": Out(1),
            **axi_write_members(prefix, addr_width=addr_width, data_width=self.data_width,
                                id_width=id_width),
        })

    def elaborate(self, platform):
        m = Module()
        p = lambda name: getattr(self, f"{self.prefix}_{name}")     # noqa: E731
        lanes, width = self.lanes, self.width
        beat = self.i.payload

        # ---- burst former ------------------------------------------------------------------
        command = data.StructLayout({"word": self.bus_word_width, "len": 8})
        cmd = m.submodules.commands = RegisteredFIFO(command, 4)
        fifo = m.submodules.words = SyncFIFOBuffered(width=lanes * width + lanes,
                                                     depth=self.fifo_depth)
        word = Signal(self.bus_word_width)
        m.d.comb += word.eq(self.base_word + beat.word)
        ready, take, is_open = form_bursts(m, valid=self.i.valid, word=word, room=fifo.w_rdy,
                                           commands=cmd, max_burst=self.max_burst,
                                           size=self.size)
        m.d.comb += [
            self.i.ready.eq(ready),
            fifo.w_en.eq(take), fifo.w_data.eq(Cat(beat.data, beat.strb)),
        ]

        # ---- AW: bursts go out while fewer than ``outstanding`` await their response -------
        in_flight = Signal(range(self.outstanding + 1))
        lengths = m.submodules.lengths = RegisteredFIFO(8, self.outstanding + 2)
        aw = m.submodules.aw = SkidBuffer(command)
        can_issue = cmd.r_rdy & (in_flight != self.outstanding) & lengths.w_rdy
        issue = can_issue & aw.i.ready
        m.d.comb += [
            aw.i.valid.eq(can_issue), aw.i.payload.eq(cmd.r_data), cmd.r_en.eq(issue),
            lengths.w_en.eq(issue), lengths.w_data.eq(cmd.r_data.len),
            p("awid").eq(0), p("awaddr").eq(Cat(Const(0, self.size), aw.o.payload.word)),
            p("awlen").eq(aw.o.payload.len), p("awsize").eq(self.size),
            p("awburst").eq(AWBURST_INCR), p("awlock").eq(0), p("awcache").eq(AWCACHE),
            p("awprot").eq(0), p("awvalid").eq(aw.o.valid), aw.o.ready.eq(p("awready")),
        ]

        # ---- W: each issued burst's words, wlast on the last --------------------------------
        w = m.submodules.w = SkidBuffer(data.StructLayout({
            "data": lanes * width, "strb": self.bus_bytes, "last": 1}))
        active = Signal()
        left = Signal(8)                            # beats after the one in hand
        sending = active & fifo.r_rdy & w.i.ready
        last = left == 0
        load = lengths.r_rdy & (~active | (sending & last))
        lane_bytes = width // 8
        strb = fifo.r_data[lanes * width:]
        m.d.comb += [
            w.i.valid.eq(active & fifo.r_rdy), fifo.r_en.eq(sending),
            w.i.payload.data.eq(fifo.r_data[:lanes * width]),
            w.i.payload.strb.eq(Cat(strb[n].replicate(lane_bytes) for n in range(lanes))),
            w.i.payload.last.eq(last),
            lengths.r_en.eq(load),
            p("wdata").eq(w.o.payload.data), p("wstrb").eq(w.o.payload.strb),
            p("wlast").eq(w.o.payload.last), p("wvalid").eq(w.o.valid),
            w.o.ready.eq(p("wready")),
        ]
        with m.If(sending):
            m.d.sync += left.eq(left - 1)
            with m.If(last):
                m.d.sync += active.eq(0)
        with m.If(load):
            m.d.sync += [active.eq(1), left.eq(lengths.r_data)]

        # ---- B -------------------------------------------------------------------------------
        answered = p("bvalid")
        m.d.comb += p("bready").eq(1)
        m.d.sync += self.bus_error.eq(answered & (p("bresp") != 0))
        m.d.sync += in_flight.eq(in_flight + issue - answered)
        m.d.comb += self.idle.eq(~is_open & (fifo.level == 0) & (cmd.level == 0) &
                                 (in_flight == 0))
        return m
