"""Re-routing after all-to-all (Ascend ``MoeReRouting``, SPEC 1.5): tokens that arrive
rank-major leave expert-major, rank-ascending within an expert.

Block (r, e) of the input (n(r, e) tokens, starting at source row ``src``, the sum of the
counts before it in rank-major order) goes to destination rows ``dst(r, e) .. + n(r, e)``
with ``dst(r, e) = dst_base[e] + (the counts of expert e on ranks before r)`` and
``dst_base[e]`` the exclusive prefix sum of the per-expert totals. Tokens are moved as bits,
never changed (int8, fp16 or bf16: only the element width matters).

Two passes over the counts, then the move:

1. **count** (the N x E count matrix streamed in once, one count per cycle, rank-major):
   every count is checked (negative, above ``tokens``), added to its expert's counter in a
   :class:`~moe_hw.blocks.counter_bank.CounterBank` (built with an ``amount``, its counters
   in a block memory), and, when it is not zero, written to the block memory as the entry
   ``(n, e, rank_prefix)``, where
   ``rank_prefix`` is the counter's value before the addition (the counts of expert e on the
   ranks before r). Empty blocks leave no entry: they cost their count's cycle and nothing
   else.
2. **offsets** (one expert per cycle): each counter (the expert's total) is read into the
   :class:`~moe_hw.blocks.prefix_sum.PrefixSum`; its exclusive sum ``dst_base[e]`` goes to
   the offset memory and the ``expert_token_num`` beat is the total (count mode, type 1) or
   the inclusive sum (cumsum mode, type 0). The sum of all counts is compared with A.
3. **move** (only when every count was valid and they sum to A): the entries are read in
   order; ``dst = dst_base[e] + rank_prefix`` and its element address ``dst*H`` (on a
   registered product, :func:`~moe_hw.arith.product.pipelined_product`) go to a block queue;
   the token generator issues one token per cycle at most: its source row is the next one
   (the source is read front to back), its destination the block's next row. Each token is
   one :class:`~moe_hw.blocks.row_reader.RowReader` command (``ceil(H/lanes)`` read beats at
   ``src*H``, the last one with the partial lane enables) and one ``row_write`` beat (its
   index and scale).

Streams and ports (payload fields are listed least significant first):

``counts`` (in)
    N*E beats, rank-major (rank 0's E counts first): ``count`` (``count_type``: 32 or 64
    bits, two's complement for the signed types).
``expert_token_num`` (out)
    E beats, expert 0 first: ``value`` (the expert's total, or the inclusive prefix sum of
    the totals when ``expert_token_num_type`` is 0).
``scales`` (in, when built with ``scales``)
    A beats in source order: ``scale`` (fp32 bits, moved unchanged).
``read_request`` (out), ``read_response`` (in)
    The memory read port into ``tokens`` (element addresses, row ``r`` at ``r*H``), as
    :class:`~moe_hw.blocks.row_reader.RowReader`: requests ``{addr, enable}``, in-order
    responses ``{data}`` with any latency. Rows are read in order, 0 .. A-1.
``write`` (out)
    The memory write port into ``permute_tokens``: ``addr`` (element address of lane 0),
    ``data`` (``lanes`` elements), ``enable`` (lane enables: partial on a row's last beat when
    H is not a multiple of ``lanes``). ``ceil(H/lanes)`` beats per token, tokens in source
    order.
``row_write`` (out)
    One beat per token, in source order: ``row`` (its destination row: where
    ``permute_per_token_scales`` takes ``scale``), ``idx_addr`` and ``idx`` (the write
    ``permute_token_idx[idx_addr] = idx``: ``[dst] = src`` for ``idx_type`` 0 (gather),
    ``[src] = dst`` for 1 (scatter)) and, with ``scales``, ``scale``.
``start``, ``tokens``, ``hidden``, ``num_ranks``, ``num_experts`` (in)
    Run-time A, H, N and E, sampled with ``expert_token_num_type`` and ``idx_type`` when
    ``start`` is high while idle (the shared :class:`~moe_hw.blocks.run_control.RunControl`).
``busy``, ``done``, ``error`` (out)
    ``done`` rises when the last beat of every output stream has left and stays high until
    the next start. ``error``: a run-time size above its maximum (nothing is read or written;
    ``done`` :data:`EMPTY_CYCLES` (2) cycles after start), a negative count, a count above
    ``tokens``, counts not summing to ``tokens``, more than ``max_blocks`` non-empty blocks,
    or ``hidden`` = 0 with ``tokens`` > 0. The
    count errors are found in passes 1 and 2: every count beat is still taken and the
    ``expert_token_num`` beats still leave (their values are then meaningless), but nothing
    is moved: no token is read or written, so no write ever falls outside the A rows.

E = 0 makes the run empty (``done`` two cycles after start). A = 0, or N = 0, runs the two
count passes and moves nothing.

Cycles (stall-free, from the start cycle to the first cycle ``done`` is high, with a memory
that answers a request taken at the end of cycle u from cycle u + L;
:meth:`MoeReRoutingParams.cycles`)::

    A*ceil(H/lanes) + N*E + E + move_overhead + product_latency + L     (a move)
    N*E + E + COUNT_OVERHEAD                                            (no move)

with ``move_overhead`` = 24, ``COUNT_OVERHEAD`` = 14 and
``product_latency`` = 2 for operands of up to 18 bits (``max_tokens`` and ``max_hidden`` below
2**18; 3 above). "No move": A = 0, N = 0, or counts the unit refuses.

Passes 1 and 2 run at one count and one expert per cycle; the move at one beat per cycle,
tokens and blocks back to back (a block costs nothing beyond its tokens' beats; an empty
block only its count's cycle in pass 1). A stall anywhere costs only the cycles it lasts.
"""

from dataclasses import dataclass

from amaranth.hdl import Assert, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.params import dsp_param
from ..arith.product import pipelined_product, product_latency
from ..blocks.block_memory import BlockMemory, bram_param
from ..blocks.counter_bank import CounterBank
from ..blocks.prefix_sum import PrefixSum
from ..blocks.row_beats import row_beats
from ..blocks.row_reader import RowReader, last_enable_of, request_layout, response_layout
from ..blocks.run_control import EMPTY_CYCLES, START_LATENCY, RunControl, run_ports
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import CreditPipeline, SkidBuffer, delay, replicated

__all__ = ["MoeReRoutingParams", "MoeReRoutingUnit", "ELEMENT_FORMATS", "COUNT_TYPES"]

#: Token formats and their element widths (the unit moves bits; nothing else differs).
ELEMENT_FORMATS = {"int8": 8, "fp16": 16, "bf16": 16}
#: Count types: (bits, signed).
COUNT_TYPES = {"int32": (32, True), "int64": (64, True), "uint32": (32, False),
               "uint64": (64, False)}


@dataclass(frozen=True)
class MoeReRoutingParams(UnitParams):
    """Generation-time parameters of :class:`MoeReRoutingUnit`."""

    format: str = param("bf16", choices=tuple(ELEMENT_FORMATS),
                        doc="token elements (moved as bits)")
    lanes: int = param(16, choices=LANES)
    max_tokens: int = param(32768, minimum=1, maximum=1 << 24, doc="A")
    max_hidden: int = param(16384, minimum=1, maximum=1 << 20, doc="H")
    max_ranks: int = param(32, minimum=1, maximum=1 << 12, doc="N")
    max_experts: int = param(256, minimum=1, maximum=1 << 12, doc="E")
    max_blocks: int = param(512, minimum=1, maximum=1 << 12,
                            doc="non-empty (rank, expert) blocks of one run")
    count_type: str = param("int32", choices=tuple(COUNT_TYPES),
                            doc="expert_token_num_per_rank elements")
    scales: bool = param(True, choices=(False, True), doc="per-token fp32 scales move too")
    max_outstanding: int = param(16, minimum=4, maximum=4096,
                                 doc="beats in flight; full rate needs memory latency <= this - 1")
    dsp: str = dsp_param()
    bram: str = bram_param()

    COUNTER_MEMORY = "block"
    """The counter bank's memory (:class:`~moe_hw.blocks.counter_bank.CounterBank`): a block
    memory, whose read takes two cycles, so the bank has four stages."""

    COUNT_OVERHEAD = START_LATENCY + 8 + CounterBank.latency_of(COUNTER_MEMORY)
    """Stall-free cycles of a run that moves nothing, beyond ``N*E + E`` (14): start and
    decide, then, after the last expert read-out enters, the issue skid buffer, the counter
    bank's four stages (its counters in a block memory: a two-cycle read) and its value
    register, the prefix sum's register, the
    ``expert_token_num`` queue (its write, its skid buffer, its busy flag: a register, a
    cycle behind the beats), the drained register and the done register. Pass 2's
    read-outs follow pass 1's counts without a gap (the bank forwards in order)."""
    @property
    def move_overhead(self):
        """Stall-free cycles of a run that moves, beyond ``A*ceil(H/lanes) + N*E + E``, the
        product's latency and the memory's (24): start and decide; the end of pass 2 up to the
        check of the sum, as above; the block pipeline (the entry read and the offset read, two
        cycles each: block memories with a registered read; the destination row; then the
        product) and its queue (two: the queue's write and its skid buffer); the token
        generator's block register, the command skid buffer, the row reader's segment
        register; after the memory, the reader's skid buffer, the write skid buffer, the
        drained register and the done register. Later blocks and tokens follow back to back."""
        return (START_LATENCY + 14 + CounterBank.latency_of(self.COUNTER_MEMORY) +
                2 * BlockMemory.latency)

    @property
    def element_width(self):
        return ELEMENT_FORMATS[self.format]

    @property
    def count_bits(self):
        """Bits of a count port beat."""
        return COUNT_TYPES[self.count_type][0]

    @property
    def count_signed(self):
        return COUNT_TYPES[self.count_type][1]

    @property
    def row_width(self):
        """Bits of a row index or a valid count (0 .. max_tokens)."""
        return bits_for(self.max_tokens)

    @property
    def total_width(self):
        """Bits of an expert's total: up to ``max_ranks * max_tokens`` (valid counts)."""
        return bits_for(self.max_ranks * self.max_tokens)

    @property
    def sum_width(self):
        """Bits of the sum of all counts: up to ``max_ranks * max_experts * max_tokens``."""
        return bits_for(self.max_ranks * self.max_experts * self.max_tokens)

    @property
    def max_beats(self):
        return -(-self.max_hidden // self.lanes)

    @property
    def addr_width(self):
        return max(1, ceil_log2(self.max_tokens * self.max_hidden + 1))

    @property
    def product_latency(self):
        return product_latency(self.row_width, bits_for(self.max_hidden))

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order."""
        return {"tokens": self.max_tokens, "hidden": self.max_hidden,
                "num_ranks": self.max_ranks, "num_experts": self.max_experts}

    def moves(self, tokens, hidden, num_ranks, num_experts):
        """Whether a run with valid counts moves tokens."""
        return tokens > 0 and hidden > 0 and num_ranks > 0 and num_experts > 0

    def cycles(self, tokens, hidden, num_ranks, num_experts, memory_latency=1, *, valid=True):
        """Exact stall-free cycles from the start cycle to the first cycle ``done`` is high.
        ``valid``: the counts are valid (non-negative, summing to ``tokens``), so the run
        moves the tokens (when A, H and N are not 0). A memory quicker than the row reader's
        in-flight queue counts as that (:meth:`RowReader.join_latency`)."""
        too_big = any(value > maximum for value, maximum in
                      zip((tokens, hidden, num_ranks, num_experts), self.sizes.values()))
        if num_experts == 0 or too_big:
            return EMPTY_CYCLES
        passes = num_ranks * num_experts + num_experts
        if not (valid and self.moves(tokens, hidden, num_ranks, num_experts)):
            return passes + self.COUNT_OVERHEAD
        return (tokens * -(-hidden // self.lanes) + passes + self.move_overhead +
                self.product_latency + RowReader.join_latency(self.max_outstanding,
                                                              memory_latency))

    def count_layout(self):
        return data.StructLayout({"count": self.count_bits})

    def expert_token_num_layout(self):
        return data.StructLayout({"value": self.sum_width})

    def scale_layout(self):
        return data.StructLayout({"scale": 32})

    def write_layout(self):
        return data.StructLayout({"addr": self.addr_width,
                                  "data": data.ArrayLayout(self.element_width, self.lanes),
                                  "enable": self.lanes})

    def row_write_layout(self):
        fields = {"row": self.row_width, "idx_addr": self.row_width, "idx": self.row_width}
        if self.scales:
            fields["scale"] = 32
        return data.StructLayout(fields)


class MoeReRoutingUnit(wiring.Component):
    """Rank-major to expert-major re-routing of tokens, scales and indices; see the module
    docstring for the protocol and the cycle count."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(MoeReRoutingParams, params, kwargs)
        self.params = p = params
        members = {
            "counts": In(stream.Signature(p.count_layout())),
            "expert_token_num": Out(stream.Signature(p.expert_token_num_layout())),
            "read_request": Out(stream.Signature(request_layout(p.lanes, p.addr_width))),
            "read_response": In(stream.Signature(response_layout(p.lanes, p.element_width))),
            "write": Out(stream.Signature(p.write_layout())),
            "row_write": Out(stream.Signature(p.row_write_layout())),
            **run_ports(p.sizes),
            "expert_token_num_type": In(1),
            "idx_type": In(1),
        }
        if p.scales:
            members["scales"] = In(stream.Signature(p.scale_layout()))
        super().__init__(members)

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order (:attr:`MoeReRoutingParams.sizes`)."""
        return self.params.sizes

    def elaborate(self, platform):
        m = Module()
        p = self.params
        lanes_log2 = ceil_log2(p.lanes)
        expert_width = max(1, ceil_log2(p.max_experts))

        # ---- run control --------------------------------------------------------------------
        ctl = m.submodules.control = RunControl(p.sizes, empty_when_zero=("num_experts",))
        ctl.connect(m, self)
        tokens = ctl.size("tokens")
        cumsum_mode = Signal()                     # expert_token_num_type == 0
        scatter_idx = Signal()                     # idx_type == 1
        ranks_zero = Signal()
        no_move = Signal()                         # A == 0 or H == 0
        hidden_bad = Signal()                      # H == 0 with A > 0
        # A == 0 and H == 0, registered at accept beside ranks_zero: the decide cycle's flags
        # above are then gates of two registers, not compares of the held sizes (whose
        # sub-terms Yosys shares with the row reader's, across the unit).
        tokens_zero = Signal()
        hidden_zero = Signal()
        beats = Signal(range(p.max_beats + 1))
        last_en = Signal(p.lanes)
        hidden_step = Signal(bits_for(p.max_hidden))

        count_phase = Signal()
        offsets_phase = Signal()
        move_phase = Signal()
        bad = Signal()                             # a count was negative or above A

        # ---- pass 1: the count stream, one count per cycle ---------------------------------------
        # Every request to the bank passes the issue skid buffer (a register: the bank never
        # stalls, so the buffer is always ready).
        m.submodules.issue = issue = SkidBuffer(data.StructLayout({
            "index": expert_width, "amount": p.row_width, "increment": 1, "nonzero": 1,
            "bad": 1, "offsets": 1}))
        issue_ready = issue.i.ready

        experts_held = ctl.size("num_experts")
        ranks_left = Signal.like(self.num_ranks)
        last_rank = Signal()                       # ranks_left == 1
        count_take = self.counts.valid & self.counts.ready
        row_start = Signal()
        expert, last_expert = row_beats(m, experts_held, start=row_start, step=count_take,
                                        name="expert")
        rank_end = count_take & last_expert
        with m.If(rank_end):
            m.d.sync += [ranks_left.eq(ranks_left - 1), last_rank.eq(ranks_left == 2)]

        count = self.counts.payload.count
        low = count[:p.row_width]
        high_bits = count[p.row_width:p.count_bits - 1] if p.count_signed \
            else count[p.row_width:]
        negative = count[p.count_bits - 1] if p.count_signed else 0
        # Negative or too wide for a row count: tested at the port (the count's own bits); the
        # compare with A waits for the stage after the issue buffer.
        wide = (high_bits.any() if len(high_bits) else 0) | negative

        # ---- pass 2's read-out of the counters ----------------------------------------------------
        # The bank, the prefix sum and the offset write never stall (a stall is an enable to
        # every register of the bank, and its forwarding logic): the read-outs are
        # the credit pipeline's items, and its queue holds the expert_token_num beats that
        # the port does not take at once. A read-out enters only while the queue is sure to
        # have room for its beat.
        # (The counter bank, below; built here for its latency.)
        bank = CounterBank(p.max_experts, p.total_width, amount_width=p.row_width,
                           memory=p.COUNTER_MEMORY, target=p.bram)
        readout_latency = 1 + bank.latency + 1 + PrefixSum.latency
        m.submodules.num_pipe = num_pipe = CreditPipeline(readout_latency,
                                                          p.expert_token_num_layout())
        reads_pending = Signal()
        reads_left = Signal.like(self.num_experts)
        last_read = Signal()
        read_expert = Signal(expert_width)
        m.d.comb += num_pipe.i_valid.eq(offsets_phase & reads_pending)
        with m.If(num_pipe.take):
            m.d.sync += [read_expert.eq(read_expert + 1), reads_left.eq(reads_left - 1),
                         last_read.eq(reads_left == 2)]
            with m.If(last_read):
                m.d.sync += reads_pending.eq(0)

        m.d.comb += [
            self.counts.ready.eq(count_phase & issue_ready),
            issue.i.valid.eq((count_phase & self.counts.valid) | num_pipe.take),
            issue.i.payload.index.eq(Mux(count_phase, expert, read_expert)),
            issue.i.payload.amount.eq(low),
            issue.i.payload.increment.eq(count_phase),
            issue.i.payload.nonzero.eq(low.any()),
            issue.i.payload.bad.eq(wide),
            issue.i.payload.offsets.eq(~count_phase),
        ]

        # ---- the counter bank: per-expert totals; a block's rank prefix --------------------------
        # One CounterBank of every expert, its counters in a block memory (as the unit's
        # tables: on ECP5 a DP16KD read from its output register). As four LUT-RAM banks of
        # 64 experts, each seeing every request, their reads (a choice among the cells after
        # the read) and the address registers the banks shared were the critical path of 9
        # placements of 16 (docs/timing-log.md, release 72).
        latency = bank.latency + 1                 # the bank, then the value registered
        request = issue.o.payload
        # The bank never stalls: every result is taken as it comes out (a count's entry is
        # written, a read-out's total enters the prefix sum, which never stalls), so every
        # register below loads every cycle and the issue buffer's output is always taken.
        m.d.comb += issue.o.ready.eq(1)
        # The bank's and the prefix sum's clear: copies of ``decide`` of their own (kept apart
        # from the run control's), so that the run registers that load in the decide cycle
        # and the bank's clear logic are several nets, not one that spans the unit. (A copy
        # may read 1 for the cycle after reset: a clear then is what reset does.)
        bank_clears = replicated(m, ctl.accept, name="clear", copies=2, apart=True)
        m.submodules.bank = bank
        m.d.comb += [
            bank.en.eq(1), bank.valid.eq(issue.o.valid), bank.index.eq(request.index),
            bank.increment.eq(request.increment), bank.amount.eq(request.amount),
            bank.clear.eq(bank_clears[0]),
        ]

        def follow(value, name, reset_less=False):
            return delay(m, value, latency, 1, name=name, reset_less=reset_less)
        out_index = follow(request.index, "out_index", reset_less=True)
        out_amount = follow(request.amount, "out_amount", reset_less=True)
        out_nonzero = follow(request.nonzero, "out_nonzero")
        # A count is bad when negative or too wide (tested at the port), or above A (compared
        # here, from the issue buffer's register, over the bank's first two stages: the high
        # halves' order and the low halves' in registers, then joined).
        # (Both unsigned: a half that one of them lacks compares as 0.)
        amount, half = request.amount, max(len(request.amount), len(tokens)) // 2
        above_high, equal_high, above_low, bad_early = (delay(
            m, value, 1, 1, name=name) for value, name in (
                (amount[half:] > tokens[half:], "above_high"),
                (amount[half:] == tokens[half:], "equal_high"),
                (amount[:half] > tokens[:half], "above_low"),
                (request.bad, "bad_early")))
        out_bad = delay(m, bad_early | above_high | (equal_high & above_low), latency - 1, 1,
                        name="out_bad")
        out_offsets = follow(request.offsets, "out_offsets")
        out_value = delay(m, bank.value, 1, 1, name="out_value", reset_less=True)
        out_valid = follow(issue.o.valid, "out_valid")
        out_count = out_valid & ~out_offsets
        out_read = out_valid & out_offsets

        # The block memory: one entry (n, e, rank_prefix) per non-empty block, in rank-major
        # order.
        # (With the block's one- and two-token flags, tested on the way in: they leave the
        # table for the token generator's last-token flags through registers only.)
        entry_layout = data.StructLayout({"tokens": p.row_width, "expert": expert_width,
                                          "prefix": p.row_width, "one": 1, "two": 1})
        # The unit's two tables are block memories with a registered read (on ECP5 the
        # DP16KD's own output register): no LUT RAM banks, and no choice among them after the
        # read (as banks of LUT RAM they were a sixth of the unit's logic and a third of its
        # flip-flops, and their reads were among its slowest paths).
        m.submodules.blocks = blocks = BlockMemory(entry_layout, p.max_blocks, target=p.bram)
        entries = Signal(range(p.max_blocks + 1))
        entries_full = Signal()                    # entries == max_blocks: a further block
        new_entry = out_count & out_nonzero        # is an error, and is not written
        # The entry's write passes a register, so that the memory's write pins hang off
        # flip-flops, not the bank's output tests (the path was the output's kind through
        # ``entries_full`` into a write enable, 239.8 MHz). The move reads the table only
        # after pass 2.
        m.d.sync += [
            blocks.write_addr.eq(entries),
            blocks.write_data[0].tokens.eq(out_amount),
            blocks.write_data[0].expert.eq(out_index),
            blocks.write_data[0].prefix.eq(out_value),
            blocks.write_data[0].one.eq(out_amount == 1),
            blocks.write_data[0].two.eq(out_amount == 2),
            blocks.write_en.eq(new_entry & ~entries_full),
        ]
        with m.If(new_entry & ~entries_full):
            m.d.sync += [entries.eq(entries + 1), entries_full.eq(entries == p.max_blocks - 1)]
        with m.If((out_count & out_bad) | (new_entry & entries_full)):
            m.d.sync += bad.eq(1)

        # ---- pass 2: totals -> prefix sum -> offsets and expert_token_num -------------------------
        m.submodules.prefix = prefix = PrefixSum(p.total_width, p.sum_width)
        m.submodules.offsets = offsets = BlockMemory(p.row_width, p.max_experts, target=p.bram)
        offsets_written = Signal(expert_width)
        offsets_left = Signal.like(self.num_experts)
        offsets_complete = Signal()
        sum_matches = Signal()
        m.d.comb += [
            prefix.i.valid.eq(out_read),
            prefix.i.payload.value.eq(out_value),
            prefix.o.ready.eq(1),
            num_pipe.payload.value.eq(Mux(cumsum_mode, prefix.o.payload.inclusive,
                                          prefix.o.payload.value)),
            offsets.write_addr.eq(offsets_written),
            offsets.write_data[0].eq(prefix.o.payload.exclusive),
            offsets.write_en.eq(prefix.o.valid),
        ]
        wiring.connect(m, num_pipe.o, wiring.flipped(self.expert_token_num))
        m.d.sync += sum_matches.eq(prefix.total == tokens)
        with m.If(offsets.write_en):
            m.d.sync += [offsets_written.eq(offsets_written + 1),
                         offsets_left.eq(offsets_left - 1)]
            with m.If(offsets_left == 1):
                m.d.sync += offsets_complete.eq(1)

        # ---- the move: entries -> destination rows and addresses -> block queue -----------------
        # Stages: the entry read (2), the offset read (2), dst = offset + prefix (1), the
        # product dst*H.
        read = offsets.latency
        block_latency = blocks.latency + read + 1 + p.product_latency
        # The block pipeline never stalls (CreditPipeline): its registers load every cycle, so
        # no stall net fans out to the tables' banks and the product; a block enters only when
        # the queue behind it is sure to have room.
        block_layout = data.StructLayout({"tokens": p.row_width, "row": p.row_width,
                                          "elem": p.addr_width, "one": 1, "two": 1})
        # Its skid buffer holds the wide fields in two registers written in turn, so that the
        # token generator's load (the queue's ready) reaches only the buffer's flags and
        # pointers, not the clock enable of the fields' registers.
        m.submodules.block_pipe = bpipe = CreditPipeline(block_latency, block_layout,
                                                         alternate=("tokens", "row", "elem"))
        run = Const(1)
        entries_left = Signal.like(entries)
        entries_pending = Signal()
        last_entry = Signal()
        entry_addr = Signal.like(entries)
        m.d.comb += [
            bpipe.i_valid.eq(move_phase & entries_pending),
            blocks.read_addr.eq(entry_addr),
            blocks.read_en.eq(run),
        ]
        with m.If(bpipe.take):
            m.d.sync += [entry_addr.eq(entry_addr + 1), entries_left.eq(entries_left - 1),
                         last_entry.eq(entries_left == 2)]
            with m.If(last_entry):
                m.d.sync += entries_pending.eq(0)
        entry = blocks.read_data[0]                                            # stage 2
        m.d.comb += [offsets.read_addr.eq(entry.expert), offsets.read_en.eq(run)]
        base = offsets.read_data[0]                                            # stage 4
        entry_prefix = delay(m, entry.prefix, read, run, name="entry_prefix", reset_less=True)
        dst_row = Signal(p.row_width)
        m.d.sync += dst_row.eq(base + entry_prefix)                            # stage 5
        dst_elem = pipelined_product(m, dst_row, hidden_step, en=run, dsp=p.dsp,
                                     name="dst_elem")[:p.addr_width]
        block_tokens = delay(m, entry.tokens, read + 1 + p.product_latency, run,
                             name="block_tokens", reset_less=True)
        block_row = delay(m, dst_row, p.product_latency, run, name="block_row", reset_less=True)

        # A block of one or two tokens: the flags stored beside the entry (the token
        # generator's last-token flags then load from registers).
        block_one = delay(m, entry.one, read + 1 + p.product_latency, run, name="block_one")
        block_two = delay(m, entry.two, read + 1 + p.product_latency, run, name="block_two")
        m.d.comb += [
            bpipe.payload.one.eq(block_one),
            bpipe.payload.two.eq(block_two),
            bpipe.payload.tokens.eq(block_tokens),
            bpipe.payload.row.eq(block_row),
            bpipe.payload.elem.eq(dst_elem),
        ]
        block_queue = bpipe.o

        # ---- the token generator: one token per cycle ---------------------------------------------
        reader = m.submodules.reader = RowReader(
            lanes=p.lanes, width=p.element_width, addr_width=p.addr_width,
            max_count=p.max_beats, outstanding=p.max_outstanding,
            tag_layout=data.StructLayout({"elem": p.addr_width}), step_tag="elem", bram=p.bram)
        wiring.connect(m, reader.request, wiring.flipped(self.read_request))
        wiring.connect(m, wiring.flipped(self.read_response), reader.response)
        m.d.comb += reader.last_enable.eq(last_en)
        m.submodules.command_skid = cmd_skid = SkidBuffer(reader.command.payload.shape(),
                                                          ready_next=True)
        wiring.connect(m, cmd_skid.o, reader.command)
        row_fields = {name: field.shape for name, field in p.row_write_layout()
                      if name != "scale"}
        m.submodules.row_skid = row_skid = SkidBuffer(data.StructLayout(row_fields),
                                                      ready_next=True)

        cur_loaded = Signal()
        cur_left = Signal(p.row_width)
        cur_last = Signal()                        # cur_left == 1
        cur_second = Signal()                      # cur_left == 2
        cur_row = Signal(p.row_width)
        # The token's element address in two halves with the carry between them a cycle
        # late: the low half adds H's low bits and keeps its carry out in a register, the
        # high half adds H's high bits and that carry (the address is the high half plus
        # the carry, then the low half). Each loop is a half-width carry chain (the 30-bit
        # loop was the path of 11 of 16 seeds); the high half's increment for the command
        # is not a loop.
        elem_half = p.addr_width // 2
        cur_low = Signal(elem_half)
        cur_high = Signal(p.addr_width - elem_half)
        cur_carry = Signal()
        src_row = Signal(p.row_width)
        src_elem = Signal(p.addr_width)
        # Both buffers have room: one register (the AND of their flags' next values), so that
        # the token's emit and the block's load are each one gate of registers.
        token_ready = Signal(init=1)
        m.d.sync += token_ready.eq(cmd_skid.ready_next & row_skid.ready_next)
        if getattr(platform, "formal_invariants", False):
            m.d.comb += Assert(token_ready == (cmd_skid.i.ready & row_skid.i.ready))
        emit = cur_loaded & token_ready
        if p.scales:
            # The scales pass a skid buffer (no path from the port's valid to its ready) and
            # join the row beats at the port, not at the token generator: a token's emit
            # waits only for the two skid buffers' ready registers.
            m.submodules.scale_skid = scale_skid = SkidBuffer(p.scale_layout())
            wiring.connect(m, wiring.flipped(self.scales), scale_skid.i)
            m.d.comb += [
                self.row_write.valid.eq(row_skid.o.valid & scale_skid.o.valid),
                self.row_write.payload.eq(row_skid.o.payload),
                self.row_write.payload.scale.eq(scale_skid.o.payload.scale),
                row_skid.o.ready.eq(self.row_write.ready & scale_skid.o.valid),
                scale_skid.o.ready.eq(self.row_write.ready & row_skid.o.valid),
            ]
        else:
            wiring.connect(m, row_skid.o, wiring.flipped(self.row_write))
        m.d.comb += [
            cmd_skid.i.valid.eq(emit),
            cmd_skid.i.payload.addr.eq(src_elem),
            cmd_skid.i.payload.count.eq(beats),
            cmd_skid.i.payload.tail.eq(1),
            cmd_skid.i.payload.skip.eq(0),
            cmd_skid.i.payload.tag.elem.eq(Cat(cur_low, cur_high + cur_carry)),
            row_skid.i.valid.eq(emit),
            row_skid.i.payload.row.eq(cur_row),
            row_skid.i.payload.idx_addr.eq(Mux(scatter_idx, src_row, cur_row)),
            row_skid.i.payload.idx.eq(Mux(scatter_idx, cur_row, src_row)),
        ]
        # The two element counters add H from copies of their own (a run constant, loaded in
        # the decide cycle; the copies follow a cycle later, long before the move): the one
        # register also feeds the product's DSP, and its net to the adders' carry chains was
        # 1.3 ns of the critical path (hidden_step -> the token's element address, 218.0 MHz).
        step_cur, step_src = replicated(m, hidden_step, name="hidden_step_copy", copies=2)
        with m.If(emit):
            m.d.sync += [cur_left.eq(cur_left - 1), cur_last.eq(cur_second),
                         cur_second.eq(cur_left == 3),
                         cur_row.eq(cur_row + 1),
                         Cat(cur_low, cur_carry).eq(cur_low + step_cur[:elem_half]),
                         cur_high.eq(cur_high + step_cur[elem_half:] + cur_carry),
                         src_row.eq(src_row + 1), src_elem.eq(src_elem + step_src)]
            with m.If(cur_last):
                m.d.sync += cur_loaded.eq(0)
        block = block_queue.payload
        # The block queue's ready (and the load) come from copies of the block register's
        # flags, ``gen_idle`` (not loaded) and ``gen_ending`` (loaded, on its last token),
        # registered from the flags' next values: other registers than ``cur_loaded`` and
        # ``cur_last``, so that the load and the queue's wide clock enable are not computed
        # after ``emit``, the clock enable of the token counters (two wide enable nets in a
        # row).
        gen_idle = Signal(init=1)
        gen_ending = Signal()
        m.d.comb += block_queue.ready.eq(gen_idle | (token_ready & gen_ending))
        load = block_queue.valid & block_queue.ready
        next_loaded = Mux(load, 1, Mux(emit & cur_last, 0, cur_loaded))
        next_last = Mux(load, block.one, Mux(emit, cur_second, cur_last))
        m.d.sync += [gen_idle.eq(~next_loaded), gen_ending.eq(next_loaded & next_last)]
        with m.If(load):
            m.d.sync += [cur_loaded.eq(1), cur_left.eq(block.tokens),
                         cur_last.eq(block.one), cur_second.eq(block.two),
                         cur_row.eq(block.row),
                         cur_low.eq(block.elem[:elem_half]),
                         cur_high.eq(block.elem[elem_half:]), cur_carry.eq(0)]

        # ---- the write port: a beat's address is its row's plus lanes per beat, counted by the
        # reader beside the read address (its ``step_tag``) ------------------------------------
        # The address and the data in alternating registers: ``write.ready`` reaches only the
        # skid buffer's flags, not the clock enables of the wide payload (the port's ready
        # into the buffer was the critical path, 215.7 MHz).
        m.submodules.write_skid = write_skid = SkidBuffer(p.write_layout(),
                                                          alternate=("addr", "data"))
        m.d.comb += [
            write_skid.i.valid.eq(reader.beats.valid),
            reader.beats.ready.eq(write_skid.i.ready),
            write_skid.i.payload.addr.eq(reader.beats.payload.tag.elem),
            write_skid.i.payload.data.eq(reader.beats.payload.data),
            write_skid.i.payload.enable.eq(reader.beats.payload.enable),
        ]
        wiring.connect(m, write_skid.o, wiring.flipped(self.write))

        # ---- control --------------------------------------------------------------------------------
        offsets_done = offsets_phase & offsets_complete
        refused = bad | ~sum_matches | hidden_bad
        # The move has drained when no entry is left to read and every stage and buffer after
        # it is empty. Nothing refills them after that, so the test (an AND of ten flags, in
        # front of the run control's done and the phase register) is registered, and
        # ``finished`` is that register: a one-cycle pulse (it is not set again in the cycle
        # after); done rises a cycle later.
        drained = Signal()
        m.d.sync += drained.eq(move_phase & ~drained & ~entries_pending & ~bpipe.busy &
                               ~cur_loaded & ~cmd_skid.o.valid & ~reader.busy &
                               ~write_skid.o.valid & ~row_skid.o.valid & ~num_pipe.busy)
        m.d.comb += [
            ctl.fault.eq(offsets_done & refused),
            ctl.finished.eq(drained),
            prefix.clear.eq(bank_clears[1]),
            row_start.eq(ctl.decide | rank_end),
        ]
        with m.If(count_phase & rank_end & last_rank):
            m.d.sync += [count_phase.eq(0), offsets_phase.eq(1)]
        # The move's entry count loads through pass 2 (``entries`` is final before the
        # offsets are: the last count's result leaves the bank ahead of the read-outs), and
        # the entry address returns to 0 when a move has drained, so that the end of pass 2
        # reaches only the phase flags and ``entries_pending``.
        with m.If(offsets_phase):
            m.d.sync += [entries_left.eq(entries), last_entry.eq(entries == 1)]
        with m.If(drained):
            m.d.sync += entry_addr.eq(0)
        with m.If(offsets_done):
            m.d.sync += [offsets_phase.eq(0), move_phase.eq(1), offsets_complete.eq(0),
                         entries_pending.eq(~refused & ~no_move & (entries != 0))]
        # Every run ends with its phases clear (pass 1 hands over to pass 2, pass 2 to the
        # move, and the move ends with ``finished``; a run that does nothing sets none). The
        # decide cycle sets the first if the run begins: ``begin`` (the size checks' OR) is
        # then the flags' data, not their clock enable, which the phases' own hand-overs
        # also reach.
        with m.If(ctl.finished):
            m.d.sync += move_phase.eq(0)
        with m.If(ctl.decide):
            m.d.sync += [count_phase.eq(ctl.begin & ~ranks_zero),
                         offsets_phase.eq(ctl.begin & ranks_zero)]
        with m.If(ctl.accept):
            m.d.sync += [
                cumsum_mode.eq(~self.expert_token_num_type), scatter_idx.eq(self.idx_type),
                ranks_zero.eq(self.num_ranks == 0),
                tokens_zero.eq(self.tokens == 0), hidden_zero.eq(self.hidden == 0),
            ]
        # The run registers load in the decide cycle, from the held sizes: ``accept`` (a
        # function of the start port) then reaches only the few registers above.
        held = {name: ctl.size(name) for name in p.sizes}
        hidden_held = held["hidden"]
        with m.If(ctl.decide):
            m.d.sync += [
                no_move.eq(tokens_zero | hidden_zero),
                hidden_bad.eq(~tokens_zero & hidden_zero),
                beats.eq((hidden_held + (p.lanes - 1)) >> lanes_log2),
                last_en.eq(last_enable_of(hidden_held, p.lanes)),
                hidden_step.eq(hidden_held),
                ranks_left.eq(held["num_ranks"]), last_rank.eq(held["num_ranks"] == 1),
                reads_left.eq(held["num_experts"]), last_read.eq(held["num_experts"] == 1),
                reads_pending.eq(1), read_expert.eq(0),
                offsets_written.eq(0), offsets_left.eq(held["num_experts"]),
                offsets_complete.eq(0), bad.eq(0), entries.eq(0), entries_full.eq(0),
                entries_pending.eq(0), src_row.eq(0), src_elem.eq(0),
            ]
        return m
