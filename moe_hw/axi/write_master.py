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
per cycle; an unaligned run of consecutive beats costs one word more than its beats. Every
step starts from registers (skid buffers between them, their bus-wide data in alternate
registers with a copy of the pointers per 64 bits): the beat is registered as it comes
in, the rotation is a 2:1 choice per bit for each bit of the lane offset, one registered
stage each (one stage up to 2 lanes, three at 8, four at 16: the choice beside the alternate
registers' own is then one LUT, where a 4:1 choice made it three levels), and the merge with
the carry decides from the last stage's registers, which also say whether the beat spills
into the next word (reduced over the stages). Latency (:attr:`WriteRealign.latency`): 2
cycles and one per rotation stage (3 up to 2 lanes, 5 at 8, 6 at 16).

:class:`AxiWriteMaster` groups consecutive words into INCR bursts and issues them:

* A burst grows while words arrive one after another at consecutive addresses; it closes
  (its address and length go to the command queue) when a word does not continue it, when it
  holds ``max_burst`` beats, when the next word would start a new 4 KiB page, or in a cycle
  in which no word arrives. Its words wait in a data FIFO (a block RAM of ``fifo_depth``
  words, of which it fills one less); a full FIFO stops the input, which then closes the
  burst: nothing waits on a burst that cannot grow. The decision is made from registers:
  each word comes in through a register stage that holds its word address (``base_word``
  is added to a burst's start as it closes), whether it follows the word before (as
  :func:`pairwise_equal`'s parts, joined behind the register) and whether it starts a 4 KiB
  page; the burst's length limit and the FIFO's room are registers of their own. A closed
  burst's command waits a cycle in a register before the command queue (five deep; the
  former's room for it is a register too), so that the queue's head never loads in the
  cycle of the close. The input waits while an open burst could not close (no room
  for its command), even for a word that would extend it: the input's ready is then a gate
  of three registers, not of the word's own flags.
* The FIFO is a :class:`~moe_hw.blocks.block_memory.BlockMemory` (``bram``: ``ecp5`` for
  DP16KD blocks with their output registers), written through a register and read ahead
  (two cycles) into a :class:`~moe_hw.stream.CreditPipeline`'s queue, so that no block RAM
  output and no FIFO flag is combinational logic's input.
* AW is issued from the command queue while fewer than ``outstanding`` bursts await their
  write response (B); each issued burst's length goes to the W side, which sends its words
  from the FIFO with ``wlast`` on the last, going on to the next burst without a gap.
* B is always accepted (``bready`` is 1); a response other than OKAY raises
  ``bus_error`` for one cycle.

``idle`` is high when nothing is held: no open burst or waiting command, the FIFO and the
command queue empty, and every issued burst answered. ``base_word`` (the buffer's base
address in bus words) is added to every word address; it must hold while the master is not
idle, and from the cycle before the first word (its page position is registered).

Every AXI output is a register (skid buffers on AW and W, constants elsewhere).

The pieces :class:`~moe_hw.axi.read_master.AxiReadMaster` uses too are functions here:
:func:`check_bus` (the parameters), :func:`beat_position` (a beat's offset and low lanes),
:func:`pairwise_equal` (an equality in two-bit parts, joined a stage later),
:func:`page_marks` (a word's 4 KiB page ends), :func:`rotate` (one stage of the rotation),
:func:`form_bursts` (the burst former), :func:`burst_commands` (its command register and
queue); both masters' FIFOs are :func:`~moe_hw.blocks.block_fifo.block_fifo` (a block RAM
read ahead).
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..blocks.block_fifo import block_fifo, count_level
from ..blocks.block_memory import MEMORY_TARGETS
from ..params import check_choice
from ..stream import ALTERNATE_GROUP_BITS, RegisteredFIFO, SkidBuffer, delay, replicated

__all__ = ["WriteRealign", "AxiWriteMaster", "axi_write_members", "beat_position",
           "burst_commands", "check_bus", "form_bursts", "page_marks", "pairwise_equal",
           "rotate", "rotation_stages", "word_layout"]

#: Lane-offset bits each registered stage of a rotation resolves (a 2:1 choice per bit;
#: beside the alternate registers' own choice one LUT, where a 4:1 choice made three levels).
STAGE_BITS = 1

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


def beat_position(addr, enable, lanes):
    """Where an element-addressed beat of ``lanes`` elements at ``addr`` (``enable``: its
    elements wanted) falls on the bus words: ``(offset, low, spills)``, its lane 0's lane in
    the word (element l goes to lane ``(l + offset) mod lanes``), the lanes below the offset
    (those of the next word), as one compare per lane, and the enabled elements that land
    there, in the next word (element l does when l + offset >= lanes: lane lanes - 1 - l is
    below the offset)."""
    shift = exact_log2(lanes)
    offset = addr[:shift] if shift else Const(0, 1)
    low = Cat(offset > n for n in range(lanes))
    return offset, low, enable & Cat(low[lanes - 1 - n] for n in range(lanes))


def pairwise_equal(a, b):
    """Whether ``a`` and ``b`` are equal in each two bits (bit k: bits 2k and 2k + 1), one
    LUT each: registered, their AND is the equality a stage later, as a gate of registers
    rather than a compare's tree behind a register."""
    return Cat(a[k:k + 2] == b[k:k + 2] for k in range(0, len(a), 2))


def page_marks(m, word, base_word, page_bits, *, last=True):
    """``(first, last)``: whether bus word ``word`` (before the base's add) starts a 4 KiB
    page at ``base_word + word``, and whether it ends one (its next starts one), each an
    equality of its low ``page_bits`` bits with a register (-base, ~base = -base - 1) rather
    than a compare after the add. The registers follow the base a cycle late: it must hold
    from the cycle before the first word. With no page bits (a bus word of 4 KiB) both are 1.
    ``last=False``: only ``first`` (``last`` is None), and no register for the other. (An
    unused second register changed the write master's netlist by 10 LUTs, and its placement
    lost about 20 MHz on each of three seeds.)"""
    if page_bits <= 0:
        return Const(1, 1), Const(1, 1) if last else None
    low = word[:page_bits]
    page_base = Signal(page_bits)               # -base_word mod 2 ** page_bits
    m.d.sync += page_base.eq(-base_word[:page_bits])
    if not last:
        return low == page_base, None
    page_end = Signal(page_bits)                # ~base_word mod 2 ** page_bits
    m.d.sync += page_end.eq(~base_word[:page_bits])
    return low == page_base, low == page_end


def rotate(value, width, offset, stage, *, down=False):
    """Stage ``stage`` of the rotation of ``value`` (lanes of ``width`` bits) towards the high
    lanes (towards the low ones when ``down``) by the lane offset ``offset``: by its
    :data:`STAGE_BITS` bits from bit ``stage * STAGE_BITS`` on, shifted up as far, a choice
    per output lane among 2 ** STAGE_BITS input lanes. The :func:`rotation_stages` stages,
    each registered, are the offset's rotation."""
    lanes = len(value) // width
    shift = exact_log2(lanes)
    low_bit = stage * STAGE_BITS
    bits = offset[low_bit:min(shift, low_bit + STAGE_BITS)]
    sign = 1 if down else -1
    out = []
    for n in range(lanes):
        choices = [value.word_select((n + sign * (k << low_bit)) % lanes, width)
                   for k in range(1 << len(bits))]
        for bit in range(len(bits)):
            choices = [Mux(bits[bit], choices[k + 1], choices[k])
                       for k in range(0, len(choices), 2)]
        out.append(choices[0])
    return Cat(out)


def rotation_stages(shift):
    """Registered stages (at least one) that rotate by a lane offset of ``shift`` bits,
    :data:`STAGE_BITS` bits each."""
    return max(1, -(-shift // STAGE_BITS))


def form_bursts(m, *, valid, word, continues, room, commands, max_burst):
    """Group bus words arriving in order (``word``, counted from the buffer's base: the
    commands' queue adds it, :func:`burst_commands`; when ``valid``) into INCR
    bursts: a burst grows while words arrive one after another at consecutive addresses and
    closes (its ``word`` and ``len`` written to ``commands``, a FIFO) when a word does not
    continue it, when it holds ``max_burst`` beats, when the word starts a new 4 KiB page,
    or in a cycle in which no word arrives. ``continues`` (a gate of registers, worked out
    by the caller a stage earlier): the word is the previous word plus one and starts no
    new page, so that the choice to extend is made from registers alone; the burst's being
    full is a register too. ``room`` (a register): the caller can take a word. A word waits
    while an open burst could not close (``commands`` has no room), even one that would
    extend it, so that ``ready`` is a gate of registers alone. Returns ``(ready, take,
    is_open)``: a word can be taken, a word is taken, a burst is open."""
    is_open = Signal()
    start = Signal.like(word)
    length = Signal(8)                          # AxLEN: beats - 1
    at_max = Signal()                           # the open burst holds max_burst beats
    extend = is_open & continues & ~at_max
    # (with ``extend`` in it, the word's own flags ran through ``ready`` into the write
    # master's input read pointers: 4 levels)
    ready = room & (~is_open | commands.w_rdy)
    take = valid & ready
    close = is_open & Mux(take, ~extend, commands.w_rdy)
    m.d.comb += [commands.w_en.eq(close), commands.w_data.word.eq(start),
                 commands.w_data.len.eq(length)]
    with m.If(take):
        with m.If(extend):
            m.d.sync += [length.eq(length + 1), at_max.eq(length == max_burst - 2)]
        with m.Else():
            m.d.sync += [is_open.eq(1), start.eq(word), length.eq(0),
                         at_max.eq(max_burst == 1)]
    with m.Elif(close):
        m.d.sync += is_open.eq(0)
    return ready, take, is_open


def burst_commands(m, command, base_word, depth=5):
    """The queue of closed bursts' commands (``command``: ``word``, ``len``), fed by
    :func:`form_bursts` through a register. Returns ``(cmd, closing, waiting)``: the queue (a
    :class:`~moe_hw.stream.RegisteredFIFO` of ``depth``, submodule ``commands``), the
    former's ``commands`` argument (``w_en``, ``w_data``, ``w_rdy``) and the register that
    holds a closed command.

    A closed burst's command waits a cycle in a register before the queue, so that the
    queue's head does not load in the cycle of the close (the input's flags through the
    close into the head's clock enable: 4 levels, 217.2 MHz in the write master). The former
    sees room while the queue, with the command waiting, has two free entries (a register): a
    command it closes then always finds room a cycle later. The former counts words from the
    buffer's base: a burst's bus address is the base's add into the waiting register (an add
    in front of the former's input register, a carry chain then the skid buffer's choice, was
    as long as the former's paths)."""
    cmd = m.submodules.commands = RegisteredFIFO(command, depth)
    closing = SimpleNamespace(w_en=Signal(name="closing"), w_data=Signal(command),
                              w_rdy=Signal(init=1, name="closing_room"))
    # (a closed command waits for the queue; its data is read only beside the flag)
    absolute = Signal(command)
    m.d.comb += [absolute.word.eq(closing.w_data.word + base_word),
                 absolute.len.eq(closing.w_data.len)]
    waiting = delay(m, closing.w_en, 1, 1, name="waiting")
    waiting_data = delay(m, absolute, 1, 1, name="waiting_data", reset_less=True)
    m.d.sync += closing.w_rdy.eq(cmd.level + waiting <= cmd.depth - 2)
    m.d.comb += [cmd.w_en.eq(waiting), cmd.w_data.eq(waiting_data)]
    return cmd, closing, waiting


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

    @property
    def rotation_stages(self):
        """Registered stages of the rotation (at least one)."""
        return rotation_stages(self.shift)

    @property
    def latency(self):
        """Cycles from a beat on ``i`` to its word on ``o`` (no stalls): the input register,
        the rotation's stages, the merge's output register."""
        return 2 + self.rotation_stages

    def elaborate(self, platform):
        m = Module()
        lanes, width, shift = self.lanes, self.width, self.shift
        skids = []

        # ---- the input register: the rotation starts from flip-flops ----------------------
        # Every bus-wide field of the realigner's stages is held in two registers written in
        # turn (SkidBuffer's ``alternate``): their loads are registers, not a decision
        # fanned out to a bus-wide clock enable (the merge's flush, a stage's ready).
        # ``same``: for each two bits of the address, whether the beat's are those of the
        # last beat taken plus ``lanes``, one LUT each as the beat comes in, so that the
        # beat's following that one is a gate of registers in the next stage (a 24-bit
        # compare there, behind the input register, was 4 levels).
        addr_width = len(self.i.payload.addr)
        arrival = data.StructLayout({**self.write_layout.members,
                                     "same": -(-addr_width // 2)})
        inp = m.submodules.input = SkidBuffer(arrival, alternate=("data",),
                                              group_bits=ALTERNATE_GROUP_BITS)
        expected = Signal(addr_width)           # the last beat taken's address, + lanes
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += expected.eq(self.i.payload.addr + lanes)
        m.d.comb += [
            inp.i.valid.eq(self.i.valid), self.i.ready.eq(inp.i.ready),
            *(inp.i.payload[name].eq(self.i.payload[name])
              for name in self.write_layout.members),
            inp.i.payload.same.eq(pairwise_equal(self.i.payload.addr, expected)),
        ]
        skids.append(inp)
        beat = inp.o.payload

        # ---- the rotation, :data:`STAGE_BITS` of the lane offset per registered stage ----
        # Element l of the beat goes to lane (l + offset) mod lanes. ``low``: the lanes below
        # the offset, which a continuing beat takes from the carry; ``follows``: the beat's
        # address is the previous beat's plus ``lanes`` (it continues that beat); ``rest``:
        # the offset bits the later stages resolve.
        # ``spill``: whether the beat has enabled elements in the next word (``low`` lanes),
        # as an OR over the elements that first marks each one (element l spills when
        # l + offset >= lanes) and then reduces four to one in each stage, so that the merge
        # reads it from a register rather than as a gate of all the lanes.
        addr = beat.addr
        offset, low, spills = beat_position(addr, beat.enable, lanes)
        follows = beat.same.all()
        source = {"word": addr[shift:], "data": Cat(beat.data[n] for n in range(lanes)),
                  "strb": beat.enable, "low": low, "follows": follows, "rest": offset,
                  "spill": spills}
        valid, ready = inp.o.valid, inp.o.ready
        for stage in range(self.rotation_stages):
            spill = source["spill"]
            if stage:
                spill = Cat(spill[n:n + 4].any() for n in range(0, len(spill), 4))
            rotation = data.StructLayout({"word": self.word_width, "data": lanes * width,
                                          "strb": lanes, "low": lanes, "follows": 1,
                                          "rest": max(1, shift), "spill": len(spill)})
            rot = m.submodules[f"rotate{stage}"] = SkidBuffer(
                rotation, alternate=("data",), group_bits=ALTERNATE_GROUP_BITS)
            skids.append(rot)
            m.d.comb += [
                rot.i.valid.eq(valid), ready.eq(rot.i.ready),
                rot.i.payload.word.eq(source["word"]),
                rot.i.payload.data.eq(rotate(source["data"], width, source["rest"], stage)),
                rot.i.payload.strb.eq(rotate(source["strb"], 1, source["rest"], stage)),
                rot.i.payload.low.eq(source["low"]), rot.i.payload.follows.eq(source["follows"]),
                rot.i.payload.rest.eq(source["rest"]), rot.i.payload.spill.eq(spill),
            ]
            r = rot.o.payload
            source = {name: r[name] for name in rotation.members}
            valid, ready = rot.o.valid, rot.o.ready

        # ---- merge with the carry, or let the carry out alone ------------------------------
        skid = m.submodules.skid = SkidBuffer(self.o.payload.shape(), alternate=("data",),
                                              group_bits=ALTERNATE_GROUP_BITS)
        wiring.connect(m, skid.o, wiring.flipped(self.o))
        skids.append(skid)
        r = source
        carry_valid = Signal()                    # set only by the beat just before
        carry_data = Signal(lanes * width, reset_less=True)
        carry_en = Signal(lanes)
        carry_low = Signal(lanes)                 # the carry's lanes; 0 without a carry
        carry_word = Signal(self.word_width)
        continues = carry_valid & r["follows"]
        flush = carry_valid & ~(valid & continues)
        # The choices are registers: a beat that continues the carry has the carry's offset
        # (so its low lanes are the carry's) and the carry's word; lanes that the carry does
        # not hold come from the beat, and are enabled only when they are the beat's.
        merged = Cat(Mux(carry_low[n], carry_data.word_select(n, width),
                         r["data"].word_select(n, width)) for n in range(lanes))
        merged_en = Mux(flush, carry_en,
                        (r["low"] & carry_en & continues.replicate(lanes)) |
                        (~r["low"] & r["strb"]))
        m.d.comb += [
            skid.i.valid.eq(carry_valid | valid),          # flush | valid, as two registers
            ready.eq(skid.i.ready & ~flush),
            skid.i.payload.word.eq(Mux(carry_valid, carry_word, r["word"])),
            skid.i.payload.data.eq(merged),
            skid.i.payload.strb.eq(merged_en),
            self.busy.eq(carry_valid | Cat(s.held for s in skids).any()),
        ]
        spills = r["spill"].any()
        with m.If(skid.i.ready):
            with m.If(flush):
                m.d.sync += [carry_valid.eq(0), carry_low.eq(0)]
            with m.Elif(valid):
                m.d.sync += [carry_valid.eq(spills), carry_low.eq(Mux(spills, r["low"], 0))]
        # The carry's data, lanes and word load without the flush decision: a flushed carry
        # is not read again (its flag and lanes are cleared), and the beat that waits behind
        # the flush loads them again when it is taken.
        with m.If(skid.i.ready & valid):
            m.d.sync += [carry_data.eq(r["data"]), carry_en.eq(r["strb"] & r["low"]),
                         carry_word.eq(r["word"] + 1)]
        return m


class AxiWriteMaster(wiring.Component):
    """Bus words (``i``: :func:`word_layout`) as AXI4 write bursts on ``<prefix>_*``; see the
    module docstring. ``bram``: how the word FIFO is built (a
    :class:`~moe_hw.blocks.block_memory.BlockMemory` target)."""

    def __init__(self, prefix, *, lanes, width, word_width, addr_width=32, max_burst=256,
                 outstanding=4, fifo_depth=512, id_width=1, bram="generic"):
        check_bus(self, lanes=lanes, width=width, addr_width=addr_width, max_burst=max_burst,
                  outstanding=outstanding, fifo_depth=fifo_depth)
        self.prefix = prefix
        self.lanes, self.width = lanes, width
        self.word_width = word_width
        self.id_width = id_width
        self.bram = check_choice("bram", bram, MEMORY_TARGETS)
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
        entry_width = lanes * width + lanes

        # ---- the input register: each word's bus address and its relation to the one
        # before, from registers, so that the burst former decides from flip-flops ----------
        # ``same``: the word and the last word in plus one, equal in each two bits
        # (:func:`pairwise_equal`), so that the former's ``continues`` is a gate of registers
        # (the whole compare in front of this register was the wrapped dispatch's path).
        page_bits = 12 - self.size
        after = Signal(self.word_width + 1)        # the last word in, + 1 (no wrap)
        same = pairwise_equal(Cat(self.i.payload.word, Const(0, 1)), after)
        arrival = data.StructLayout({"word": self.bus_word_width, "same": len(same), "page": 1,
                                     "entry": entry_width})
        inp = m.submodules.input = SkidBuffer(arrival, alternate=("entry",),
                                              group_bits=ALTERNATE_GROUP_BITS)
        beat = self.i.payload
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += after.eq(beat.word + 1)
        page, _ = page_marks(m, beat.word, self.base_word, page_bits, last=False)
        m.d.comb += [
            inp.i.valid.eq(self.i.valid), self.i.ready.eq(inp.i.ready),
            inp.i.payload.word.eq(beat.word),          # base_word is added at the close
            inp.i.payload.same.eq(same),
            inp.i.payload.page.eq(page),               # the word starts a 4 KiB page
            inp.i.payload.entry.eq(Cat(beat.data, beat.strb)),
        ]
        word = inp.o.payload

        # ---- burst former --------------------------------------------------------------------
        command = data.StructLayout({"word": self.bus_word_width, "len": 8})
        cmd, closing, waiting = burst_commands(m, command, self.base_word)
        fifo_room = Signal(init=1)                  # the word FIFO has room (a register)
        ready, take, is_open = form_bursts(m, valid=inp.o.valid, word=word.word,
                                           continues=word.same.all() & ~word.page,
                                           room=fifo_room, commands=closing,
                                           max_burst=self.max_burst)
        m.d.comb += inp.o.ready.eq(ready)

        # ---- the word FIFO: a block RAM (registered write, two-cycle read) read ahead into
        # a credit-counted queue; every flag is a register -----------------------------------
        ahead, empty = block_fifo(m, "", width=entry_width, depth=self.fifo_depth,
                                  target=self.bram, write=take, data=word.entry,
                                  room=fifo_room, wide=True, group_bits=ALTERNATE_GROUP_BITS)

        # ---- AW: bursts go out while fewer than ``outstanding`` await their response -------
        in_flight = Signal(range(self.outstanding + 1))
        slot = Signal(init=1)                       # in_flight != outstanding (a register)
        lengths = m.submodules.lengths = RegisteredFIFO(8, self.outstanding + 2)
        aw = m.submodules.aw = SkidBuffer(command)
        can_issue = cmd.r_rdy & slot & lengths.w_rdy
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
        # The W side's control reads the W buffer's ready from a copy of its own (the
        # buffer's flag sits among the bus-wide data registers it chooses, and its net to the
        # length's load was the wrapped dispatch's path). The copy reads 0 in the cycle
        # after reset, when nothing is active.
        w = m.submodules.w = SkidBuffer(data.StructLayout({
            "data": lanes * width, "strb": self.bus_bytes, "last": 1}), ready_next=True)
        w_ready, = replicated(m, w.ready_next, name="w_ready", copies=1, apart=True)
        # The next burst's length comes through a skid buffer, so that the W side's load
        # (a gate of its flags) reaches that buffer's flags, not the length queue's fill
        # (4 levels from the W register's flag).
        next_len = m.submodules.next_len = SkidBuffer(8)
        active = Signal()
        left = Signal(8)                            # beats after the one in hand
        last = Signal()                             # left == 0 (a register)
        sending = active & ahead.o.valid & w_ready
        wants = ~active | (sending & last)          # the W side can take the next length
        load = next_len.o.valid & wants
        lane_bytes = width // 8
        entry = ahead.o.payload.data
        strb = entry[lanes * width:]
        m.d.comb += [
            w.i.valid.eq(active & ahead.o.valid), ahead.o.ready.eq(active & w_ready),
            w.i.payload.data.eq(entry[:lanes * width]),
            w.i.payload.strb.eq(Cat(strb[n].replicate(lane_bytes) for n in range(lanes))),
            w.i.payload.last.eq(last),
            next_len.i.valid.eq(lengths.r_rdy), next_len.i.payload.eq(lengths.r_data),
            lengths.r_en.eq(next_len.i.ready), next_len.o.ready.eq(wants),
            p("wdata").eq(w.o.payload.data), p("wstrb").eq(w.o.payload.strb),
            p("wlast").eq(w.o.payload.last), p("wvalid").eq(w.o.valid),
            w.o.ready.eq(p("wready")),
        ]
        with m.If(sending):
            m.d.sync += [left.eq(left - 1), last.eq(left == 1)]
            with m.If(last):
                m.d.sync += active.eq(0)
        with m.If(load):
            m.d.sync += [active.eq(1), left.eq(next_len.o.payload),
                         last.eq(next_len.o.payload == 0)]

        # ---- B -------------------------------------------------------------------------------
        answered = p("bvalid")
        m.d.comb += p("bready").eq(1)
        m.d.sync += self.bus_error.eq(answered & (p("bresp") != 0))
        count_level(m, in_flight, issue, answered, [(slot, False, self.outstanding)])
        m.d.comb += self.idle.eq(~inp.held & ~is_open & ~waiting & empty & ~ahead.busy &
                                 ~cmd.r_rdy & (in_flight == 0))
        return m
