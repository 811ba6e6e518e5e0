"""The small shared cocotb harness: run files, payload packing, stream source and sink with
seeded pause generators, clock/reset, and the cycle loop.

All actors are stepped from ONE loop, right after each rising edge: ``step()`` first samples
the handshake that happened at that edge (the values seen are the ones that were stable during
the cycle before it), then drives the values for the next cycle. One ``await`` per clock keeps
the Python overhead per cycle small, so benches of a million beats stay practical.
"""

import json
import os
from pathlib import Path

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, Timer

__all__ = ["Run", "Layout", "Pauses", "StreamSource", "StreamSink", "MemoryReader", "MemoryWriter",
           "reset", "edge", "run_until", "run_once", "reset_mid_problem",
           "high", "pack_lanes", "unpack_lanes"]


class Run:
    """The files of one simulation run: stimulus, manifest (ports, settings), results."""

    #: The run of the bench being simulated (the harness's steps read its settings).
    current = None

    def __init__(self):
        self.dir = Path(os.environ["MOE_HW_RUN_DIR"])
        self.manifest = json.loads((self.dir / "manifest.json").read_text())
        self.settings = self.manifest["settings"]
        with np.load(self.dir / "stimulus.npz") as stimulus:
            self.stimulus = {key: stimulus[key] for key in stimulus.files}
        self.extra = {}          # results the harness adds (the reset step's findings)
        Run.current = self

    def port(self, name):
        return self.manifest["ports"][name]

    def layout(self, name):
        return Layout(self.port(name))

    def save(self, **results):
        np.savez(self.dir / "results.npz", **results, **self.extra)


class Layout:
    """Packs and unpacks a structured payload described by the manifest (first field = LSBs)."""

    def __init__(self, desc):
        self.desc = desc
        self.width = desc["width"]

    def field(self, name):
        return self.desc["fields"][name]

    def pack(self, **values):
        word = 0
        for name, value in values.items():
            f = self.field(name)
            word |= (int(value) & ((1 << f["width"]) - 1)) << f["offset"]
        return word

    def unpack(self, word, name, *, signed=False):
        f = self.field(name)
        value = (word >> f["offset"]) & ((1 << f["width"]) - 1)
        if signed and value >> (f["width"] - 1):
            value -= 1 << f["width"]
        return value


def pack_lanes(elements, width):
    """An array of unsigned lane values (lane 0 first) as one integer, lane 0 least significant."""
    word = 0
    for lane in reversed(elements.tolist()):
        word = (word << width) | lane
    return word


def unpack_lanes(word, width, count):
    mask = (1 << width) - 1
    return [(word >> (width * lane)) & mask for lane in range(count)]


def high(handle):
    return str(handle.value) == "1"


class Pauses:
    """Seeded random pauses: ``next()`` is True (pause this cycle) with probability ``p``."""

    def __init__(self, p=0.0, seed=0):
        self.p = float(p)
        self.rng = np.random.default_rng(seed)
        self._buf = np.zeros(0, dtype=bool)
        self._i = 0

    def next(self):
        if self.p <= 0:
            return False
        if self._i == len(self._buf):
            self._buf = self.rng.random(4096) < self.p
            self._i = 0
        self._i += 1
        return bool(self._buf[self._i - 1])


class StreamSource:
    """Drives ``<name>__valid/__payload`` with ``items`` (ints) in order, pausing at random."""

    def __init__(self, dut, name, items, pauses=None):
        self.valid = getattr(dut, f"{name}__valid")
        self.ready = getattr(dut, f"{name}__ready")
        self.payload = getattr(dut, f"{name}__payload")
        self.items = items
        self.pauses = pauses or Pauses()
        self.sent = 0
        self._valid = False
        self.valid.value = 0
        self.payload.value = 0

    @property
    def done(self):
        return self.sent == len(self.items)

    def restart(self, items=None):
        """Back to before the first item (as after a reset), offering ``items`` if given."""
        if items is not None:
            self.items = items
        self.sent = 0
        self._valid = False
        self.valid.value = 0

    def step(self):
        if self._valid and high(self.ready):
            self.sent += 1
            self._valid = False
        if not self._valid:
            if self.sent < len(self.items) and not self.pauses.next():
                self.payload.value = self.items[self.sent]
                self._valid = True
            self.valid.value = int(self._valid)


class StreamSink:
    """Takes every item from ``<name>__valid/__payload`` with random ``ready`` pauses."""

    def __init__(self, dut, name, pauses=None):
        self.valid = getattr(dut, f"{name}__valid")
        self.ready = getattr(dut, f"{name}__ready")
        self.payload = getattr(dut, f"{name}__payload")
        self.pauses = pauses or Pauses()
        self.items = []
        self._ready = False
        self.ready.value = 0

    def restart(self):
        """Forget every item taken (as after a reset)."""
        self.items = []
        self._ready = False
        self.ready.value = 0

    def step(self):
        if self._ready and high(self.valid):
            self.items.append(self.payload.value.to_unsigned())
        self._ready = not self.pauses.next()
        self.ready.value = int(self._ready)


class MemoryReader:
    """A memory read port: takes requests on ``<request>`` (payload field ``addr``, the element
    address of lane 0, and optionally ``enable``, the lanes wanted) and answers each, in order,
    ``latency`` cycles later or after, on ``<response>`` (payload field ``data``: ``lanes``
    elements of ``width`` bits, lane 0 least significant). Data is read when the request is
    taken, so a write taken earlier (by a :class:`MemoryWriter` on the same array) is seen.
    Lanes outside ``memory`` read as 0 and are counted in ``out_of_bounds``.
    """

    def __init__(self, dut, request, response, memory, *, lanes, width, request_layout,
                 response_layout, latency=2, request_pauses=None, response_pauses=None):
        self.req_valid = getattr(dut, f"{request}__valid")
        self.req_ready = getattr(dut, f"{request}__ready")
        self.req_payload = getattr(dut, f"{request}__payload")
        self.resp_valid = getattr(dut, f"{response}__valid")
        self.resp_ready = getattr(dut, f"{response}__ready")
        self.resp_payload = getattr(dut, f"{response}__payload")
        self.memory, self.lanes, self.width = memory, lanes, width
        self.req_layout, self.resp_layout = request_layout, response_layout
        self.has_enable = "enable" in request_layout.desc["fields"]
        self.latency = latency
        self.req_pauses = request_pauses or Pauses()
        self.resp_pauses = response_pauses or Pauses()
        self.queue = []          # (cycle due, response word)
        self.requests = []       # every request taken: (addr, enable)
        self.out_of_bounds = 0
        self.cycle = 0
        self._ready = False
        self._valid = False
        self.req_ready.value = 0
        self.resp_valid.value = 0
        self.resp_payload.value = 0

    def restart(self):
        """Forget every request, answered or not (as after a reset of the memory system)."""
        self.queue, self.requests = [], []
        self.out_of_bounds = 0
        self.cycle = 0
        self._ready = self._valid = False
        self.req_ready.value = 0
        self.resp_valid.value = 0

    def _read(self, addr, enable):
        values = np.zeros(self.lanes, dtype=np.uint64)
        for lane in range(self.lanes):
            if enable >> lane & 1:
                where = addr + lane
                if 0 <= where < len(self.memory):
                    values[lane] = self.memory[where]
                else:
                    self.out_of_bounds += 1
        return self.resp_layout.pack(data=pack_lanes(values, self.width))

    def step(self):
        if self._valid and high(self.resp_ready):
            self.queue.pop(0)
            self._valid = False
        if self._ready and high(self.req_valid):
            word = self.req_payload.value.to_unsigned()
            addr = self.req_layout.unpack(word, "addr")
            enable = self.req_layout.unpack(word, "enable") if self.has_enable \
                else (1 << self.lanes) - 1
            self.requests.append((addr, enable))
            self.queue.append((self.cycle + self.latency, self._read(addr, enable)))
        self.cycle += 1
        if not self._valid and self.queue and self.queue[0][0] <= self.cycle \
                and not self.resp_pauses.next():
            self.resp_payload.value = self.queue[0][1]
            self._valid = True
        self.resp_valid.value = int(self._valid)
        self._ready = not self.req_pauses.next()
        self.req_ready.value = int(self._ready)


class MemoryWriter:
    """A memory write port: takes writes on ``<name>`` (payload fields ``addr``, ``data`` and
    ``enable``, as the dispatch unit's ``write``) into ``memory`` as they are taken. Lanes
    outside ``memory`` are not written and are counted in ``out_of_bounds``; every write is
    logged in ``log`` as (addr, enable, data word)."""

    def __init__(self, dut, name, memory, *, lanes, width, layout, pauses=None):
        self.sink = StreamSink(dut, name, pauses)
        self.memory, self.lanes, self.width, self.layout = memory, lanes, width, layout
        self.initial = memory.copy()     # what restart() puts back
        self.log = []
        self.out_of_bounds = 0

    def restart(self):
        """The memory as it was given, no write taken (as after a reset)."""
        self.memory[:] = self.initial
        self.log = []
        self.out_of_bounds = 0
        self.sink.restart()

    def step(self):
        before = len(self.sink.items)
        self.sink.step()
        for word in self.sink.items[before:]:
            addr = self.layout.unpack(word, "addr")
            enable = self.layout.unpack(word, "enable")
            data = self.layout.unpack(word, "data")
            self.log.append((addr, enable, data))
            for lane, value in enumerate(unpack_lanes(data, self.width, self.lanes)):
                if enable >> lane & 1:
                    if 0 <= addr + lane < len(self.memory):
                        self.memory[addr + lane] = value
                    else:
                        self.out_of_bounds += 1


async def reset(dut, inputs=(), cycles=2):
    """Start the clock and hold reset for ``cycles`` cycles with ``inputs`` driven to 0."""
    dut.rst.value = 1
    for name in inputs:
        getattr(dut, name).value = 0
    Clock(dut.clk, 10, unit="ns").start(start_high=False)
    await Timer(1, unit="ns")
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    dut.rst.value = 0


async def edge(dut, actors):
    """One rising edge, with every actor stepped right after it."""
    await RisingEdge(dut.clk)
    for actor in actors:
        actor.step()


async def run_until(dut, actors, finished, limit, what="the unit"):
    """Clock the actors until ``finished()`` (checked after each edge); return the cycle count."""
    cycle = 0
    while True:
        await edge(dut, actors)
        cycle += 1
        if finished():
            return cycle
        if cycle >= limit:
            raise AssertionError(f"{what} did not finish within {limit} cycles (hang?)")


async def reset_mid_problem(dut, actors, sizes, *, moved, settle=16):
    """With the run setting ``reset_at`` = N (otherwise nothing happens): an old problem is
    started and reset N cycles after its start edge, before the bench's own (fresh) problem.

    The old problem is the fresh one's sizes with every source's items in a seeded random
    order, under the run's pauses, so that a beat left over from it is not one of the fresh
    problem's beats in its place. Reset is held for two cycles with ``start`` low; every
    actor then restarts (sources from their first item, sinks and logs empty, written memory
    as it was given). For ``settle`` cycles after reset, with no input offered, ``moved()``
    (the bench's counts of beats out, reads asked, writes done) must stay at zero and
    ``busy`` must be low: the unit is idle, with no stale output. Records ``reset_busy``
    (whether the unit was busy when reset came: the reset was mid-problem) and
    ``reset_at``. Units without ``start`` (a plain pipeline) are reset the same way with
    the old problem streaming in from cycle 0."""
    run = Run.current
    reset_at = None if run is None else run.settings.get("reset_at")
    if reset_at is None:
        return
    for actor in actors:
        assert hasattr(actor, "restart"), \
            f"{type(actor).__name__} has no restart(); the reset step needs one"
    rng = np.random.default_rng([int(run.settings.get("seed", 0)), int(reset_at)])
    sources = [actor for actor in actors if isinstance(actor, StreamSource)]
    fresh = [source.items for source in sources]
    for source in sources:
        source.restart([source.items[i] for i in rng.permutation(len(source.items))])
    has_start = hasattr(dut, "start")
    for name, value in sizes.items():
        getattr(dut, name).value = value
    if has_start:
        dut.start.value = 1
    for actor in actors:
        actor.step()
    await edge(dut, actors)              # the old problem's start edge
    if has_start:
        dut.start.value = 0
    for _ in range(reset_at):
        await edge(dut, actors)
    busy = high(dut.busy) if hasattr(dut, "busy") else None
    for source, items in zip(sources, fresh):
        source.restart(items)
    for actor in actors:
        actor.restart()
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    waiting = [actor for actor in actors if not isinstance(actor, StreamSource)]
    before = moved()
    for cycle in range(settle):
        await edge(dut, waiting)
        assert moved() == before, \
            f"stale output after reset: counts {moved()} {cycle + 1} cycles after reset, " \
            f"before any start (expected {before})"
        if hasattr(dut, "busy"):
            assert not high(dut.busy), f"busy {cycle + 1} cycles after reset, before start"
        if hasattr(dut, "done"):
            assert not high(dut.done), f"done {cycle + 1} cycles after reset, before start"
    for actor in actors:                 # every actor as it was before the settle cycles
        actor.restart()
    run.extra.update(reset_at=int(reset_at), reset_busy=-1 if busy is None else int(busy))


async def run_once(dut, actors, sizes, *, limit, what, moved, started=None, settle=16):
    """One run of a unit with the start/done handshake, and the check that it then keeps
    still. The run-time ``sizes`` (port name -> value) are driven with ``start`` for the one
    cycle in which the unit samples it (cycle 0); ``started()``, if given, is called right
    after that edge. The actors are clocked until ``done``, and the cycle count from the start
    edge is returned. Then ``settle`` more cycles run, in which ``moved()`` (a tuple of counts:
    beats out, reads asked, writes done) must not change: nothing leaves a unit after done.
    With the run setting ``reset_at``, an old problem is reset first
    (:func:`reset_mid_problem`)."""
    await reset_mid_problem(dut, actors, sizes, moved=moved, settle=settle)
    for name, value in sizes.items():
        getattr(dut, name).value = value
    dut.start.value = 1
    for actor in actors:
        actor.step()
    await edge(dut, actors)              # cycle 0: the unit samples start
    dut.start.value = 0
    if started is not None:
        started()
    cycles = await run_until(dut, actors, lambda: high(dut.done), limit, what)
    at_done = moved()
    for _ in range(settle):
        await edge(dut, actors)
    assert moved() == at_done, \
        f"{what} moved after done: counts {at_done} at done, {moved()} {settle} cycles later"
    return cycles


__all__ += ["cocotb"]
