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
``start``, ``pairs``, ``hidden``, ``capacity``, ``num_experts`` (in)
    Run-time problem size, sampled when ``start`` is high while idle (the shared
    :class:`~moe_hw.blocks.run_control.RunControl`). ``pairs`` is the number of headers
    (S, or k*S for top-k).
``busy``, ``done``, ``dropped``, ``error`` (out)
    ``done`` rises when the last write has left and stays high until the next start.
    ``dropped`` counts the pairs that fail the mask. ``error`` is set when a run-time size
    exceeds its generation-time maximum; such a run does nothing.

Zero-element problems (``pairs``, ``hidden``, ``capacity`` or ``num_experts`` zero) finish at
once: ``done`` one cycle after start, no stream is read, nothing is written. ``dropped`` then
reads ``pairs`` when the capacity or the expert count is zero (every pair fails the mask) and
0 when ``hidden`` is zero (no pair carries data).

Throughput: one data beat per cycle when nothing stalls, including back-to-back one-beat
pairs; a stall anywhere costs only the cycles it lasts. Stall-free, a run of ``pairs``
pairs takes exactly ``pairs * ceil(H / lanes) + overhead`` cycles from the start cycle to
the cycle ``done`` is first seen (see :attr:`DispatchUnit.overhead`).

Pipeline: the shared :class:`~moe_hw.blocks.slot_address.SlotAddress` checks the mask and
forms ``(index*C + location)*H`` on registered DSP blocks; the current-pair register walks ``addr`` from
there in steps of ``lanes``; ``lanes`` float multipliers form ``gate * element``; a skid
buffer drives ``write`` so that ``write.ready`` has no combinational path to the inputs.
"""

from dataclasses import dataclass

from amaranth.hdl import Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..arith.fmul import FloatMultiplierCore
from ..arith.params import FORMAT_NAMES, FloatDatapathParams, dsp_param
from ..blocks.row_reader import last_enable_of
from ..blocks.row_beats import row_beats
from ..blocks.run_control import START_LATENCY, RunControl, run_ports
from ..blocks.slot_address import header_slot_stage, slot_latency
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import PipelineControl, SkidBuffer, delay

__all__ = ["DispatchParams", "DispatchUnit"]


@dataclass(frozen=True)
class DispatchParams(FloatDatapathParams, UnitParams):
    """Generation-time parameters of :class:`DispatchUnit`."""

    ALIASES = {"max_tokens": "max_pairs"}

    format: str = param("fp32", choices=FORMAT_NAMES)
    lanes: int = param(4, choices=LANES)
    max_pairs: int = param(4096, minimum=1, maximum=1 << 30, doc="headers per run (k*S)")
    max_hidden: int = param(4096, minimum=1, maximum=1 << 30)
    max_capacity: int = param(4096, minimum=1, maximum=1 << 30)
    max_experts: int = param(64, minimum=1, maximum=1 << 30)
    index_width: int = param(32, minimum=2, maximum=64)
    mul_stages: int | None = param(None, minimum=0, maximum=16, optional=True,
                                   doc="None: the multiplier's default depth for the format")
    dsp: str = dsp_param()

    def check(self):
        self.check_signed_fits("index_width", "max_capacity", "max_experts")

    @property
    def stages(self):
        return self.mul_latency

    @property
    def overhead(self):
        """Stall-free cycles beyond one per data beat: run control (start, decide), slot
        address, header skid
        buffer, current-pair register, multiplier, skid buffer, done register."""
        return START_LATENCY + slot_latency(self) + 1 + 1 + self.stages + 1 + 1

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

    def __init__(self, params=None, **kwargs):
        params = resolve_params(DispatchParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "header": In(stream.Signature(p.header_layout())),
            "data": In(stream.Signature(p.data_layout())),
            "write": Out(stream.Signature(p.write_layout())),
            **run_ports(self.sizes),
            "dropped": Out(range(p.max_pairs + 1)),
        })

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order."""
        p = self.params
        return {"pairs": p.max_pairs, "hidden": p.max_hidden, "capacity": p.max_capacity,
                "num_experts": p.max_experts}

    @property
    def latency(self):
        """Cycles from a data beat entering to its write leaving (multiplier + skid buffer)."""
        return self.params.stages + 1

    @property
    def overhead(self):
        """Stall-free cycles beyond one per data beat (:attr:`DispatchParams.overhead`)."""
        return self.params.overhead

    def elaborate(self, platform):
        m = Module()
        p = self.params
        lanes_log2 = ceil_log2(p.lanes)

        # ---- run control: start, held sizes, done / error ---------------------------------
        ctl = m.submodules.control = RunControl(self.sizes, empty_when_zero=self.sizes)
        ctl.connect(m, self)
        running = ctl.running
        beats = Signal(range(-(-p.max_hidden // p.lanes) + 1))  # data beats per pair
        last_enable = Signal(p.lanes)                              # lane enables of the last beat
        headers_left = Signal.like(self.pairs)
        pairs_left = Signal.like(self.pairs)

        # ---- header pipeline: mask and slot address -----------------------------------------
        stage = header_slot_stage(m, self.header, ctl, p, open=running & (headers_left != 0),
                                  addr_width=p.addr_width)
        header_ctl, base, h_valid = stage.ctl, stage.address, stage.in_range
        en_h = header_ctl.en
        h_gate = delay(m, self.header.payload.gate, stage.ctl.latency, en_h, name="h_gate")
        # A skid buffer between the header pipeline and the current pair: the pipeline's
        # enable then depends on registers only, not on the data stream.
        h_skid = m.submodules.header_skid = SkidBuffer(data.StructLayout({
            "gate": p.fmt.width, "valid": 1, "base": p.addr_width}))
        m.d.comb += [
            h_skid.i.valid.eq(header_ctl.o_valid),
            header_ctl.o_ready.eq(h_skid.i.ready),
            h_skid.i.payload.gate.eq(h_gate),
            h_skid.i.payload.valid.eq(h_valid),
            h_skid.i.payload.base.eq(base),
        ]
        pair = h_skid.o.payload

        # ---- current pair: walks the addresses of its beats ------------------------------
        mul_ctl = m.submodules.mul_ctl = PipelineControl(p.stages)
        cur_loaded = Signal()
        cur_valid = Signal()
        cur_gate = Signal(p.fmt.width)
        cur_addr = Signal(p.addr_width)
        m.d.comb += self.data.ready.eq(running & cur_loaded & mul_ctl.en)
        beat_take = self.data.valid & self.data.ready
        header_take = Signal()
        _, last_beat = row_beats(m, beats, start=header_take, step=beat_take)
        cur_free = ~cur_loaded | (beat_take & last_beat)
        m.d.comb += [h_skid.o.ready.eq(cur_free), header_take.eq(h_skid.o.valid & cur_free)]

        with m.If(beat_take):
            m.d.sync += cur_addr.eq(cur_addr + p.lanes)
            with m.If(last_beat):
                m.d.sync += [cur_loaded.eq(0), pairs_left.eq(pairs_left - 1)]
        with m.If(header_take):
            m.d.sync += [cur_loaded.eq(1), cur_valid.eq(pair.valid), cur_gate.eq(pair.gate),
                         cur_addr.eq(pair.base)]
            with m.If(~pair.valid):
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
            mul = FloatMultiplierCore(p.format, p.stages, dsp=p.dsp)
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
        m.d.comb += ctl.finished.eq(running & (pairs_left == 0) & ~mul_ctl.busy &
                                    ~skid.o.valid)
        with m.If(ctl.accept):
            m.d.sync += [
                beats.eq((self.hidden + (p.lanes - 1)) >> lanes_log2),
                last_enable.eq(last_enable_of(self.hidden, p.lanes)),
                headers_left.eq(self.pairs), pairs_left.eq(self.pairs),
                self.dropped.eq(0),
            ]
        # Every pair fails the mask when there is no slot, but none carries data when H is
        # zero.
        with m.If(ctl.decide & ~ctl.too_big & (ctl.size("hidden") != 0) &
                  ((ctl.size("capacity") == 0) | (ctl.size("num_experts") == 0))):
            m.d.sync += self.dropped.eq(ctl.size("pairs"))
        return m
