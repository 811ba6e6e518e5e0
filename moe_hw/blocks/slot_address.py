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
    Added to the row address: present it with its ``index`` and ``location`` (for example a
    beat's element offset).
``in_range`` (out)
    ``0 <= index < num_experts and 0 <= location < capacity``, ``latency`` enabled cycles
    after the header was presented.
``address`` (out)
    ``(index*capacity + location)*hidden + offset``, aligned with ``in_range``. Out-of-range
    pairs get an address too (from the low bits of the fields); the caller must not use it.

Latency (:func:`slot_latency`): ``index*C`` on registered DSP blocks
(:func:`~moe_hw.arith.product.pipelined_product`, 2 stages for operands of up to 18 bits),
``+ location`` (1), ``slot*H`` likewise (2), ``+ offset`` (1): 6 at the default maxima, no
stage longer than one carry chain; the mask runs alongside in two of those stages. One pair
per enabled cycle. ``dsp`` chooses the
multiplier blocks as for the float multiplier (``"ecp5"``: MULT18X18D with registers on).
"""

from amaranth.hdl import Cat, Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.product import DSP_TARGETS, pipelined_product, product_latency
from ..params import check_choice, check_int
from ..stream import CreditPipeline, delay

__all__ = ["SlotAddress", "header_slot_queue", "in_range_flags", "slot_latency", "slot_widths"]


def slot_widths(max_experts, max_capacity, max_hidden):
    """The operand widths of the two products: ``(index, capacity, slot, hidden)``."""
    return (max(1, bits_for(max_experts - 1)), bits_for(max_capacity),
            max(1, ceil_log2(max_experts * max_capacity)), bits_for(max_hidden))


def slot_latency(params):
    """The latency of the :class:`SlotAddress` of a unit with parameters ``params`` (fields
    ``max_experts``, ``max_capacity``, ``max_hidden``)."""
    index, capacity, slot, hidden = slot_widths(params.max_experts, params.max_capacity,
                                                params.max_hidden)
    return product_latency(index, capacity) + 1 + product_latency(slot, hidden) + 1


def in_range_flags(field, size):
    """The terms of ``0 <= field < size`` (a signed header field, a run-time size), to be
    registered and ANDed: the low bits' compare against the size, and the zero tests of the
    bits above the size's width (the sign among them) in groups of four. (A signed compare of
    the whole field against the size is one carry chain as wide as the field.)"""
    low = min(len(size), len(field) - 1)
    high = field.as_unsigned()[low:]
    return [field.as_unsigned()[:low] < size,
            *(high[start:start + 4] == 0 for start in range(0, len(high), 4))]


class SlotAddress(wiring.Component):
    """``(index*C + location)*H + offset`` and the bounds mask, :attr:`latency` stages. See
    the module docstring for the ports."""

    def __init__(self, *, index_width, max_experts, max_capacity, max_hidden, addr_width,
                 offset_width=0, dsp="generic"):
        self.index_width = check_int("index_width", index_width, minimum=2, maximum=64)
        self.max_experts = check_int("max_experts", max_experts, minimum=1)
        self.max_capacity = check_int("max_capacity", max_capacity, minimum=1)
        self.max_hidden = check_int("max_hidden", max_hidden, minimum=1)
        self.addr_width = check_int("addr_width", addr_width, minimum=1)
        self.dsp = check_choice("dsp", dsp, DSP_TARGETS)
        self.latency = slot_latency(self)
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

    @classmethod
    def for_params(cls, params, *, addr_width, offset_width=0):
        """The generator of a unit with parameters ``params`` (``index_width``, the maxima
        and, if the unit multiplies, ``dsp``)."""
        return cls(index_width=params.index_width, max_experts=params.max_experts,
                   max_capacity=params.max_capacity, max_hidden=params.max_hidden,
                   addr_width=addr_width, offset_width=offset_width,
                   dsp=getattr(params, "dsp", "generic"))

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
        en = self.en
        index_bits, _, slot_bits, _ = slot_widths(self.max_experts, self.max_capacity,
                                                  self.max_hidden)
        location_bits = max(1, bits_for(self.max_capacity - 1))
        # The mask in two stages (its result still has the address's latency): a field is
        # in range when its bits above the size's width are all zero (the sign among them) and
        # its low bits are below the size. The first stage registers the low compares and the
        # high bits' zero tests (:func:`in_range_flags`); the second ANDs them.
        flags = [*in_range_flags(self.index, self.num_experts),
                 *in_range_flags(self.location, self.capacity)]
        first_flags = delay(m, Cat(*flags), 1, en, name="in_range_flags")
        in_range = delay(m, first_flags.all(), 1, en, name="in_range_mask")
        # index*C on registered DSP blocks, then + location.
        index_c = pipelined_product(m, self.index.as_unsigned()[:index_bits], self.capacity,
                                    en=en, dsp=self.dsp, name="index_c")
        first = product_latency(index_bits, len(self.capacity))
        location = delay(m, self.location.as_unsigned()[:location_bits], first, en,
                         name="location")
        slot = Signal(slot_bits)
        with m.If(en):
            m.d.sync += slot.eq(index_c + location)
        # slot*H likewise, then + offset.
        row = pipelined_product(m, slot, self.hidden, en=en, dsp=self.dsp, name="slot_h")
        address = Signal(self.addr_width)
        if hasattr(self, "offset"):
            offset = delay(m, self.offset, self.latency - 1, en, name="offset", reset_less=True)
            with m.If(en):
                m.d.sync += address.eq(row + offset)
        else:
            with m.If(en):
                m.d.sync += address.eq(row)
        m.d.comb += [
            self.address.eq(address),
            self.in_range.eq(delay(m, in_range, self.latency - 2, en, name="in_range")),
        ]
        return m


def header_slot_queue(m, header, control, params, *, open, addr_width, carry=(), skid=True,
                      alternate=()):
    """The header stream of a unit that addresses the expert buffer, through the slot
    address in a pipeline that never stalls: the :class:`SlotAddress` (submodule
    ``slot_address``, enable constant 1) inside a :class:`~moe_hw.stream.CreditPipeline`
    (submodule ``header_queue``), whose queue holds the addressed headers.

    ``header`` is the unit's input stream (payload fields ``index`` and ``location``),
    ``control`` its :class:`~moe_hw.blocks.run_control.RunControl`, ``params`` its
    parameters (``index_width`` and the maxima); headers are taken while ``open`` is high.
    ``carry`` names header payload fields that travel with the address (for example the
    gate). Returns the :class:`~moe_hw.stream.CreditPipeline`: its stream ``o`` has payload
    fields ``address``, ``in_range`` and the ``carry`` fields; its output register holds the
    front header until the unit takes it. Latency :func:`slot_latency` +
    ``CreditPipeline.QUEUE_LATENCY``. With ``skid=False`` the queue's ring drives ``o``
    (see :class:`~moe_hw.stream.CreditPipeline`): the front header is the ring's
    asynchronous read, for a unit that registers it every cycle, and the latency is
    :func:`slot_latency` + ``CreditPipeline.RING_LATENCY``. ``alternate`` names payload
    fields that the skid buffer holds in two registers written in turn (its ``alternate``:
    the unit's take then reaches only the buffer's flags and pointers, not those fields'
    clock enables).
    """
    fields = {"address": addr_width, "in_range": 1}
    fields.update({name: header.payload[name].shape() for name in carry})
    queue = m.submodules.header_queue = CreditPipeline(slot_latency(params),
                                                       data.StructLayout(fields), skid=skid,
                                                       alternate=alternate)
    m.d.comb += [
        queue.i_valid.eq(header.valid & open),
        header.ready.eq(queue.i_ready & open),
    ]
    slot_address = m.submodules.slot_address = SlotAddress.for_params(params,
                                                                      addr_width=addr_width)
    address, in_range = slot_address.follow(m, control, en=1, index=header.payload.index,
                                            location=header.payload.location)
    m.d.comb += [queue.payload.address.eq(address), queue.payload.in_range.eq(in_range)]
    for name in carry:
        m.d.comb += queue.payload[name].eq(delay(m, header.payload[name], queue.latency, 1,
                                                 name=f"header_{name}"))
    return queue
