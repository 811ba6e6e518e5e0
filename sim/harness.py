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

__all__ = ["Run", "Layout", "Pauses", "StreamSource", "StreamSink", "reset", "edge", "run_until",
           "high", "pack_lanes", "unpack_lanes"]


class Run:
    """The files of one simulation run: stimulus, manifest (ports, settings), results."""

    def __init__(self):
        self.dir = Path(os.environ["MOE_HW_RUN_DIR"])
        self.manifest = json.loads((self.dir / "manifest.json").read_text())
        self.settings = self.manifest["settings"]
        with np.load(self.dir / "stimulus.npz") as stimulus:
            self.stimulus = {key: stimulus[key] for key in stimulus.files}

    def port(self, name):
        return self.manifest["ports"][name]

    def layout(self, name):
        return Layout(self.port(name))

    def save(self, **results):
        np.savez(self.dir / "results.npz", **results)


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

    def step(self):
        if self._ready and high(self.valid):
            self.items.append(self.payload.value.to_unsigned())
        self._ready = not self.pauses.next()
        self.ready.value = int(self._ready)


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


__all__ += ["cocotb"]
