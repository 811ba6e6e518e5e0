"""A bank of counters with one increment-and-read per cycle (SPEC 1.2's per-expert counters).

Used by the location generator (one counter per expert, the pair's location is the counter's
value before its increment), by the sparse dispatcher (nonzeros per expert, then the rank of
each nonzero within its expert) and by re-routing (tokens per expert, adding a block's count).

Interface (a three-stage pipeline with a global stall, to be driven like
:class:`~moe_hw.stream.PipelineControl` with latency :attr:`CounterBank.latency` = 3):

``en`` (in)
    The pipeline advances this cycle: the request at the inputs enters, each request moves
    one stage on, and the request in the last stage leaves. While ``en`` is low everything
    holds (the request in the last stage keeps its ``value`` and its increment is not
    repeated).
``valid``, ``index``, ``increment`` (in)
    A request: with ``increment`` high, counter ``index`` is read and incremented; with it
    low, the counter is only read (this is the read-out port: the same port, so that the bank
    is one simple-dual-port memory).
``amount`` (in, only when built with ``amount_width``)
    What an incrementing request adds (unsigned; re-routing adds a block's token count).
    Without ``amount_width`` every increment adds 1.
``value`` (out)
    The counter's value before the request's increment, while the request is in the last
    stage: three ``en`` cycles after it entered, and for as long as ``en`` stays low after
    that.
``clear`` (in)
    Every counter reads 0 from the next request on, including a request entering in the same
    cycle and the requests waiting in the stages before the last. Assert it only when no
    incrementing request is in the last stage. Reset clears too.

Throughput: one request per cycle, any sequence of indices, any stalls. A counter hit every
cycle counts every hit: a request takes the newest word of its counter, which is, newest
first, the sum of the request ahead of it (``hit``), the write-back in flight as it enters the
last stage, the newest write-back that landed after its memory read (captured while it waits
in the second stage), or the memory's word.

Hardware: the counters live in an ``amaranth.lib.memory`` simple-dual-port memory (one
synchronous read port, one write port; LUT RAM at every depth); a
``count``-bit register of "live" flags (a counter not written since the last clear reads 0)
makes ``clear`` a one-cycle operation and makes reset clear the bank without a walk over the
memory.

``memory="block"``: the counters in a :class:`~moe_hw.blocks.block_memory.BlockMemory`
instead (``target`` its target: on ECP5 DP16KD blocks with their output registers on), whose
read takes two cycles: the pipeline has a stage more, :attr:`CounterBank.latency` = 4 for
such a bank (the instance's ``latency``), with the same protocol. The read is given from
stage 1 as before, its word is out while the request is in stage 3, and the write-backs that
land while the request waits in stages 2 and 3 are caught as they are in stage 2 of the LUT
bank (the block's result for a read and a write of one address in one cycle is undefined:
such a write is always caught, and the caught word wins). Its live flags are set as the
write-back lands, through a decode registered beside the write-back, and looked up in three
steps (stages 1, 2 and 3). One block memory holds many counters behind a short read from a
register; a LUT-RAM bank of 64 or more words is a choice among its cells after the read
(re-routing's four banks of 64: the banks' reads were the critical path of nine placements
of sixteen). The units with a ``counters`` parameter (:func:`counters_param`: locations,
sparse_index) choose by size, :meth:`CounterBank.memory_for`: LUT RAM up to
:attr:`CounterBank.LUT_COUNTERS` (32) counters a bank, block RAM past them (the location
unit at 64 experts placed at a mean of 270.7 MHz over twelve seeds in block RAM, 251.6 in
LUT RAM; at 16 and 32 the two were alike).

Timing: every path starts and ends at a flip-flop within a stage. Stage 1 registers the
request (the inputs may come from the caller's own issue logic). The memory is read from
stage 1's index register into stage 2, and written from a register (the write-back) the
cycle after the sum. The choice among write-backs, memory word and 0 is made on the way into
stage 3, off the loop, so the last stage's loop is one LUT (``hit``: the forwarded sum, or
the chosen word) and the adder's carry chain, ending in the sum register.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..params import check_choice, check_int, param
from ..stream.credit import ring_groups
from ..stream.pipeline import KEPT
from .block_memory import MEMORY_TARGETS, BlockMemory

__all__ = ["CounterBank", "CounterBankParams", "counters_param"]

#: Counter bits per copy of the memory's addresses: four 4-bit columns of ECP5's 16x4
#: distributed RAM cell (sixteen cells at 64 counters).
GROUP_BITS = 16


class CounterBank(wiring.Component):
    """``count`` counters of ``width`` bits, one increment-and-read per cycle. See the module
    docstring for the protocol."""

    #: The pipeline's stages (a bank with ``memory="block"`` has 4: its ``latency``).
    latency = 3

    #: The memories a bank may keep its counters in.
    MEMORIES = ("lut", "block")

    #: ``counters="auto"`` (:meth:`memory_for`) keeps up to this many counters in LUT RAM.
    LUT_COUNTERS = 32

    @staticmethod
    def latency_of(memory):
        """The stages of a bank with this ``memory``: the block memory's read takes one more."""
        return CounterBank.latency + (memory == "block")

    @staticmethod
    def memory_for(count, counters="auto"):
        """The memory of a bank of ``count`` counters by a unit's ``counters`` parameter
        (:func:`counters_param`): ``lut`` or ``block`` as given, or with ``auto`` LUT RAM up
        to :attr:`LUT_COUNTERS` and block RAM past them, where a LUT-RAM bank's read is a
        choice among many cells."""
        if counters != "auto":
            return counters
        return "lut" if count <= CounterBank.LUT_COUNTERS else "block"

    def __init__(self, count, width, *, amount_width=None, copy=0, memory="lut",
                 target="generic", apart=False):
        self.count = check_int("count", count, minimum=1, maximum=1 << 20)
        self.memory = check_choice("memory", memory, self.MEMORIES)
        self.target = check_choice("target", target, MEMORY_TARGETS)
        self.latency = self.latency_of(self.memory)
        # Banks side by side (re-routing's four) take the same index: ``copy`` (0 to 3) makes
        # this bank's memory address registers a kind of their own (see ``elaborate``).
        self.copy = check_int("copy", copy, minimum=0, maximum=3)
        # ``apart``: the request's stage registers (valid, increment, index) kept apart from
        # equal registers elsewhere (:data:`~moe_hw.stream.KEPT`). Banks side by side that
        # take the same requests (sparse_index's, one per lane) otherwise share one set, and
        # with block memory, whose blocks sit apart, its nets reach all of them.
        self.apart = check_choice("apart", apart, (False, True))
        self.width = check_int("width", width, minimum=1, maximum=64)
        self.amount_width = None if amount_width is None else \
            check_int("amount_width", amount_width, minimum=1, maximum=self.width)
        members = {
            "en": In(1),
            "valid": In(1),
            "index": In(range(self.count)),
            "increment": In(1),
            "value": Out(self.width),
            "clear": In(1),
        }
        if self.amount_width is not None:
            members["amount"] = In(self.amount_width)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        block = self.memory == "block"
        kept = KEPT if self.apart else {}
        index_bits = ceil_log2(self.count)
        low_bits = (index_bits + 1) // 2         # the live lookup: low bits first, then high
        if block:
            # (Three steps: the two lowest bits on entry, then half the rest, then the others:
            # a four-way and two eight-way choices at 256 counters, where 16 groups of a
            # sixteen-way choice on entry were 4-5 LUT levels, the path of 7 placements of
            # 16.)
            low_bits = min(2, index_bits)
            mid_bits = (index_bits - low_bits + 1) // 2
            top_bits = index_bits - low_bits - mid_bits
        groups = 1 << (index_bits - low_bits)
        live = Signal(groups << low_bits)        # counter written since the last clear
        en, clear = self.en, self.clear

        # ---- stage 1: the registered request ----------------------------------------------
        s1_valid = Signal(attrs=kept)
        s1_inc = Signal(attrs=kept)
        s1_index = Signal.like(self.index, attrs=kept)
        s1_live = Signal(groups)                 # live[g << low_bits | index low bits], each g
        s1_set = Signal()                        # ... or set since the request entered

        # ---- stage 2: the memory word and what landed after it was read ----------------------
        s2_valid = Signal(attrs=kept)
        s2_inc = Signal(attrs=kept)
        s2_index = Signal.like(self.index, attrs=kept)
        # The word is the counter's (else it reads 0); with block memory, the lookup's second
        # step: s1_live[h << mid_bits | index mid bits], each h.
        s2_live = Signal(1 << top_bits if block else 1, name="s2_live")
        if block:
            s2_set = Signal()                    # s1_set, as the request left stage 1
        s2_caught = Signal()                     # a write-back to the counter landed after the
        s2_word = Signal(self.width)             # read: the newest one's word
        if block:
            # ---- (block memory) stage 3: the read's word, and what landed since the read ------
            s3_valid = Signal(attrs=kept)
            s3_inc = Signal(attrs=kept)
            s3_index = Signal.like(self.index, attrs=kept)
            s3_live = Signal()
            s3_caught = Signal()
            s3_word = Signal(self.width)

        # ---- the last stage (3, or 4 with block memory): the request whose value is out ------
        busy = Signal(attrs=kept)
        stage_inc = Signal(attrs=kept)
        stage_index = Signal.like(self.index, attrs=kept)
        hit = Signal()                           # the request ahead incremented this counter
        forwarded = Signal(self.width)           # ... to this
        stored = Signal(self.width)              # else the counter's newest word (or 0)

        # ---- the write-back: stage 3's sum, one cycle later (every cycle the request sits in
        # stage 3: the same word each time, because ``value`` holds while ``en`` is low) ----
        pending_en = Signal()
        pending_index = Signal.like(self.index, attrs=kept)
        pending_value = Signal(self.width)

        m.d.comb += self.value.eq(Mux(hit, forwarded, stored))
        incrementing = busy & stage_inc
        new_value = Signal(self.width)
        if self.amount_width is None:
            m.d.comb += new_value.eq(self.value + 1)
        else:
            # The amount follows the request through the stages.
            amount = self.amount
            for name in ("s1_amount", "s2_amount", *(("s3_amount",) if block else ()),
                         "stage_amount"):
                reg = Signal(self.amount_width, name=name)
                with m.If(en):
                    m.d.sync += reg.eq(amount)
                amount = reg
            m.d.comb += new_value.eq(self.value + amount)
        m.d.sync += [
            pending_en.eq(incrementing),
            pending_index.eq(stage_index),
            pending_value.eq(new_value),
        ]
        # The counters' memory, in column groups of about GROUP_BITS bits, each with its own
        # copy of the read address (stage 1's index) and of the write-back's address: an
        # address register then drives one group's LUT-RAM cells, not every cell of the
        # bank. Copy g holds the address XOR g (so that Yosys cannot merge the copies) and
        # its group stores each counter at that address. A bank built with ``copy`` c > 0
        # has copies of its own for every group: the address XOR g, and XOR all ones when
        # c is 2 or 3; reset to all ones when c is odd. (Yosys merges a register bit with
        # another of the same input and reset value: four banks given one index had one set
        # of address registers, and bank 0's drove bank 3's cells over a 2.0 ns net, 217.5
        # MHz.) A bit has only four kinds (the address bit or its inverse, reset 0 or 1), so
        # with two groups the copies of banks c and c + 2 still meet: in re-routing's netlist
        # banks 0 and 2 read at one set of address registers, banks 1 and 3 at another. A
        # kept register per bank and group (``kept_signal``) keeps all eight apart, and
        # placed worse (docs/timing-log.md, release 51). The reset value is never read: a
        # request is read only after it has entered.
        word = []
        columns = [] if block else ring_groups(self.width, self.count, group_bits=GROUP_BITS)
        flip = (1 << len(s1_index)) - 1 if self.copy & 2 else 0
        if block:
            # Read from stage 1's index (the block registers it), written from the write-back's
            # registers: the word is out two ``en`` cycles later, in stage 3.
            m.submodules.memory = cells = BlockMemory(self.width, self.count, target=self.target)
            m.d.comb += [
                cells.read_addr.eq(s1_index),
                cells.read_en.eq(en),
                cells.write_addr.eq(pending_index),
                cells.write_data[0].eq(pending_value),
                cells.write_en.eq(pending_en),
            ]
            word.append(cells.read_data[0])
        for group, (start, stop) in enumerate(columns):
            # (A copy's address may pass ``count`` - 1: the memory spans the index's range.)
            # The memory is LUT RAM at every depth (``ram_style``): Yosys puts a deep one in
            # a block RAM, whose inferred read has no output register, its data 4.5 ns after
            # the clock, on the way into stage 3 (the location unit at 256 experts: 148-153
            # MHz, against 187-204 in LUT RAM).
            cells = memory.Memory(
                shape=stop - start, depth=self.count if len(columns) == 1 and not flip else
                1 << len(s1_index), init=[],
                attrs={"ram_style": "distributed"})
            m.submodules["memory" if len(columns) == 1 else f"memory{group}"] = cells
            read = cells.read_port(domain="sync")
            write = cells.write_port()
            if group == 0 and self.copy == 0:
                read_addr, write_addr = s1_index, pending_index
            else:
                init = -(self.copy & 1) % (1 << len(s1_index))
                read_addr = Signal.like(s1_index, name=f"s1_index_{group}", init=init)
                write_addr = Signal.like(pending_index, name=f"pending_index_{group}",
                                         init=init)
                with m.If(en):
                    m.d.sync += read_addr.eq(self.index ^ group ^ flip)
                m.d.sync += write_addr.eq(stage_index ^ group ^ flip)
            m.d.comb += [
                read.addr.eq(read_addr),
                read.en.eq(en),
                write.addr.eq(write_addr),
                write.data.eq(pending_value[start:stop]),
                write.en.eq(pending_en),
            ]
            word.append(read.data)
        read_data = Cat(*word)
        # A counter's live flag is set by its write-back: as the request leaves the last
        # stage (the LUT bank), or (block memory) as the write lands.
        setting, set_index = (pending_en, pending_index) if block else \
            (incrementing, stage_index)
        if block:
            # The write-back's index decoded as it is registered, in two one-hot halves (the
            # low one with the increment, as flip-flops): each flag's clock enable is then the
            # AND of two registers. (From the last stage's index, the decode was four LUT
            # levels into 256 flags, the path of every placement; from the write-back's
            # registers, three.)
            dec_bits = (index_bits + 1) // 2
            set_low = Signal(1 << dec_bits)
            set_high = Signal(1 << (index_bits - dec_bits))
            m.d.sync += [
                set_low.eq(Mux(incrementing, 1 << stage_index[:dec_bits], 0)),
                set_high.eq(1 << stage_index[dec_bits:]),
            ]
            for k in range(len(live)):
                with m.If(set_low[k % len(set_low)] & set_high[k // len(set_low)]):
                    m.d.sync += live[k].eq(1)
        else:
            with m.If(setting):
                m.d.sync += live.bit_select(set_index, 1).eq(1)

        # A write-back lands at the end of the cycle it is pending in. The memory read (when
        # the request moves into stage 2) sees what landed before; what lands at that edge
        # and at every edge until the request moves on is caught in stage 2, and what lands
        # at the edge it moves into stage 3 is taken on the way in.
        lands_on_s1 = pending_en & (pending_index == s1_index)
        # ``pending_en & (pending_index == s2_index)``, registered: the write-back and the
        # stage-2 index of the next cycle are stage 3's request and (when ``en``) stage 1's,
        # so the compare is one of registers, a cycle early, and the flag that chooses among
        # the words going into stage 3 is a register.
        lands_on_s2 = Signal()
        m.d.sync += lands_on_s2.eq(incrementing & Mux(en, stage_index == s1_index,
                                                      stage_index == s2_index))
        with m.If(en | lands_on_s2):
            m.d.sync += s2_word.eq(pending_value)
        # (Written as set and clear, not as ``caught | lands``: Yosys 0.70's ABC step fails on
        # the OR-feedback form inside sparse_index.)
        with m.If(en):
            m.d.sync += s2_caught.eq(lands_on_s1 & ~clear)
        with m.Elif(clear):
            m.d.sync += s2_caught.eq(0)
        with m.Elif(lands_on_s2):
            m.d.sync += s2_caught.eq(1)

        # The live flag is looked up in two steps (two narrow multiplexers instead of one
        # ``count``-wide one): on entry, one flag per group of counters that share the index's
        # low bits; on the move into stage 2, the group's. A flag set meanwhile is caught by
        # comparing indices (``s1_set``).
        sets = setting & ~clear
        with m.If(en):
            m.d.sync += s1_set.eq(sets & (set_index == self.index))
        with m.Elif(clear):
            m.d.sync += s1_set.eq(0)
        with m.Elif(sets & (set_index == s1_index)):
            m.d.sync += s1_set.eq(1)
        low = self.index[:low_bits]
        # The request that moves into the last stage: stage 2's, or (block memory) stage 3's,
        # with the write-back landing on it now, the newest one caught, its live flag.
        if block:
            last_valid, last_inc, last_index, last_live = s3_valid, s3_inc, s3_index, s3_live
            last_caught, last_word = s3_caught, s3_word
            # ``pending_en & (pending_index == s3_index)``, registered as ``lands_on_s2``.
            lands_on_last = Signal()
            m.d.sync += lands_on_last.eq(incrementing & Mux(en, stage_index == s2_index,
                                                            stage_index == s3_index))
            with m.If(en | lands_on_last):
                m.d.sync += s3_word.eq(Mux(en & ~lands_on_s2, s2_word, pending_value))
            with m.If(en):
                m.d.sync += [
                    s3_valid.eq(s2_valid),
                    s3_inc.eq(s2_inc),
                    s3_index.eq(s2_index),
                    s3_live.eq((s2_live.bit_select(s2_index[low_bits + mid_bits:], 1) | s2_set) &
                               ~clear),
                    s2_set.eq(s1_set & ~clear),
                    s2_live.eq(Cat(s1_live.bit_select(Cat(s1_index[low_bits:low_bits + mid_bits],
                                                          Const(h, top_bits)), 1)
                                   for h in range(1 << top_bits))),
                    s3_caught.eq((s2_caught | lands_on_s2) & ~clear),
                ]
            with m.Elif(clear):
                m.d.sync += s3_caught.eq(0)
            with m.Elif(lands_on_last):
                m.d.sync += s3_caught.eq(1)
        else:
            last_valid, last_inc, last_index, last_live = s2_valid, s2_inc, s2_index, s2_live
            last_caught, last_word, lands_on_last = s2_caught, s2_word, lands_on_s2
        with m.If(en):
            m.d.sync += [
                s1_valid.eq(self.valid),
                s1_inc.eq(self.increment),
                s1_index.eq(self.index),
                s1_live.eq(Cat(live.bit_select(Cat(low, Const(g, index_bits - low_bits)), 1)
                               for g in range(groups))),
                s2_valid.eq(s1_valid),
                s2_inc.eq(s1_inc),
                s2_index.eq(s1_index),
                # A live flag set at the last edge belongs to a write-back still pending now,
                # which is caught; one set earlier, to a word the read sees. (Block memory:
                # stage 3 joins the lookup's last step and what ``s1_set`` caught.)
                *([] if block else [
                    s2_live.eq((s1_live.bit_select(s1_index[low_bits:], 1) | s1_set) & ~clear)]),
                busy.eq(last_valid),
                stage_inc.eq(last_inc),
                stage_index.eq(last_index),
                hit.eq(incrementing & (stage_index == last_index) & ~clear),
                forwarded.eq(new_value),
                stored.eq(Mux(clear, 0,
                              Mux(lands_on_last, pending_value,
                                  Mux(last_caught, last_word,
                                      Mux(last_live, read_data, Const(0, self.width)))))),
            ]
        with m.If(clear):
            m.d.sync += [live.eq(0), s1_live.eq(0), s2_live.eq(0)]
            if block:
                m.d.sync += [s2_set.eq(0), s3_live.eq(0)]
        return m


def counters_param():
    """The ``counters`` parameter of a unit built on counter banks
    (:meth:`CounterBank.memory_for`)."""
    return param("auto", choices=("auto",) + CounterBank.MEMORIES,
                 doc="the counters' memory: lut (LUT RAM), block (block RAM, a stage more), "
                     f"or auto: lut up to {CounterBank.LUT_COUNTERS} counters a bank, "
                     "block past")


class CounterBankParams:
    """The parameters of a unit built on counter banks: its ``counters`` field
    (:func:`counters_param`) and ``bank_counters``, the counters of one bank, give the banks'
    memory and stages."""

    @property
    def counter_memory(self):
        """The banks' memory, ``lut`` or ``block`` (``counters``, or by ``bank_counters``)."""
        return CounterBank.memory_for(self.bank_counters, self.counters)

    @property
    def bank_latency(self):
        """The banks' stages: 3 in LUT RAM, 4 in block RAM."""
        return CounterBank.latency_of(self.counter_memory)
