"""The run control every unit shares: ``start``, the run-time sizes, ``busy``, ``done`` and
``error``, and the start latch.

A unit puts :func:`run_ports` into its signature (so its ports keep their names:
``start``, one port per size, ``busy``, ``done``, ``error``), instantiates
:class:`RunControl` and wires it with :meth:`RunControl.connect`. The protocol, the same for
every unit:

* The sizes are sampled in the cycle ``start`` is high while the unit is idle (``accept``).
* A size above its generation-time maximum sets ``error`` and ``done`` one cycle later: the
  run does nothing (``too_big``).
* A size whose zero means "nothing to do" (``empty_when_zero``) sets ``done`` one cycle later
  without reading or writing anything (``empty``); the unit may add its own empty conditions.
* Otherwise ``running`` (= ``busy``) rises; the unit raises ``finished`` when its last output
  has left, and ``done`` rises one cycle later and stays high until the next start.
* The held sizes are ``size[name]`` (registers loaded at ``accept``).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["run_ports", "RunControl"]


def run_ports(sizes):
    """The run-control members of a unit's signature: ``start``, the sizes
    (``{name: maximum}``, in port order), ``busy``, ``done``, ``error``."""
    return {"start": In(1), **{name: In(range(maximum + 1)) for name, maximum in sizes.items()},
            "busy": Out(1), "done": Out(1), "error": Out(1)}


class RunControl(wiring.Component):
    """Start latch, size checks and done/error for a unit; see the module docstring.

    ``sizes``: ``{name: maximum}``. ``empty_when_zero``: the names whose zero makes the run
    empty. Inputs for a unit's own rules: ``empty_also`` joins the empty condition (e.g.
    ``k == 0``); ``fault`` (a pulse while running) sets ``error``, which then holds until the
    next start (e.g. a hostile value found in the data).

    Outputs for the unit: ``accept`` (start taken this cycle), ``begin`` (``accept`` and the
    run will go: not too big, not empty), ``running``, ``too_big``, ``empty`` (combinational,
    for the ``accept`` cycle), and the held ``size_<name>``.
    """

    def __init__(self, sizes, *, empty_when_zero=()):
        self.sizes = dict(sizes)
        self.empty_when_zero = tuple(empty_when_zero)
        for name in self.empty_when_zero:
            if name not in self.sizes:
                raise ValueError(f"empty_when_zero names {name!r}, which is not a size")
        members = {"start": In(1), "finished": In(1), "empty_also": In(1), "fault": In(1),
                   "accept": Out(1), "begin": Out(1), "running": Out(1),
                   "too_big": Out(1), "empty": Out(1),
                   "busy": Out(1), "done": Out(1), "error": Out(1)}
        for name, maximum in self.sizes.items():
            members[name] = In(range(maximum + 1))
            members[f"size_{name}"] = Out(range(maximum + 1))
        super().__init__(members)

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
        too_big = 0
        for name, maximum in self.sizes.items():
            too_big = too_big | (getattr(self, name) > maximum)
        empty = self.empty_also
        for name in self.empty_when_zero:
            empty = empty | (getattr(self, name) == 0)
        m.d.comb += [
            self.accept.eq(self.start & ~running),
            self.too_big.eq(too_big),
            self.empty.eq(empty),
            self.begin.eq(self.accept & ~too_big & ~empty),
            self.running.eq(running),
            self.busy.eq(running),
        ]
        with m.If(self.accept):
            m.d.sync += [self.size(name).eq(getattr(self, name)) for name in self.sizes]
            m.d.sync += [self.done.eq(0), self.error.eq(0)]
            with m.If(too_big):
                m.d.sync += [self.error.eq(1), self.done.eq(1)]
            with m.Elif(empty):
                m.d.sync += self.done.eq(1)
            with m.Else():
                m.d.sync += running.eq(1)
        with m.If(self.fault & running):
            m.d.sync += self.error.eq(1)
        with m.If(self.finished):
            m.d.sync += [running.eq(0), self.done.eq(1)]
        return m
