"""The combine unit in gather form (SPEC 1.4, tutel decode), and the datapath it shares with
``dispatch_backward_data`` (SPEC 1.1 backward): gather expert-buffer rows by (index,
location), multiply by the gate, and sum over the top-k choices of each token::

    for i in 0..S-1:                               # tokens stream out in token order
        acc = START
        for k in 0..K-1:                           # K: the run-time top_k
            term = gate[k][i] * buffer[index[k][i]*C + location[k][i], :] if the pair is valid
                   else +0.0                        # valid: 0 <= index < E, 0 <= location < C
            acc = acc + term                        # product rounded, then the sum rounded
        out[i, :] = acc

``START`` is the unit's summation start rule: ``"zero"`` (+0.0; ``golden.combine_gather``,
which skips invalid pairs: adding +0.0 to a sum that started at +0.0 changes nothing, since
such a sum is never -0.0) or ``"first"`` (the sum is the first term itself,
``golden.dispatch_backward_data``: term_0 + term_1 + ...; the hardware starts from -0.0, the
exact additive identity, so ``-0.0 + term_0 == term_0`` bit for bit, -0.0 included).
:class:`CombineGatherUnit` is the first, :class:`~moe_hw.units.dispatch_backward_data.
DispatchBackwardDataUnit` the second; the hardware is the same.

Streams and ports (payload fields are listed least significant first):

``header`` (in)
    One beat per token: ``gate``, ``index``, ``location``, each an array of ``max_top_k``
    entries (entry k is the token's k-th choice; entries at and past the run-time ``top_k``
    are ignored). Gates are the format's bits, indices and locations two's complement
    (``index_width`` bits; any bit pattern is safe).
``read_request`` (out), ``read_response`` (in)
    A memory read port into the expert buffer [E*C, H] (element addresses, row r at r*H), as
    :class:`~moe_hw.blocks.row_reader.RowReader`. Invalid pairs are never read.
``data`` (out)
    ``ceil(H / lanes)`` beats per token, in token order: ``data`` (the sums, lane 0 first),
    ``enable`` (partial on a row's last beat when H is not a multiple of ``lanes``; disabled
    lanes carry don't-care values) and ``last`` (a token's last beat).
``start``, ``tokens``, ``hidden``, ``top_k``, ``capacity``, ``num_experts`` (in)
    Run-time problem size, sampled when ``start`` is high while idle (the shared
    :class:`~moe_hw.blocks.run_control.RunControl`). ``top_k`` may be 0 (every output is
    +0.0, as for top_k = 1 with every pair invalid).
``busy``, ``done``, ``error``, ``dropped`` (out)
    ``done`` rises when the last beat has left and stays high until the next start.
    ``dropped`` counts the (k, i) pairs that fail the mask. ``error`` is set, and nothing done,
    when a run-time size exceeds its generation-time maximum.

Zero-element problems (``tokens`` or ``hidden`` zero) finish at once: ``done`` two cycles after
start, no header taken, nothing read or out. (Zero capacity or experts is not empty: every
pair is dropped and every output is START's sum of +0.0 terms, which is +0.0.)

Schedule (why one adder per lane keeps one beat per cycle): the work is the item sequence
n = i*B + b (token i, beat b, B = ceil(H / lanes)), cut into *windows* of ``window`` items
(the last may be shorter). Within a window the unit makes K passes, pass k reading the k-th
row segment of every item of the window, so the two terms of one item that meet in the
adder are ``window`` beats apart, and a window of at least ``add_stages + 2`` items (the
accumulate loop: the adder, then the write-back and the read into the adder's operand
register) hides the adder's latency completely. A per-item accumulator of ``window`` entries holds the partial
sums between passes; the last pass sends its sums out. Rows are read in segments: one
command per (pass, token) part of a window, at one beat per cycle whatever the segment
lengths. A scoreboard bit per accumulator entry holds a beat at the datapath's entrance
while its partial sum is still in the adder, which only happens in a window shorter than
``add_stages + 2`` items (with the
default ``window``, only the last window can be).

Throughput and exact cycles: the read port delivers one beat per cycle, and each item needs
K reads, so the natural ideal is ``K * S * B`` cycles; the unit reaches it but for the last
window. Stall-free, with a memory that answers a request taken at the end of cycle u from
cycle u + L, a run takes exactly :meth:`CombineGatherParams.cycles` =
``sum over windows of (n_w + (K-1) * max(n_w, add_stages + 2)) + overhead(L)`` cycles from
the start cycle to the first cycle ``done`` is high (n_w: the window's items, ``window`` but
for the last window; L counts as 1 when no pair is valid, as nothing waits for the memory
then). With the default window the only term above ``K * S * B`` is the last window's
``(K-1) * max(0, add_stages + 2 - n_w)``, at most ``(K-1) * (add_stages + 1)`` cycles. A stall
anywhere costs only the cycles it lasts.

Pipeline: header ring (the headers of the current and next windows, replayed once per pass) -> pass
scheduler -> ring read -> the pass's pair registered | the shared
:class:`~moe_hw.blocks.slot_address.SlotAddress` (mask and ``slot = index*C + location`` | ``addr =
slot*H + beat*lanes``) -> command queue -> row reader -> operand registers -> ``lanes`` float
multipliers (gate * element, +0.0 for an invalid pair) -> accumulator read (registered address) ->
operand registers -> ``lanes`` float adders (with the partial sum, or START on the first pass) ->
accumulator write-back (passes before the last) and output queue -> ``data``.

No stall reaches the wide datapath. The command pipeline (ring read, slot address) and the
multiply-accumulate pipeline each run with enable constant 1 inside a
:class:`~moe_hw.stream.CreditPipeline`: an item enters only when the queue after it is sure
to have room for it, so the row reader's command ``ready`` and the consumer's ``data.ready``
reach only the queues' skid buffers. A beat enters the multiply-accumulate pipeline when it
has a credit and its accumulator entry is not pending (the scoreboard bit of the entry in
hand is kept as a register). Partial sums pass through the output queue too and are dropped
at its output.
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.fadd import FloatAdderCore
from ..arith.fmul import FloatMultiplierCore
from ..arith.params import FORMAT_NAMES, FloatDatapathParams, dsp_param
from ..arith.product import pipelined_product, product_latency
from ..blocks.block_memory import bram_param
from ..blocks.row_reader import RowReader, last_enable_of, request_layout, response_layout
from ..blocks.run_control import EMPTY_CYCLES, RunControl, run_ports
from ..blocks.slot_address import SlotAddress, slot_latency
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import CreditPipeline, delay, lut_increment, replicated

__all__ = ["CombineGatherParams", "CombineGatherUnit", "SUM_STARTS", "gather_schedule"]

#: Summation start rules: +0.0 (combine) or the first term (dispatch backward data).
SUM_STARTS = ("zero", "first")


@dataclass(frozen=True)
class CombineGatherParams(FloatDatapathParams, UnitParams):
    """Generation-time parameters of :class:`CombineGatherUnit` (and of the backward-data unit,
    which is the same hardware). Old names ``max_k`` and ``outstanding`` are accepted."""

    format: str = param("fp32", choices=FORMAT_NAMES)
    lanes: int = param(4, choices=LANES)
    max_tokens: int = param(4096, minimum=1, maximum=1 << 30)
    max_hidden: int = param(4096, minimum=1, maximum=1 << 30)
    max_capacity: int = param(4096, minimum=1, maximum=1 << 30)
    max_experts: int = param(64, minimum=1, maximum=1 << 30)
    max_top_k: int = param(2, minimum=1, maximum=16)
    index_width: int = param(32, minimum=2, maximum=64)
    mul_stages: int | None = param(None, minimum=0, maximum=16, optional=True,
                                   doc="None: the multiplier's default depth for the format")
    dsp: str = dsp_param()
    # The partial sum loops through the adder; a combinational adder would close it without
    # a register.
    add_stages: int | None = param(None, minimum=1, maximum=16, optional=True,
                                   doc="None: the adder's default depth for the format")
    window: int | None = param(None, minimum=1, maximum=256, optional=True,
                               doc="items per window; None: add_stages + 2 (full rate)")
    max_outstanding: int = param(16, minimum=4, maximum=4096,
                                 doc="beats in flight; full rate needs memory latency <= this - 1")
    bram: str = bram_param()

    @property
    def command_latency(self):
        """Cycles of the command pipeline: ring read, the pass's pair registered, then the
        slot address."""
        return 2 + slot_latency(self)

    def check(self):
        self.check_signed_fits("index_width", "max_capacity", "max_experts")

    @property
    def mul_read_latency(self):
        """Cycles from a beat entering the datapath to its accumulator read: the operand
        registers and the multiplier."""
        return 1 + self.mul_latency

    @property
    def accumulate_latency(self):
        """Cycles from a beat entering the datapath to its sum: the operand registers, the
        multiplier, the adder's operand registers (after the accumulator read) and the
        adder."""
        return self.mul_read_latency + 1 + self.add_latency

    @property
    def accumulate_loop(self):
        """The fewest cycles between the beats of two passes that meet in one accumulator
        entry: the partial sum is written back ``accumulate_latency`` cycles after the first
        entered and read ``mul_read_latency`` cycles after the second entered, a cycle after
        the write at the earliest (``add_stages + 2``)."""
        return self.accumulate_latency + 1 - self.mul_read_latency

    @property
    def window_items(self):
        """Items per window (the accumulator depth)."""
        return self.accumulate_loop if self.window is None else self.window

    @property
    def ring_depth(self):
        """Header ring entries: the tokens of two windows and one more (the ring's room is
        a register, decided a cycle ahead), a power of two."""
        return 1 << ceil_log2(2 * self.window_items + 1)

    @property
    def setup(self):
        """The run control's setup cycles: the held sizes (1), ``ceil(H / lanes)`` (1), then
        ``tokens * beats`` on a pipelined product, from which the first window is sized."""
        return 2 + product_latency(bits_for(self.max_tokens), bits_for(self.max_beats))

    @property
    def max_beats(self):
        return -(-self.max_hidden // self.lanes)

    @property
    def addr_width(self):
        return max(1, ceil_log2(self.max_experts * self.max_capacity * self.max_hidden))

    # ---- stall-free timing -----------------------------------------------------------
    def overhead(self, memory_latency=1):
        """Stall-free cycles beyond the schedule's read beats, for a memory that answers a
        request taken at the end of cycle u from cycle u + ``memory_latency``: run control
        (start, then :attr:`setup` cycles), header ring write, command pipeline, row reader
        (command register, memory, skid buffer), the command queue before the reader and
        the output queue after the adders (:class:`~moe_hw.stream.CreditPipeline`: write,
        skid buffer, idle register), operand registers, multiplier, the adder's operand
        registers, adder, done register."""
        return (self.setup + 1 + 1 + self.command_latency + CreditPipeline.QUEUE_LATENCY + 1 +
                memory_latency + 1 + self.accumulate_latency + CreditPipeline.QUEUE_LATENCY +
                CreditPipeline.IDLE_LATENCY + 1)

    def schedule_cycles(self, tokens, hidden, top_k):
        """Stall-free cycles the schedule needs at one read beat per cycle: K*S*B plus, for a
        window shorter than add_stages + 2 items, the wait for its partial sums."""
        items = tokens * -(-hidden // self.lanes)
        passes = max(top_k, 1)
        loop = self.accumulate_loop
        total = 0
        for start in range(0, items, self.window_items):
            n = min(self.window_items, items - start)
            total += n + (passes - 1) * max(n, loop)
        return total

    def cycles(self, tokens, hidden, top_k, memory_latency=1, *, reads=True):
        """Exact stall-free cycles of a run (start cycle to the first cycle ``done`` is high).
        ``reads``: whether any pair is valid; a run that reads nothing never waits for the
        memory, so it costs what it would with a one-cycle memory. A memory quicker than the
        row reader's in-flight queue counts as that (:meth:`RowReader.join_latency`)."""
        if tokens == 0 or hidden == 0:
            return EMPTY_CYCLES
        return (self.schedule_cycles(tokens, hidden, top_k) + self.overhead(
            RowReader.join_latency(self.max_outstanding, memory_latency if reads else 1)))

    # ---- payload layouts -------------------------------------------------------------
    def header_layout(self):
        return data.StructLayout({
            "gate": data.ArrayLayout(self.fmt.width, self.max_top_k),
            "index": data.ArrayLayout(signed(self.index_width), self.max_top_k),
            "location": data.ArrayLayout(signed(self.index_width), self.max_top_k),
        })

    def data_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.fmt.width, self.lanes),
                                  "enable": self.lanes, "last": 1})


def gather_schedule(tokens, beats, top_k, window):
    """The unit's read order: a list of (pass k, token, beat) items, one per read beat.

    Items n = token*beats + beat in windows of ``window``; each window makes max(top_k, 1)
    passes over its items. (The scoreboard's model of the hardware's request log.)
    """
    passes = max(top_k, 1)
    items = tokens * beats
    order = []
    for start in range(0, items, window):
        span = range(start, min(start + window, items))
        for p in range(passes):
            order.extend((p, n // beats, n % beats) for n in span)
    return order


class CombineGatherUnit(wiring.Component):
    """Gather by (index, location), gate-multiply and sum over k, one read beat per cycle.
    See the module docstring for the protocol, the schedule and the cycle count."""

    #: The summation start rule (one of :data:`SUM_STARTS`).
    SUM_START = "zero"
    PARAMS = CombineGatherParams

    def __init__(self, params=None, **kwargs):
        params = resolve_params(self.PARAMS, params, kwargs)
        assert self.SUM_START in SUM_STARTS
        self.params = p = params
        super().__init__({
            "header": In(stream.Signature(p.header_layout())),
            "read_request": Out(stream.Signature(request_layout(p.lanes, p.addr_width))),
            "read_response": In(stream.Signature(response_layout(p.lanes, p.fmt.width))),
            "data": Out(stream.Signature(p.data_layout())),
            **run_ports(self.sizes),
            "dropped": Out(range(p.max_tokens * p.max_top_k + 1)),
        })

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order."""
        p = self.params
        return {"tokens": p.max_tokens, "hidden": p.max_hidden, "top_k": p.max_top_k,
                "capacity": p.max_capacity, "num_experts": p.max_experts}

    def overhead(self, memory_latency=1):
        """:meth:`CombineGatherParams.overhead`."""
        return self.params.overhead(memory_latency)

    def cycles(self, tokens, hidden, top_k, memory_latency=1, *, reads=True):
        """:meth:`CombineGatherParams.cycles`."""
        return self.params.cycles(tokens, hidden, top_k, memory_latency, reads=reads)

    def elaborate(self, platform):
        m = Module()
        p = self.params
        fmt = p.fmt
        lanes_log2 = ceil_log2(p.lanes)
        window = p.window_items
        ring_bits = ceil_log2(p.ring_depth)
        max_items = p.max_tokens * p.max_beats

        # ---- run control: start, held sizes, done / error ---------------------------------
        ctl = m.submodules.control = RunControl(self.sizes, empty_when_zero=("tokens", "hidden"),
                                                setup=p.setup)
        ctl.connect(m, self)
        running = ctl.running
        k_last = Signal(range(p.max_top_k))      # the last pass, max(top_k, 1) - 1
        k_zero = Signal()                        # top_k == 0: one pass, every pair invalid
        beats = Signal(range(p.max_beats + 1))
        last_en = Signal(p.lanes)

        # ---- header ring: the headers of the current and the next window -----------------
        ring = m.submodules.ring = memory.Memory(shape=p.header_layout(), depth=p.ring_depth,
                                                 init=[])
        ring_w = ring.write_port()
        ring_r = ring.read_port()
        # The tokens' counters are read only as ring addresses, so they count modulo the
        # ring's depth (its address's width): short carry chains.
        headers_in = Signal(ring_bits)           # headers taken so far
        win_tok = Signal(ring_bits)              # token of the current window's first item
        # The ring's fill (headers_in - win_tok) and the headers available from the scheduler's
        # token on (headers_in - cur_tok) are counters of their own, and the header stream's
        # ready is a register: the run is on, headers are still to come, and the ring has
        # room (decided a cycle ahead: the fill grows by one at most), so that a header
        # taken is one LUT of registers.
        fill = Signal(range(p.ring_depth + 1))
        avail = Signal(range(p.ring_depth + 1))
        avail_some = Signal()                    # avail != 0
        headers_left = Signal.like(self.tokens)
        all_in = Signal()
        header_open = Signal()
        header_take = self.header.valid & header_open
        all_in_next = Mux(header_take, headers_left == 1, all_in)
        # (the run ends only after the last header is in)
        # The ring holds at most ``ring_depth - 1`` headers (at least the two windows and one
        # more that it needs, as the depth is a power of two above ``2 * window + 1``), so
        # that the entry at ``headers_in`` is never one to be read: the ring is written there
        # in every cycle, with whatever the port shows, and only a take keeps it (by moving
        # ``headers_in`` on). The take then reaches the counters alone, not the write enable
        # of every LUT-RAM cell of the ring (the header's valid through the take into that
        # write enable: the best seed's path before, 228.5 MHz).
        m.d.sync += header_open.eq((running | ctl.begin) & ~all_in_next &
                                   (fill < p.ring_depth - 2))
        with m.If(header_take):
            m.d.sync += headers_left.eq(headers_left - 1)
        m.d.sync += all_in.eq(all_in_next)
        m.d.comb += [
            self.header.ready.eq(header_open),
            ring_w.addr.eq(headers_in),
            ring_w.data.eq(self.header.payload),
            ring_w.en.eq(1),
        ]
        with m.If(header_take):
            m.d.sync += headers_in.eq(headers_in + 1)

        # ---- pass scheduler: one row segment per cycle ---------------------------------------
        # Every compare and difference the next segment needs is taken from registers kept
        # alongside the position (the beats to the row's end, whether this pass is the last,
        # the next window's length), so that a step is one carry chain and a choice.
        gen_active = Signal()
        # ``gen`` (the scheduler's take) as a register of its own, decided a cycle ahead from
        # the next values of its three flags: the position registers load on it, so that
        # their clock enables are one LUT of registers (a window's switch: this, the
        # segment's two flags and the first window's sizing).
        can_gen = Signal()
        can_gen_n = Signal(init=1)               # ~can_gen, a copy
        win_beat = Signal.like(beats)            # beat of the window's first item
        win_to_end = Signal.like(beats)          # beats from win_beat to its row's end
        win_len = Signal(range(window + 1))      # the window's items
        after = Signal(range(max_items + 1))     # items after the current window
        # after - window (negative: the next window is the last and shorter)
        after_less = Signal(signed(max(len(after), bits_for(3 * window)) + 1))
        after_less2 = Signal.like(after_less)   # after - 2 * window
        after_less3 = Signal.like(after_less)   # after - 3 * window
        last_window = Signal()                   # after == 0
        next_len = Signal(range(window + 1))     # the next window's items, min(after, window)

        follow_len = Signal(range(window + 1))   # the length of the window after the next
        # its copy for the ``over_less`` sums (reset value all ones, so that Yosys keeps it
        # apart: no one net reaches all four of a switch's carry chains)
        follow_len_less = Signal(len(follow_len), init=-1 % (1 << len(follow_len)))

        def window_follows(less, less2, less3, over2, over3, over4):
            """The sizes kept for the window after the current one, from ``less``, ``less2``
            and ``less3`` (the items after the current window less one, two and three
            windows): the next window's length is a register too, so that the next position
            is one carry chain from registers, and it is chosen by the signs of registers;
            so is the length of the window after that, so that a switch's sums are one carry
            chain from registers too. ``over2``, ``over3`` and ``over4`` are the pairs
            (``less2`` - beats, that less one) and the same for ``less3`` and ``less3`` -
            window, in the sums' width: the window after the next one's length less beats
            (and less one) is chosen among registers too, as the next ``len_over`` (and
            ``len_over_less``)."""
            short = less[-1]                     # the window after the current is the last
            follow_len_next = Mux(less2[-1], 0, Mux(less3[-1], less2[:len(follow_len)], window))
            new_after = Mux(short, 0, less)
            # (the ``over`` pairs are read only while the window they size is not past the
            # last, so they need not follow ``short``)
            return [after.eq(new_after), after_less.eq(Mux(short, -window, less2)),
                    after_less2.eq(Mux(short, -2 * window, less3)),
                    after_less3.eq(Mux(short, -3 * window, less3 - window)),
                    last_window.eq(short | (less == 0)),
                    next_len.eq(Mux(short | less2[-1], new_after[:len(next_len)], window)),
                    follow_len.eq(follow_len_next), follow_len_less.eq(follow_len_next),
                    follow_over.eq(Mux(less2[-1], no_len_over,
                                       Mux(less3[-1], over2[0], full_len_over))),
                    follow_over_less.eq(Mux(less2[-1], no_len_over_less,
                                            Mux(less3[-1], over2[1], full_len_over_less))),
                    after2_over.eq(over3[0]), after2_over_less.eq(over3[1]),
                    after3_over.eq(over4[0]), after3_over_less.eq(over4[1])]

        pass_k = Signal(range(p.max_top_k))
        last_pass = Signal()                     # pass_k == k_last
        pass_left = Signal(range(window + 1))    # items of this pass still to schedule
        cur_tok = Signal(ring_bits)
        cur_beat = Signal.like(beats)
        to_end = Signal.like(beats)              # beats - cur_beat
        # The segment's two compares are the signs of two registers, pass_left - to_end and
        # that less one, kept alongside the position (with their values at the window's
        # first item, and beats + 1), so that no carry chain sits between a position register
        # and the next position's choice.
        over = Signal(signed(max(len(beats), len(pass_left)) + 1))   # pass_left - to_end
        over_less = Signal.like(over)            # over - 1
        win_over = Signal.like(over)
        win_over_less = Signal.like(over)
        beats_more = Signal(len(beats) + 1)      # beats + 1
        m.d.sync += beats_more.eq(beats + 1)
        # Copies of ``beats`` for the position's steps, one for each register that steps by it
        # (two levels of two copies: a copy of a copy differs from its twin in its input), so
        # that no one net carries beats to every carry chain of the scheduler. They follow
        # ``beats`` two cycles late, long before the first segment (the run control's setup,
        # then the first window's sizing).
        assert p.setup >= 2
        to_end_beats, beats_copy = replicated(m, beats, name="beats_copy", copies=2)
        over_beats, over_less_beats = replicated(m, to_end_beats, name="beats_over", copies=2)
        over_len_beats, over_less_len_beats = replicated(m, beats_copy, name="beats_over_len",
                                                         copies=2)
        # The next window's ``over`` is ``next_len - beats`` when the window ends at a row's
        # end, else ``over + next_len``. Both are registers kept alongside (``len_over`` and
        # ``over_len`` with their ``over_less`` twins), so that a window's switch is a choice
        # among registers, not a carry chain after the next window's length. Their own next
        # values at a switch are sums of registers: the window after the next one has its
        # length kept as a register too (``follow_len``).
        sum_shape = signed(max(len(beats) + 1, bits_for(2 * window)) + 1)
        over_len = Signal(sum_shape)              # over + next_len
        over_less_len = Signal(sum_shape)         # over_less + next_len
        win_over_len = Signal(sum_shape)
        win_over_less_len = Signal(sum_shape)
        len_over = Signal(sum_shape)              # next_len - beats
        len_over_less = Signal(sum_shape)         # next_len - beats - 1
        # The next ``len_over`` and ``len_over_less`` at a switch, kept as registers: the
        # window after the next one's length less beats (and less one), chosen by
        # ``window_follows`` among registers, from after_less2 and after_less3 less beats
        # (and less one) kept in the sums' width (their low bits: exact whenever read).
        follow_over = Signal(sum_shape)           # follow_len - beats
        follow_over_less = Signal(sum_shape)      # follow_len - beats - 1
        after2_over = Signal(sum_shape)           # after_less2 - beats
        after2_over_less = Signal(sum_shape)      # after_less2 - beats - 1
        after3_over = Signal(sum_shape)           # after_less3 - beats
        after3_over_less = Signal(sum_shape)      # after_less3 - beats - 1
        # constants of the run, from the held ``beats`` (for the first window)
        no_len_over = Signal(sum_shape)           # -beats
        no_len_over_less = Signal(sum_shape)
        full_len_over = Signal(sum_shape)         # window - beats
        full_len_over_less = Signal(sum_shape)
        two_len_over = Signal(sum_shape)          # 2 * window - beats
        two_len_over_less = Signal(sum_shape)
        beats_window = Signal(range(p.max_beats + window + 1))   # beats + window
        beats_window_more = Signal(range(p.max_beats + window + 2))
        m.d.sync += [no_len_over.eq(-beats), no_len_over_less.eq(-1 - beats),
                     full_len_over.eq(window - beats), full_len_over_less.eq(window - 1 - beats),
                     two_len_over.eq(2 * window - beats),
                     two_len_over_less.eq(2 * window - 1 - beats),
                     beats_window.eq(beats + window),
                     # (one adder: ``beats + window + 1`` became ``beats_more + window``)
                     beats_window_more.eq(beats + (window + 1))]

        tail = ~over[-1]                         # to_end <= pass_left: the segment ends its row
        count = Mux(tail, to_end, pass_left)
        end_pass = over_less[-1]                 # to_end >= pass_left: it finishes the pass
        # (the token's increment in LUTs beside the register, not a carry chain: the chain,
        # placed apart, was dispatch_backward_data's path, cur_tok -> itself, 221.2 MHz)
        tok_inc = lut_increment(cur_tok)
        next_tok = Mux(tail, tok_inc, cur_tok)
        next_beat = Mux(tail, 0, cur_beat + pass_left)
        next_to_end = Mux(tail, to_end_beats, to_end - pass_left)
        next_over = Mux(tail, len_over, over_len)
        next_over_less = Mux(tail, len_over_less, over_less_len)

        # (a switch makes ``follow_len`` the next window's length: both candidates' sums are
        # carry chains from registers, and ``tail``, a register bit of wide fan-out, chooses
        # after them, in the registers' own choice, not before the chains)
        next_over_len = Mux(tail, len_over + follow_len, over_len + follow_len)
        next_over_less_len = Mux(tail, len_over_less + follow_len_less,
                                 over_less_len + follow_len_less)

        # The command pipeline never stalls: a segment is scheduled only when the command
        # queue is sure to have room for it, so the row reader's command ``ready`` reaches
        # only the queue's skid buffer.
        tag_layout = data.StructLayout({"gate": fmt.width, "valid": 1, "first": 1, "final": 1,
                                        "end_pass": 1, "tail": 1})
        reader = m.submodules.reader = RowReader(
            lanes=p.lanes, width=fmt.width, addr_width=p.addr_width,
            max_count=min(window, p.max_beats), tag_layout=tag_layout,
            outstanding=p.max_outstanding, alternate_data=True, bram=p.bram)
        command_layout = data.StructLayout({"command": reader.command.payload.shape(),
                                            "counts_drop": 1})
        cmd_pipe = m.submodules.cmd_pipe = CreditPipeline(p.command_latency, command_layout)
        m.d.comb += cmd_pipe.i_valid.eq(gen_active & avail_some)
        gen = cmd_pipe.take
        with m.If(can_gen):
            with m.If(~end_pass):                # (then the segment ends its row)
                m.d.sync += [cur_tok.eq(tok_inc), cur_beat.eq(0), to_end.eq(to_end_beats),
                             pass_left.eq(over), over.eq(over - over_beats),
                             over_less.eq(over_less - over_less_beats),
                             over_len.eq(over_len - over_len_beats),
                             over_less_len.eq(over_less_len - over_less_len_beats)]
            with m.Elif(~last_pass):             # the next pass over the same window
                m.d.sync += [pass_k.eq(pass_k + 1), last_pass.eq(pass_k + 1 == k_last),
                             cur_tok.eq(win_tok), cur_beat.eq(win_beat), to_end.eq(win_to_end),
                             pass_left.eq(win_len), over.eq(win_over),
                             over_less.eq(win_over_less), over_len.eq(win_over_len),
                             over_less_len.eq(win_over_less_len)]
            with m.Else():                       # the next window
                m.d.sync += [pass_k.eq(0), last_pass.eq(k_last == 0),
                             cur_tok.eq(next_tok), cur_beat.eq(next_beat),
                             to_end.eq(next_to_end), pass_left.eq(next_len),
                             over.eq(next_over), over_less.eq(next_over_less),
                             over_len.eq(next_over_len), over_less_len.eq(next_over_less_len)]
                with m.If(last_window):
                    m.d.sync += gen_active.eq(0)
        # The sizes kept for the windows after the next one load at a switch too, on a copy of
        # can_gen of their own (inverted: Yosys would merge an equal copy), so that the take
        # reaches them on a net apart from the position registers' one.
        with m.If(~can_gen_n & end_pass & last_pass):
            m.d.sync += [len_over.eq(follow_over), len_over_less.eq(follow_over_less),
                         *window_follows(after_less, after_less2, after_less3,
                                         (after2_over, after2_over_less),
                                         (after3_over, after3_over_less),
                                         (after3_over - window, after3_over_less - window))]
        # The next window's start (the win_* registers) loads whenever the segment in hand
        # ends the window's last pass, not on the take: its clock enable is then two
        # registers, not the scheduler's handshake (a net to eight wide registers). Nothing
        # reads them on a window's last pass (only the next pass restarts from them), and
        # while the take waits the state, and so the value loaded, does not change.
        with m.If(end_pass & last_pass):
            m.d.sync += [win_tok.eq(next_tok), win_beat.eq(next_beat),
                         win_to_end.eq(next_to_end), win_len.eq(next_len),
                         win_over.eq(next_over), win_over_less.eq(next_over_less),
                         win_over_len.eq(next_over_len),
                         win_over_less_len.eq(next_over_less_len)]
        # avail and fill follow cur_tok and win_tok: base + (header taken - tokens passed).
        # Their next values are choices among sums of registers alone (avail + 1, avail - 1,
        # fill + 1, formed beside the handshakes), by the header take and by ``gen`` last: no
        # carry chain after a handshake. Whether avail is nonzero (the scheduler's valid, so
        # that ``gen`` is one LUT of registers) is kept as a register, decided from flags
        # rather than from the sums.
        next_pass = end_pass & ~last_pass
        avail_up = Signal.like(avail)
        avail_down = Signal.like(avail)
        fill_up = Signal.like(fill)
        m.d.comb += [avail_up.eq(avail + 1), avail_down.eq(avail - 1), fill_up.eq(fill + 1)]
        held = Mux(header_take, avail_up, avail)          # no segment scheduled
        refilled = Mux(header_take, fill_up, fill)        # the next pass: the window's start
        # a segment (avail is nonzero then): header taken - token passed
        advanced = Mux(header_take, Mux(tail, avail, avail_up), Mux(tail, avail_down, avail))
        some_next = Mux(gen, Mux(next_pass, (fill != 0) | header_take,
                                 ~tail | header_take | (avail[1:] != 0)),
                        avail_some | header_take)
        m.d.sync += [
            avail.eq(Mux(gen, Mux(next_pass, refilled, advanced), held)),
            avail_some.eq(some_next),
            # the next window starts at the current token
            fill.eq(Mux(gen & end_pass & last_pass, advanced, refilled)),
        ]

        # ---- command pipeline: ring read | slot address (mask and slot | address) ----------
        m.d.comb += [ring_r.addr.eq(cur_tok), ring_r.en.eq(1)]
        side = {"pass_k": pass_k, "beat": cur_beat, "count": count, "tail": tail,
                "end_pass": end_pass, "first": pass_k == 0, "final": last_pass}
        s1 = {name: delay(m, value, 1, 1, name=f"{name}_s1") for name, value in side.items()}
        header = ring_r.data
        if p.max_top_k == 1:
            gate, index, location = header.gate[0], header.index[0], header.location[0]
        else:
            gate = header.gate[s1["pass_k"]]
            index = header.index[s1["pass_k"]]
            location = header.location[s1["pass_k"]]
        # The pass's pair, chosen from the ring's word, is registered before the slot address
        # (its mask compares start from registers).
        gate, index, location = (delay(m, value, 1, 1, name=f"{name}_s2", reset_less=True)
                                 for name, value in (("gate", gate), ("index", index),
                                                     ("location", location)))
        s2 = {name: delay(m, value, 1, 1, name=f"{name}_s2") for name, value in s1.items()}
        # The beat's element offset joins the row address at the slot address's last stage.
        offset = Signal(len(s2["beat"]) + lanes_log2)
        m.d.comb += offset.eq(s2["beat"] << lanes_log2)
        slot_address = m.submodules.slot_address = SlotAddress.for_params(
            p, addr_width=p.addr_width, offset_width=len(offset))
        base, in_range = slot_address.follow(m, ctl, en=1, index=index, location=location)
        m.d.comb += slot_address.offset.eq(offset)
        s3 = {name: delay(m, value, slot_address.latency, 1, name=f"{name}_s3")
              for name, value in s2.items()}
        s3["gate"] = delay(m, gate, slot_address.latency, 1, name="gate_s3")
        # top_k == 0 is held for the run: every pair is invalid.
        s3["valid"] = in_range & ~k_zero

        wiring.connect(m, reader.request, wiring.flipped(self.read_request))
        wiring.connect(m, wiring.flipped(self.read_response), reader.response)
        command = cmd_pipe.payload.command
        m.d.comb += [
            command.addr.eq(base),
            command.count.eq(s3["count"]),
            command.tail.eq(s3["tail"]),
            command.skip.eq(~s3["valid"]),
            # A pair is counted once, at the segment holding its row's first beat.
            cmd_pipe.payload.counts_drop.eq(~s3["valid"] & (s3["beat"] == 0) & ~k_zero),
            reader.command.valid.eq(cmd_pipe.o.valid),
            reader.command.payload.eq(cmd_pipe.o.payload.command),
            cmd_pipe.o.ready.eq(reader.command.ready),
            reader.last_enable.eq(last_en),
        ]
        for name in ("gate", "valid", "first", "final", "end_pass", "tail"):
            m.d.comb += command.tag[name].eq(s3[name])
        # (counted a cycle later, off the handshake path)
        drop = delay(m, cmd_pipe.o.valid & cmd_pipe.o.ready & cmd_pipe.o.payload.counts_drop,
                     1, 1, name="drop")
        with m.If(drop):
            m.d.sync += self.dropped.eq(self.dropped + 1)

        # ---- gate multiply and accumulate: a pipeline that never stalls -------------------
        # A beat enters when the output queue is sure to have room for it and its partial
        # sum (if it needs one) is in the accumulator by the time it reads it; from there
        # the multipliers, the accumulator and the adders run with enable constant 1, and
        # the consumer's ``ready`` reaches only the output queue's skid buffer.
        beat = reader.beats
        tag = beat.payload.tag
        out_layout = data.StructLayout({"out": p.data_layout(), "final": 1})
        # Partial sums vanish at the queue's output (``keep``); the output beat is held in
        # two registers written in turn (``alternate``: ``data.ready`` reaches no wide clock
        # enable).
        acc_pipe = m.submodules.acc_pipe = CreditPipeline(p.accumulate_latency, out_layout,
                                                          keep="final", alternate=("out",))
        item = Signal(range(window))             # the beat's accumulator entry
        # The next entry's two candidates, item + 1 and item + 2, are registers kept alongside
        # (reached only while the pass goes on, so they never pass window + 1).
        item_inc = Signal(range(window + 2))
        item_inc2 = Signal(range(window + 2))
        item_bit = Signal(window)                # 1 << item
        # pending: the entry's partial sum is not yet readable by a beat entering now.
        # pending_here: pending[item], kept as a register so that the hazard is one LUT of
        # registers; pending_inc: pending[item_inc], so that the next pending_here is a
        # choice between registers' bits (no compare or carry chain on a computed entry).
        # (Every entry set in a run is freed before its done, so a run starts with none
        # pending, and ``start`` need not reach these registers.)
        pending = Signal(window)
        pending_here = Signal()
        pending_inc = Signal()
        hazard = ~tag.first & pending_here
        m.d.comb += [acc_pipe.i_valid.eq(beat.valid & ~hazard),
                     beat.ready.eq(acc_pipe.i_ready & ~hazard)]
        take = acc_pipe.take
        wrap = beat.payload.last & tag.end_pass  # the pass's last item: the next is entry 0
        # An entry's partial sum is written back ``accumulate_latency`` cycles after its
        # beat entered, and a beat reads the accumulator ``mul_read`` cycles after it
        # entered, so an entry frees ``accumulate_loop`` cycles after it was taken.
        # The entry freed in a cycle is decoded a cycle ahead into a register (cleared), and
        # the beat's entry is kept one-hot too (item_bit), so that each pending bit's next
        # value is one LUT of registers and ``take``.
        ahead = p.accumulate_loop - 2            # (the loop is at least 3 cycles)
        freed_ahead = delay(m, take & ~tag.final, ahead, 1, name="freed")
        freed_item_ahead = delay(m, item, ahead, 1, name="freed_item")
        freed = delay(m, freed_ahead, 1, 1, name="freed_now")
        freed_item = delay(m, freed_item_ahead, 1, 1, name="freed_item_now")
        cleared = Signal(window)
        m.d.sync += cleared.eq(Mux(freed_ahead, Const(1, window) << freed_item_ahead, 0))
        with m.If(take):
            m.d.sync += [item.eq(Mux(wrap, 0, item_inc)), item_inc.eq(Mux(wrap, 1, item_inc2)),
                         item_inc2.eq(Mux(wrap, 2, item_inc2 + 1)),
                         item_bit.eq(Mux(wrap, 1, item_bit << 1))]
        sets = take & ~tag.final
        m.d.sync += pending.eq((pending | Mux(sets, item_bit, 0)) & ~cleared)

        # An entry's pending bit in the next cycle, from its bit now: set if this beat (taken)
        # is its entry, cleared if its partial sum is freed now. A beat's own entry is never
        # item_inc or item_inc2, so those two only clear. For the constant entries (0 and 1,
        # after a wrap) and item_inc2 the clearing is ``cleared`` (the entry freed now,
        # one-hot) and the beat's entry ``item_bit``: bits of registers, so that those
        # candidates are one LUT of registers, or a choice among such bits, not a compare.
        def kept(bit, entry):                    # a register's entry, not the beat's
            return bit & ~(freed & (freed_item == entry))
        padded = Cat(pending, Const(0, 2))       # entries past the window are never pending
        cleared_padded = Cat(cleared, Const(0, 2))

        def next_first_bit(entry):
            taken_here = ~tag.final & Cat(item_bit, Const(0, 2))[entry]
            return (padded[entry] | taken_here) & ~cleared_padded[entry]
        stays_all = padded & ~cleared_padded
        here_kept = kept(pending_here, item)
        inc_kept = kept(pending_inc, item_inc)
        m.d.sync += [
            pending_here.eq(Mux(take, Mux(wrap, next_first_bit(0), inc_kept), here_kept)),
            pending_inc.eq(Mux(take, Mux(wrap, next_first_bit(1),
                                         stays_all.bit_select(item_inc2, 1)),
                               inc_kept)),
        ]

        # Operands registered next to the multipliers.
        gate_m = delay(m, tag.gate, 1, 1, name="lane_gate", reset_less=True)
        products = []
        for lane in range(p.lanes):
            mul = FloatMultiplierCore(p.format, p.mul_latency, dsp=p.dsp)
            m.submodules[f"mul{lane}"] = mul
            m.d.comb += [mul.a.eq(gate_m),
                         mul.b.eq(delay(m, beat.payload.data[lane], 1, 1,
                                        name=f"lane_data{lane}", reset_less=True)),
                         mul.en.eq(1)]
            products.append(mul.product)
        mul_read = p.mul_read_latency
        m_item = delay(m, item, mul_read, 1, name="item_m", reset_less=True)
        m_valid = delay(m, tag.valid, mul_read, 1, name="valid_m")
        m_first = delay(m, tag.first, mul_read, 1, name="first_m")

        # The accumulator is read with a registered address (the beat's entry) and the
        # adder's operands are registered after the read.
        acc = m.submodules.acc = memory.Memory(
            shape=data.ArrayLayout(fmt.width, p.lanes), depth=window, init=[])
        acc_w = acc.write_port()
        acc_r = acc.read_port(domain="comb")
        m.d.comb += acc_r.addr.eq(m_item)
        start_bits = 0 if self.SUM_START == "zero" else 1 << (fmt.width - 1)
        sums = []
        for lane in range(p.lanes):
            add = FloatAdderCore(p.format, p.add_latency)
            m.submodules[f"add{lane}"] = add
            # an invalid pair adds +0.0
            term = delay(m, Mux(m_valid, products[lane], 0), 1, 1,
                         name=f"term{lane}", reset_less=True)
            partial = delay(m, Mux(m_first, Const(start_bits, fmt.width), acc_r.data[lane]),
                            1, 1, name=f"partial{lane}", reset_less=True)
            m.d.comb += [add.a.eq(term), add.b.eq(partial), add.en.eq(1)]
            sums.append(add.sum)
        latency = p.accumulate_latency
        m.d.comb += [
            acc_w.addr.eq(delay(m, item, latency, 1, name="item_a", reset_less=True)),
            acc_w.en.eq(delay(m, take & ~tag.final, latency, 1, name="write_back")),
            acc_pipe.payload.final.eq(delay(m, tag.final, latency, 1, name="final_a")),
            acc_pipe.payload.out.enable.eq(delay(m, beat.payload.enable, latency, 1,
                                                 name="enable_a")),
            acc_pipe.payload.out.last.eq(delay(m, beat.payload.last & tag.tail, latency, 1,
                                               name="last_a")),
        ]
        for lane, value in enumerate(sums):
            m.d.comb += [acc_pipe.payload.out.data[lane].eq(value), acc_w.data[lane].eq(value)]
        # Partial sums leave the queue too and vanish at its output (``keep``).
        out = acc_pipe.o
        m.d.comb += [
            self.data.valid.eq(out.valid),
            self.data.payload.eq(out.payload.out),
            out.ready.eq(self.data.ready),
        ]

        # ---- control -----------------------------------------------------------------------
        beats_in = (self.hidden + (p.lanes - 1)) >> lanes_log2
        # The items (tokens * beats) during the run control's setup, from the held sizes: a
        # pipelined product, read when the run begins.
        held_beats = Signal.like(beats)
        m.d.sync += held_beats.eq((ctl.size("hidden") + (p.lanes - 1)) >> lanes_log2)
        items_in = Signal(range(max_items + 1))
        m.d.comb += items_in.eq(pipelined_product(m, ctl.size("tokens"), held_beats, en=1,
                                                  dsp=p.dsp, name="items"))
        with m.If(ctl.accept):
            m.d.sync += [
                k_last.eq(Mux(self.top_k == 0, 0, self.top_k - 1)), k_zero.eq(self.top_k == 0),
                beats.eq(beats_in), last_en.eq(last_enable_of(self.hidden, p.lanes)),
                headers_left.eq(self.tokens), all_in.eq(self.tokens == 0),
                last_pass.eq(self.top_k <= 1),
                to_end.eq(beats_in), win_to_end.eq(beats_in),
            ]
        # The registers that restart at a constant do so in the decide cycle (a register),
        # not from the start handshake: nothing reads them before the run begins.
        with m.If(ctl.decide):
            m.d.sync += [
                headers_in.eq(0),
                fill.eq(0), avail.eq(0), avail_some.eq(0), win_tok.eq(0),
                win_beat.eq(0), cur_tok.eq(0), cur_beat.eq(0), pass_k.eq(0),
                item.eq(0), item_inc.eq(1), item_inc2.eq(2), item_bit.eq(1),
                self.dropped.eq(0),
            ]
        # The first window, from the items (tokens * beats): sized in the two cycles before
        # the first header can be in the ring (the run begins, a header is taken).
        first_items = Signal.like(items_in)
        first_less = Signal.like(after_less)     # items - window
        first_less2 = Signal.like(after_less)    # items - 2 * window
        first_less3 = Signal.like(after_less)    # items - 3 * window
        # items less beats, and items less window and beats: the first sums' terms (used only
        # while items < 2 * window, so they fit the sums' width)
        items_over = Signal(sum_shape)
        items_over_less = Signal(sum_shape)
        first_less_over = Signal(sum_shape)
        first_less_over_less = Signal(sum_shape)
        # items less 2, 3 and 4 windows, less beats (and less one), in the sums' width (their
        # low bits: from the low bits of the items and of run constants beats + n * window)
        width = sum_shape.width
        sizing_over = {}
        for n in (2, 3, 4):
            for less_one in (0, 1):
                constant = Signal(width, name=f"beats_window{n}{'_more' * less_one}")
                m.d.sync += constant.eq(beats + (n * window + less_one))
                sizing_over[n, less_one] = Signal(sum_shape,
                                                 name=f"first_less{n}_over{'_less' * less_one}")
                with m.If(ctl.begin):
                    m.d.sync += sizing_over[n, less_one].eq(items_in[:width] - constant)
        sizing = delay(m, ctl.begin, 1, 1, name="sizing")
        with m.If(ctl.begin):
            m.d.sync += [first_items.eq(items_in), first_less.eq(items_in - window),
                         first_less2.eq(items_in - 2 * window),
                         first_less3.eq(items_in - 3 * window),
                         items_over.eq(items_in - beats),
                         items_over_less.eq(items_in - beats_more),
                         first_less_over.eq(items_in - beats_window),
                         first_less_over_less.eq(items_in - beats_window_more)]
        with m.If(sizing):
            first_short = first_less[-1]
            short_items = first_items[:len(win_len)]
            first_len = Mux(first_short, short_items, window)
            # (differences registered when the run began: a choice among registers here)
            first_over = Mux(first_short, items_over, full_len_over)
            first_over_less = Mux(first_short, items_over_less, full_len_over_less)
            m.d.sync += [
                gen_active.eq(1), win_len.eq(first_len), pass_left.eq(first_len),
                over.eq(first_over), over_less.eq(first_over_less),
                win_over.eq(first_over), win_over_less.eq(first_over_less),
                *window_follows(first_less, first_less2, first_less3,
                                *(((sizing_over[n, 0], sizing_over[n, 1]) for n in (2, 3, 4)))),
            ]
            # over + next_len: items - beats when there are at most two windows (the first
            # window's over plus the second's length), else 2 * window - beats.
            first_over_len = Mux(first_less2[-1], items_over, two_len_over)
            first_over_less_len = Mux(first_less2[-1], items_over_less, two_len_over_less)
            m.d.sync += [
                over_len.eq(first_over_len), over_less_len.eq(first_over_less_len),
                win_over_len.eq(first_over_len), win_over_less_len.eq(first_over_less_len),
                len_over.eq(Mux(first_short, no_len_over,
                                Mux(first_less2[-1], first_less_over, full_len_over))),
                len_over_less.eq(Mux(first_short, no_len_over_less,
                                     Mux(first_less2[-1], first_less_over_less,
                                         full_len_over_less))),
            ]
        # can_gen: gen_active & avail_some & the command queue's ready, each at its next value
        # (gen_active rises at sizing and falls after the last window's last segment; the
        # decide cycle clears avail_some while gen_active is low).
        gen_active_next = sizing | (gen_active & ~(gen & end_pass & last_pass & last_window))
        can_gen_next = gen_active_next & some_next & cmd_pipe.ready_next
        m.d.sync += [can_gen.eq(can_gen_next), can_gen_n.eq(~can_gen_next)]
        m.d.comb += ctl.finished.eq(running & ~sizing & ~gen_active & ~cmd_pipe.busy &
                                    ~reader.busy & ~acc_pipe.busy)
        return m
