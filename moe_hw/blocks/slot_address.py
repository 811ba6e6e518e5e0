"""The slot address generator: ``(index*C + location)*H`` with its bounds mask.

Every unit that addresses the expert buffer ``[E*C, H]`` (dispatch, combine_gather,
dispatch_backward_data, dispatch_backward_gate) forms its row address here, and only here, so
that the address pipeline is timed once.

Ports (a pure pipeline: every register loads when ``en`` is high):

``index``, ``location`` (in)
    The pair's header fields, two's complement, ``index_width`` bits; any bit pattern is safe.
``capacity``, ``num_experts``, ``hidden`` (in)
    The run-time sizes, held for the run.
``offset`` (in)
    Added to the row address in the second stage: present it one enabled cycle after its
    ``index`` and ``location`` (for example a beat's element offset).
``in_range`` (out)
    ``0 <= index < num_experts and 0 <= location < capacity``, ``latency`` enabled cycles
    after the header was presented.
``address`` (out)
    ``(index*capacity + location)*hidden + offset``, aligned with ``in_range``. Out-of-range
    pairs get an address too (from the low bits of the fields); the caller must not use it.

Latency: 2 (stage 1: mask and ``slot = index*C + location``; stage 2: ``slot*H + offset``).
One pair per enabled cycle.
"""

from amaranth.hdl import Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..params import check_int
from ..stream import delay

__all__ = ["SlotAddress"]


class SlotAddress(wiring.Component):
    """``(index*C + location)*H + offset`` and the bounds mask, two stages. See the module
    docstring for the ports."""

    latency = 2

    def __init__(self, *, index_width, max_experts, max_capacity, max_hidden, addr_width,
                 offset_width=0):
        self.index_width = check_int("index_width", index_width, minimum=2, maximum=64)
        self.max_experts = check_int("max_experts", max_experts, minimum=1)
        self.max_capacity = check_int("max_capacity", max_capacity, minimum=1)
        self.max_hidden = check_int("max_hidden", max_hidden, minimum=1)
        self.addr_width = check_int("addr_width", addr_width, minimum=1)
        members = {
            "en": In(1),
            "index": In(signed(index_width)),
            "location": In(signed(index_width)),
            "capacity": In(range(max_capacity + 1)),
            "num_experts": In(range(max_experts + 1)),
            "hidden": In(range(max_hidden + 1)),
            "in_range": Out(1),
            "address": Out(addr_width),
        }
        if offset_width:
            members["offset"] = In(offset_width)
        super().__init__(members)

    def follow(self, m, control, *, en, index, location):
        """Drive this generator from a pipeline enable ``en``, a header's ``index`` and
        ``location``, and the held sizes of a :class:`~moe_hw.blocks.run_control.RunControl`
        (``capacity``, ``num_experts``, ``hidden``). Returns ``(address, in_range)``."""
        m.d.comb += [
            self.en.eq(en), self.index.eq(index), self.location.eq(location),
            self.capacity.eq(control.size("capacity")),
            self.num_experts.eq(control.size("num_experts")),
            self.hidden.eq(control.size("hidden")),
        ]
        return self.address, self.in_range

    def elaborate(self, platform):
        m = Module()
        in_range = ((self.index >= 0) & (self.index < self.num_experts) &
                    (self.location >= 0) & (self.location < self.capacity))
        slot = Signal(max(1, ceil_log2(self.max_experts * self.max_capacity)))
        index_bits = max(1, bits_for(self.max_experts - 1))
        location_bits = max(1, bits_for(self.max_capacity - 1))
        with m.If(self.en):
            m.d.sync += slot.eq(self.index.as_unsigned()[:index_bits] * self.capacity +
                                self.location.as_unsigned()[:location_bits])
        address = Signal(self.addr_width)
        row = slot * self.hidden
        with m.If(self.en):
            m.d.sync += address.eq(row + self.offset if hasattr(self, "offset") else row)
        m.d.comb += [
            self.address.eq(address),
            self.in_range.eq(delay(m, in_range, 2, self.en, name="in_range")),
        ]
        return m
