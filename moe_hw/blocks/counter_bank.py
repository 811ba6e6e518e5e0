"""A bank of counters with one increment-and-read per cycle (SPEC 1.2's per-expert counters).

Used by the location generator (one counter per expert, the pair's location is the counter's
value before its increment) and by the sparse dispatcher (nonzeros per expert, then the rank of
each nonzero within its expert).

Interface (a two-stage pipeline with a global stall, to be driven like
:class:`~moe_hw.stream.PipelineControl` with latency :attr:`CounterBank.latency` = 2):

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
    stage: two ``en`` cycles after it entered, and for as long as ``en`` stays low after that.
``clear`` (in)
    Every counter reads 0 from the next request on, including a request entering in the same
    cycle and one waiting in the first stage. Assert it only when no incrementing request is
    in the last stage. Reset clears too.

Throughput: one request per cycle, any sequence of indices. A request that hits the counter
the request ahead of it is incrementing (back-to-back hits on one counter), or whose
registered write-back is still pending, takes the forwarded sum instead of the memory's stale
word, so a counter hit every cycle counts every hit.

Hardware: the counters live in an ``amaranth.lib.memory`` simple-dual-port memory (LUT RAM or
block RAM: one synchronous read port, one write port); a ``count``-bit register of "live" flags
(a counter not written since the last clear reads 0) makes ``clear`` a one-cycle operation and
makes reset clear the bank without a walk over the memory.

Timing: every path starts and ends at a flip-flop within a stage. The first stage registers
the request, and the live-flag lookup is split across the two stages: on entry, one flag per
group of counters (the counters that share the index's low bits), then in the first stage
the group's flag (two narrow multiplexers instead of one ``count``-wide one). A live flag the
request in the last stage sets meanwhile is caught by comparing indices on entry. The memory
is read from the first stage's index register and written from a register one cycle after
the increment. The inputs may therefore come from a short
multiplexer in front (the caller's own issue logic).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..params import check_int

__all__ = ["CounterBank"]


class CounterBank(wiring.Component):
    """``count`` counters of ``width`` bits, one increment-and-read per cycle. See the module
    docstring for the protocol."""

    latency = 2

    def __init__(self, count, width, *, amount_width=None, ram_style=None):
        self.count = check_int("count", count, minimum=1, maximum=1 << 20)
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
        # ``ram_style="distributed"`` keeps a deep bank in LUT RAM: a block RAM's output
        # (4 ns from the clock on ECP5, no output register when inferred) would start the
        # forwarding multiplexer and the adder.
        self.ram_style = ram_style
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = mem = memory.Memory(
            shape=self.width, depth=self.count, init=[],
            attrs=None if self.ram_style is None else {"ram_style": self.ram_style})
        read = mem.read_port(domain="sync")
        write = mem.write_port()
        index_bits = ceil_log2(self.count)
        low_bits = (index_bits + 1) // 2         # the live lookup: low bits first, then high
        groups = 1 << (index_bits - low_bits)
        live = Signal(groups << low_bits)        # counter written since the last clear

        # ---- stage 1: the registered request ----------------------------------------------
        req_valid = Signal()
        req_inc = Signal()
        req_index = Signal.like(self.index)
        req_live = Signal(groups)                # live[g << low_bits | index low bits], each g
        req_set = Signal()                       # ... or set by the request that was ahead

        # ---- stage 2: the request whose value is out -----------------------------------------
        busy = Signal()                          # a request is in the stage
        stage_inc = Signal()
        stage_index = Signal.like(self.index)
        hit = Signal()                           # it read the counter its predecessor incremented
        forwarded = Signal(self.width)           # ... whose new value is this
        was_live = Signal()

        # The write-back is registered (``pending``): the memory's write port is driven from
        # flip-flops. A request reading the memory while the write is still pending takes the
        # pending word instead (``hit_pending``).
        pending_en = Signal()
        pending_index = Signal.like(self.index)
        pending_value = Signal(self.width)
        hit_pending = Signal()
        from_pending = Signal(self.width)

        m.d.comb += self.value.eq(
            Mux(hit, forwarded,
                Mux(hit_pending, from_pending,
                    Mux(was_live, read.data, Const(0, self.width)))))
        incrementing = busy & stage_inc
        new_value = Signal(self.width)
        if self.amount_width is None:
            m.d.comb += new_value.eq(self.value + 1)
        else:
            # The amount follows the request through both stages.
            req_amount = Signal(self.amount_width)
            stage_amount = Signal(self.amount_width)
            with m.If(self.en):
                m.d.sync += [req_amount.eq(self.amount), stage_amount.eq(req_amount)]
            m.d.comb += new_value.eq(self.value + stage_amount)
        m.d.sync += [
            # Every cycle the request sits in the stage: the same word each time, because
            # ``value`` holds while ``en`` is low.
            pending_en.eq(incrementing),
            pending_index.eq(stage_index),
            pending_value.eq(new_value),
        ]
        m.d.comb += [
            read.addr.eq(req_index),
            read.en.eq(self.en),
            write.addr.eq(pending_index),
            write.data.eq(pending_value),
            write.en.eq(pending_en),
        ]
        with m.If(incrementing):
            m.d.sync += live.bit_select(stage_index, 1).eq(1)

        low = self.index[:low_bits]
        with m.If(self.en):
            m.d.sync += [
                req_valid.eq(self.valid),
                req_inc.eq(self.increment),
                req_index.eq(self.index),
                req_live.eq(Cat(live.bit_select(Cat(low, Const(g, index_bits - low_bits)), 1)
                                for g in range(groups))),
                # The request in the last stage sets its live flag at this edge.
                req_set.eq(incrementing & (stage_index == self.index)),
                busy.eq(req_valid),
                stage_inc.eq(req_inc),
                stage_index.eq(req_index),
                hit.eq(incrementing & (stage_index == req_index) & ~self.clear),
                forwarded.eq(new_value),
                hit_pending.eq(pending_en & (pending_index == req_index) & ~self.clear),
                from_pending.eq(pending_value),
                was_live.eq((req_live.bit_select(req_index[low_bits:], 1) | req_set) &
                            ~self.clear),
            ]
        with m.If(self.clear):
            m.d.sync += [live.eq(0), req_live.eq(0), req_set.eq(0)]
        return m
