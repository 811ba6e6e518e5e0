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
``add_latency`` (= L) cycles to come out of the adder and one more through the feedback
register in front of the adder's input. The unit therefore interleaves G = L + 1 pairs:
pairs are taken in groups of G, and within a group the beats are issued round-robin,
``for beat b: for pair g in the group: (g, b)``. The multipliers, the adders and the tree run
freely (no clock enable, no stall): each lane's adder and feedback register form a ring of G
slots that turns every cycle, and item n of a run (counted from the run's first reading item
n0) enters the ring in its slot, n - n0 modulo G after that item's, so that a pair's beats
always meet their own partial (the first beat restarts it from +0.0). A cycle without an
item (a stall) is a bubble: it adds +0.0, which leaves a partial unchanged (a partial is never
-0.0: it starts at +0.0, and a rounded sum is -0.0 only when both addends are, so
``x + (+0.0) = x`` for every x, NaN included); after a stall an item waits for its slot to
come round (at most G - 1 cycles). A pair's final partials leave the adders L cycles after its
last beat entered; the tree takes them then. Every pair of a group has the same number of
beats, so results leave in pair order. The last group is padded to G with dummy pairs (no
reads, not output). Invalid pairs travel the same way but read nothing and touch no partial
(their result is +0.0), so the cycle count depends only on the problem size. A lane past H on
the last beat adds +0.0.

Throughput and exact cycle count: one beat per cycle. Stall-free (streams and memory, read
latency ``read_latency``: a request taken in cycle c is answered from cycle c + latency), a
run of P = k*S pairs with B = ``max(1, ceil(H / lanes))`` beats each issues
``ceil(P / G) * G * B`` items at one per cycle, and takes exactly
``DispatchBackwardGateParams.cycles(P, H, read_latency)`` cycles from the start cycle to the cycle
``done`` is first seen; when P is a multiple of G that is ``P * B + overhead(read_latency)``
(``overhead(L) = lead + max(2, 1 + L) + result_latency + 4``, ``lead = setup + 1 +
slot_latency + 2``, ``result_latency = 2 + mul_latency + (1 + levels) * add_latency``:
13 + (1 + L) + 50 + 4 = L + 68 at the defaults with L >= 1). The ideal is ``P * B``; the
excess (a partial last group's padding, the pipeline) is fixed per run. Full rate holds with
``max_outstanding >= read_latency + 2``.

Pipeline: run setup (P = tokens * top_k on a pipelined product of the held sizes, in the run
control's setup cycles); the header queue (the shared
:class:`~moe_hw.blocks.slot_address.SlotAddress`, mask and ``slot = index*C + location``, then
``slot*H``, free-running inside a :class:`~moe_hw.stream.CreditPipeline` whose output register
holds the front pair; the pair's ``i*H`` is counted as it is taken); issue (the group's pairs in a
G-entry distributed-RAM table, read one item ahead into a register, each item writing back its
pair's addresses of the next beat; the last-beat flag registered; two read requests into skid
buffers, which must both have room for any item to issue, a descriptor into a queue of
``max_outstanding`` credits, a :class:`~moe_hw.stream.CreditPipeline` without a datapath, or
past 16 a block RAM FIFO on ``bram``, whose head comes 6 cycles after the issue); join
(the front descriptor with both responses, in its ring slot); an operand register and ``lanes``
multipliers; a product register (+0.0 for a lane without data); ``lanes`` adders with their
feedback registers; the adder tree; all of it free-running into the output queue (a
:class:`~moe_hw.stream.CreditPipeline`: a pair's last beat joins only with a credit for its
result), whose skid buffer drives ``grad_gate``: the consumer's ``ready`` reaches only that
buffer's output register.
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.lib.memory import Memory
from amaranth.utils import bits_for, ceil_log2

from ..arith.fadd import FloatAdderCore, adder_tree
from ..arith.fmul import FloatMultiplierCore
from ..arith.params import FORMAT_NAMES, FloatDatapathParams, dsp_param
from ..arith.product import pipelined_product, product_latency
from ..blocks.block_fifo import BLOCK_FIFO_LATENCY, block_queue
from ..blocks.block_memory import bram_param
from ..blocks.row_beats import row_beats
from ..blocks.row_reader import RowReader, last_enable_of
from ..blocks.run_control import EMPTY_CYCLES, RunControl, run_ports
from ..blocks.slot_address import header_slot_queue, slot_latency
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import CreditPipeline, SkidBuffer, delay

__all__ = ["DispatchBackwardGateParams", "DispatchBackwardGateUnit"]

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
    bram: str = bram_param()
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
        """G: the pairs accumulated round-robin: a lane's partial goes round its adder and
        the feedback register in ``add_latency + 1`` cycles."""
        return self.add_latency + 1

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
        pipelined product of the held sizes, then a register of it."""
        return 2 + product_latency(bits_for(self.max_tokens), bits_for(self.max_top_k))

    @property
    def header_latency(self):
        """Cycles of the header pipeline: the slot address and the header queue (a
        :class:`~moe_hw.stream.CreditPipeline`, whose output register holds the front
        pair)."""
        return slot_latency(self) + CreditPipeline.QUEUE_LATENCY

    @property
    def lead(self):
        """Cycles from the start cycle to the first item's issue: the start cycle, the setup
        cycles, the header pipeline (``setup + 1 + header_latency``)."""
        return self.setup + 1 + self.header_latency

    @property
    def deep_descriptors(self):
        """Whether the descriptor queue is a block RAM FIFO (more than
        :attr:`~moe_hw.blocks.row_reader.RowReader.SHALLOW` in flight, as behind an AXI
        master) rather than a LUT-RAM ring."""
        return self.max_outstanding > RowReader.SHALLOW

    @property
    def descriptor_latency(self):
        """Cycles from an item's issue to its descriptor at the queue's head (stall-free):
        the ring's :attr:`~moe_hw.stream.CreditPipeline.QUEUE_LATENCY`, or the block RAM
        FIFO's :data:`~moe_hw.blocks.block_fifo.BLOCK_FIFO_LATENCY`."""
        return BLOCK_FIFO_LATENCY if self.deep_descriptors else CreditPipeline.QUEUE_LATENCY

    def join_delay(self, read_latency, reads=True):
        """Stall-free cycles from an item's issue to its join with its read data. Joins are
        in order, so an item without reads waits as long as the reading items before it:
        the read round trip (request skid buffer, memory) if any item of the run reads, else
        the descriptor queue's latency."""
        queue = self.descriptor_latency
        return max(queue, 1 + read_latency) if reads else queue

    @property
    def result_latency(self):
        """Cycles from the join of a pair's last item to its result at the output queue's
        input: the operand register, the multiplier, the product register, the lane's last
        addition, the tree."""
        return 2 + self.mul_latency + (1 + self.tree_levels) * self.add_latency

    def cycles(self, pairs, hidden, read_latency, *, reads=True):
        """Exact stall-free cycles of a run of ``pairs`` pairs, from the start cycle to the
        cycle ``done`` is first seen (``EMPTY_CYCLES`` when there are no pairs). ``reads``:
        whether any pair reads (it is valid and H > 0).

        With G = :attr:`interleave`, B = ``max(1, ceil(H / lanes))``, ``groups =
        ceil(pairs / G)`` and r = ``pairs - (groups - 1) * G`` real pairs in the last group,
        the items issue one per cycle from cycle ``lead``, ``groups * G * B`` of them; the
        last real pair's last item is number ``groups*G*B - (G - r) - 1``. Its result
        reaches the output queue ``join_delay + result_latency`` cycles after its issue;
        then the queue, the cycle the result leaves it, the queue's idle register and the
        done register::

            lead + groups*G*B - (G - r) - 1 + join_delay + result_latency
                 + QUEUE_LATENCY + 1 + IDLE_LATENCY + 1

        (the dummy items after it join within G cycles, long before the result leaves).
        """
        if pairs == 0:
            return EMPTY_CYCLES
        g = self.interleave
        beats = max(1, -(-hidden // self.lanes))
        groups = -(-pairs // g)
        last_members = pairs - (groups - 1) * g
        last_item = groups * g * beats - (g - last_members) - 1
        return (self.lead + last_item + self.join_delay(read_latency, reads) +
                self.result_latency + CreditPipeline.QUEUE_LATENCY + 1 +
                CreditPipeline.IDLE_LATENCY + 1)

    def overhead(self, read_latency):
        """Stall-free cycles beyond ``pairs * B`` when ``pairs`` is a multiple of G (whole
        groups) and some pair reads: :meth:`cycles` with r = G."""
        return (self.lead + self.join_delay(read_latency) + self.result_latency +
                CreditPipeline.QUEUE_LATENCY + CreditPipeline.IDLE_LATENCY + 1)


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
        # The product is registered in the fabric: the DSP block's output went straight to
        # the pair counts' loads, over a 3.6 ns net on one placement (222.0 MHz).
        pairs = delay(m, pipelined_product(m, tokens, ctl.size("top_k"), en=1, dsp=p.dsp,
                                           name="pairs")[:bits_for(p.max_pairs)],
                      1, 1, name="pairs_held", reset_less=True)
        beats = Signal(range(max_beats + 1))
        last_enable = Signal(p.lanes)
        has_data = Signal()                      # H > 0: a valid pair reads
        headers_left = Signal.like(pairs)
        headers_open = Signal()                  # headers_left != 0, as a register
        # P == 1 from the held sizes (tokens == top_k == 1), a register, where ``pairs == 1``
        # at the begin put the product's DSP output in front of a compare (243.8 MHz).
        one_pair = Signal()
        m.d.sync += one_pair.eq((tokens == 1) & (ctl.size("top_k") == 1))

        # ---- header queue: mask and slot, then the grad_dispatch row address -----------------
        # The slot address runs freely inside a credit pipeline; the queue's output register
        # holds the front pair until the issue sequencer takes it on its beat 0.
        # (The address is held in two registers written in turn: the issue's take of a
        # header reaches only the queue's flags, not the address's clock enables.)
        h_queue = header_slot_queue(m, self.header, ctl, p, open=running & headers_open,
                                    addr_width=p.grad_addr_width, alternate=("address",))
        with m.If(h_queue.take):
            m.d.sync += [headers_left.eq(headers_left - 1), headers_open.eq(headers_left != 1)]
        h_out = h_queue.o
        h = h_out.payload
        # The front pair's input row address i*H: the pairs count i = 0..S-1, k times over.
        token = Signal(range(p.max_tokens))      # the front pair's input row
        input_base = Signal(p.input_addr_width)  # token * H
        # The token's wrap (token == tokens - 1) is a register, set a take ahead from a compare
        # with tokens - 2, so that the row's clock enables and choices start at a flop (the
        # compare with tokens - 1 in front of them was the path, 236.2 MHz).
        token_wraps = Signal()
        one_token = Signal()                     # tokens == 1
        second_last = Signal.like(token)         # tokens - 2 (any value when tokens == 1)
        m.d.sync += [one_token.eq(tokens == 1), second_last.eq(tokens - 2)]

        # ---- issue sequencer: groups of G pairs, beats round-robin over the group ------------
        issuing = Signal()                       # items left to issue in this run
        pairs_left = Signal.like(pairs)          # pairs whose header is still to be taken
        more_pairs = Signal()                    # pairs_left != 0
        last_pair = Signal()                     # pairs_left == 1
        member = Signal(range(group))            # position in the group
        next_member = Signal(range(group))       # the member after it
        last_member = Signal()                   # member == G - 1
        first_beat = Signal()                    # the round of beat 0 (takes the headers)
        # first_beat & more_pairs, a register of its own: the item's valid, its header take
        # and the take's clock enables (the pair count, the token and its row address) start
        # from it rather than from a gate of the two (the path was first_beat -> the take ->
        # pairs_left's clock enable, 219.4 MHz).
        need_header = Signal()
        # The group's pairs, one entry per member: the addresses of the pair's next beat in
        # both rows, whether the pair reads, whether it is a pair at all; every item writes
        # its pair's entry back with the addresses a beat on (the adder is off the issue
        # path). The entry of the next member is read one item ahead into ``ahead``
        # (distributed RAM, read at a register), so that an item's fields are registers.
        # Written at an item's issue (a cycle after it when G >= 3), an entry is next read at
        # the issue of the item G - 1 later: at least G - 1 cycles later.
        entry_layout = data.StructLayout({"grad": p.grad_addr_width,
                                          "input": p.input_addr_width,
                                          "live": 1, "real": 1})
        ahead = Signal(entry_layout)
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

        live = Signal()
        real = Signal()
        grad_addr = Signal(p.grad_addr_width)
        input_addr = Signal(p.input_addr_width)
        m.d.comb += [
            live.eq(Mux(first_beat, need_header & h.in_range, ahead.live)),
            real.eq(Mux(first_beat, need_header, ahead.real)),
            grad_addr.eq(Mux(first_beat, h.address, ahead.grad)),
            input_addr.eq(Mux(first_beat, input_base, ahead.input)),
        ]
        reads = Signal()
        enable = Signal(p.lanes)
        m.d.comb += [
            reads.eq(live & has_data),
            enable.eq(Mux(reads, Mux(last_beat, last_enable, all_lanes), 0)),
        ]

        # The descriptors wait for their read data in a queue (a credit pipeline without a
        # datapath: its credits bound the items between issue and join by max_outstanding).
        descriptor_layout = data.StructLayout({
            "reads": 1,         # the item has read data to wait for
            "enable": p.lanes,  # lanes whose product counts; the others add +0.0
            "first": 1,         # beat 0: the partials start from +0.0
            "result": 1,        # the last beat of a real pair: its partials leave for the tree
        })
        # Deep (behind an AXI master: 256), a LUT-RAM ring's read is a 16:1 choice and more
        # (the wrapped unit's path, on both seeds placed), so there the descriptors wait in a
        # block RAM FIFO read ahead into registers (``block_queue``, a ``block_fifo`` with a
        # credit pipeline's ports), ``max_outstanding`` in all; an item's descriptor is the
        # head ``BLOCK_FIFO_LATENCY`` cycles after its issue (:attr:`descriptor_latency`).
        if p.deep_descriptors:
            pending = block_queue(m, "descriptors", descriptor_layout,
                                  entries=p.max_outstanding, target=p.bram)
        else:
            pending = m.submodules.descriptors = CreditPipeline(0, descriptor_layout,
                                                                depth=p.max_outstanding)
        input_skid = m.submodules.input_skid = SkidBuffer(p.read_layout(p.input_addr_width))
        grad_skid = m.submodules.grad_skid = SkidBuffer(p.read_layout(p.grad_addr_width))
        # An item issues when both request skid buffers have room, whether it reads or not:
        # its ``valid`` is then two LUTs of registers (an item that does not read waits
        # only while a read port stalls).
        m.d.comb += [
            pending.i_valid.eq(issuing & (~need_header | h_out.valid) &
                               input_skid.i.ready & grad_skid.i.ready),
            issue.eq(pending.take),
            pending.payload.reads.eq(reads),
            pending.payload.enable.eq(enable),
            pending.payload.first.eq(first_beat),
            pending.payload.result.eq(real & last_beat),
        ]
        # ``issue & need_header`` written out as one AND of registers (when a header is
        # needed, the item waits for it), so that the take's clock enables (the pair count,
        # the token and its row address) are not behind the issue's own logic (the path was
        # the request skid buffer's flag -> the item's valid -> the take -> this -> the pair
        # count's clock enable, 5 LUTs, 223.1 MHz). It repeats the item valid's terms on
        # purpose: with one shared "may issue" term for both, one seed gave 208.4 MHz (after
        # 233.6), the shared term on the path from a request skid buffer's flag to the take.
        take_header = Signal()
        m.d.comb += take_header.eq(need_header & issuing & h_out.valid & pending.i_ready &
                                   input_skid.i.ready & grad_skid.i.ready)
        m.d.comb += h_out.ready.eq(take_header)
        # The group just issued was the last: no header is left once this item's is taken,
        # if it issues (registers only, so that the end of the issue is one gate after
        # ``issue``: the path was the take -> this flag -> ``issuing``, 222.3 MHz).
        no_pairs_after = ~more_pairs | (need_header & last_pair)

        here = Signal(entry_layout)              # the item's pair, its addresses of this beat
        m.d.comb += [here.grad.eq(grad_addr), here.input.eq(input_addr),
                     here.live.eq(live), here.real.eq(real)]

        def stepped(entry):
            """``entry`` with its addresses a beat on."""
            out = Signal(entry_layout)
            m.d.comb += [out.grad.eq(entry.grad + p.lanes), out.input.eq(entry.input + p.lanes),
                         out.live.eq(entry.live), out.real.eq(entry.real)]
            return out

        # The entry written back, a beat on. An entry written ``write_delay`` cycles after its
        # item's issue is next read at the issue of the item G - 1 later, at least G - 1
        # cycles after it, so the write may trail the issue by up to G - 2 cycles. With
        # G >= 4 the item is registered as it is (its addresses are a choice of the beat-0
        # flag between the header's and the entry's: the flag's net, or the header queue's
        # read pointer, in front of a carry chain was the critical path, 242.4 and 224.1 MHz),
        # then stepped into a second register; with G = 3 stepped into one register (the
        # carry chain ends at a register, not at the distributed RAM's write port).
        if group >= 4:
            write_delay = 2
            written = delay(m, stepped(delay(m, here, 1, 1, name="table_item", reset_less=True)),
                            1, 1, name="table_write_data", reset_less=True)
        elif group == 3:
            write_delay = 1
            written = delay(m, stepped(here), 1, 1, name="table_write_data", reset_less=True)
        else:
            write_delay = 0
            written = stepped(here)
        m.d.comb += [
            table_write.en.eq(delay(m, issue, write_delay, 1, name="table_write_en")),
            table_write.addr.eq(delay(m, member, write_delay, 1, name="table_write_addr",
                                      reset_less=True)),
            table_write.data.eq(written),
        ]
        with m.If(issue):
            m.d.sync += ahead.eq(table_read.data)
        with m.If(take_header):
            m.d.sync += [pairs_left.eq(pairs_left - 1), more_pairs.eq(~last_pair),
                         last_pair.eq(pairs_left == 2)]
            with m.If(token_wraps):
                m.d.sync += [token.eq(0), input_base.eq(0), token_wraps.eq(one_token)]
            with m.Else():
                m.d.sync += [token.eq(token + 1), input_base.eq(input_base + hidden),
                             token_wraps.eq(token == second_last)]
        # The dropped count, a cycle later (off the handshake path).
        with m.If(delay(m, take_header & ~h.in_range, 1, 1, name="take_dropped")):
            m.d.sync += self.dropped.eq(self.dropped + 1)
        first_beat_next = Mux(issue & last_member, last_beat, first_beat)
        more_pairs_next = Mux(take_header, ~last_pair, more_pairs)
        m.d.sync += need_header.eq(first_beat_next & more_pairs_next)
        with m.If(issue):
            m.d.sync += [member.eq(next_member),
                         next_member.eq(Mux(next_member == group - 1, 0, next_member + 1)),
                         last_member.eq(next_member == group - 1)]
            with m.If(last_member):
                with m.If(last_beat):
                    m.d.sync += first_beat.eq(1)
                    with m.If(no_pairs_after):
                        m.d.sync += issuing.eq(0)
                with m.Else():
                    m.d.sync += first_beat.eq(0)

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

        # ---- join: the front descriptor with both responses, in its ring slot ---------------
        # The multipliers, adders and the tree run freely (no enable); an item enters them in
        # the cycle it joins, and a cycle without a join is a bubble (every product +0.0, no
        # partial restarts). A lane's partial circulates through its adder and the feedback
        # register in G cycles, so item n of the run has the ring slot (phase) of the run's
        # first reading item plus n - n0, modulo G. ``ring`` (one-hot) counts the cycles to
        # the next item's phase: it holds in a cycle an item joins and counts down (G - 1
        # after 0) in any other. An item that reads joins only at its phase (``ring[0]``);
        # one that does not (an invalid or dummy pair) touches no partial, and joins as soon
        # as it is at the front. Until the first reading item joins (``fresh``) no slot is in
        # use, and any phase will do. Stall-free, the items from the first reading one on join
        # one per cycle. A result (a pair's last beat) joins only when the output queue has a
        # credit for it. The output queue's credit flag is decided as if a result joined in
        # every cycle, and its count follows the joins a cycle late (``ready_ahead``,
        # ``late_count``): the join, a function of the front descriptor, the phase and both
        # responses' valids, then reaches a register, not the count's choice and clock enable
        # (the path was ``ring[0]`` -> the count, 4 LUTs, 249.1 MHz).
        head = pending.o.payload
        out = m.submodules.results = CreditPipeline(p.result_latency, p.result_layout(),
                                                    ready_ahead=True, late_count=True)
        ring = Signal(group, init=1)
        fresh = Signal()                         # no reading item has joined in this run yet
        both = self.input_data.valid & self.grad_data.valid
        candidate = pending.o.valid & (~head.reads | (ring[0] & both))
        join = Signal()
        m.d.comb += [
            out.i_valid.eq(candidate & head.result),
            join.eq(candidate & (~head.result | out.i_ready)),
            pending.o.ready.eq(join),
            self.input_data.ready.eq(join & head.reads),
            self.grad_data.ready.eq(join & head.reads),
        ]
        with m.If(join & head.reads):
            m.d.sync += fresh.eq(0)
        with m.If(~join & ~fresh):
            m.d.sync += ring.eq(Cat(ring[1:], ring[0]))

        # ---- multiply: an operand register, then ``lanes`` free-running multipliers ----------
        # The join's flags follow the item: a lane without data (past H, invalid or dummy
        # pair, a bubble) contributes +0.0; ``first`` restarts the lane's partial.
        flags_delay = 1 + p.mul_latency
        lane_on = delay(m, Mux(join, head.enable, 0), flags_delay, 1, name="m_enable")
        restart = delay(m, join & head.reads & head.first, flags_delay, 1, name="m_first")
        products = []
        for lane in range(p.lanes):
            mul = FloatMultiplierCore(p.format, p.mul_latency, dsp=p.dsp)
            m.submodules[f"mul{lane}"] = mul
            m.d.comb += [
                mul.a.eq(delay(m, self.input_data.payload.data[lane], 1, 1,
                               name=f"op_input{lane}", reset_less=True)),
                mul.b.eq(delay(m, self.grad_data.payload.data[lane], 1, 1,
                               name=f"op_grad{lane}", reset_less=True)),
                mul.en.eq(1),
            ]
            product = Signal(p.fmt.width, name=f"product{lane}")
            m.d.sync += product.eq(Mux(lane_on[lane], mul.product, 0))
            products.append(product)

        # ---- accumulate: G ring slots per lane, through the adder and a feedback register -----
        # ``partial`` (the adder's input) is the sum that left the adder a cycle earlier, or
        # +0.0 when a pair starts. A bubble adds +0.0, which leaves a partial unchanged.
        partials = []
        for lane in range(p.lanes):
            acc = FloatAdderCore(p.format, p.add_latency)
            m.submodules[f"acc{lane}"] = acc
            partial = Signal(p.fmt.width, name=f"partial{lane}")
            m.d.sync += partial.eq(Mux(restart, 0, acc.sum))
            m.d.comb += [acc.a.eq(partial), acc.b.eq(products[lane]), acc.en.eq(1)]
            partials.append(acc.sum)

        # ---- the fixed pairwise tree: p[m] = p[2m] + p[2m + 1] ---------------------------------
        # A pair's final partials leave the adders add_latency cycles after its last item
        # entered them; the tree takes them then.
        total = adder_tree(m, partials, p.format, p.add_latency, name="tree")
        # The result of a pair that reads nothing is +0.0 (its items touched no partial).
        empty_result = delay(m, join & head.result & ~head.reads, p.result_latency, 1,
                             name="empty_result")
        m.d.comb += out.payload.value.eq(Mux(empty_result, 0, total))
        wiring.connect(m, wiring.flipped(self.grad_gate), out.o)

        # ---- control ----------------------------------------------------------------------------
        m.d.comb += ctl.finished.eq(running & ~issuing & ~pending.busy & ~out.busy)
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
                pairs_left.eq(pairs), more_pairs.eq(1), last_pair.eq(one_pair),
                token_wraps.eq(one_token),
                member.eq(0), next_member.eq(1), last_member.eq(0),
                first_beat.eq(1), need_header.eq(1), issuing.eq(1),
                ring.eq(1), fresh.eq(1),
            ]
        return m
