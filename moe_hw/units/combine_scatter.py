"""The scatter-add combine unit (DUET ``SparseDispatcher.combine``, SPEC 1.3).

For every slot s, in the order the headers arrive (slot order: expert-major, token-ascending
within an expert, as ``sparse_dispatch_indices`` gives it)::

    if 0 <= token < S:
        out[token, j] = out[token, j] + gate * expert_out[s, j]      for j in 0..H-1

each product rounded, then each sum rounded (IEEE-754 round to nearest even). ``out`` is the
token-indexed buffer ``[S, H]``, row-major: element ``(token, j)`` is at address
``token*H + j``. It must hold +0.0 when the run starts (the caller clears it, as dispatch's
output is "all zero before the operator runs"), so every token starts its sum from +0.0.

Where ``out`` lives: behind a read port and a write port, not in a memory the unit owns. The
buffer is a large tensor (S*H elements: 1024 x 512 float32 is 2 MiB, the SPEC 1.1 network scale
is 36 MiB), so SPEC 2 puts it off-unit; the same unit can then sit in front of block RAM,
UltraRAM or a DRAM controller, and the buffer is shared with whoever reads the result. An
owned ``amaranth.lib.memory.Memory`` would fix the latency (and could forward), but would size
the bitstream by ``max_tokens*max_hidden`` and need a separate read-out path.

Memory port contract: responses come in request order; a read request taken in a cycle after
a write was taken returns the written data (read-after-write ordering, as a RAM gives and as
a memory controller must keep). The unit never relies on a read and a write to the same
address in the same cycle.

Streams and ports (payload fields are listed least significant first):

``header`` (in)
    One beat per slot: ``token`` (two's complement, ``index_width`` bits; any bit pattern is
    safe) and ``gate`` (the format's bits).
``data`` (in)
    ``ceil(H / lanes)`` beats per slot, ``lanes`` elements each, lane 0 first; the last beat
    of a slot is padded past H (the padding is never written).
``read`` (out), ``read_data`` (in)
    The read port of the buffer: request ``{addr, enable}`` (element address of lane 0, lane
    enables), response ``{data}`` (``lanes`` elements) in request order.
``write`` (out)
    The write port: ``{addr, data, enable}`` as the dispatch unit's.
``start``, ``tokens``, ``slots``, ``hidden`` (in)
    Run-time problem size (S, the number of headers, H), sampled when ``start`` is high while
    idle (the shared :class:`~moe_hw.blocks.run_control.RunControl`).
``busy``, ``done``, ``dropped``, ``error`` (out)
    ``done`` rises when the last write has been taken and stays high until the next start.
    ``dropped`` counts slots whose token is outside ``[0, S)``: their data beats are taken
    and discarded, nothing is read or written for them. ``error`` is set when a run-time size
    exceeds its maximum; such a run does nothing.

Zero-element problems (``slots``, ``tokens`` or ``hidden`` zero) finish at once: ``done`` is seen
``EMPTY_CYCLES`` (2) cycles after start, no stream is read, nothing is read or written.
``dropped`` then reads
``slots`` when ``tokens`` is zero and ``hidden`` is not (every slot fails the mask), else 0.

Read-modify-write hazard: a slot's beat at address A reads ``out`` at A, adds, and writes A
back ``hazard_window`` cycles later. If a later slot has the same token, its beat at A must
not read A until that write has been taken. The unit counts the beats between their issue
(read request) and their write being taken (at most ``max_outstanding``; writes are taken in
issue order) and issues a beat only when the beat of the same address before it has been
taken. It finds that beat without comparing addresses: slots that are not dropped issue
``ceil(H / lanes)`` beats each, in slot order, so if a slot's token was last seen on the j-th
such slot before it, every beat of the slot has its predecessor exactly
``j * ceil(H / lanes)`` beats earlier, which has been taken exactly when fewer beats than
that are in flight. The header pipeline finds j in a history of the tokens of the last
``max_outstanding - 1`` slots (a farther one is always taken: the in-flight count never
reaches ``max_outstanding``) and hands the slot its in-flight limit ``min(j *
ceil(H / lanes), max_outstanding)``. Only a true conflict (same token, same beat) stalls, for
exactly as long as it must.

Throughput and exact cycle counts (no stalls from the streams or the memory; memory read
latency ``read_latency``: a request taken in cycle c is answered from cycle c + latency):

- no hazard: one data beat per cycle; a run of n slots takes exactly
  ``n * ceil(H / lanes) + overhead(read_latency)`` cycles from the start cycle to the cycle
  ``done`` is first seen (``CombineScatterParams.cycles``; the last slot not dropped),
  provided ``max_outstanding >= hazard_window(read_latency)``. ``overhead = lead +
  hazard_window``; ``lead = START_LATENCY + (run_setup - 1) + header_stages + 2`` (8 at the
  default parameters: start and decide, the 4 header stages, the header skid buffer, the
  current-slot register) and ``hazard_window = max(1 + mul_latency + 2, 1 + read_latency) +
  add_latency + 3`` (join: the product through the operand register, the multiplier and the
  FIFO, or the read round trip; the adder; the write FIFO and the write being taken). At the
  default parameters and read latency 2: ``hazard_window = 32``, ``overhead = 40``;
- a hazard: a beat at the address of a beat issued in cycle c issues no earlier than
  ``c + hazard_window``. So a slot that repeats the previous slot's token (same token on
  back-to-back slots) costs ``max(0, hazard_window - ceil(H / lanes))`` cycles, one whose
  token was last seen d beats earlier costs ``max(0, hazard_window - d)``, and the beats after
  its first flow at full rate again. ``CombineScatterParams.replay_cycles`` gives the exact
  count of any slot order (dropped slots included).

Pipeline: header pipeline (``header_stages``, 4 at the default parameters: the mask; the token
history compare; the in-flight limit of the nearest match in each group of four history entries;
the nearest group's; the row address ``token*H`` alongside on registered DSP blocks), a header skid
buffer (the header pipeline's enable depends on registers only); the current-slot register walks
``addr``; issue (read request into a skid buffer, in-flight count, the room look-ahead: compares of
the in-flight count against the current and the next slot's limit; an operand register and
``lanes`` multipliers ``gate * element``, free-running); the products wait in a FIFO (a
:class:`~moe_hw.stream.RingQueue`, ``max_outstanding`` deep, without a full check: at most
``max_outstanding`` beats are in flight, and its write enable is a register) for the read data;
``lanes`` adders form ``old + product``, free-running too, into a write FIFO (a
:class:`~moe_hw.stream.RingQueue` likewise) that drives ``write``. The issue decision
(``data.ready``) is a function of registers only; no stall enable fans out to the arithmetic
pipelines.
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.fadd import FloatAdderCore
from ..arith.fmul import FloatMultiplierCore
from ..arith.params import FORMAT_NAMES, FloatDatapathParams, dsp_param
from ..arith.product import pipelined_product, product_latency
from ..blocks.row_beats import row_beats
from ..blocks.row_reader import last_enable_of
from ..blocks.run_control import EMPTY_CYCLES, START_LATENCY, RunControl, run_ports
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import PipelineControl, RingQueue, SkidBuffer, delay, replicated

__all__ = ["CombineScatterParams", "CombineScatterUnit"]

#: Queue latency: an entry written in cycle c is on the queue's output from cycle c + 2.
_FIFO_LATENCY = RingQueue.LATENCY


@dataclass(frozen=True)
class CombineScatterParams(FloatDatapathParams, UnitParams):
    """Generation-time parameters of :class:`CombineScatterUnit`."""

    format: str = param("fp32", choices=FORMAT_NAMES)
    lanes: int = param(4, choices=LANES)
    max_tokens: int = param(4096, minimum=1, maximum=1 << 30, doc="S, the token buffer's rows")
    max_slots: int = param(65536, minimum=1, maximum=1 << 30, doc="headers per run")
    max_hidden: int = param(4096, minimum=1, maximum=1 << 30)
    index_width: int = param(32, minimum=2, maximum=64, doc="the header's token field")
    max_outstanding: int = param(32, minimum=2, maximum=1024, power_of_two=True,
                                 doc="beats between issue and write (the hazard tracker)")
    mul_stages: int | None = param(None, minimum=0, maximum=16, optional=True,
                                   doc="None: the multiplier's default depth for the format")
    dsp: str = dsp_param()
    add_stages: int | None = param(None, minimum=0, maximum=16, optional=True,
                                   doc="None: the adder's default depth for the format")

    def check(self):
        self.check_signed_fits("index_width", "max_tokens")

    @property
    def addr_width(self):
        return max(1, ceil_log2(self.max_tokens * self.max_hidden))

    def header_layout(self):
        return data.StructLayout({"token": signed(self.index_width), "gate": self.fmt.width})

    def data_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.fmt.width, self.lanes)})

    def read_layout(self):
        return data.StructLayout({"addr": self.addr_width, "enable": self.lanes})

    def write_layout(self):
        return data.StructLayout({
            "addr": self.addr_width,
            "data": data.ArrayLayout(self.fmt.width, self.lanes),
            "enable": self.lanes,
        })

    # ---- exact stall-free timing ----------------------------------------------------------

    def join_delay(self, read_latency):
        """Cycles from a beat's issue to its read data and product meeting at the adder:
        the product path (operand register, multiplier, FIFO) or the read path (request
        skid buffer, memory), whichever is longer."""
        return max(1 + self.mul_latency + _FIFO_LATENCY, 1 + read_latency)

    def hazard_window(self, read_latency):
        """Cycles from a beat's issue to the earliest issue of a beat at the same address:
        join, adder, write FIFO (the write is taken), in-flight count update."""
        return self.join_delay(read_latency) + self.add_latency + _FIFO_LATENCY + 1

    @property
    def token_bits(self):
        """The bits of an in-range token (the row address and the hazard history)."""
        return max(1, bits_for(self.max_tokens - 1))

    @property
    def base_latency(self):
        """Stages of the row address ``token * H`` (a registered DSP product)."""
        return product_latency(self.token_bits, bits_for(self.max_hidden))

    @property
    def header_stages(self):
        """Stages of the header pipeline: the mask, the token history compare, the slot's
        in-flight limit in two (the nearest match in each group of four entries, the nearest
        group's): 4, or the row address product if that is longer."""
        return max(4, self.base_latency)

    @property
    def limit_stages(self):
        """Stages of the in-flight limit table ``min(j * beats, max_outstanding)`` (a
        registered shift-and-add tree per ``j``, then the saturation)."""
        return _limit_stages(self.max_outstanding)

    @property
    def run_setup(self):
        """The run control's ``setup``: the limit table, computed from ``beats`` (held from
        the decide cycle on), must be ready when the first header reaches it."""
        return max(1, self.limit_stages - 2)

    @property
    def lead(self):
        """Cycles from the start cycle to the first data beat's cycle: run control (start,
        decide, ``run_setup - 1`` more), the header pipeline, the header skid buffer, the
        current-slot register."""
        return START_LATENCY + (self.run_setup - 1) + self.header_stages + 2

    def overhead(self, read_latency):
        """Stall-free cycles beyond one per data beat when the last slot is not dropped: the
        lead-in, then from the last beat's issue cycle t: its write is taken in cycle
        ``t + hazard_window - 1``, ``finished`` is high in the next cycle and ``done`` in the
        one after."""
        return self.lead + self.hazard_window(read_latency)

    def cycles(self, slots, hidden, read_latency):
        """Exact stall-free cycles of a run of ``slots`` slots without hazards or a dropped
        last slot: ``slots * ceil(H / lanes) + overhead``; 1 for a zero-element run."""
        if slots == 0 or hidden == 0:
            return EMPTY_CYCLES
        return slots * -(-hidden // self.lanes) + self.overhead(read_latency)

    def replay_cycles(self, tokens_in_order, hidden, read_latency):
        """Exact stall-free cycles of a run for ANY slot order: replays the issue schedule
        against the tracker. ``tokens_in_order`` has every slot's token, ``None`` for a
        dropped slot (its beats are taken and discarded at full rate). A beat at the address
        of a beat issued in cycle c issues no earlier than ``c + hazard_window``; the run ends
        ``hazard_window + 1`` cycles after its last issued beat (``done`` is seen then), or 2
        cycles after its last discarded one, whichever is later."""
        if not tokens_in_order or hidden == 0:
            return EMPTY_CYCLES
        beats = -(-hidden // self.lanes)
        window = self.hazard_window(read_latency)
        issued = {}          # (token, beat) -> issue cycle of its latest beat
        cycle, end = 0, 0
        for token in tokens_in_order:
            for beat in range(beats):
                if token is None:
                    end = max(end, cycle + 2)
                else:
                    last = issued.get((token, beat))
                    if last is not None and cycle < last + window:
                        cycle = last + window
                    issued[(token, beat)] = cycle
                    end = max(end, cycle + window + 1)
                cycle += 1
        return self.lead + end


def _limit_stages(depth):
    most_terms = max(bin(j).count("1") for j in range(1, max(depth, 2)))
    return max(1, ceil_log2(most_terms))


def _limit_table(m, beats, depth, stages):
    """``{j: min(j * beats, depth)}`` for ``j`` in ``1 .. depth - 1``, registers that follow
    ``beats`` ``stages`` cycles later (:func:`_limit_stages`). ``j * beats`` is the sum of
    ``beats`` shifted by the set bits of ``j``, one registered adder level per stage (no
    multiplier blocks); below ``depth`` it fits ``bits_for(depth)`` bits, so the sums are
    taken modulo that."""
    width = bits_for(depth)
    table = {}
    for j in range(1, depth):
        small = delay(m, beats < -(-depth // j), stages - 1, Const(1), name=f"limit_small{j}")
        terms = [(beats << k)[:width] for k in range(width) if (j >> k) & 1]
        for level in range(stages - 1):
            summed = []
            for i in range(0, len(terms), 2):
                total = Signal(width, name=f"limit_sum{j}_{level}_{i // 2}")
                m.d.sync += total.eq(sum(terms[i:i + 2])[:width])
                summed.append(total)
            terms = summed
        entry = Signal(width, name=f"limit_of{j}")
        m.d.sync += entry.eq(Mux(small, sum(terms)[:width], depth))
        table[j] = entry
    return table


class CombineScatterUnit(wiring.Component):
    """Streaming scatter-add combine with an in-flight tracker for the read-modify-write
    hazard. See the module docstring for the protocol and timing."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(CombineScatterParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "header": In(stream.Signature(p.header_layout())),
            "data": In(stream.Signature(p.data_layout())),
            "read": Out(stream.Signature(p.read_layout())),
            "read_data": In(stream.Signature(p.data_layout())),
            "write": Out(stream.Signature(p.write_layout())),
            **run_ports(self.sizes),
            "dropped": Out(range(p.max_slots + 1)),
        })

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order."""
        p = self.params
        return {"tokens": p.max_tokens, "slots": p.max_slots, "hidden": p.max_hidden}

    def hazard_window(self, read_latency):
        return self.params.hazard_window(read_latency)

    def overhead(self, read_latency):
        return self.params.overhead(read_latency)

    def elaborate(self, platform):
        m = Module()
        p = self.params
        lanes_log2 = ceil_log2(p.lanes)
        width = p.fmt.width
        depth = p.max_outstanding
        token_bits = p.token_bits

        # ---- run control: start, held sizes, done / error ---------------------------------
        ctl = m.submodules.control = RunControl(self.sizes, empty_when_zero=self.sizes,
                                                setup=p.run_setup)
        ctl.connect(m, self)
        running = ctl.running
        beats = Signal(range(-(-p.max_hidden // p.lanes) + 1))
        last_enable = Signal(p.lanes)
        headers_left = Signal.like(self.slots)
        slots_left = Signal.like(self.slots)
        no_slots = Signal()                     # slots_left == 0, as a register

        # ---- in-flight limits by distance --------------------------------------------------
        # Every slot that is not dropped issues ``beats`` beats, in slot order, and writes
        # retire in issue order. So if a slot's token was last seen on the j-th slot before
        # it that is not dropped, that slot's beat b (the same address as this slot's beat b)
        # was issued exactly j * beats beats earlier, and it has retired exactly when fewer
        # than j * beats beats are in flight. ``limit_of[j] = min(j * beats, depth)``: the
        # tracker's capacity bounds the in-flight count anyway. A register of the held
        # ``beats``.
        # The limit as the room check reads it: ``no_limit`` for a dropped slot (always room:
        # above every in-flight count + 1), 0 while the header skid buffer shows no slot.
        limit_width = bits_for(depth + 2)
        no_limit = (1 << limit_width) - 1
        limit_of = _limit_table(m, beats, depth, p.limit_stages)

        # ---- header pipeline: mask, history, limit; row address alongside --------------------
        header = self.header.payload
        header_ctl = m.submodules.header_ctl = PipelineControl(p.header_stages)
        header_open = Signal()      # running, headers left: a register
        m.d.comb += [
            header_ctl.i_valid.eq(self.header.valid & header_open),
            self.header.ready.eq(header_ctl.en & header_open),
        ]
        en_h = header_ctl.en
        with m.If(self.header.valid & self.header.ready):
            m.d.sync += headers_left.eq(headers_left - 1)
            with m.If(headers_left == 1):
                m.d.sync += header_open.eq(0)
        with m.If(ctl.begin):           # a run that begins has a slot
            m.d.sync += header_open.eq(1)
        # Stage 1: the mask.
        token = header.token.as_unsigned()[:token_bits]
        h1_token = delay(m, token, 1, en_h, name="h1_token", reset_less=True)
        h1_in_range = delay(m, (header.token >= 0) & (header.token < ctl.size("tokens")), 1,
                            en_h, name="h1_in_range")
        h1_valid = delay(m, header_ctl.i_valid, 1, en_h, name="h1_valid")
        with m.If(en_h & h1_valid & ~h1_in_range):
            m.d.sync += self.dropped.eq(self.dropped + 1)
        # Stage 2: which of the last ``depth - 1`` slots that are not dropped had this token.
        # ``history[i]`` is the token of the (i + 1)-th latest one. A repeat stays in the
        # history, and the nearest match wins (stages 3 and 4), so that the history's next
        # value does not wait for the compares: they are a stage of their own.
        # The token is compared by every history entry: a copy of it for each group of up
        # to eight entries (one register fed all of them: 235.2 MHz, a 1.4 ns net).
        history = [Signal(token_bits, name=f"history{i}") for i in range(depth - 1)]
        history_valid = Signal(depth - 1)
        matches = Signal(depth - 1)
        copies = min(4, -(-(depth - 1) // 8))
        h1_copies = replicated(m, token, name="h1_token_copy", copies=copies, en=en_h)
        m.d.comb += matches.eq(Cat(*[history_valid[i] &
                                     (history[i] == h1_copies[i * copies // (depth - 1)])
                                     for i in range(depth - 1)]))
        seen = delay(m, matches, 1, en_h, name="h2_seen")
        with m.If(en_h & h1_valid & h1_in_range):
            m.d.sync += [history[0].eq(h1_token),
                         history_valid.eq(Cat(Const(1, 1), history_valid))]
            m.d.sync += [history[i].eq(history[i - 1]) for i in range(1, depth - 1)]
        with m.If(ctl.accept):
            m.d.sync += history_valid.eq(0)
        # Stages 3 and 4: the slot's in-flight limit, ``limit_of[j]`` for the nearest match j
        # (none: ``depth``): the nearest match within each group of four entries, then the
        # nearest group's.
        groups = []
        for first in range(0, depth - 1, 4):
            members = range(first, min(first + 4, depth - 1))
            group_seen = Signal(name=f"h3_seen{first // 4}")
            group_limit = Signal(limit_width, name=f"h3_limit{first // 4}")
            nearest = Const(0, limit_width)
            for i in reversed(members):
                nearest = Mux(seen[i], limit_of[i + 1], nearest)
            with m.If(en_h):
                m.d.sync += [group_seen.eq(seen[first:members.stop].any()),
                             group_limit.eq(nearest)]
            groups.append((group_seen, group_limit))
        nearest = Const(depth, limit_width)
        for group_seen, group_limit in reversed(groups):
            nearest = Mux(group_seen, group_limit, nearest)
        h_limit = Signal(limit_width)
        with m.If(en_h):
            m.d.sync += h_limit.eq(nearest)
        h_lim = delay(m, h_limit, p.header_stages - 4, en_h, name="h_lim", reset_less=True)
        # The row address token * H on registered DSP blocks, alongside.
        product = pipelined_product(m, token, ctl.size("hidden"), en=en_h, dsp=p.dsp,
                                    name="base")
        h_base = delay(m, product[:p.addr_width], p.header_stages - p.base_latency, en_h,
                       name="h_base", reset_less=True)
        h_gate = delay(m, header.gate, p.header_stages, en_h, name="h_gate", reset_less=True)
        h_in_range = delay(m, h1_in_range, p.header_stages - 1, en_h, name="h_in_range")
        # A skid buffer between the header pipeline and the current slot: the pipeline's
        # enable then depends on registers only, not on the data stream. Its wide fields sit
        # in alternating registers (the current slot's registers load them anyway), so that
        # the beat's take, through the slot's end, reaches only the skid buffer's flags (it
        # reached the clock enable of the base address: 213.6 MHz). The limit is held in a
        # plain register with a reset, so that it reads 0 while no slot is shown.
        h_skid = m.submodules.header_skid = SkidBuffer(data.StructLayout({
            "gate": width, "valid": 1, "base": p.addr_width,
            "limit": limit_width}), alternate=("gate", "base"), reset_held=True)
        m.d.comb += [
            h_skid.i.valid.eq(header_ctl.o_valid),
            header_ctl.o_ready.eq(h_skid.i.ready),
            h_skid.i.payload.gate.eq(h_gate),
            h_skid.i.payload.valid.eq(h_in_range),
            h_skid.i.payload.base.eq(h_base),
            h_skid.i.payload.limit.eq(Mux(header_ctl.o_valid,
                                          Mux(h_in_range, h_lim, no_limit), 0)),
        ]
        slot = h_skid.o.payload

        # ---- current slot: walks the addresses of its beats ----------------------------------
        cur_loaded = Signal()
        cur_valid = Signal()
        cur_addr = Signal(p.addr_width)
        cur_lim = Signal(limit_width)           # the slot's in-flight limit
        room_ok = Signal()                      # a slot in hand, dropped or with room
        read_skid = m.submodules.read_skid = SkidBuffer(p.read_layout())
        # ``room_ok`` is a register (below), so that the beat's ``ready`` is one LUT from
        # registers. It includes ``cur_loaded``, which implies ``running`` (the slots are the
        # run's, and the run ends after its last slot's last beat). A dropped slot's beats are
        # taken and discarded at full rate.
        m.d.comb += self.data.ready.eq((~cur_valid | read_skid.i.ready) & room_ok)
        beat_take = self.data.valid & self.data.ready
        issue = Signal()
        m.d.comb += issue.eq(beat_take & cur_valid)
        load = Signal()
        # The rows follow one another (a slot is loaded only when the one in hand ends), so
        # the beat counter restarts by itself after a last beat: its clock enable is the take
        # alone (it was the load, the take gated with the skid buffer's valid: 210.7 MHz).
        _, last_beat = row_beats(m, beats, start=ctl.decide, step=beat_take, wrap=True)
        cur_free = ~cur_loaded | (beat_take & last_beat)
        m.d.comb += [h_skid.o.ready.eq(cur_free), load.eq(h_skid.o.valid & cur_free)]
        enable = Signal(p.lanes)
        m.d.comb += enable.eq(Mux(last_beat, last_enable, (1 << p.lanes) - 1))

        with m.If(beat_take):
            m.d.sync += cur_addr.eq(cur_addr + p.lanes)
            with m.If(last_beat):
                m.d.sync += [cur_loaded.eq(0), slots_left.eq(slots_left - 1),
                             no_slots.eq(slots_left == 1)]
        with m.If(load):
            m.d.sync += [cur_loaded.eq(1), cur_valid.eq(slot.valid),
                         cur_addr.eq(slot.base), cur_lim.eq(slot.limit)]
        # The slot's gate, in two registers used in turn: the one not in use loads the header
        # skid buffer's gate in every cycle, and a load flips which one is in use
        # (``gate_sel``), so that the beat's take reaches that flag alone, not the clock
        # enable of a word (the gate loaded at ``load``: one seed's path of six, 229.3 MHz).
        gates = [Signal(width, name=f"cur_gate{i}", reset_less=True) for i in range(2)]
        gate_sel = Signal()
        with m.If(gate_sel):
            m.d.sync += gates[0].eq(slot.gate)
        with m.Else():
            m.d.sync += gates[1].eq(slot.gate)
        with m.If(load):
            m.d.sync += gate_sel.eq(~gate_sel)
        cur_gate = Mux(gate_sel, gates[1], gates[0])

        # ---- in-flight count and the room flag ------------------------------------------------
        # ``count`` is the number of beats in flight (issued, write not yet taken) at the start
        # of this cycle, kept beside ``count - 1`` and ``count + 1`` so that its next value is
        # a choice among registers by this cycle's handshakes, and so that the compares below
        # start from registers. (``count_less`` is read only when ``count`` is 1 or more.)
        retire = self.write.valid & self.write.ready
        grow = Signal()
        shrink = Signal()
        m.d.comb += [grow.eq(issue & ~retire), shrink.eq(retire & ~issue)]

        def by_change(values):
            """``values[d]`` for this cycle's change d of the in-flight count."""
            return Mux(grow, values[1], Mux(shrink, values[-1], values[0]))

        count = Signal(limit_width)
        count_less = Signal(limit_width, init=-1 % (1 << limit_width))
        count_more = Signal(limit_width, init=1)
        m.d.sync += [
            count.eq(by_change({-1: count_less, 0: count, 1: count_more})),
            count_less.eq(by_change({-1: count_less - 1, 0: count_less, 1: count})),
            count_more.eq(by_change({-1: count, 0: count_more, 1: count_more + 1})),
        ]
        idle = Signal()                         # no beat in flight this cycle
        m.d.comb += idle.eq(count == 0)

        # ``room_ok`` (a slot in hand, and dropped or with fewer beats in flight than its
        # limit) is a register, so that the beat's ``ready`` is one LUT from registers. Each
        # cycle forms it for the next: for each change d of the count, whether the next cycle's
        # slot (the skid buffer's when the slot in hand is done with, else the one in hand) is
        # dropped or has ``count + d`` below its limit, a compare of registers each, then the
        # choices by the slot's end and by the handshakes, last. The limits carry "dropped"
        # and "no slot" in their values (``no_limit``, 0), so that the compares are the
        # choice's only data (with the flags beside them, it was three LUT levels after the
        # compares: 194.9 MHz).
        after = {-1: count_less, 0: count, 1: count_more}
        room_next = {}
        for d, value in after.items():
            cur_ok = value < cur_lim
            next_ok = value < slot.limit
            # (``cur_free``: the next cycle's slot is the skid buffer's)
            room_next[d] = Mux(cur_free, next_ok, cur_ok)
        m.d.sync += room_ok.eq(by_change(room_next))

        # ---- issue: read request, gate multiply ---------------------------------------------
        m.d.comb += [
            read_skid.i.valid.eq(issue),
            read_skid.i.payload.addr.eq(cur_addr),
            read_skid.i.payload.enable.eq(enable),
            self.read.valid.eq(read_skid.o.valid),
            self.read.payload.eq(read_skid.o.payload),
            read_skid.o.ready.eq(self.read.ready),
        ]

        # The multipliers run freely: the FIFO behind them always has room, since it and the
        # pipeline hold at most ``depth`` beats between them.
        always = Const(1)
        product_layout = data.StructLayout({
            "product": data.ArrayLayout(width, p.lanes),
            "addr": p.addr_width,
            "enable": p.lanes,
        })
        products = Signal(product_layout)
        # An operand register in front of the multipliers: their unpacking logic then starts
        # from registers placed beside them, not from the data port.
        op_gate = delay(m, cur_gate, 1, always, name="op_gate", reset_less=True)
        op_data = delay(m, self.data.payload.data, 1, always, name="op_data", reset_less=True)
        for lane in range(p.lanes):
            mul = FloatMultiplierCore(p.format, p.mul_latency, dsp=p.dsp)
            m.submodules[f"mul{lane}"] = mul
            m.d.comb += [mul.a.eq(op_gate), mul.b.eq(op_data[lane]),
                         mul.en.eq(always), products.product[lane].eq(mul.product)]
        product_delay = 1 + p.mul_latency
        m.d.comb += [
            products.addr.eq(delay(m, cur_addr, product_delay, always,
                                   name="m_addr", reset_less=True)),
            products.enable.eq(delay(m, enable, product_delay, always,
                                     name="m_enable", reset_less=True)),
        ]
        m_valid = delay(m, issue, product_delay, always, name="m_valid")

        # The queues are distributed-RAM rings without a full check (their write enables are
        # registers): the in-flight count bounds what they hold.
        fifo = m.submodules.product_fifo = RingQueue(product_layout, depth)
        m.d.comb += [fifo.w_en.eq(m_valid), fifo.w_data.eq(products)]
        head = fifo.o.payload

        # ---- join the read data with the product, add ---------------------------------------
        # The adders run freely too, into a FIFO that always has room: the adders and the
        # FIFO hold at most ``depth`` beats between them (a beat counts as in flight until
        # its write is taken). No stall enable fans out to the adder pipelines.
        join = Signal()
        m.d.comb += [
            join.eq(fifo.o.valid & self.read_data.valid),
            fifo.o.ready.eq(join),
            self.read_data.ready.eq(fifo.o.valid),
        ]
        # (Its output skid buffer holds the address and the data in alternating registers, so
        # that ``write.ready`` reaches only its flags and pointers, not the clock enables of
        # the wide payload: its net was on the critical path, 227.6 MHz on one seed.)
        write_fifo = m.submodules.write_fifo = RingQueue(p.write_layout(), depth,
                                                         alternate=("addr", "data"))
        sums = Signal(p.write_layout())
        for lane in range(p.lanes):
            add = FloatAdderCore(p.format, p.add_latency)
            m.submodules[f"add{lane}"] = add
            m.d.comb += [add.a.eq(self.read_data.payload.data[lane]),
                         add.b.eq(head.product[lane]), add.en.eq(always),
                         sums.data[lane].eq(add.sum)]
        m.d.comb += [
            sums.addr.eq(delay(m, head.addr, p.add_latency, always,
                               name="a_addr", reset_less=True)),
            sums.enable.eq(delay(m, head.enable, p.add_latency, always,
                                 name="a_enable", reset_less=True)),
            write_fifo.w_en.eq(delay(m, join, p.add_latency, always, name="a_valid")),
            write_fifo.w_data.eq(sums),
        ]
        wiring.connect(m, wiring.flipped(self.write), write_fifo.o)

        # ---- control ---------------------------------------------------------------------------
        m.d.comb += ctl.finished.eq(running & no_slots & idle)
        # Every slot fails the mask when there is no token, but none carries data when H is
        # zero (registered in the start cycle, used in the decide cycle).
        all_dropped = Signal()
        with m.If(ctl.accept):
            m.d.sync += [
                beats.eq((self.hidden + (p.lanes - 1)) >> lanes_log2),
                last_enable.eq(last_enable_of(self.hidden, p.lanes)),
                headers_left.eq(self.slots), slots_left.eq(self.slots),
                no_slots.eq(self.slots == 0),
                all_dropped.eq((self.hidden != 0) & (self.tokens == 0)),
                self.dropped.eq(0),
            ]
        with m.If(ctl.decide & ~ctl.too_big & all_dropped):
            m.d.sync += self.dropped.eq(ctl.size("slots"))
        return m
