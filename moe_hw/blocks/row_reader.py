"""The row reader: turns row commands into beat reads on a memory read port and lines the
in-order responses back up with their rows. The gather units (``sparse_gather``,
``combine_gather``, ``dispatch_backward_data``) are each a command generator in front of one
of these.

Streams and ports (payload fields are listed least significant first):

``command`` (in)
    One beat per row segment: ``addr`` (element address of the segment's first element),
    ``count`` (its beats, at least 1), ``tail`` (the segment ends its row, so its last beat
    carries the row's partial lane enables ``last_enable``), ``skip`` (read nothing: the
    segment's beats come out as zeros; a dropped or out-of-range row) and, when the reader was
    built with a ``tag_layout``, ``tag`` (carried to every beat of the segment; a field named
    by ``step_tag`` advances by ``lanes`` with each beat, like ``addr``).
``request`` (out)
    The memory read port's request stream: ``addr`` (element address of lane 0) and
    ``enable`` (the lanes wanted; lane l reads element ``addr + l``). ``count`` requests per
    segment that is not skipped, at ``addr``, ``addr + lanes``, ...; never one for a skipped
    segment, and never a lane past the row (``last_enable`` on a tail segment's last beat).
``response`` (in)
    The read port's response stream: ``data`` (``lanes`` elements), one per request, in
    request order, any latency, any pauses.
``beats`` (out)
    One beat per command beat, in command order: ``data`` (the response, or zeros for a
    skipped segment), ``enable``, ``last`` (the segment's last beat) and ``tag``.
``last_enable`` (in)
    The lane enables of a row's last beat (all ones when H is a multiple of ``lanes``); held
    for a run.
``busy`` (out)
    A command, a read in flight or a beat is still inside.

Throughput: one beat per cycle in and out, including back-to-back one-beat segments and
skipped segments, as long as the memory's latency L (below) is at most ``outstanding - 1``:
every issued beat (read or skipped) holds a slot of the in-flight queue from its issue until
it is joined with its data, L cycles at full rate, and no more than ``outstanding`` beats are
ever in flight, so the memory never holds more than that many unanswered requests. A longer
latency costs throughput, never correctness. A pause anywhere costs only its own cycles.

Latency (stall-free): a command taken at the end of cycle t issues its first request in cycle
t + 1; the response to a request taken at the end of cycle u, delivered L cycles after it
(``response.valid`` from cycle u + L), leaves on ``beats`` from cycle u + L + 1 (one skid
buffer register). A deep in-flight queue (``outstanding`` above 16, as behind an AXI master)
is a block RAM FIFO whose head is a beat's entry from
:data:`~moe_hw.blocks.block_fifo.BLOCK_FIFO_LATENCY` cycles after its issue, so there L
counts as at least that (:meth:`RowReader.join_latency`; a skipped beat's L as that too).
``response.ready`` and ``beats.valid`` do not depend combinationally on ``beats.ready``.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..params import LANES, check_choice, check_int
from .block_fifo import BLOCK_FIFO_LATENCY, block_fifo, block_fifo_depth
from .block_memory import MEMORY_TARGETS
from ..stream import RegisteredFIFO, SkidBuffer
from ..stream.credit import Ring

__all__ = ["RowReader", "row_beats", "last_enable", "last_enable_of"]


def row_beats(hidden, lanes):
    """Beats per row of ``hidden`` elements: ``ceil(hidden / lanes)``."""
    return -(-hidden // lanes)


def last_enable(hidden, lanes):
    """Lane enables of a row's last beat (as an int, lane 0 least significant)."""
    remainder = hidden % lanes
    return (1 << lanes) - 1 if remainder == 0 else (1 << remainder) - 1


def last_enable_of(hidden, lanes):
    """Hardware: the lane enables of a row's last beat from a run-time ``hidden`` signal."""
    lanes_log2 = ceil_log2(lanes)
    if lanes_log2 == 0:
        return Const(1, 1)
    remainder = hidden[:lanes_log2]
    # Lane l is enabled when the remainder is 0 or above l: one small compare per lane, no
    # shifter and no carry chain between the size and the register that holds the enables.
    return Cat(*((remainder == 0) | (remainder > lane) for lane in range(lanes)))


class RowReader(wiring.Component):
    """Row-segment reads on a memory read port, one beat per cycle, responses realigned with
    their segments. See the module docstring for the protocol.

    Parameters: ``lanes`` (elements per beat), ``width`` (bits per element), ``addr_width``,
    ``max_count`` (the most beats in one segment; 1: every command one beat, its ready the
    issue alone, no segment count), ``tag_layout`` (sideband per segment, or
    ``None``), ``outstanding`` (the in-flight queue depth: beats issued but not yet out),
    ``alternate_data`` (the beats' data leaves the output skid buffer from two registers
    written in turn, :class:`~moe_hw.stream.SkidBuffer`'s ``alternate``: for a consumer that
    registers the data, so that ``beats.ready`` reaches no clock enable of the data),
    ``step_tag`` (the name of an unsigned tag field that is ``tag.FIELD + k*lanes`` on the
    segment's beat k: a second address, a write address for the beats, counted beside the
    read address rather than added after the reader), ``bram`` (the
    :class:`~moe_hw.blocks.block_memory.BlockMemory` target of a deep in-flight queue, one
    of more than :attr:`SHALLOW` beats: ``generic`` or ``ecp5``), ``buffered_command`` (a
    command waits in a register of its own while the current segment issues: the command's
    ``ready`` is then that register's empty flag, which the memory's ``ready`` does not
    reach; a command taken while the current segment ends, or none is loaded, still goes
    straight to it, so the latency and the throughput are the same; with a shallow queue and
    a tag without ``step_tag``, the tag ring holds a tag per segment, written when the
    command is taken: no register holds the current segment's tag), ``skips`` (False: no
    command skips, its ``skip`` bit is not read; every beat is a read, so the join waits on
    the response alone, and the beats' data are the responses' without a choice of zeros).
    """

    def __init__(self, *, lanes, width, addr_width, max_count, tag_layout=None, outstanding=16,
                 alternate_data=False, step_tag=None, bram="generic", buffered_command=False,
                 skips=True):
        self.lanes = check_choice("lanes", lanes, LANES)
        self.width = check_int("width", width, minimum=1, maximum=64)
        self.addr_width = check_int("addr_width", addr_width, minimum=1, maximum=64)
        self.max_count = check_int("max_count", max_count, minimum=1)
        self.outstanding = check_int("outstanding", outstanding, minimum=2, maximum=4096)
        self.tag_layout = tag_layout
        self.alternate_data = bool(alternate_data)
        if step_tag is not None and (tag_layout is None or step_tag not in tag_layout.members):
            raise ValueError(f"step_tag: no field {step_tag!r} in the tag layout {tag_layout!r}")
        self.step_tag = step_tag
        self.bram = check_choice("bram", bram, MEMORY_TARGETS)
        self.buffered_command = bool(buffered_command)
        self.skips = bool(skips)
        command = {"addr": addr_width, "count": range(max_count + 1), "tail": 1, "skip": 1}
        beat = {"data": data.ArrayLayout(width, lanes), "enable": lanes, "last": 1}
        if tag_layout is not None:
            command["tag"] = tag_layout
            beat["tag"] = tag_layout
        super().__init__({
            "command": In(stream.Signature(data.StructLayout(command))),
            "request": Out(stream.Signature(request_layout(lanes, addr_width))),
            "response": In(stream.Signature(response_layout(lanes, width))),
            "beats": Out(stream.Signature(data.StructLayout(beat))),
            "last_enable": In(lanes),
            "busy": Out(1),
        })

    #: The deepest in-flight queue held in LUT RAM (its tags in a plain :class:`Ring`, one
    #: LUT-RAM cell of 16 entries per bit group); deeper ones are a block RAM FIFO.
    SHALLOW = 16

    @property
    def latency(self):
        """Cycles from a response being taken to its beat leaving (the output skid buffer)."""
        return 1

    @staticmethod
    def join_latency(outstanding, memory_latency):
        """The memory latency that a reader of ``outstanding`` beats in flight runs at,
        stall-free, with a memory that answers from ``memory_latency`` cycles after a
        request is taken: a response is joined with its beat's entry, the in-flight queue's
        head from 1 cycle after the beat's issue in LUT RAM (up to :attr:`SHALLOW`), from
        :data:`~moe_hw.blocks.block_fifo.BLOCK_FIFO_LATENCY` cycles after it in block RAM;
        a quicker memory counts as that (the units' cycle formulas)."""
        return max(memory_latency,
                   1 if outstanding <= RowReader.SHALLOW else BLOCK_FIFO_LATENCY)

    def elaborate(self, platform):
        m = Module()
        lanes = self.lanes
        all_lanes = Const((1 << lanes) - 1, lanes)

        # ---- the current segment: one beat issued per cycle -------------------------------
        cur_loaded = Signal()
        cur_addr = Signal(self.addr_width)
        cur_left = Signal(range(self.max_count + 1))    # beats still to issue
        cur_tail = Signal()
        cur_skip = Signal(name="cur_skip") if self.skips else Const(0)
        # cur_left == 1, as a register; with one-beat segments (``max_count`` 1) every beat
        # is its segment's last, and the command's ready is the issue alone
        single = self.max_count == 1
        cur_last = Const(1) if single else Signal()
        # With a buffered command, a shallow queue and a tag that holds for its segment, the
        # tag ring holds a tag per segment, not per beat: written from the command port when
        # a command is taken (its ready a register, the memory's ready nowhere near) and read
        # on with the segment's last beat. No register holds the segment's tag, so no wide
        # clock enable waits on the issue (the expert reader's ``cur_tag``, 88 bits, on the
        # issue's net: the path of two seeds in six). The ring then holds a tag for every
        # segment with a beat in flight (``outstanding`` at most), the current one and the
        # waiting one.
        segment_tags = (self.buffered_command and self.tag_layout is not None and
                        self.step_tag is None and self.outstanding <= self.SHALLOW)
        if self.tag_layout is not None and not segment_tags:
            cur_tag = Signal(self.tag_layout)

        # Every issued beat, read or skipped, waits here for its data, in order. The queue's
        # flags and head are registers: the join below looks at the head's ``read`` and
        # takes it in the same cycle, and the issue is gated by a register (``w_rdy``).
        # Shallow (on chip: 16), the beat's tag waits beside it in a ring of its own, read at
        # its read pointer (distributed RAM): the tag only passes to the output register, and
        # so the join reaches the clock enable of the head's few flag and enable bits and the
        # tag ring's pointer copies, not a head register as wide as the tag (in moe_layer's
        # expert reader, a gate, a bias and an address: 84 bits, a net that took 2.8 ns to
        # route). Deep (behind an AXI master: 256), a LUT-RAM read is a 16:1 choice and more
        # (the wrapped units' critical path), so there the entry and its tag wait together
        # in a block RAM FIFO read ahead into registers (``block_fifo``): an entry written
        # in cycle c is the head from cycle c + ``BLOCK_FIFO_LATENCY``, long before its
        # response behind a bus, ``outstanding`` beats in all (``block_fifo_depth``).
        entry_layout = data.StructLayout({**({"read": 1} if self.skips else {}),
                                          "enable": lanes, "last": 1})
        tag = head_tag = None
        reads = lane_reads = None
        if self.outstanding <= self.SHALLOW:
            inflight = m.submodules.inflight = RegisteredFIFO(entry_layout, self.outstanding)
            w_rdy, push, entry = inflight.w_rdy, inflight.w_en, inflight.w_data
            r_rdy, take, head = inflight.r_rdy, inflight.r_en, inflight.r_data
            if self.tag_layout is not None:
                tags = m.submodules.tags = Ring(
                    self.tag_layout, self.outstanding + (2 if segment_tags else 0))
                tag, head_tag = tags.w_data, tags.r_data
            queue_busy = inflight.r_rdy
        else:
            # (``reads`` is ``read`` again per lane, so that each lane's choice of the data or
            # zeros has a flag of its own, not one register reaching every data bit)
            queued = data.StructLayout({"entry": entry_layout,
                                        **({"reads": lanes} if self.skips else {}), **(
                {"tag": self.tag_layout} if self.tag_layout is not None else {})})
            w_rdy = Signal(init=1)                      # an entry fits (a register)
            push = Signal()
            pushed = Signal(queued)
            ahead, empty = block_fifo(m, "inflight", width=queued.size,
                                      depth=block_fifo_depth(self.outstanding),
                                      target=self.bram, write=push, data=pushed, room=w_rdy)
            popped = data.View(queued, ahead.o.payload)
            entry, r_rdy, take, head = pushed.entry, ahead.o.valid, ahead.o.ready, popped.entry
            if self.skips:
                reads, lane_reads = pushed.reads, popped.reads
            if self.tag_layout is not None:
                tag, head_tag = pushed.tag, popped.tag
            queue_busy = ~empty | ahead.busy

        issue = cur_loaded & w_rdy & (cur_skip | self.request.ready)
        enable = Mux(cur_last & cur_tail, self.last_enable, all_lanes)
        # The segment registers load from ``source``: the command port, or with a buffered
        # command the waiting command while there is one. The buffer's flag and data are
        # registers loaded while it is empty (its data then takes the port's payload, unseen
        # while the flag is low), so the command's ``ready`` is a register; a command taken
        # in a cycle where the segment registers load goes to them, not to the buffer.
        cmd = self.command.payload
        source_valid, source = self.command.valid, cmd
        moves = ~cur_loaded | (issue & cur_last)        # the segment registers load
        if self.buffered_command:
            waiting = Signal()
            waiting_cmd = Signal.like(cmd, reset_less=True)
            m.d.sync += waiting.eq(~moves & (waiting | self.command.valid))
            with m.If(~waiting):
                m.d.sync += waiting_cmd.eq(cmd)
            source_valid = waiting | self.command.valid
            source = data.View(cmd.shape(), Mux(waiting, waiting_cmd, cmd))
        m.d.comb += [
            self.request.valid.eq(cur_loaded & ~cur_skip & w_rdy),
            self.request.payload.addr.eq(cur_addr),
            self.request.payload.enable.eq(enable),
            self.command.ready.eq(~waiting if self.buffered_command else moves),
            # the issued beat's entry and tag
            *([entry.read.eq(~cur_skip)] if self.skips else []),
            entry.enable.eq(enable),
            entry.last.eq(cur_last),
            push.eq(issue),
        ]
        if self.tag_layout is not None:
            if self.outstanding <= self.SHALLOW:
                m.d.comb += tags.w_en.eq(self.command.valid & self.command.ready
                                         if segment_tags else issue)
            m.d.comb += tag.eq(cmd.tag if segment_tags else cur_tag)
        if reads is not None:
            m.d.comb += reads.eq((~cur_skip).replicate(lanes))

        # The segment registers change when a beat issues or while none is loaded, and then
        # load the next command (the current one ends, or none was loaded) or step. The choice
        # is made from registers alone, and the memory's ``ready`` passes one LUT (``issue``,
        # or'ed with ``~cur_loaded``) to the clock enable: with nothing to load, the registers
        # take the command port's idle payload, which ``cur_loaded`` = 0 keeps unseen.
        with m.If(issue | ~cur_loaded):
            with m.If(cur_last | ~cur_loaded):
                m.d.sync += [cur_loaded.eq(source_valid), cur_addr.eq(source.addr),
                             cur_left.eq(source.count), cur_tail.eq(source.tail),
                             *([cur_skip.eq(source.skip)] if self.skips else [])]
                if not single:
                    m.d.sync += cur_last.eq(source.count == 1)
                if self.tag_layout is not None and not segment_tags:
                    m.d.sync += cur_tag.eq(source.tag)
            if not single:
                with m.Else():
                    m.d.sync += [cur_addr.eq(cur_addr + lanes), cur_left.eq(cur_left - 1),
                                 cur_last.eq(cur_left == 2)]
                    if self.step_tag is not None:
                        field = cur_tag[self.step_tag]
                        m.d.sync += field.eq(field + lanes)

        # ---- join the head of the queue with its response ---------------------------------
        skid = m.submodules.skid = SkidBuffer(
            self.beats.payload.shape(), alternate=("data",) if self.alternate_data else ())
        if self.skips:
            joined = r_rdy & (~head.read | self.response.valid)
            response_ready = r_rdy & head.read & skid.i.ready
        else:                                   # every beat waits for its response
            joined = r_rdy & self.response.valid
            response_ready = r_rdy & skid.i.ready
        m.d.comb += [
            skid.i.valid.eq(joined),
            skid.i.payload.data.eq(
                self.response.payload.data if not self.skips else
                Mux(head.read, self.response.payload.data, 0) if lane_reads is None else
                Cat(Mux(lane_reads[lane], self.response.payload.data[lane], 0)
                    for lane in range(lanes))),
            skid.i.payload.enable.eq(head.enable),
            skid.i.payload.last.eq(head.last),
            self.response.ready.eq(response_ready),
            take.eq(joined & skid.i.ready),
        ]
        if self.tag_layout is not None:
            if self.outstanding <= self.SHALLOW:
                # (the two queues hold the same beats: the tag ring is read with the head)
                taken = joined & skid.i.ready
                m.d.comb += tags.r_en.eq(taken & head.last if segment_tags else taken)
            m.d.comb += skid.i.payload.tag.eq(head_tag)
        wiring.connect(m, skid.o, wiring.flipped(self.beats))

        # (a waiting command implies a loaded segment: ``waiting`` is set only while the
        # segment registers hold one that does not move, and they load the waiting command
        # as it clears; so the buffered reader's ``busy`` is the same three flags)
        m.d.comb += self.busy.eq(cur_loaded | queue_busy | skid.o.valid)
        return m


def request_layout(lanes, addr_width):
    """The read port's request payload: ``addr`` (low bits), then ``enable``."""
    return data.StructLayout({"addr": addr_width, "enable": lanes})


def response_layout(lanes, width):
    """The read port's response payload: ``data``, ``lanes`` elements, lane 0 lowest."""
    return data.StructLayout({"data": data.ArrayLayout(width, lanes)})


__all__ += ["request_layout", "response_layout"]
