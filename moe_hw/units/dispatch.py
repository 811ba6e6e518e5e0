"""The dispatch unit (tutel / MLU-OPS ``moe_dispatch_forward``, SPEC 1.1).

For every (k, i) pair, in the order the headers arrive (k-major for top-k > 1)::

    if 0 <= index < E and 0 <= location < C:
        dispatch[(index*C + location)*H + j] = gate * input[i, j]      for j in 0..H-1

Streams and ports (payload fields are listed least significant first):

``header`` (in)
    One beat per (k, i) pair: ``gate`` (the format's bits), ``index`` and ``location``
    (two's complement, ``index_width`` bits each; any bit pattern is safe).
``data`` (in)
    ``ceil(H / lanes)`` beats per pair, ``lanes`` elements each, lane 0 first; the last beat
    of a pair is zero-padded past H.
``write`` (out)
    The memory write port: ``addr`` is the element address of lane 0, ``data`` the gated
    elements, ``enable`` the lane enables (lane l writes element ``addr + l``). The last beat
    of a pair carries partial enables when H is not a multiple of ``lanes``.
``start``, ``tokens``, ``hidden``, ``capacity``, ``num_experts`` (in)
    Run-time problem size, sampled when ``start`` is high while idle. ``tokens`` is the
    number of headers (S, or k*S for top-k).
``busy``, ``done``, ``dropped``, ``error`` (out)
    ``done`` rises when the last write has left and stays high until the next start.
    ``dropped`` counts the pairs that fail the mask. ``error`` is set when a run-time size
    exceeds its generation-time maximum; such a run does nothing.

Zero-element problems (``tokens``, ``hidden``, ``capacity`` or ``num_experts`` zero) finish at
once: ``done`` one cycle after start, no stream is read, nothing is written. ``dropped`` then
reads ``tokens`` when the capacity or the expert count is zero (every pair fails the mask) and
0 when ``hidden`` is zero (no pair carries data).

Throughput: one data beat per cycle when nothing stalls, including back-to-back one-beat
tokens; a stall anywhere costs only the cycles it lasts. Stall-free, a run of ``tokens``
pairs takes exactly ``tokens * ceil(H / lanes) + overhead`` cycles from the start cycle to
the cycle ``done`` is first seen (see :attr:`DispatchUnit.overhead`).

Pipeline: header stage 1 checks the mask and forms ``slot = index*C + location``; header
stage 2 forms ``base = slot*H``; the current-pair register walks ``addr`` from ``base`` in
steps of ``lanes``; ``lanes`` float multipliers form ``gate * element``; a skid buffer drives
``write`` so that ``write.ready`` has no combinational path to the inputs.
"""

from dataclasses import dataclass

from amaranth.hdl import Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.fmul import FloatMultiplierCore
from ..formats import float_format
from ..params import LANES, ParameterError, check_choice, check_int, resolve_params
from ..stream import PipelineControl, SkidBuffer, delay
from .float_params import FloatDatapathParams

__all__ = ["DispatchParams", "DispatchUnit"]


@dataclass(frozen=True)
class DispatchParams(FloatDatapathParams):
    """Generation-time parameters of :class:`DispatchUnit`."""

    format: str = "fp32"
    lanes: int = 4
    max_tokens: int = 4096
    max_hidden: int = 4096
    max_capacity: int = 4096
    max_experts: int = 64
    index_width: int = 32
    mul_stages: int | None = None  # None: the multiplier's default depth for the format

    def __post_init__(self):
        float_format(self.format)
        check_choice("lanes", self.lanes, LANES)
        for name in ("max_tokens", "max_hidden", "max_capacity", "max_experts"):
            check_int(name, getattr(self, name), minimum=1, maximum=1 << 30)
        check_int("index_width", self.index_width, minimum=2, maximum=64)
        limit = 1 << (self.index_width - 1)
        for name in ("max_capacity", "max_experts"):
            if getattr(self, name) > limit:
                raise ParameterError(
                    f"Index width must hold {name} ({getattr(self, name)}) as a signed value, "
                    f"not {self.index_width}")
        if self.mul_stages is not None:
            check_int("mul_stages", self.mul_stages, minimum=0, maximum=8)

    @property
    def stages(self):
        return self.mul_latency

    @property
    def addr_width(self):
        return max(1, ceil_log2(self.max_experts * self.max_capacity * self.max_hidden))

    def header_layout(self):
        return data.StructLayout({
            "gate": self.fmt.width,
            "index": signed(self.index_width),
            "location": signed(self.index_width),
        })

    def data_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.fmt.width, self.lanes)})

    def write_layout(self):
        return data.StructLayout({
            "addr": self.addr_width,
            "data": data.ArrayLayout(self.fmt.width, self.lanes),
            "enable": self.lanes,
        })


class DispatchUnit(wiring.Component):
    """Streaming dispatch with ``(index*capacity + location)*hidden`` address generation,
    bounds masks and a gate-multiply pipeline. See the module docstring for the protocol."""

    HEADER_LATENCY = 2

    def __init__(self, params=None, **kwargs):
        params = resolve_params(DispatchParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "header": In(stream.Signature(p.header_layout())),
            "data": In(stream.Signature(p.data_layout())),
            "write": Out(stream.Signature(p.write_layout())),
            "start": In(1),
            "tokens": In(range(p.max_tokens + 1)),
            "hidden": In(range(p.max_hidden + 1)),
            "capacity": In(range(p.max_capacity + 1)),
            "num_experts": In(range(p.max_experts + 1)),
            "busy": Out(1),
            "done": Out(1),
            "dropped": Out(range(p.max_tokens + 1)),
            "error": Out(1),
        })

    @property
    def latency(self):
        """Cycles from a data beat entering to its write leaving (multiplier + skid buffer)."""
        return self.params.stages + 1

    @property
    def overhead(self):
        """Stall-free cycles beyond one per data beat: start, header pipeline, current-pair
        register, multiplier, skid buffer, done register."""
        return 1 + self.HEADER_LATENCY + 1 + self.params.stages + 1 + 1

    def elaborate(self, platform):
        m = Module()
        p = self.params
        lanes_log2 = ceil_log2(p.lanes)

        # Run-time sizes, held for the whole run.
        tokens = Signal.like(self.tokens)
        hidden = Signal.like(self.hidden)
        capacity = Signal.like(self.capacity)
        num_experts = Signal.like(self.num_experts)
        beats = Signal(range(-(-p.max_hidden // p.lanes) + 1))  # data beats per pair
        last_enable = Signal(p.lanes)                              # lane enables of the last beat
        running = Signal()
        headers_left = Signal.like(self.tokens)
        pairs_left = Signal.like(self.tokens)

        # ---- start / finish ------------------------------------------------------------
        too_big = ((self.tokens > p.max_tokens) | (self.hidden > p.max_hidden) |
                   (self.capacity > p.max_capacity) | (self.num_experts > p.max_experts))
        empty = ((self.tokens == 0) | (self.hidden == 0) | (self.capacity == 0) |
                 (self.num_experts == 0))
        remainder = self.hidden[:lanes_log2] if lanes_log2 else Const(0, 1)
        start = self.start & ~running

        # ---- header pipeline: mask and slot, then base address ---------------------------
        header = self.header.payload
        header_ctl = m.submodules.header_ctl = PipelineControl(self.HEADER_LATENCY)
        header_open = running & (headers_left != 0)
        m.d.comb += [
            header_ctl.i_valid.eq(self.header.valid & header_open),
            self.header.ready.eq(header_ctl.en & header_open),
        ]
        en_h = header_ctl.en
        in_range = ((header.index >= 0) & (header.index < num_experts) &
                    (header.location >= 0) & (header.location < capacity))
        slot_width = max(1, ceil_log2(p.max_experts * p.max_capacity))
        slot = Signal(slot_width)
        index_bits = max(1, bits_for(p.max_experts - 1))
        location_bits = max(1, bits_for(p.max_capacity - 1))
        with m.If(en_h):
            m.d.sync += slot.eq(header.index.as_unsigned()[:index_bits] * capacity +
                                header.location.as_unsigned()[:location_bits])
        base = Signal(p.addr_width)
        with m.If(en_h):
            m.d.sync += base.eq(slot * hidden)
        h_gate = delay(m, header.gate, 2, en_h, name="h_gate")
        h_valid = delay(m, in_range, 2, en_h, name="h_in_range")

        # ---- current pair: walks the addresses of its beats ------------------------------
        mul_ctl = m.submodules.mul_ctl = PipelineControl(p.stages)
        cur_loaded = Signal()
        cur_valid = Signal()
        cur_gate = Signal(p.fmt.width)
        cur_addr = Signal(p.addr_width)
        beat = Signal.like(beats)
        last_beat = beat == beats - 1
        m.d.comb += self.data.ready.eq(running & cur_loaded & mul_ctl.en)
        beat_take = self.data.valid & self.data.ready
        cur_free = ~cur_loaded | (beat_take & last_beat)
        m.d.comb += header_ctl.o_ready.eq(cur_free)
        header_take = header_ctl.o_valid & cur_free

        with m.If(beat_take):
            m.d.sync += [beat.eq(beat + 1), cur_addr.eq(cur_addr + p.lanes)]
            with m.If(last_beat):
                m.d.sync += [cur_loaded.eq(0), pairs_left.eq(pairs_left - 1)]
        with m.If(header_take):
            m.d.sync += [cur_loaded.eq(1), cur_valid.eq(h_valid), cur_gate.eq(h_gate),
                         cur_addr.eq(base), beat.eq(0)]
            with m.If(~h_valid):
                m.d.sync += self.dropped.eq(self.dropped + 1)
        with m.If(self.header.valid & self.header.ready):
            m.d.sync += headers_left.eq(headers_left - 1)

        # ---- gate multiply ---------------------------------------------------------------
        # Beats of dropped pairs travel the pipeline too, as items that write nothing, so
        # that the run's cycle count does not depend on which pairs are dropped.
        m.d.comb += mul_ctl.i_valid.eq(self.data.valid & running & cur_loaded)
        en_m = mul_ctl.en
        products = []
        for lane in range(p.lanes):
            mul = FloatMultiplierCore(p.format, p.stages)
            m.submodules[f"mul{lane}"] = mul
            m.d.comb += [mul.a.eq(cur_gate), mul.b.eq(self.data.payload.data[lane]),
                         mul.en.eq(en_m)]
            products.append(mul.product)
        enable = Mux(last_beat, last_enable, Const((1 << p.lanes) - 1, p.lanes))
        w_addr = delay(m, cur_addr, p.stages, en_m, name="w_addr")
        w_enable = delay(m, enable, p.stages, en_m, name="w_enable")
        w_write = delay(m, cur_valid, p.stages, en_m, name="w_write")

        # Items that write nothing go through the skid buffer too and vanish at its output.
        skid = m.submodules.skid = SkidBuffer(data.StructLayout({
            "beat": p.write_layout(), "write": 1}))
        m.d.comb += [
            skid.i.valid.eq(mul_ctl.o_valid),
            mul_ctl.o_ready.eq(skid.i.ready),
            skid.i.payload.write.eq(w_write),
            skid.i.payload.beat.addr.eq(w_addr),
            skid.i.payload.beat.enable.eq(w_enable),
            self.write.valid.eq(skid.o.valid & skid.o.payload.write),
            self.write.payload.eq(skid.o.payload.beat),
            skid.o.ready.eq(self.write.ready | ~skid.o.payload.write),
        ]
        for lane, product in enumerate(products):
            m.d.comb += skid.i.payload.beat.data[lane].eq(product)

        # ---- control -----------------------------------------------------------------------
        finished = (running & (pairs_left == 0) & ~mul_ctl.busy & ~skid.o.valid)
        m.d.comb += self.busy.eq(running)
        with m.If(start):
            m.d.sync += [
                tokens.eq(self.tokens), hidden.eq(self.hidden), capacity.eq(self.capacity),
                num_experts.eq(self.num_experts),
                beats.eq((self.hidden + (p.lanes - 1)) >> lanes_log2),
                last_enable.eq(Mux(remainder == 0, (1 << p.lanes) - 1,
                                   (Const(1, p.lanes + 1) << remainder) - 1)),
                headers_left.eq(self.tokens), pairs_left.eq(self.tokens),
                self.done.eq(0), self.error.eq(0), self.dropped.eq(0),
            ]
            with m.If(too_big):
                m.d.sync += [self.error.eq(1), self.done.eq(1)]
            with m.Elif(empty):
                m.d.sync += self.done.eq(1)
                with m.If((self.hidden != 0) &
                          ((self.capacity == 0) | (self.num_experts == 0))):
                    m.d.sync += self.dropped.eq(self.tokens)
            with m.Else():
                m.d.sync += running.eq(1)
        with m.If(finished):
            m.d.sync += [running.eq(0), self.done.eq(1)]
        return m
