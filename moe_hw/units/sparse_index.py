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

Pipeline: the rows pass two skid buffers, where each gate is classified (routed, negative) in
two steps, and a beat register from which every beat of passes 1 and 3 is issued. The requests
(bank row, per-lane increments, lane) pass a skid buffer into a
:class:`~moe_hw.stream.CreditPipeline` that never stalls: the counter banks (``counters``:
three stages in LUT RAM; four in block RAM, ``bram`` its target, by default past 32 counters a
bank) and the offset memory in step with them (read in banks,
:class:`~moe_hw.blocks.banked_memory.BankedMemory`, or with block-RAM banks a
:class:`~moe_hw.blocks.block_memory.BlockMemory`), a lane-select stage that registers the
lane's count and its offset, a slot stage that registers ``offset + rank`` and whether it
reaches ``nonzeros`` (from ``nonzeros - offset``, computed in the stage before), then the
credit pipeline's queue, from which the prefix sum and the ``write`` port take the results. The
row's last beat and the phase changes come from flags registered one take ahead.

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
    run reads and writes nothing and is done ``EMPTY_CYCLES`` (2) cycles after start); or when a
    gate of an
    in-range lane is negative, i.e. < 0 as the golden model rejects it: sign bit set, not
    +-0.0 and not a NaN (a NaN with the sign bit set is routed like any NaN). A negative gate
    does not stop the run: it is treated as routed (nonzero), every beat of both passes is
    still taken, so no source hangs, and the outputs are those of the nonzero rule; the host
    must discard them. ``error`` is also set, and the write suppressed, if a slot would fall
    outside ``[0, nonzeros)`` (the second copy of the matrix has a routed gate the first did
    not have; the unit keeps no copy to compare the two in full).

A run with E = 0 finishes at once (``done`` ``EMPTY_CYCLES`` (2) cycles after start). Otherwise,
stall-free, a
run takes exactly (:meth:`SparseIndexParams.stall_free_cycles`)::

    S*B + E + place_cycles + passes_overhead      (S >= 1)
    E + offsets_overhead                          (S == 0)

    B = ceil(E / lanes);  place_cycles = sum over the S*B beats of max(1, routed gates in it)

cycles from the start cycle to the cycle ``done`` is first seen: pass 1 at one beat per cycle,
pass 2 at one expert per cycle, pass 3 at one beat or one routed gate per cycle, whichever is
more. With one beat per row (``lanes >= E``) and k routed gates per row that is
``S + E + k*S + passes_overhead``: pass 3 is bound by the one slot write per cycle of the
``write`` port, and no pass can start before the previous one has seen the whole matrix (an
offset needs every count before it). Empty experts cost only their ``part_sizes`` beat. A
stall anywhere costs only the cycles it lasts.
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.params import FORMAT_NAMES, FloatDatapathParams
from ..blocks.banked_memory import BankedMemory
from ..blocks.block_memory import BlockMemory, bram_param
from ..blocks.counter_bank import CounterBank, CounterBankParams, counters_param
from ..blocks.prefix_sum import PrefixSum
from ..blocks.run_control import EMPTY_CYCLES, START_LATENCY, RunControl, run_ports
from ..formats import float_format
from ..params import LANES, UnitParams, param, resolve_params
from ..blocks.row_beats import row_beats
from ..stream import CreditPipeline, SkidBuffer, delay

__all__ = ["SparseIndexParams", "SparseIndexUnit", "gate_class", "gate_class_of_tests",
           "gate_tests", "gate_tests_layout", "place_cycles"]

COUNT, OFFSETS, PLACE = 0, 1, 2       # the passes


@dataclass(frozen=True)
class SparseIndexParams(FloatDatapathParams, CounterBankParams, UnitParams):
    """Generation-time parameters of :class:`SparseIndexUnit`."""

    format: str = param("fp32", choices=FORMAT_NAMES)
    lanes: int = param(4, choices=LANES, doc="gates per beat")
    max_tokens: int = param(4096, minimum=1, maximum=1 << 24)
    max_experts: int = param(64, minimum=1, maximum=1 << 16)
    counters: str = counters_param()
    bram: str = bram_param()

    @property
    def bank_counters(self):
        """A lane's counter bank's counters, ``ceil(max_experts / lanes)``; its memory
        (``counter_memory``) is the offset table's too, and its stages L
        (``bank_latency``) 3 in LUT RAM, 4 in block RAM."""
        return self.max_beats_per_row

    @property
    def passes_overhead(self):
        """Stall-free cycles beyond the passes' own for S >= 1 (28 with the counters in LUT
        RAM, 30 in block RAM): the run control's start and decide cycles and its second setup
        cycle (3); the rows' two input skid buffers, where the gates are classified (2; pass
        3's first beats wait in them during pass 2); pass 1's beat register (1); between pass
        2 and pass 3, the request skid buffer, the counter banks' L stages, the lane-select
        and slot stages, the credit pipeline's queue write and output register, the prefix
        sum's register and the offset memory's write (7 + L: pass 3 starts once every offset
        is written); pass 3's beat register (1); and after the last routed gate, the request
        skid buffer, the banks' L stages, the lane-select and slot stages, the queue write and
        output register, the credit pipeline's busy register, the drained register and the
        done register (8 + L). Pass 2 follows pass 1 without a gap (the banks forward in
        order)."""
        return START_LATENCY + 20 + 2 * self.bank_latency

    @property
    def offsets_overhead(self):
        """The same for S == 0 (no rows, so no pass 1 or 3; 15, or 16 with the counters in
        block RAM): the start, decide and second setup cycles, the request skid buffer, the
        counter banks' L stages, the lane-select and slot stages, the queue write and output
        register, the prefix sum's register, the part_sizes skid buffer, the drained register
        and the done register."""
        return START_LATENCY + 10 + self.bank_latency

    def stall_free_cycles(self, tokens, num_experts, place_cycles):
        """Cycles from the start cycle to the cycle ``done`` is first seen, without stalls
        (exact; ``EMPTY_CYCLES`` (2) when E = 0 or a size exceeds its maximum). ``place_cycles``
        is pass 3's:
        the sum over the beats of ``max(1, routed gates in the beat)`` (see
        :func:`place_cycles`)."""
        if num_experts == 0 or tokens > self.max_tokens or num_experts > self.max_experts:
            return EMPTY_CYCLES
        if tokens == 0:
            return num_experts + self.offsets_overhead
        return (tokens * -(-num_experts // self.lanes) + num_experts + place_cycles +
                self.passes_overhead)

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


def gate_tests_layout(fmt):
    """The tests :func:`gate_tests` makes of a gate: the mantissa's nonzero tests, one per
    piece of at most 16 bits (least significant first), and the exponent's nonzero and
    all-ones tests."""
    fmt = float_format(fmt)
    return data.StructLayout({"mantissa_nonzero": -(-fmt.mant_bits // 16),
                              "exponent_nonzero": 1, "exponent_ones": 1})


def gate_tests(bits, fmt):
    """The first half of :func:`gate_class`: tests of at most 16 bits each (two LUT4 levels),
    packed as :func:`gate_tests_layout`."""
    fmt = float_format(fmt)
    mantissa = bits[:fmt.mant_bits]
    exponent = bits[fmt.mant_bits:fmt.width - 1]
    return Cat(*(mantissa[low:low + 16].any() for low in range(0, fmt.mant_bits, 16)),
               exponent.any(), exponent.all())


def gate_class_of_tests(tests, sign):
    """The second half of :func:`gate_class`: ``(routed, negative)`` from a gate's
    :func:`gate_tests` (a view of :func:`gate_tests_layout`) and its sign bit, one LUT level
    each for fp32."""
    mantissa_nonzero = tests.mantissa_nonzero.any()
    routed = mantissa_nonzero | tests.exponent_nonzero
    nan = tests.exponent_ones & mantissa_nonzero
    return routed, sign & routed & ~nan


def gate_class(bits, fmt):
    """``(routed, negative)`` of a gate's bit pattern: routed when nonzero (NaN included,
    +-0.0 not); negative when < 0 (sign set, not zero, not NaN)."""
    fmt = float_format(fmt)
    tests = data.View(gate_tests_layout(fmt), gate_tests(bits, fmt))
    return gate_class_of_tests(tests, bits[fmt.width - 1])


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

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order (the AXI wrapper's registers)."""
        return self.params.sizes

    def elaborate(self, platform):
        m = Module()
        p = self.params
        fmt = p.fmt
        lanes_log2 = ceil_log2(p.lanes)
        all_lanes = (1 << p.lanes) - 1

        # ---- run control: start, held sizes, done / error ---------------------------------
        # ``error`` also reports the unit's own faults (a negative gate, or a slot outside
        # [0, nonzeros)), through the run control's ``fault`` input. Two setup cycles: the
        # row's beat counter takes its per-run constants from registers loaded in the decide
        # cycle.
        ctl = m.submodules.control = RunControl(p.sizes, empty_when_zero=("num_experts",),
                                                setup=2)
        ctl.connect(m, self)
        tokens = ctl.size("tokens")

        # The passes as registered flags (each implies ``running``).
        count_phase = Signal()
        offsets_phase = Signal()
        place_phase = Signal()
        tokens_zero = Signal()
        tokens_one = Signal()

        banks = []
        for lane in range(p.lanes):
            # (Block-RAM banks keep their stage registers apart: shared, the one set's nets
            # ran between the banks' blocks, the path of four placements of eight at 1024
            # experts.)
            bank = CounterBank(p.bank_counters, p.count_width, memory=p.counter_memory,
                               target=p.bram, apart=p.counter_memory == "block")
            m.submodules[f"bank{lane}"] = bank
            banks.append(bank)
        m.submodules.prefix = prefix = PrefixSum(p.count_width, p.slot_width)
        # The offsets are read in banks of one LUT-RAM row (16 words) with the address
        # registered per bank and the bank's word selected in a register of its own: one
        # memory read behind one address register was a path of its own (the address's
        # fan-out to every cell, the cell, a 4:1 multiplexer).
        # (One select level, whatever the banks: the read keeps step with the counter bank.)
        # With the counters in block RAM, the offsets are too (a BlockMemory, read two
        # cycles after its address, which passes two registers first to keep step).
        if p.counter_memory == "block":
            offsets = BlockMemory(p.slot_width, p.max_experts, target=p.bram)
            offsets_read, offsets_write = offsets.read_data[0], offsets.write_data[0]
        else:
            offsets = BankedMemory(p.slot_width, p.max_experts, bank_depth=16,
                                   select_fanin=max(2, p.max_experts))
            offsets_read, offsets_write = offsets.read_data, offsets.write_data
        m.submodules.offsets = offsets
        # The requests for the banks pass a skid buffer: the issue logic (the row stream's
        # ready, pass 3's beat register) sees its registered ready, not the pipeline's stall.
        m.submodules.issue = issue = SkidBuffer(data.StructLayout({
            "index": range(p.max_beats_per_row), "increment": p.lanes,
            "lane": range(p.lanes), "offsets": 1, "place": 1, "real": 1,
            "token": range(p.max_tokens), "gate": fmt.width}))
        issue_ready = issue.i.ready
        # The rows enter through two skid buffers, and each gate is classified on the way:
        # its nonzero test (a 31-input OR for fp32, and the NaN test beside it) would take
        # three LUT levels and the skid's multiplexer in one cycle, so the tests of at most 16
        # bits are registered in the first buffer and combined into the routed and negative
        # flags on the way into the second. The beat logic below starts from registers.
        lane_gates = data.ArrayLayout(fmt.width, p.lanes)
        m.submodules.rows_in = rows_in = SkidBuffer(data.StructLayout({
            "gates": lane_gates, "tests": data.ArrayLayout(gate_tests_layout(fmt), p.lanes)}))
        m.submodules.rows_classified = rows_classified = SkidBuffer(data.StructLayout({
            "gates": lane_gates, "routed": p.lanes, "negative": p.lanes}))
        tested = rows_in.o.payload
        classes = [gate_class_of_tests(tested.tests[lane], tested.gates[lane][fmt.width - 1])
                   for lane in range(p.lanes)]
        m.d.comb += [
            # Rows enter only during a run: nothing is left in the buffers after one.
            rows_in.i.valid.eq(self.rows.valid & ctl.running),
            self.rows.ready.eq(rows_in.i.ready & ctl.running),
            rows_in.i.payload.gates.eq(self.rows.payload.gates),
            *(rows_in.i.payload.tests[lane].eq(gate_tests(self.rows.payload.gates[lane], fmt))
              for lane in range(p.lanes)),
            rows_classified.i.valid.eq(rows_in.o.valid),
            rows_in.o.ready.eq(rows_classified.i.ready),
            rows_classified.i.payload.gates.eq(tested.gates),
            rows_classified.i.payload.routed.eq(Cat(*(routed for routed, _ in classes))),
            rows_classified.i.payload.negative.eq(Cat(*(negative for _, negative in classes))),
        ]
        m.submodules.part_skid = part_skid = SkidBuffer(p.part_sizes_layout())

        # ---- the input rows: beat and row counters, flags registered one take ahead ----------
        beats_per_row = Signal(range(p.max_beats_per_row + 1))
        last_mask = Signal(p.lanes)                    # the lanes below E in a row's last beat
        rows_left = Signal.like(self.tokens)
        rows_pending = Signal()                        # rows_left != 0
        rows_pending_next = Signal()                   # ... at the next edge
        m.d.comb += rows_pending_next.eq(rows_pending)
        m.d.sync += rows_pending.eq(rows_pending_next)
        last_row = Signal()                            # rows_left == 1
        token = Signal(range(p.max_tokens))            # the current input row
        rows = rows_classified.o
        row_take = rows.valid & rows.ready
        row_start = Signal()
        beat, last_beat = row_beats(m, beats_per_row, start=row_start,
                                    step=row_take, name="row")
        row_end = row_take & last_beat
        with m.If(row_end):
            m.d.sync += [rows_left.eq(rows_left - 1), last_row.eq(rows_left == 2),
                         token.eq(token + 1)]
            with m.If(last_row):
                m.d.comb += rows_pending_next.eq(0)

        gates = rows.payload.gates
        lanes_in_range = Mux(last_beat, last_mask, all_lanes)
        routed = rows.payload.routed & lanes_in_range
        negative = rows.payload.negative & lanes_in_range
        # A negative gate in a taken beat: the flag and the take are registered, the fault
        # is raised the cycle after (the run is still running then).
        negative_seen = Signal()
        took = Signal()
        m.d.sync += [negative_seen.eq(negative.any()), took.eq(row_take)]
        faults = [took & negative_seen]

        # ---- the beat register: every beat of passes 1 and 3 is issued from it ---------------
        # In pass 1 a beat leaves in one request that increments all its routed lanes; in
        # pass 3 its routed lanes leave one per cycle. The rows' ready is then a function of
        # three registers (the register's state, each flag with ``rows_pending`` in it), in
        # front of the wide clock enables of the rows' skid buffer and of this register.
        cur_loaded = Signal()
        cur_pending = Signal(p.lanes)                  # the routed lanes not yet issued
        cur_gates = Signal(data.ArrayLayout(fmt.width, p.lanes))
        cur_beat = Signal.like(beat)
        cur_token = Signal.like(token)
        # The lowest pending lane, one-hot and as a number (lane 0 when none is pending: the
        # beat leaves as a bubble), and whether no other lane is pending: registered with
        # ``cur_pending`` (the encoder runs on the lanes about to be pending), so that the
        # gate's lane multiplexer and the register's free flag start from registers.
        cur_lowest = Signal(p.lanes)
        cur_lane = Signal(range(p.lanes))
        cur_single = Signal(init=1)

        def lowest_of(pending):
            return Cat(*(pending[lane] & ~pending[:lane].any() if lane else pending[0]
                         for lane in range(p.lanes)))

        def single_of(pending):
            return ~(pending & ~lowest_of(pending)).any()

        def set_pending(pending):
            lane_of = Const(0, range(p.lanes))
            for lane in reversed(range(p.lanes)):
                lane_of = Mux(pending[lane], lane, lane_of)
            return [cur_pending.eq(pending), cur_lowest.eq(lowest_of(pending)),
                    cur_lane.eq(lane_of), cur_single.eq(single_of(pending))]

        def set_counted(pending):
            # Pass 1: the whole beat in one request.
            return [cur_pending.eq(pending), cur_lowest.eq(pending), cur_single.eq(1)]

        emit = cur_loaded & issue_ready
        cur_free = ~cur_loaded | (emit & cur_single)
        # The lanes left after an emit: those of ``cur_pending`` but its lowest, computed
        # from ``cur_pending`` alone (``cur_lowest`` is its lowest whenever this matters: in
        # pass 3 with more than one lane pending), so that each bit of the next lowest lane,
        # lane number and "single" is a function of ``lanes`` register bits only.
        left_after = cur_pending & ~lowest_of(cur_pending)
        loads = cur_free & row_take
        # The rows' ready is the same test on copies of the flags: ``cur_empty`` (not
        # loaded) and ``cur_alone`` (loaded, one lane left), registered from the flags' next
        # values, each with the rows' ``rows_pending`` in it. They are other registers than
        # ``cur_loaded`` and ``cur_single``, so the rows' ready is one LUT of three registers
        # of its own, not a LUT after ``cur_free``, the clock enable of the beat register's
        # ~150 bits: each wide enable net is then one LUT from registers (two such nets in a
        # row were the unit's critical path). (With ``rows_pending`` a fourth input of the
        # ready, the rows' skid buffer's flags were three LUTs behind it and the flags, the
        # path of 6 placements of 16; the next-value logic is that of ``rows_pending``.)
        cur_empty = Signal()
        cur_alone = Signal()
        next_loaded = Mux(cur_free, row_take, cur_loaded)
        next_single = Mux(loads, count_phase | single_of(routed),
                          Mux(emit, single_of(left_after), cur_single))
        m.d.sync += [cur_empty.eq(rows_pending_next & ~next_loaded),
                     cur_alone.eq(rows_pending_next & next_loaded & next_single)]
        # A second copy, for the clock enable of the beat's data (each flag the inverse of
        # the first copy's, so that Yosys keeps them apart): ``cur_free`` then drives only
        # the narrow control registers.
        data_loaded = Signal()
        data_busy = Signal(init=1)
        m.d.sync += [data_loaded.eq(next_loaded), data_busy.eq(~(next_loaded & next_single))]
        data_free = ~data_loaded | (issue_ready & ~data_busy)
        with m.If(emit):
            m.d.sync += set_pending(left_after)
        with m.If(data_free):
            # The beat's data load whenever the register is free (a short enable for a wide
            # register); only ``cur_loaded`` and the pending lanes depend on the take.
            m.d.sync += [cur_gates.eq(gates), cur_beat.eq(beat), cur_token.eq(token)]
        with m.If(cur_free):
            m.d.sync += cur_loaded.eq(0)
            with m.If(row_take):
                m.d.sync += cur_loaded.eq(1)
                with m.If(count_phase):
                    m.d.sync += set_counted(routed)
                with m.Else():
                    m.d.sync += set_pending(routed)

        # ---- pass 2's counter read-out ----------------------------------------------------------
        reads_pending = Signal()
        reads_left = Signal.like(self.num_experts)
        last_read = Signal()                           # reads_left == 1
        read_expert = Signal(range(p.max_experts))
        # Pass 1's last beat may still wait in the beat register when pass 2 begins: the
        # read-out issues after it.
        reading = offsets_phase & reads_pending & ~cur_loaded
        with m.If(reading & issue_ready):
            m.d.sync += [read_expert.eq(read_expert + 1), reads_left.eq(reads_left - 1),
                         last_read.eq(reads_left == 2)]
            with m.If(last_read):
                m.d.sync += reads_pending.eq(0)

        # ---- the counter banks, shared by the three passes ------------------------------------
        m.d.comb += [
            issue.i.valid.eq(reading | cur_loaded),
            rows.ready.eq(cur_empty | (issue_ready & cur_alone)),
            issue.i.payload.index.eq(Mux(cur_loaded, cur_beat, read_expert >> lanes_log2)),
            issue.i.payload.increment.eq(Mux(cur_loaded, cur_lowest, 0)),
            issue.i.payload.lane.eq(Mux(cur_loaded, cur_lane, read_expert[:lanes_log2])),
            issue.i.payload.offsets.eq(reading),
            issue.i.payload.place.eq(place_phase),
            issue.i.payload.real.eq(cur_pending.any()),
            issue.i.payload.token.eq(cur_token),
            issue.i.payload.gate.eq(cur_gates[cur_lane]),
        ]
        # The banks and the two stages after them run free (no stall net reaches their
        # registers): a request enters only when the credit pipeline's queue is sure to have
        # room for its result, and the consumers (the prefix sum, the ``write`` port) take the
        # results from the queue.
        result_layout = data.StructLayout({
            "value": p.count_width, "offsets": 1, "place": 1, "write": 1, "outside": 1,
            "beat": p.write_layout()})
        m.submodules.pipe = pipe = CreditPipeline(p.bank_latency + 2, result_layout)
        request = issue.o.payload
        m.d.comb += [pipe.i_valid.eq(issue.o.valid), issue.o.ready.eq(pipe.i_ready)]
        for lane, bank in enumerate(banks):
            m.d.comb += [
                bank.en.eq(1),
                bank.valid.eq(pipe.take),
                bank.index.eq(request.index),
                bank.increment.eq(request.increment[lane]),
            ]
        # The offset memory is read in step with the banks: its word and the count are out
        # in the same cycle.
        offsets_addr = delay(m, Cat(request.lane, request.index),
                             p.bank_latency - offsets.latency, 1, name="offsets_addr",
                             reset_less=True)
        m.d.comb += [offsets.read_addr.eq(offsets_addr), offsets.read_en.eq(1)]

        # The rest of the request follows the banks' stages.
        def follow(value, name):
            return delay(m, value, p.bank_latency, 1, name=name)
        bank_offsets = follow(request.offsets, "bank_offsets")
        bank_place = follow(request.place, "bank_place")
        bank_lane = follow(request.lane, "bank_lane")
        bank_real = follow(request.real, "bank_real")
        bank_token = follow(request.token, "bank_token")
        bank_gate = follow(request.gate, "bank_gate")

        # ---- after the banks: the lane's count and offset, then the slot ----------------------
        value = Signal(p.count_width)
        m.d.comb += value.eq(Cat(*(bank.value for bank in banks))
                             .word_select(bank_lane, p.count_width))
        bank_real_v = delay(m, bank_real, 1, 1, name="v_real")
        v_value = Signal.like(value)
        v_offset = Signal(p.slot_width)
        v_room = Signal(signed(p.slot_width + 2))     # nonzeros - offset: the ranks that fit
        s_slot = Signal(p.slot_width + 1)
        s_outside = Signal()                           # slot >= nonzeros
        m.d.sync += [v_value.eq(value), v_offset.eq(offsets_read),
                     v_room.eq(prefix.total - offsets_read),
                     s_slot.eq(v_offset + v_value),
                     s_outside.eq(bank_real_v & (v_value >= v_room))]
        m.d.comb += [
            pipe.payload.value.eq(delay(m, value, 2, 1, name="s_value", reset_less=True)),
            pipe.payload.offsets.eq(delay(m, bank_offsets, 2, 1,
                                          name="s_offsets", reset_less=True)),
            pipe.payload.place.eq(delay(m, bank_place, 2, 1, name="s_place", reset_less=True)),
            pipe.payload.write.eq(delay(m, bank_real_v, 1, 1, name="s_real") & ~s_outside),
            pipe.payload.outside.eq(s_outside),
            pipe.payload.beat.addr.eq(s_slot),
            pipe.payload.beat.token.eq(delay(m, bank_token, 2, 1, name="s_token", reset_less=True)),
            pipe.payload.beat.gate.eq(delay(m, bank_gate, 2, 1, name="s_gate", reset_less=True)),
        ]
        result = pipe.o.payload
        m.d.comb += pipe.o.ready.eq(Mux(result.offsets, prefix.i.ready,
                                        self.write.ready | ~result.place | ~result.write))

        # ---- pass 2: counts -> prefix sum -> part_sizes and the offset memory ----------------
        offsets_written = Signal.like(self.num_experts)
        offsets_left = Signal.like(self.num_experts)
        last_offset = Signal()                         # offsets_left == 1
        offsets_complete = Signal()                    # every offset is written
        m.d.comb += [
            prefix.i.valid.eq(pipe.o.valid & result.offsets),
            prefix.i.payload.value.eq(result.value),
            part_skid.i.valid.eq(prefix.o.valid),
            prefix.o.ready.eq(part_skid.i.ready),
            part_skid.i.payload.part_size.eq(prefix.o.payload.value),
            part_skid.i.payload.offset.eq(prefix.o.payload.exclusive),
            offsets.write_addr.eq(offsets_written),
            offsets_write.eq(prefix.o.payload.exclusive),
            offsets.write_en.eq(prefix.o.valid & part_skid.i.ready),
            self.nonzeros.eq(prefix.total),
        ]
        wiring.connect(m, part_skid.o, wiring.flipped(self.part_sizes))
        with m.If(offsets.write_en):
            m.d.sync += [offsets_written.eq(offsets_written + 1),
                         offsets_left.eq(offsets_left - 1), last_offset.eq(offsets_left == 2)]
            with m.If(last_offset):
                m.d.sync += offsets_complete.eq(1)

        # ---- pass 3: slot = offset + rank -> write ----------------------------------------------
        m.d.comb += [
            self.write.valid.eq(pipe.o.valid & result.place & result.write),
            self.write.payload.eq(result.beat),
        ]
        faults.append(pipe.o.valid & pipe.o.ready & result.place & result.outside)
        m.d.comb += ctl.fault.eq(Cat(*faults).any())

        # ---- control ----------------------------------------------------------------------------
        offsets_done = offsets_complete                # set only in the offsets phase
        # ``decide | offsets_done`` (the banks' clear, the row number's restart) as a register
        # of its own, loaded a cycle ahead from what sets those two (``offsets_complete`` is
        # a one-cycle pulse after the last offset's write): the wide restart is then a
        # register, not a LUT of two.
        restart = Signal()
        m.d.sync += restart.eq(ctl.accept | (offsets.write_en & last_offset))
        # Pass 3 has drained when no beat is left to issue and every stage and buffer after
        # the issue is empty. Nothing refills them after that, so the test (an AND of half a
        # dozen flags, in front of the run control's done and the phase registers' resets) is
        # registered, and ``finished`` is that register: a one-cycle pulse (it is not set again
        # in the cycle after), done rises a cycle later.
        drained = Signal()
        m.d.sync += drained.eq(place_phase & ~drained & ~rows_pending & ~cur_loaded &
                               ~issue.o.valid & ~pipe.busy & ~part_skid.o.valid)
        m.d.comb += [
            ctl.finished.eq(drained),
            # No request is in flight in the decide cycle, nor when pass 3 begins.
            prefix.clear.eq(ctl.decide),
            *(bank.clear.eq(restart) for bank in banks),
            row_start.eq(ctl.begin | offsets_done | row_end),
        ]
        with m.If(count_phase & row_end & last_row):
            m.d.sync += [count_phase.eq(0), offsets_phase.eq(1)]
        with m.If(offsets_done):
            m.d.sync += [offsets_phase.eq(0), place_phase.eq(1), offsets_complete.eq(0),
                         rows_left.eq(tokens), last_row.eq(tokens_one)]
            m.d.comb += rows_pending_next.eq(~tokens_zero)
        with m.If(ctl.finished):
            m.d.sync += place_phase.eq(0)
        with m.If(restart):
            m.d.sync += token.eq(0)
        with m.If(ctl.begin):
            m.d.sync += [count_phase.eq(~tokens_zero), offsets_phase.eq(tokens_zero)]
            m.d.comb += rows_pending_next.eq(~tokens_zero)
        # The run registers load in the decide cycle (a register), from the held sizes, so
        # that the start handshake does not drive the enable of every run register
        # (``begin`` comes a cycle later: the run control has two setup cycles).
        held_experts = ctl.size("num_experts")
        with m.If(ctl.decide):
            m.d.sync += [
                beats_per_row.eq((held_experts + (p.lanes - 1)) >> lanes_log2),
                last_mask.eq(Cat(*((held_experts - 1)[:lanes_log2] >= lane
                                   for lane in range(p.lanes)))),
                tokens_zero.eq(tokens == 0), tokens_one.eq(tokens == 1),
                rows_left.eq(tokens), last_row.eq(tokens == 1),
                reads_left.eq(held_experts), last_read.eq(held_experts == 1),
                offsets_left.eq(held_experts), last_offset.eq(held_experts == 1),
                reads_pending.eq(1), read_expert.eq(0),
                offsets_written.eq(0), offsets_complete.eq(0),
                count_phase.eq(0), offsets_phase.eq(0), place_phase.eq(0),
            ]
        return m


def place_cycles(routed_per_beat):
    """Pass 3's stall-free cycles: ``sum(max(1, n))`` over the routed gates ``n`` of every beat
    of the matrix (a beat with none still takes its cycle)."""
    return sum(max(1, int(n)) for n in routed_per_beat)
