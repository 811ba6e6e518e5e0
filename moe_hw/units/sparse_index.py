"""The sparse dispatcher's index computation (DUET ``SparseDispatcher``, SPEC 1.3): a stable
counting sort of the gate matrix's nonzeros by expert.

From ``gates[S, E]`` it produces, per expert, ``part_sizes[e]`` (the nonzeros in column e) and
its first slot ``offset[e]`` (the exclusive prefix sum of ``part_sizes``), and, per nonzero
``gates[i, e]``, its slot ``offset[e] + (the nonzeros of column e in rows before i)``, where it
writes ``batch_index[slot] = i`` and ``nonzero_gates[slot] = gates[i, e]``. A gate is routed
when it is nonzero: NaN is routed, +0.0 and -0.0 are not.

Three passes:

1. **count** (the gate matrix streamed in once): every routed gate increments its expert's
   counter. Lane ``l`` of a beat owns experts ``l, l + lanes, ...``, so each lane has its own
   :class:`~moe_hw.blocks.counter_bank.CounterBank` and a whole beat is counted per cycle.
2. **offsets** (one expert per cycle): each counter is read out into the
   :class:`~moe_hw.blocks.prefix_sum.PrefixSum`, whose output is both the ``part_sizes`` beat
   and the expert's offset, written to an offset memory (depth ``max_experts``).
3. **place** (the gate matrix streamed in a second time): the counters are cleared and count
   again; a beat's routed gates leave one per cycle, lowest lane first, each as a write of
   slot ``offset[e] + rank`` with ``rank`` the counter's value before its increment. A beat
   with no routed gate still takes one cycle.

The state is O(E) (counters and offsets); the gate matrix itself is read twice, as a DMA
would re-read it from memory, instead of being buffered (which would need O(S*k) storage).

Streams and ports (payload fields are listed least significant first):

``rows`` (in)
    The gate matrix, row by row, ``ceil(E / lanes)`` beats per row, **twice** (pass 1, then
    pass 3: ``2 * S * ceil(E / lanes)`` beats). Beat ``b`` of row ``i`` holds ``gates`` (an
    array of ``lanes`` elements in the format's bits, lane 0 least significant) with lane
    ``l`` holding ``gates[i, b*lanes + l]``; lanes past E are ignored (pad them with anything).
``part_sizes`` (out)
    E beats, expert 0 first (pass 2): ``part_size`` and ``offset`` (the expert's first slot).
``write`` (out)
    One beat per routed gate (pass 3), in row-major order (token ascending, then expert
    ascending): ``addr`` (the slot), ``token`` (``batch_index[addr]``) and ``gate``
    (``nonzero_gates[addr]``, the gate's bits unchanged).
``start``, ``tokens``, ``num_experts`` (in)
    Run-time S and E, sampled when ``start`` is high while idle (the shared
    :class:`~moe_hw.blocks.run_control.RunControl`).
``busy``, ``done``, ``error``, ``nonzeros`` (out)
    ``done`` rises when the last beat of both output streams has left and stays high until the
    next start. ``nonzeros`` is the number of routed gates (final once ``part_sizes`` has
    ended). ``error`` is set when a run-time size exceeds its generation-time maximum (such a
    run reads and writes nothing and is done one cycle after start); or when a gate of an
    in-range lane is negative, i.e. < 0 as the golden model rejects it: sign bit set, not
    +-0.0 and not a NaN (a NaN with the sign bit set is routed like any NaN). A negative gate
    does not stop the run: it is treated as routed (nonzero), every beat of both passes is
    still taken, so no source hangs, and the outputs are those of the nonzero rule; the host
    must discard them. ``error`` is also set, and the write suppressed, if a slot would fall
    outside ``[0, nonzeros)`` (the second copy of the matrix has a routed gate the first did
    not have; the unit keeps no copy to compare the two in full).

A run with E = 0 finishes at once (``done`` one cycle after start). Otherwise, stall-free, a
run takes exactly (:meth:`SparseIndexParams.stall_free_cycles`)::

    S*B + E + place_cycles + PASSES_OVERHEAD      (S >= 1)
    E + OFFSETS_OVERHEAD                          (S == 0)

    B = ceil(E / lanes);  place_cycles = sum over the S*B beats of max(1, routed gates in it)

cycles from the start cycle to the cycle ``done`` is first seen: pass 1 at one beat per cycle,
pass 2 at one expert per cycle, pass 3 at one beat or one routed gate per cycle, whichever is
more. With one beat per row (``lanes >= E``) and k routed gates per row that is
``S + E + k*S + PASSES_OVERHEAD``: pass 3 is bound by the one slot write per cycle of the
``write`` port, and no pass can start before the previous one has seen the whole matrix (an
offset needs every count before it). Empty experts cost only their ``part_sizes`` beat. A
stall anywhere costs only the cycles it lasts.
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.params import FORMAT_NAMES, FloatDatapathParams
from ..blocks.counter_bank import CounterBank
from ..blocks.prefix_sum import PrefixSum
from ..blocks.run_control import EMPTY_CYCLES, START_LATENCY, RunControl, run_ports
from ..formats import float_format
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import PipelineControl, SkidBuffer

__all__ = ["SparseIndexParams", "SparseIndexUnit", "gate_class", "place_cycles"]

COUNT, OFFSETS, PLACE = 0, 1, 2       # the passes


@dataclass(frozen=True)
class SparseIndexParams(FloatDatapathParams, UnitParams):
    """Generation-time parameters of :class:`SparseIndexUnit`."""

    format: str = param("fp32", choices=FORMAT_NAMES)
    lanes: int = param(4, choices=LANES, doc="gates per beat")
    max_tokens: int = param(4096, minimum=1, maximum=1 << 24)
    max_experts: int = param(64, minimum=1, maximum=1 << 16)

    PASSES_OVERHEAD = START_LATENCY + 7
    """Stall-free cycles beyond the passes' own for S >= 1: the run control's start and
    decide cycles; between pass 2 and
    pass 3, the counter bank stage, the prefix sum's register and the offset memory's write
    (pass 3 starts once every offset is written); pass 3's beat register; and after the last
    routed gate, the counter bank stage, the write skid buffer and the done register."""
    OFFSETS_OVERHEAD = START_LATENCY + 4
    """The same for S == 0 (no rows, so no pass 1 or 3): the start and decide cycles, the counter bank
    stage, the prefix sum's register, the part_sizes skid buffer and the done register."""

    def stall_free_cycles(self, tokens, num_experts, place_cycles):
        """Cycles from the start cycle to the cycle ``done`` is first seen, without stalls
        (exact; 1 when E = 0 or a size exceeds its maximum). ``place_cycles`` is pass 3's:
        the sum over the beats of ``max(1, routed gates in the beat)`` (see
        :func:`place_cycles`)."""
        if num_experts == 0 or tokens > self.max_tokens or num_experts > self.max_experts:
            return EMPTY_CYCLES
        if tokens == 0:
            return num_experts + self.OFFSETS_OVERHEAD
        return (tokens * -(-num_experts // self.lanes) + num_experts + place_cycles +
                self.PASSES_OVERHEAD)

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order."""
        return {"tokens": self.max_tokens, "num_experts": self.max_experts}

    @property
    def max_beats_per_row(self):
        return -(-self.max_experts // self.lanes)

    @property
    def count_width(self):
        """Bits of a per-expert count: up to ``max_tokens``."""
        return bits_for(self.max_tokens)

    @property
    def slot_width(self):
        """Bits of a slot, an offset or the number of nonzeros: up to ``max_tokens *
        max_experts``."""
        return bits_for(self.max_tokens * self.max_experts)

    def row_layout(self):
        return data.StructLayout({"gates": data.ArrayLayout(self.fmt.width, self.lanes)})

    def part_sizes_layout(self):
        return data.StructLayout({"part_size": self.count_width, "offset": self.slot_width})

    def write_layout(self):
        return data.StructLayout({"addr": self.slot_width,
                                  "token": max(1, bits_for(self.max_tokens - 1)),
                                  "gate": self.fmt.width})


def gate_class(bits, fmt):
    """``(routed, negative)`` of a gate's bit pattern: routed when nonzero (NaN included,
    +-0.0 not); negative when < 0 (sign set, not zero, not NaN)."""
    fmt = float_format(fmt)
    magnitude = bits[:fmt.width - 1]
    exponent = bits[fmt.mant_bits:fmt.width - 1]
    nan = (exponent == fmt.exp_max) & (bits[:fmt.mant_bits] != 0)
    routed = magnitude != 0
    return routed, bits[fmt.width - 1] & routed & ~nan


class SparseIndexUnit(wiring.Component):
    """Counting sort of the gate matrix's nonzeros by expert: ``part_sizes``, offsets and the
    slot of every nonzero. See the module docstring for the protocol and the cycle count."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(SparseIndexParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "rows": In(stream.Signature(p.row_layout())),
            "part_sizes": Out(stream.Signature(p.part_sizes_layout())),
            "write": Out(stream.Signature(p.write_layout())),
            **run_ports(p.sizes),
            "nonzeros": Out(p.slot_width),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params
        fmt = p.fmt
        lanes_log2 = ceil_log2(p.lanes)

        # ---- run control: start, held sizes, done / error ---------------------------------
        # ``error`` also reports the unit's own faults (a negative gate, or a slot outside
        # [0, nonzeros)), through the run control's ``fault`` input.
        ctl = m.submodules.control = RunControl(p.sizes, empty_when_zero=("num_experts",))
        ctl.connect(m, self)
        faults = []
        running = ctl.running
        tokens = ctl.size("tokens")
        num_experts = ctl.size("num_experts")
        phase = Signal(range(3))
        beats_per_row = Signal(range(p.max_beats_per_row + 1))
        rows_left = Signal.like(self.tokens)
        beat = Signal(range(p.max_beats_per_row))      # beat of the current input row
        token = Signal(range(p.max_tokens))            # the current input row
        reads_left = Signal.like(self.num_experts)     # pass 2: counters still to read
        read_expert = Signal(range(p.max_experts))
        offsets_written = Signal.like(self.num_experts)

        banks = []
        for lane in range(p.lanes):
            bank = CounterBank(p.max_beats_per_row, p.count_width)
            m.submodules[f"bank{lane}"] = bank
            banks.append(bank)
        m.submodules.ctl = pipe = PipelineControl(CounterBank.latency)
        m.submodules.prefix = prefix = PrefixSum(p.count_width, p.slot_width)
        m.submodules.offsets = offsets = memory.Memory(shape=p.slot_width,
                                                       depth=p.max_experts, init=[])
        offset_write = offsets.write_port()
        offset_read = offsets.read_port(domain="sync")
        m.submodules.part_skid = part_skid = SkidBuffer(p.part_sizes_layout())
        m.submodules.write_skid = write_skid = SkidBuffer(data.StructLayout({
            "beat": p.write_layout(), "write": 1}))

        # ---- the input beat: which lanes are routed, which are negative ---------------------
        gates = self.rows.payload.gates
        routed, negative = [], []
        for lane in range(p.lanes):
            expert = Cat(Const(lane, lanes_log2), beat)
            in_range = expert < num_experts
            is_routed, is_negative = gate_class(gates[lane], fmt)
            routed.append(in_range & is_routed)
            negative.append(in_range & is_negative)
        routed = Cat(*routed)
        row_take = self.rows.valid & self.rows.ready
        last_beat = beat == beats_per_row - 1
        with m.If(row_take):
            m.d.sync += beat.eq(Mux(last_beat, 0, beat + 1))
            with m.If(last_beat):
                m.d.sync += [rows_left.eq(rows_left - 1), token.eq(token + 1)]
        faults.append(row_take & Cat(*negative).any())

        # ---- pass 3's beat register: its routed lanes leave one per cycle -------------------
        cur_loaded = Signal()
        cur_pending = Signal(p.lanes)
        cur_gates = Signal(data.ArrayLayout(fmt.width, p.lanes))
        cur_beat = Signal.like(beat)
        cur_token = Signal.like(token)
        # The lowest pending lane (lane 0 when none is pending: the beat leaves as a bubble).
        cur_lane = Const(0, range(p.lanes))
        for lane in reversed(range(p.lanes)):
            cur_lane = Mux(cur_pending[lane], lane, cur_lane)
        lane_sel = Signal(range(p.lanes))
        m.d.comb += lane_sel.eq(cur_lane)
        single = (cur_pending & (cur_pending - 1)) == 0
        emit = cur_loaded & pipe.en
        cur_free = ~cur_loaded | (emit & single)
        with m.If(emit):
            m.d.sync += cur_pending.eq(cur_pending & (cur_pending - 1))
        with m.If(cur_free):
            m.d.sync += cur_loaded.eq(0)
            with m.If((phase == PLACE) & row_take):
                m.d.sync += [cur_loaded.eq(1), cur_pending.eq(routed), cur_gates.eq(gates),
                             cur_beat.eq(beat), cur_token.eq(token)]

        # ---- the counter bank stage, shared by the three passes -----------------------------
        in_count, in_offsets, in_place = (running & (phase == COUNT),
                                          running & (phase == OFFSETS),
                                          running & (phase == PLACE))
        m.d.comb += [
            pipe.i_valid.eq(Mux(in_count, self.rows.valid,
                                Mux(in_offsets, reads_left != 0, in_place & cur_loaded))),
            self.rows.ready.eq((in_count & pipe.en) |
                               (in_place & (rows_left != 0) & cur_free)),
        ]
        place_real = cur_pending.any()
        for lane, bank in enumerate(banks):
            m.d.comb += [
                bank.en.eq(pipe.en),
                bank.valid.eq(pipe.i_valid & (~in_place | (lane_sel == lane))),
                bank.index.eq(Mux(in_count, beat,
                                  Mux(in_offsets, read_expert >> lanes_log2, cur_beat))),
                bank.increment.eq(Mux(in_count, routed[lane],
                                      in_place & place_real & (lane_sel == lane))),
            ]
        m.d.comb += [
            offset_read.addr.eq(Cat(lane_sel, cur_beat)),
            offset_read.en.eq(pipe.en),
        ]
        with m.If(in_offsets & pipe.en & (reads_left != 0)):
            m.d.sync += [reads_left.eq(reads_left - 1), read_expert.eq(read_expert + 1)]

        stage_phase = Signal.like(phase)
        stage_lane = Signal(range(p.lanes))
        stage_real = Signal()
        stage_token = Signal.like(token)
        stage_gate = Signal(fmt.width)
        with m.If(pipe.en):
            m.d.sync += [
                stage_phase.eq(phase),
                stage_lane.eq(Mux(in_offsets, read_expert[:lanes_log2], lane_sel)),
                stage_real.eq(place_real),
                stage_token.eq(cur_token),
                stage_gate.eq(cur_gates[lane_sel]),
            ]
        value = Signal(p.count_width)
        m.d.comb += value.eq(Cat(*(bank.value for bank in banks))
                             .word_select(stage_lane, p.count_width))
        m.d.comb += pipe.o_ready.eq(Mux(stage_phase == OFFSETS, prefix.i.ready,
                                        Mux(stage_phase == PLACE, write_skid.i.ready, 1)))

        # ---- pass 2: counts -> prefix sum -> part_sizes and the offset memory ----------------
        m.d.comb += [
            prefix.i.valid.eq(pipe.o_valid & (stage_phase == OFFSETS)),
            prefix.i.payload.value.eq(value),
            part_skid.i.valid.eq(prefix.o.valid),
            prefix.o.ready.eq(part_skid.i.ready),
            part_skid.i.payload.part_size.eq(prefix.o.payload.value),
            part_skid.i.payload.offset.eq(prefix.o.payload.exclusive),
            offset_write.addr.eq(offsets_written),
            offset_write.data.eq(prefix.o.payload.exclusive),
            offset_write.en.eq(prefix.o.valid & part_skid.i.ready),
            self.nonzeros.eq(prefix.total),
        ]
        wiring.connect(m, part_skid.o, wiring.flipped(self.part_sizes))
        with m.If(offset_write.en):
            m.d.sync += offsets_written.eq(offsets_written + 1)

        # ---- pass 3: slot = offset + rank -> write ----------------------------------------------
        slot = Signal(p.slot_width + 1)
        m.d.comb += slot.eq(offset_read.data + value)
        outside = stage_real & (slot >= prefix.total)
        m.d.comb += [
            write_skid.i.valid.eq(pipe.o_valid & (stage_phase == PLACE)),
            write_skid.i.payload.write.eq(stage_real & ~outside),
            write_skid.i.payload.beat.addr.eq(slot),
            write_skid.i.payload.beat.token.eq(stage_token),
            write_skid.i.payload.beat.gate.eq(stage_gate),
            self.write.valid.eq(write_skid.o.valid & write_skid.o.payload.write),
            self.write.payload.eq(write_skid.o.payload.beat),
            write_skid.o.ready.eq(self.write.ready | ~write_skid.o.payload.write),
        ]
        faults.append(write_skid.i.valid & write_skid.i.ready & outside)
        m.d.comb += ctl.fault.eq(Cat(*faults).any())

        # ---- control ----------------------------------------------------------------------------
        offsets_done = in_offsets & (offsets_written == num_experts)
        m.d.comb += [
            ctl.finished.eq(in_place & (rows_left == 0) & ~cur_loaded & ~pipe.busy &
                            ~write_skid.o.valid & ~part_skid.o.valid),
            prefix.clear.eq(ctl.accept),
            *(bank.clear.eq(ctl.accept | offsets_done) for bank in banks),
        ]
        with m.If(in_count & row_take & last_beat & (rows_left == 1)):
            m.d.sync += phase.eq(OFFSETS)
        with m.If(offsets_done):
            m.d.sync += [phase.eq(PLACE), rows_left.eq(tokens), beat.eq(0), token.eq(0)]
        with m.If(ctl.accept):
            m.d.sync += [
                beats_per_row.eq((self.num_experts + (p.lanes - 1)) >> lanes_log2),
                rows_left.eq(self.tokens), beat.eq(0), token.eq(0),
                reads_left.eq(self.num_experts), read_expert.eq(0), offsets_written.eq(0),
                phase.eq(Mux(self.tokens == 0, OFFSETS, COUNT)),
            ]
        return m


def place_cycles(routed_per_beat):
    """Pass 3's stall-free cycles: ``sum(max(1, n))`` over the routed gates ``n`` of every beat
    of the matrix (a beat with none still takes its cycle)."""
    return sum(max(1, int(n)) for n in routed_per_beat)
