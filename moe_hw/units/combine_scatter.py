"""The scatter-add combine unit (DUET ``SparseDispatcher.combine``, SPEC 1.3).

For every slot s, in the order the headers arrive (slot order: expert-major, token-ascending
within an expert, as ``sparse_dispatch_indices`` gives it)::

    if 0 <= token < S:
        out[token, j] = out[token, j] + gate * expert_out[s, j]      for j in 0..H-1

each product rounded, then each sum rounded (IEEE-754 round to nearest even). ``out`` is the
token-indexed buffer ``[S, H]``, row-major: element ``(token, j)`` is at address
``token*H + j``. It must hold +0.0 when the run starts (the caller clears it, as dispatch's
output is "all zero before the operator runs"), so every token starts its sum from +0.0.

Where ``out`` lives: behind a read port and a write port, not in a memory the unit owns. The
buffer is a large tensor (S*H elements: 1024 x 512 float32 is 2 MiB, the SPEC 1.1 network scale
is 36 MiB), so SPEC 2 puts it off-unit; the same unit can then sit in front of block RAM,
UltraRAM or a DRAM controller, and the buffer is shared with whoever reads the result. An
owned ``amaranth.lib.memory.Memory`` would fix the latency (and could forward), but would size
the bitstream by ``max_tokens*max_hidden`` and need a separate read-out path.

Memory port contract: responses come in request order; a read request taken in a cycle after
a write was taken returns the written data (read-after-write ordering, as a RAM gives and as
a memory controller must keep). The unit never relies on a read and a write to the same
address in the same cycle.

Streams and ports (payload fields are listed least significant first):

``header`` (in)
    One beat per slot: ``token`` (two's complement, ``index_width`` bits; any bit pattern is
    safe) and ``gate`` (the format's bits).
``data`` (in)
    ``ceil(H / lanes)`` beats per slot, ``lanes`` elements each, lane 0 first; the last beat
    of a slot is padded past H (the padding is never written).
``read`` (out), ``read_data`` (in)
    The read port of the buffer: request ``{addr, enable}`` (element address of lane 0, lane
    enables), response ``{data}`` (``lanes`` elements) in request order.
``write`` (out)
    The write port: ``{addr, data, enable}`` as the dispatch unit's.
``start``, ``tokens``, ``slots``, ``hidden`` (in)
    Run-time problem size (S, the number of headers, H), sampled when ``start`` is high while
    idle (the shared :class:`~moe_hw.blocks.run_control.RunControl`).
``busy``, ``done``, ``dropped``, ``error`` (out)
    ``done`` rises when the last write has been taken and stays high until the next start.
    ``dropped`` counts slots whose token is outside ``[0, S)``: their data beats are taken
    and discarded, nothing is read or written for them. ``error`` is set when a run-time size
    exceeds its maximum; such a run does nothing.

Zero-element problems (``slots``, ``tokens`` or ``hidden`` zero) finish at once: ``done`` one
cycle after start, no stream is read, nothing is read or written. ``dropped`` then reads
``slots`` when ``tokens`` is zero and ``hidden`` is not (every slot fails the mask), else 0.

Read-modify-write hazard: a slot's beat at address A reads ``out`` at A, adds, and writes A
back ``hazard_window`` cycles later. If a later slot has the same token, its beat at A must
not read A until that write has been taken. An in-flight tracker holds the address of every
beat between its issue (read request) and its write being taken (at most ``max_outstanding``
beats, retired in order); a beat is issued only when no tracked address equals its own. Only a
true conflict (same token, same beat) stalls, for exactly as long as it must.

Throughput and exact cycle counts (no stalls from the streams or the memory; memory read
latency ``read_latency``: a request taken in cycle c is answered from cycle c + latency):

- no hazard: one data beat per cycle; a run of n slots takes exactly
  ``n * ceil(H / lanes) + overhead(read_latency)`` cycles from the start cycle to the cycle
  ``done`` is first seen (``CombineScatterParams.cycles``; the last slot not dropped),
  provided ``max_outstanding >= hazard_window(read_latency)``. ``overhead = 3 +
  hazard_window`` and ``hazard_window = max(mul_latency + 2, 1 + read_latency) + add_latency + 2``
  (join: the product through the multiplier and the FIFO, or the read round trip; the
  adder; the write skid buffer and the write being taken);
- a hazard: a beat at the address of a beat issued in cycle c issues no earlier than
  ``c + hazard_window``. So a slot that repeats the previous slot's token (same token on
  back-to-back slots) costs ``max(0, hazard_window - ceil(H / lanes))`` cycles, one whose
  token was last seen d beats earlier costs ``max(0, hazard_window - d)``, and the beats after
  its first flow at full rate again. ``CombineScatterParams.replay_cycles`` gives the exact
  count of any slot order (dropped slots included).

Pipeline: header stage (mask, ``token*H``); the current-slot register walks ``addr``; issue
(read request into a skid buffer, tracker entry, ``lanes`` multipliers ``gate * element``,
free-running); the products wait in a FIFO (``max_outstanding`` deep, never full: at most
``max_outstanding`` beats are in flight) for the read data; ``lanes`` adders form
``old + product``; a skid buffer drives ``write``.
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.fadd import FloatAdderCore
from ..arith.fmul import FloatMultiplierCore
from ..arith.params import FORMAT_NAMES, FloatDatapathParams, dsp_param
from ..blocks.row_reader import last_enable_of
from ..blocks.run_control import EMPTY_CYCLES, START_LATENCY, RunControl, run_ports
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import PipelineControl, SkidBuffer, delay

__all__ = ["CombineScatterParams", "CombineScatterUnit"]

#: FIFO latency: an entry written in cycle c is readable from cycle c + 2 (SyncFIFOBuffered).
_FIFO_LATENCY = 2


@dataclass(frozen=True)
class CombineScatterParams(FloatDatapathParams, UnitParams):
    """Generation-time parameters of :class:`CombineScatterUnit`."""

    format: str = param("fp32", choices=FORMAT_NAMES)
    lanes: int = param(4, choices=LANES)
    max_tokens: int = param(4096, minimum=1, maximum=1 << 30, doc="S, the token buffer's rows")
    max_slots: int = param(65536, minimum=1, maximum=1 << 30, doc="headers per run")
    max_hidden: int = param(4096, minimum=1, maximum=1 << 30)
    index_width: int = param(32, minimum=2, maximum=64, doc="the header's token field")
    max_outstanding: int = param(32, minimum=2, maximum=1024, power_of_two=True,
                                 doc="beats between issue and write (the hazard tracker)")
    mul_stages: int | None = param(None, minimum=0, maximum=16, optional=True,
                                   doc="None: the multiplier's default depth for the format")
    dsp: str = dsp_param()
    add_stages: int | None = param(None, minimum=0, maximum=16, optional=True,
                                   doc="None: the adder's default depth for the format")

    def check(self):
        self.check_signed_fits("index_width", "max_tokens")

    @property
    def addr_width(self):
        return max(1, ceil_log2(self.max_tokens * self.max_hidden))

    def header_layout(self):
        return data.StructLayout({"token": signed(self.index_width), "gate": self.fmt.width})

    def data_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.fmt.width, self.lanes)})

    def read_layout(self):
        return data.StructLayout({"addr": self.addr_width, "enable": self.lanes})

    def write_layout(self):
        return data.StructLayout({
            "addr": self.addr_width,
            "data": data.ArrayLayout(self.fmt.width, self.lanes),
            "enable": self.lanes,
        })

    # ---- exact stall-free timing ----------------------------------------------------------

    def join_delay(self, read_latency):
        """Cycles from a beat's issue to its read data and product meeting at the adder:
        the product path (multiplier, FIFO) or the read path (request skid buffer, memory),
        whichever is longer."""
        return max(self.mul_latency + _FIFO_LATENCY, 1 + read_latency)

    def hazard_window(self, read_latency):
        """Cycles from a beat's issue to the earliest issue of a beat at the same address:
        join, adder, write skid buffer (the write is taken), tracker update."""
        return self.join_delay(read_latency) + self.add_latency + 2

    #: Cycles from the start cycle to the first data beat's cycle: run control (start,
    #: decide), header stage, current-slot register.
    LEAD = START_LATENCY + 2

    def overhead(self, read_latency):
        """Stall-free cycles beyond one per data beat when the last slot is not dropped: the
        lead-in, then from the last beat's issue cycle t: its write is taken in cycle
        ``t + hazard_window - 1``, ``finished`` is high in the next cycle and ``done`` in the
        one after."""
        return self.LEAD + self.hazard_window(read_latency)

    def cycles(self, slots, hidden, read_latency):
        """Exact stall-free cycles of a run of ``slots`` slots without hazards or a dropped
        last slot: ``slots * ceil(H / lanes) + overhead``; 1 for a zero-element run."""
        if slots == 0 or hidden == 0:
            return EMPTY_CYCLES
        return slots * -(-hidden // self.lanes) + self.overhead(read_latency)

    def replay_cycles(self, tokens_in_order, hidden, read_latency):
        """Exact stall-free cycles of a run for ANY slot order: replays the issue schedule
        against the tracker. ``tokens_in_order`` has every slot's token, ``None`` for a
        dropped slot (its beats are taken and discarded at full rate). A beat at the address
        of a beat issued in cycle c issues no earlier than ``c + hazard_window``; the run ends
        ``hazard_window + 1`` cycles after its last issued beat (``done`` is seen then), or 2
        cycles after its last discarded one, whichever is later."""
        if not tokens_in_order or hidden == 0:
            return EMPTY_CYCLES
        beats = -(-hidden // self.lanes)
        window = self.hazard_window(read_latency)
        issued = {}          # (token, beat) -> issue cycle of its latest beat
        cycle, end = 0, 0
        for token in tokens_in_order:
            for beat in range(beats):
                if token is None:
                    end = max(end, cycle + 2)
                else:
                    last = issued.get((token, beat))
                    if last is not None and cycle < last + window:
                        cycle = last + window
                    issued[(token, beat)] = cycle
                    end = max(end, cycle + window + 1)
                cycle += 1
        return self.LEAD + end


class CombineScatterUnit(wiring.Component):
    """Streaming scatter-add combine with an in-flight address tracker for the
    read-modify-write hazard. See the module docstring for the protocol and timing."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(CombineScatterParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "header": In(stream.Signature(p.header_layout())),
            "data": In(stream.Signature(p.data_layout())),
            "read": Out(stream.Signature(p.read_layout())),
            "read_data": In(stream.Signature(p.data_layout())),
            "write": Out(stream.Signature(p.write_layout())),
            **run_ports(self.sizes),
            "dropped": Out(range(p.max_slots + 1)),
        })

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order."""
        p = self.params
        return {"tokens": p.max_tokens, "slots": p.max_slots, "hidden": p.max_hidden}

    def hazard_window(self, read_latency):
        return self.params.hazard_window(read_latency)

    def overhead(self, read_latency):
        return self.params.overhead(read_latency)

    def elaborate(self, platform):
        m = Module()
        p = self.params
        lanes_log2 = ceil_log2(p.lanes)
        width = p.fmt.width
        depth = p.max_outstanding

        # ---- run control: start, held sizes, done / error ---------------------------------
        ctl = m.submodules.control = RunControl(self.sizes, empty_when_zero=self.sizes)
        ctl.connect(m, self)
        running = ctl.running
        tokens = ctl.size("tokens")
        hidden = ctl.size("hidden")
        beats = Signal(range(-(-p.max_hidden // p.lanes) + 1))
        last_enable = Signal(p.lanes)
        headers_left = Signal.like(self.slots)
        slots_left = Signal.like(self.slots)

        # ---- header stage: mask and row address --------------------------------------------
        header = self.header.payload
        header_ctl = m.submodules.header_ctl = PipelineControl(1)
        header_open = running & (headers_left != 0)
        m.d.comb += [
            header_ctl.i_valid.eq(self.header.valid & header_open),
            self.header.ready.eq(header_ctl.en & header_open),
        ]
        en_h = header_ctl.en
        in_range = (header.token >= 0) & (header.token < tokens)
        token_bits = max(1, bits_for(p.max_tokens - 1))
        base = Signal(p.addr_width)
        with m.If(en_h):
            m.d.sync += base.eq(header.token.as_unsigned()[:token_bits] * hidden)
        h_gate = delay(m, header.gate, 1, en_h, name="h_gate")
        h_valid = delay(m, in_range, 1, en_h, name="h_in_range")
        with m.If(self.header.valid & self.header.ready):
            m.d.sync += headers_left.eq(headers_left - 1)

        # ---- in-flight tracker: addresses of beats between issue and write taken ----------
        track_addr = [Signal(p.addr_width, name=f"track_addr{i}") for i in range(depth)]
        track_valid = Signal(depth)
        track_head = Signal(range(depth))       # next entry to fill (issue)
        track_tail = Signal(range(depth))       # oldest entry (retired when its write is taken)
        inflight = Signal(range(depth + 1))

        # ---- current slot: walks the addresses of its beats ----------------------------------
        cur_loaded = Signal()
        cur_valid = Signal()
        cur_gate = Signal(width)
        cur_addr = Signal(p.addr_width)
        beat = Signal.like(beats)
        last_beat = beat == beats - 1
        enable = Signal(p.lanes)
        m.d.comb += enable.eq(Mux(last_beat, last_enable, (1 << p.lanes) - 1))

        conflict = Signal()
        m.d.comb += conflict.eq(Cat(*[track_valid[i] & (track_addr[i] == cur_addr)
                                      for i in range(depth)]).any())
        read_skid = m.submodules.read_skid = SkidBuffer(p.read_layout())
        can_issue = read_skid.i.ready & (inflight != depth) & ~conflict
        # A dropped slot's beats are taken and discarded at full rate.
        m.d.comb += self.data.ready.eq(running & cur_loaded & (~cur_valid | can_issue))
        beat_take = self.data.valid & self.data.ready
        issue = Signal()
        m.d.comb += issue.eq(beat_take & cur_valid)
        cur_free = ~cur_loaded | (beat_take & last_beat)
        m.d.comb += header_ctl.o_ready.eq(cur_free)
        header_take = header_ctl.o_valid & cur_free

        with m.If(beat_take):
            m.d.sync += [beat.eq(beat + 1), cur_addr.eq(cur_addr + p.lanes)]
            with m.If(last_beat):
                m.d.sync += [cur_loaded.eq(0), slots_left.eq(slots_left - 1)]
        with m.If(header_take):
            m.d.sync += [cur_loaded.eq(1), cur_valid.eq(h_valid), cur_gate.eq(h_gate),
                         cur_addr.eq(base), beat.eq(0)]
            with m.If(~h_valid):
                m.d.sync += self.dropped.eq(self.dropped + 1)

        # ---- issue: read request, tracker entry, gate multiply ------------------------------
        m.d.comb += [
            read_skid.i.valid.eq(issue),
            read_skid.i.payload.addr.eq(cur_addr),
            read_skid.i.payload.enable.eq(enable),
            self.read.valid.eq(read_skid.o.valid),
            self.read.payload.eq(read_skid.o.payload),
            read_skid.o.ready.eq(self.read.ready),
        ]
        retire = self.write.valid & self.write.ready
        set_mask = Signal(depth)
        clear_mask = Signal(depth)
        m.d.comb += [
            set_mask.eq(Mux(issue, Const(1, depth) << track_head, 0)),
            clear_mask.eq(Mux(retire, Const(1, depth) << track_tail, 0)),
        ]
        m.d.sync += track_valid.eq((track_valid & ~clear_mask) | set_mask)
        for i in range(depth):
            with m.If(set_mask[i]):
                m.d.sync += track_addr[i].eq(cur_addr)
        with m.If(issue):
            m.d.sync += track_head.eq(track_head + 1)      # depth is a power of two: wraps
        with m.If(retire):
            m.d.sync += track_tail.eq(track_tail + 1)
        with m.If(issue & ~retire):
            m.d.sync += inflight.eq(inflight + 1)
        with m.Elif(retire & ~issue):
            m.d.sync += inflight.eq(inflight - 1)

        # The multipliers run freely: the FIFO behind them always has room, since it and the
        # pipeline hold at most ``depth`` beats between them.
        always = Const(1)
        product_layout = data.StructLayout({
            "product": data.ArrayLayout(width, p.lanes),
            "addr": p.addr_width,
            "enable": p.lanes,
        })
        products = Signal(product_layout)
        for lane in range(p.lanes):
            mul = FloatMultiplierCore(p.format, p.mul_latency, dsp=p.dsp)
            m.submodules[f"mul{lane}"] = mul
            m.d.comb += [mul.a.eq(cur_gate), mul.b.eq(self.data.payload.data[lane]),
                         mul.en.eq(always), products.product[lane].eq(mul.product)]
        m.d.comb += [
            products.addr.eq(delay(m, cur_addr, p.mul_latency, always, name="m_addr")),
            products.enable.eq(delay(m, enable, p.mul_latency, always, name="m_enable")),
        ]
        m_valid = delay(m, issue, p.mul_latency, always, name="m_valid")

        fifo = m.submodules.product_fifo = SyncFIFOBuffered(width=product_layout.size,
                                                            depth=depth)
        m.d.comb += [fifo.w_en.eq(m_valid), fifo.w_data.eq(products.as_value())]
        head = data.View(product_layout, fifo.r_data)

        # ---- join the read data with the product, add ---------------------------------------
        add_ctl = m.submodules.add_ctl = PipelineControl(p.add_latency)
        m.d.comb += [
            add_ctl.i_valid.eq(fifo.r_rdy & self.read_data.valid),
            fifo.r_en.eq(add_ctl.en & self.read_data.valid),
            self.read_data.ready.eq(add_ctl.en & fifo.r_rdy),
        ]
        write_skid = m.submodules.write_skid = SkidBuffer(p.write_layout())
        for lane in range(p.lanes):
            add = FloatAdderCore(p.format, p.add_latency)
            m.submodules[f"add{lane}"] = add
            m.d.comb += [add.a.eq(self.read_data.payload.data[lane]),
                         add.b.eq(head.product[lane]), add.en.eq(add_ctl.en),
                         write_skid.i.payload.data[lane].eq(add.sum)]
        m.d.comb += [
            write_skid.i.payload.addr.eq(delay(m, head.addr, p.add_latency, add_ctl.en,
                                               name="a_addr")),
            write_skid.i.payload.enable.eq(delay(m, head.enable, p.add_latency, add_ctl.en,
                                                 name="a_enable")),
            write_skid.i.valid.eq(add_ctl.o_valid),
            add_ctl.o_ready.eq(write_skid.i.ready),
            self.write.valid.eq(write_skid.o.valid),
            self.write.payload.eq(write_skid.o.payload),
            write_skid.o.ready.eq(self.write.ready),
        ]

        # ---- control ---------------------------------------------------------------------------
        m.d.comb += ctl.finished.eq(running & (slots_left == 0) & (inflight == 0))
        with m.If(ctl.accept):
            m.d.sync += [
                beats.eq((self.hidden + (p.lanes - 1)) >> lanes_log2),
                last_enable.eq(last_enable_of(self.hidden, p.lanes)),
                headers_left.eq(self.slots), slots_left.eq(self.slots),
                self.dropped.eq(0),
            ]
        # Every slot fails the mask when there is no token, but none carries data when H is
        # zero.
        with m.If(ctl.decide & ~ctl.too_big & (ctl.size("hidden") != 0) &
                  (ctl.size("tokens") == 0)):
            m.d.sync += self.dropped.eq(ctl.size("slots"))
        return m
