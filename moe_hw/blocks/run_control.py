"""The run control every unit shares: ``start``, the run-time sizes, ``busy``, ``done`` and
``error``, and the start latch.

A unit puts :func:`run_ports` into its signature (so its ports keep their names:
``start``, one port per size, ``busy``, ``done``, ``error``), instantiates
:class:`RunControl` and wires it with :meth:`RunControl.connect`. The protocol, the same for
every unit, counted in cycles from the start cycle (cycle 0):

* Cycle 0 (``accept``: ``start`` high while idle): the sizes are sampled into ``size[name]``
  and the checks of each size are registered (``> maximum``; ``== 0`` for the names in
  ``empty_when_zero``; the unit's ``empty_also``). The unit may load its own run registers
  from the ports in this cycle.
* Cycle 1 (``decide``): ``too_big`` and ``empty`` are valid. A size above its
  generation-time maximum sets ``error`` and ``done`` (visible in cycle 2): the run does
  nothing. An empty run sets ``done`` without reading or writing anything.
* Otherwise the unit prepares for ``setup`` cycles (cycles 1 .. setup, from the held sizes:
  for example a pipelined product), ``begin`` pulses in cycle ``setup`` and ``running``
  (= ``busy``) is high from cycle ``setup + 1`` (:attr:`RunControl.start_latency`). The unit
  raises ``finished`` when its last output has left, and ``done`` rises one cycle later and
  stays high until the next start.

Every decision is taken from registers (the held sizes and the registered checks), never
from the ports in the start cycle: the start-to-done path is then two short stages, not one
long one. An empty or too-big run therefore takes :data:`EMPTY_CYCLES` cycles from start to
``done``.
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["run_ports", "RunControl", "EMPTY_CYCLES", "START_LATENCY"]

#: Cycles from the start cycle to the first ``running`` cycle with the default ``setup`` of
#: 1: the start cycle and the decide cycle (:attr:`RunControl.start_latency` in general).
START_LATENCY = 2

#: Cycles from the start cycle to the cycle ``done`` is first seen, for a run that does
#: nothing (too big or empty).
EMPTY_CYCLES = 2


def run_ports(sizes):
    """The run-control members of a unit's signature: ``start``, the sizes
    (``{name: maximum}``, in port order), ``busy``, ``done``, ``error``."""
    return {"start": In(1), **{name: In(range(maximum + 1)) for name, maximum in sizes.items()},
            "busy": Out(1), "done": Out(1), "error": Out(1)}


class RunControl(wiring.Component):
    """Start latch, size checks and done/error for a unit; see the module docstring.

    ``sizes``: ``{name: maximum}``. ``empty_when_zero``: the names whose zero makes the run
    empty. ``setup``: the cycles from ``decide`` to ``begin`` plus one (at least 1). Inputs
    for a unit's own rules: ``empty_also`` (sampled at ``accept``) joins the empty condition
    (e.g. ``k == 0``); ``fault`` (a pulse while running) sets ``error``, which then holds
    until the next start (e.g. a hostile value found in the data).

    Outputs for the unit: ``accept`` (start taken this cycle), ``decide`` (the cycle after),
    ``too_big`` and ``empty`` (valid in the ``decide`` cycle), ``begin`` (the run will go:
    not too big, not empty; ``setup`` cycles after ``accept``), ``running``, ``stopped``
    (``~running``, a register of its own: held inverted, so that Yosys keeps it apart, for
    a unit's input far from the control whose handshake the run flag's net would reach),
    and the held ``size_<name>`` (from the cycle after ``accept``).
    """

    def __init__(self, sizes, *, empty_when_zero=(), setup=1):
        self.sizes = dict(sizes)
        self.empty_when_zero = tuple(empty_when_zero)
        if not isinstance(setup, int) or setup < 1:
            raise ValueError(f"setup must be an integer of at least 1, not {setup!r}")
        self.setup = setup
        for name in self.empty_when_zero:
            if name not in self.sizes:
                raise ValueError(f"empty_when_zero names {name!r}, which is not a size")
        members = {"start": In(1), "finished": In(1), "empty_also": In(1), "fault": In(1),
                   "accept": Out(1), "decide": Out(1), "begin": Out(1), "running": Out(1),
                   "stopped": Out(1, init=1),
                   "too_big": Out(1), "empty": Out(1),
                   "busy": Out(1), "done": Out(1), "error": Out(1)}
        for name, maximum in self.sizes.items():
            members[name] = In(range(maximum + 1))
            members[f"size_{name}"] = Out(range(maximum + 1))
        super().__init__(members)

    @property
    def start_latency(self):
        """Cycles from the start cycle to the first ``running`` cycle."""
        return self.setup + 1

    def size(self, name):
        """The held run-time size ``name``."""
        return getattr(self, f"size_{name}")

    def connect(self, m, unit):
        """Wire the unit's run-control ports (``run_ports``) to this block."""
        m.d.comb += [self.start.eq(unit.start), unit.busy.eq(self.busy),
                     unit.done.eq(self.done), unit.error.eq(self.error)]
        m.d.comb += [getattr(self, name).eq(getattr(unit, name)) for name in self.sizes]

    def elaborate(self, platform):
        m = Module()
        running = Signal()
        deciding = Signal()
        preparing = Signal()
        too_big = {name: getattr(self, name) > maximum for name, maximum in self.sizes.items()}
        empty = {name: getattr(self, name) == 0 for name in self.empty_when_zero}
        too_big_flags = Signal(len(too_big))
        empty_flags = Signal(len(empty) + 1)
        # ``idle`` (neither deciding, preparing nor running) is a register of its own, so that
        # ``accept``, which fans out to the clock enables of every register a unit loads at
        # the start, is one gate of the start port and a register.
        idle = Signal(init=1)
        m.d.comb += [
            self.accept.eq(self.start & idle),
            self.decide.eq(deciding),
            self.too_big.eq(too_big_flags.any()),
            self.empty.eq(empty_flags.any()),
            self.running.eq(running),
            self.busy.eq(~idle),
        ]
        # The checks are registered in every cycle, not only at ``accept``: in the decide
        # cycle they hold the checks of the sizes at the start. ``clear`` (neither too big nor
        # empty) is one flag per size (its checks ORed) and one for ``empty_also``, so that
        # the start-time path is the checks of one size, and ``begin`` one gate of
        # ``deciding`` and a few flags (a single registered flag for the whole OR was the
        # critical path of dispatch and re-routing: every size's compares in one cycle).
        bad = [too_big[name] | empty[name] if name in empty else too_big[name]
               for name in self.sizes]
        bad_flags = Signal(len(bad) + 1)
        m.d.sync += [too_big_flags.eq(Cat(*too_big.values())),
                     empty_flags.eq(Cat(*empty.values(), self.empty_also)),
                     bad_flags.eq(Cat(*bad, self.empty_also))]
        go = deciding & ~bad_flags.any()
        m.d.sync += deciding.eq(self.accept)
        with m.If(self.accept):
            m.d.sync += [self.size(name).eq(getattr(self, name)) for name in self.sizes]
            m.d.sync += [self.done.eq(0), self.error.eq(0)]
        with m.If(deciding):
            with m.If(self.too_big):
                m.d.sync += [self.error.eq(1), self.done.eq(1)]
            with m.Elif(self.empty):
                m.d.sync += self.done.eq(1)
        if self.setup == 1:
            m.d.comb += self.begin.eq(go)
            preparing_next = 0
        else:
            left = Signal(range(self.setup), name="setup_left")
            with m.If(go):
                m.d.sync += [preparing.eq(1), left.eq(self.setup - 2)]
            with m.If(preparing):
                m.d.sync += left.eq(left - 1)
                with m.If(left == 0):
                    m.d.sync += preparing.eq(0)
            # begin (preparing & left == 0) as a register, decided a cycle ahead (from go when
            # the setup is 2 cycles, else from left == 1), so that the units' start logic
            # starts at a flop (the setup count's compare in front of it was the critical
            # path of dispatch_backward_gate: setup_left -> round_beat's reset, 216.1 MHz).
            m.d.sync += self.begin.eq((go if self.setup == 2 else 0) | (preparing & (left == 1)))
            preparing_next = go | (preparing & (left != 0))
        with m.If(self.begin):
            m.d.sync += running.eq(1)
        running_next = (running | self.begin) & ~self.finished
        m.d.sync += self.stopped.eq(~running_next)
        with m.If(self.fault & running):
            m.d.sync += self.error.eq(1)
        with m.If(self.finished):
            m.d.sync += [running.eq(0), self.done.eq(1)]
        m.d.sync += idle.eq(~(self.accept | preparing_next | running_next))
        return m
