"""A streaming prefix sum: per-expert offsets from per-expert counts (SPEC 1.3 and 1.5).

Streams (payload fields least significant first):

``i`` (in)
    One term per beat: ``value`` (unsigned, ``value_width`` bits).
``o`` (out)
    One beat per term, in order: ``value`` (the term), ``exclusive`` (the sum of the terms
    before it since the last clear) and ``inclusive`` (``exclusive + value``), both
    ``sum_width`` bits, wrapping modulo ``2**sum_width``.
``clear`` (in)
    Restart the sum: the next term taken gets ``exclusive == 0``, and ``total`` reads 0 from
    the next cycle on. Assert it only in a cycle that takes no term (the units clear in
    their decide cycle): the clear is then the total register's synchronous reset, not a
    multiplexer in front of the adder.
``total`` (out)
    The sum of every term taken since the last clear (the last ``inclusive``).

Latency one cycle, one term per cycle; a register stage (``i.ready = o.ready | ~o.valid``),
``o.valid`` registered.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..params import check_int

__all__ = ["PrefixSum"]


class PrefixSum(wiring.Component):
    """Exclusive and inclusive running sums of a stream of terms. See the module docstring."""

    latency = 1

    def __init__(self, value_width, sum_width):
        self.value_width = check_int("value_width", value_width, minimum=1, maximum=64)
        self.sum_width = check_int("sum_width", sum_width, minimum=1, maximum=64)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"value": self.value_width}))),
            "o": Out(stream.Signature(data.StructLayout({
                "value": self.value_width, "exclusive": self.sum_width,
                "inclusive": self.sum_width}))),
            "clear": In(1),
            "total": Out(self.sum_width),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.i.ready.eq(self.o.ready | ~self.o.valid)
        with m.If(self.o.ready | ~self.o.valid):
            m.d.sync += self.o.valid.eq(self.i.valid)
        with m.If(self.i.valid & self.i.ready):
            total = Signal(self.sum_width)
            m.d.comb += total.eq(self.total + self.i.payload.value)
            m.d.sync += [
                self.o.payload.value.eq(self.i.payload.value),
                self.o.payload.exclusive.eq(self.total),
                self.o.payload.inclusive.eq(total),
                self.total.eq(total),
            ]
        with m.If(self.clear):
            m.d.sync += self.total.eq(0)
        return m
