"""The properties each unit is checked against (``python -m moe_hw.formal``), and the small
generation parameters at which the checks run.

:data:`PROPERTIES` gives the :class:`~moe_hw.flows.formal.Property` list of each unit of the
registry and each shared block (``skid_buffer``, ``run_control``: :data:`BLOCKS`) that has a
harness; :data:`DEFAULTS` their formal generation parameters. The properties of a unit with
a run control (``start``, sizes, ``busy``, ``done``) share :class:`RunTracker`: the
harness's own copy of the sizes sampled at the start, the cycles since the start and the
cycle ``done`` is first seen.

Units with a memory read port (the combines, moe_re_routing) are checked under the port's
contract (:func:`memory_responds`: a response only for an outstanding request); their
``done_within`` puts a memory of latency 1 behind the port (a response exactly while a request
is outstanding) in place of the always-valid producer, which would break that contract.
Each property is built by :func:`run_property` from its conditions over a run; a bound that
is not a short Amaranth expression is the unit's own Python cycle formula, tabulated over the
small maxima (:func:`formula_table`).

Property names: ``<stream>_held`` (the stream protocol on an output), ``*_in_bounds`` (no
write or output outside the unit's range, for any header bit pattern and any run-time size),
``done_within`` (bounded liveness: with the consumer always ready and the producer always
valid, ``done`` rises within the unit's stall-free cycle formula plus :data:`MARGIN`),
``conservation`` (at ``done``, beats counted against the sizes and the inputs that pass the
mask), ``cover_*`` (a run reaching ``done`` through a given path), ``reset_quiet`` (in a
harness whose reset is a free input: from a reset until a start, nothing valid, busy and done
low).
"""

import dataclasses
import itertools

from amaranth.hdl import Assert, Assume, Cat, Const, Cover, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.utils import ceil_log2

from ..blocks.row_reader import last_enable_of
from ..blocks.run_control import EMPTY_CYCLES, RunControl
from ..golden.expand import BACKWARD_MODES
from ..params import ParameterError, check_int
from ..stream import SkidBuffer
from .formal import Property

__all__ = ["DEFAULTS", "BLOCKS", "PROPERTIES", "RunTracker", "MARGIN"]

#: Cycles of slack over a unit's exact stall-free cycle formula in ``done_within``.
MARGIN = 2


class RunTracker:
    """The harness's view of a run: ``accept`` (the start is taken: ``start`` while not
    ``busy``), ``size[name]`` (the size ports sampled then), ``waiting`` (from the cycle after
    ``accept`` until ``done`` is seen), ``cycles`` (cycles since ``accept``, which is cycle
    0; saturating), ``finished`` (``done`` seen for the first time after a start)."""

    def __init__(self, h, names, *, cycle_width=8):
        m, dut = h.m, h.dut
        self.accept = Signal(name="run_accept")
        m.d.comb += self.accept.eq(dut.start & ~dut.busy)
        self.size = {}
        for name in names:
            port = getattr(dut, name)
            self.size[name] = held = Signal.like(port, name=f"run_{name}")
            with m.If(self.accept):
                m.d.sync += held.eq(port)
        self.waiting = Signal(name="run_waiting")
        self.cycles = Signal(cycle_width, name="run_cycles")
        self.finished = Signal(name="run_finished")
        m.d.comb += self.finished.eq(self.waiting & dut.done)
        with m.If(self.accept):
            m.d.sync += [self.waiting.eq(1), self.cycles.eq(1)]
        with m.Else():
            with m.If(self.finished):
                m.d.sync += self.waiting.eq(0)
            with m.If(self.cycles != (1 << cycle_width) - 1):
                m.d.sync += self.cycles.eq(self.cycles + 1)

    def counter(self, h, event, name, width=8):
        """A count of ``event`` cycles since ``accept`` (the accept cycle's event not
        counted: no transfer happens in it)."""
        count = Signal(width, name=name)
        with h.m.If(self.accept):
            h.m.d.sync += count.eq(0)
        with h.m.Elif(event):
            h.m.d.sync += count.eq(count + 1)
        return count


def taken(channel):
    return channel.valid & channel.ready


def implies(condition, consequence):
    return ~condition | consequence


def run_property(name, names, conditions, depth, doc, kind="assert"):
    """A property of a run: ``conditions(h, run)`` (``run`` the :class:`RunTracker` of the
    size ports ``names``; it may add assumptions of its own) returns the values asserted
    (``kind`` ``"assert"``) or covered (``"cover"``) in every cycle."""
    statement = {"assert": Assert, "cover": Cover}[kind]

    def build(h):
        run = RunTracker(h, names)
        h.m.d.comb += [statement(condition) for condition in conditions(h, run)]
    return Property(name, kind, build, depth, doc)


def held_property(name, depth=12):
    """``<name>_held``: the stream protocol on the unit's output stream ``name``."""
    return Property(f"{name}_held", "assert",
                    lambda h: h.held(getattr(h.dut, name), Assert), depth,
                    f"{name}: once valid, valid and payload hold until ready")


#: The one-bit status outputs that must be low while a unit is idle after reset.
STATUS = ("busy", "done", "error", "held", "running", "begin", "decide")


def reset_quiet(depth, *, start=None, assume=None,
                doc="after a reset, until a start is taken: no output valid; busy, done and "
                    "error low"):
    """``reset_quiet`` (SPEC section 2, as tests/test_reset.py checks it in simulation): in
    a harness whose reset is a free input, from the cycle after a reset (and from the first
    cycle, the state reset leaves) until a start is taken, no output stream is valid and the
    status outputs of :data:`STATUS` the unit has (busy, done, error, ...) are low. The start
    is taken when ``start`` is high while not ``busy``; ``start(h)`` gives it for a unit
    without those ports (the skid buffer: an item taken in). ``assume(h)`` adds the unit's
    contract."""

    def build(h):
        dut, m = h.dut, h.m
        if assume is not None:
            assume(h)
        go = start(h) if start is not None else dut.start & ~dut.busy
        # Its ``init`` is 1, the value reset gives it.
        quiet = Signal(init=1, name="reset_quiet")
        with m.If(go):
            m.d.sync += quiet.eq(0)
        members = dut.signature.members
        still = [channel.valid for _, channel in h.streams(wiring.Out)]
        still += [getattr(dut, name) for name in STATUS
                  if name in members and members[name].flow == wiring.Out]
        m.d.comb += Assert(implies(quiet, ~Cat(*still).any()))

    return Property("reset_quiet", "assert", build, depth, doc, reset=True)


def always_flowing(h, memory=None):
    """The liveness assumptions: every input stream valid, every output stream ready; with
    ``memory`` (the names of a read port's request and response streams), the response
    stream is a memory of latency 1 (:func:`memory_responds` with ``answers``) instead."""
    response = memory[1] if memory else None
    if memory:
        memory_responds(h, *memory, answers=True)
    for name, channel in h.streams(wiring.In):
        if name != response:
            h.m.d.comb += Assume(channel.valid)
    for _, channel in h.streams(wiring.Out):
        h.m.d.comb += Assume(channel.ready)


def done_within(names, bound_of, depth, doc, memory=None):
    """``done_within``: with :func:`always_flowing` (and its ``memory``), ``done`` is seen at
    most ``bound_of(h, run) + MARGIN`` cycles after the start (``run`` the
    :class:`RunTracker`; the bound is the exact stall-free formula as an Amaranth value, or
    :func:`formula_table`'s)."""

    def conditions(h, run):
        always_flowing(h, memory)
        bound = bound_of(h, run) + MARGIN
        return [~(run.waiting & ~h.dut.done & (run.cycles >= bound))]
    return run_property("done_within", names, conditions, depth, doc)


def size_tuples(maxima):
    """Every tuple of run-time sizes up to ``maxima`` (name -> maximum, in order)."""
    return itertools.product(*(range(maximum + 1) for maximum in maxima.values()))


def formula_table(h, run, maxima, cycles):
    """The unit's own cycle formula as a table: ``cycles(*sizes)`` (Python) for every tuple of
    run-time sizes up to ``maxima`` (name -> maximum, in ``cycles``' argument order), chosen
    by the sizes ``run`` sampled; a size above its maximum gives ``EMPTY_CYCLES`` (such a
    run does nothing). (For the units whose formula is not a short Amaranth expression;
    small maxima keep the table small.)"""
    names = list(maxima)
    key = Cat(*(run.size[name] for name in names))
    bound = Signal(len(run.cycles), name="run_bound")
    h.m.d.comb += bound.eq(EMPTY_CYCLES)
    with h.m.Switch(key):
        for sizes in size_tuples(maxima):
            value = sum(size << offset for size, offset in
                        zip(sizes, itertools.accumulate((len(run.size[name]) for name in
                                                         names[:-1]), initial=0)))
            count = cycles(*sizes)
            if count >= (1 << len(run.cycles)) - 1:
                raise ParameterError(f"the cycle formula at {dict(zip(names, sizes))} is "
                                     f"{count}, past the tracker's {len(run.cycles)} bits")
            with h.m.Case(value):
                h.m.d.comb += bound.eq(count)
    return bound


def lanes_in_bounds(h, run, ports, limit):
    """The conditions of :func:`port_in_bounds` for the memory ports ``ports``."""
    for port in ports:
        channel = getattr(h.dut, port)
        for lane in range(len(channel.payload.enable)):
            yield implies(channel.valid & channel.payload.enable[lane],
                          h.dut.busy & (channel.payload.addr + lane < limit))


def port_in_bounds(ports, names, limit_of, depth, doc):
    """``<port>_in_bounds``: every enabled lane ``l`` of a beat on each memory port of
    ``ports`` (payload ``addr``, ``enable``) addresses ``addr + l < limit_of(run)`` (the run's
    sizes, sampled at its start), and the ports are used only while the unit is busy. (One
    property for a unit's ports: one solver run.)"""
    ports = (ports,) if isinstance(ports, str) else tuple(ports)
    name = ports[0] if len(ports) == 1 else "memory"
    return run_property(f"{name}_in_bounds", names,
                        lambda h, run: lanes_in_bounds(h, run, ports, limit_of(run)),
                        depth, doc)


def memory_responds(h, request, response, *, answers=False):
    """The memory port's contract: a response only for a request taken before it and not yet
    answered (responses in request order; their data is free). ``answers``: also a response
    whenever one is outstanding (a memory of latency 1 that never pauses: a request taken in
    cycle u is answered from cycle u + 1, the units' ``memory_latency`` 1)."""
    outstanding = Signal(8, name=f"{request}_outstanding")
    request, response = getattr(h.dut, request), getattr(h.dut, response)
    h.m.d.sync += outstanding.eq(outstanding + taken(request) - taken(response))
    h.m.d.comb += Assume(~response.valid | (outstanding != 0))
    if answers:
        h.m.d.comb += Assume(response.valid | (outstanding == 0))


# ---- the stream skid buffer ------------------------------------------------------------------

def _skid_properties(dut, settings):
    def occupancy(h):
        # Items in minus items out stays in 0..2; i.ready is low exactly when two are held;
        # o.valid is high exactly when one is. Returns the count.
        dut = h.dut
        inside = Signal(3, name="inside")
        h.m.d.sync += inside.eq(inside + taken(dut.i) - taken(dut.o))
        h.m.d.comb += [Assert(inside <= 2), Assert(dut.i.ready == (inside != 2)),
                       Assert(dut.o.valid == (inside != 0))]
        return inside

    def order(h):
        # A chosen item (the one that enters when the free input ``pick`` is first high)
        # leaves after exactly the items that entered before it, with its payload: nothing
        # is lost, duplicated or reordered. (With occupancy's statements, which the
        # induction needs.)
        dut = h.dut
        m = h.m
        inside = occupancy(h)
        pick = h.free(1, "pick")
        chosen = Signal(len(Value.cast(dut.i.payload)), name="chosen")
        armed, ahead = Signal(name="armed"), Signal(3, name="ahead")
        with m.If(~armed & pick & taken(dut.i)):
            m.d.sync += [armed.eq(1), chosen.eq(dut.i.payload),
                         ahead.eq(inside - taken(dut.o))]
        with m.Elif(armed & taken(dut.o)):
            m.d.sync += ahead.eq(ahead - 1)
        with m.If(armed & (ahead == 0) & taken(dut.o)):
            m.d.sync += armed.eq(0)
        m.d.comb += [Assert(~armed | (ahead < inside)),
                     Assert(~(armed & (ahead == 0) & dut.o.valid) |
                            (Value.cast(dut.o.payload) == chosen))]

    def full_throughput(h):
        dut = h.dut
        # With the consumer always ready, the input is never refused.
        h.m.d.comb += Assume(dut.o.ready)
        h.m.d.comb += Assert(dut.i.ready)

    def cover_full(h):
        dut = h.dut
        h.m.d.comb += Cover(~dut.i.ready & dut.o.valid)

    return [held_property("o"),
            Property("occupancy", "assert", occupancy, 6, "0..2 items held; ready low only "
                     "when full; o.valid iff an item is held"),
            Property("order", "assert", order, 8, "the items leave in order with their "
                     "payload (none lost or duplicated)"),
            Property("full_throughput", "assert", full_throughput, 6,
                     "consumer always ready: i.ready stays high"),
            Property("cover_full", "cover", cover_full, 8, "both entries held"),
            reset_quiet(6, start=lambda h: taken(h.dut.i),
                        doc="after a reset, until an item is taken in: o.valid and held low")]


# ---- the run control -------------------------------------------------------------------------

def _run_control_properties(dut, settings):
    names = list(dut.sizes)

    def contract(h):
        # The unit's contract: it raises ``finished`` only while running.
        h.m.d.comb += Assume(~h.dut.finished | h.dut.running)

    def track(h):
        contract(h)
        return RunTracker(h, names)

    def sizes_held(h):
        dut = h.dut
        # The held sizes are the ones sampled at the start, for the whole run.
        run = track(h)
        for name in names:
            h.m.d.comb += Assert(~(h.past_valid & (run.waiting | dut.busy)) |
                                 (dut.size(name) == run.size[name]))

    def done_rules(h):
        dut = h.dut
        # done and busy never together; done and error are cleared by a start; error only
        # for a size above its maximum or a fault while running; an empty or too-big run
        # is done EMPTY_CYCLES after the start; begin only for a run that is neither.
        run = track(h)
        m = h.m
        too_big = Value.cast(0)
        for name, maximum in dut.sizes.items():
            too_big = too_big | (run.size[name] > maximum)
        empty = Value.cast(0)
        for name in dut.empty_when_zero:
            empty = empty | (run.size[name] == 0)
        empty_also = Signal(name="run_empty_also")
        with m.If(run.accept):
            m.d.sync += empty_also.eq(dut.empty_also)
        fault_seen = Signal(name="fault_seen")
        with m.If(run.accept):
            m.d.sync += fault_seen.eq(0)
        with m.Elif(dut.fault & dut.running):
            m.d.sync += fault_seen.eq(1)
        m.d.comb += [
            Assert(~(dut.busy & dut.done)),
            Assert(~(run.waiting & ~dut.busy) | dut.done),
            Assert(~(run.waiting & (run.cycles == 1)) | (~dut.done & ~dut.error)),
            Assert(~(run.waiting & dut.error) | too_big | fault_seen),
            Assert(~dut.begin | ~(too_big | empty | empty_also)),
            Assert(~(run.waiting & (too_big | empty | empty_also) & (run.cycles >= 2)) |
                   (dut.done & (dut.error == too_big))),
        ]

    def cover_error(h):
        dut = h.dut
        run = track(h)
        h.m.d.comb += Cover(run.finished & dut.error)

    def cover_run(h):
        dut = h.dut
        run = track(h)
        h.m.d.comb += Cover(run.finished & ~dut.error & (run.cycles >= dut.start_latency + 2))

    return [Property("sizes_held", "assert", sizes_held, 8,
                     "the held sizes are the ones sampled at start, for the whole run"),
            Property("done_rules", "assert", done_rules, 8,
                     "busy/done exclusive; start clears done/error; error only when too big "
                     "or on a fault; empty and too-big runs done at cycle 2; no begin then"),
            Property("cover_error", "cover", cover_error, 8, "a too-big run ends in error"),
            Property("cover_run", "cover", cover_run, 10, "a run that begins ends in done"),
            reset_quiet(6, assume=contract,
                        doc="after a reset, until a start is taken: busy, done, error, "
                            "running, begin and decide low")]


# ---- dispatch --------------------------------------------------------------------------------

def _dispatch_properties(dut, settings):
    p = dut.params
    lanes_log2 = ceil_log2(p.lanes)
    sizes = dut.sizes

    def beats(run):
        return (run.size["hidden"] + (p.lanes - 1)) >> lanes_log2

    def passes(run, header):
        index, location = header.index, header.location
        return ((index >= 0) & (index < run.size["num_experts"]) &
                (location >= 0) & (location < run.size["capacity"]))

    def counts(h, run):
        dut = h.dut
        m = h.m
        header_taken = taken(dut.header)
        good = header_taken & passes(run, dut.header.payload)
        experts_hit = Signal(p.max_experts, name="experts_hit")
        with m.If(run.accept):
            m.d.sync += experts_hit.eq(0)
        with m.Elif(good):
            m.d.sync += experts_hit.eq(experts_hit | (1 << dut.header.payload.index.as_unsigned()))
        return (run.counter(h, header_taken, "headers_taken"),
                run.counter(h, good, "pairs_passed"),
                run.counter(h, taken(dut.write), "write_beats"), experts_hit)

    def conservation(h, run):
        headers, passed, writes, _ = counts(h, run)
        sizes_nonzero = ((run.size["hidden"] != 0) & (run.size["capacity"] != 0) &
                         (run.size["num_experts"] != 0))
        return [implies(run.finished, writes == passed * beats(run)),
                implies(run.finished & ~h.dut.error & sizes_nonzero,
                        h.dut.dropped == headers - passed)]

    def cover_drop(h, run):
        _, _, writes, _ = counts(h, run)
        return [run.finished & (h.dut.dropped != 0) & (writes != 0)]

    def cover_empty_expert(h, run):
        _, passed, writes, hit = counts(h, run)
        every = Signal(p.max_experts, name="every_expert")
        h.m.d.comb += every.eq((Const(1, p.max_experts + 1) << run.size["num_experts"]) - 1)
        return [run.finished & ~h.dut.error & (run.size["num_experts"] >= 2) &
                (writes != 0) & ((hit & every) != every)]

    # The longest stall-free run at the maxima, with the margin and the start: every check
    # goes at least this deep, so that it sees whole runs.
    run_depth = p.max_pairs * -(-p.max_hidden // p.lanes) + p.overhead + MARGIN + 2
    liveness = done_within(
        sizes, lambda h, run: run.size["pairs"] * beats(run) + p.overhead, run_depth,
        "consumer ready, producer valid: done within pairs*ceil(H/lanes) + overhead + 2")
    return [port_in_bounds("write", sizes,
                           lambda run: (run.size["num_experts"] * run.size["capacity"] *
                                        run.size["hidden"]), run_depth,
                           "every enabled lane's address in [0, E*C*H) of the run, only "
                           "while busy"),
            held_property("write", run_depth),
            liveness,
            run_property("conservation", sizes, conservation, run_depth,
                         "at done: write beats = passing pairs * ceil(H/lanes); dropped = "
                         "pairs failing the mask"),
            run_property("cover_drop", sizes, cover_drop, run_depth,
                         "done after a run with a write and a dropped pair", kind="cover"),
            run_property("cover_empty_expert", sizes, cover_empty_expert, run_depth,
                         "done after a run with writes where some expert got no pair",
                         kind="cover"),
            reset_quiet(run_depth)]


# ---- the units with a run control: what they share ------------------------------------------

def held_properties(dut, depth):
    """``<stream>_held`` for every output stream of ``dut``."""
    return [held_property(name, depth) for name, member in dut.signature.members.items()
            if member.is_signature and member.flow == wiring.Out]


def cover_done(names, depth, doc="a run that begins (neither empty nor too big) ends in done"):
    """``cover_done``: ``done`` after a run past the run control's decide cycle, no error."""
    return run_property("cover_done", names,
                        lambda h, run: [run.finished & ~h.dut.error & (run.cycles > EMPTY_CYCLES)],
                        depth, doc, kind="cover")


def row_count(run, name, lanes):
    """``ceil(size / lanes)`` of the run's size ``name``: the beats of a row of that many
    elements."""
    return (run.size[name] + (lanes - 1)) >> ceil_log2(lanes)


# ---- locations -------------------------------------------------------------------------------

def _locations_properties(dut, settings):
    p = dut.params

    def in_range(h, run):
        # A location is -1 (index out of range) or a count of earlier pairs, below the run's
        # pair count; an expert's count is at most the pair count.
        dut = h.dut
        location = dut.location.payload.location
        pairs = run.size["pairs"]
        return [implies(dut.location.valid,
                        dut.busy & ((location == -1) | ((location >= 0) & (location < pairs)))),
                implies(dut.counts.valid, dut.busy & (dut.counts.payload.count <= pairs))]

    def conservation(h, run):
        # At done: one location per pair, one count per expert, the counts sum to the
        # routed pairs, and dropped counts the routed pairs at or past the capacity.
        dut = h.dut
        index = dut.index.payload.index
        routed = taken(dut.index) & (index >= 0) & (index < run.size["num_experts"])
        locations = run.counter(h, taken(dut.location), "location_beats")
        counts = run.counter(h, taken(dut.counts), "count_beats")
        routed_pairs = run.counter(h, routed, "routed_pairs")
        total = Signal(8, name="count_total")
        with h.m.If(run.accept):
            h.m.d.sync += total.eq(0)
        with h.m.Elif(taken(dut.counts)):
            h.m.d.sync += total.eq(total + dut.counts.payload.count)
        past_capacity = run.counter(
            h, taken(dut.location) & (dut.location.payload.location >= run.size["capacity"]),
            "past_capacity")
        ran = run.finished & ~dut.error
        return [implies(ran, (locations == run.size["pairs"]) &
                        (counts == run.size["num_experts"]) & (total == routed_pairs)),
                implies(ran, dut.dropped == past_capacity)]

    run_depth = p.max_pairs + p.max_experts + p.overhead + MARGIN + 2
    return [run_property("location_in_range", p.sizes, in_range, run_depth,
                         "location -1 or in [0, pairs); count <= pairs; only while busy"),
            *held_properties(dut, run_depth),
            done_within(p.sizes, lambda h, run: run.size["pairs"] + run.size["num_experts"] +
                        p.overhead, run_depth,
                        f"consumer ready, producer valid: done within pairs + E + {p.overhead} "
                        "+ 2"),
            run_property("conservation", p.sizes, conservation, run_depth,
                         "at done: a location per pair, a count per expert, counts sum to the "
                         "routed pairs, dropped = locations >= capacity"),
            cover_done(p.sizes, run_depth),
            run_property("cover_drop", p.sizes,
                         lambda h, run: [run.finished & ~h.dut.error & (h.dut.dropped != 0)],
                         run_depth, "done after a run with a pair past the capacity",
                         kind="cover"),
            reset_quiet(run_depth)]


# ---- sparse_index ----------------------------------------------------------------------------

def _sparse_index_properties(dut, settings):
    p = dut.params

    def in_bounds(h, run):
        # A slot is below the routed-gate count of pass 1 (whatever pass 3's rows hold) and
        # below S*E; writes only while busy.
        dut = h.dut
        addr = dut.write.payload.addr
        return [implies(dut.write.valid,
                        dut.busy & (addr < dut.nonzeros) &
                        (addr < run.size["tokens"] * run.size["num_experts"]))]

    beats = -(-p.max_experts // p.lanes)
    # Pass 3 takes at most ``lanes`` cycles a beat.
    run_depth = (p.max_tokens * beats * (1 + p.lanes) + p.max_experts + p.passes_overhead +
                 MARGIN + 2)

    def bound(h, run):
        return (run.size["tokens"] * row_count(run, "num_experts", p.lanes) * (1 + p.lanes) +
                run.size["num_experts"] + p.passes_overhead)

    return [run_property("write_in_bounds", p.sizes, in_bounds, run_depth,
                         "every slot below nonzeros (pass 1's count) and S*E; only while busy"),
            *held_properties(dut, run_depth),
            done_within(p.sizes, bound, run_depth,
                        "consumer ready, producer valid: done within the cycle formula with "
                        "every beat's place cycles at lanes, + 2"),
            cover_done(p.sizes, run_depth),
            reset_quiet(run_depth)]


# ---- the combines ----------------------------------------------------------------------------

def _with_memory(prop, request, response):
    """``prop`` under the memory port's contract (:func:`memory_responds`)."""
    def build(h):
        memory_responds(h, request, response)
        prop.build(h)
    return dataclasses.replace(prop, build=build)


def _with_memory_checks(props, memory, sizes, cycles, depth, liveness_doc):
    """The checks of a unit with a memory read port ``memory`` (request, response): ``props``
    under the port's contract, and ``done_within`` with a memory of latency 1 behind it,
    bounded by the unit's cycle formula ``cycles`` over ``sizes`` (:func:`formula_table`)."""
    return [*(_with_memory(prop, *memory) for prop in props),
            done_within(sizes, lambda h, run: formula_table(h, run, sizes, cycles), depth,
                        liveness_doc, memory=memory)]


def _combine_scatter_properties(dut, settings):
    p = dut.params
    sizes = dut.sizes
    memory = ("read", "read_data")

    def limit(run):
        return run.size["tokens"] * run.size["hidden"]

    def worst_cycles(tokens, slots, hidden):
        # The slowest stall-free run of these sizes over every slot order (each slot's
        # token in range, the same as another's, or dropped): the unit's replay of its
        # issue schedule, with a memory of latency 1.
        if tokens == 0 or slots == 0 or hidden == 0:
            return EMPTY_CYCLES
        choices = [None, *range(tokens)]
        return max(p.replay_cycles(list(order), hidden, 1)
                   for order in itertools.product(choices, repeat=slots))

    def conservation(h, run):
        # At done: every slot's header taken; reads and writes = ceil(H/lanes) per slot
        # whose token is in [0, S); dropped = the other slots.
        dut = h.dut
        token = dut.header.payload.token
        passing = taken(dut.header) & (token >= 0) & (token < run.size["tokens"])
        headers = run.counter(h, taken(dut.header), "headers_taken")
        passed = run.counter(h, passing, "slots_passed")
        reads = run.counter(h, taken(dut.read), "read_beats")
        writes = run.counter(h, taken(dut.write), "write_beats")
        ran = run.finished & ~dut.error & (run.size["tokens"] != 0) & (run.size["hidden"] != 0)
        beats = row_count(run, "hidden", p.lanes)
        return [implies(ran, (headers == run.size["slots"]) & (reads == passed * beats) &
                        (writes == passed * beats) & (dut.dropped == headers - passed)),
                implies(run.finished & dut.error, (reads == 0) & (writes == 0))]

    run_depth = max(worst_cycles(*values) for values in size_tuples(sizes)) + MARGIN + 2
    props = [port_in_bounds(("read", "write"), sizes, limit, run_depth,
                            "every enabled lane's read and write in [0, S*H) of the run, only "
                            "while busy"),
             *held_properties(dut, run_depth),
             run_property("conservation", sizes, conservation, run_depth,
                          "at done: a header per slot; reads = writes = ceil(H/lanes) per "
                          "slot whose token is in [0, S); dropped = the others"),
             cover_done(sizes, run_depth),
             reset_quiet(run_depth)]
    return _with_memory_checks(props, memory, sizes, worst_cycles, run_depth,
                               "consumer ready, producer valid, memory latency 1: done within "
                               "the slowest slot order's replayed cycles + 2")


def _combine_gather_properties(dut, settings):
    p = dut.params
    sizes = dut.sizes
    memory = ("read_request", "read_response")
    run_depth = (p.schedule_cycles(p.max_tokens, p.max_hidden, p.max_top_k) + p.overhead(1) +
                 MARGIN + 2)

    def limit(run):
        return run.size["num_experts"] * run.size["capacity"] * run.size["hidden"]

    def conservation(h, run):
        # At done: a header per token, ceil(H/lanes) data beats per token, ceil(H/lanes) read
        # beats per pair (k < top_k) that passes the mask; dropped = the pairs that fail it.
        dut = h.dut
        header = dut.header.payload
        valid = Value.cast(0)
        considered = Value.cast(0)
        for k in range(p.max_top_k):
            active = run.size["top_k"] > k
            good = (active & (header.index[k] >= 0) &
                    (header.index[k] < run.size["num_experts"]) &
                    (header.location[k] >= 0) & (header.location[k] < run.size["capacity"]))
            valid = valid + good
            considered = considered + active
        beat = taken(dut.header)
        headers = run.counter(h, beat, "headers_taken")
        valid_pairs = Signal(8, name="valid_pairs")
        all_pairs = Signal(8, name="all_pairs")
        with h.m.If(run.accept):
            h.m.d.sync += [valid_pairs.eq(0), all_pairs.eq(0)]
        with h.m.Elif(beat):
            h.m.d.sync += [valid_pairs.eq(valid_pairs + valid),
                           all_pairs.eq(all_pairs + considered)]
        reads = run.counter(h, taken(dut.read_request), "read_beats")
        outs = run.counter(h, taken(dut.data), "data_beats")
        beats = row_count(run, "hidden", p.lanes)
        ran = run.finished & ~dut.error & (run.size["tokens"] != 0) & (run.size["hidden"] != 0)
        return [implies(ran, (headers == run.size["tokens"]) &
                        (outs == run.size["tokens"] * beats) &
                        (reads == valid_pairs * beats) &
                        (dut.dropped == all_pairs - valid_pairs)),
                implies(run.finished & dut.error, (reads == 0) & (outs == 0))]

    def cycles(tokens, hidden, top_k, capacity, num_experts):
        return p.cycles(tokens, hidden, top_k, 1)

    props = [port_in_bounds("read_request", sizes, limit, run_depth,
                            "every enabled lane's read in [0, E*C*H) of the run, only while "
                            "busy"),
             *held_properties(dut, run_depth),
             run_property("conservation", sizes, conservation, run_depth,
                          "at done: a header and ceil(H/lanes) data beats per token, "
                          "ceil(H/lanes) reads per pair passing the mask; dropped = the rest"),
             cover_done(sizes, run_depth),
             reset_quiet(run_depth)]
    return _with_memory_checks(props, memory, sizes, cycles, run_depth,
                               "consumer ready, producer valid, memory latency 1: done within "
                               "the cycle formula + 2")


# ---- moe_re_routing --------------------------------------------------------------------------

def _moe_re_routing_properties(dut, settings):
    p = dut.params
    sizes = p.sizes
    memory = ("read_request", "read_response")

    def in_bounds(h, run):
        # Every token read and write inside the A rows of H elements; every per-token write's
        # row, index address and index below A; all only while busy.
        dut = h.dut
        tokens = run.size["tokens"]
        yield from lanes_in_bounds(h, run, ("read_request", "write"),
                                   tokens * run.size["hidden"])
        row = dut.row_write.payload
        yield implies(dut.row_write.valid, dut.busy & (row.row < tokens) &
                      (row.idx_addr < tokens) & (row.idx < tokens))

    def cycles(tokens, hidden, num_ranks, num_experts):
        # Valid counts move the tokens (the longer run); the counts are free inputs.
        return max(p.cycles(tokens, hidden, num_ranks, num_experts, 1, valid=valid)
                   for valid in (True, False))

    def counts(h, run):
        dut = h.dut
        return {name: run.counter(h, taken(getattr(dut, name)), f"{name}_beats")
                for name in ("counts", "expert_token_num", "read_request", "write",
                             "row_write")}

    def conservation(h, run):
        # At done, a run that is neither empty nor refused: N*E counts taken, E
        # expert_token_num beats, A*ceil(H/lanes) reads and writes, A per-token writes. A
        # refused run (a size too big, counts that are negative, too big, not summing to A,
        # too many blocks; H = 0 with A > 0) reads and writes nothing.
        dut = h.dut
        beats = counts(h, run)
        row_beats = row_count(run, "hidden", p.lanes)
        tokens = run.size["tokens"]
        ran = run.finished & ~dut.error & (run.size["num_experts"] != 0)
        return [implies(ran, (beats["counts"] == run.size["num_ranks"] *
                              run.size["num_experts"]) &
                        (beats["expert_token_num"] == run.size["num_experts"]) &
                        (beats["read_request"] == tokens * row_beats) &
                        (beats["write"] == tokens * row_beats) &
                        (beats["row_write"] == tokens)),
                implies(run.finished & dut.error,
                        (beats["read_request"] == 0) & (beats["write"] == 0) &
                        (beats["row_write"] == 0))]

    def cover_move(h, run):
        beats = counts(h, run)
        return [run.finished & ~h.dut.error & (run.size["num_ranks"] >= 2) &
                (beats["row_write"] >= 2)]

    run_depth = cycles(*sizes.values()) + MARGIN + 2
    props = [run_property("memory_in_bounds", sizes, in_bounds, run_depth,
                          "every enabled lane's read and write in [0, A*H); every per-token "
                          "row, index address and index below A; only while busy"),
             *held_properties(dut, run_depth),
             run_property("conservation", sizes, conservation, run_depth,
                          "at done: N*E counts, E expert_token_num beats, A*ceil(H/lanes) "
                          "reads and writes, A per-token writes; none for a refused run"),
             cover_done(sizes, run_depth),
             run_property("cover_move", sizes, cover_move, run_depth,
                          "done after a run that moved tokens from two ranks", kind="cover"),
             reset_quiet(run_depth)]
    return _with_memory_checks(props, memory, sizes, cycles, run_depth,
                               "consumer ready, producer valid, memory latency 1: done within "
                               "the cycle formula (a move's) + 2")


# ---- expand and expand_backward --------------------------------------------------------------

def _stream_unit_properties(dut, *, output, out_size, inputs, cycles, liveness_doc):
    """The checks of a unit that takes a plan and a data stream and sends one output stream
    of ``ceil(out_size/lanes)`` beats (expand, expand_backward): ``inputs`` maps each input
    stream to its beats in a run (``beats(run)``); ``cycles`` is the unit's cycle formula
    over its sizes (in port order)."""
    p = dut.params
    sizes = dut.sizes
    if getattr(p, "parts", 1) != 1:
        raise ParameterError(f"parts must be 1 for the formal checks, not {p.parts}")

    def beats_of(h, run):
        dut = h.dut
        return {name: run.counter(h, taken(getattr(dut, name)), f"{name}_beats")
                for name in (*inputs, output)}

    def in_bounds(h, run):
        # Output beat n (counted from the start) only while busy and n < ceil(size/lanes);
        # ``last`` exactly on the final beat; every lane enabled but on the final beat, which
        # enables exactly the lanes below the size's remainder: no element outside the output.
        dut = h.dut
        out = getattr(dut, output)
        sent = beats_of(h, run)[output]
        total = row_count(run, out_size, p.lanes)
        final = sent == total - 1
        enable = Mux(final, last_enable_of(run.size[out_size], p.lanes), (1 << p.lanes) - 1)
        return [implies(out.valid, dut.busy & (sent < total) &
                        (out.payload.last == final) & (out.payload.enable == enable))]

    def conservation(h, run):
        # At done: each input's beats and ceil(size/lanes) output beats; an empty (no output
        # elements) or refused run takes and sends nothing.
        dut = h.dut
        beats = beats_of(h, run)
        ran = run.finished & ~dut.error & (run.size["output_elements"] != 0)
        expected = {name: beats(run) for name, beats in inputs.items()}
        expected[output] = row_count(run, out_size, p.lanes)
        return [implies(ran, Cat(*(beats[name] == value
                                   for name, value in expected.items())).all()),
                implies(run.finished & ~ran, Cat(*(beats[name] == 0
                                                   for name in expected)).all())]

    run_depth = max(cycles(*values) for values in size_tuples(sizes)) + MARGIN + 2
    listed = ", ".join(f"{name}'s beats" for name in inputs)
    return [run_property(f"{output}_in_bounds", sizes, in_bounds, run_depth,
                         f"{output} beats only while busy, fewer than ceil({out_size}/lanes); "
                         f"last on the final one, whose enables stop at {out_size}"),
            *held_properties(dut, run_depth),
            done_within(sizes, lambda h, run: formula_table(h, run, sizes, cycles),
                        run_depth, liveness_doc),
            run_property("conservation", sizes, conservation, run_depth,
                         f"at done: {listed}, ceil({out_size}/lanes) out; nothing for an "
                         "empty or refused run"),
            cover_done(sizes, run_depth),
            reset_quiet(run_depth)]


def _expand_properties(dut, settings):
    p = dut.params
    return _stream_unit_properties(
        dut, output="output", out_size="output_elements",
        inputs={"plan": lambda run: p.plan_beats,
                "input_data": lambda run: row_count(run, "input_elements", p.lanes)},
        cycles=p.cycles, liveness_doc="consumer ready, producer valid: done within plan + "
        "ceil(n_in/lanes) + ceil(n_out/lanes) + overhead + 2")


def _expand_backward_properties(dut, settings):
    p = dut.params

    def cycles(input_elements, output_elements, mode):
        return p.cycles(input_elements, output_elements, BACKWARD_MODES[mode])

    return _stream_unit_properties(
        dut, output="input_grad", out_size="input_elements",
        inputs={"plan": lambda run: p.plan_beats,
                "grad_output": lambda run: row_count(run, "output_elements", p.lanes)},
        cycles=cycles, liveness_doc="consumer ready, producer valid: done within the cycle "
        "formula (plan, items, flush, drain, overhead) + 2")


# ---- the targets -----------------------------------------------------------------------------

def _block_settings(settings, known):
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ParameterError(f"unknown parameter {unknown[0]!r}; the parameters are "
                             f"{', '.join(known)}")
    return {**known, **settings}


def _make_skid(settings):
    """The skid buffer: ``width`` payload bits; with ``groups`` > 0, an alternate field of
    ``width`` bits (the two registers written in turn) beside a held bit, in that many groups
    with their own pointer and flag copies (``group_flags``: the output queues' form)."""
    values = _block_settings(settings, DEFAULTS["skid_buffer"])
    width = check_int("width", values["width"], minimum=1, maximum=64)
    groups = check_int("groups", values["groups"], minimum=0, maximum=width)
    if not groups:
        return SkidBuffer(width)
    return SkidBuffer(data.StructLayout({"data": width, "tag": 1}), alternate=("data",),
                      group_bits=-(-width // groups), group_flags=True)


def _make_run_control(settings):
    values = _block_settings(settings, DEFAULTS["run_control"])
    maximum = check_int("max_size", values["max_size"], minimum=1, maximum=1 << 16)
    setup = check_int("setup", values["setup"], minimum=1, maximum=8)
    return RunControl({"rows": maximum, "cols": maximum}, empty_when_zero=("rows",),
                      setup=setup)


#: The generation parameters the checks run at, by unit or block (``--set`` overrides).
DEFAULTS = {
    "skid_buffer": {"width": 4, "groups": 0},
    "run_control": {"max_size": 5, "setup": 2},
    "dispatch": {"format": "bf16", "lanes": 2, "max_pairs": 2, "max_hidden": 4,
                 "max_capacity": 2, "max_experts": 2, "index_width": 4, "mul_stages": 1},
    "locations": {"max_pairs": 4, "max_experts": 3, "max_capacity": 2, "index_width": 4},
    "sparse_index": {"format": "bf16", "lanes": 2, "max_tokens": 2, "max_experts": 2},
    # The combines' multiply-add datapaths make each step slow: one beat per row.
    "combine_scatter": {"format": "bf16", "lanes": 2, "max_tokens": 2, "max_slots": 2,
                        "max_hidden": 2, "index_width": 3, "max_outstanding": 8,
                        "mul_stages": 1, "add_stages": 1},
    "combine_gather": {"format": "bf16", "lanes": 2, "max_tokens": 2, "max_hidden": 2,
                       "max_capacity": 2, "max_experts": 2, "max_top_k": 1, "index_width": 3,
                       "mul_stages": 1, "add_stages": 1},
    "moe_re_routing": {"format": "int8", "lanes": 2, "max_tokens": 2, "max_hidden": 2,
                       "max_ranks": 2, "max_experts": 2, "max_blocks": 4,
                       "count_type": "int32", "scales": True, "max_outstanding": 4},
    "expand": {"format": "int8", "lanes": 2, "max_rank": 2, "max_input": 4, "max_output": 6},
    # The float adders (lane tree, accumulators, drain pre-adders) make each step slow.
    "expand_backward": {"format": "bf16", "lanes": 2, "max_rank": 2, "max_input": 4,
                        "max_output": 4, "add_stages": 1},
}

#: The shared blocks checked on their own: name -> ``make(settings)``, the component.
BLOCKS = {"skid_buffer": _make_skid, "run_control": _make_run_control}

#: The property lists by unit or block, in checking order: name -> ``properties(component,
#: settings)``.
PROPERTIES = {
    "skid_buffer": _skid_properties,
    "run_control": _run_control_properties,
    "dispatch": _dispatch_properties,
    "locations": _locations_properties,
    "sparse_index": _sparse_index_properties,
    "combine_scatter": _combine_scatter_properties,
    "combine_gather": _combine_gather_properties,
    "moe_re_routing": _moe_re_routing_properties,
    "expand": _expand_properties,
    "expand_backward": _expand_backward_properties,
}
