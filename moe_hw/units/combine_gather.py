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

``expert`` (in), ``sums`` (out), with ``expert_lanes=True`` only
    The multiply-add lanes serve a second, affine datapath while the unit is idle (a layer
    whose expert phase and combine phase never overlap shares them: :class:`~moe_hw.units.
    moe_layer.MoELayer`). While ``expert.on`` is high, the operands of a cycle are
    ``expert.scale`` (every lane's multiplicand), ``expert.data`` (one element per lane) and
    ``expert.bias`` (every lane's addend), and ``sums`` holds ``scale * data + bias`` per lane
    (the product rounded, then the sum) :attr:`~CombineGatherParams.accumulate_latency`
    cycles later, in place of the combine's sums. The lanes run freely: every cycle's
    operands come out, and the caller keeps track of which cycles carry its beats.
    ``expert.on`` must have held its value for a cycle before the first operands of its
    phase and until their sums are out, and the unit must be idle (the combine's beats
    and the expert's never in the lanes together).

Zero-element problems (``tokens`` or ``hidden`` zero) finish at once: ``done`` two cycles after
start, no header taken, nothing read or out. (Zero capacity or experts is not empty: every
pair is dropped and every output is START's sum of +0.0 terms, which is +0.0.)

Schedule (why one adder per lane keeps one beat per cycle): the work is the item sequence
n = i*B + b (token i, beat b, B = ceil(H / lanes)), cut into *windows* of ``window`` items
(the last may be shorter). Within a window the unit makes K passes, pass k reading the
beat of the token's k-th row for every item of the window, so the two terms of one item that
meet in the adder are ``window`` beats apart, and a window of at least ``add_stages + 2``
items (the accumulate loop: the adder, then the write-back and the read into the adder's
operand register) hides the adder's latency completely. A per-item accumulator of
``window`` entries holds the partial sums between passes; the last pass sends its sums out.
The scheduler steps through the items one beat per cycle, each beat a read command of its
own (the next beat, the next token's first, the window's first again for the next pass, the
next window's first): every step is an increment or a choice among registers, whatever the
row and window lengths. In a window of n items shorter than ``add_stages + 2`` (with the
default ``window``, only the last window can be), a pass barrier at the datapath's entrance
holds the first beat of each pass after the first until its entry's partial sum is back
from the adder (``add_stages + 2 - n`` idle cycles after the pass before).

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

Pipeline: header ring (the headers of the current and next windows, replayed once per pass)
-> item scheduler -> ring read -> the pass's pair registered | the shared
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
has a credit and the pass barrier does not hold it. Partial sums pass through the output
queue too and are dropped at its output.
"""

from dataclasses import dataclass

from amaranth.hdl import Const, Module, Mux, Signal, signed
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
from ..stream import (CreditPipeline, delay, lut_increment, replicated, thermometer_down,
                      thermometer_up)

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
        """The run control's setup cycles: the held sizes and ``ceil(H / lanes)`` (1),
        ``tokens * beats`` on a pipelined product, then that in a register (1), from which
        the first window is sized."""
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

    def __init__(self, params=None, *, expert_lanes=False, **kwargs):
        params = resolve_params(self.PARAMS, params, kwargs)
        assert self.SUM_START in SUM_STARTS
        self.params = p = params
        #: Whether the lanes also serve an affine datapath (the ``expert`` and ``sums``
        #: ports; see the module docstring).
        self.expert_lanes = expert_lanes
        lanes_ports = {}
        if expert_lanes:
            lane_values = data.ArrayLayout(p.fmt.width, p.lanes)
            lanes_ports = {
                "expert": In(data.StructLayout({"on": 1, "scale": p.fmt.width,
                                                "data": lane_values,
                                                "bias": p.fmt.width})),
                "sums": Out(lane_values),
            }
        super().__init__({
            "header": In(stream.Signature(p.header_layout())),
            "read_request": Out(stream.Signature(request_layout(p.lanes, p.addr_width))),
            "read_response": In(stream.Signature(response_layout(p.lanes, p.fmt.width))),
            "data": Out(stream.Signature(p.data_layout())),
            **run_ports(self.sizes),
            "dropped": Out(range(p.max_tokens * p.max_top_k + 1)),
            **lanes_ports,
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
        # (The registers that restart in the run control's decide cycle have no reset of
        # their own: nothing reads them before it, and the decide flag, a register, is then
        # their slices' set/reset alone, not a LUT of it and the reset: the reset through
        # that LUT into ``item`` and ``cur_tok`` was a path of moe_layer's and
        # dispatch_backward_data's seeds. ``dropped``, a status output, keeps its reset.)
        headers_in = Signal(ring_bits, reset_less=True)      # headers taken so far
        win_tok = Signal(ring_bits, reset_less=True)         # the current window's first token
        # The ring's fill (headers_in - win_tok) and the headers available from the scheduler's
        # token on (headers_in - cur_tok) are counters of their own, in thermometer code (bit
        # j: more than j), so that a count's step is a shift by one bit and its compares
        # are its bits; the header stream's ready is a register: the run is on, headers are
        # still to come, and the ring has room (decided a cycle ahead: the fill grows by one
        # at most), so that a header taken is one LUT of registers.
        fill = Signal(p.ring_depth, reset_less=True)
        avail = Signal(p.ring_depth, reset_less=True)
        avail_some = avail[0]                    # avail != 0
        headers_left = Signal.like(self.tokens)
        all_in = Signal()
        header_open = Signal()
        header_take = self.header.valid & header_open
        headers_one = Signal()                   # headers_left == 1
        all_in_next = Mux(header_take, headers_one, all_in)
        # (the run ends only after the last header is in)
        # The ring holds at most ``ring_depth - 1`` headers (at least the two windows and one
        # more that it needs, as the depth is a power of two above ``2 * window + 1``), so
        # that the entry at ``headers_in`` is never one to be read: the ring is written there
        # in every cycle, with whatever the port shows, and only a take keeps it (by moving
        # ``headers_in`` on). The take then reaches the counters alone, not the write enable
        # of every LUT-RAM cell of the ring (the header's valid through the take into that
        # write enable: the best seed's path before, 228.5 MHz).
        m.d.sync += header_open.eq((running | ctl.begin) & ~all_in_next &
                                   ~fill[p.ring_depth - 3])
        with m.If(header_take):
            m.d.sync += [headers_left.eq(headers_left - 1), headers_one.eq(headers_left == 2)]
        m.d.sync += all_in.eq(all_in_next)
        m.d.comb += [
            self.header.ready.eq(header_open),
            ring_w.addr.eq(headers_in),
            ring_w.data.eq(self.header.payload),
            ring_w.en.eq(1),
        ]
        with m.If(header_take):
            m.d.sync += headers_in.eq(headers_in + 1)

        # ---- item scheduler: one read beat per cycle -------------------------------------
        # The scheduler steps through the items (token, beat) of the current window once per
        # pass, one beat per cycle, each beat a command of its own: every register steps by
        # one (the next beat, the next token, the next pass back at the window's start, the
        # next window), and every compare the next step needs is a flag kept beside its
        # counter, so that a step is an increment and a choice among registers.
        gen_active = Signal()
        # The scheduler's take as a register of its own (``can_gen``), decided a cycle ahead
        # from the next values of its three flags: the position registers load on it, so
        # that their clock enables are one LUT of registers.
        can_gen = Signal()
        can_gen_n = Signal(init=1)               # ~can_gen, a copy
        len_bits = bits_for(window)
        pass_k = Signal(range(p.max_top_k), reset_less=True)
        last_pass = Signal()                     # pass_k == k_last
        pass_end = Signal()                      # the beat in hand is its pass's last item
        left = Signal(len_bits)                  # items of this pass after the one in hand
        cur_tok = Signal(ring_bits, reset_less=True)
        cur_beat = Signal.like(beats, reset_less=True)
        to_end = Signal.like(beats)              # beats of the row after the one in hand
        row_end = Signal()                       # to_end == 0: the beat ends its row
        row_start = Signal(reset_less=True)      # cur_beat == 0
        # the current window's first item, and its length less one (and whether that is 0)
        win_beat = Signal.like(beats, reset_less=True)
        win_to_end = Signal.like(beats)
        win_row_end = Signal()
        win_row_start = Signal(reset_less=True)
        win_left = Signal(len_bits)
        win_one = Signal()
        # The windows after the current one: the items after it less one, two and three
        # windows (their signs and low bits size the windows to come), the next window's
        # length less one and its == 1 flag, and whether the current window is the last.
        less_shape = signed(max(bits_for(max_items), bits_for(4 * window)) + 1)
        after_less = Signal(less_shape)
        after_less2 = Signal(less_shape)
        after_less3 = Signal(less_shape)
        next_left = Signal(len_bits)
        next_one = Signal()
        last_window = Signal()
        beats_less = Signal.like(beats)          # beats - 1
        beats_one = Signal()                     # beats == 1
        m.d.sync += [beats_less.eq(beats - 1), beats_one.eq(beats == 1)]

        def windows_from(less1, less2, less3, less4):
            """The sizes of the windows after one that starts T items before the end (T at
            least 1), from T less one, two, three and four windows: whether it is the last,
            the next window's length (less one, and == 1) and the items after it less one,
            two and three windows. Choices by signs of registers; the low bits of ``less1``
            are the next window's length when it is the last one."""
            short = less1[-1]                    # T < window: the window is the last
            tail_window = less2[-1]              # the next window is the last (or none)
            return [last_window.eq(short | (tail_window & (less1[:len_bits] == 0))),
                    next_left.eq(Mux(tail_window, less1[:len_bits] - 1, window - 1)),
                    next_one.eq(~short & Mux(tail_window, less1[:len_bits] == 1, window == 1)),
                    after_less.eq(Mux(short, -window, less2)),
                    after_less2.eq(Mux(short, -2 * window, less3)),
                    after_less3.eq(Mux(short, -3 * window, less4))]

        # The next item of the pass (and the next window's first): the next beat of the row,
        # or the next token's first.
        tok_inc = lut_increment(cur_tok)
        adv_tok = Mux(row_end, tok_inc, cur_tok)
        adv_beat = Mux(row_end, 0, cur_beat + 1)
        adv_to_end = Mux(row_end, beats_less, to_end - 1)
        # (one beat per row: every beat ends its row)
        adv_row_end = beats_one | (~row_end & (to_end == 1))
        restart = pass_end & ~last_pass          # the next pass over the same window

        # The command pipeline never stalls: a beat is scheduled only when the command
        # queue is sure to have room for it, so the row reader's command ``ready`` reaches
        # only the queue's skid buffer. The reader holds a command in a register of its own
        # (``buffered_command``, the same cycles): its ``ready`` is a register, and the
        # memory's ready, through the reader's issue, does not reach the queue's output
        # flags and payload (the path of 5 of 16 seeds, and in moe_layer the expert
        # buffer's ready that way: 4 LUTs).
        tag_layout = data.StructLayout({"gate": fmt.width, "valid": 1, "first": 1, "final": 1,
                                        "end_pass": 1, "tail": 1})
        reader = m.submodules.reader = RowReader(
            lanes=p.lanes, width=fmt.width, addr_width=p.addr_width, max_count=1,
            tag_layout=tag_layout, outstanding=p.max_outstanding, alternate_data=True,
            bram=p.bram, buffered_command=True)
        command_layout = data.StructLayout({"command": reader.command.payload.shape(),
                                            "counts_drop": 1})
        # (the queue's ready decided from registers alone, ``ready_ahead``, so that the
        # take does not reach it; can_gen is the take itself: the scheduler's registers and
        # their next values read the one register, not the three flags it is made of)
        cmd_pipe = m.submodules.cmd_pipe = CreditPipeline(p.command_latency, command_layout,
                                                          ready_ahead=True)
        m.d.comb += cmd_pipe.i_valid.eq(can_gen)
        with m.If(can_gen):
            with m.If(restart):                  # back to the window's first item
                m.d.sync += [pass_k.eq(pass_k + 1), last_pass.eq(pass_k + 1 == k_last),
                             cur_tok.eq(win_tok), cur_beat.eq(win_beat), to_end.eq(win_to_end),
                             row_end.eq(win_row_end), row_start.eq(win_row_start),
                             left.eq(win_left), pass_end.eq(win_one)]
            with m.Else():                       # the next item, of this window or the next
                m.d.sync += [cur_tok.eq(adv_tok), cur_beat.eq(adv_beat), to_end.eq(adv_to_end),
                             row_end.eq(adv_row_end), row_start.eq(row_end)]
                with m.If(pass_end):             # the next window
                    m.d.sync += [pass_k.eq(0), last_pass.eq(k_last == 0),
                                 left.eq(next_left), pass_end.eq(next_one)]
                    with m.If(last_window):
                        m.d.sync += gen_active.eq(0)
                with m.Else():
                    m.d.sync += [left.eq(left - 1), pass_end.eq(left == 1)]
        # The sizes of the windows after the next one load at a switch, on a copy of can_gen
        # of their own (inverted: Yosys would merge an equal copy), so that the take reaches
        # them on a net apart from the position registers' one.
        with m.If(~can_gen_n & pass_end & last_pass):
            m.d.sync += windows_from(after_less, after_less2, after_less3,
                                     after_less3 - window)
        # The next window's start (the win_* registers) loads whenever the beat in hand ends
        # the window's last pass, not on the take: its clock enable is then two registers,
        # not the scheduler's handshake. Nothing reads them on a window's last pass (only the
        # next pass restarts from them), and while the take waits the state, and so the
        # value loaded, does not change.
        with m.If(pass_end & last_pass):
            m.d.sync += [win_tok.eq(adv_tok), win_beat.eq(adv_beat), win_to_end.eq(adv_to_end),
                         win_row_end.eq(adv_row_end), win_row_start.eq(row_end),
                         win_left.eq(next_left), win_one.eq(next_one)]
        # avail and fill follow cur_tok and win_tok: base + (header taken - tokens passed).
        # Their next values are choices among their bits shifted by one, by the header take
        # and by the scheduler's take: no carry chain, and no compare.
        avail_up, avail_down = thermometer_up(avail), thermometer_down(avail)
        fill_up = thermometer_up(fill)
        held = Mux(header_take, avail_up, avail)          # no beat scheduled
        refilled = Mux(header_take, fill_up, fill)        # the next pass: the window's start
        # a beat (avail is nonzero then): header taken - token passed
        advanced = Mux(header_take, Mux(row_end, avail, avail_up),
                       Mux(row_end, avail_down, avail))
        # (avail's next bit 0, written with avail != 0 whenever a beat is scheduled)
        some_next = Mux(can_gen, Mux(restart, fill[0] | header_take,
                                     ~row_end | header_take | avail[1]),
                        avail_some | header_take)
        m.d.sync += [
            avail.eq(Mux(can_gen, Mux(restart, refilled, advanced), held)),
            # the next window starts at the next token
            fill.eq(Mux(can_gen & pass_end & last_pass, advanced, refilled)),
        ]

        # ---- command pipeline: ring read | slot address (mask and slot | address) ----------
        m.d.comb += [ring_r.addr.eq(cur_tok), ring_r.en.eq(1)]
        side = {"pass_k": pass_k, "beat": cur_beat, "row_start": row_start, "tail": row_end,
                "end_pass": pass_end, "first": pass_k == 0, "final": last_pass}
        # (the command's side data, the pass's pair and its gate are data beside the command
        # pipeline's valid: no reset)
        s1 = {name: delay(m, value, 1, 1, name=f"{name}_s1", reset_less=True)
              for name, value in side.items()}
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
        s2 = {name: delay(m, value, 1, 1, name=f"{name}_s2", reset_less=True)
              for name, value in s1.items()}
        # The beat's element offset joins the row address at the slot address's last stage.
        offset = Signal(len(s2["beat"]) + lanes_log2)
        m.d.comb += offset.eq(s2["beat"] << lanes_log2)
        slot_address = m.submodules.slot_address = SlotAddress.for_params(
            p, addr_width=p.addr_width, offset_width=len(offset))
        base, in_range = slot_address.follow(m, ctl, en=1, index=index, location=location)
        m.d.comb += slot_address.offset.eq(offset)
        s3 = {name: delay(m, value, slot_address.latency, 1, name=f"{name}_s3", reset_less=True)
              for name, value in s2.items()}
        s3["gate"] = delay(m, gate, slot_address.latency, 1, name="gate_s3", reset_less=True)
        # top_k == 0 is held for the run: every pair is invalid.
        s3["valid"] = in_range & ~k_zero

        wiring.connect(m, reader.request, wiring.flipped(self.read_request))
        wiring.connect(m, wiring.flipped(self.read_response), reader.response)
        command = cmd_pipe.payload.command
        m.d.comb += [
            command.addr.eq(base),
            command.count.eq(1),
            command.tail.eq(s3["tail"]),
            command.skip.eq(~s3["valid"]),
            # A pair is counted once, at its row's first beat.
            cmd_pipe.payload.counts_drop.eq(~s3["valid"] & s3["row_start"] & ~k_zero),
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
        item = Signal(range(window), reset_less=True)        # the beat's accumulator entry
        # The pass barrier. An entry's partial sum is written back ``accumulate_latency``
        # cycles after its beat entered and read ``mul_read`` cycles after a beat entered,
        # so the beats of two passes that meet in one entry must enter at least
        # ``accumulate_loop`` cycles apart. Beats enter in order, at most one per cycle, so
        # in a window of n items that holds for every entry when the first beat of a pass
        # enters at least ``accumulate_loop - n`` idle cycles after the last beat of the pass
        # before (stall-free exactly that: the schedule's cycles). Only a window shorter
        # than the loop waits (with the default ``window``, only the last window can be).
        # The wait is a thermometer code of the idle cycles still to come, loaded at a
        # pass's end (its last item is n - 1: bit j is ``n - 1 < loop - 1 - j``) and shifted
        # down every cycle, so that each bit's next value is the bit above it or a register
        # of the load's. The item's compares with those constants are registers too
        # (``below``, bit j: ``item < loop - 1 - j``), kept a step ahead like the item:
        # all ones at entry 0, shifted down by one at each step (the compare in front of the
        # barrier's choice, 4 levels, was the path of seeds of this unit and of moe_layer).
        loop = p.accumulate_loop
        hold = Signal(loop - 1)                  # bit j: more than j idle cycles to come
        ones = (1 << (loop - 1)) - 1
        below = Signal(loop - 1, init=ones, reset_less=True)
        holding = hold[0]
        m.d.comb += [acc_pipe.i_valid.eq(beat.valid & ~holding),
                     beat.ready.eq(acc_pipe.i_ready & ~holding)]
        take = acc_pipe.take
        wrap = tag.end_pass                      # the pass's last item: the next is entry 0
        with m.If(take):
            m.d.sync += [item.eq(Mux(wrap, 0, item + 1)),
                         below.eq(Mux(wrap, ones, below >> 1))]
        # (a pass ends only in a cycle the count is zero: the load is or'ed in)
        load = take & wrap & ~tag.final
        m.d.sync += hold.eq((hold >> 1) | (load.replicate(loop - 1) & below))

        # Operands registered next to the multipliers. With ``expert_lanes``, the expert's
        # operands are chosen in front of those registers while ``expert.on`` (by copies of
        # the flag, one per group of lanes), its product always passes (valid, never the
        # first pass) and its bias takes the accumulator's place as the addend.
        copies = min(p.lanes, 4)
        mul_read = p.mul_read_latency
        gate_in, data_in, valid_in, first_in = tag.gate, beat.payload.data, tag.valid, tag.first
        if self.expert_lanes:
            x = self.expert
            on = replicated(m, x.on, name="expert_on", copies=copies)
            gate_in = Mux(on[0], x.scale, tag.gate)
            data_in = [Mux(on[lane * copies // p.lanes], x.data[lane], data_in[lane])
                       for lane in range(p.lanes)]
            valid_in, first_in = tag.valid | x.on, tag.first & ~x.on
            bias_m = delay(m, x.bias, mul_read, 1, name="expert_bias", reset_less=True)
        gate_m = delay(m, gate_in, 1, 1, name="lane_gate", reset_less=True)
        products = []
        for lane in range(p.lanes):
            mul = FloatMultiplierCore(p.format, p.mul_latency, dsp=p.dsp)
            m.submodules[f"mul{lane}"] = mul
            m.d.comb += [mul.a.eq(gate_m),
                         mul.b.eq(delay(m, data_in[lane], 1, 1,
                                        name=f"lane_data{lane}", reset_less=True)),
                         mul.en.eq(1)]
            products.append(mul.product)
        m_item = delay(m, item, mul_read, 1, name="item_m", reset_less=True)
        # The beat's flags that choose a lane's operands (+0.0 for an invalid pair, START on
        # the first pass), one copy per lane (four at most, one per group of lanes), so that
        # no one register reaches every lane's operand bits.
        m_valid = replicated(m, delay(m, valid_in, mul_read - 1, 1, name="valid_m"),
                             name="valid_lane", copies=copies)
        m_first = replicated(m, delay(m, first_in, mul_read - 1, 1, name="first_m"),
                             name="first_lane", copies=copies)

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
            group = lane * copies // p.lanes
            term = delay(m, Mux(m_valid[group], products[lane], 0), 1, 1,
                         name=f"term{lane}", reset_less=True)
            addend = acc_r.data[lane]
            if self.expert_lanes:
                addend = Mux(on[group], bias_m, addend)
            partial = delay(m, Mux(m_first[group], Const(start_bits, fmt.width), addend),
                            1, 1, name=f"partial{lane}", reset_less=True)
            m.d.comb += [add.a.eq(term), add.b.eq(partial), add.en.eq(1)]
            if self.expert_lanes:
                m.d.comb += self.sums[lane].eq(add.sum)
            sums.append(add.sum)
        latency = p.accumulate_latency
        m.d.comb += [
            acc_w.addr.eq(delay(m, item, latency, 1, name="item_a", reset_less=True)),
            acc_w.en.eq(delay(m, take & ~tag.final, latency, 1, name="write_back")),
            acc_pipe.payload.final.eq(delay(m, tag.final, latency, 1, name="final_a")),
            acc_pipe.payload.out.enable.eq(delay(m, beat.payload.enable, latency, 1,
                                                 name="enable_a")),
            acc_pipe.payload.out.last.eq(delay(m, tag.tail, latency, 1, name="last_a")),
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
        # The items (tokens * beats) during the run control's setup, from the held tokens and
        # ``beats`` (loaded at the start): a pipelined product, then a register in the fabric
        # (the product's last register is in the DSP block, whose net to the window sizing's
        # carry chains is long), read when the run begins.
        items_in = Signal(range(max_items + 1))
        m.d.sync += items_in.eq(pipelined_product(m, ctl.size("tokens"), beats, en=1,
                                                  dsp=p.dsp, name="items"))
        with m.If(ctl.accept):
            m.d.sync += [
                k_last.eq(Mux(self.top_k == 0, 0, self.top_k - 1)), k_zero.eq(self.top_k == 0),
                beats.eq(beats_in), last_en.eq(last_enable_of(self.hidden, p.lanes)),
                headers_left.eq(self.tokens), headers_one.eq(self.tokens == 1),
                all_in.eq(self.tokens == 0),
                last_pass.eq(self.top_k <= 1),
            ]
        # The registers that restart at a constant do so in the decide cycle (a register),
        # not from the start handshake: nothing reads them before the run begins.
        with m.If(ctl.decide):
            m.d.sync += [
                headers_in.eq(0),
                fill.eq(0), avail.eq(0), win_tok.eq(0),
                win_beat.eq(0), cur_tok.eq(0), cur_beat.eq(0), pass_k.eq(0),
                row_start.eq(1), win_row_start.eq(1),
                item.eq(0), below.eq(ones),
                self.dropped.eq(0),
            ]
        # The first window, from the items (tokens * beats): sized in the two cycles before
        # the first header can be in the ring (the run begins, a header is taken).
        first_items = Signal(len_bits)           # the items' low bits
        first_less = [Signal(less_shape, name=f"first_less{n}") for n in range(1, 5)]
        with m.If(ctl.begin):                    # items less one to four windows
            m.d.sync += [first_items.eq(items_in[:len_bits]),
                         *(less.eq(items_in - n * window)
                           for n, less in enumerate(first_less, start=1))]
        sizing = delay(m, ctl.begin, 1, 1, name="sizing")
        with m.If(sizing):
            first_short = first_less[0][-1]      # fewer items than a window
            first_left = Mux(first_short, first_items - 1, window - 1)
            first_one = Mux(first_short, first_items == 1, window == 1)
            m.d.sync += [
                gen_active.eq(1), left.eq(first_left), pass_end.eq(first_one),
                win_left.eq(first_left), win_one.eq(first_one),
                to_end.eq(beats_less), win_to_end.eq(beats_less),
                row_end.eq(beats_one), win_row_end.eq(beats_one),
                *windows_from(*first_less),
            ]
        # can_gen: gen_active & avail_some & the command queue's ready, each at its next value
        # (gen_active rises at sizing and falls after the last window's last beat; the
        # decide cycle clears avail_some while gen_active is low).
        switch = can_gen & pass_end & last_pass
        gen_active_next = sizing | (gen_active & ~(switch & last_window))
        can_gen_next = gen_active_next & some_next & cmd_pipe.ready_next
        m.d.sync += [can_gen.eq(can_gen_next), can_gen_n.eq(~can_gen_next)]
        m.d.comb += ctl.finished.eq(running & ~sizing & ~gen_active & ~cmd_pipe.busy &
                                    ~reader.busy & ~acc_pipe.busy)
        return m

