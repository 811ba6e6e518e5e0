"""A streaming scan (SPEC 1.7, seed 003): ``carry = init; for x in xs: carry, y = step(carry, x)``
on one instance of a pipelined step, with independent sequences interleaved.

:class:`Scan` wraps any *step* component of the form ``(carry, x) -> (carry, y)``: a
free-running pipeline (its registers load every cycle) with

* ``latency`` (an int attribute, D >= 0): its outputs are the results for the inputs it was
  given D cycles earlier;
* ports ``carry`` (in), ``x`` (in), ``carry_next`` (out, the shape of ``carry``) and,
  optionally, ``y`` (out). A step without ``y`` scans for its final carry alone (``ys=False``).

The scan adds the carry store (a register file of one carry per interleaved sequence, read
asynchronously by slot), a register in front of each of the step's inputs (the carry read
and the ``x`` payload reach only a register, not the step's first stage), the loop counters,
the run control, and a credit-counted output
queue (:class:`~moe_hw.stream.CreditPipeline`): the step is never stalled, so a wide step
(16 float lanes) has no enable net at all.

Streams and ports (payload fields least significant first):

``init`` (in)
    One beat per sequence, in sequence order: its initial carry.
``x`` (in)
    One beat per step of every sequence, in the scan's order (below).
``o`` (out)
    With ``ys`` (the default): one beat per step, in the same order as ``x``: ``y``, the
    ``carry`` after the step and ``last`` (the sequence's last step: its ``carry`` is the
    sequence's final carry). Without ``ys``: one beat per sequence, in sequence order:
    ``carry``, its final carry (and ``last``, always 1).
``start``, ``sequences`` (K), ``length`` (T) (in); ``busy``, ``done``, ``error`` (out)
    The shared :class:`~moe_hw.blocks.run_control.RunControl`. K or T zero: an empty run
    (nothing taken, nothing out, ``done`` after :data:`EMPTY_CYCLES`); above its maximum:
    ``error``.

Order: the K sequences are taken in *groups* of ``n = min(max_interleave, sequences left)``
consecutive sequences. A group runs T rounds; round t issues step t of each of the group's n
sequences in sequence order, then ``period - n`` bubbles, where ``period = max(n, D + 1)``
and D is the loop latency (:attr:`Scan.latency`: the step's latency plus
:data:`INPUT_LATENCY`, the input register): the carry store is read a cycle after the
issue (:data:`CARRY_READ_LATENCY`), so a carry written back at the end of cycle
``issue + D + 1`` is read by the same sequence's next step no earlier than cycle
``issue + period + 1``. So ``x`` holds, per group, the group's sequences' steps round by
round: ``x[g, t, s]`` for t in 0..T-1, s in 0..n-1. The group
ends with its last issue (the last round's bubbles are skipped: no step of the group reads
a carry after it).

Rate: one sequence alone runs one step every D + 1 cycles; ``max_interleave >= D + 1``
sequences keep the step busy every cycle (one step per cycle). The next group's size and
period are worked out while a group issues, so the groups follow each other without a gap
(a group that issues for fewer than :data:`PENDING_LATENCY` cycles leaves the difference).
Stall-free, a run takes exactly :func:`scan_cycles` = ``START_LATENCY + GROUP_SETUP + sum
over groups of span_g + sum over all groups but the last of max(0, PENDING_LATENCY -
span_g) + D + CARRY_READ_LATENCY + QUEUE_LATENCY + IDLE_LATENCY + 1`` cycles, with
``span_g = (T - 1) * period_g + n_g`` (:data:`CARRY_READ_LATENCY`, 1: the issue registered
before the carry store's read; the last two latencies of
:class:`~moe_hw.stream.CreditPipeline`, 2 + 1, and the done register) from the start cycle
to the cycle ``done`` is first seen, the last beat being taken as soon as it is offered.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, Value, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..arith.fadd import FloatAdderCore
from ..params import check_int
from ..stream import CreditPipeline, RegisterCopies, delay, lut_increment
from .run_control import EMPTY_CYCLES, START_LATENCY, RunControl, run_ports

__all__ = ["Scan", "scan_cycles", "scan_groups", "CountingStep", "PrefixSumStep",
           "FloatSumStep", "GROUP_SETUP", "PENDING_LATENCY", "INPUT_LATENCY",
           "CARRY_READ_LATENCY"]

#: Cycles from ``begin`` to the first group's first issue, beyond the one of ``begin``:
#: the group size and its period are each a register (no compare chain between them and the
#: handshakes).
GROUP_SETUP = 2
#: Cycles from a group's load to the cycle its successor can be loaded: a group that issues
#: for fewer cycles leaves a gap of the difference.
PENDING_LATENCY = 3
#: The register in front of the step's inputs: a scan's loop latency is the step's plus this.
INPUT_LATENCY = 1
#: The register in front of the carry store's read (the issue's slot, first-round flag, init
#: and x): a cycle from the take to the read, beside the loop (a carry written back at the end
#: of cycle ``issue + D + 1`` is read in cycle ``next issue + 1``), so it adds a cycle to a
#: run, not to the period.
CARRY_READ_LATENCY = 1
#: The carry store is split into memories of about this many bits (two at most), each read
#: at a copy of the slot of its own.
CARRY_GROUP_BITS = 48


def scan_groups(max_interleave, sequences):
    """The group sizes of a run of ``sequences`` sequences."""
    return [min(max_interleave, sequences - first)
            for first in range(0, sequences, max_interleave)]


def scan_cycles(latency, max_interleave, sequences, length):
    """Exact stall-free cycles of a :class:`Scan` run, from the start cycle to the first cycle
    ``done`` is high (see the module docstring), for a loop latency of ``latency`` cycles
    (:attr:`Scan.latency`: the step's latency plus :data:`INPUT_LATENCY`)."""
    if sequences == 0 or length == 0:
        return EMPTY_CYCLES
    spans = [(length - 1) * max(n, latency + 1) + n
             for n in scan_groups(max_interleave, sequences)]
    issue = GROUP_SETUP + sum(spans) + sum(max(0, PENDING_LATENCY - d) for d in spans[:-1])
    return (START_LATENCY + issue + latency + CARRY_READ_LATENCY + CreditPipeline.QUEUE_LATENCY
            + CreditPipeline.IDLE_LATENCY + 1)


def _member(component, name):
    return component.signature.members[name] if name in component.signature.members else None


class Scan(wiring.Component):
    """A scan over a pipelined ``step`` with up to ``max_interleave`` sequences interleaved.
    See the module docstring for the step's interface, the ports, the order and the rate.

    ``max_sequences`` (K) and ``max_length`` (T) bound the run-time sizes; ``ys``: whether
    every step's beat leaves on ``o`` (else only each sequence's final carry).
    """

    def __init__(self, step, *, max_sequences, max_length, max_interleave, ys=True):
        if not isinstance(step, wiring.Component):
            raise TypeError(f"step must be an amaranth.lib.wiring.Component, not {step!r}")
        for name, flow in (("carry", wiring.In), ("x", wiring.In),
                           ("carry_next", wiring.Out)):
            member = _member(step, name)
            if member is None or not member.is_port or member.flow != flow:
                raise ValueError(f"step must have an {flow.name.lower()} port {name!r} "
                                 f"(a step is (carry, x) -> (carry_next, y))")
        latency = getattr(step, "latency", None)
        self.step_latency = check_int("step latency", latency, minimum=0, maximum=1 << 10)
        #: The loop latency D: an issue's carry is written back D cycles after it.
        self.latency = self.step_latency + INPUT_LATENCY
        if Shape.cast(step.carry.shape()).width != Shape.cast(step.carry_next.shape()).width:
            raise ValueError(f"step's carry_next must have the width of its carry "
                             f"({Shape.cast(step.carry.shape()).width}), not "
                             f"{Shape.cast(step.carry_next.shape()).width}")
        has_y = _member(step, "y") is not None
        if ys and not has_y:
            raise ValueError("ys=True needs a step with an output port 'y'")
        self.step = step
        self.ys = bool(ys)
        self.max_sequences = check_int("max_sequences", max_sequences, minimum=1)
        self.max_length = check_int("max_length", max_length, minimum=1)
        self.max_interleave = check_int("max_interleave", max_interleave, minimum=1,
                                        maximum=1 << 16)
        self.carry_shape = step.carry.shape()
        self.x_shape = step.x.shape()
        fields = {"y": step.y.shape()} if self.ys else {}
        self.out_layout = data.StructLayout({**fields, "carry": self.carry_shape, "last": 1})
        super().__init__({
            "init": In(stream.Signature(self.carry_shape)),
            "x": In(stream.Signature(self.x_shape)),
            "o": Out(stream.Signature(self.out_layout)),
            **run_ports(self.sizes),
        })

    @property
    def sizes(self):
        return {"sequences": self.max_sequences, "length": self.max_length}

    def period(self, interleave):
        """Cycles per round of a group of ``interleave`` sequences."""
        return max(interleave, self.latency + 1)

    def groups(self, sequences):
        """The group sizes of a run of ``sequences`` sequences."""
        return scan_groups(self.max_interleave, sequences)

    def cycles(self, sequences, length):
        """Exact stall-free cycles from the start cycle to the first cycle ``done`` is high
        (:func:`scan_cycles`)."""
        return scan_cycles(self.latency, self.max_interleave, sequences, length)

    def elaborate(self, platform):
        m = Module()
        step = m.submodules.step = self.step
        interleave = self.max_interleave
        latency = self.latency
        ctl = m.submodules.control = RunControl(self.sizes, empty_when_zero=("sequences",
                                                                             "length"))
        ctl.connect(m, self)
        length = ctl.size("length")

        pipe = m.submodules.pipeline = CreditPipeline(
            latency + CARRY_READ_LATENCY, self.out_layout, keep=None if self.ys else "last")
        wiring.connect(m, pipe.o, wiring.flipped(self.o))

        # ---- the schedule: groups, rounds (t) and slots ----------------------------------------
        left = Signal(range(self.max_sequences + 1))       # sequences not yet grouped
        group = Signal(range(interleave + 1))              # n
        period = Signal(range(max(interleave, latency + 1) + 1))
        slot = Signal(range(max(interleave, latency + 1)))
        carry_width = Shape.cast(self.carry_shape).width
        store_groups = min(2, -(-carry_width // CARRY_GROUP_BITS))
        round_ = Signal(range(self.max_length))            # t
        first_round = Signal()                             # t == 0
        last_round = Signal()                              # t == T - 1
        last_slot = Signal()                               # slot == period - 1
        issuing = Signal()                                 # slot < n
        last_issue = Signal()                              # slot == n - 1
        rounds = Signal()                                  # a group is issuing
        # rounds & issuing, a register of its own (set and cleared with them), so that the
        # take, which every register of the schedule waits for, is one gate of five flags.
        issue_now = Signal()
        final_group = Signal()
        # The next group, worked out while the current one runs (from ``left``, in two
        # register stages: ``pending_ready`` is high PENDING_LATENCY cycles after a group is
        # loaded), so that groups follow each other without a gap when they last that long.
        pending_group = Signal.like(group)
        pending_period = Signal.like(period)
        pending_final = Signal()
        pending_ready = Signal()
        compute = Signal()                                 # stage 1: group size, final flag
        compute_period = Signal()                          # stage 2: its period
        waiting = Signal()                                 # no group: load one when ready

        m.d.comb += [
            pipe.i_valid.eq(issue_now & self.x.valid & (self.init.valid | ~first_round)),
            self.x.ready.eq(issue_now & pipe.i_ready & (self.init.valid | ~first_round)),
            self.init.ready.eq(issue_now & pipe.i_ready & first_round & self.x.valid),
        ]
        take = pipe.take

        # The first group is worked out from the decide cycle on (``left`` is loaded in the
        # start cycle); an empty or too-big run never loads it.
        with m.If(ctl.accept):
            m.d.sync += [left.eq(self.sequences), pending_ready.eq(0), waiting.eq(0),
                         compute.eq(1)]
        with m.If(ctl.begin):
            m.d.sync += waiting.eq(1)
        # Stage 1 compares ``left`` with the two constants, stage 2 chooses among registers
        # and constants (``left`` holds meanwhile: no group is loaded before
        # ``pending_ready``), so that no compare's carry chain feeds a choice in one cycle.
        over = Signal()                                    # left > max_interleave
        over_loop = Signal()                               # left > D + 1
        with m.If(compute):
            m.d.sync += [over.eq(left > interleave), over_loop.eq(left > latency + 1),
                         compute.eq(0), compute_period.eq(1)]
        with m.If(compute_period):
            m.d.sync += [pending_group.eq(Mux(over, interleave, left)),
                         pending_final.eq(~over),
                         pending_period.eq(Mux(over, max(interleave, latency + 1),
                                               Mux(over_loop, left, latency + 1))),
                         compute_period.eq(0), pending_ready.eq(1)]
        all_issued = Signal()
        with m.If(ctl.accept):
            m.d.sync += all_issued.eq(0)
        # The last-slot, last-issue and last-round tests compare a counter with a register
        # (period - 2, n - 2, T - 2; signed: -1 matches nothing), not with a sum.
        period_m2 = Signal(signed(len(period) + 1), name="period_m2")
        group_m2 = Signal(signed(len(group) + 1), name="group_m2")
        length_m2 = Signal(signed(len(length) + 1), name="length_m2")
        with m.If(ctl.decide):
            m.d.sync += length_m2.eq(length - 2)
        # round == T - 2, registered in every cycle: the round steps only at a round's last
        # slot, and a round has two slots at least (D >= 1), so the flag has caught up with a
        # step (or a load) by the next round's last slot.
        round_is_m2 = Signal()
        m.d.sync += round_is_m2.eq(round_ == length_m2)

        def schedule(taken):
            # The schedule's next state when the pipeline takes a step (``taken``) and when it
            # does not. It is given twice, under ``take`` and under its complement, so that
            # ``take`` (the x and init handshake) is the last choice before each register, not
            # the head of a chain of decisions (advance, the group's end, the next load).
            # A take implies ``rounds`` and ``issuing`` (``issue_now``); without one the slot
            # advances only over a bubble, where the group cannot end. Written with those
            # constants, so that no register's next value tests them behind the take again.
            advance = Const(1) if taken else rounds & ~issuing
            # The group ends with its last issue: the bubbles after it would only wait for
            # carries that no step of this group reads any more.
            group_ends = last_round & last_issue if taken else Const(0)
            load = pending_ready & (waiting | (group_ends & ~final_group))
            with m.If(advance):
                # (The slot's registers step at the group's end too: nothing reads them until
                # the next load, which sets them, so the end is not a test in their next
                # values; it clears the issue flags after them, and wins.)
                with m.If(last_slot):
                    m.d.sync += [slot.eq(0),
                                 issuing.eq(1), issue_now.eq(1), last_issue.eq(group == 1),
                                 last_slot.eq(period == 1),
                                 round_.eq(round_ + 1), first_round.eq(0),
                                 last_round.eq(round_is_m2)]
                with m.Else():
                    # (LUTs, not a carry chain: see lut_increment.)
                    slot_next = lut_increment(slot)
                    m.d.sync += [slot.eq(slot_next),
                                 last_slot.eq(slot == period_m2),
                                 last_issue.eq(slot == group_m2)]
                    with m.If(last_issue):
                        m.d.sync += [issuing.eq(0), issue_now.eq(0)]
                with m.If(group_ends):
                    m.d.sync += [rounds.eq(0), issue_now.eq(0)]
                    with m.If(final_group):
                        m.d.sync += all_issued.eq(1)
                    with m.Else():
                        m.d.sync += waiting.eq(1)
            # Loading a group (after the above: it wins over the group's end). The flags of the
            # next slot are registers (``last_slot``, ``last_issue``, ``issuing``): loaded here
            # for the group's first slot, then as the slots advance.
            with m.If(load):
                m.d.sync += [group.eq(pending_group), period.eq(pending_period),
                             final_group.eq(pending_final), left.eq(left - pending_group),
                             pending_ready.eq(0), compute.eq(1), waiting.eq(0), rounds.eq(1),
                             issue_now.eq(1),
                             slot.eq(0), round_.eq(0), first_round.eq(1),
                             last_round.eq(length == 1), issuing.eq(1),
                             last_issue.eq(pending_group == 1), last_slot.eq(pending_period == 1),
                             group_m2.eq(pending_group - 2), period_m2.eq(pending_period - 2)]

        with m.If(take):
            schedule(True)
        with m.Else():
            schedule(False)

        # ---- the carry store and the step -----------------------------------------------------
        # The issue's slot, first-round flag, init and x payloads are registered before the
        # carry store is read (CARRY_READ_LATENCY): the schedule's slot register then reaches only
        # its own logic and these registers, not the LUT RAM's address pins (the take's path
        # into the slot ended in a 1 ns net to a register the RAM had pulled away). Copies of
        # the read slot, one per half of the carry store's bits (each half a memory of its
        # own): no single net reaches every LUT RAM cell of a wide carry. Not inverted copies
        # (those put a LUT in front of the RAM's address pins): they differ in reset value.
        read_slot = RegisterCopies(len(slot), name="read_slot", copies=store_groups,
                                   apart=False)
        m.d.sync += read_slot.eq(slot)
        read_first = delay(m, first_round, 1, 1, name="read_first", reset_less=True)
        read_init = delay(m, self.init.payload, 1, 1, name="read_init", reset_less=True)
        x_read = delay(m, self.x.payload, 1, 1, name="x_read", reset_less=True)
        out_latency = latency + CARRY_READ_LATENCY
        arrives = delay(m, take, out_latency, 1, name="arrives")
        slot_out = delay(m, slot, out_latency, 1, name="slot_out", reset_less=True)
        last_out = delay(m, last_round, out_latency, 1, name="last_out", reset_less=True)
        carry_in = Signal(carry_width, name="carry_in", reset_less=True)
        x_in = Signal(Shape.cast(self.x_shape).width, name="x_in", reset_less=True)
        carry_read = []
        bits = -(-carry_width // store_groups)
        for index, (address, low) in enumerate(zip(read_slot.values,
                                                   range(0, carry_width, bits))):
            high = min(low + bits, carry_width)
            store = m.submodules[f"carry_store{index}"] = memory.Memory(
                shape=high - low, depth=max(interleave, 2), init=[])
            write = store.write_port()
            read = store.read_port(domain="comb")
            m.d.comb += [read.addr.eq(address), write.addr.eq(slot_out), write.en.eq(arrives),
                         write.data.eq(Value.cast(step.carry_next)[low:high])]
            carry_read.append(read.data)
        m.d.sync += [carry_in.eq(Mux(read_first, read_init, Cat(*carry_read))),
                     x_in.eq(x_read)]
        m.d.comb += [
            step.carry.eq(carry_in),
            step.x.eq(x_in),
            pipe.payload.carry.eq(step.carry_next),
            pipe.payload.last.eq(last_out),
        ]
        if self.ys:
            m.d.comb += pipe.payload.y.eq(step.y)

        m.d.comb += ctl.finished.eq(ctl.running & all_issued & ~pipe.busy)
        return m


# ---- steps ------------------------------------------------------------------------------------

class CountingStep(wiring.Component):
    """The seed's example step, ``fn(c, x) = (c + 1, x + c)``, on ``width``-bit integers
    (wrapping), with ``latency`` register stages (to exercise the interleaving)."""

    def __init__(self, width=16, latency=1):
        self.width = check_int("width", width, minimum=1, maximum=64)
        self.latency = check_int("latency", latency, minimum=0, maximum=64)
        super().__init__({"carry": In(self.width), "x": In(self.width),
                          "carry_next": Out(self.width), "y": Out(self.width)})

    def elaborate(self, platform):
        m = Module()
        carry = delay(m, (self.carry + 1)[:self.width], self.latency, 1, name="carry_next")
        y = delay(m, (self.x + self.carry)[:self.width], self.latency, 1, name="y")
        m.d.comb += [self.carry_next.eq(carry), self.y.eq(y)]
        return m


class PrefixSumStep(wiring.Component):
    """The prefix sum as a step, ``fn(c, x) = (c + x, c)`` (SPEC 1.7): ``y`` is the exclusive
    sum, wrapping modulo ``2**width``; one register stage."""

    latency = 1

    def __init__(self, width=32):
        self.width = check_int("width", width, minimum=1, maximum=64)
        super().__init__({"carry": In(self.width), "x": In(self.width),
                          "carry_next": Out(self.width), "y": Out(self.width)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [self.carry_next.eq(self.carry + self.x), self.y.eq(self.carry)]
        return m


class FloatSumStep(wiring.Component):
    """A float running sum on the project's adder: ``fn(c, x) = (c + x, c + x)`` in ``format``,
    rounded once per step (:class:`~moe_hw.arith.fadd.FloatAdderCore`, ``stages`` deep:
    the latency)."""

    def __init__(self, format="fp32", stages=None):
        self.core = FloatAdderCore(format, stages)
        self.latency = self.core.latency
        width = self.core.format.width
        super().__init__({"carry": In(width), "x": In(width),
                          "carry_next": Out(width), "y": Out(width)})

    def elaborate(self, platform):
        m = Module()
        core = m.submodules.add = self.core
        m.d.comb += [core.a.eq(self.carry), core.b.eq(self.x), core.en.eq(1),
                     self.carry_next.eq(core.sum), self.y.eq(core.sum)]
        return m
