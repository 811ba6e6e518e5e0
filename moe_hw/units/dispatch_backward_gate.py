"""The dispatch backward-gate unit (tutel / MLU-OPS, SPEC 1.1 backward, gate gradient).

For every (k, i) pair in k-major order (pair p = k*S + i)::

    grad_gates[k, i] = sum_j input[i, j] * grad_dispatch[index*C + location, j]   (valid pair)
                     = +0.0                                                       (otherwise)

a pair being valid when ``0 <= index < E and 0 <= location < C``. The sum is taken in exactly
the order of ``golden.dispatch_backward_gate(..., lanes=lanes)``: each product is rounded;
element j goes to lane partial ``j % lanes``, which starts at +0.0 and adds its elements in
ascending j, rounding after each add; then the ``lanes`` partials are reduced by the fixed
pairwise tree ``p[m] = p[2m] + p[2m + 1]``.

Streams and ports (payload fields are listed least significant first):

``header`` (in)
    One beat per pair, k-major: ``index`` and ``location`` (two's complement,
    ``index_width`` bits each; any bit pattern is safe). The token i is implicit: the pairs
    count i = 0..S-1 for k = 0, then again for k = 1, ...
``input_read`` (out), ``input_data`` (in)
    Read port of ``input`` [S, H], row-major: request ``{addr, enable}`` (element address
    ``i*H + j`` of lane 0, lane enables), response ``{data}``, in request order.
``grad_read`` (out), ``grad_data`` (in)
    Read port of ``grad_dispatch`` [E*C, H]: request at ``(index*C + location)*H + j``.
``grad_gate`` (out)
    One beat per pair, in pair order: ``value``, the format's bits.
``start``, ``tokens``, ``top_k``, ``hidden``, ``capacity``, ``num_experts`` (in)
    Run-time problem size (S, k, H, C, E), sampled when ``start`` is high while idle (the
    shared :class:`~moe_hw.blocks.run_control.RunControl`).
``busy``, ``done``, ``dropped``, ``error`` (out)
    ``done`` rises when the last result has been taken and stays high until the next start.
    ``dropped`` counts the pairs that fail the mask (their result is +0.0; nothing is read
    for them). ``error`` is set when a run-time size exceeds its maximum; such a run does
    nothing.

A problem without pairs (``tokens`` or ``top_k`` zero) finishes at once: ``done`` two cycles
after start, no stream is read. With ``hidden``, ``capacity`` or ``num_experts`` zero every
pair still gets its +0.0 result (an empty sum, or a dropped pair), and nothing is read.

The loop-carried dependency: a lane partial needs its previous sum, which takes
``add_latency`` (= L) cycles to come out of the adder. The unit therefore interleaves G = L
pairs: pairs are taken in groups of G, and within a group the beats are issued round-robin,
``for beat b: for pair g in the group: (g, b)``. Each lane's adder advances only when an item
enters it, so the sum that leaves it is always the one that entered G items earlier, i.e.
the same pair's previous beat: it is fed straight back (``+0.0`` instead on beat 0). A
pair's final partials leave the adders when its last beat's successor G items later enters;
they go into the ``lanes - 1`` adder tree. Every pair of a group has the same number of
beats, so results leave in pair order. The last group is padded to G with dummy pairs (no
reads, not output), and one round of G dummy items pushes the last results out. Invalid
pairs travel the same way (no reads, products forced to +0.0), so the cycle count depends
only on the problem size. A lane past H on the last beat adds +0.0, which leaves a partial
unchanged: a partial is never -0.0 (it starts at +0.0, and a rounded sum is -0.0 only when
both addends are), so ``x + (+0.0) = x`` for every x, NaN included.

Throughput and exact cycle count: one beat per cycle. Stall-free (streams and memory, read
latency ``read_latency``: a request taken in cycle c is answered from cycle c + latency), a
run of P = k*S pairs with B = ``max(1, ceil(H / lanes))`` beats each issues
``ceil(P / G) * G * B + G`` items at one per cycle, and takes exactly
``DispatchBackwardGateParams.cycles(P, H, read_latency)`` cycles from the start cycle to the cycle
``done`` is first seen; when P is a multiple of G that is ``P * B + overhead(read_latency)``
(``overhead(L) = lead + G - 1 + max(2, 1 + L) + mul_latency + levels * add_latency + 3``,
``lead = setup + 1 + slot_latency + 1``: 11 + 10 + (1 + L) + 12 + 22 + 3 = L + 59 at the
defaults with L >= 1). The ideal is ``P * B``; the excess (a partial last group's padding, the
flush round, the
pipeline) is fixed per run. Full rate needs ``max_outstanding >= read_latency + 2``.

Pipeline: run setup (P = tokens * top_k on a pipelined product of the held sizes, in the
run control's setup cycles); header stages (the shared
:class:`~moe_hw.blocks.slot_address.SlotAddress`: mask and ``slot = index*C + location``,
then ``slot*H``) and a skid buffer (the pair's ``i*H`` is counted as it enters); issue (the
group's pairs in a G-entry distributed-RAM table, read one item ahead into a register; a
per-round beat offset; the last-beat flag registered; two read requests into skid buffers, a
descriptor into a FIFO of
``max_outstanding``); join
(the descriptor with both responses); ``lanes`` multipliers; ``lanes`` accumulating adders;
the adder tree; a skid buffer drives ``grad_gate``.
"""

from dataclasses import dataclass

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.lib.memory import Memory
from amaranth.utils import bits_for, ceil_log2

from ..arith.fadd import FloatAdderCore
from ..arith.fmul import FloatMultiplierCore
from ..arith.params import FORMAT_NAMES, FloatDatapathParams, dsp_param
from ..arith.product import pipelined_product, product_latency
from ..blocks.row_beats import row_beats
from ..blocks.row_reader import last_enable_of
from ..blocks.run_control import EMPTY_CYCLES, RunControl, run_ports
from ..blocks.slot_address import header_slot_stage, slot_latency
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import PipelineControl, SkidBuffer, delay

__all__ = ["DispatchBackwardGateParams", "DispatchBackwardGateUnit"]

#: FIFO latency: an entry written in cycle c is readable from cycle c + 2 (SyncFIFOBuffered).
_FIFO_LATENCY = 2


@dataclass(frozen=True)
class DispatchBackwardGateParams(FloatDatapathParams, UnitParams):
    """Generation-time parameters of :class:`DispatchBackwardGateUnit`."""

    format: str = param("fp32", choices=FORMAT_NAMES)
    lanes: int = param(4, choices=LANES)
    max_tokens: int = param(4096, minimum=1, maximum=1 << 30, doc="S")
    max_top_k: int = param(8, minimum=1, maximum=1 << 30)
    max_hidden: int = param(4096, minimum=1, maximum=1 << 30)
    max_capacity: int = param(4096, minimum=1, maximum=1 << 30)
    max_experts: int = param(64, minimum=1, maximum=1 << 30)
    index_width: int = param(32, minimum=2, maximum=64)
    max_outstanding: int = param(16, minimum=2, maximum=1024, power_of_two=True,
                                 doc="issued items waiting for read data")
    mul_stages: int | None = param(None, minimum=0, maximum=16, optional=True,
                                   doc="None: the multiplier's default depth for the format")
    dsp: str = dsp_param()
    # The accumulation interleaves add_stages pairs; a combinational adder would close a
    # combinational loop through its own output.
    add_stages: int | None = param(None, minimum=1, maximum=16, optional=True,
                                   doc="None: the adder's default depth for the format")

    def check(self):
        self.check_signed_fits("index_width", "max_capacity", "max_experts")

    @property
    def max_pairs(self):
        return self.max_tokens * self.max_top_k

    @property
    def interleave(self):
        """G: the pairs accumulated round-robin (the adder latency)."""
        return self.add_latency

    @property
    def tree_levels(self):
        return ceil_log2(self.lanes)

    @property
    def input_addr_width(self):
        return max(1, ceil_log2(self.max_tokens * self.max_hidden))

    @property
    def grad_addr_width(self):
        return max(1, ceil_log2(self.max_experts * self.max_capacity * self.max_hidden))

    def header_layout(self):
        return data.StructLayout({"index": signed(self.index_width),
                                  "location": signed(self.index_width)})

    def read_layout(self, addr_width):
        return data.StructLayout({"addr": addr_width, "enable": self.lanes})

    def data_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.fmt.width, self.lanes)})

    def result_layout(self):
        return data.StructLayout({"value": self.fmt.width})

    # ---- exact stall-free timing ----------------------------------------------------------

    @property
    def setup(self):
        """The run control's setup cycles: the decide cycle, then P = tokens * top_k on a
        pipelined product of the held sizes."""
        return 1 + product_latency(bits_for(self.max_tokens), bits_for(self.max_top_k))

    @property
    def header_latency(self):
        """Cycles of the header pipeline: the slot address, then the pair skid buffer."""
        return slot_latency(self) + 1

    @property
    def lead(self):
        """Cycles from the start cycle to the first item's issue: the start cycle, the setup
        cycles, the header pipeline (``setup + 1 + header_latency``; 11 at the default
        maxima)."""
        return self.setup + 1 + self.header_latency

    def join_delay(self, read_latency, reads=True):
        """Stall-free cycles from an item's issue to its join with its read data. Joins are
        in order, so an item without reads waits as long as the reading items before it:
        the read round trip (request skid buffer, memory) if any item of the run reads, else
        the FIFO latency."""
        return max(_FIFO_LATENCY, 1 + read_latency) if reads else _FIFO_LATENCY

    def cycles(self, pairs, hidden, read_latency, *, reads=True):
        """Exact stall-free cycles of a run of ``pairs`` pairs, from the start cycle to the
        cycle ``done`` is first seen (``EMPTY_CYCLES`` when there are no pairs). ``reads``:
        whether any pair
        reads (it is valid and H > 0).

        With G = :attr:`interleave`, B = ``max(1, ceil(H / lanes))``, ``groups =
        ceil(pairs / G)`` and r = ``pairs - (groups - 1) * G`` real pairs in the last group,
        the items issue one per cycle from cycle ``lead``: ``groups * G * B`` group items,
        then the G flush items. The last pair's partials leave the adders when flush item
        ``r - 1`` enters them (issue + join delay + multiplier); the tree and the output
        skid buffer follow (``levels * add_latency + 1``) unless the remaining ``G - r``
        flush items take longer to clear the multiplier; then the ``finished`` cycle and the
        done register::

            lead + groups*G*B + (r - 1) + join_delay + mul_latency
                 + max(levels*add_latency + 1, G - r) + 2
        """
        if pairs == 0:
            return EMPTY_CYCLES
        g = self.interleave
        beats = max(1, -(-hidden // self.lanes))
        groups = -(-pairs // g)
        last_members = pairs - (groups - 1) * g
        return (self.lead + groups * g * beats + last_members - 1 +
                self.join_delay(read_latency, reads) + self.mul_latency +
                max(self.tree_levels * self.add_latency + 1, g - last_members) + 2)

    def overhead(self, read_latency):
        """Stall-free cycles beyond ``pairs * B`` when ``pairs`` is a multiple of G (whole
        groups) and some pair reads: :meth:`cycles` with r = G."""
        return (self.lead + self.interleave - 1 + self.join_delay(read_latency) +
                self.mul_latency + self.tree_levels * self.add_latency + 1 + 2)


class DispatchBackwardGateUnit(wiring.Component):
    """Streaming gate gradient of dispatch: per pair, a dot product of an ``input`` row and a
    ``grad_dispatch`` row in the golden model's lane/tree order, one beat per cycle. See the
    module docstring for the protocol, the interleaving and the timing."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(DispatchBackwardGateParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "header": In(stream.Signature(p.header_layout())),
            "input_read": Out(stream.Signature(p.read_layout(p.input_addr_width))),
            "input_data": In(stream.Signature(p.data_layout())),
            "grad_read": Out(stream.Signature(p.read_layout(p.grad_addr_width))),
            "grad_data": In(stream.Signature(p.data_layout())),
            "grad_gate": Out(stream.Signature(p.result_layout())),
            **run_ports(self.sizes),
            "dropped": Out(range(p.max_pairs + 1)),
        })

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order."""
        p = self.params
        return {"tokens": p.max_tokens, "top_k": p.max_top_k, "hidden": p.max_hidden,
                "capacity": p.max_capacity, "num_experts": p.max_experts}

    def overhead(self, read_latency):
        return self.params.overhead(read_latency)

    def elaborate(self, platform):
        m = Module()
        p = self.params
        lanes_log2 = ceil_log2(p.lanes)
        group = p.interleave
        depth = p.max_outstanding
        max_beats = max(1, -(-p.max_hidden // p.lanes))
        all_lanes = (1 << p.lanes) - 1

        # ---- run control: start, held sizes, done / error; no pairs is an empty run --------
        # The setup cycles form P = tokens * top_k from the held sizes on a pipelined product.
        ctl = m.submodules.control = RunControl(self.sizes, empty_when_zero=("tokens", "top_k"),
                                                setup=p.setup)
        ctl.connect(m, self)
        running = ctl.running
        tokens = ctl.size("tokens")
        hidden = ctl.size("hidden")
        pairs = pipelined_product(m, tokens, ctl.size("top_k"), en=1, dsp=p.dsp,
                                  name="pairs")[:bits_for(p.max_pairs)]
        beats = Signal(range(max_beats + 1))
        last_enable = Signal(p.lanes)
        has_data = Signal()                      # H > 0: a valid pair reads
        headers_left = Signal.like(pairs)
        headers_open = Signal()                  # headers_left != 0, as a register

        # ---- header pipeline: mask and slot, then the grad_dispatch row address ---------------
        stage = header_slot_stage(m, self.header, ctl, p, open=running & headers_open,
                                  addr_width=p.grad_addr_width)
        header_ctl = stage.ctl
        with m.If(self.header.valid & self.header.ready):
            m.d.sync += [headers_left.eq(headers_left - 1), headers_open.eq(headers_left != 1)]

        # A skid buffer between the header pipeline and the issue sequencer (the sequencer's
        # ready does not reach the pipeline's enable); the pair's input row address i*H is
        # counted as a header enters it.
        pair_layout = data.StructLayout({"grad": p.grad_addr_width, "input": p.input_addr_width,
                                         "in_range": 1})
        pair_skid = m.submodules.pair_skid = SkidBuffer(pair_layout)
        token = Signal(range(p.max_tokens))      # the input row of the next header's pair
        last_token = Signal.like(token)          # tokens - 1
        input_base = Signal(p.input_addr_width)  # token * H
        m.d.sync += last_token.eq(tokens - 1)
        m.d.comb += [
            pair_skid.i.valid.eq(header_ctl.o_valid),
            header_ctl.o_ready.eq(pair_skid.i.ready),
            pair_skid.i.payload.grad.eq(stage.address),
            pair_skid.i.payload.input.eq(input_base),
            pair_skid.i.payload.in_range.eq(stage.in_range),
        ]
        with m.If(pair_skid.i.valid & pair_skid.i.ready):
            with m.If(~stage.in_range):
                m.d.sync += self.dropped.eq(self.dropped + 1)
            with m.If(token == last_token):
                m.d.sync += [token.eq(0), input_base.eq(0)]
            with m.Else():
                m.d.sync += [token.eq(token + 1), input_base.eq(input_base + hidden)]
        h = pair_skid.o.payload

        # ---- issue sequencer: groups of G pairs, beats round-robin over the group ------------
        issuing = Signal()                       # items left to issue in this run
        flushing = Signal()                      # the final round of G dummy items
        pairs_left = Signal.like(pairs)          # pairs whose header is still to be taken
        more_pairs = Signal()                    # pairs_left != 0
        last_pair = Signal()                     # pairs_left == 1
        member = Signal(range(group))            # position in the group
        next_member = Signal(range(group))       # the member after it
        last_member = Signal()                   # member == G - 1
        first_beat = Signal()                    # the round of beat 0 (takes the headers)
        beat_offset = Signal(max(p.input_addr_width, p.grad_addr_width))   # beat * lanes
        # The group's pairs, one entry per member, written on beat 0: the row addresses,
        # whether the pair reads, whether it is a pair at all. The entry of the next member is
        # read one item ahead into ``ahead`` (distributed RAM, read at a register), so that an
        # item's fields are registers. Written at an item's issue, an entry is next read at
        # the issue of the item G - 1 later: at least a cycle later when G >= 2.
        entry_layout = data.StructLayout({"grad": p.grad_addr_width,
                                          "input": p.input_addr_width,
                                          "live": 1, "real": 1})
        ahead = Signal(entry_layout)
        if group > 1:
            table = m.submodules.group_table = Memory(shape=entry_layout, depth=group, init=[])
            table_read = table.read_port(domain="comb")
            table_write = table.write_port()
            m.d.comb += table_read.addr.eq(next_member)

        issue = Signal()
        step = issue & last_member               # a round of the group ends
        # The beat of the round in hand, and its registered "last beat of the rows" flag.
        new_round = Signal()
        _, last_beat = row_beats(m, beats, start=new_round, step=step, name="round")
        m.d.comb += new_round.eq(ctl.begin | (step & last_beat))
        need_header = first_beat & ~flushing & more_pairs

        live = Signal()
        real = Signal()
        grad_addr = Signal(p.grad_addr_width)
        input_addr = Signal(p.input_addr_width)
        m.d.comb += [
            live.eq(Mux(first_beat, need_header & h.in_range, ahead.live)),
            real.eq(Mux(first_beat, need_header, ahead.real)),
            # beat_offset is 0 on beat 0.
            grad_addr.eq(Mux(first_beat, h.grad, ahead.grad + beat_offset)),
            input_addr.eq(Mux(first_beat, h.input, ahead.input + beat_offset)),
        ]
        reads = Signal()
        enable = Signal(p.lanes)
        m.d.comb += [
            reads.eq(live & has_data),
            enable.eq(Mux(reads, Mux(last_beat, last_enable, all_lanes), 0)),
        ]

        input_skid = m.submodules.input_skid = SkidBuffer(p.read_layout(p.input_addr_width))
        grad_skid = m.submodules.grad_skid = SkidBuffer(p.read_layout(p.grad_addr_width))
        outstanding = Signal(range(depth + 1))
        join = Signal()
        m.d.comb += issue.eq(issuing & (outstanding != depth) &
                             (~need_header | pair_skid.o.valid) &
                             (~reads | (input_skid.i.ready & grad_skid.i.ready)))
        take_header = issue & need_header
        m.d.comb += pair_skid.o.ready.eq(take_header)
        # The group just issued was the last: no header is left once this item's is taken.
        no_pairs_after = ~more_pairs | (take_header & last_pair)

        item = Signal(entry_layout)              # the item's pair, as the table keeps it
        m.d.comb += [item.grad.eq(Mux(first_beat, h.grad, ahead.grad)),
                     item.input.eq(Mux(first_beat, h.input, ahead.input)),
                     item.live.eq(live), item.real.eq(real)]
        if group > 1:
            m.d.comb += [table_write.en.eq(issue & first_beat), table_write.addr.eq(member),
                         table_write.data.eq(item)]
        with m.If(issue):
            # G = 1: the next item is the same pair's next beat.
            m.d.sync += ahead.eq(table_read.data if group > 1 else item)
        with m.If(take_header):
            m.d.sync += [pairs_left.eq(pairs_left - 1), more_pairs.eq(~last_pair),
                         last_pair.eq(pairs_left == 2)]
        with m.If(issue):
            if group > 1:
                m.d.sync += [member.eq(next_member),
                             next_member.eq(Mux(next_member == group - 1, 0, next_member + 1)),
                             last_member.eq(next_member == group - 1)]
            with m.If(last_member):
                with m.If(flushing):
                    m.d.sync += [issuing.eq(0), flushing.eq(0)]
                with m.Elif(last_beat):
                    m.d.sync += [first_beat.eq(1), beat_offset.eq(0)]
                    with m.If(no_pairs_after):
                        m.d.sync += flushing.eq(1)
                with m.Else():
                    m.d.sync += [first_beat.eq(0), beat_offset.eq(beat_offset + p.lanes)]

        m.d.comb += [
            input_skid.i.valid.eq(issue & reads),
            input_skid.i.payload.addr.eq(input_addr),
            input_skid.i.payload.enable.eq(enable),
            grad_skid.i.valid.eq(issue & reads),
            grad_skid.i.payload.addr.eq(grad_addr),
            grad_skid.i.payload.enable.eq(enable),
        ]
        wiring.connect(m, wiring.flipped(self.input_read), input_skid.o)
        wiring.connect(m, wiring.flipped(self.grad_read), grad_skid.o)

        # ---- descriptors wait for their read data ---------------------------------------------
        descriptor_layout = data.StructLayout({
            "reads": 1,       # the item has read data to wait for
            "enable": p.lanes,  # lanes whose product counts; the others add +0.0
            "first": 1,       # beat 0: the partials start from +0.0
            "result": 1,      # the last beat of a real pair: its partials leave for the tree
        })
        descriptor = Signal(descriptor_layout)
        m.d.comb += [
            descriptor.reads.eq(reads),
            descriptor.enable.eq(enable),
            descriptor.first.eq(first_beat),
            descriptor.result.eq(real & last_beat),
        ]
        fifo = m.submodules.descriptor_fifo = SyncFIFOBuffered(width=descriptor_layout.size,
                                                               depth=depth)
        m.d.comb += [fifo.w_en.eq(issue), fifo.w_data.eq(descriptor.as_value())]
        head = data.View(descriptor_layout, fifo.r_data)
        with m.If(issue & ~join):
            m.d.sync += outstanding.eq(outstanding + 1)
        with m.Elif(join & ~issue):
            m.d.sync += outstanding.eq(outstanding - 1)

        # ---- join and multiply ------------------------------------------------------------------
        mul_ctl = m.submodules.mul_ctl = PipelineControl(p.mul_latency)
        both = self.input_data.valid & self.grad_data.valid
        arrived = ~head.reads | both
        m.d.comb += [
            mul_ctl.i_valid.eq(fifo.r_rdy & arrived),
            join.eq(fifo.r_rdy & arrived & mul_ctl.en),
            fifo.r_en.eq(mul_ctl.en & arrived),
            self.input_data.ready.eq(mul_ctl.en & fifo.r_rdy & head.reads &
                                     self.grad_data.valid),
            self.grad_data.ready.eq(mul_ctl.en & fifo.r_rdy & head.reads &
                                    self.input_data.valid),
        ]
        en_m = mul_ctl.en
        m_enable = delay(m, head.enable, p.mul_latency, en_m, name="m_enable")
        m_first = delay(m, head.first, p.mul_latency, en_m, name="m_first")
        m_result = delay(m, head.result, p.mul_latency, en_m, name="m_result")
        products = []
        for lane in range(p.lanes):
            mul = FloatMultiplierCore(p.format, p.mul_latency, dsp=p.dsp)
            m.submodules[f"mul{lane}"] = mul
            m.d.comb += [mul.a.eq(self.input_data.payload.data[lane]),
                         mul.b.eq(self.grad_data.payload.data[lane]), mul.en.eq(en_m)]
            # A lane without data (past H, invalid or dummy pair) contributes +0.0.
            products.append(Mux(m_enable[lane], mul.product, 0))

        # ---- accumulate: G pairs interleaved through the adders, advancing per item ----------
        tree_ctl = m.submodules.tree_ctl = PipelineControl(p.tree_levels * p.add_latency)
        advance = Signal()
        # Whether the sum now leaving the adders is a pair's final partials (it entered G
        # items ago); the shift register loads only when an item enters, as the adders do.
        leaving_result = delay(m, m_result, p.add_latency, advance, name="acc_result")
        m.d.comb += [
            advance.eq(mul_ctl.o_valid & (~leaving_result | tree_ctl.en)),
            mul_ctl.o_ready.eq(advance),
            tree_ctl.i_valid.eq(advance & leaving_result),
        ]
        partials = []
        for lane in range(p.lanes):
            acc = FloatAdderCore(p.format, p.add_latency)
            m.submodules[f"acc{lane}"] = acc
            m.d.comb += [acc.a.eq(Mux(m_first, 0, acc.sum)), acc.b.eq(products[lane]),
                         acc.en.eq(advance)]
            partials.append(acc.sum)

        # ---- the fixed pairwise tree: p[m] = p[2m] + p[2m + 1] ---------------------------------
        level = 0
        while len(partials) > 1:
            reduced = []
            for pos in range(len(partials) // 2):
                add = FloatAdderCore(p.format, p.add_latency)
                m.submodules[f"tree{level}_{pos}"] = add
                m.d.comb += [add.a.eq(partials[2 * pos]), add.b.eq(partials[2 * pos + 1]),
                             add.en.eq(tree_ctl.en)]
                reduced.append(add.sum)
            partials = reduced
            level += 1

        out_skid = m.submodules.out_skid = SkidBuffer(p.result_layout())
        m.d.comb += [
            out_skid.i.valid.eq(tree_ctl.o_valid),
            out_skid.i.payload.value.eq(partials[0]),
            tree_ctl.o_ready.eq(out_skid.i.ready),
        ]
        wiring.connect(m, wiring.flipped(self.grad_gate), out_skid.o)

        # ---- control ----------------------------------------------------------------------------
        m.d.comb += ctl.finished.eq(running & ~issuing & (outstanding == 0) & ~mul_ctl.busy &
                                    ~tree_ctl.busy & ~out_skid.o.valid)
        with m.If(ctl.accept):
            m.d.sync += [
                beats.eq(Mux(self.hidden == 0, 1, (self.hidden + (p.lanes - 1)) >> lanes_log2)),
                last_enable.eq(Mux(self.hidden == 0, 0, last_enable_of(self.hidden, p.lanes))),
                has_data.eq(self.hidden != 0),
                token.eq(0), input_base.eq(0), self.dropped.eq(0),
            ]
        with m.If(ctl.begin):
            # P > 0 here (an empty run never begins).
            m.d.sync += [
                headers_left.eq(pairs), headers_open.eq(1),
                pairs_left.eq(pairs), more_pairs.eq(1), last_pair.eq(pairs == 1),
                member.eq(0), next_member.eq(1 % group), last_member.eq(group == 1),
                first_beat.eq(1), beat_offset.eq(0),
                flushing.eq(0), issuing.eq(1),
            ]
        return m
