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
What the response side needs to put the beat back together (where the first word comes
from, whether a second follows, the offset) goes to the plan queue, one entry per request.
Registered stages: the request's position (:func:`~moe_hw.axi.write_master.beat_position`,
the base address added, whether its word starts or ends a 4 KiB page), then the words one
per cycle, each with whether it continues the word before on the same page (so the burst
former decides from registers).

**Bursts** (:func:`~moe_hw.axi.write_master.form_bursts`, the write master's burst former):
consecutive words become INCR bursts of at most ``max_burst`` beats that never cross a 4 KiB
boundary; their commands wait in a queue.

**AR**: a burst is issued when fewer than ``outstanding`` bursts are in flight (issued and
not finished by ``rlast``) and the response FIFO (``fifo_depth`` words, a block RAM) has
``max_burst`` words not yet reserved (so room for all its beats: they are reserved at the
issue), so ``rready`` is always 1 and R never waits. Both are registers. The response FIFO
and the plan queue (``fifo_depth`` entries) are the write master's
:func:`~moe_hw.axi.write_master.block_fifo`: a
:class:`~moe_hw.blocks.block_memory.BlockMemory` (``bram``: ``ecp5`` for DP16KD blocks with
their output registers) read ahead into a :class:`~moe_hw.stream.CreditPipeline`'s queue,
so that the assembly decides from registers. A response other
than OKAY raises ``bus_error`` for one cycle (the data is passed on as it came).

**Assemble** (the response side of the realignment): per plan entry, the first word is the
previous word (the *carry*: the word the previous request spilled into) or the next word off
the FIFO, and a spilling request takes one word more. The two words are merged per lane (the
lanes below the offset from the second) in a registered stage, then rotated by the offset
into the response's lane order with the write path's
:func:`~moe_hw.axi.write_master.rotate`, a 4:1 choice per bit for each two bits of the
offset, one registered stage each (one stage up to 4 lanes, two up to 16): the response
leaves from the last stage's skid buffer.

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

from ..stream import ALTERNATE_GROUP_BITS, RegisteredFIFO, SkidBuffer
from ..blocks.block_memory import MEMORY_TARGETS
from ..params import check_choice
from .write_master import (AWBURST_INCR, AWCACHE, beat_position, block_fifo,
                           check_bus, count_level, form_bursts, page_marks, rotate,
                           rotation_stages)

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

    #: Lane-offset bits each rotation stage resolves (a 4:1 choice per bit).
    STAGE_BITS = 2

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

        # ---- split, stage 1: the request's position on the bus words (registered) --------
        position = data.StructLayout({"word": word_width, "offset": max(1, shift),
                                      "low": lanes, "spill": 1, "follows": 1,
                                      "page_first": 1, "page_last": 1})
        pre = m.submodules.position = SkidBuffer(position)
        req = self.request.payload
        offset, low, follows = beat_position(m, req.addr, lanes,
                                             self.request.valid & self.request.ready)
        word = Signal(word_width)
        m.d.comb += word.eq(self.base_word + req.addr[shift:])
        page_bits = 12 - self.size
        # The word starts a 4 KiB page; it is a page's last (its next starts one).
        page_first, page_last = page_marks(m, req.addr[shift:], self.base_word, page_bits)
        m.d.comb += [
            pre.i.valid.eq(self.request.valid), self.request.ready.eq(pre.i.ready),
            pre.i.payload.word.eq(word),
            pre.i.payload.page_first.eq(page_first),
            pre.i.payload.page_last.eq(page_last),
            pre.i.payload.offset.eq(offset), pre.i.payload.low.eq(low),
            # An enabled lane lands below the offset once rotated (element l does when
            # l + offset >= lanes: lane lanes - 1 - l is below the offset): the next word.
            pre.i.payload.spill.eq((req.enable & Cat(low[lanes - 1 - n]
                                                     for n in range(lanes))).any()),
            pre.i.payload.follows.eq(follows),
        ]

        # ---- split, stage 2: the words, one per cycle, and the plan ----------------------
        plan_layout = data.StructLayout({"carry": 1, "spill": 1, "low": lanes,
                                         "offset": max(1, shift)})
        plan_room = Signal(init=1)               # the plan queue has room (a register)
        # ``continues``: the word is the previous word plus one and starts no new page (for
        # the burst former, from registers).
        words = m.submodules.words = SkidBuffer(data.StructLayout({"word": word_width,
                                                                   "continues": 1}))
        r = pre.o.payload
        last_spill = Signal()                    # the previous request read its next word
        half = Signal()                          # this request's first word is issued
        carry = r.follows & last_spill
        first = ~carry & ~half                   # the request's first word is to be read
        has_word = first | r.spill
        final = ~(first & r.spill)               # this step ends the request
        plan_ok = plan_room | ~final
        go = pre.o.valid & plan_ok & (words.i.ready | ~has_word)
        plan = Signal(plan_layout)
        after = Signal(word_width)               # the last word issued, plus one
        m.d.comb += [
            words.i.valid.eq(pre.o.valid & has_word & plan_ok),
            words.i.payload.word.eq(Mux(first, r.word, r.word + 1)),
            words.i.payload.continues.eq(Mux(first, (r.word == after) & ~r.page_first,
                                             ~r.page_last)),
            plan.carry.eq(carry), plan.spill.eq(r.spill), plan.low.eq(r.low),
            plan.offset.eq(r.offset),
            pre.o.ready.eq(go & final),
        ]
        plans, plans_empty = block_fifo(m, "plans", width=plan_layout.size,
                                        depth=self.fifo_depth, target=self.bram,
                                        write=go & final, data=plan, room=plan_room)
        with m.If(words.i.valid & words.i.ready):
            m.d.sync += after.eq(Mux(first, r.word + 1, r.word + 2))
        with m.If(go):
            m.d.sync += half.eq(~final)
            with m.If(final):
                m.d.sync += last_spill.eq(r.spill)

        # ---- bursts ------------------------------------------------------------------------
        command = data.StructLayout({"word": word_width, "len": 8})
        cmd = m.submodules.commands = RegisteredFIFO(command, 4)
        ready, _, is_open = form_bursts(m, valid=words.o.valid, word=words.o.payload.word,
                                        continues=words.o.payload.continues, room=1,
                                        commands=cmd, max_burst=self.max_burst)
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
        got_first = Signal()                     # the head's first word is in ``kept``
        first_ready = head.carry | got_first
        need_word = ~first_ready | head.spill
        store_only = ~first_ready & head.spill   # this step only keeps the first word
        step_ok = plans.o.valid & (~need_word | fifo.o.valid)
        step = step_ok & (store_only | merge.i.ready)
        low_word = Mux(first_ready, kept, word_in)
        m.d.comb += [
            merge.i.valid.eq(step_ok & ~store_only),
            merge.i.payload.data.eq(Cat(
                Mux(head.low[n], word_in.word_select(n, width),
                    low_word.word_select(n, width)) for n in range(lanes))),
            merge.i.payload.offset.eq(head.offset),
            fifo.o.ready.eq(step & need_word),
            plans.o.ready.eq(step & ~store_only),
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
        with m.If(step):
            m.d.sync += got_first.eq(store_only)
            with m.If(need_word):
                m.d.sync += kept.eq(word_in)

        # ---- assemble, stage 2: rotated into the response's lane order, the offset's bits
        # resolved a few per registered stage as in the write path ------------------------
        turning = data.StructLayout({"data": bits, "offset": max(1, shift)})
        valid, ready, source = merge.o.valid, merge.o.ready, merge.o.payload
        stages = []
        for stage in range(rotation_stages(shift, self.STAGE_BITS)):
            rot = m.submodules[f"rotate{stage}"] = SkidBuffer(
                turning, alternate=("data",), group_bits=ALTERNATE_GROUP_BITS)
            stages.append(rot)
            low_bit = stage * self.STAGE_BITS
            turn = source.offset[low_bit:min(shift, low_bit + self.STAGE_BITS)]
            m.d.comb += [
                rot.i.valid.eq(valid), ready.eq(rot.i.ready),
                rot.i.payload.data.eq(rotate(source.data, width, turn, low_bit, down=True)),
                rot.i.payload.offset.eq(source.offset),
            ]
            valid, ready, source = rot.o.valid, rot.o.ready, rot.o.payload
        m.d.comb += [
            self.response.valid.eq(valid), ready.eq(self.response.ready),
            self.response.payload.data.eq(source.data),
        ]

        m.d.comb += self.idle.eq(~pre.held & ~half & ~words.held & ~is_open &
                                 ~cmd.r_rdy & (in_flight == 0) & fifo_empty &
                                 ~fifo.busy & plans_empty & ~plans.busy & ~merge.held &
                                 ~Cat(rot.held for rot in stages).any())
        return m
