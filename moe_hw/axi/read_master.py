"""A unit's memory read port as an AXI4 master read channel set (AR, R).

A unit's read port is a request stream (``addr``: the element address of lane 0,
``enable``: the lanes wanted) and a response stream (``data``: ``lanes`` elements, one
response per request, in request order). :class:`AxiReadMaster` serves it from AXI4 read
bursts, in four parts:

**Split** (the request side of the realignment, as in
:class:`~moe_hw.axi.write_master.WriteRealign`): the bus is ``lanes`` elements wide, and a
request whose address is not a multiple of ``lanes`` (a row of H elements, H not a multiple
of the lanes) straddles two bus words when its enabled lanes reach past the first one (it
*spills*). Each request becomes the bus words it needs, in order: its first word, unless it
continues the previous request (its address is the previous one's plus ``lanes``) and that
one spilled (the word was read then), and the next word if it spills. An aligned request is
one word; an unaligned run of consecutive requests costs one word more than its requests.
What the response side needs to put the beat back together (whether the step takes a word,
whether it only keeps it, where the first word comes from, the offset) goes to the plan
queue, one entry per word step. Registered stages: the request's position
(:func:`~moe_hw.axi.write_master.beat_position`, whether its word starts or ends a 4 KiB
page, and its word address compared with the last request's plus one and plus two, per two
bits), then those compares joined (whether it continues the last request's spill, whether
its first word follows the last word read), then the words one per cycle, each with whether
it continues the word before on the same page (so the burst former decides from
registers). A step waits for room in both the word and the plan queues, so that it is a
gate of registers. Word addresses are counted from the buffer's base until a burst closes.

**Bursts** (:func:`~moe_hw.axi.write_master.form_bursts`, the write master's burst former):
consecutive words become INCR bursts of at most ``max_burst`` beats that never cross a 4 KiB
boundary; their commands, with the base added, wait in a queue
(:func:`~moe_hw.axi.write_master.burst_commands`, the write master's).

**AR**: a burst is issued when fewer than ``outstanding`` bursts are in flight (issued and
not finished by ``rlast``) and the response FIFO (``fifo_depth`` words, a block RAM) has
``max_burst`` words not yet reserved (so room for all its beats: they are reserved at the
issue), so ``rready`` is always 1 and R never waits. Both are registers. The response FIFO
and the plan queue (``fifo_depth`` entries) are
:func:`~moe_hw.blocks.block_fifo.block_fifo`: a
:class:`~moe_hw.blocks.block_memory.BlockMemory` (``bram``: ``ecp5`` for DP16KD blocks with
their output registers) read ahead into a :class:`~moe_hw.stream.CreditPipeline`'s queue,
so that the assembly decides from registers. A response other
than OKAY raises ``bus_error`` for one cycle (the data is passed on as it came).

**Assemble** (the response side of the realignment): per request, the first word is the
previous word (the *carry*: the word the previous request spilled into) or the next word off
the FIFO, and a spilling request takes one word more (a plan entry that only keeps the first
word, then one that takes the second). The two words are merged per lane (the lanes below
the offset from the second) in a registered stage, then rotated by the offset into the
response's lane order with the write path's :func:`~moe_hw.axi.write_master.rotate`, a 2:1
choice per bit for each bit of the offset, one registered stage each (three at 8 lanes, four
at 16: beside the alternate registers' own choice one LUT, where a 4:1 choice made three
levels): the response leaves from the last stage's skid buffer.

``idle``: nothing is held (no request, word, burst, plan or response inside). ``base_word``
(the buffer's base address in bus words) is added to every word address; it must hold while
the master is not idle, and from the cycle before the first request (its page position is
registered). Every AXI output is a register (a skid buffer on AR, constants
elsewhere).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..stream import ALTERNATE_GROUP_BITS, SkidBuffer
from ..blocks.block_fifo import block_fifo, count_level
from ..blocks.block_memory import MEMORY_TARGETS
from ..params import check_choice
from .write_master import (AWBURST_INCR, AWCACHE, beat_position, burst_commands, check_bus,
                           form_bursts, page_marks, pairwise_equal, rotate, rotation_stages)

__all__ = ["AxiReadMaster", "axi_read_members"]


def axi_read_members(prefix, *, addr_width, data_width, id_width=1):
    """The AXI4 master read channels ``<prefix>_ar*``, ``_r*`` as signature members."""
    return {
        f"{prefix}_arid": Out(id_width), f"{prefix}_araddr": Out(addr_width),
        f"{prefix}_arlen": Out(8), f"{prefix}_arsize": Out(3), f"{prefix}_arburst": Out(2),
        f"{prefix}_arlock": Out(1), f"{prefix}_arcache": Out(4), f"{prefix}_arprot": Out(3),
        f"{prefix}_arvalid": Out(1), f"{prefix}_arready": In(1),
        f"{prefix}_rid": In(id_width), f"{prefix}_rdata": In(data_width),
        f"{prefix}_rresp": In(2), f"{prefix}_rlast": In(1), f"{prefix}_rvalid": In(1),
        f"{prefix}_rready": Out(1),
    }


class AxiReadMaster(wiring.Component):
    """A read port (``request``: ``request_layout``, ``response``: ``response_layout``, as
    :class:`~moe_hw.blocks.row_reader.RowReader`'s) served by AXI4 read bursts on
    ``<prefix>_*``; see the module docstring. ``bram``: how the plan queue and the response
    FIFO are built (a :class:`~moe_hw.blocks.block_memory.BlockMemory` target)."""

    def __init__(self, prefix, request_layout, response_layout, *, addr_width=32,
                 max_burst=256, outstanding=4, fifo_depth=512, id_width=1, bram="generic"):
        array = response_layout["data"].shape
        self.lanes, self.width = array.length, Shape.cast(array.elem_shape).width
        check_bus(self, lanes=self.lanes, width=self.width, addr_width=addr_width,
                  max_burst=max_burst, outstanding=outstanding, fifo_depth=fifo_depth)
        if fifo_depth < max_burst:
            raise ValueError(f"fifo_depth ({fifo_depth}) must hold a whole burst of max_burst "
                             f"({max_burst}) beats")
        self.prefix, self.id_width = prefix, id_width
        self.bram = check_choice("bram", bram, MEMORY_TARGETS)
        self.shift = exact_log2(self.lanes)
        self.request_layout, self.response_layout = request_layout, response_layout
        super().__init__({
            "request": In(stream.Signature(request_layout)),
            "response": Out(stream.Signature(response_layout)),
            "base_word": In(self.bus_word_width),
            "idle": Out(1), "bus_error": Out(1),
            **axi_read_members(prefix, addr_width=addr_width, data_width=self.data_width,
                               id_width=id_width),
        })

    def elaborate(self, platform):
        m = Module()
        p = lambda name: getattr(self, f"{self.prefix}_{name}")     # noqa: E731
        lanes, width, shift = self.lanes, self.width, self.shift
        bits = lanes * width
        word_width = self.bus_word_width

        # ---- split, stage 1: the request's position on the bus words (registered), and
        # how it follows the one before, as compares per two bits of its word address ------
        # Word addresses are counted from the buffer's base (a burst's bus address is the
        # base's add as it closes, :func:`burst_commands`). ``after1``, ``after2``: the last
        # request's word plus one and plus two. The request follows the last one (its address
        # is that one's plus ``lanes``) when its offset is the last one's and its word is
        # ``after1``; its first word continues the last word read (``after``, as a word
        # address) when its word is ``after2`` if the last request spilled, else ``after1``.
        req = self.request.payload
        take = self.request.valid & self.request.ready
        rel = Signal(word_width)
        word1 = Signal(word_width)
        m.d.comb += [rel.eq(req.addr[shift:]), word1.eq(rel + 1)]
        offset, low, spills = beat_position(req.addr, req.enable, lanes)
        spill = spills.any()                     # the request reads the next word too
        after1 = Signal(word_width)
        after2 = Signal(word_width)
        after_spill = Signal()                   # the last request spilled
        last_offset = Signal.like(offset)
        with m.If(take):
            m.d.sync += [after1.eq(word1), after2.eq(rel + 2), after_spill.eq(spill),
                         last_offset.eq(offset)]
        page_bits = 12 - self.size
        # The word starts a 4 KiB page; it is a page's last (its next starts one).
        page_first, page_last = page_marks(m, rel, self.base_word, page_bits)
        position = data.StructLayout({"word": word_width, "word1": word_width,
                                      "offset": max(1, shift), "low": lanes, "spill": 1,
                                      "same1": -(-word_width // 2),
                                      "same2": -(-word_width // 2),
                                      "same_offset": 1, "after_spill": 1,
                                      "page_first": 1, "page_last": 1})
        pre = m.submodules.position = SkidBuffer(position)
        m.d.comb += [
            pre.i.valid.eq(self.request.valid), self.request.ready.eq(pre.i.ready),
            pre.i.payload.word.eq(rel), pre.i.payload.word1.eq(word1),
            pre.i.payload.page_first.eq(page_first),
            pre.i.payload.page_last.eq(page_last),
            pre.i.payload.offset.eq(offset), pre.i.payload.low.eq(low),
            pre.i.payload.spill.eq(spill),
            pre.i.payload.same1.eq(pairwise_equal(rel, after1)),
            pre.i.payload.same2.eq(pairwise_equal(rel, after2)),
            pre.i.payload.same_offset.eq(offset == last_offset),
            pre.i.payload.after_spill.eq(after_spill),
        ]

        # ---- split, stage 2: the compares joined (registered) ------------------------------
        joined = data.StructLayout({"word": word_width, "word1": word_width,
                                    "offset": max(1, shift), "low": lanes, "spill": 1,
                                    "carry": 1, "after": 1,
                                    "page_first": 1, "page_last": 1})
        joins = m.submodules.joins = SkidBuffer(joined)
        q = pre.o.payload
        m.d.comb += [
            joins.i.valid.eq(pre.o.valid), pre.o.ready.eq(joins.i.ready),
            *(joins.i.payload[name].eq(q[name])
              for name in ("word", "word1", "offset", "low", "spill", "page_first",
                           "page_last")),
            # The request's first word is the one the last request spilled into.
            joins.i.payload.carry.eq(q.after_spill & q.same_offset & q.same1.all()),
            joins.i.payload.after.eq(Mux(q.after_spill, q.same2.all(), q.same1.all())),
        ]

        # ---- split, stage 3: the words, one per cycle, and the plan ----------------------
        # One plan entry per step: ``word``, the step takes a word off the response FIFO;
        # ``store``, it only keeps it (the first of a request's two words); ``kept``, the
        # request's first word is the one kept (a carry, or the word the step before
        # stored): the assembly's step is then a gate of registers.
        plan_layout = data.StructLayout({"word": 1, "store": 1, "kept": 1, "low": lanes,
                                         "offset": max(1, shift)})
        plan_room = Signal(init=1)               # the plan queue has room (a register)
        # ``continues``: the word is the previous word plus one and starts no new page (for
        # the burst former, from registers).
        words = m.submodules.words = SkidBuffer(data.StructLayout({"word": word_width,
                                                                   "continues": 1}))
        r = joins.o.payload
        half = Signal()                          # this request's first word is issued
        carry = r.carry
        first = ~carry & ~half                   # the request's first word is to be read
        has_word = first | r.spill
        final = ~(first & r.spill)               # this step ends the request
        # A step waits for room for a word and a plan entry even when it has no use for
        # one of them (both queues are full only behind a stalled bus), so that it is a
        # gate of three registers (with the room it needs, the request's flags and the
        # step's count reached the skid buffers' loads: 4 levels).
        go = joins.o.valid & plan_room & words.i.ready
        plan = Signal(plan_layout)
        m.d.comb += [
            words.i.valid.eq(joins.o.valid & has_word & plan_room),
            words.i.payload.word.eq(Mux(first, r.word, r.word1)),
            words.i.payload.continues.eq(Mux(first, r.after & ~r.page_first,
                                             ~r.page_last)),
            plan.word.eq(has_word), plan.store.eq(~final), plan.kept.eq(carry | half),
            plan.low.eq(r.low), plan.offset.eq(r.offset),
            joins.o.ready.eq(go & final),
        ]
        plans, plans_empty = block_fifo(m, "plans", width=plan_layout.size,
                                        depth=self.fifo_depth, target=self.bram,
                                        write=go, data=plan, room=plan_room)
        with m.If(go):
            m.d.sync += half.eq(~final)

        # ---- bursts ------------------------------------------------------------------------
        command = data.StructLayout({"word": word_width, "len": 8})
        cmd, closing, waiting = burst_commands(m, command, self.base_word)
        ready, _, is_open = form_bursts(m, valid=words.o.valid, word=words.o.payload.word,
                                        continues=words.o.payload.continues, room=1,
                                        commands=closing, max_burst=self.max_burst)
        m.d.comb += words.o.ready.eq(ready)

        # ---- AR: issued while bursts and the FIFO's room allow -----------------------------
        in_flight = Signal(range(self.outstanding + 1))
        # The unreserved words of the response FIFO, less ``max_burst`` (so that the room
        # compares are of this register with the head command's length, or with 0).
        spare = Signal(range(-self.max_burst, self.fifo_depth - self.max_burst + 1),
                       init=self.fifo_depth - self.max_burst)
        # Both conditions are registers, decided a cycle ahead from the counts' next values:
        # a slot for one more burst, and room for a burst of ``max_burst`` beats (whatever
        # the next command's length: the head command's length then reaches no compare on
        # the way to the issue; the FIFO holds at least two such bursts by default).
        slot = Signal(init=1)                    # in_flight < outstanding
        fits = Signal(init=1)                    # spare >= 0: room for max_burst words
        ar = m.submodules.ar = SkidBuffer(command)
        can_issue = cmd.r_rdy & slot & fits
        issue = can_issue & ar.i.ready
        m.d.comb += [
            ar.i.valid.eq(can_issue), ar.i.payload.eq(cmd.r_data), cmd.r_en.eq(issue),
            p("arid").eq(0), p("araddr").eq(Cat(Const(0, self.size), ar.o.payload.word)),
            p("arlen").eq(ar.o.payload.len), p("arsize").eq(self.size),
            p("arburst").eq(AWBURST_INCR), p("arlock").eq(0), p("arcache").eq(AWCACHE),
            p("arprot").eq(0), p("arvalid").eq(ar.o.valid), ar.o.ready.eq(p("arready")),
        ]

        # ---- R: always taken into the reserved room ----------------------------------------
        m.d.comb += p("rready").eq(1)
        fifo, fifo_empty = block_fifo(m, "responses", width=bits, depth=self.fifo_depth,
                                      target=self.bram, write=p("rvalid"), data=p("rdata"),
                                      wide=True, group_bits=ALTERNATE_GROUP_BITS)
        m.d.sync += self.bus_error.eq(p("rvalid") & (p("rresp") != 0))
        finished = p("rvalid") & p("rlast")
        count_level(m, in_flight, issue, finished, [(slot, False, self.outstanding)])

        # ---- assemble, stage 1: the request's words merged per lane (registered) -----------
        merged_layout = data.StructLayout({"data": bits, "offset": max(1, shift)})
        # The bus-wide data of the assembly's stages in two registers written in turn (as
        # in the realigner): their loads are registers, not a stage's ready fanned out.
        merge = m.submodules.merge = SkidBuffer(merged_layout, alternate=("data",),
                                                group_bits=ALTERNATE_GROUP_BITS)
        head = Signal(plan_layout)
        m.d.comb += head.eq(plans.o.payload)
        word_in = fifo.o.payload.data
        kept = Signal(bits, reset_less=True)     # the last word taken off the FIFO
        need_word = head.word
        step_ok = plans.o.valid & (~need_word | fifo.o.valid)
        # (a step that only stores waits for the merge's room too: the step is then one LUT)
        step = step_ok & merge.i.ready
        low_word = Mux(head.kept, kept, word_in)
        m.d.comb += [
            merge.i.valid.eq(step_ok & ~head.store),
            merge.i.payload.data.eq(Cat(
                Mux(head.low[n], word_in.word_select(n, width),
                    low_word.word_select(n, width)) for n in range(lanes))),
            merge.i.payload.offset.eq(head.offset),
            fifo.o.ready.eq(step & need_word),
            plans.o.ready.eq(step),
        ]
        # A word taken off the FIFO is counted free a cycle later (``popped``, a register):
        # the count's adders and the room's compares then start from registers alone.
        popped = Signal()
        m.d.sync += popped.eq(step & need_word)
        # An issued burst of len + 1 beats reserves its words: -(len + 1) is ~len with a
        # sign bit of 1 (no adder of its own).
        length = cmd.r_data.len
        m.d.sync += spare.eq(spare + Mux(issue, Cat(~length, Const(1, 1)).as_signed(), 0) +
                             popped)
        # ``fits`` of the next count, spare' >= 0: each case a compare of registers (after
        # an issue, spare - (len + 1) + popped >= 0 is spare > len, or spare >= len when a
        # word was popped), the handshakes choose.
        m.d.sync += fits.eq(Mux(issue, Mux(popped, spare >= length, spare > length),
                                Mux(popped, spare >= -1, spare >= 0)))
        with m.If(step & need_word):
            m.d.sync += kept.eq(word_in)

        # ---- assemble, stage 2: rotated into the response's lane order, the offset's bits
        # resolved a few per registered stage as in the write path ------------------------
        turning = data.StructLayout({"data": bits, "offset": max(1, shift)})
        valid, ready, source = merge.o.valid, merge.o.ready, merge.o.payload
        stages = []
        for stage in range(rotation_stages(shift)):
            rot = m.submodules[f"rotate{stage}"] = SkidBuffer(
                turning, alternate=("data",), group_bits=ALTERNATE_GROUP_BITS)
            stages.append(rot)
            m.d.comb += [
                rot.i.valid.eq(valid), ready.eq(rot.i.ready),
                rot.i.payload.data.eq(rotate(source.data, width, source.offset, stage,
                                             down=True)),
                rot.i.payload.offset.eq(source.offset),
            ]
            valid, ready, source = rot.o.valid, rot.o.ready, rot.o.payload
        m.d.comb += [
            self.response.valid.eq(valid), ready.eq(self.response.ready),
            self.response.payload.data.eq(source.data),
        ]

        m.d.comb += self.idle.eq(~pre.held & ~joins.held & ~half & ~words.held & ~is_open &
                                 ~waiting & ~cmd.r_rdy & (in_flight == 0) & fifo_empty &
                                 ~fifo.busy & plans_empty & ~plans.busy & ~merge.held &
                                 ~Cat(rot.held for rot in stages).any())
        return m
