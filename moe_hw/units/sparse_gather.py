"""The sparse gather unit: the DUET ``SparseDispatcher.dispatch()`` move (SPEC 1.3).

For every slot s in order, ``expert_input[s, :] = input[batch_index[s], :]``: the rows of the
token-major ``input`` [S, H] gathered into expert-major slot order (``part_sizes`` then splits
the result per expert; an expert with no slots simply has no rows). Elements are moved, never
changed: the ``format`` only sets the element width (32 bits for fp32, 16 for fp16 and bf16).

Streams and ports (payload fields are listed least significant first):

``header`` (in)
    One beat per slot: ``index``, the slot's ``batch_index`` (two's complement,
    ``index_width`` bits; any bit pattern is safe).
``read_request`` (out), ``read_response`` (in)
    A memory read port into ``input`` (element addresses, row ``r`` at ``r*H``), as
    :class:`~moe_hw.blocks.row_reader.RowReader`: requests ``{addr, enable}``, in-order
    responses ``{data}`` with any latency.
``data`` (out)
    ``ceil(H / lanes)`` beats per slot, in slot order: ``data`` (``lanes`` elements, lane 0
    first), ``enable`` (lane enables: partial on a row's last beat when H is not a multiple of
    ``lanes``; the disabled lanes carry whatever the memory returned for them, zeros for a
    skipped row) and ``last`` (a row's last beat). The data is one LUT from two registers
    written in turn (the row reader's ``alternate_data``), for a consumer that registers it.
``start``, ``slots``, ``tokens``, ``hidden`` (in)
    Run-time problem size, sampled when ``start`` is high while idle (the shared
    :class:`~moe_hw.blocks.run_control.RunControl`): ``slots`` (the number of headers, n),
    ``tokens`` (S, the rows of ``input``), ``hidden`` (H).
``busy``, ``done``, ``error``, ``dropped`` (out)
    ``done`` rises when the last beat has left and stays high until the next start.
    ``dropped`` counts the slots whose ``batch_index`` is outside ``[0, tokens)``: such a slot
    reads nothing and its row comes out as all-zero bits (the row count and order of the
    output never change), and ``error`` is set. ``error`` is also set, and nothing done, when
    a run-time size exceeds its generation-time maximum.

Zero-element problems (``slots`` or ``hidden`` zero) finish at once: ``done`` two cycles after
start, nothing read, nothing out.

Throughput: one beat per cycle when nothing stalls (one-beat rows included); a stall anywhere
costs only the cycles it lasts. Stall-free, with a memory that answers a request taken at the
end of cycle u from cycle u + L, a run takes exactly :meth:`SparseGatherParams.cycles` =
``slots * ceil(H / lanes) + overhead(L)`` cycles from the start cycle to the cycle ``done`` is
first seen, with ``overhead(L) = START_LATENCY + header_latency + L + 4`` (= L + 8 at the
default maxima; L counts as 1 when no slot is in range, as nothing waits for the memory then,
and as at least 6 with more than 16 beats in flight: :meth:`RowReader.join_latency`).

Pipeline: the header stage checks the range and forms the row address ``index*H`` on a
registered multiplier (:func:`~moe_hw.arith.product.pipelined_product`, ``dsp`` chooses its
blocks; :attr:`SparseGatherParams.header_latency` stages, 2 for operands of up to 18 bits);
a skid buffer passes the row commands to the row reader, which issues the row's reads and
realigns the responses.
"""

from dataclasses import dataclass

from amaranth.hdl import Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.params import FORMAT_NAMES, dsp_param
from ..arith.product import pipelined_product, product_latency
from ..blocks.block_memory import bram_param
from ..blocks.row_reader import RowReader, last_enable_of, request_layout, response_layout
from ..blocks.run_control import EMPTY_CYCLES, START_LATENCY, RunControl, run_ports
from ..formats import float_format
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import PipelineControl, SkidBuffer, delay

__all__ = ["SparseGatherParams", "SparseGatherUnit", "WIDTH_FORMATS"]

#: The old ``width`` parameter (bits per element) -> the ``format`` that replaces it.
WIDTH_FORMATS = {32: "fp32", 16: "fp16"}


@dataclass(frozen=True)
class SparseGatherParams(UnitParams):
    """Generation-time parameters of :class:`SparseGatherUnit`.

    The old ``width`` (bits per element) is accepted for ``format``: 32 means fp32, 16 fp16
    (the element width is all the unit uses of the format)."""

    ALIASES = {"width": "format"}

    format: str = param("fp32", choices=FORMAT_NAMES, doc="sets the element width")
    lanes: int = param(4, choices=LANES)
    max_slots: int = param(4096, minimum=1, maximum=1 << 30, doc="n, the headers of one run")
    max_tokens: int = param(4096, minimum=1, maximum=1 << 30, doc="S, the rows of input")
    max_hidden: int = param(4096, minimum=1, maximum=1 << 30)
    index_width: int = param(32, minimum=2, maximum=64)
    max_outstanding: int = param(16, minimum=4, maximum=4096,
                                 doc="beats in flight; full rate needs memory latency <= this - 1")
    dsp: str = dsp_param()
    bram: str = bram_param()

    def __post_init__(self):
        # The alias ``width`` arrives here as ``format`` with its old value: convert it.
        if not isinstance(self.format, str) and self.format in WIDTH_FORMATS:
            object.__setattr__(self, "format", WIDTH_FORMATS[self.format])
        super().__post_init__()

    def check(self):
        self.check_signed_fits("index_width", "max_tokens")

    @property
    def fmt(self):
        return float_format(self.format)

    @property
    def row_bits(self):
        """Bits of an in-range ``batch_index`` (a row of ``input``)."""
        return max(1, bits_for(self.max_tokens - 1))

    @property
    def header_latency(self):
        """Cycles of the header stage: the range check and the row address ``index*H`` on a
        pipelined product."""
        return product_latency(self.row_bits, bits_for(self.max_hidden))

    @property
    def max_beats(self):
        return -(-self.max_hidden // self.lanes)

    @property
    def addr_width(self):
        return max(1, ceil_log2(self.max_tokens * self.max_hidden))

    def overhead(self, memory_latency=1):
        """Stall-free cycles beyond one per output beat, for a memory that answers a request
        taken at the end of cycle u from cycle u + ``memory_latency``: run control (start,
        decide), header stage (:attr:`header_latency`), command skid buffer, row reader
        command register, the
        memory, the reader's skid buffer, done register."""
        return START_LATENCY + self.header_latency + 1 + 1 + memory_latency + 1 + 1

    def cycles(self, slots, hidden, memory_latency=1, *, reads=True):
        """Exact stall-free cycles of a run (start cycle to the first cycle ``done`` is high).
        ``reads``: whether any slot is in range; a run that reads nothing never waits for
        the memory, so it costs what it would with a one-cycle memory. A memory quicker than
        the row reader's in-flight queue counts as that (:meth:`RowReader.join_latency`)."""
        if slots == 0 or hidden == 0:
            return EMPTY_CYCLES
        return slots * -(-hidden // self.lanes) + self.overhead(
            RowReader.join_latency(self.max_outstanding, memory_latency if reads else 1))

    def header_layout(self):
        return data.StructLayout({"index": signed(self.index_width)})

    def data_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.fmt.width, self.lanes),
                                  "enable": self.lanes, "last": 1})


class SparseGatherUnit(wiring.Component):
    """Row gather by ``batch_index`` on a memory read port, one beat per cycle. See the module
    docstring for the protocol."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(SparseGatherParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "header": In(stream.Signature(p.header_layout())),
            "read_request": Out(stream.Signature(request_layout(p.lanes, p.addr_width))),
            "read_response": In(stream.Signature(response_layout(p.lanes, p.fmt.width))),
            "data": Out(stream.Signature(p.data_layout())),
            **run_ports(self.sizes),
            "dropped": Out(range(p.max_slots + 1)),
        })

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order."""
        p = self.params
        return {"slots": p.max_slots, "tokens": p.max_tokens, "hidden": p.max_hidden}

    def elaborate(self, platform):
        m = Module()
        p = self.params
        lanes_log2 = ceil_log2(p.lanes)

        # ---- run control: start, held sizes, done / error ---------------------------------
        ctl = m.submodules.control = RunControl(self.sizes, empty_when_zero=("slots", "hidden"))
        ctl.connect(m, self)
        running = ctl.running
        tokens = ctl.size("tokens")
        hidden = ctl.size("hidden")
        beats = Signal(range(p.max_beats + 1))
        headers_left = Signal.like(self.slots)

        # The beats' data leaves the reader from two registers written in turn (its
        # ``alternate_data``; whoever takes ``data`` registers it): the choice of the response
        # or zeros then ends in a register whose clock enable no handshake reaches (behind
        # AXI, the wrapped unit's paths ran from the in-flight queue's head through that
        # choice into the output register's clock-enabled data).
        reader = m.submodules.reader = RowReader(
            lanes=p.lanes, width=p.fmt.width, addr_width=p.addr_width, max_count=p.max_beats,
            outstanding=p.max_outstanding, bram=p.bram, alternate_data=True)
        wiring.connect(m, reader.request, wiring.flipped(self.read_request))
        wiring.connect(m, wiring.flipped(self.read_response), reader.response)
        m.d.comb += [
            self.data.valid.eq(reader.beats.valid),
            self.data.payload.data.eq(reader.beats.payload.data),
            self.data.payload.enable.eq(reader.beats.payload.enable),
            self.data.payload.last.eq(reader.beats.payload.last),
            reader.beats.ready.eq(self.data.ready),
        ]

        # ---- header stage: range check and row address ---------------------------------
        hdr = m.submodules.header_ctl = PipelineControl(p.header_latency)
        # Registered "a header is still to come": no count compare on the ready path.
        headers_open = Signal()
        header_open = running & headers_open
        m.d.comb += [
            hdr.i_valid.eq(self.header.valid & header_open),
            self.header.ready.eq(hdr.en & header_open),
        ]
        index = self.header.payload.index
        in_range = (index >= 0) & (index < tokens)
        # index*H on registered DSP blocks; an out-of-range index's address is never used.
        base = pipelined_product(m, index.as_unsigned()[:p.row_bits], hidden, en=hdr.en,
                                 dsp=p.dsp, name="row_base")[:p.addr_width]
        skip = delay(m, ~in_range, p.header_latency, hdr.en, name="skip")
        with m.If(self.header.valid & self.header.ready):
            m.d.sync += [headers_left.eq(headers_left - 1), headers_open.eq(headers_left != 1)]

        # A skid buffer between the header stage and the reader: the reader's command ready
        # (its beat count and the read port's ready) does not reach the header stage's enable.
        cmd_skid = m.submodules.command_skid = SkidBuffer(reader.command.payload.shape())
        m.d.comb += [
            cmd_skid.i.valid.eq(hdr.o_valid),
            hdr.o_ready.eq(cmd_skid.i.ready),
            cmd_skid.i.payload.addr.eq(base),
            cmd_skid.i.payload.count.eq(beats),
            cmd_skid.i.payload.tail.eq(1),
            cmd_skid.i.payload.skip.eq(skip),
        ]
        wiring.connect(m, cmd_skid.o, reader.command)
        # A batch_index outside [0, S) is an error (counted as it enters the skid buffer).
        dropping = cmd_skid.i.valid & cmd_skid.i.ready & skip
        m.d.comb += ctl.fault.eq(dropping)
        with m.If(dropping):
            m.d.sync += self.dropped.eq(self.dropped + 1)

        # ---- control -----------------------------------------------------------------------
        last_en = Signal(p.lanes)
        m.d.comb += reader.last_enable.eq(last_en)
        m.d.comb += ctl.finished.eq(running & ~headers_open & ~hdr.busy & ~cmd_skid.o.valid &
                                    ~reader.busy)
        with m.If(ctl.accept):
            m.d.sync += [
                beats.eq((self.hidden + (p.lanes - 1)) >> lanes_log2),
                last_en.eq(last_enable_of(self.hidden, p.lanes)),
                headers_left.eq(self.slots),
                headers_open.eq(self.slots != 0),
                self.dropped.eq(0),
            ]
        return m
