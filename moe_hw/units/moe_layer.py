"""The whole MoE layer data path (SPEC 1.8) in one component, tutel's ``is_postscore=True``
form (``golden.moe_layer``): route the top-k choices, dispatch the token rows with gate 1.0,
run every expert's elementwise affine ``a_e * x + b_e`` over its filled slots, and combine the
expert rows weighted by the gates, tokens out in token order::

    locations = compute_locations(indices)                       # LocationsUnit
    buffer[index*C + location, :] = 1.0 * input[i, :]   (valid)   # DispatchUnit
    buffer[e*C + r, :] = scale[e] * buffer[e*C + r, :] + bias[e]  # r < min(count[e], C)
    output[i, :] = sum over k of gate[k][i] * buffer[index*C + location, :]   # CombineGather

It composes the existing units as submodules (:class:`~moe_hw.units.locations.LocationsUnit`,
:class:`~moe_hw.units.dispatch.DispatchUnit`, :class:`~moe_hw.blocks.row_reader.RowReader` with
the experts' row commands, :class:`~moe_hw.units.combine_gather.CombineGatherUnit`, whose
float multiply-add lanes compute the affine experts too) around an internal pair memory, and
shares one external expert buffer [E*C, H] (one read port, one write port) between its
phases.

With ``experts="scan_layers"`` every expert is a scan_layers stack of its own (SPEC 1.7,
1.8): L layers ``relu?(a_{e,l} * x + b_{e,l})`` with vectors of length H per expert and
layer, ``golden.moe_layer`` with ``scale`` and ``bias`` [E, L, H]. One
:class:`~moe_hw.units.scan_layers.ScanLayersUnit` (one layer datapath, its parameter memory
of ``max_layers`` layers) serves every expert in turn: the cost does not grow with E or L.

Streams and ports (payload fields are listed least significant first):

``pair`` (in)
    One beat per (k, i) pair, k-major (all tokens of choice 0, then choice 1, ...): ``gate``
    (the format's bits) and ``index`` (two's complement, ``index_width`` bits; any bit pattern
    is safe: an out-of-range index is a dropped pair). The host makes them from the gate
    matrix [S, E] with ``golden.top_k_routing``.
``data`` (in)
    The token rows, once per choice k, k-major like the pairs (the dispatch unit's data
    stream): for pair (k, i), ``ceil(H / lanes)`` beats of ``input[i, :]``, ``lanes`` elements
    each, lane 0 first, the last beat zero-padded past H. ``k*S*ceil(H / lanes)`` beats in
    all, or none when H, C or E is 0 (nothing can be dispatched).
``expert_params`` (in)
    Expert stacks (``experts="scan_layers"``, ``affine`` 1): E*L*ceil(H / lanes) beats,
    expert-major, each expert's as the scan_layers unit's ``layer_params`` (layer-major,
    ``scale`` then ``bias``, ``lanes`` elements each); taken in the expert phase, every
    expert's, the ones with no filled row dropped. Affine experts:
    when ``affine`` is 1: E beats, expert 0 first: ``scale`` then ``bias`` (the format's
    bits), held in an internal memory of ``max_experts`` entries. They may come at any time
    during the run; the expert phase waits for them. None when ``affine`` is 0. (A missing
    scale is 1.0 and a missing bias -0.0, which the host substitutes: ``1.0 * x`` and
    ``x + -0.0`` are ``x`` bit for bit, -0.0 and NaN included, so ``a*x + b`` with them is
    exactly the golden's "no multiply" / "no add".)
``output`` (out)
    The combined rows in token order: ``ceil(H / lanes)`` beats per token, ``data`` (lane 0
    first), ``enable`` (partial on a row's last beat when H is not a multiple of ``lanes``;
    disabled lanes carry don't-care values) and ``last`` (a token's last beat).
``read_request`` (out), ``read_response`` (in), ``write`` (out)
    The expert buffer [E*C, H] (element address ``(e*C + slot)*H + j``): a read port as
    :class:`~moe_hw.blocks.row_reader.RowReader` (``addr``, ``enable`` / ``data``; responses in
    request order, any latency) and a write port as the dispatch unit's (``addr``, ``data``,
    ``enable``). The memory must order a read after every write taken before it (the bench
    models one array behind both ports); the phases never have a read and a write of the same
    address in flight together. The layer never touches a slot that no valid pair fills.
    ``write`` and ``read_request`` are driven from skid buffers (registered valid and
    payload; ``ready`` reaches only them).
``start``, ``tokens``, ``hidden``, ``top_k``, ``num_experts``, ``capacity``, ``affine`` (in)
    Run-time problem size (S, H, k, E, C) and whether the experts are affine (1) or the
    identity (0), sampled when ``start`` is high while idle (the shared
    :class:`~moe_hw.blocks.run_control.RunControl`; S = 0 is its empty run).
``layers``, ``relu`` (in, expert stacks only)
    L (0: identity experts) and whether the layers apply relu, sampled with the sizes.
``busy``, ``done``, ``dropped``, ``error``, ``phase`` (out)
    ``done`` rises when the last output beat has left and stays high until the next start.
    ``dropped`` counts the pairs that fail the capacity mask (``golden.moe_layer``'s
    ``dropped``: an out-of-range index, or a location >= C); it restarts at 0 the cycle after
    a start is taken and is final when the route phase ends. ``error`` is set, and nothing
    read or written, when a run-time size exceeds its generation-time maximum (``done`` two
    cycles after start). ``phase`` is the phase below (0 when idle), for performance
    counters.

A run with S = 0 finishes at once (``done`` two cycles after start) and takes nothing.

Phases (``phase``):

1. *route and dispatch* (overlapped): the pairs enter the location generator one per cycle;
   each pair's location joins its gate and index (a 5-entry FIFO, one more than the pairs
   in the generator) in the pair memory (a :class:`~moe_hw.blocks.block_memory.BlockMemory` of
   ``max_tokens`` words of ``max_top_k`` entries, word i entry k = pair (k, i), read in two
   cycles: on ECP5 a DP16KD with its output register, ``bram="ecp5"``); then the E
   per-expert totals come out and every expert with ``min(count, C) > 0`` filled slots goes
   on the expert work list (empty experts never appear there, so they cost nothing). The
   dispatch unit reads its headers from the pair memory as soon as they are written and
   writes the token rows into the expert buffer through the write port, one beat per cycle.
   Its gate is 1.0 (postscore), so it is built without multipliers (``gate_one``: ``1.0 *
   x`` is ``x``, a NaN the multiplier's canonical quiet NaN).
2. *experts* (only when ``affine`` is 1, H > 0 and some expert has a filled slot): for every
   expert on the work list, for each of its ``min(count, C)`` filled rows, the row is read
   (one row command per row into a row reader), each lane computes ``scale * x`` (rounded)
   then ``+ bias`` (rounded) in the combine unit's float multiplier and adder of that lane
   (the combine unit is idle in this phase: one set of lanes serves both phases, the
   expert's operands chosen in front of the lanes' operand registers), and the row is
   written back in place, one beat per cycle. With expert stacks (when ``affine`` is 1 and
   H, L > 0, filled rows or not): for every expert in order, either its stack runs (the stack
   unit started with the expert's filled rows as its tokens, its L*B parameter beats from
   ``expert_params``, the rows from the row reader, which runs ahead through the work
   list; the results written back in place, rows in slot order), or, with no filled row,
   its L*B parameter beats are taken and dropped. One expert after another: the stack
   drains between experts.
3. *combine*: the combine-gather unit reads one header per token from the pair memory (the
   token's k gates, indices and locations), reads the expert rows through the read port and
   sends the gate-weighted sums out on ``output`` in token order.

Exact stall-free cycle count (start cycle to the first cycle ``done`` is high, with a memory
that answers a request taken at the end of cycle u from cycle u + L;
:meth:`MoELayerParams.cycles`, phase by phase :meth:`MoELayerParams.phase_cycles`), with
P = k*S pairs, B = ceil(H / lanes) beats per row and R = ``sum over e of min(count[e], C)``
filled rows::

    route_dispatch = run_setup + max(ROUTE_LATENCY + P*B + dispatch.overhead,  (H, C, E > 0)
                          locations.stall_free_cycles(P, E) + TOTALS_LATENCY) + PHASE_EXIT
    experts        = R*B + L + combine.accumulate_latency + EXPERT_OVERHEAD
                     + 2*PORT_LATENCY + PHASE_EXIT
                     (0 when the phase is skipped: identity experts, H = 0 or R = 0)
    experts        = sum over experts e with r_e = min(count[e], C) > 0 of
                     (stack.cycles(r_e, H, Ls) + 1)
                     + (experts with r_e = 0) * (Ls*B + 1) + STACK_OVERHEAD + PHASE_EXIT
                     (expert stacks of Ls layers: 0 when skipped: identity experts, H = 0)
    combine        = COMBINE_START + combine.cycles(S, H, k, L + PORT_LATENCY)
                     + combine_header_latency                                     (H > 0)
                     COMBINE_START + combine.cycles(S, H, k, L) = 1 + 2           (H = 0)
    total          = route_dispatch + experts + combine          (2 when S = 0)

with run_setup = 2 + product_latency (the sub-units' start: P = k*S on a pipelined product
of the held sizes and a register; 4 at the defaults), ROUTE_LATENCY = 8, TOTALS_LATENCY = 1
(the per-expert totals' two registers before the work list, less the cycle the location
generator's ``done`` already comes after its last total), ``combine.accumulate_latency``
(the combine lanes' operand registers, multiplier, adder operand registers and adder:
mul_stages + add_stages + 2), EXPERT_OVERHEAD = 5,
PORT_LATENCY = 1 (the skid buffer on each expert-buffer port: the read request's adds to every
read's latency, the write's to the expert phase's last write; the route phase's is hidden by the
dispatch unit's own drain), combine_header_latency = max(0, PAIR_READ_LATENCY - (combine.setup -
1)) with PAIR_READ_LATENCY = 2 (0 at the defaults: the combine unit's setup hides the pair-memory
read), PHASE_EXIT = 2 (the phase's end is registered), and ``dispatch.overhead``
(:attr:`~moe_hw.units.dispatch.DispatchParams.overhead`), ``locations.stall_free_cycles`` (P + E +
overhead, :meth:`~moe_hw.units.locations.LocationsParams.stall_free_cycles`) and ``combine.cycles``
(the combine-gather unit's K*S*B plus its windows' and pipeline's overhead,
:meth:`~moe_hw.units.combine_gather.CombineGatherParams.cycles`), STACK_OVERHEAD = 2 and
``stack.cycles`` (:meth:`~moe_hw.units.scan_layers.ScanLayersParams.cycles`: its set-up, the
L*B parameter beats and the scan at one layer-beat per cycle; exact when the memory latency is
below the row reader's in-flight beats, which with stacks are at least a scan group and 16
more): the sub-units' own documented counts. Route and dispatch overlap completely: the
dispatch unit starts with the first location and is never starved, even at one beat per
pair. The ideal, one beat per cycle on the busiest port in every phase, is ``P*B + R*B +
K*S*B`` (K = max(k, 1); stacks: ``P*B + (E + R)*Ls*B + K*S*B``); the rest is fixed pipeline
fill per phase. A phase is counted from the cycle ``phase`` first shows it (the start cycle
for phase 1) to the cycle it first shows the next phase (or ``done`` is high); the route
phase's sub-units are started run_setup cycles into it, the combine unit in the first cycle of
its phase (COMBINE_START = 1: the start is registered). A pause on any stream costs at most
the cycles it lasts.
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.params import FORMAT_NAMES, FloatDatapathParams, dsp_param
from ..arith.product import pipelined_product, product_latency
from ..blocks.block_fifo import count_level
from ..blocks.block_memory import BlockMemory, bram_param
from ..blocks.row_reader import RowReader, last_enable_of, request_layout, response_layout
from ..blocks.run_control import EMPTY_CYCLES, RunControl, run_ports
from ..params import LANES, ParameterError, UnitParams, param, resolve_params
from ..stream import (CreditPipeline, PipelineControl, RegisterCopies, RegisteredFIFO,
                      SkidBuffer, delay)
from .combine_gather import CombineGatherParams, CombineGatherUnit
from .dispatch import DispatchParams, DispatchUnit
from .locations import LocationsParams, LocationsUnit
from .scan_layers import ScanLayersParams, ScanLayersUnit

__all__ = ["MoELayerParams", "MoELayer", "PHASES"]

#: ``phase`` output values.
PHASES = {"idle": 0, "route_dispatch": 1, "experts": 2, "combine": 3}

#: The ``experts`` choices: one scale and bias per expert, or a scan_layers stack per expert.
EXPERT_KINDS = ("affine", "scan_layers")


@dataclass(frozen=True)
class MoELayerParams(FloatDatapathParams, UnitParams):
    """Generation-time parameters of :class:`MoELayer`, and its exact stall-free timing."""

    format: str = param("fp32", choices=FORMAT_NAMES)
    lanes: int = param(4, choices=LANES)
    max_tokens: int = param(1024, minimum=1, maximum=1 << 30, doc="S")
    max_hidden: int = param(1024, minimum=1, maximum=1 << 30, doc="H")
    max_experts: int = param(16, minimum=1, maximum=1 << 30, doc="E")
    max_capacity: int = param(1024, minimum=1, maximum=1 << 30, doc="C")
    max_top_k: int = param(2, minimum=1, maximum=16, doc="k")
    index_width: int = param(32, minimum=2, maximum=64, doc="the pair stream's index field")
    mul_stages: int | None = param(None, minimum=0, maximum=16, optional=True,
                                   doc="None: the multiplier's default depth for the format")
    dsp: str = dsp_param()
    bram: str = bram_param()
    add_stages: int | None = param(None, minimum=1, maximum=16, optional=True,
                                   doc="None: the adder's default depth for the format")
    max_outstanding: int = param(16, minimum=4, maximum=4096,
                                 doc="read beats in flight; full rate needs memory latency "
                                     "< this")
    experts: str = param("affine", choices=EXPERT_KINDS,
                         doc="affine: a*x + b per expert; scan_layers: L layers "
                             "relu?(a_l*x + b_l) per expert, vectors a_l, b_l of length H")
    max_layers: int = param(4, minimum=1, maximum=1 << 12,
                            doc="L of the scan_layers expert stack (experts=scan_layers)")

    #: Stall-free cycles by which the dispatch unit's first header comes later than it would
    #: from a header stream valid at once: the pair's trip through the location generator
    #: (the counter bank's three stages, output register), its write into the pair memory, the
    #: pair-memory read (two cycles: the block RAM and its output register) and the register
    #: after the pair's choice from the memory's word.
    ROUTE_LATENCY = 8
    #: The per-expert totals pass two registers in front of the work list (the count with
    #: its compares, then the filled rows); the location generator's ``done`` comes two
    #: cycles after its last total left it, which hides one of them.
    TOTALS_LATENCY = 1
    #: Expert phase cycles beyond R*B + L + the combine lanes' accumulate latency: the
    #: work-list load, the command register, the row reader's issue and output registers,
    #: the credit pipeline's queue (its write and its skid buffer).
    EXPERT_OVERHEAD = 5
    #: The skid buffer on each expert-buffer port (write, read request): a cycle on every
    #: write and on every read's round trip. (The dispatch unit's ``done`` comes two cycles
    #: after its last write leaves it, so the route phase does not see the write's.)
    PORT_LATENCY = 1
    #: The pair-memory read in front of the combine unit's header stream (a
    #: :class:`~moe_hw.blocks.block_memory.BlockMemory`).
    PAIR_READ_LATENCY = BlockMemory.latency

    @property
    def combine_header_latency(self):
        """Cycles the combine phase waits for its first header beyond the combine unit's own
        count: the pair-memory read, less what the unit's setup cycles already hide."""
        return max(0, self.PAIR_READ_LATENCY - (self.combine.setup - 1))
    #: The cycles from a phase's last event (its units done) to the next phase: the test of
    #: the flags, then the registered end (a cycle after it) that enters the next phase.
    PHASE_EXIT = 2
    #: The combine unit's start is registered: it starts in the first cycle of its phase.
    COMBINE_START = 1

    @property
    def run_setup(self):
        """Cycles from the layer's start cycle to the cycle its sub-units (location
        generator, dispatch) are started (4 at the defaults): P = k*S on a pipelined product
        of the held sizes (from the decide cycle on) and a fabric register after it, which
        the sub-units take with their start. That start is a register of its own, loaded
        from the run control's ``begin`` (so the run control is set up one cycle less): no
        gate of the layer's control lies in front of the sub-units' start logic, far across
        the die."""
        return 2 + product_latency(bits_for(self.max_tokens), bits_for(self.max_top_k))


    def check(self):
        if self.max_tokens * self.max_top_k > 1 << 30:
            raise ParameterError(f"max_tokens * max_top_k must be at most {1 << 30}, not "
                                 f"{self.max_tokens * self.max_top_k}")
        self.check_signed_fits("index_width", "max_capacity", "max_experts")
        location_width = self.locations.location_width
        if location_width > self.index_width:
            raise ParameterError(f"index_width must hold a location of max_tokens * max_top_k "
                                 f"pairs ({location_width} bits), not {self.index_width}")

    @property
    def max_pairs(self):
        return self.max_tokens * self.max_top_k

    @property
    def max_beats(self):
        return -(-self.max_hidden // self.lanes)

    @property
    def addr_width(self):
        """Bits of an expert-buffer element address (as the dispatch and combine units)."""
        return max(1, ceil_log2(self.max_experts * self.max_capacity * self.max_hidden))

    # ---- the sub-units' parameters -------------------------------------------------------
    @property
    def locations(self):
        return LocationsParams(max_pairs=self.max_pairs, max_experts=self.max_experts,
                               max_capacity=self.max_capacity, index_width=self.index_width,
                               bram=self.bram)

    @property
    def dispatch(self):
        return DispatchParams(format=self.format, lanes=self.lanes, max_pairs=self.max_pairs,
                              max_hidden=self.max_hidden, max_capacity=self.max_capacity,
                              max_experts=self.max_experts, index_width=self.index_width,
                              mul_stages=self.mul_stages, dsp=self.dsp, gate_one=True)

    @property
    def stacked(self):
        """Whether the experts are scan_layers stacks."""
        return self.experts == "scan_layers"

    @property
    def stack(self):
        """The expert stack's :class:`~moe_hw.units.scan_layers.ScanLayersParams` (its tokens
        are one expert's filled rows)."""
        return ScanLayersParams(format=self.format, lanes=self.lanes,
                                max_tokens=self.max_capacity, max_hidden=self.max_hidden,
                                max_layers=self.max_layers, mul_stages=self.mul_stages,
                                add_stages=self.add_stages, dsp=self.dsp, bram=self.bram)

    @property
    def reader_outstanding(self):
        """The expert row reader's in-flight beats: ``max_outstanding``, and with expert
        stacks at least a scan group (its beats are taken back to back) and 16 more."""
        if self.stacked:
            return max(self.max_outstanding, self.stack.interleave + 16)
        return self.max_outstanding

    @property
    def combine(self):
        return CombineGatherParams(format=self.format, lanes=self.lanes,
                                   max_tokens=self.max_tokens, max_hidden=self.max_hidden,
                                   max_capacity=self.max_capacity,
                                   max_experts=self.max_experts, max_top_k=self.max_top_k,
                                   index_width=self.index_width, mul_stages=self.mul_stages,
                                   dsp=self.dsp, add_stages=self.add_stages,
                                   max_outstanding=self.max_outstanding, bram=self.bram)

    # ---- exact stall-free timing ---------------------------------------------------------
    def phase_cycles(self, *, tokens, hidden, top_k, num_experts, capacity, rows, affine,
                     reads=True, memory_latency=1, filled=None, layers=1):
        """Exact stall-free cycles of each phase (a dict ``route_dispatch``, ``experts``,
        ``combine``; their sum is the run's, see :meth:`cycles`). A phase lasts from the
        cycle the previous one ended (the start cycle for the first) to the cycle the next
        one (or ``done``) is first seen.

        ``rows``: the filled rows ``sum over e of min(count[e], C)``; ``reads``: whether any
        pair is valid (a combine that reads nothing never waits for the memory)."""
        if tokens == 0:
            return {"route_dispatch": EMPTY_CYCLES, "experts": 0, "combine": 0}
        pairs = top_k * tokens
        beats = -(-hidden // self.lanes)
        route = self.locations.stall_free_cycles(pairs, num_experts) + self.TOTALS_LATENCY
        if pairs and hidden and capacity and num_experts:
            route = max(route, self.ROUTE_LATENCY + pairs * beats + self.dispatch.overhead)
        experts = 0
        if self.stacked:
            if affine and hidden and layers:
                experts = self.stack_cycles(hidden, filled, layers)
        elif affine and hidden and rows:
            experts = (rows * beats + RowReader.join_latency(self.reader_outstanding,
                                                             memory_latency) +
                       self.combine.accumulate_latency + self.EXPERT_OVERHEAD +
                       2 * self.PORT_LATENCY + self.PHASE_EXIT)
        combine = self.COMBINE_START + self.combine.cycles(
            tokens, hidden, top_k, memory_latency + self.PORT_LATENCY, reads=reads)
        if hidden:           # (with H = 0 the combine unit takes no header)
            combine += self.combine_header_latency
        return {"route_dispatch": self.run_setup + route + self.PHASE_EXIT,
                "experts": experts,
                "combine": combine}

    #: Expert-stack phase cycles beyond the runs and the dropped experts' parameters: the
    #: phase's first cycle, the last choice, the write port's skid buffer.
    STACK_OVERHEAD = 2

    def stack_cycles(self, hidden, filled, layers):
        """The expert phase's exact stall-free cycles with expert stacks: per expert with
        filled rows, its stack's run (:meth:`ScanLayersParams.cycles` of its rows) and the
        choice before it; per expert without, its L*B parameter beats taken and dropped and
        the choice before them; ``STACK_OVERHEAD`` and ``PHASE_EXIT``. ``filled``: the filled
        rows of every expert."""
        beats = -(-hidden // self.lanes)
        runs = [self.stack.cycles(rows, hidden, layers) + 1 for rows in filled if rows]
        dropped = sum(1 for rows in filled if not rows)
        return (sum(runs) + dropped * (layers * beats + 1) + self.STACK_OVERHEAD
                + self.PHASE_EXIT)

    def cycles(self, **problem):
        """Exact stall-free cycles of a run, start cycle to the first cycle ``done`` is high:
        the sum of :meth:`phase_cycles` (arguments as there; 1 when S = 0)."""
        if problem["tokens"] == 0:
            return EMPTY_CYCLES
        return sum(self.phase_cycles(**problem).values())

    # ---- payload layouts -----------------------------------------------------------------
    def pair_layout(self):
        return data.StructLayout({"gate": self.fmt.width, "index": signed(self.index_width)})

    def data_layout(self):
        return self.dispatch.data_layout()

    def expert_params_layout(self):
        if self.stacked:
            return self.stack.params_layout()
        return data.StructLayout({"scale": self.fmt.width, "bias": self.fmt.width})

    def output_layout(self):
        return self.combine.data_layout()

    def write_layout(self):
        return self.dispatch.write_layout()

    def entry_layout(self):
        """One pair in the pair memory."""
        return data.StructLayout({"gate": self.fmt.width, "index": signed(self.index_width),
                                  "location": signed(self.locations.location_width)})


class MoELayer(wiring.Component):
    """One MoE layer (route, dispatch, affine experts, combine) over an external expert
    buffer. See the module docstring for the protocol, the phases and the cycle count."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(MoELayerParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "pair": In(stream.Signature(p.pair_layout())),
            "data": In(stream.Signature(p.data_layout())),
            "expert_params": In(stream.Signature(p.expert_params_layout())),
            "output": Out(stream.Signature(p.output_layout())),
            "read_request": Out(stream.Signature(request_layout(p.lanes, p.addr_width))),
            "read_response": In(stream.Signature(response_layout(p.lanes, p.fmt.width))),
            "write": Out(stream.Signature(p.write_layout())),
            **run_ports(self.sizes),
            "affine": In(1),
            **({"layers": In(range(p.max_layers + 1)), "relu": In(1)} if p.stacked else {}),
            "dropped": Out(range(p.max_pairs + 1)),
            "phase": Out(2),
        })

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order."""
        p = self.params
        return {"tokens": p.max_tokens, "hidden": p.max_hidden, "top_k": p.max_top_k,
                "num_experts": p.max_experts, "capacity": p.max_capacity}

    # ---- hardware ----------------------------------------------------------------------------
    def _expert_stacks(self, m, reader, work, work_in, in_experts, hidden, last_en, beats,
                       num_experts, layers, relu, accept):
        """The expert phase with scan_layers stacks (``experts="scan_layers"``): one
        :class:`~moe_hw.units.scan_layers.ScanLayersUnit` runs once per expert on the work
        list, its tokens the expert's filled rows (read by the row reader, which runs ahead
        through the list), its layer parameters the expert's L*B beats of
        ``expert_params``; the parameters of experts with no filled row are taken and
        dropped (L*B cycles each). The results are written back in place, rows in slot
        order. ``layers`` and ``relu`` are the held run values, ``accept`` the run's start.
        Returns ``(write stream, busy)``: ``busy`` until the phase's last expert is done."""
        p = self.params
        all_lanes = (1 << p.lanes) - 1
        stack = m.submodules.expert_stack = ScanLayersUnit(p.stack)
        layer_beats = Signal(range(p.max_layers * p.max_beats + 1))         # L*B
        m.d.comb += layer_beats.eq(pipelined_product(m, layers, beats, en=1, dsp=p.dsp,
                                                     name="stack_beats"))
        entry = work.read_port(domain="comb")
        run_out = Signal(range(p.max_experts + 1))      # work entries run
        param_expert = Signal(range(p.max_experts + 1))  # the expert whose parameters are next
        skip_left = Signal.like(layer_beats)             # beats of a dropped expert left
        picking = Signal()                               # choose: drop, run or finish
        skipping = Signal()
        running = Signal()
        finished = Signal()
        entry_left = run_out != work_in
        target = Mux(entry_left, entry.data.expert, num_experts)
        params = self.expert_params
        m.d.comb += [
            entry.addr.eq(run_out),
            stack.tokens.eq(entry.data.rows),
            stack.hidden.eq(hidden),
            stack.layers.eq(layers),
            stack.relu.eq(relu),
            stack.layer_params.valid.eq(running & params.valid),
            stack.layer_params.payload.eq(params.payload),
            params.ready.eq(skipping | (running & stack.layer_params.ready)),
            stack.input.valid.eq(reader.beats.valid),
            stack.input.payload.data.eq(reader.beats.payload.data),
            reader.beats.ready.eq(stack.input.ready),
        ]

        # Write-back: the expert's rows are contiguous from its base, B beats each; a beat's
        # address is its row's plus lanes times its place in the row.
        w_row = Signal(p.addr_width)
        w_beat = Signal(range(p.max_beats + 1))
        w_last = Signal()                                # w_beat == B - 1
        out = stream.Signature(p.write_layout()).create()
        m.d.comb += [
            out.valid.eq(stack.output.valid),
            stack.output.ready.eq(out.ready),
            out.payload.addr.eq(w_row + (w_beat << ceil_log2(p.lanes))),
            out.payload.data.eq(stack.output.payload.data),
            out.payload.enable.eq(Mux(w_last, last_en, all_lanes)),
        ]
        with m.If(out.valid & out.ready):
            with m.If(w_last):
                m.d.sync += [w_row.eq(w_row + hidden), w_beat.eq(0), w_last.eq(beats == 1)]
            with m.Else():
                m.d.sync += [w_beat.eq(w_beat + 1), w_last.eq(w_beat + 2 == beats)]

        with m.If(in_experts & ~(picking | skipping | running | finished)):
            m.d.sync += picking.eq(1)
        with m.If(picking):
            with m.If(param_expert != target):
                m.d.sync += [picking.eq(0), skipping.eq(1), skip_left.eq(layer_beats)]
            with m.Elif(entry_left):
                m.d.comb += stack.start.eq(1)
                m.d.sync += [picking.eq(0), running.eq(1), w_row.eq(entry.data.base),
                             w_beat.eq(0), w_last.eq(beats == 1)]
            with m.Else():
                m.d.sync += [picking.eq(0), finished.eq(1)]
        with m.If(skipping & params.valid):
            m.d.sync += skip_left.eq(skip_left - 1)
            with m.If(skip_left == 1):
                m.d.sync += [skipping.eq(0), picking.eq(1), param_expert.eq(param_expert + 1)]
        with m.If(running & stack.done):
            m.d.sync += [running.eq(0), picking.eq(1), param_expert.eq(param_expert + 1),
                         run_out.eq(run_out + 1)]
        with m.If(accept):
            m.d.sync += [picking.eq(0), skipping.eq(0), running.eq(0), finished.eq(0),
                         run_out.eq(0), param_expert.eq(0)]
        return out, ~finished

    def elaborate(self, platform):
        m = Module()
        p = self.params
        fmt = p.fmt
        lanes_log2 = ceil_log2(p.lanes)
        entry_layout = p.entry_layout()

        m.submodules.locations = loc = LocationsUnit(p.locations)
        m.submodules.dispatch = disp = DispatchUnit(p.dispatch)
        # (affine experts: the combine unit's multiply-add lanes compute them too, in the
        # expert phase, while the combine unit is idle)
        m.submodules.combine = comb = CombineGatherUnit(p.combine, expert_lanes=not p.stacked)

        # ---- run control: start, held sizes, done / error; S = 0 is an empty run -----------
        # The run control begins a cycle before the sub-units start: ``sub_start`` (below) is
        # its ``begin`` registered.
        ctl = m.submodules.control = RunControl(self.sizes, empty_when_zero=("tokens",),
                                                setup=p.run_setup - 1)
        ctl.connect(m, self)
        tokens = ctl.size("tokens")
        hidden = ctl.size("hidden")
        # The last beat's lane enables, a register from the held H (the experts' reads and
        # writes come long after it is held): the decode of H's low bits was in front of the
        # expert reader's request, after H's net and the beat count's chain (189.8 MHz).
        last_en = Signal(p.lanes)
        m.d.sync += last_en.eq(last_enable_of(hidden, p.lanes))
        top_k = ctl.size("top_k")
        num_experts = ctl.size("num_experts")
        capacity = ctl.size("capacity")
        affine = Signal()
        # Expert stacks: L and relu, held from the start (beside the run control's sizes).
        ctl_layers = Signal(range(p.max_layers + 1))
        ctl_relu = Signal()
        pairs = Signal(range(p.max_pairs + 1))
        beats = Signal(range(p.max_beats + 1))
        expert_span = Signal(p.addr_width + 1)       # C*H, the elements of one expert
        sub_start = Signal()                            # the sub-units' start (below)
        # The phase as one-hot registers (the ``phase`` output is their encoding): a phase
        # test is a register, not a decode.
        in_route = Signal()
        in_experts = Signal()
        in_combine = Signal()
        # Copies of the last two for the shared ports' payload choices alone, one per group
        # of a port's payload bits, so that no phase flag's net reaches every payload bit of
        # a port (kept apart from the flags and from each other: ``RegisterCopies``).
        experts_copies = RegisterCopies(1, name="in_experts_copy")
        combine_copies = RegisterCopies(1, name="in_combine_copy")
        assert PHASES == {"idle": 0, "route_dispatch": 1, "experts": 2, "combine": 3}
        m.d.comb += self.phase.eq(Cat(in_route | in_combine, in_experts | in_combine))

        # ---- pair memory: word i, entry k = pair (k, i) ---------------------------------------
        pair_mem = m.submodules.pair_memory = BlockMemory(
            entry_layout, p.max_tokens, granules=p.max_top_k, target=p.bram)

        # ---- route: pairs -> location generator; join the location with gate and index ----
        # The generator keeps pair order; the FIFO holds the pairs inside it: at most 4, its
        # counter bank's 3 stages and its output register, since the location stream's ready
        # is always high here. So the FIFO, 5 deep, always has room for a pair the generator
        # takes, and its ``w_rdy`` gates neither handshake: the pair's valid reaches the
        # generator's issue alone (``w_rdy`` through the issue into its pair count's clock
        # enable, 3 levels, was a seed's path; before that ``SyncFIFO``'s level compare, into
        # the generator's phase flags: 187.5 MHz). The taken pair enters the FIFO a cycle
        # late, from registers: the FIFO's fill and flags wait on no handshake (the issue's
        # take through the write into ``w_rdy``, 4 levels, was two seeds' path). It is on
        # ``r_data`` two cycles after its take, before its location (four at the least).
        join = m.submodules.join = RegisteredFIFO(p.pair_layout(), p.locations.inside + 1)
        pair_taken = Signal()
        pair_held = Signal(p.pair_layout(), reset_less=True)
        m.d.sync += [pair_taken.eq(self.pair.valid & self.pair.ready),
                     pair_held.eq(self.pair.payload)]
        m.d.comb += [
            loc.index.valid.eq(self.pair.valid),
            loc.index.payload.index.eq(self.pair.payload.index),
            self.pair.ready.eq(loc.index.ready),
            join.w_data.eq(pair_held),
            join.w_en.eq(pair_taken),
        ]
        joined = join.r_data
        # (The counters that restart in the run control's decide cycle, here and below, have
        # no reset of their own: nothing reads them before it, and the decide flag, a
        # register, is then their slices' set/reset alone, not a LUT of it and the reset.
        # ``x_loaded`` and ``dropped`` keep theirs: the expert command's valid and a status
        # output, read while idle.)
        w_token = Signal.like(self.tokens, reset_less=True)  # where the next location goes
        w_choice = Signal(range(p.max_top_k), reset_less=True)
        location = loc.location.payload.location
        m.d.comb += [
            loc.location.ready.eq(1),
            join.r_en.eq(loc.location.valid),
            pair_mem.write_addr.eq(w_token),
            pair_mem.write_en.eq(Mux(loc.location.valid, Const(1, p.max_top_k) << w_choice, 0)),
        ]
        for choice in range(p.max_top_k):
            m.d.comb += [pair_mem.write_data[choice].gate.eq(joined.gate),
                         pair_mem.write_data[choice].index.eq(joined.index),
                         pair_mem.write_data[choice].location.eq(location)]
        # T - 1 as a register (the held size's, ready before the route phase): the token
        # counters' wrap compares two registers, with no subtraction in front of it.
        tokens_last = Signal.like(tokens)
        m.d.sync += tokens_last.eq(tokens - 1)
        # T == 1, T == 2, T - 2 and T - 3, for the token counters' wrap flags (``wrap_flag``);
        # T != 0 and T == 1 for the combine's count of tokens left (``c_left``)
        tokens_one = Signal()
        tokens_two = Signal()
        tokens_any = Signal()
        tokens_less2 = Signal.like(tokens)
        tokens_less3 = Signal.like(tokens)
        m.d.sync += [tokens_one.eq(tokens == 1), tokens_two.eq(tokens == 2),
                     tokens_any.eq(tokens != 0),
                     tokens_less2.eq(tokens - 2), tokens_less3.eq(tokens - 3)]

        def wrap_flag(token, step, name, stepped=None):
            # Whether ``token`` is T - 1, as a register: the compare itself while the token
            # holds, and a step ahead when it steps (T == 1 after a wrap to 0, else whether
            # the token is T - 2), so that the counter's clock enables wait on no compare
            # (the token's compare into the choice's enable: seeds' paths). Whether the token
            # is T - 2 comes from registers too, so that the step is the last choice (the
            # compare behind the step's choice, 4 levels, was two seeds' path): the compares
            # with T - 2 and T - 3 are registered every cycle, and after a step the token is
            # the one compared with T - 3 plus one, or 0 after a wrap. (A token holds for many
            # cycles after the run's clear and T's load before its first step.)
            # ``stepped``: the step registered, when the caller has it already.
            flag = Signal(name=name)
            if stepped is None:
                stepped = Signal(name=f"{name}_stepped")
                m.d.sync += stepped.eq(step)
            wrapped = Signal(name=f"{name}_wrapped")
            was_less2 = Signal(name=f"{name}_less2")
            was_less3 = Signal(name=f"{name}_less3")
            m.d.sync += [wrapped.eq(step & flag),
                         was_less2.eq(token == tokens_less2), was_less3.eq(token == tokens_less3)]
            is_less2 = Mux(stepped, Mux(wrapped, tokens_two, was_less3), was_less2)
            m.d.sync += flag.eq(Mux(step, Mux(flag, tokens_one, is_less2), token == tokens_last))
            return flag

        w_wrap = wrap_flag(w_token, loc.location.valid, "w_wrap")
        with m.If(loc.location.valid):
            with m.If(w_wrap):
                m.d.sync += [w_token.eq(0), w_choice.eq(w_choice + 1)]
            with m.Else():
                m.d.sync += w_token.eq(w_token + 1)
        # The capacity mask: an out-of-range index has location -1. The test is registered
        # before the count (the location's compare, a carry chain, reached the count's clock
        # enable: a seed's path); ``dropped`` is final a cycle after the last location, long
        # before the route phase ends.
        drop = Signal()
        m.d.sync += drop.eq(loc.location.valid & ((location < 0) | (location >= capacity)))
        with m.If(drop):
            m.d.sync += self.dropped.eq(self.dropped + 1)

        # ---- the per-expert totals -> the expert work list (filled experts only) ----------
        # (``one``: rows == 1, so that the expert phase's last-row flag loads a bit)
        work_layout = data.StructLayout({"base": p.addr_width, "rows": range(p.max_capacity + 1),
                                         "one": 1, "expert": range(p.max_experts)})
        work = m.submodules.work_list = memory.Memory(shape=work_layout, depth=p.max_experts,
                                                      init=[])
        work_w = work.write_port()
        work_r = work.read_port(domain="comb")
        work_in = Signal(range(p.max_experts + 1), reset_less=True)   # entries on the list
        work_out = Signal(range(p.max_experts + 1), reset_less=True)  # taken by the experts
        # work_in - 1 and work_in - 2, loaded with work_in: the expert phase's tests whether
        # an entry is left after the next one or two compare two registers, with no adder on
        # work_out in front (``work_out + 2 != work_in`` was among the layer's deepest inputs)
        work_in_less = [Signal(signed(len(work_in) + 2), init=-k, name=f"work_in_less{k}",
                               reset_less=True)
                        for k in (1, 2)]
        counts_in = Signal(range(p.max_experts + 1), reset_less=True)  # totals received
        count_base = Signal(p.addr_width + 1, reset_less=True)  # e*C*H of the next total
        # The totals pass two registers before the list: the first holds the count with its
        # compares (``count < C``, ``count != 0``), the second the filled rows ``min(count, C)``
        # and whether there are any, so the list's write enable starts from a register.
        total_valid = Signal()
        total_count = Signal.like(loc.counts.payload.count)
        total_below = Signal()                          # count < C
        total_any = Signal()                            # count != 0
        total_one = Signal()                            # count == 1
        filled = Signal()                               # a total with rows != 0 in hand
        filled_valid = Signal()
        filled_rows = Signal(range(p.max_capacity + 1))
        filled_one = Signal()                           # filled_rows == 1
        capacity_any = Signal()                         # C != 0 (held sizes)
        capacity_one = Signal()                         # C == 1
        count = loc.counts.payload.count
        m.d.sync += [
            total_valid.eq(loc.counts.valid),
            total_count.eq(count),
            total_below.eq(count < capacity),
            total_any.eq(count != 0),
            total_one.eq(count == 1),
            capacity_any.eq(capacity != 0),
            capacity_one.eq(capacity == 1),
            filled_valid.eq(total_valid),
            filled_rows.eq(Mux(total_below, total_count, capacity)),
            filled_one.eq(Mux(total_below, total_one, capacity_one)),
            filled.eq(total_valid & Mux(total_below, total_any, capacity_any)),
        ]
        m.d.comb += [
            loc.counts.ready.eq(1),
            work_w.addr.eq(work_in),
            work_w.data.base.eq(count_base),
            work_w.data.rows.eq(filled_rows),
            work_w.data.one.eq(filled_one),
            work_w.data.expert.eq(counts_in),
            work_w.en.eq(filled),
        ]
        # C*H on a pipelined product of the held sizes (loaded at accept): ready from cycle
        # start + 1 + its latency (at most 4: operands of at most 31 bits), before the
        # location generator's first total (its run control, three bank stages and output
        # register: start + 6 at the earliest, with no pairs).
        span_latency = product_latency(len(capacity), len(hidden))
        assert span_latency <= 4, span_latency
        m.d.comb += expert_span.eq(pipelined_product(m, capacity, hidden, en=1, dsp=p.dsp,
                                                     name="expert_span"))
        with m.If(filled_valid):
            m.d.sync += [counts_in.eq(counts_in + 1), count_base.eq(count_base + expert_span)]
            with m.If(filled):
                m.d.sync += [work_in.eq(work_in + 1), work_in_less[0].eq(work_in),
                             work_in_less[1].eq(work_in_less[0])]

        # ---- expert parameters (affine experts: E beats into a memory, any time in the run;
        # expert stacks: streamed into each expert's run, below) --------------------------------
        params_in = Signal(range(p.max_experts + 1), reset_less=True)
        if not p.stacked:
            expert_mem = m.submodules.expert_memory = memory.Memory(
                shape=p.expert_params_layout(), depth=p.max_experts, init=[])
            expert_w = expert_mem.write_port()
            expert_r = expert_mem.read_port(domain="comb")
            # Open while the run is on, the experts are affine and parameters are still to
            # come (``running & affine & (params_in != num_experts)``), as a register: set as
            # the run begins (``running`` rises with it), cleared at the last beat. The take
            # is then one gate of the stream's valid and this flop (the run flag and the
            # count's compare in front of it were the layer's critical path: 4 LUTs into the
            # LUT RAM's write enables, 157.5 MHz). The write itself is a cycle later, from
            # registers (the take, and the payload and address loaded every cycle): the take
            # reaches only the counts and this flop, not the memory's write enables too (with
            # them it was placed by the memory, and the flop's loop through it crossed the
            # chip twice: 190.0 MHz). The route phase does not end while a write is pending.
            params_open = Signal()
            params_left = Signal(range(p.max_experts + 1))
            params_take = self.expert_params.valid & params_open
            params_we = Signal()
            params_data = Signal.like(self.expert_params.payload, reset_less=True)
            params_addr = Signal.like(params_in, reset_less=True)
            m.d.sync += [params_we.eq(params_take), params_data.eq(self.expert_params.payload),
                         params_addr.eq(params_in)]
            m.d.comb += [
                self.expert_params.ready.eq(params_open),
                expert_w.addr.eq(params_addr),
                expert_w.data.eq(params_data),
                expert_w.en.eq(params_we),
            ]
            with m.If(params_take):
                m.d.sync += [params_in.eq(params_in + 1), params_left.eq(params_left - 1)]
                with m.If(params_left == 1):
                    m.d.sync += params_open.eq(0)
            with m.If(ctl.begin):
                m.d.sync += [params_left.eq(num_experts),
                             params_open.eq(affine & (num_experts != 0))]

        # ---- dispatch: headers from the pair memory as soon as they are written -------------
        # The pair chosen from the memory's word is registered before the dispatch unit (a
        # stage more than the read): the block RAM's output reached the dispatch's range
        # compare over a 1.4 ns net, then its choice and the compare's carry chain (186.3 MHz).
        # Whether a written pair is still to be read and whether the next header ends its
        # choice's tokens come from registers: the read's clock enables wait on no compare
        # (the pair count's compare, and the token's, into ``d_choice``: two seeds' paths).
        # ``unread`` counts the pairs written less the headers read a cycle late
        # (``d_stepped``), so that only registers reach it and its flags (the read's take
        # through its count, 4 levels, was a seed's path); a pair is left when it is not 0,
        # or not 1 after a read.
        d_ctl = m.submodules.dispatch_header = PipelineControl(BlockMemory.latency + 1)
        d_token = Signal.like(self.tokens, reset_less=True)
        d_choice = Signal(range(p.max_top_k), reset_less=True)
        unread = Signal.like(pairs, reset_less=True)
        unread_nonzero = Signal(reset_less=True)
        unread_not_one = Signal(init=1, reset_less=True)
        d_stepped = Signal(reset_less=True)
        m.d.comb += d_ctl.i_valid.eq(in_route & disp.busy &
                                     Mux(d_stepped, unread_not_one, unread_nonzero))
        d_step = d_ctl.i_valid & d_ctl.en
        m.d.sync += d_stepped.eq(d_step)
        count_level(m, unread, loc.location.valid, d_stepped,
                    [(unread_nonzero, False, 0), (unread_not_one, False, 1)])
        d_wrap = wrap_flag(d_token, d_step, "d_wrap", stepped=d_stepped)
        with m.If(d_step):
            with m.If(d_wrap):
                m.d.sync += [d_token.eq(0), d_choice.eq(d_choice + 1)]
            with m.Else():
                m.d.sync += d_token.eq(d_token + 1)
        d_entry = (pair_mem.read_data[0] if p.max_top_k == 1 else
                   pair_mem.read_data[delay(m, d_choice, BlockMemory.latency, d_ctl.en,
                                            name="d_choice_r", reset_less=True)])
        m.d.comb += [
            disp.header.valid.eq(d_ctl.o_valid),
            d_ctl.o_ready.eq(disp.header.ready),
            disp.header.payload.index.eq(delay(m, d_entry.index, 1, d_ctl.en, name="d_index",
                                               reset_less=True)),
            disp.header.payload.location.eq(delay(m, d_entry.location, 1, d_ctl.en,
                                                  name="d_location", reset_less=True)),
        ]
        wiring.connect(m, wiring.flipped(self.data), disp.data)

        # ---- combine: one header per token from the pair memory --------------------------------
        c_ctl = m.submodules.combine_header = PipelineControl(BlockMemory.latency)
        # Whether a token is left to read is a count of the tokens left, T when the route
        # phase starts, decremented a cycle after each read (``c_stepped``) like the
        # dispatch's ``unread``, with flags for 0 and 1: only registers reach the flags (the
        # combine's header ready through the read's take into a compare of ``c_token`` with
        # T, 4 levels, was the deepest path left; before that the compare itself).
        c_token = Signal.like(self.tokens, reset_less=True)
        c_left = Signal.like(self.tokens)
        c_left_nonzero = Signal()
        c_left_not_one = Signal()
        c_stepped = Signal()
        m.d.comb += c_ctl.i_valid.eq(in_combine & comb.busy &
                                     Mux(c_stepped, c_left_not_one, c_left_nonzero))
        c_step = c_ctl.i_valid & c_ctl.en
        m.d.sync += c_stepped.eq(c_step)
        count_level(m, c_left, 0, c_stepped,
                    [(c_left_nonzero, False, 0), (c_left_not_one, False, 1)])
        with m.If(c_step):
            m.d.sync += c_token.eq(c_token + 1)
        m.d.comb += [
            comb.header.valid.eq(c_ctl.o_valid),
            c_ctl.o_ready.eq(comb.header.ready),
        ]
        for choice in range(p.max_top_k):
            word = pair_mem.read_data[choice]
            m.d.comb += [comb.header.payload.gate[choice].eq(word.gate),
                         comb.header.payload.index[choice].eq(word.index),
                         comb.header.payload.location[choice].eq(word.location)]
        wiring.connect(m, comb.data, wiring.flipped(self.output))

        # The pair memory's one read port: dispatch headers in phase 1, combine's in phase 3.
        # The read advances when both pipelines do: the idle one's ``en`` is high (its stages
        # hold nothing), so this is the busy one's, without a choice by the phase between
        # the dispatch's ready and the blocks' enable pins (the dispatch's run flag through
        # its header ready and that choice, 3 levels, was two seeds' path).
        m.d.comb += [
            pair_mem.read_addr.eq(Mux(in_combine, c_token, d_token)),
            pair_mem.read_en.eq(c_ctl.en & d_ctl.en),
        ]

        # ---- experts: read each filled row, a*x + b per lane, write it back in place --------
        tag_layout = data.StructLayout({"scale": fmt.width, "bias": fmt.width,
                                        "base": p.addr_width})
        reader = m.submodules.expert_reader = RowReader(
            lanes=p.lanes, width=fmt.width, addr_width=p.addr_width, max_count=p.max_beats,
            tag_layout=tag_layout, outstanding=p.reader_outstanding, bram=p.bram,
            buffered_command=True, alternate_data=not p.stacked, skips=False)
        x_loaded = Signal()
        x_addr = Signal(p.addr_width)
        x_rows = Signal(range(p.max_capacity + 1))
        x_scale = Signal(fmt.width)
        x_bias = Signal(fmt.width)
        # The reader holds a command in a buffer of its own (``buffered_command``): the
        # command's ``ready`` is a register, and the next load's decision (``x_load``, the
        # clock enable of the wide command registers) is a few LUTs of registers, not the
        # reader's issue logic behind the command's ready (the path of the reader's
        # ``cur_last`` into ``x_rows``'s enable, 161.4 MHz). Before, a skid buffer in front of
        # the reader did that, and the memory's ready reached its flags through the issue
        # (4 LUTs, the path of three seeds in nine). The row's scale, bias and base go into
        # the reader's tag ring as the command is taken, one entry per row: no register of
        # them waits on the issue. Its beats' data leave from two registers written in turn
        # (``alternate_data``; the combine lanes register it): the expert pipeline's ready
        # reaches the output skid buffer's flags, not the data's clock enables (over nets of
        # 1.8 and 2.4 ns, a seed's path). It skips nothing (``skips=False``: every row is
        # read), so its join waits on the response alone (the in-flight head's read flag
        # through the join into the tag ring's read pointers was a seed's path).
        cmd = reader.command
        m.d.comb += [
            cmd.valid.eq(x_loaded),
            cmd.payload.addr.eq(x_addr),
            cmd.payload.count.eq(beats),
            cmd.payload.tail.eq(1),
            cmd.payload.tag.scale.eq(x_scale),
            cmd.payload.tag.bias.eq(x_bias),
            cmd.payload.tag.base.eq(x_addr),
            reader.last_enable.eq(last_en),
            work_r.addr.eq(work_out),
        ]
        if not p.stacked:
            m.d.comb += expert_r.addr.eq(work_r.data.expert)
        cmd_take = cmd.valid & cmd.ready
        # Whether the work list has an entry left (work_out != work_in) and whether the row
        # in hand is its expert's last (x_rows == 1) are registers, so that a load is a few
        # LUTs of registers and the command's ready. work_in holds still in the expert phase:
        # ``work_left_after`` (work_out + 1 != work_in) becomes ``work_left`` at a load.
        work_left = Signal()
        work_left_after = Signal()
        last_row = Signal()
        x_load = in_experts & work_left & (~x_loaded | (cmd_take & last_row))
        with m.If(x_load):
            m.d.sync += [work_left.eq(work_left_after),
                         work_left_after.eq(work_out != work_in_less[1])]
        with m.Else():
            m.d.sync += [work_left.eq(work_out != work_in),
                         work_left_after.eq(work_out != work_in_less[0])]
        with m.If(cmd_take):
            m.d.sync += [x_addr.eq(x_addr + hidden), x_rows.eq(x_rows - 1),
                         last_row.eq(x_rows == 2)]
            with m.If(last_row):
                m.d.sync += x_loaded.eq(0)
        with m.If(x_load):
            m.d.sync += [x_loaded.eq(1), x_addr.eq(work_r.data.base),
                         x_rows.eq(work_r.data.rows), last_row.eq(work_r.data.one),
                         work_out.eq(work_out + 1)]
            if not p.stacked:
                m.d.sync += [x_scale.eq(expert_r.data.scale), x_bias.eq(expert_r.data.bias)]

        if p.stacked:
            x_out, x_busy = self._expert_stacks(
                m, reader, work, work_in, in_experts, hidden, last_en, beats, num_experts,
                ctl_layers, ctl_relu, ctl.accept)
        else:
            # The multiply-add runs on the combine unit's lanes (the two phases never overlap:
            # one set of float multipliers and adders for both), freely, inside a credit
            # pipeline: no stall enable reaches the lanes' float pipelines, and the write
            # port's ready reaches only the queue's skid buffer.
            beat = reader.beats
            latency = p.combine.accumulate_latency
            # (the queue's output beat in two registers written in turn: the write port's
            # ready reaches no wide clock enable; its skid flag reached the output register's
            # enables over a 2.9 ns net, 187.5 MHz)
            x_pipe = m.submodules.expert_pipeline = CreditPipeline(
                latency, p.write_layout(), alternate=("addr", "data"))
            m.d.comb += [x_pipe.i_valid.eq(beat.valid), beat.ready.eq(x_pipe.i_ready)]
            x_offset = Signal(p.addr_width, reset_less=True)  # the beat's offset in its row
            with m.If(x_pipe.take):
                m.d.sync += x_offset.eq(Mux(beat.payload.last, 0, x_offset + p.lanes))
            m.d.comb += [comb.expert.on.eq(in_experts),
                         comb.expert.scale.eq(beat.payload.tag.scale),
                         comb.expert.data.eq(beat.payload.data),
                         comb.expert.bias.eq(beat.payload.tag.bias)]
            x_w_addr = delay(m, beat.payload.tag.base + x_offset, latency, 1,
                             name="x_addr", reset_less=True)
            x_w_enable = delay(m, beat.payload.enable, latency, 1, name="x_enable",
                               reset_less=True)
            m.d.comb += [
                x_pipe.payload.addr.eq(x_w_addr),
                x_pipe.payload.enable.eq(x_w_enable),
            ]
            m.d.comb += x_pipe.payload.data.eq(comb.sums)

            x_out, x_busy = x_pipe.o, x_pipe.busy

        # ---- the expert buffer's ports, shared by phase ----------------------------------------
        # Each port is driven by a skid buffer of its own, behind the choice by phase: the
        # port's valid and payload are registers (the choice's select would otherwise fan
        # out to every payload bit on the way out of the unit), and its ready reaches only
        # that skid buffer.
        def shared_port(name, layout, first, second, second_copies, alternate=()):
            # A skid buffer driven by stream ``first`` in its phase and by ``second`` in its
            # own; ``second_copies`` (copies of the second's phase flag, read only once a
            # phase has been entered: in the idle phase neither stream is on) choose the
            # payload, each copy a group of its bits. Neither stream's valid nor its ready
            # is gated by its phase: a stream is valid only in its own phase (its unit is
            # idle before and has drained after), so the buffer's valid is the two valids
            # or'ed, and a ready outside a stream's phase takes nothing. The reader's issue
            # behind the ready is a gate shorter (the combine reader's issue, gated so,
            # reached its command registers' enables in 4 LUTs), and no phase flag is on
            # the way to the buffer's flags (``in_experts`` through the choice of the valids
            # into the request buffer's, 4 levels).
            port = m.submodules[name] = SkidBuffer(layout, alternate=alternate)
            width = len(port.i.payload.as_value())
            group = -(-width // len(second_copies.values))
            choice = [Mux(copy, second.payload.as_value()[lo:lo + group],
                          first.payload.as_value()[lo:lo + group])
                      for copy, lo in zip(second_copies.values, range(0, width, group))]
            m.d.comb += [
                port.i.valid.eq(first.valid | second.valid),
                port.i.payload.eq(Cat(*choice)),
                first.ready.eq(port.i.ready),
                second.ready.eq(port.i.ready),
            ]
            return port

        # write: dispatch in phase 1, experts in phase 2; read: experts, then combine
        # (the write's address and data leave from two registers written in turn: the
        # port's ready, the wrapper's or the bus master's, reaches the buffer's flags and
        # pointer, not the clock enables of the whole beat: seeds 1 and 5 of nine ran from
        # the port's output flag and that ready, over two 2 ns nets, into them)
        write_port = shared_port("write_port", p.write_layout(),
                                 disp.write, x_out, experts_copies,
                                 alternate=("addr", "data"))
        request_port = shared_port("request_port", request_layout(p.lanes, p.addr_width),
                                   reader.request, comb.read_request, combine_copies)
        # The responses go to both readers, ungated: a reader takes a response only for a
        # read of its own in flight, and its reads are all answered and taken before its
        # phase ends (the expert phase ends with the reader idle; the combine's reads begin
        # in its phase), so in each phase one reader has reads in flight and the other's
        # ``ready`` is low. No phase flag is on the way from the response's valid to the
        # readers' joins (``in_experts`` and ``in_combine`` into their in-flight queues'
        # flags and skid buffers, 4 levels).
        m.d.comb += [
            reader.response.valid.eq(self.read_response.valid),
            comb.read_response.valid.eq(self.read_response.valid),
            reader.response.payload.eq(self.read_response.payload),
            comb.read_response.payload.eq(self.read_response.payload),
            self.read_response.ready.eq(reader.response.ready | comb.read_response.ready),
        ]

        wiring.connect(m, write_port.o, wiring.flipped(self.write))
        wiring.connect(m, request_port.o, wiring.flipped(self.read_request))

        # ---- control ----------------------------------------------------------------------------
        # The sub-units start a cycle after the layer's run control begins (ctl.begin: not
        # too big, S > 0), from a register: the run control's setup count is then not in
        # front of their start logic (their idle flags and the clock enables of every
        # register they load at the start). The sizes they take with it are held registers.
        # The combine unit reads the layer's held sizes when the route (or expert) phase ends.
        m.d.sync += sub_start.eq(ctl.begin)
        # P = k*S on a pipelined product of the held sizes, then a fabric register (the
        # product leaves a DSP block, and the sub-units' start logic takes it), ready when the
        # run begins.
        m.d.sync += pairs.eq(pipelined_product(m, tokens, top_k, en=1, dsp=p.dsp,
                                               name="pairs")[:len(pairs)])
        m.d.comb += [
            loc.start.eq(sub_start),
            loc.pairs.eq(pairs),
            loc.num_experts.eq(num_experts),
            loc.capacity.eq(capacity),
            disp.start.eq(sub_start),
            disp.pairs.eq(pairs),
            disp.hidden.eq(hidden),
            disp.capacity.eq(capacity),
            disp.num_experts.eq(num_experts),
            comb.tokens.eq(tokens),
            comb.hidden.eq(hidden),
            comb.top_k.eq(top_k),
            comb.capacity.eq(capacity),
            comb.num_experts.eq(num_experts),
        ]
        # The phase's end and the choice of the next phase read registers alone: every
        # parameter taken is ``~params_open`` (``params_in == num_experts`` once the run has
        # begun, and the route phase starts after that), and the size and count tests are
        # flags beside them (a compare of the held counts in front of the phase registers
        # was the layer's critical path).
        route_done = (in_route & loc.done & disp.done & ~write_port.o.valid &
                      ~total_valid & ~filled_valid)
        hidden_any = Signal()                           # H != 0 (held sizes)
        m.d.sync += hidden_any.eq(hidden != 0)
        if p.stacked:
            # Expert stacks run (and take their parameters) whenever H, L > 0, filled rows
            # or not: the parameters of every expert are on the stream.
            layers_any = Signal()
            m.d.sync += layers_any.eq(ctl_layers != 0)
            run_experts = affine & hidden_any & layers_any
        else:
            route_done &= ~params_open & ~params_we
            work_any = Signal()                         # work_in != 0
            with m.If(filled_valid & filled):
                m.d.sync += work_any.eq(1)
            with m.If(ctl.accept):
                m.d.sync += work_any.eq(0)
            run_experts = affine & hidden_any & work_any
        experts_done = (in_experts & ~work_left & ~x_loaded & ~reader.busy &
                        ~x_busy & ~write_port.o.valid)
        # The next phase is chosen into registers a cycle after these flags (pulses: each
        # clears as the phase moves on): the flags come from all over the layer, and the
        # choice behind them reached the phase flags and their copies in 4 levels (the
        # expert phase's ``work_left`` through ``experts_done``, ``hidden_any`` through
        # ``run_experts``). Both tests hold once true until the phase changes (every unit of
        # the phase is idle and has nothing left to take; ``run_experts`` is final before the
        # route phase ends), so the registers cost one cycle per phase (``PHASE_EXIT``).
        to_experts = Signal()
        to_combine = Signal()
        m.d.sync += [to_experts.eq(route_done & run_experts & ~to_experts),
                     to_combine.eq(((route_done & ~run_experts) | experts_done) &
                                   ~to_combine)]
        finished = in_combine & comb.done
        # The combine unit's start is registered (a cycle into its phase): the start reaches
        # the unit's run control.
        m.d.sync += comb.start.eq(to_combine)
        m.d.comb += ctl.finished.eq(finished)
        # The one-hot flags and their copies each from their own set and clear, not from the
        # choice among all four entries (the combine's end through ``finished`` into the
        # copies of ``in_experts``, 3 levels, was a seed's path): a phase is entered only
        # from the one before it, so a flag is set by its own entry and cleared by the next.
        # The copies load every cycle the value their flag takes (they read all ones for a
        # cycle after a reset, in the idle phase, where nothing reads them).
        experts_next = to_experts | (in_experts & ~to_combine)
        combine_next = to_combine | (in_combine & ~comb.done)
        m.d.sync += [
            in_route.eq(sub_start | (in_route & ~to_experts & ~to_combine)),
            in_experts.eq(experts_next), *experts_copies.eq(experts_next),
            in_combine.eq(combine_next), *combine_copies.eq(combine_next),
        ]

        with m.If(ctl.accept):
            m.d.sync += [affine.eq(self.affine),
                         beats.eq((self.hidden + (p.lanes - 1)) >> lanes_log2)]
            if p.stacked:
                m.d.sync += [ctl_layers.eq(self.layers), ctl_relu.eq(self.relu)]
        # The registers that restart at a constant do so in the decide cycle (a register, the
        # cycle after the start is taken), not from the start handshake, which then reaches
        # only the registers that take the inputs (the wrapper's start register over a long
        # net into the clears of ``unread``, ``x_offset`` and ``dropped``: seeds' paths).
        # Nothing reads them before the run begins (the parameters are taken from ``begin``).
        with m.If(ctl.decide):
            m.d.sync += [
                w_token.eq(0), w_choice.eq(0), unread.eq(0), unread_nonzero.eq(0),
                unread_not_one.eq(1), d_stepped.eq(0),
                work_in.eq(0), work_out.eq(0), counts_in.eq(0), count_base.eq(0),
                *(less.eq(-k) for k, less in enumerate(work_in_less, 1)),
                params_in.eq(0), d_token.eq(0), d_choice.eq(0), c_token.eq(0),
                x_loaded.eq(0), self.dropped.eq(0),
            ]
            if not p.stacked:
                m.d.sync += x_offset.eq(0)
        with m.If(sub_start):
            m.d.sync += [c_left.eq(tokens), c_left_nonzero.eq(tokens_any),
                         c_left_not_one.eq(~tokens_one)]
        return m
