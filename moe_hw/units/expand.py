"""The expand unit: OneFlow ``expand`` as an N-D stride address generator (SPEC 1.6, seed 002).

Output element x = (x_0, .., x_{R-1}), in C order, is ``input_flat[sum_d x_d * out_stride[d]]``.
Elements are moved, never changed: the ``format`` only sets the element width (32 bits for
fp32, 16 for fp16 and bf16, 8 for int8). ``repeat`` runs on the same hardware (the host maps
it to reshape + expand + reshape, :mod:`moe_hw.host.repeat`).

On-chip path (the only one built so far): the whole input is first loaded into an on-chip
buffer, then the output streams out at one beat of ``lanes`` elements per cycle for every
stride pattern (an innermost broadcast, kept runs shorter than ``lanes``, a broadcast row):
each lane reads its own copy of the buffer.

Streams and ports (payload fields are listed least significant first):

``input_data`` (in)
    The input, flat in C order, ``ceil(input_elements / lanes)`` beats: ``data`` (``lanes``
    elements, lane 0 first; the lanes past the end of the last beat are ignored).
``output`` (out)
    The output, flat in C order, ``ceil(output_elements / lanes)`` beats: ``data``,
    ``enable`` (lane enables: partial on the last beat when the output is not a multiple of
    ``lanes``; the disabled lanes carry some element of the input) and ``last`` (the last
    beat).
``start``, ``input_elements``, ``output_elements`` (in)
    Run-time sizes, sampled when ``start`` is high while idle
    (:class:`~moe_hw.blocks.run_control.RunControl`); a size above its maximum sets
    ``error`` and the run does nothing; ``output_elements == 0`` is an empty run (nothing
    loaded, nothing out).
``plan`` (in)
    The address generator's run-time plan, ``max_rank + lanes`` beats taken first in a run
    (:meth:`ExpandParams.plan_layout`: ``digit`` and ``addr``, arrays of
    ``max(max_rank, 4)``, and ``carry``, ``max_rank`` bits): beat d < ``max_rank`` holds dim d's four steps of y_d and of a_d
    (below), beat ``max_rank + l`` lane l's start values of every dim and the carries of
    its first step. The host planner
    (:func:`moe_hw.host.expand.plan`) computes it from the input shape and the expand sizes.
    (A stream rather than a port sampled with ``start``: the plan of 16 lanes by 6 dims is
    thousands of bits.)
``busy``, ``done``, ``error`` (out)
    ``done`` rises when the last beat has left and stays high until the next start.

The address generator. The host planner drops the size-1 output dims, merges neighbouring
dims that are one run of addresses (a kept dim over a contiguous kept dim; two broadcast
dims), and pads the result in front with size-1 dims to ``max_rank`` dims of sizes s_d and
strides t_d. Lane l walks the output elements l, l + lanes, l + 2*lanes, ...: an odometer
that adds K = ``lanes`` per beat in the mixed radix of the output shape, whose digits k_d
the planner computes. Dim d of a lane holds ``y_d = x_d + k_d - s_d`` and ``q_d = y_d + 1``
(two's complement: their sign bits are the wrap flags, registers, no compare) and its share
of the address ``a_d = x_d * t_d``. With ``c_R = 0``, the carry out of dim d is
``c_d = (y_d >= 0) | ((q_d >= 0) & c_{d+1})`` (a lookahead over R flag pairs), and each
register adds one of four planned constants chosen by ``(c_{d+1}, c_d)``: ``k_d + c_{d+1} -
c_d*s_d`` to y_d and q_d, that times t_d to a_d. Counters and adders only, no run-time
multiplier. The address ``sum_d a_d`` is formed by a registered adder tree outside the loop.

The odometer runs a step ahead (:func:`odometer`), so that no adder and no lookahead share a
cycle: it holds the carries of the coming step (registers; a lane's start carries come with
its plan beat) and, per dim, the candidates of the next y_d and q_d, y_d plus each step
(registers). A step takes the next y_d as the candidate its carries choose, the next carries
from the lookahead over the chosen candidates' sign bits, and forms the following candidates
from the chosen one: one step per cycle with every loop a register choice followed by either
the lookahead or an adder.

The buffer: ``lanes`` copies, one per output lane, each a
:class:`~moe_hw.blocks.banked_memory.BankedMemory` of ``ceil(max_input / lanes)`` rows of
``lanes`` elements. A load beat writes one row of every copy (so the load takes one cycle per
input beat); lane l reads the row of its address from its own copy and keeps the element at
the address's low bits. Memory: ``lanes * ceil(max_input / lanes) * lanes`` elements, that
is ``lanes`` times the input (lanes 16, fp32, max_input 256: 128 Kbit of LUT RAM).

A run takes the plan, then the input, then streams the output.

Split across P parallel units (``parts`` = P > 1; OneFlow SBP ``split(d)``, SPEC 1.6): P
copies of the unit above (the expand core, unchanged) side by side, each with its own
streams and run-time sizes, every name prefixed with ``part<p>_`` (:meth:`ExpandParams.prefix`):
``part<p>_input_data``, ``part<p>_output``, ``part<p>_plan``, ``part<p>_input_elements``,
``part<p>_output_elements``. The host gives part p its physical slice of the input and its
own plan (:func:`moe_hw.golden.physical_expand`); ``max_input`` and ``max_output`` are per
part. ``start``, ``busy``, ``done`` and ``error`` are shared, and registered at the top:
``start`` is taken while ``busy`` is low and starts every part; ``busy`` is high from the
cycle after the start until the cycle after the last part is idle; ``done`` rises the cycle
after every part is done and stays high until the next start; ``error`` is high, with
``done``, when any part found a size above its maximum. With ``parts`` = 1 (the default)
the unit is the core itself: the names above, no prefix, no extra register.

Cycles (stall-free, from the start cycle to the first cycle ``done`` is high):
:meth:`ExpandParams.cycles` = ``max_rank + lanes + max(1, ceil(n_in / lanes)) + ceil(n_out
/ lanes) +`` :attr:`ExpandParams.overhead`, the plan beats, the load beats (a cycle with no
input: the last lane's odometer loads its plan beat), the output beats, and a
fixed overhead (run control, the address tree, the memory read, the lane select, the output
queue, done);
an empty run takes :data:`~moe_hw.blocks.run_control.EMPTY_CYCLES`. Any pause costs only the
cycles it lasts. With ``parts`` = P > 1 the parts run at once, each on its own streams:
:meth:`ExpandParams.split_cycles` = ``max_p cycles(n_in_p, n_out_p) + 1``, the slowest part
(an empty part counting ``EMPTY_CYCLES``) and the registered ``done``.
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..blocks.banked_memory import BankedMemory
from ..blocks.row_reader import last_enable_of
from ..blocks.run_control import EMPTY_CYCLES, START_LATENCY, RunControl, run_ports
from ..params import LANES, ParameterError, UnitParams, param, resolve_params
from ..stream import CreditPipeline, replicated

__all__ = ["ExpandParams", "ExpandUnit", "ELEMENT_FORMATS", "PARTS", "SPLIT_LATENCY",
           "StrideAddressParams", "dim_steps", "odometer", "sum_tree"]

#: Element formats and their widths (the unit moves bits; nothing else differs).
ELEMENT_FORMATS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8}

#: The ``parts`` a unit may have (parallel expand cores, SBP split).
PARTS = (1, 2, 4, 8)

#: Cycles a split unit (``parts`` > 1) adds to its slowest part: the registered ``done``.
SPLIT_LATENCY = 1


class StrideAddressParams:
    """What the expand units' parameter classes share: the address generator's sizes and
    its plan layout (fields ``lanes``, ``max_rank``, ``max_input``, ``max_output``)."""

    def check(self):
        if -(-self.max_input // self.lanes) > 1 << 16:
            raise ParameterError(f"max_input must be at most {self.lanes << 16} at lanes "
                                 f"{self.lanes}, not {self.max_input}")

    @property
    def rows(self):
        """Rows of ``lanes`` elements that hold ``max_input`` elements."""
        return -(-self.max_input // self.lanes)

    @property
    def addr_width(self):
        """Bits of an element address (and of a dim's share of it), modulo 2**addr_width."""
        return max(1, ceil_log2(self.rows * self.lanes))

    @property
    def digit_width(self):
        """Bits of a dim's y_d = x_d + k_d - s_d and of its steps (-s_d .. s_d)."""
        return bits_for(self.max_output) + 1

    @property
    def tree_latency(self):
        """Registered levels of the address adder tree (at least one)."""
        return max(1, ceil_log2(self.max_rank))

    def plan_layout(self):
        """A beat of the plan: ``digit`` and ``addr``, ``max(max_rank, 4)`` entries each, and
        ``carry``, ``max_rank`` bits. Dim d's beat: the steps of y_d and of a_d, entry
        ``2*c_{d+1} + c_d`` (``carry`` unused); lane l's beat: the start y_d and a_d of dim d
        in entry d (dim 0 outermost) and the start's carries, c_d in bit d."""
        entries = max(self.max_rank, 4)
        return data.StructLayout({
            "digit": data.ArrayLayout(signed(self.digit_width), entries),
            "addr": data.ArrayLayout(self.addr_width, entries),
            "carry": self.max_rank,
        })


@dataclass(frozen=True)
class ExpandParams(StrideAddressParams, UnitParams):
    """Generation-time parameters of :class:`ExpandUnit`."""

    format: str = param("fp32", choices=tuple(ELEMENT_FORMATS), doc="sets the element width")
    lanes: int = param(16, choices=LANES)
    max_rank: int = param(6, minimum=1, maximum=16, doc="dims of expand_size")
    max_input: int = param(256, minimum=1, maximum=1 << 20,
                           doc="input elements held on chip (lanes copies of them)")
    max_output: int = param(1 << 24, minimum=1, maximum=1 << 40, doc="output elements")
    parts: int = param(1, choices=PARTS,
                       doc="parallel expand cores (SBP split); max_input/max_output per part")

    @property
    def element_width(self):
        return ELEMENT_FORMATS[self.format]

    @property
    def read_latency(self):
        """Cycles from a beat's take to its elements at the queue: the adder tree, the
        buffer read, the lane select."""
        return self.tree_latency + BankedMemory.read_latency(self.rows) + 1

    @property
    def overhead(self):
        """Stall-free cycles beyond one per load beat and one per output beat: run control
        (start, decide), the read pipeline (:attr:`read_latency`), the output queue
        (:attr:`CreditPipeline.QUEUE_LATENCY`), the queue's busy flag and done."""
        return (START_LATENCY + self.read_latency + CreditPipeline.QUEUE_LATENCY
                + CreditPipeline.IDLE_LATENCY + 1)

    @property
    def plan_beats(self):
        """Beats of the plan stream: one per dim, one per lane."""
        return self.max_rank + self.lanes

    def cycles(self, input_elements, output_elements):
        """Exact stall-free cycles of a run (start cycle to the first cycle ``done`` is
        high)."""
        if output_elements == 0:
            return EMPTY_CYCLES
        return (self.plan_beats + self.load_cycles(input_elements)
                + -(-output_elements // self.lanes) + self.overhead)

    def load_cycles(self, input_elements):
        """Cycles of the load: one per input beat, at least one (the last lane's odometer
        loads its plan beat in the cycle after the take; a hostile run with no input but
        some output waits for it)."""
        return max(1, -(-input_elements // self.lanes))

    def split_cycles(self, part_sizes):
        """Exact stall-free cycles of a run split over the parts, ``part_sizes`` a list of
        ``(input_elements, output_elements)``, one per part: :meth:`cycles` of the slowest part
        and, with ``parts`` > 1, the registered ``done`` (:data:`SPLIT_LATENCY`)."""
        if len(part_sizes) != self.parts:
            raise ValueError(f"part_sizes must have {self.parts} entries (parts), not "
                             f"{len(part_sizes)}")
        slowest = max(self.cycles(n_in, n_out) for n_in, n_out in part_sizes)
        return slowest + (SPLIT_LATENCY if self.parts > 1 else 0)

    def prefix(self, part):
        """The port-name prefix of part ``part``: none with one part, ``part<p>_``
        otherwise."""
        return "" if self.parts == 1 else f"part{part}_"

    def input_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.element_width, self.lanes)})

    def output_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.element_width, self.lanes),
                                  "enable": self.lanes, "last": 1})


def dim_steps(m, p, payload, loads):
    """The dims' step registers ``(dy, da)`` of the address generator: dim d's four steps of
    y_d and of a_d, loaded from the plan beat ``payload`` in a cycle ``loads[d]`` is high.
    ``dy`` has two more entries, 4 and 5: steps 2 and 3 plus one (the steps of q_d with a
    carry in, for the odometer's flags a step ahead)."""
    dy = [Signal(data.ArrayLayout(signed(p.digit_width), 6), name=f"dim{d}_dy")
          for d in range(p.max_rank)]
    da = [Signal(data.ArrayLayout(p.addr_width, 4), name=f"dim{d}_da")
          for d in range(p.max_rank)]
    for d in range(p.max_rank):
        with m.If(loads[d]):
            m.d.sync += [dy[d][i].eq(payload.digit[i]) for i in range(4)]
            m.d.sync += [dy[d][4 + i].eq(payload.digit[2 + i] + 1) for i in range(2)]
            m.d.sync += [da[d][i].eq(payload.addr[i]) for i in range(4)]
    return dy, da


def odometer(m, p, dy, da, *, load, start, take, name):
    """One lane's odometer (see the module docstring), a step ahead: loads its start values
    and start carries from the plan beat ``start`` when ``load`` is high, else steps by the
    planned constants when ``take`` is high. Returns the dims' shares of the address,
    ``[a_0, .., a_{R-1}]`` (registers); the address is their sum (:func:`sum_tree`).

    The registers: the carries ``c_d`` of the coming step, and per dim the candidates of
    the next y_d, ``v_i = y_d + dy_i`` (i = 2*carry in + wrap; 4 and 5 the next q_d with a
    carry in). A step takes the next y_d as the candidate its carries choose, and the next
    carries from the chosen candidates' sign bits: registers chosen by registers, then the
    lookahead; the adders only form the following candidates from the chosen one."""
    rank = p.max_rank
    carry = Signal(rank, name=f"{name}_carry")      # c_d, out of dim d, this step
    a = [Signal(p.addr_width, name=f"{name}_a{d}") for d in range(rank)]
    next_carry = [Const(0)] * (rank + 1)             # the following step's; c_R = 0
    steps = []
    for d in reversed(range(rank)):
        innermost = d == rank - 1
        # The innermost dim has no carry in: its candidates 0 and 1 only (its q_d unused).
        count = 2 if innermost else 6
        v = Signal(data.ArrayLayout(signed(p.digit_width), count), name=f"{name}_v{d}")
        choice = carry[d] if innermost else Cat(carry[d], carry[d + 1])
        y_next = v[choice]
        next_carry[d] = ~y_next.as_signed()[-1]
        if not innermost:
            # q_d + dy_i = y_d + dy_(i+2): step i's q_d candidate is entry i + 2.
            q_next = v[Cat(carry[d], carry[d + 1], Const(0, 1)) + 2]
            next_carry[d] |= ~q_next.as_signed()[-1] & next_carry[d + 1]
        steps.append((d, v, choice, y_next, count))
    with m.If(load):
        m.d.sync += carry.eq(start.carry)
        m.d.sync += [a[d].eq(start.addr[d]) for d in range(rank)]
    with m.Elif(take):
        m.d.sync += carry.eq(Cat(*next_carry[:rank]))
        m.d.sync += [a[d].eq(a[d] + da[d][choice]) for d, _, choice, _, _ in steps]
    for d, v, _, y_next, count in steps:
        base = Mux(load, start.digit[d], y_next)
        with m.If(load | take):
            m.d.sync += [v[i].eq(base + dy[d][i]) for i in range(count)]
    return a


def sum_tree(m, values, *, name):
    """The registered pairwise sum of ``values`` (modulo their width): one register level per
    halving, at least one."""
    width = len(values[0])
    level = 0
    while True:
        pairs = [values[i:i + 2] for i in range(0, len(values), 2)]
        regs = []
        for index, pair in enumerate(pairs):
            reg = Signal(width, name=f"{name}_l{level}_{index}", reset_less=True)
            m.d.sync += reg.eq(pair[0] + pair[1] if len(pair) == 2 else pair[0])
            regs.append(reg)
        values, level = regs, level + 1
        if len(values) == 1:
            return values[0]


class ExpandUnit(wiring.Component):
    """The stride address generator in front of a per-lane replicated on-chip buffer, one
    output beat per cycle; with ``parts`` > 1, that many of them side by side. See the module
    docstring for the protocol."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(ExpandParams, params, kwargs)
        self.params = p = params
        streams = {}
        for part in range(p.parts):
            prefix = p.prefix(part)
            streams.update({
                f"{prefix}input_data": In(stream.Signature(p.input_layout())),
                f"{prefix}output": Out(stream.Signature(p.output_layout())),
                f"{prefix}plan": In(stream.Signature(p.plan_layout())),
            })
        super().__init__({**streams, **run_ports(self.sizes)})

    @property
    def sizes(self):
        """The run-time sizes and their maxima, in port order (each part's, prefixed)."""
        p = self.params
        return {f"{p.prefix(part)}{name}": maximum for part in range(p.parts)
                for name, maximum in (("input_elements", p.max_input),
                                      ("output_elements", p.max_output))}

    def elaborate(self, platform):
        if self.params.parts > 1:
            return self.elaborate_parts()
        m = Module()
        p = self.params
        lanes, rank = p.lanes, p.max_rank
        lanes_log2 = ceil_log2(lanes)

        ctl = m.submodules.control = RunControl(self.sizes, empty_when_zero=("output_elements",))
        ctl.connect(m, self)
        running = ctl.running

        # ---- run registers, loaded with start ---------------------------------------------
        max_in_beats = p.rows
        max_out_beats = -(-p.max_output // lanes)
        load_row = Signal(range(max(2, max_in_beats)))
        load_left = Signal(range(max_in_beats + 1))
        load_open = Signal()                 # an input beat is still to come
        out_left = Signal(range(max_out_beats + 1))
        out_last = Signal()                  # the beat in hand is the last (a register)
        generating = Signal()                # an output beat is still to be issued
        last_en = Signal(lanes)
        # The plan beat expected next, one-hot: dims 0 .. max_rank-1, then the lanes.
        plan_next = Signal(p.plan_beats, init=1)
        plan_open = Signal()                 # a plan beat is still to come
        with m.If(ctl.accept):
            m.d.sync += [
                plan_next.eq(1),
                plan_open.eq(1),
                load_row.eq(0),
                load_left.eq((self.input_elements + (lanes - 1)) >> lanes_log2),
                load_open.eq(self.input_elements != 0),
                out_left.eq((self.output_elements + (lanes - 1)) >> lanes_log2),
                out_last.eq(self.output_elements <= lanes),
                last_en.eq(last_enable_of(self.output_elements, lanes)),
            ]

        # ---- the plan: the dims' steps, then the lanes' start values -------------------------
        # A plan beat is registered, with a load flag per dim and per lane (registers: each
        # lane's odometer loads on a flag of its own), and loaded a cycle after its take.
        planning = running & plan_open
        plan_take = self.plan.valid & planning
        m.d.comb += self.plan.ready.eq(planning)
        beat = Signal(p.plan_layout(), name="plan_beat")
        beat_loads = Signal(p.plan_beats, name="plan_loads")
        m.d.sync += beat_loads.eq(Mux(plan_take, plan_next, 0))
        with m.If(plan_take):
            m.d.sync += [beat.eq(self.plan.payload),
                         plan_next.eq(Cat(Const(0), plan_next[:-1]))]
            with m.If(plan_next[-1]):
                m.d.sync += plan_open.eq(0)
        dy, da = dim_steps(m, p, beat, [beat_loads[d] for d in range(rank)])

        # ---- load: every input beat is one row of every lane's copy ------------------------
        copies = []
        for lane in range(lanes):
            copy = BankedMemory(data.ArrayLayout(p.element_width, lanes), p.rows)
            m.submodules[f"copy{lane}"] = copy
            copies.append(copy)
        loading = running & ~plan_open & load_open
        load_take = self.input_data.valid & loading
        m.d.comb += self.input_data.ready.eq(loading)
        for copy in copies:
            m.d.comb += [copy.write_addr.eq(load_row),
                         copy.write_data.eq(self.input_data.payload.data),
                         copy.write_en.eq(load_take)]
        with m.If(load_take):
            m.d.sync += [load_row.eq(load_row + 1), load_left.eq(load_left - 1)]
            with m.If(load_left == 1):
                m.d.sync += load_open.eq(0)

        # ---- the output pipeline: free-running, behind a credit-counted queue --------------
        pipe = m.submodules.output_pipe = CreditPipeline(p.read_latency, p.output_layout())
        wiring.connect(m, pipe.o, wiring.flipped(self.output))
        # generating is set only while running (by the last input beat, or a cycle after the
        # last plan beat when there is no input: the last lane's odometer loads then) and
        # falls with the last output beat, so it is the pipeline's valid on its own.
        m.d.comb += pipe.i_valid.eq(generating)
        take = pipe.take
        with m.If(take):
            m.d.sync += [out_left.eq(out_left - 1), out_last.eq(out_left == 2)]
        generating_next = Mux((load_take & (load_left == 1)) | (beat_loads[-1] & ~load_open),
                              1, Mux(take & out_last, 0, generating))
        m.d.sync += generating.eq(generating_next)
        m.d.comb += ctl.finished.eq(running & ~plan_open & ~beat_loads[-1] & ~load_open &
                                    ~generating & ~pipe.busy)
        # The odometers' step: the take, formed per group of lanes from copies of its two
        # registers, so that no one net reaches every odometer register.
        groups = min(lanes, 4)
        takes = [valid & ready for valid, ready in zip(
            replicated(m, generating_next, name="generating_copy", copies=groups),
            replicated(m, pipe.ready_next, name="ready_copy", copies=groups))]

        # ---- the lanes' odometers ----------------------------------------------------------
        for lane in range(lanes):
            a = odometer(m, p, dy, da, load=beat_loads[rank + lane], start=beat,
                         take=takes[lane * groups // lanes], name=f"lane{lane}")
            # The address, its row in the lane's copy and its element in the row.
            addr = sum_tree(m, a, name=f"lane{lane}_addr")
            copy = copies[lane]
            m.d.comb += [copy.read_addr.eq(addr >> lanes_log2), copy.read_en.eq(1)]
            element = Signal(p.element_width, name=f"lane{lane}_element", reset_less=True)
            if lanes_log2:
                col = addr[:lanes_log2]
                for stage in range(copy.latency):
                    reg = Signal(lanes_log2, name=f"lane{lane}_col{stage}", reset_less=True)
                    m.d.sync += reg.eq(col)
                    col = reg
                m.d.sync += element.eq(copy.read_data[col])
            else:
                m.d.sync += element.eq(copy.read_data[0])
            m.d.comb += pipe.payload.data[lane].eq(element)

        # The beat's lane enables and last flag travel beside it.
        flags = Signal(lanes + 1)
        m.d.comb += flags.eq(Cat(Mux(out_last, last_en, (1 << lanes) - 1), out_last))
        for stage in range(p.read_latency):
            reg = Signal(lanes + 1, name=f"flags{stage}", reset_less=True)
            m.d.sync += reg.eq(flags)
            flags = reg
        m.d.comb += [pipe.payload.enable.eq(flags[:lanes]), pipe.payload.last.eq(flags[lanes])]
        return m

    def elaborate_parts(self):
        """``parts`` expand cores, each on its own ports, under one registered status."""
        m = Module()
        p = self.params
        core_params = p.replace(parts=1)
        # Taken while busy is low: then every core is idle (busy covers them all), and each
        # core takes it in the same cycle.
        accept = self.start & ~self.busy
        cores = []
        for part in range(p.parts):
            core = m.submodules[f"part{part}"] = ExpandUnit(core_params)
            cores.append(core)
            prefix = p.prefix(part)
            wiring.connect(m, wiring.flipped(getattr(self, f"{prefix}input_data")),
                           core.input_data)
            wiring.connect(m, wiring.flipped(getattr(self, f"{prefix}plan")), core.plan)
            wiring.connect(m, core.output, wiring.flipped(getattr(self, f"{prefix}output")))
            m.d.comb += [core.start.eq(accept),
                         core.input_elements.eq(getattr(self, f"{prefix}input_elements")),
                         core.output_elements.eq(getattr(self, f"{prefix}output_elements"))]
        # Registered status: busy from the cycle after the start (a core is busy from then
        # on, so busy is never low while a core is busy); done and error cleared by the start.
        m.d.sync += [
            self.busy.eq(accept | Cat(*(core.busy for core in cores)).any()),
            self.done.eq(~accept & Cat(*(core.done for core in cores)).all()),
            self.error.eq(~accept & Cat(*(core.error for core in cores)).any()),
        ]
        return m
