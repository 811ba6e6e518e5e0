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
    ``dropped`` counts the pairs that fail the mask (it restarts two cycles after start).
    ``error`` is set when a run-time size
    exceeds its generation-time maximum; such a run does nothing.

Zero-element problems (``pairs``, ``hidden``, ``capacity`` or ``num_experts`` zero) finish at
once: ``done`` two cycles after start (the run control's decide cycle), no stream is read,
nothing is written. ``dropped`` then
reads ``pairs`` when the capacity or the expert count is zero (every pair fails the mask) and
0 when ``hidden`` is zero (no pair carries data).

Throughput: one data beat per cycle when nothing stalls, including back-to-back one-beat
pairs; a stall anywhere costs only the cycles it lasts. Stall-free, a run of ``pairs``
pairs takes exactly ``pairs * ceil(H / lanes) + overhead`` cycles from the start cycle to
the cycle ``done`` is first seen (see :attr:`DispatchUnit.overhead`).

Pipeline: the shared :class:`~moe_hw.blocks.slot_address.SlotAddress` checks the mask and
forms ``(index*C + location)*H`` on registered DSP blocks into a queue whose front entry (a
read of its ring) is the current pair; the beat counter walks ``addr`` from there in steps of
``lanes``; the data beats wait in a ring of their own (both rings' reads are registered
every cycle, so that taking a beat advances only their read pointers); ``lanes``
float multipliers form ``gate * element`` in a pipeline that never stalls
(:class:`~moe_hw.stream.CreditPipeline`: a beat enters only when the output queue has room
for it), and the queue drives ``write``, so that ``write.ready`` reaches no clock enable of
the datapath and has no combinational path to the inputs.

With ``gate_one`` (a postscore dispatch, as inside :class:`~moe_hw.units.moe_layer.MoELayer`)
every gate is 1.0: the header's gate is not read, and each lane's multiplier gives way to a
register of the element and its NaN flag (``1.0 * x`` is ``x`` bit for bit, a NaN the
multiplier's canonical quiet NaN), so a run is ``mul_latency - 1`` cycles shorter
(:attr:`DispatchParams.overhead`).
"""

from dataclasses import dataclass

from amaranth.hdl import Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..arith.float_core import unpack
from ..arith.fmul import FloatMultiplierCore
from ..arith.params import FORMAT_NAMES, FloatDatapathParams, dsp_param
from ..blocks.row_reader import last_enable_of
from ..blocks.row_beats import row_beats
from ..blocks.run_control import START_LATENCY, RunControl, run_ports
from ..blocks.slot_address import header_slot_queue, slot_latency
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import ALTERNATE_GROUP_BITS, CreditPipeline, delay, replicated

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
    gate_one: bool = param(False, choices=(False, True),
                           doc="every gate is 1.0 (tutel's postscore dispatch): no multiplier, "
                               "the header's gate is not read")

    def check(self):
        self.check_signed_fits("index_width", "max_capacity", "max_experts")

    @property
    def stages(self):
        """The gate multiply's stages: the multiplier's, or with :attr:`gate_one` one
        register (``1.0 * x`` is ``x``, a NaN the multiplier's canonical quiet NaN)."""
        return 1 if self.gate_one else self.mul_latency

    @property
    def late_operands(self):
        """At 16 lanes the data ring's read pointers follow the take a cycle late
        (``CreditPipeline(late_read=True)``): the lane groups' pointer copies span the chip,
        and the take reached the far ones in the cycle it was made (216.8 MHz). The operands
        are then loaded a cycle later: one cycle more per run."""
        return self.lanes >= 16

    @property
    def overhead(self):
        """Stall-free cycles beyond one per data beat: run control (start, decide), slot
        address, header queue (its ring's read is the current pair), operand register (a
        cycle later with :attr:`late_operands`), multiplier, output queue, its idle register,
        done register."""
        return (START_LATENCY + slot_latency(self) + CreditPipeline.RING_LATENCY + 1 +
                self.late_operands + self.stages +
                CreditPipeline.QUEUE_LATENCY + CreditPipeline.IDLE_LATENCY + 1)

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
        """Cycles from a data beat entering to its write leaving (operand register, a cycle
        later with late operands, multiplier, output queue)."""
        return 1 + self.params.late_operands + self.params.stages + CreditPipeline.QUEUE_LATENCY

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
        headers_open = Signal()                  # headers_left != 0, as a register
        pairs_left = Signal.like(self.pairs)

        # ---- header pipeline: mask and slot address, then a queue -------------------------
        # The queue's ring drives its output (no skid buffer): the front entry, read at the
        # ring's read pointer, is the current pair, popped when its last beat is taken, which
        # advances a few pointer registers instead of loading a register of the pair's width.
        h_queue = header_slot_queue(m, self.header, ctl, p, open=running & headers_open,
                                    addr_width=p.addr_width,
                                    carry=() if p.gate_one else ("gate",), skid=False)
        h_out = h_queue.o
        with m.If(h_queue.take):
            m.d.sync += [headers_left.eq(headers_left - 1), headers_open.eq(headers_left != 1)]

        # ---- current pair: walks the addresses of its beats ------------------------------
        # The multipliers never stall: a beat enters only when the output queue has room.
        out_layout = data.StructLayout({"beat": p.write_layout(), "write": 1})
        # Beats of dropped pairs vanish at the queue's output (``keep``); the beat is held in
        # two registers written in turn (``alternate``), so that ``write.ready`` reaches only
        # the output's flags and pointers, not the clock enable of lanes x 32 data bits.
        # Its ready is decided a credit ahead (``ready_ahead``): the take fans out across the
        # lanes, and the credit count's loop through it was the critical path at 16 lanes.
        # Each group of the beat's registers has its own copy of the skid flag
        # (``group_flags``; the write port's ready is a register in front of it): one flag's
        # net to the far groups' clock enables was on the critical path at 16 lanes.
        mul_ctl = m.submodules.mul_pipe = CreditPipeline(1 + p.late_operands + p.stages,
                                                         out_layout,
                                                         keep="write", alternate=("beat",),
                                                         group_bits=ALTERNATE_GROUP_BITS,
                                                         group_flags=True, ready_ahead=True)
        pair = h_out.payload
        # The data beats enter through a one-register credit pipeline whose ring drives its
        # output (only while the run is on, so that nothing is left in it after one): the
        # beat's handshake starts from registers, and taking a beat advances the ring's read
        # pointer copies only; the operand registers load the ring's read every cycle. (A
        # skid buffer here puts the take on the clock enable of lanes x 32 payload bits.) Its
        # ready is decided a credit ahead, so that the take does not loop back into it.
        data_in = m.submodules.data_in = CreditPipeline(1, p.data_layout(), skid=False,
                                                         ready_ahead=True,
                                                         late_read=p.late_operands)
        beats_in = data_in.o
        # The data input takes the run control's own copy of the run flag (``stopped``): the
        # flag's net spans the unit, and the input's take and credit count were on it.
        m.d.comb += [
            data_in.i_valid.eq(self.data.valid & ~ctl.stopped),
            data_in.payload.eq(delay(m, self.data.payload, 1, 1, name="data_in", reset_less=True)),
            self.data.ready.eq(data_in.i_ready & ~ctl.stopped),
        ]
        # (A pair is in the queue only while the run is on.)
        m.d.comb += [
            mul_ctl.i_valid.eq(beats_in.valid & h_out.valid),
            beats_in.ready.eq(h_out.valid & mul_ctl.i_ready),
        ]
        beat_take = mul_ctl.take
        pair_done = Signal()
        # The beat walk restarts in the decide cycle (a register; no beat is taken before the
        # run begins), not from the begin decision.
        beat, last_beat = row_beats(m, beats, start=ctl.decide | pair_done, step=beat_take)
        m.d.comb += [pair_done.eq(beat_take & last_beat), h_out.ready.eq(pair_done)]
        offset = beat << lanes_log2                  # the beat's element offset in its row
        # The pair's bookkeeping, a cycle later (off the handshake path). Every field of the
        # ring's read goes straight into registers (no logic between the ring and them).
        done_pair = delay(m, pair_done, 1, 1, name="done_pair")
        in_range = delay(m, pair.in_range, 1, 1, name="pair_in_range")
        done_dropped = done_pair & ~in_range
        with m.If(done_pair):
            m.d.sync += pairs_left.eq(pairs_left - 1)
        with m.If(done_dropped):
            m.d.sync += self.dropped.eq(self.dropped + 1)

        # ---- gate multiply ---------------------------------------------------------------
        # Beats of dropped pairs travel the pipeline too, as items that write nothing, so
        # that the run's cycle count does not depend on which pairs are dropped.
        # The operands are registered first, next to each lane's multiplier.
        # A copy of the gate register per group of up to four lanes (two copies at most
        # lanes 8, four at 16): the gate fans out to every lane's operand logic, and the
        # lanes that share a copy share the logic that classifies it too.
        # (With late operands the beat's data reaches its operand registers a cycle after the
        # take, and the gate follows it through a register.)
        if p.gate_one:
            # A gate of 1.0 (``gate_one``): ``1.0 * x`` is ``x`` bit for bit, and a NaN is the
            # canonical quiet NaN, as the multiplier gives it. The element and its NaN flag
            # are registered, then chosen: the choice is not mapped onto the register's
            # set/reset, whose net from the flag's LUTs was 4 ns.
            for lane in range(p.lanes):
                x = delay(m, beats_in.payload.data[lane], 1, 1, name=f"lane_data{lane}",
                          reset_less=True)
                nan = delay(m, unpack(m, p.fmt, x, name=f"lane{lane}").nan, 1, 1,
                            name=f"lane_nan{lane}", reset_less=True)
                x = delay(m, x, 1, 1, name=f"lane_one{lane}", reset_less=True)
                m.d.comb += mul_ctl.payload.beat.data[lane].eq(Mux(nan, p.fmt.quiet_nan, x))
        else:
            gate = delay(m, pair.gate, 1, 1, name="gate_late") if p.late_operands else pair.gate
            gates = replicated(m, gate, name="lane_gate", copies=min(4, max(2, p.lanes // 4)))
            for lane in range(p.lanes):
                mul = FloatMultiplierCore(p.format, p.stages, dsp=p.dsp)
                m.submodules[f"mul{lane}"] = mul
                m.d.comb += [mul.a.eq(gates[len(gates) * lane // p.lanes]),
                             mul.b.eq(delay(m, beats_in.payload.data[lane], 1, 1,
                                            name=f"lane_data{lane}", reset_less=True)),
                             mul.en.eq(1), mul_ctl.payload.beat.data[lane].eq(mul.product)]
        enable = Mux(last_beat, last_enable, Const((1 << p.lanes) - 1, p.lanes))
        latency = mul_ctl.latency
        # The pair's address (the ring's read) and the offset are registered before the
        # add, so that no carry chain follows the ring's read.
        if latency >= 2:
            addr = (delay(m, pair.address, 1, 1, name="w_row", reset_less=True) +
                    delay(m, offset, 1, 1, name="w_offset", reset_less=True))[:p.addr_width]
            addr = delay(m, addr, latency - 1, 1, name="w_addr", reset_less=True)
        else:
            addr = delay(m, (pair.address + offset)[:p.addr_width], latency, 1,
                         name="w_addr", reset_less=True)
        m.d.comb += [
            mul_ctl.payload.beat.addr.eq(addr),
            mul_ctl.payload.beat.enable.eq(delay(m, enable, latency, 1,
                                                 name="w_enable", reset_less=True)),
            mul_ctl.payload.write.eq(delay(m, in_range, latency - 1, 1, name="w_write")),
        ]

        # Items that write nothing leave the queue too and vanish at its output (``keep``).
        out = mul_ctl.o
        m.d.comb += [
            self.write.valid.eq(out.valid),
            self.write.payload.eq(out.payload.beat),
            out.ready.eq(self.write.ready),
        ]

        # ---- control -----------------------------------------------------------------------
        pairs_done = Signal()           # registered: pairs_left is loaded at accept
        m.d.sync += pairs_done.eq(pairs_left == 0)
        m.d.comb += ctl.finished.eq(running & pairs_done & ~mul_ctl.busy)
        with m.If(ctl.accept):
            m.d.sync += [
                beats.eq((self.hidden + (p.lanes - 1)) >> lanes_log2),
                last_enable.eq(last_enable_of(self.hidden, p.lanes)),
                headers_left.eq(self.pairs), headers_open.eq(self.pairs != 0),
                pairs_left.eq(self.pairs),
            ]
        # Every pair fails the mask when there is no slot, but none carries data when H is
        # zero (registered at accept, used in the decide cycle).
        no_slot = Signal()
        with m.If(ctl.accept):
            m.d.sync += no_slot.eq((self.hidden != 0) &
                                   ((self.capacity == 0) | (self.num_experts == 0)))
        # The count restarts in the decide cycle (a register), not at accept: its clock
        # enable is then two registers, not the start handshake.
        with m.If(ctl.decide):
            m.d.sync += self.dropped.eq(Mux(~ctl.too_big & no_slot, ctl.size("pairs"), 0))
        return m
