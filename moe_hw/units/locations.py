"""The location generator (tutel routing, SPEC 1.2): the slot of every (k, i) pair within its
expert, from a bank of per-expert counters, one pair per cycle.

For every pair, in the order the indices arrive (k-major for top-k > 1)::

    if 0 <= index < E:  location = counter[index]; counter[index] += 1
    else:               location = -1                  (not routed; no counter moves)

then, after the last pair, ``counter[0..E-1]`` (the per-expert totals, ``expert_counts``).

Streams and ports (payload fields are listed least significant first):

``index`` (in)
    One beat per (k, i) pair: ``index`` (two's complement, ``index_width`` bits; any bit
    pattern is safe).
``location`` (out)
    One beat per pair, in input order: ``location`` (two's complement: the counter value, or
    -1 for an out-of-range index).
``counts`` (out)
    The read-out phase: after the last pair, E beats, expert 0 first: ``count`` (unsigned), the
    number of pairs routed to the expert. Its beats follow the last ``location`` beat through
    the same pipeline; the two streams are independent (a stall on one does not reorder the
    other).
``start``, ``pairs``, ``num_experts``, ``capacity`` (in)
    Run-time problem size, sampled when ``start`` is high while idle (the shared
    :class:`~moe_hw.blocks.run_control.RunControl`). ``pairs`` is the number of (k, i) pairs
    (k*S).
``busy``, ``done``, ``dropped``, ``error`` (out)
    ``done`` rises when the last beat of both output streams has left and stays high until
    the next start. ``dropped`` counts the routed pairs whose location is >= ``capacity``
    (those dispatch's mask will drop; out-of-range pairs, location -1, are not in it).
    ``error`` is set when a run-time size exceeds its generation-time maximum; such a run
    reads and writes nothing and is done ``EMPTY_CYCLES`` (2) cycles after start.

A run with no pairs and no experts finishes at once (``done`` ``EMPTY_CYCLES`` (2) cycles
after start). Every other run, stall-free, takes exactly ``pairs + num_experts + overhead``
cycles from the start cycle to the cycle ``done`` is first seen
(:meth:`LocationsParams.stall_free_cycles`): one pair (and then one read-out) enters the
counter bank every cycle, and a stall anywhere costs only the cycles it lasts.

``overhead = START_LATENCY + 2 + B``: 7 with the counters in LUT RAM, 8 in block RAM, where
B is the counter bank's stages (:attr:`LocationsParams.overhead`).

Pipeline (one global stall, :class:`~moe_hw.stream.PipelineControl`): the pair's index is
range-checked and enters the :class:`~moe_hw.blocks.counter_bank.CounterBank` (an increment
for a routed pair, a plain read for a read-out; for a read-out the index is the expert
number); B cycles later the counter's value becomes the location (or the count); a skid
buffer on each output stream cuts the ready paths. The bank keeps its counters (``counters``)
in LUT RAM, 3 stages, or in block RAM (``bram`` its target), 4 stages; ``auto``, the default,
takes LUT RAM up to 32 experts and block RAM past them (the default 64), where a LUT-RAM
bank's read is a choice among its cells (into the live flags' lookup, the path of most
placements at 64 experts and of every one at 128 and 256). The issue decision
(pairs or read-outs, the last of each) comes from flags registered one take ahead, and
``dropped`` is counted from the location skid buffer's output register.
"""

from dataclasses import dataclass

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from ..blocks.block_memory import bram_param
from ..blocks.counter_bank import CounterBank, CounterBankParams, counters_param
from ..blocks.run_control import EMPTY_CYCLES, START_LATENCY, RunControl, run_ports
from ..params import UnitParams, param, resolve_params
from ..stream import PipelineControl, SkidBuffer, delay

__all__ = ["LocationsParams", "LocationsUnit"]


@dataclass(frozen=True)
class LocationsParams(CounterBankParams, UnitParams):
    """Generation-time parameters of :class:`LocationsUnit`."""

    max_pairs: int = param(4096, minimum=1, maximum=1 << 30, doc="(k, i) pairs per run (k*S)")
    max_experts: int = param(64, minimum=1, maximum=1 << 30)
    max_capacity: int = param(4096, minimum=1, maximum=1 << 30)
    index_width: int = param(32, minimum=2, maximum=64)
    counters: str = counters_param()
    bram: str = bram_param()

    def check(self):
        self.check_signed_fits("index_width", "max_experts")

    @property
    def bank_counters(self):
        """The counter bank's counters: one per expert."""
        return self.max_experts

    @property
    def overhead(self):
        """Stall-free cycles beyond one per pair and one per expert: the run control's start
        and decide cycles, the counter bank's stages, the output skid buffer and the done
        register (7 with the LUT-RAM bank, 8 with the block-RAM one)."""
        return START_LATENCY + 2 + self.bank_latency

    @property
    def inside(self):
        """The most pairs inside the unit (taken, their location not yet out) while the
        location stream's ``ready`` is always high: the counter bank's stages and the output
        register."""
        return self.bank_latency + 1

    def stall_free_cycles(self, pairs, num_experts):
        """Cycles from the start cycle to the cycle ``done`` is first seen, without stalls
        (exact): ``pairs + num_experts + overhead``, or ``EMPTY_CYCLES`` (2) for an empty run
        (no pairs, no experts) and for a run whose sizes exceed the maxima."""
        if pairs + num_experts == 0 or pairs > self.max_pairs or \
                num_experts > self.max_experts:
            return EMPTY_CYCLES
        return pairs + num_experts + self.overhead

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order."""
        return {"pairs": self.max_pairs, "num_experts": self.max_experts,
                "capacity": self.max_capacity}

    @property
    def count_width(self):
        """Bits of an expert's counter: it counts up to ``max_pairs``."""
        return bits_for(self.max_pairs)

    @property
    def location_width(self):
        """Bits of a signed location: -1 .. max_pairs - 1."""
        return bits_for(self.max_pairs - 1) + 1

    def index_layout(self):
        return data.StructLayout({"index": signed(self.index_width)})

    def location_layout(self):
        return data.StructLayout({"location": signed(self.location_width)})

    def count_layout(self):
        return data.StructLayout({"count": self.count_width})


class LocationsUnit(wiring.Component):
    """Per-expert counters that give every (k, i) pair its location, then the per-expert
    totals. See the module docstring for the protocol."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(LocationsParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "index": In(stream.Signature(p.index_layout())),
            "location": Out(stream.Signature(p.location_layout())),
            "counts": Out(stream.Signature(p.count_layout())),
            **run_ports(p.sizes),
            "dropped": Out(range(p.max_pairs + 1)),
        })

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order (the AXI wrapper's registers)."""
        return self.params.sizes

    @property
    def overhead(self):
        return self.params.overhead

    def stall_free_cycles(self, pairs, num_experts):
        """:meth:`LocationsParams.stall_free_cycles`."""
        return self.params.stall_free_cycles(pairs, num_experts)

    def elaborate(self, platform):
        m = Module()
        p = self.params

        # ---- run control: start, held sizes, done / error ---------------------------------
        ctl = m.submodules.control = RunControl(p.sizes)
        ctl.connect(m, self)
        m.d.comb += ctl.empty_also.eq((self.pairs == 0) & (self.num_experts == 0))
        num_experts = ctl.size("num_experts")
        capacity = ctl.size("capacity")

        m.submodules.bank = bank = CounterBank(p.bank_counters, p.count_width,
                                               memory=p.counter_memory, target=p.bram)
        m.submodules.ctl = pipe = PipelineControl(bank.latency)
        m.submodules.location_skid = location_skid = SkidBuffer(p.location_layout())
        m.submodules.count_skid = count_skid = SkidBuffer(p.count_layout())

        # ---- issue: a pair, or after the last pair a read-out ---------------------------------
        # The phase flags and the "this is the last one" flags are registers, computed one
        # take ahead, so that the issue decision costs a flip-flop's delay.
        pairs_phase = Signal()             # issuing pairs
        readout_phase = Signal()           # issuing read-outs
        pairs_left = Signal.like(self.pairs)
        last_pair = Signal()               # pairs_left == 1
        readout_index = Signal(range(p.max_experts))
        readouts_left = Signal.like(self.num_experts)
        last_readout = Signal()            # readouts_left == 1
        has_experts = Signal()             # num_experts != 0
        issue_valid = Mux(pairs_phase, self.index.valid, readout_phase)
        take = issue_valid & pipe.en
        m.d.comb += self.index.ready.eq(pairs_phase & pipe.en)
        with m.If(take & pairs_phase):
            m.d.sync += [pairs_left.eq(pairs_left - 1), last_pair.eq(pairs_left == 2)]
            with m.If(last_pair):
                m.d.sync += [pairs_phase.eq(0), readout_phase.eq(has_experts)]
        with m.If(take & ~pairs_phase):
            m.d.sync += [readout_index.eq(readout_index + 1),
                         readouts_left.eq(readouts_left - 1),
                         last_readout.eq(readouts_left == 2)]
            with m.If(last_readout):
                m.d.sync += readout_phase.eq(0)

        # ---- the request: the bank registers it, the rest of it follows in step -----------
        index = self.index.payload.index
        ew = len(num_experts)
        # 0 <= index < num_experts, as a zero test of the high bits and a narrow compare.
        in_range = (index.as_unsigned()[ew:] == 0) & (index.as_unsigned()[:ew] < num_experts)
        m.d.comb += [
            pipe.i_valid.eq(issue_valid),
            bank.en.eq(pipe.en),
            bank.valid.eq(issue_valid),
            # An out-of-range index may alias a counter here; it only reads it.
            bank.index.eq(Mux(pairs_phase, index.as_unsigned(), readout_index)),
            bank.increment.eq(pairs_phase & in_range),
        ]

        # ---- the counter's value: a location or a count --------------------------------------
        stage_readout = delay(m, ~pairs_phase, bank.latency, pipe.en, name="stage_readout")
        stage_in_range = delay(m, in_range, bank.latency, pipe.en, name="stage_in_range")
        location = Mux(stage_in_range, bank.value, -1)
        m.d.comb += [
            pipe.o_ready.eq(Mux(stage_readout, count_skid.i.ready, location_skid.i.ready)),
            location_skid.i.valid.eq(pipe.o_valid & ~stage_readout),
            location_skid.i.payload.location.eq(location),
            count_skid.i.valid.eq(pipe.o_valid & stage_readout),
            count_skid.i.payload.count.eq(bank.value),
        ]
        wiring.connect(m, location_skid.o, wiring.flipped(self.location))
        wiring.connect(m, count_skid.o, wiring.flipped(self.counts))
        # Counted as the location leaves (from the skid buffer's register): it is final before
        # ``done``, which waits for the skid buffer to empty.
        leaving = self.location.payload.location
        with m.If(self.location.valid & self.location.ready & (leaving >= 0) &
                  (leaving.as_unsigned() >= capacity)):
            m.d.sync += self.dropped.eq(self.dropped + 1)

        # ---- control ----------------------------------------------------------------------------
        m.d.comb += [
            ctl.finished.eq(ctl.running & ~pairs_phase & ~readout_phase &
                            ~pipe.busy & ~location_skid.o.valid & ~count_skid.o.valid),
            # No request is in flight in the decide cycle; the first enters after ``begin``.
            bank.clear.eq(ctl.decide),
        ]
        with m.If(ctl.accept):
            m.d.sync += [pairs_left.eq(self.pairs), last_pair.eq(self.pairs == 1),
                         has_experts.eq(self.num_experts != 0),
                         readouts_left.eq(self.num_experts),
                         last_readout.eq(self.num_experts == 1),
                         readout_index.eq(0), self.dropped.eq(0),
                         pairs_phase.eq(0), readout_phase.eq(0)]
        with m.If(ctl.begin):
            m.d.sync += [pairs_phase.eq(pairs_left != 0),
                         readout_phase.eq((pairs_left == 0) & has_experts)]
        return m
