"""The expand backward unit: ``input_grad_flat[addr(x)] += grad_output[x]`` (SPEC 1.6
backward, OneFlow ``expand``'s gradient), fp32 / fp16 / bf16.

``addr(x) = sum_d x_d * out_stride[d]`` is the forward unit's address (a broadcast or new dim
has stride 0), formed by the same stride address generator (two of its odometers,
:func:`~moe_hw.units.expand.pair_odometer`, planned on the host by
:func:`moe_hw.host.expand.plan_of`). The output gradient
streams in, the input gradient is accumulated on chip and streamed out at the end.

The problem: every output element adds into an input element, and in the common case (a gate
broadcast across H, the innermost dim broadcast) every element of a beat and of many beats in
a row adds into the same one: a read-modify-write through an adder of latency L would stall
L + 3 cycles per beat. The unit removes the stall at two levels:

- within a beat, by the host's choice of *mode* (:func:`golden.expand.backward_mode
  <moe_hw.golden.expand.backward_mode>`), sent on the ``mode`` port. ``reduce`` (innermost
  dim broadcast, its size a multiple of ``lanes``): all lanes of a beat go to one element,
  so a fixed pairwise adder tree sums the beat into one item. ``rows`` (innermost dim kept,
  its size a multiple of ``lanes``): lane j of a beat goes to element ``a + j`` with ``a`` a
  multiple of ``lanes``, so the beat is one item, a row of the accumulator. ``elements``
  (any other stride pattern, where a beat's lanes go to several elements, some perhaps more
  than once): every element is an item, one per cycle, so such a beat takes ``lanes`` cycles.
  ``stream``: ``rows`` where the input is one kept run under at most one broadcast dim (a
  repeat of whole rows, a row broadcast over tokens, no broadcast at all) and a pass over it
  is at least G items: see below;
- across items, by latency interleaving: the accumulator is G = L + 3 banks
  (:func:`golden.expand.expand_backward_banks <moe_hw.golden.expand.expand_backward_banks>`)
  of the whole input gradient, item k adding into bank ``k % G``. A bank's read-modify-write
  (the memory's 2-cycle read, the adder, the write) takes L + 3 cycles, so the next item of
  the same bank (G items, at least G cycles, later) reads its result: one item per cycle,
  any address pattern, no hazard check.

At the end the G banks are summed per element, a pair at a time: ``((+0.0 + (bank_0 +
bank_1)) + (bank_2 + bank_3)) + ..`` (the last pair of an odd G is ``bank_{G-1} + +0.0``).
The even and the odd banks are two memories, so a pair is one read of each, summed by a
pre-adder per lane; the pairs go into the partial on the accumulation's own ``lanes`` adders.
Rows go in groups of W = L + 1, and for each pair in turn the group's rows are read one per
cycle, so that a row's partial goes round the adder and a feedback register in exactly W
cycles (the latency interleaving of :mod:`moe_hw.units.dispatch_backward_gate`); a pass
(one pair over a group) starts only when the output queue has room for the group's W
results, since its reads cannot wait. Each bank word read is cleared behind the read,
so the banks are +0.0 again for the next run (a reset in the middle of a run leaves them
dirty). The summation order is therefore exactly ``golden.expand_backward_hw(grad_output,
input_shape, expand_size, lanes, add_latency)``.

In ``stream`` mode a row is added to once per pass, a pass (G items or more) apart, so every
item adds into bank 0 with no hazard, and the last pass is the last ``rows`` items, in row
order: each of them is its row's last add, whose sum goes straight to the output queue (and
+0.0 back into the bank); there is no drain. An item of the last pass is taken only when the
queue has a slot for its row (the queue holds every row from its take to its delivery, so
stall-free this never waits). The order is then the sequential one of
``golden.expand_backward``. A run in stream mode with fewer items than rows (a plan that is not
a stream of passes) drains as ``rows`` mode does; the output's flags go by position, so any
plan gives exactly ``rows`` beats, the last one last.

Streams and ports (payload fields are listed least significant first):

``plan`` (in)
    The address generator's plan, ``max_rank + 2`` beats taken first in a run
    (:meth:`~moe_hw.units.expand.StrideAddressParams.plan_layout`): each dim's steps (of two
    items), then the start values and carries of the two odometers, which take the items in
    turn (the even items from element 0, the odd ones from one item on; an item is ``lanes``
    elements in the ``reduce``, ``rows`` and ``stream`` modes and one in ``elements`` mode),
    so that each odometer has two cycles per step (:func:`~moe_hw.units.expand.
    pair_odometer`).
``grad_output`` (in)
    The output gradient, flat in C order, ``ceil(output_elements / lanes)`` beats: ``data``
    (``lanes`` elements, lane 0 first; lanes past the end are ignored).
``input_grad`` (out)
    The input gradient, flat in C order, ``ceil(input_elements / lanes)`` beats: ``data``,
    ``enable`` (partial on the last beat) and ``last``.
``start``, ``input_elements``, ``output_elements``, ``mode`` (in)
    Run-time sizes (the forward's names: ``input_elements`` is the input gradient's size) and
    the mode (0 ``elements``, 1 ``reduce``, 2 ``rows``, 3 ``stream``), sampled when
    ``start`` is high while idle (:class:`~moe_hw.blocks.run_control.RunControl`); a size
    above its maximum sets ``error`` and the run does nothing; ``output_elements == 0`` is an
    empty run.
``busy``, ``done``, ``error`` (out)
    ``done`` rises when the last beat has left and stays high until the next start.

Rate: one item per cycle, so one ``grad_output`` beat per cycle in the ``reduce``, ``rows``
and ``stream`` modes and ``1 / lanes`` of a beat per cycle in ``elements`` mode; then the
drain (not in stream mode), ``ceil(G / 2) * W`` cycles per group of W rows (about G / 2 per row
of ``lanes`` input elements). Stall-free, a run takes exactly
:meth:`ExpandBackwardParams.cycles` cycles from the start cycle to the first cycle ``done``
is high::

    (max_rank + 3) + items + ceil(G/2)*W*ceil(rows / W) - (W - 1 - (rows - 1) % W)
                   + F + 3*L + 13

with ``items`` = ``output_elements`` (``elements``) or ``output_elements / lanes``, ``rows =
ceil(input_elements / lanes)``, F = :meth:`ExpandBackwardParams.front` (in ``reduce`` mode
the address tree and the read address register, or the lane tree, whichever is longer:
``max(T + 1, 1 + log2(lanes)*L)``; in the other modes ``T + 1``, with T the address tree,
``ceil(log2(max_rank))``, at least 1: an item that does not use the lane tree does not wait
for it);
the plan beats and its close (the last beat's load flag opens the items), one cycle per item,
the drain up to its last real row (a last group of fewer than W rows ends early), the last
item's add, the drain's pre-add and add (3L), and 13 more:
run control 2, the memory read in the last item's write and in the drain 2 + 3 (the drain's
read address is a register loaded as it issues), the flush's
spare cycle and the switch to the drain 1 + 1, the output queue 2, busy 1, done 1. In stream
mode::

    (max_rank + 3) + items + F + L + 8

(the plan and its close, the items, the last item's front, memory read 2 and add, run control
2, the output queue 2, busy 1, done 1). An empty run takes
:data:`~moe_hw.blocks.run_control.EMPTY_CYCLES`. Any pause costs at most its own cycles plus,
on the output, up to W per drain pass.

Memory: two :class:`~moe_hw.blocks.block_memory.BlockMemory` (the even and the odd banks),
each ``ceil(G / 2) * 2**ceil(log2(rows))`` words of ``lanes`` elements (the bank's half in
the high address bits), a write enable per lane. Adders: ``2 * lanes``, all of latency L
(``add_stages``): ``lanes`` accumulators, and ``lanes - 1`` in the lane tree, which are the
drain's pre-adders too (the tree is idle once the drain begins), with one more pre-adder for
the last lane. Each takes its operands through a register
(:func:`~moe_hw.arith.fadd.registered_adder`: the choices by the drain flag, the bank's
parity and the pass flags before it, the core's carry chains after it) and a core of L - 1
stages, so L is by default the format's adder depth and one: 12.
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..arith.fadd import DEFAULT_ADDER_STAGES, adder_tree, registered_adder
from ..arith.params import FORMAT_NAMES, FloatDatapathParams
from ..blocks.block_memory import BlockMemory, bram_param
from ..blocks.row_reader import last_enable_of
from ..blocks.run_control import EMPTY_CYCLES, START_LATENCY, RunControl, run_ports
from ..golden.expand import BACKWARD_MODES, expand_backward_banks
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import ALTERNATE_GROUP_BITS, CreditPipeline, RegisterCopies, delay, replicated
from .expand import (StrideAddressParams, dim_steps, pair_odometer, registered_plan,
                     sum_level, sum_tree)

__all__ = ["ExpandBackwardParams", "ExpandBackwardUnit"]


@dataclass(frozen=True)
class ExpandBackwardParams(StrideAddressParams, FloatDatapathParams, UnitParams):
    """Generation-time parameters of :class:`ExpandBackwardUnit`."""

    format: str = param("fp32", choices=FORMAT_NAMES)
    lanes: int = param(16, choices=LANES)
    max_rank: int = param(6, minimum=1, maximum=16, doc="dims of expand_size")
    max_input: int = param(1024, minimum=1, maximum=1 << 20,
                           doc="input gradient elements held on chip (G banks of them)")
    max_output: int = param(1 << 24, minimum=1, maximum=1 << 40, doc="output elements")
    # At least 1: the accumulation interleaves banks and rows; a combinational adder would
    # close a combinational loop through its own output.
    add_stages: int | None = param(None, minimum=1, maximum=16, optional=True,
                                   doc="L, every adder's latency; None: the adder's default "
                                       "depth for the format and one (an operand register)")
    bram: str = bram_param()

    @property
    def add_latency(self):
        """L, every adder's latency: ``add_stages``, by default the format's adder depth and
        one, so that the accumulators and pre-adders (:func:`registered_adder`: an operand
        register, then a core of L - 1 stages) have the adder's full depth."""
        stages = self.add_stages
        return DEFAULT_ADDER_STAGES[self.format] + 1 if stages is None else stages

    @property
    def banks(self):
        """G: the accumulator banks, item k adds into bank ``k % G``."""
        return expand_backward_banks(self.add_latency)

    @property
    def ring(self):
        """W: rows reduced round-robin in the drain (a partial goes round the adder and its
        feedback register in ``add_latency + 1`` cycles)."""
        return self.add_latency + 1

    @property
    def element_width(self):
        return self.fmt.width

    @property
    def lane_levels(self):
        return ceil_log2(self.lanes)

    @property
    def front_latency(self):
        """F in ``reduce`` mode: cycles from an item's take to its address and value at the
        accumulator: the address adder tree, or the beat register and the lane tree, whichever
        is longer."""
        return max(self.short_front_latency, 1 + self.lane_levels * self.add_latency)

    @property
    def short_front_latency(self):
        """F in the other modes (no lane tree): the address adder tree and the memories'
        read address register."""
        return self.tree_latency + 1

    @property
    def drain_read_latency(self):
        """Cycles from a drain read's issue to its data: the read address register and the
        memory's read."""
        return 1 + BlockMemory.latency

    def front(self, mode):
        """F of a run in ``mode``."""
        return self.front_latency if mode == "reduce" else self.short_front_latency

    def flush(self, mode):
        """Cycles the drain waits after the last item's take, so that the item's write (its
        front, the read, the add) has landed before the first drain read."""
        return self.front(mode) + BlockMemory.latency + self.add_latency + 1

    @property
    def plan_beats(self):
        """Beats of the plan stream: one per dim, one for each odometer's start."""
        return self.max_rank + 2

    @property
    def plan_cycles(self):
        """Stall-free cycles from the first plan beat's take to the first item's: the beats
        and one (the last beat's load flag, a register, opens the items)."""
        return self.plan_beats + 1

    @property
    def row_bits(self):
        return ceil_log2(self.rows)

    @property
    def pairs(self):
        """Pairs of banks, summed one pair per drain pass: ``ceil(G / 2)``."""
        return -(-self.banks // 2)

    @property
    def memory_depth(self):
        """Words of each of the two memories (the even banks, the odd banks)."""
        return self.pairs << self.row_bits

    @property
    def output_depth(self):
        """The output queue's depth: a drain pass's W results beyond the drain's round trip
        (read, pre-add, add), and in stream mode every row from its item's take to its
        delivery, so that a row a cycle goes without a pause; and a slot each for the
        decision and the delivery that the count takes a cycle late."""
        read, lat = BlockMemory.latency, self.add_latency
        return 2 + max(2 * self.ring + self.drain_read_latency + 2 * lat + 3,
                       self.short_front_latency + read + lat + CreditPipeline.QUEUE_LATENCY + 2)

    def streams(self, input_elements, output_elements, mode):
        """Whether a run streams its rows out (``stream`` mode with at least one item per
        row; otherwise it drains as ``rows`` mode does)."""
        return (mode == "stream"
                and self.items(output_elements, mode) >= -(-input_elements // self.lanes))

    def items(self, output_elements, mode):
        """Items of a run: one per element in ``elements`` mode, one per beat otherwise."""
        if mode == "elements":
            return output_elements
        return -(-output_elements // self.lanes)

    def drain_cycles(self, input_elements):
        """Stall-free cycles of the drain up to its last real row's issue (inclusive)."""
        rows = max(1, -(-input_elements // self.lanes))
        w = self.ring
        groups = -(-rows // w)
        return self.pairs * w * groups - (w - 1 - (rows - 1) % w)

    def cycles(self, input_elements, output_elements, mode):
        """Exact stall-free cycles of a run (start cycle to the first cycle ``done`` is
        high); see the module docstring."""
        if output_elements == 0:
            return EMPTY_CYCLES
        if self.streams(input_elements, output_elements, mode):
            # The last item's front, read and add, the output queue, busy, done.
            return (START_LATENCY + self.plan_cycles + self.items(output_elements, mode)
                    + self.short_front_latency + BlockMemory.latency + self.add_latency
                    + CreditPipeline.QUEUE_LATENCY + CreditPipeline.IDLE_LATENCY + 1)
        return (START_LATENCY + self.plan_cycles + self.items(output_elements, mode)
                + self.flush(mode) + 1 + self.drain_cycles(input_elements)
                + self.drain_read_latency + 2 * self.add_latency
                + CreditPipeline.QUEUE_LATENCY + CreditPipeline.IDLE_LATENCY + 1)

    def grad_output_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.fmt.width, self.lanes)})

    def input_grad_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.fmt.width, self.lanes),
                                  "enable": self.lanes, "last": 1})


class ExpandBackwardUnit(wiring.Component):
    """The stride address generator in front of G interleaved accumulator banks; see the
    module docstring for the protocol, the summation order and the timing."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(ExpandBackwardParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "plan": In(stream.Signature(p.plan_layout())),
            "grad_output": In(stream.Signature(p.grad_output_layout())),
            "input_grad": Out(stream.Signature(p.input_grad_layout())),
            **run_ports(self.sizes),
        })

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order."""
        p = self.params
        return {"input_elements": p.max_input, "output_elements": p.max_output,
                "mode": len(BACKWARD_MODES) - 1}

    def elaborate(self, platform):
        m = Module()
        p = self.params
        lanes, rank, width = p.lanes, p.max_rank, p.fmt.width
        lanes_log2 = ceil_log2(lanes)
        lat = p.add_latency
        read_latency = BlockMemory.latency
        banks, ring = p.banks, p.ring
        all_lanes = (1 << lanes) - 1
        elements, reduce, rows_mode, stream_mode = (
            BACKWARD_MODES.index(name) for name in ("elements", "reduce", "rows", "stream"))

        ctl = m.submodules.control = RunControl(self.sizes, empty_when_zero=("output_elements",))
        ctl.connect(m, self)
        running = ctl.running

        # ---- run registers, loaded with start ---------------------------------------------
        max_items = p.max_output
        mode = Signal(range(len(BACKWARD_MODES)))
        stream = Signal()                    # one bank, a row leaves at its last item
        items_left = Signal(range(max_items + 1))
        run_rows = Signal(range(p.rows + 1))  # ceil(input_elements / lanes)
        last_en = Signal(lanes)
        lane = Signal(range(lanes))          # elements mode: the element's lane in its beat
        bank = Signal(range(banks))          # the last item's bank (k % G) a cycle on
        feeding = Signal()                   # the plan is in, an item is still to be taken
        long_front = mode == reduce          # the items wait for the lane tree
        rows_of_run = (self.input_elements + (lanes - 1)) >> lanes_log2
        with m.If(ctl.accept):
            m.d.sync += [
                mode.eq(self.mode),
                stream.eq(self.mode == stream_mode),
                items_left.eq(Mux(self.mode == elements, self.output_elements,
                                  (self.output_elements + (lanes - 1)) >> lanes_log2)),
                feeding.eq(0),
                run_rows.eq(rows_of_run),
                last_en.eq(last_enable_of(self.input_elements, lanes)),
                lane.eq(0), bank.eq(0),
            ]

        # ---- the plan: the dims' steps, then the odometers' starts -----------------------
        # (the first item comes two cycles after the odd odometer's load at the earliest: the
        # last plan beat's load flag opens the items)
        _, beat, beat_loads = registered_plan(m, p, self.plan, ctl)
        dy, da = dim_steps(m, p, beat, [beat_loads[d] for d in range(rank)])

        # ---- items: a beat (reduce, rows) or one element of it (elements), one per cycle --
        # ``feeding`` (the plan is in and an item is still to be taken) is a register, set by
        # the last plan beat's load flag, a cycle after that beat's take (the take, a gate of
        # the run flag and the plan's valid, set it before: the run flag's net into the take
        # and the take's net across the unit into ``feeding`` was the path at 4 and 16 lanes,
        # 169.2 and 111.6 MHz), and cleared with the last item's take; ``room`` (the output
        # queue has a slot for a stream item, or the run does not stream) is a register too:
        # the take is one gate of the stream's valid, the run flag and the two. (The run flag
        # is implied by ``feeding``, but it makes that plain to a formal check's induction,
        # which starts from any state.)
        room = Signal()
        with m.If(beat_loads[-1]):
            m.d.sync += feeding.eq(1)
        accumulating = running & feeding & room
        take = self.grad_output.valid & accumulating
        last_of_beat = (mode != elements) | (lane == lanes - 1) | (items_left == 1)
        m.d.comb += self.grad_output.ready.eq(accumulating & last_of_beat)
        flushing = Signal()
        flush_left = Signal(range(p.flush("reduce") + 1))
        with m.If(take):
            m.d.sync += [items_left.eq(items_left - 1),
                         lane.eq(Mux(last_of_beat, 0, lane + 1))]
            with m.If(items_left == 1):
                m.d.sync += [feeding.eq(0), flushing.eq(1),
                             flush_left.eq(Mux(long_front, p.flush("reduce"), p.flush("rows")))]

        # Two odometers take the items in turn (odd_item: the next item is odd), each
        # stepping two items in two cycles or more (expand's pair odometer): the even one
        # from element 0, the odd one from one item on. An odometer's odd take is the cycle
        # after its even take, and its next even take two cycles later at the earliest (the
        # other odometer's item comes between), so its choice registers load in every cycle
        # (``choose_always``): the take fanned out to their clock enables (lanes 4's path).
        # With the choice registers loading in every cycle an odometer needs only its odd
        # take, the cycle after its item's take: formed from register copies of the take
        # and of the parity, so that the take reaches one register per odometer, not its
        # logic (the take's net across the unit into the odometers' flags was a lanes-4
        # path, 187.2 MHz). The take's copies are one set with the bank counter's step, its
        # first (which reads 0 from reset; the others read 1 in the cycle after a reset, a
        # spurious odd take of an idle odometer, whose state is loaded again before a run's
        # first item); the parity's are the address tree's (below).
        odd_item = Signal()
        odd_next = Mux(ctl.accept, 0, odd_item ^ take)
        m.d.sync += odd_item.eq(odd_next)
        takes_late = replicated(m, take, name="item_took", copies=3, apart=True)
        bank_step = takes_late[0]
        pair_count = -(-rank // 2)
        parities = replicated(m, odd_item, name="odd_item_copy", copies=min(pair_count, 3),
                              apart=True)
        shares = []
        for parity, name in enumerate(("even_odometer", "odd_odometer")):
            parity_late = parities[-parity]
            took = takes_late[1 + parity] & (parity_late if parity else ~parity_late)
            a, _ = pair_odometer(m, p, dy, da, load=beat_loads[rank + parity],
                                 start=beat, odd_take=took,
                                 name=name, copies=1, choose_always=True)
            shares.append(a)
        # The address tree's first level sums both odometers' shares in pairs of dims, and
        # the item's sums are chosen after it, by register copies of ``odd_item`` (the parity
        # a cycle later), one per pair of dims: the same latency (the choice in front of the
        # first level, by copies of the parity's next value, took the take across the unit
        # into the copies: the lanes-4 path at 178.8 MHz).
        pair_sums = [sum_level(m, share, name=f"addr_pair_{parity}")
                     for parity, share in enumerate(shares)]
        chosen = [Mux(parities[i % len(parities)], odd, even)
                  for i, (even, odd) in enumerate(zip(*pair_sums))]
        # tree_latency after the take
        addr = sum_tree(m, chosen, name="addr") if len(chosen) > 1 else chosen[0]
        # An item reaches the accumulator F cycles after its take: in reduce mode after the
        # lane tree (F long), otherwise after the address tree (F short). The item's address,
        # valid and bank take either delay (a choice by the run's mode); its values only the
        # one their mode uses, so the beat's lanes are not held for the lane tree's length.
        front, short = p.front_latency, p.short_front_latency
        # The mode's flags that choose per item, as register copies loaded at the start (the
        # mode register's net reached the front's choices across the unit: at 16 lanes
        # `mode` over a 5.4 ns net into the address's choice and its row bound test, 112.5
        # MHz): per group of lanes the row-like and reduce flags of the lanes' values and
        # enables; the long front's choices read copies of their own, one per fronted value
        # (``copy``: the address, the valid, the bank), loaded from the lanes' first a cycle
        # later (a run constant long before the first item; loaded from the mode's compare
        # they would be merged with the lanes'). (With one set, a copy shared by the address
        # and a group's values was a 5.8 ns net into a lane's operand choice at 16 lanes.)
        lane_groups = min(lanes, 4)
        group_of = [j * lane_groups // lanes for j in range(lanes)]   # lane j's group
        rows_copies = replicated(m, (self.mode == rows_mode) | (self.mode == stream_mode),
                                 name="rows_like", copies=lane_groups, en=ctl.accept)
        reduce_copies = replicated(m, self.mode == reduce, name="reduce_mode",
                                   copies=lane_groups, en=ctl.accept)
        front_reduce = replicated(m, reduce_copies[0], name="reduce_front", copies=3)

        def fronted(value, name, *, copy, reset_less=True, at=0, early=0):
            """``value`` (formed ``at`` cycles after the take) at the accumulator, or
            ``early`` cycles before; chosen by the reduce flag's copy ``copy``."""
            near = delay(m, value, short - at - early, 1, name=f"{name}_short",
                         reset_less=reset_less)
            far = delay(m, near, front - short, 1, name=f"{name}_long", reset_less=reset_less)
            return Mux(front_reduce[copy], far, near)

        # The item's address and bank a cycle early too: the memories' read address is a
        # register (F short is the address tree and that register).
        addr_early = fronted(addr, "item_addr", copy=0, at=p.tree_latency, early=1)
        addr = delay(m, addr_early, 1, 1, name="item_addr_front", reset_less=True)
        data_in = self.grad_output.payload.data
        beat = [delay(m, data_in[j], 1, 1, name=f"beat{j}", reset_less=True)
                for j in range(lanes)]
        # The element of elements mode is chosen from the registered beat a cycle after the
        # take, by copies of the lane (one per 8 bits of the element), then registered: the
        # lane's net into a 16:1 choice among the port's lanes was the lanes-16 path.
        if lanes == 1:
            element = beat[0]
        else:
            lane_copies = replicated(m, lane, name="lane_copy", copies=min(4, -(-width // 8)))
            chosen = Signal(width)
            for c, copy in enumerate(lane_copies):
                lo, hi = width * c // len(lane_copies), width * (c + 1) // len(lane_copies)
                m.d.comb += chosen[lo:hi].eq(Cat(*(b[lo:hi] for b in beat)).word_select(
                    copy, hi - lo))
            element = delay(m, chosen, 1, 1, name="element", reset_less=True)
        # The lane tree's adders are the drain's pre-adders too (lane j's pair is summed by
        # the tree's adder j, in level order; the last lane has a pre-adder of its own): the
        # tree is idle from the drain's start, since the flush waits out the last item's
        # front. Each adder chooses its operands by a copy of ``draining`` per group of lanes,
        # a cycle late (the drain's first pair is read drain_read cycles after its issue).
        draining = Signal()                  # the drain has begun (adders in drain use)
        drain_copies = replicated(m, draining, name="draining_copy", copies=lane_groups)
        pair_operands = [(Signal(width, name=f"pair{j}_even"), Signal(width, name=f"pair{j}_odd"))
                         for j in range(lanes)]
        reduced, lent_sums = adder_tree(
            m, beat, p.format, lat, name="lane_tree",
            lent=([drain_copies[group_of[j]] for j in range(lanes - 1)], pair_operands))
        spare = front - 1 - p.lane_levels * lat
        reduced = delay(m, reduced, spare, 1, name="reduced", reset_less=True)
        beat = [delay(m, v, short - 1, 1, name=f"beat{j}_front", reset_less=True)
                for j, v in enumerate(beat)]
        element = delay(m, element, short - 1 - (lanes > 1), 1, name="element_front",
                        reset_less=True)
        # The item's valid, a cycle early, into a register copy per group of lanes (the valid's
        # register, placed by its other loads, was 6.4 ns of net from the write enables at 16
        # lanes, 121.7 MHz).
        item_on = replicated(m, fronted(take, "item_valid", copy=1, reset_less=False, early=1),
                             name="item_on", copies=lane_groups)
        # The item's bank: a counter stepped the cycle after each take, by a register copy of
        # the take of its own (the take's net across the unit into the counter's enable was the
        # lanes-4 path, 192.5 MHz), so it holds item k's bank (k % G) a cycle after its take.
        with m.If(bank_step):
            m.d.sync += bank.eq(Mux(stream | (bank == banks - 1), 0, bank + 1))
        bank_early = fronted(bank, "item_bank", copy=2, at=1, early=1)
        item_bank = delay(m, bank_early, 1, 1, name="item_bank_front", reset_less=True)
        # Stream mode (F short): the last pass is the last run_rows items; each is its row's
        # last add. Its flags by position (the k-th such item is row k): the last flag on the
        # final item, whatever the plan.
        touch_last = take & stream & (items_left <= run_rows)
        # (The output queue takes it a cycle before the accumulator does: the queue's latency
        # is the drain's, whose read takes the read address register too.)
        item_last_early = delay(m, touch_last, short - 1, 1, name="item_last_early")
        item_last = delay(m, item_last_early, 1, 1, name="item_last")
        item_final = delay(m, items_left == 1, short + read_latency + lat, 1,
                           name="item_final", reset_less=True)

        # The item at the accumulator: its row, bank, lane values and lane enables.
        row = addr[lanes_log2:]
        single = Signal(lanes)               # the one lane of a reduce or elements item
        m.d.comb += single.eq(Const(1, lanes) << addr[:lanes_log2] if lanes_log2 else 1)
        enables = Signal(lanes)
        m.d.comb += enables.eq(Cat(item_on[group_of[j]] & (rows_copies[group_of[j]] | single[j])
                                   for j in range(lanes)))
        # The row's bound test on the front's address, a register per group of lanes a cycle
        # after the front; it masks the enables one register down their delay line (the
        # write is read + L cycles after the front). (Before the front, the test was on a
        # path with the held row count's net, then with the long front's choice.)
        # The bound is a copy of the run's row count of its own, loaded at the start (the
        # count's register, placed by its loads in the drain's control, was a 5.2 ns net from
        # the compare at 16 lanes, 118.9 MHz).
        row_bound = replicated(m, rows_of_run, name="row_bound", copies=1, en=ctl.accept,
                               apart=True)[0]
        in_rows = replicated(m, row < row_bound, name="in_rows", copies=lane_groups)
        values = [Mux(rows_copies[group_of[j]], beat[j],
                      Mux(reduce_copies[group_of[j]], reduced, element))
                  for j in range(lanes)]

        # ---- the accumulator: G banks in two memories, even and odd banks -------------------
        # Bank b is in memory b % 2 at row-major address (row, b // 2): an item reads both
        # memories and keeps its own bank's word, the drain reads a pair of banks per cycle.
        memories = []
        for parity in range(2):
            memory = BlockMemory(width, p.memory_depth, granules=lanes, target=p.bram)
            m.submodules[("even_banks", "odd_banks")[parity]] = memory
            memories.append(memory)
        even, odd = memories
        read = BlockMemory.latency
        addr_width = len(even.read_addr)
        drain_issue = Signal()
        drain_addr = Signal(addr_width)
        item_parity = item_bank[0] if banks > 1 else Const(0)
        rmw_addr = Cat(row[:p.row_bits], item_bank[1:])[:addr_width]
        # The read address: a register (a copy per memory) loaded a cycle ahead, the item's
        # from its early address, the drain's as it issues (so the drain reads a cycle after
        # its issue: ``drain_read``).
        rmw_early = Cat(addr_early[lanes_log2:][:p.row_bits], bank_early[1:])[:addr_width]
        # (The copies not held inverted, ``apart=False``: a block's address pin takes the
        # register itself, with no inverter LUT in between; no other register loads the
        # value they would be merged with.)
        read_addrs = RegisterCopies(addr_width, name="read_addr", copies=2, apart=False)
        m.d.sync += read_addrs.eq(Mux(draining, drain_addr, rmw_early))
        for memory, read_addr in zip(memories, read_addrs.values):
            m.d.comb += [memory.read_addr.eq(read_addr), memory.read_en.eq(1)]
        drain_read = p.drain_read_latency
        parity_read = delay(m, item_parity, read, 1, name="parity_read", reset_less=True)

        # The drain: a pre-adder per lane (the lane tree's adders and one more) sums the pair
        # of banks (+0.0 for the missing odd bank of an odd G); the ring adder adds the pairs
        # into the partial, which is the adder's sum a cycle later, +0.0 where the first pair
        # starts a row.
        # The restart flag in a copy per group of lanes, loaded a cycle ahead (one flag into
        # every lane's partial was the lanes-16 path: two 3.0 ns nets, 147.4 MHz).
        restart_early = Signal()
        restarts = replicated(m, restart_early, name="restart", copies=lane_groups)
        last_pass_signal = Signal()          # the drain's pass is the last pair of banks
        pair_on = delay(m, drain_issue, drain_read, 1, name="pair_on")
        odd_on = delay(m, drain_issue & ((banks % 2 == 0) | ~last_pass_signal), drain_read, 1,
                       name="odd_on")
        ring_on = delay(m, pair_on, lat, 1, name="ring_on")
        values_read = [delay(m, v, read, 1, name=f"value{j}_read", reset_less=True)
                       for j, v in enumerate(values)]
        sums = []
        # The accumulators' operand choice by the copies of draining, a cycle late (the last
        # item's add is over L + 1 cycles before draining rises, and the first drain pair
        # arrives read + L cycles after it), so that no one net reaches every lane.
        pre_sums = lent_sums + [None]
        for j in range(lanes):
            drain_here = drain_copies[group_of[j]]
            pair_even, pair_odd = pair_operands[j]
            m.d.comb += [pair_even.eq(Mux(pair_on, even.read_data[j], 0)),
                         pair_odd.eq(Mux(odd_on, odd.read_data[j], 0))]
            if pre_sums[j] is None:
                pre = m.submodules[f"pair{j}"] = registered_adder(
                    m, p.format, lat, pair_even, pair_odd, name=f"pair{j}")
                pre_sums[j] = pre.sum
            partial = Signal(width, name=f"partial{j}")
            old = Mux(parity_read, odd.read_data[j], even.read_data[j])
            acc = m.submodules[f"acc{j}"] = registered_adder(
                m, p.format, lat, Mux(drain_here, partial, old),
                Mux(drain_here, Mux(ring_on, pre_sums[j], 0), values_read[j]), name=f"acc{j}")
            m.d.sync += partial.eq(Mux(restarts[group_of[j]], 0, acc.sum))
            sums.append(acc.sum)

        # Writes: an item's sum read + L cycles after its front into its bank's memory, or a
        # drain read's clear (both memories) a cycle after it. Each memory's write address
        # and enables are registers of their own, chosen a cycle ahead (chosen at the
        # memory, the choice's LUT, driven by the clear flag, spread its net over the
        # memory's blocks: at 16 lanes the flag's 3.6 ns net and the choice's 3.3 ns net
        # into a block's address were the path with the output queue's cut).
        write_en_early = delay(m, Cat(in_rows[group_of[j]] & e for j, e in
                                      enumerate(delay(m, enables, 1, 1, name="item_enables"))),
                               read + lat - 2, 1, name="write_en")
        write_odd_early = delay(m, item_parity, read + lat - 1, 1, name="write_odd",
                                reset_less=True)
        write_addr_early = delay(m, rmw_addr, read + lat - 1, 1, name="write_addr",
                                 reset_less=True)
        clear_early = delay(m, drain_issue, drain_read - 2, 1, name="clear_early")
        # The write data is +0.0 for a drain read's clear and, in stream mode, for a row's
        # last add (its sum leaves), so the bank is clear for the next run. That choice
        # reaches every lane's write data in both memories: a copy of it per group of lanes,
        # each a register loaded a cycle ahead.
        write_zero = replicated(
            m, clear_early | delay(m, item_last, read + lat - 1, 1, name="write_last"),
            name="write_zero", copies=lane_groups)
        clear_addr_early = delay(m, drain_addr, drain_read - 2, 1, name="clear_addr",
                                 reset_less=True)
        # (Not inverted either: the read address copies' note above.)
        write_addrs = RegisterCopies(addr_width, name="write_addr_at", copies=2, apart=False)
        m.d.sync += write_addrs.eq(Mux(clear_early, clear_addr_early, write_addr_early))
        for parity, memory in enumerate(memories):
            mine = write_odd_early if parity else ~write_odd_early
            write_en = Signal(lanes, name=f"write_en_at{parity}")
            m.d.sync += write_en.eq(Mux(clear_early, all_lanes, Mux(mine, write_en_early, 0)))
            m.d.comb += [memory.write_en.eq(write_en),
                         memory.write_addr.eq(write_addrs.values[parity])]
            for j in range(lanes):
                m.d.comb += memory.write_data[j].eq(
                    Mux(write_zero[group_of[j]], 0, sums[j]))

        # ---- flush, then the drain ------------------------------------------------------------
        with m.If(flushing):
            m.d.sync += flush_left.eq(flush_left - 1)
            with m.If(flush_left == 0):
                m.d.sync += [flushing.eq(0), draining.eq(1)]
        # The output queue takes a result a cycle before the accumulator's input (an item's,
        # in stream mode) or lat cycles after its drain issue (the pre-add); either's sum is
        # there drain_read + lat cycles later.
        latency = drain_read + lat
        depth = p.output_depth
        # The queue's output register holds the sums as two registers written in turn, with
        # pointer and flag copies per 64 bits (the skid buffer's ``group_flags``): its read
        # then reaches no bus-wide clock enable (at 16 lanes the ring's read pointer into
        # the output register was the critical path).
        out = m.submodules.output_pipe = CreditPipeline(
            latency, p.input_grad_layout(), depth=depth, alternate=("data",),
            group_bits=ALTERNATE_GROUP_BITS, group_flags=True)
        wiring.connect(m, out.o, wiring.flipped(self.input_grad))
        # Results not yet taken by the consumer, counted when they are decided (an item's
        # take, a drain read): a last pass starts only when the queue has room for all W of
        # its results (its takes cannot wait: the rows keep ring slots), and in stream mode
        # an item is taken only with a slot for its row (room).
        # The count takes a decision and a delivery a cycle late (``counted``, ``delivered``:
        # registers), so that neither the take's and the drain's logic nor the output's
        # handshake runs on into its adder and compares: ``pending`` is then the true count
        # give or take one, and the flags assume one more (the queue has two slots more for
        # it, ``output_depth``), so they are never later than exact ones.
        pending = Signal(range(depth + 1))
        delivered = Signal()
        drain_out = Signal()
        counted = Signal()
        pass_room = Signal()                 # a last pass's W results fit
        pending_next = pending + counted - delivered
        # The flags test pending_next against constants without its adder: it is pending, or
        # one more or one less, so each flag is a choice among three compares of pending.
        up, down = counted & ~delivered, delivered & ~counted

        def next_below(limit):
            return Mux(up, pending < limit - 1, Mux(down, pending < limit + 1, pending < limit))
        m.d.sync += [counted.eq(Mux(stream, touch_last, drain_out)),
                     delivered.eq(self.input_grad.valid & self.input_grad.ready),
                     pending.eq(pending_next), room.eq(next_below(depth - 2) | ~stream),
                     pass_room.eq(next_below(depth - ring - 2))]
        # rho counts every drain cycle modulo W; a pass (one pair of banks over a group of W
        # rows) starts only at rho == 0, so the rows keep their ring slots whatever waits.
        rho = Signal(range(ring))
        drain_pair = Signal(range(p.pairs))
        group_row = Signal(range(p.rows + ring + 1))
        last_group = Signal()                # group_row + W >= rows
        pass_on = Signal()                   # the current pass issues
        drain_open = Signal()                # a pass is still to come
        m.d.comb += last_pass_signal.eq(drain_pair == p.pairs - 1)
        last_pass = last_pass_signal
        starts = draining & drain_open & (rho == 0)
        go = starts & (~last_pass | pass_room)
        # The drain's row and its tests as registers stepped beside rho: drain_row = group_row
        # + rho, group_left = rows - group_row, left = max(rows - drain_row, 0), and real =
        # left > 0 (a register of its own, so that no zero test stands before drain_out).
        drain_row = Signal(range(p.rows + ring + 1))
        group_left = Signal(range(p.rows + 1))
        left = Signal(range(p.rows + 1))
        real = Signal()
        m.d.comb += [
            drain_issue.eq(Mux(rho == 0, go, pass_on)),
            drain_addr.eq(Cat(drain_row[:p.row_bits], drain_pair)[:addr_width]),
            restart_early.eq(delay(m, drain_issue & (drain_pair == 0), drain_read - 2 + lat,
                                   1, name="restart_next")),
            drain_out.eq(drain_issue & last_pass & real),
            out.i_valid.eq(Mux(stream, item_last_early,
                               delay(m, drain_out, lat, 1, name="drain_out"))),
            out.payload.data.eq(Cat(*sums)),
        ]

        drain_final = delay(m, left == 1, drain_read + 2 * lat, 1, name="final",
                            reset_less=True)
        final = Mux(stream, item_final, drain_final)
        m.d.comb += [out.payload.enable.eq(Mux(final, last_en, all_lanes)),
                     out.payload.last.eq(final)]
        with m.If(draining & drain_open):
            wrap = rho == ring - 1
            m.d.sync += rho.eq(Mux(wrap, 0, rho + 1))
            with m.If(wrap):
                m.d.sync += [drain_row.eq(group_row), left.eq(group_left),
                             real.eq(group_left != 0)]
            with m.Else():
                # (``real`` is left > 0: the saturation's test is a register, and left > 1
                # an OR of left's upper bits, not two compares' carry chains after the
                # decrement's, the lanes-4 path at 203.4 MHz)
                m.d.sync += [drain_row.eq(drain_row + 1), left.eq(Mux(real, left - 1, 0)),
                             real.eq(left[1:].any())]
            with m.If(rho == 0):
                m.d.sync += pass_on.eq(go)
            with m.If(wrap & pass_on):
                m.d.sync += pass_on.eq(0)
                with m.If(~last_pass):
                    m.d.sync += drain_pair.eq(drain_pair + 1)
                with m.Else():
                    next_row, next_left = group_row + ring, group_left - ring
                    m.d.sync += [drain_pair.eq(0), group_row.eq(next_row),
                                 drain_row.eq(next_row), group_left.eq(next_left),
                                 left.eq(next_left), real.eq(1),
                                 last_group.eq(group_left <= 2 * ring)]
                    with m.If(last_group):
                        m.d.sync += drain_open.eq(0)
        m.d.comb += ctl.finished.eq(running & draining & ~drain_open & ~out.busy)

        with m.If(ctl.begin):
            # Stream mode needs a whole last pass (at least one item per row); with fewer
            # items (a plan that is not a stream of passes) the run drains as rows mode does.
            streaming = stream & (items_left >= run_rows)
            m.d.sync += stream.eq(streaming)
            m.d.sync += [draining.eq(0), flushing.eq(0), drain_open.eq(~streaming), rho.eq(0),
                         drain_pair.eq(0), group_row.eq(0), pass_on.eq(0), pending.eq(0),
                         counted.eq(0), delivered.eq(0), last_group.eq(run_rows <= ring),
                         drain_row.eq(0),
                         group_left.eq(run_rows), left.eq(run_rows), real.eq(run_rows != 0)]
        return m
