"""The expand unit: OneFlow ``expand`` as an N-D stride address generator (SPEC 1.6, seed 002).

Output element x = (x_0, .., x_{R-1}), in C order, is ``input_flat[sum_d x_d * out_stride[d]]``.
Elements are moved, never changed: the ``format`` only sets the element width (32 bits for
fp32, 16 for fp16 and bf16, 8 for int8). ``repeat`` runs on the same hardware (the host maps
it to reshape + expand + reshape, :mod:`moe_hw.host.repeat`).

Two paths, chosen at generation time by ``memory``:

- ``onchip`` (the default): the whole input is first loaded into an on-chip buffer, then the
  output streams out at one beat of ``lanes`` elements per cycle for every stride pattern (an
  innermost broadcast, kept runs shorter than ``lanes``, a broadcast row): each lane reads its
  own copy of the buffer. The input must fit ``max_input`` (lanes copies of it on chip).
- ``external``: the input stays in a memory behind a read port (``read_request`` /
  ``read_response``, the row reader's port: a request's ``addr`` is the element address of
  lane 0 and lane l of the response holds element ``addr + l``), for an input that does not
  fit on chip; ``max_input`` only sizes the addresses. Nothing is loaded. Each output beat's
  lanes are cut into groups: a lane starts a group unless its address is the one of the lane
  before it or that plus one (so a group's addresses span fewer than ``lanes`` elements), and
  each group is one read at its first lane's address, its lane enables the group's extent
  (never a lane at or past ``input_elements``). A broadcast of the innermost dim (every lane
  one address), a row or a kept run of at least ``lanes`` elements is one read per beat (two
  where a run ends inside the beat); kept runs shorter than ``lanes`` (a beat gathers several
  of them) are a read per run. The responses, in order, are put back together into the output
  beat (the lanes each serves, at their columns in it), which leaves when its last read is in.
  At most ``max_outstanding`` reads are in flight.

Streams and ports (payload fields are listed least significant first):

``input_data`` (in; on-chip path)
    The input, flat in C order, ``ceil(input_elements / lanes)`` beats: ``data`` (``lanes``
    elements, lane 0 first; the lanes past the end of the last beat are ignored).
``read_request`` (out), ``read_response`` (in; external path)
    The memory read port: a request's ``addr`` (element address of lane 0) and ``enable``
    (the lanes wanted); a response's ``data`` (``lanes`` elements), one per request, in request
    order, any latency, any pauses. The input is flat in C order from element address 0.
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
    The address generator's run-time plan, ``max_rank + 2 * lanes`` beats taken first in a
    run (:meth:`ExpandParams.plan_layout`: ``digit`` and ``addr``, arrays of
    ``max(max_rank, 4)``, and ``carry``, ``max_rank`` bits): beat d < ``max_rank`` holds dim
    d's four steps of y_d and of a_d (below), beat ``max_rank`` lane 0's odometer start (the
    start values of every dim and the carries of its first step), beats ``max_rank + l``
    (1 <= l < lanes) lane l's even constants and beats ``max_rank + lanes + l`` (0 <= l <
    lanes) its odd constants (u_d in ``digit``, A_e in ``addr`` entry 0). The host planner
    (:func:`moe_hw.host.expand.plan`) computes it from the input shape and the expand sizes.
    (A stream rather than a port sampled with ``start``: the plan of 16 lanes by 6 dims is
    thousands of bits.)
``busy``, ``done``, ``error`` (out)
    ``done`` rises when the last beat has left and stays high until the next start.

The address generator. The host planner drops the size-1 output dims, merges neighbouring
dims that are one run of addresses (a kept dim over a contiguous kept dim; two broadcast
dims), and pads the result in front with size-1 dims to ``max_rank`` dims of sizes s_d and
strides t_d. Lane l reads output elements l, l + lanes, l + 2*lanes, ... . One odometer,
lane 0's, steps through the pairs of beats: it adds 2K = 2 * ``lanes`` per step in the mixed
radix of the output shape, whose digits k_d the planner computes. Dim d holds ``y_d = x_d +
k_d - s_d`` and ``q_d = y_d + 1`` (two's complement: their sign bits are the wrap flags, no
compare) and its share of the address ``a_d = x_d * t_d``. With ``c_R = 0``, the carry out
of dim d is ``c_d = (y_d >= 0) | ((q_d >= 0) & c_{d+1})`` (a lookahead over R flag pairs),
and each register adds one of four planned constants chosen by ``(c_{d+1}, c_d)``: ``k_d +
c_{d+1} - c_d*s_d`` to y_d and q_d, that times t_d to a_d. Counters and adders only, no
run-time multiplier. The address ``sum_d a_d`` is formed by a registered adder tree outside
the loop.

The odometer holds the carries of the coming step and, per dim, the candidates of the next
y_d and q_d, y_d plus each step (registers; its start carries come with its plan beat). A
step has two cycles, as it serves two beats (:func:`pair_odometer`): at an even beat's take
it chooses the next y_d among the candidates by the carries (registers choosing registers)
and adds the shares' steps; in the next cycle it forms the following carries (the lookahead
over the chosen digits' sign bits) and candidates (the adders). No cycle holds a choice and
the lookahead, or the lookahead and an adder.

The lanes have no loop (:func:`lane_addresses`): lane l of beat 2j + h (h = 0 even, 1 odd)
reads the pair's element plus e = hK + l, so its digits are the pair's plus the digits k^e
of e, and its address is the pair's plus ``A_e = sum_d k^e_d t_d`` plus ``w_d = t_{d-1} -
s_d t_d`` for every dim d that carries; the carries ``c_d = (y_d >= u_d) | ((y_d >= u_d -
1) & c_{d+1})`` compare the pair's digits with the lane's constants ``u_d = k_d - k^e_d``
(its even and odd plan beats hold u_d and A_e; the digits of numbers below 2K, so |u_d| <=
2K, and the pair's digits are compared saturated to a few bits,
:attr:`StrideAddressParams.lane_digit_width`). A feed-forward pipeline per lane: the
compares, the carries, the offset's adder tree, the add of the pair's address
(:attr:`StrideAddressParams.address_latency` cycles from the take in all).

The buffer: ``lanes`` copies, one per output lane, each ``ceil(max_input / lanes)`` rows of
``lanes`` elements in LUT RAM (two memories of half a row). A load beat writes one row of
every copy (so the load takes one cycle per input beat; the write's row and enable reach the
copies through a tree of register copies, one per lane at its end); lane l reads the row of
its address from its own copy into registers and keeps the element at the address's low bits,
in two registered steps (the element of each group of four, then the group's). Memory:
``lanes * ceil(max_input / lanes) * lanes`` elements, that is ``lanes`` times the input (lanes
16, fp32, max_input 256: 128 Kbit of LUT RAM). (Past 16 rows, a LUT RAM cell's depth, the
row's read is also Yosys's multiplexer of the cells' outputs.)

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
:meth:`ExpandParams.cycles` = ``max_rank + 2*lanes + max(1, ceil(n_in / lanes)) + ceil(n_out
/ lanes) +`` :attr:`ExpandParams.overhead`, the plan beats, the load beats (a cycle with no
input: the last lane loads its plan beat), the output beats, and a
fixed overhead (run control, the lane addresses, the buffer's read and the lane's choice of
its element, the output queue, done);
an empty run takes :data:`~moe_hw.blocks.run_control.EMPTY_CYCLES`. Any pause costs only the
cycles it lasts.

External path, with a memory of latency L (a response L cycles after its request is taken)
and R reads (the groups of every output beat, the lanes past the end of the last beat
included: they wrap to the first elements): ``max_rank + 2*lanes + 1 + R + L + W +``
:meth:`ExpandParams.external_overhead`, where ``W = floor((R - 1) / max_outstanding) *
max(0, L + 1 - max_outstanding)`` (a read holds its tag for L + 1 cycles: with more latency
than tags, every ``max_outstanding`` reads wait for the ones before them). The efficiency
against one beat per cycle is about ``ceil(n_out / lanes) / R``: 1 for a broadcast row, an
innermost broadcast and a replication of whole rows of a multiple of ``lanes`` elements.
:func:`moe_hw.host.expand.external_reads` gives R and every read.

With ``parts`` = P > 1 the parts run at once, each on its own streams:
:meth:`ExpandParams.split_cycles` = ``max_p cycles(n_in_p, n_out_p) + 1``, the slowest part
(an empty part counting ``EMPTY_CYCLES``) and the registered ``done``.
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..blocks.row_reader import last_enable_of, request_layout, response_layout
from ..blocks.run_control import EMPTY_CYCLES, START_LATENCY, RunControl, run_ports
from ..params import LANES, ParameterError, UnitParams, param, resolve_params
from ..stream import CreditPipeline, RegisteredFIFO, RegisterCopies, replicated
from ..stream.pipeline import delay

__all__ = ["ExpandParams", "ExpandUnit", "ELEMENT_FORMATS", "MEMORIES", "PARTS", "SPLIT_LATENCY",
           "StrideAddressParams", "dim_steps", "pair_odometer", "registered_plan", "sum_level",
           "sum_tree"]

#: Element formats and their widths (the unit moves bits; nothing else differs).
ELEMENT_FORMATS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8}

#: The ``parts`` a unit may have (parallel expand cores, SBP split).
PARTS = (1, 2, 4, 8)

#: Where the input is read from (:attr:`ExpandParams.memory`).
MEMORIES = ("onchip", "external")

#: On-chip path: the memories of a lane's copy of the buffer, each half of a row (a copy of
#: the lane's read address per memory, so that no address flop reaches a whole row's cells).
ONCHIP_HALVES = 2
#: On-chip path: cycles from a lane's address to its element (:meth:`ExpandUnit.read_copies`):
#: the address copies, the row's register, the group's element, the lane's element.
ONCHIP_READ_LATENCY = 4

#: External path: registered levels after the address tree that find a beat's groups (the
#: lanes' address differences, then the group-start flags).
EXTERNAL_BREAK_LATENCY = 2
#: External path: cycles from a group's issue to its read request in the request queue (the
#: base and last lane, the extent and columns, the lane enables).
EXTERNAL_ISSUE_LATENCY = 3
#: External path: cycles from a response taken to its output beat in the output queue (the
#: lanes' picks, the merge).
EXTERNAL_MERGE_LATENCY = 2

#: Cycles a split unit (``parts`` > 1) adds to its slowest part: the registered ``done``.
SPLIT_LATENCY = 1


class StrideAddressParams:
    """What the expand units' parameter classes share: the address generator's sizes and
    its plan layout (fields ``lanes``, ``max_rank``, ``max_input``, ``max_output``)."""

    #: The input is held on chip (rows of ``lanes`` elements, at most 2**16 of them).
    on_chip = True

    def check(self):
        if self.on_chip and -(-self.max_input // self.lanes) > 1 << 16:
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

    @property
    def offset_tree_latency(self):
        """Registered levels of a lane's offset sum (its ``max_rank`` carry terms and its
        start offset; at least one)."""
        return max(1, ceil_log2(self.max_rank + 1))

    @property
    def address_latency(self):
        """Cycles from a beat's take to its lanes' addresses (:func:`lane_addresses`): the
        pair's saturated digits, the lanes' digit compares, their carries, their offset sums
        and the add of the pair's address."""
        return 3 + self.offset_tree_latency + 1

    @property
    def lane_digit_width(self):
        """Bits of a lane's digit constants (u_d = k_d - k^e_d and u_d - 1, digits of
        numbers below 2 * lanes: within -2 * lanes .. 2 * lanes) and of the pair's digits
        saturated for the compare with them."""
        return bits_for(2 * self.lanes) + 2

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
    memory: str = param("onchip", choices=MEMORIES,
                        doc="where the input is read: an on-chip buffer loaded from input_data, "
                            "or an external memory read port")
    max_outstanding: int = param(32, minimum=2, maximum=1024,
                             doc="external memory: reads in flight at once")

    @property
    def element_width(self):
        return ELEMENT_FORMATS[self.format]

    @property
    def on_chip(self):
        return self.memory == "onchip"

    @property
    def read_latency(self):
        """Cycles from a beat's take to its elements at the queue: the lane addresses, the
        buffer's read and the lane's choice of its element (:data:`ONCHIP_READ_LATENCY`)."""
        return self.address_latency + ONCHIP_READ_LATENCY

    @property
    def overhead(self):
        """Stall-free cycles beyond one per load beat and one per output beat: run control
        (start, decide), the read pipeline (:attr:`read_latency`), the output queue
        (:attr:`CreditPipeline.QUEUE_LATENCY`), the queue's busy flag and done."""
        return (START_LATENCY + self.read_latency + CreditPipeline.QUEUE_LATENCY
                + CreditPipeline.IDLE_LATENCY + 1)

    @property
    def plan_beats(self):
        """Beats of the plan stream: one per dim, lane 0's odometer start, the even
        constants of lanes 1 .. lanes-1 and the odd constants of every lane."""
        return self.max_rank + 2 * self.lanes

    def cycles(self, input_elements, output_elements, reads=None, memory_latency=None):
        """Exact stall-free cycles of a run (start cycle to the first cycle ``done`` is
        high). On the external path, ``reads`` is the run's read count (one per group of
        lanes, see the module docstring) and ``memory_latency`` the memory's (cycles from a
        request taken to its response)."""
        if output_elements == 0:
            return EMPTY_CYCLES
        if self.memory == "external":
            if reads is None or memory_latency is None:
                raise ValueError("the external path's cycles need reads and memory_latency")
            # Every read holds a tag from its request to its response, L + 1 cycles at full
            # rate: with L + 1 above max_outstanding, each max_outstanding reads wait for the
            # tags of the ones before them.
            waits = (reads - 1) // self.max_outstanding * max(0, memory_latency + 1
                                                          - self.max_outstanding)
            return (self.plan_beats + 1 + reads + memory_latency + waits
                    + self.external_overhead())
        return (self.plan_beats + self.load_cycles(input_elements)
                + -(-output_elements // self.lanes) + self.overhead)

    def external_overhead(self):
        """Stall-free cycles of the external path beyond the plan beats, the plan's last
        load, one per read and the memory's latency: run control, the address tree and the
        group flags, the issue stages and the request queue, the merge and the output
        queue, done."""
        return (START_LATENCY + self.address_latency + EXTERNAL_BREAK_LATENCY
                + CreditPipeline.RING_LATENCY + 1 + EXTERNAL_ISSUE_LATENCY
                + CreditPipeline.QUEUE_LATENCY + EXTERNAL_MERGE_LATENCY
                + CreditPipeline.QUEUE_LATENCY + CreditPipeline.IDLE_LATENCY + 1)

    def load_cycles(self, input_elements):
        """Cycles of the load: one per input beat, at least one (the last lane loads its
        plan beat in the cycle after the take; a hostile run with no input but
        some output waits for it)."""
        return max(1, -(-input_elements // self.lanes))

    def split_cycles(self, part_sizes):
        """Exact stall-free cycles of a run split over the parts, ``part_sizes`` a list of
        ``(input_elements, output_elements)`` (on the external path ``(input_elements,
        output_elements, reads, memory_latency)``), one per part: :meth:`cycles` of the slowest
        part and, with ``parts`` > 1, the registered ``done`` (:data:`SPLIT_LATENCY`)."""
        if len(part_sizes) != self.parts:
            raise ValueError(f"part_sizes must have {self.parts} entries (parts), not "
                             f"{len(part_sizes)}")
        slowest = max(self.cycles(*sizes) for sizes in part_sizes)
        return slowest + (SPLIT_LATENCY if self.parts > 1 else 0)

    def prefix(self, part):
        """The port-name prefix of part ``part``: none with one part, ``part<p>_``
        otherwise."""
        return "" if self.parts == 1 else f"part{part}_"

    def input_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.element_width, self.lanes)})

    def address_beat_layout(self):
        """External path: an address beat, every lane's address, the lanes that start a
        group, and the output beat's lane enables and last flag."""
        return data.StructLayout({"addr": data.ArrayLayout(self.addr_width, self.lanes),
                                  "starts": self.lanes, "enable": self.lanes, "last": 1})

    def tag_layout(self):
        """External path: what a read's response needs: the lanes it serves, every lane's
        column in it, the output beat's enables and last flag, and whether it is the beat's
        last read."""
        return data.StructLayout({
            "served": self.lanes,
            "col": data.ArrayLayout(max(1, ceil_log2(self.lanes)), self.lanes),
            "out_enable": self.lanes, "out_last": 1, "read_last": 1})

    def read_layout(self):
        """External path: a read request (``addr``, ``enable``) and its tag."""
        return data.StructLayout({"addr": self.addr_width, "enable": self.lanes,
                                  **self.tag_layout().members})

    def output_layout(self):
        return data.StructLayout({"data": data.ArrayLayout(self.element_width, self.lanes),
                                  "enable": self.lanes, "last": 1})


def registered_plan(m, p, plan, ctl):
    """Takes the ``plan`` stream's :attr:`~StrideAddressParams.plan_beats` beats from the run's
    begin (``ctl``, the unit's :class:`~moe_hw.blocks.run_control.RunControl`). A plan beat
    is registered, with a load flag per beat (registers), and loaded a cycle after its take.
    Returns ``(plan_open, beat, beat_loads)``: a beat is still to come; the beat register;
    the flags, ``beat_loads[i]`` high in the cycle after beat i's take (the last one's is the
    plan's close: ``plan_open`` has fallen)."""
    plan_next = Signal(p.plan_beats, init=1)     # the beat expected next, one-hot
    plan_open = Signal()
    # ``plan_open`` opens as the run begins (``begin``: ``running`` rises in the next cycle)
    # and closes with the last beat's take, or when the run is not running (the run
    # control's ``stopped``: a run that begins takes its whole plan, but a formal check's
    # induction starts from any state), so the take is one gate of the plan's valid and that
    # register: the run flag's net into the take, from the run control across the unit, was
    # expand_backward's path at 4 lanes (``running``, 204.9 MHz; ``stopped``, the run
    # control's own inverted copy of it, 189.5 MHz).
    with m.If(ctl.accept):
        m.d.sync += plan_next.eq(1)
    closing = Signal()
    m.d.sync += plan_open.eq(ctl.begin | (plan_open & ~closing & ~ctl.stopped))
    plan_take = plan.valid & plan_open
    m.d.comb += plan.ready.eq(plan_open)
    beat = Signal.like(plan.payload, name="plan_beat", reset_less=True)
    beat_loads = Signal(p.plan_beats, name="plan_loads")
    m.d.sync += beat_loads.eq(Mux(plan_take, plan_next, 0))
    # The beat register loads every cycle (no clock enable: the take reached the enables
    # of its ~400 bits across the chip); only a cycle with a load flag reads it.
    m.d.sync += beat.eq(plan.payload)
    m.d.comb += closing.eq(plan_take & plan_next[-1])
    with m.If(plan_take):
        m.d.sync += plan_next.eq(Cat(Const(0), plan_next[:-1]))
    return plan_open, beat, beat_loads


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


def _select(onehot, values):
    """The entry of ``values`` (an array view) that the one-hot ``onehot`` picks (zero when
    it is zero): an AND-OR, no decoder."""
    width = len(values[0])
    terms = [Mux(onehot[i], values[i], Const(0, width)) for i in range(len(onehot))]
    while len(terms) > 1:          # a balanced OR tree
        terms = [terms[i] | terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def sum_level(m, values, *, name):
    """One registered level of a pairwise sum: ``values[2i] + values[2i + 1]`` (modulo their
    width) into register ``i``, a lone last value registered as it is. Returns the
    registers, named ``{name}_{i}``."""
    regs = []
    for index in range(0, len(values), 2):
        pair = values[index:index + 2]
        reg = Signal(len(values[0]), name=f"{name}_{index // 2}", reset_less=True)
        m.d.sync += reg.eq(pair[0] + pair[1] if len(pair) == 2 else pair[0])
        regs.append(reg)
    return regs


def sum_tree(m, values, *, name):
    """The registered pairwise sum of ``values`` (modulo their width): one register level per
    halving (:func:`sum_level`), at least one."""
    level = 0
    while True:
        values, level = sum_level(m, values, name=f"{name}_l{level}"), level + 1
        if len(values) == 1:
            return values[0]


def saturate(value, width):
    """``value`` (signed) saturated to a signed ``width``-bit value."""
    low, high = -(1 << (width - 1)), (1 << (width - 1)) - 1
    above = value[width - 1:]
    return Mux(~value[-1] & above.any(), high,
               Mux(value[-1] & ~above.all(), low, value[:width]))[:width].as_signed()


def pair_odometer(m, p, dy, da, *, load, start, odd_take, name, copies, even_take=None,
                  choose_always=False):
    """Lane 0's odometer for :func:`lane_addresses`: it steps by 2K = 2 * ``lanes`` once per
    pair of beats (its dims' steps are those of 2K), so a step has two cycles: at an even
    beat's take it chooses the next pair's digits and shares (a register choice, by the
    registered carries, and the shares' add); in the cycle after it forms the following
    carries (the lookahead over the chosen digits' sign bits) and candidates (the adders).
    No cycle holds a choice and the lookahead, or the lookahead and an adder. The pair's
    state, which every lane reads, moves to the next pair at the odd beat's take (at least a
    cycle after the even one's).

    Returns the pair's address shares ``[a_0, .., a_{R-1}]`` (registers) and ``copies``
    copies (:func:`~moe_hw.stream.replicated`) of its digits ``y_d``. The start's copies
    load a cycle after ``load`` (from a register of their own, so that the load flag reaches
    them through one mux), and so do the start's candidates (from the same registers, by
    copies of ``load`` of their own, one per group of dims: the plan's load flag over a long
    net into every candidate adder's operand was a path of both units, expand at 159.6 MHz
    and expand_backward at 196). So the first take must come two cycles after ``load`` at the
    earliest, as it does in both: expand's plan has at least one lane beat after the
    odometer's and its output starts a cycle after the last beat's load flag, and
    expand_backward's items open at its last plan beat's load flag. expand_backward runs two
    of these, one per parity of its items, each with ``even_take`` its items' takes and
    ``odd_take`` the cycle after each.

    ``choose_always``: the choice registers load in every cycle, not only at the even take
    (the take then reaches a few flags, not the choice's clock enables). Only for a caller
    whose odd take is always the cycle after the even one and whose next even take is two
    cycles after that at the earliest: the state a choice reads (the digits, carries and
    shares) then changes only at the end of the odd take's cycle, so the choice loaded in the
    odd take's cycle is the even take's again, and the one loaded at the next even take is
    from the new state. The odometer then needs no ``even_take`` (leave it None): the cycle
    after an even take is the odd take's, so ``odd_take`` (which may come from registers
    near the odometer) marks it."""
    if (even_take is None) != choose_always:
        raise ValueError("pair_odometer: even_take is needed without choose_always, and unused "
                         "with it")
    rank = p.max_rank
    carry = Signal(rank, name=f"{name}_carry")      # c_d of the coming step
    a = [Signal(p.addr_width, name=f"{name}_a{d}") for d in range(rank)]
    chosen_y = [Signal(signed(p.digit_width), name=f"{name}_next_y{d}", reset_less=True)
                for d in range(rank)]
    start_y = [Signal(signed(p.digit_width), name=f"{name}_start_y{d}", reset_less=True)
               for d in range(rank)]
    chosen_q = Signal(rank, name=f"{name}_next_q_sign", reset_less=True)
    chosen_a = [Signal(p.addr_width, name=f"{name}_next_a{d}", reset_less=True)
                for d in range(rank)]
    loaded = Signal(name=f"{name}_loaded")          # the cycle after load
    m.d.sync += loaded.eq(load)
    following = Signal(name=f"{name}_following")    # the cycle after an even take
    if choose_always:
        m.d.comb += following.eq(odd_take & ~loaded)
    else:
        m.d.sync += following.eq(even_take & ~load)
    next_carry = [Const(0)] * (rank + 1)
    v_loads = replicated(m, load, name=f"{name}_load_copy", copies=min(rank, 3), apart=True)
    for d in reversed(range(rank)):
        v_load = v_loads[d * len(v_loads) // rank]
        innermost = d == rank - 1
        count = 2 if innermost else 6
        v = Signal(data.ArrayLayout(signed(p.digit_width), count), name=f"{name}_v{d}")
        choice = carry[d] if innermost else Cat(carry[d], carry[d + 1])
        # At the even take: choose.
        with m.If(1 if choose_always else even_take):
            m.d.sync += [chosen_y[d].eq(v[choice]), chosen_a[d].eq(a[d] + da[d][choice])]
            if not innermost:
                q = v[Cat(carry[d], carry[d + 1], Const(0, 1)) + 2]
                m.d.sync += chosen_q[d].eq(q.as_signed()[-1])
        # The cycle after: the next carries and candidates from the chosen digits.
        next_carry[d] = ~chosen_y[d][-1]
        if not innermost:
            next_carry[d] |= ~chosen_q[d] & next_carry[d + 1]
        base = Mux(v_load, start_y[d], chosen_y[d])
        with m.If(v_load | following):
            m.d.sync += [v[i].eq(base + dy[d][i]) for i in range(count)]
        m.d.sync += start_y[d].eq(start.digit[d])
    with m.If(load):
        m.d.sync += carry.eq(start.carry)
    with m.Elif(following):
        m.d.sync += carry.eq(Cat(*next_carry[:rank]))
    # The pair's state: the start, then each next pair's at the odd take.
    with m.If(load):
        m.d.sync += [a[d].eq(start.addr[d]) for d in range(rank)]
    with m.Elif(odd_take):
        m.d.sync += [a[d].eq(chosen_a[d]) for d in range(rank)]
    digits = Cat(*(Mux(loaded, start_y[d], chosen_y[d]) for d in range(rank)))
    width = p.digit_width
    held = replicated(m, digits, name=f"{name}_y", copies=copies, en=loaded | odd_take)
    return a, [[copy[d * width:(d + 1) * width].as_signed() for d in range(rank)]
               for copy in held]


def lane_addresses(m, p, dy, da, beat, beat_loads, take):
    """Every lane's read address, :attr:`StrideAddressParams.address_latency` cycles after
    a beat's take (registers): lane 0's odometer by pairs of beats (:func:`pair_odometer`)
    and, per lane, its offset from it as a feed-forward pipeline (see the module
    docstring).

    Lane l of beat 2j + h (h = 0, 1) reads element 2jK + hK + l, the pair's element plus
    e = hK + l: its digits are the pair's plus the digits k^e of e, with carries ``c_d =
    (x_d + k^e_d + c_{d+1} >= s_d)``. In the pair's ``y_d = x_d + k_d - s_d`` (k the digits
    of the step 2K) that is ``c_d = (y_d >= u_d) | ((y_d >= u_d - 1) & c_{d+1})`` with ``u_d
    = k_d - k^e_d``, and the address is the pair's plus ``A_e = sum_d k^e_d t_d`` plus
    ``sum_d c_d * w_d``, ``w_d = t_{d-1} - s_d t_d`` (a carry into dim d - 1 less the wrap of
    dim d; ``t_{-1} = 0``), each ``w_d`` formed from the dims' step registers. Each lane has
    an even and an odd set of constants (u_d and A_e, from its plan beats; lane 0's even
    set is ``u_d = k_d``, ``A_0 = 0``), chosen by the beat's parity."""
    lanes, rank = p.lanes, p.max_rank
    width = p.lane_digit_width
    groups = min(lanes, 4)
    # The beat's parity: odd is high while the beat to be taken next is odd.
    odd = Signal(name="odd_beat")
    odd_next = Mux(beat_loads[rank], 0, Mux(take, ~odd, odd))
    m.d.sync += odd.eq(odd_next)
    # Copies of odd itself, one per group of lanes: each lane's constants for the next
    # compare are chosen by them into registers (the lanes compare a cycle after the take,
    # on the pair's saturated digits, with the constants of the parity the beat had), so
    # that the parity reaches a choice into a register, not the compare's carry chain.
    parities = RegisterCopies(1, name="odd_beat_copy", copies=groups, apart=False)
    m.d.sync += parities.eq(odd_next)
    shares, digit_copies = pair_odometer(m, p, dy, da, load=beat_loads[rank], start=beat,
                                         even_take=take & ~odd, odd_take=take & odd,
                                         name="lane0", copies=groups)
    base = sum_tree(m, shares, name="lane0_addr")    # tree_latency after the take
    # The pair's address, delayed to meet the lanes' offsets, a copy per group of lanes.
    base = delay(m, base, p.address_latency - 2 - p.tree_latency, 1, name="lane0_base",
                 reset_less=True)
    bases = replicated(m, base, name="lane0_base_copy", copies=groups)
    # The pair's digits saturated to lane_digit_width bits, a register per copy: a compare
    # with a lane's constants (far inside that range) gives the same answer on narrow
    # operands.
    saturated = []
    for group, digits in enumerate(digit_copies):
        regs = [Signal(signed(width), name=f"lane0_y{d}_sat{group}", reset_less=True)
                for d in range(rank)]
        m.d.sync += [reg.eq(saturate(y, width)) for reg, y in zip(regs, digits)]
        saturated.append(regs)
    # w_d from the step registers: t_d = da[d][2] - da[d][0], -s_d t_d = da[d][1] - da[d][0].
    w = []
    for d in range(rank):
        reg = Signal(p.addr_width, name=f"dim{d}_w", reset_less=True)
        value = da[d][1] - da[d][0]
        if d:
            value = value + (da[d - 1][2] - da[d - 1][0])
        m.d.sync += reg.eq(value)
        w.append(reg)
    k, k_minus_1 = [], []
    for d in range(rank):
        reg = Signal(signed(width), name=f"dim{d}_k", reset_less=True)
        m.d.sync += reg.eq(dy[d][0])
        k.append(reg)
        reg = Signal(signed(width), name=f"dim{d}_k_minus_1", reset_less=True)
        m.d.sync += reg.eq(dy[d][0] - 1)
        k_minus_1.append(reg)

    def constants(lane, load, name):
        """A lane's u_d, u_d - 1 and A_e, loaded from its plan beat."""
        u = [Signal(signed(width), name=f"{name}_u{d}", reset_less=True) for d in range(rank)]
        u_minus_1 = [Signal(signed(width), name=f"{name}_u{d}_minus_1", reset_less=True)
                     for d in range(rank)]
        offset = Signal(p.addr_width, name=f"{name}_start", reset_less=True)
        with m.If(load):
            m.d.sync += [u[d].eq(beat.digit[d]) for d in range(rank)]
            m.d.sync += [u_minus_1[d].eq(beat.digit[d] - 1) for d in range(rank)]
            m.d.sync += offset.eq(beat.addr[0])
        return u, u_minus_1, offset

    addrs = []
    for lane in range(lanes):
        group = lane * groups // lanes
        y, odd_beat = saturated[group], parities.values[group]
        if lane == 0:
            even = (k, k_minus_1, Const(0, p.addr_width))
        else:
            even = constants(lane, beat_loads[rank + lane], f"lane{lane}_even")
        odd_set = constants(lane, beat_loads[rank + lanes + lane], f"lane{lane}_odd")
        # Stage 0 (the take's cycle): the constants of the beat's parity, into registers.
        # (The plan's constants are loaded before the first take.)
        chosen = [[Signal(signed(width), name=f"lane{lane}_u{d}{kind}_chosen", reset_less=True)
                   for d in range(rank)] for kind in ("", "_minus_1")]
        chosen_start = Signal(p.addr_width, name=f"lane{lane}_start", reset_less=True)
        m.d.sync += [reg.eq(Mux(odd_beat, odd_set[i][d], even[i][d]))
                     for i, regs in enumerate(chosen) for d, reg in enumerate(regs)]
        m.d.sync += chosen_start.eq(Mux(odd_beat, odd_set[2], even[2]))
        # Stage 1: the digits against the beat's constants; the beat's start offset.
        generate = Signal(rank, name=f"lane{lane}_generate", reset_less=True)
        propagate = Signal(rank, name=f"lane{lane}_propagate", reset_less=True)
        start = Signal(p.addr_width, name=f"lane{lane}_offset0", reset_less=True)
        m.d.sync += [
            generate.eq(Cat(*(y[d] >= chosen[0][d] for d in range(rank)))),
            propagate.eq(Cat(*(y[d] >= chosen[1][d] for d in range(rank)))),
            start.eq(chosen_start),
        ]
        # Stage 2: the carries.
        carry = Signal(rank, name=f"lane{lane}_carry", reset_less=True)
        c = Const(0)
        carries = [None] * rank
        for d in reversed(range(rank)):
            c = generate[d] | (propagate[d] & c)
            carries[d] = c
        m.d.sync += carry.eq(Cat(*carries))
        start = delay(m, start, 1, 1, name=f"lane{lane}_offset1", reset_less=True)
        # Stages 3..: the offset, then the pair's address added.
        terms = [Mux(carry[d], w[d], 0) for d in range(rank)] + [start]
        offset = sum_tree(m, terms, name=f"lane{lane}_offset")
        addr = Signal(p.addr_width, name=f"lane{lane}_addr", reset_less=True)
        m.d.sync += addr.eq(offset + bases[group])
        addrs.append(addr)
    return addrs


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
            if p.memory == "external":
                streams.update({
                    f"{prefix}read_request": Out(stream.Signature(
                        request_layout(p.lanes, p.addr_width))),
                    f"{prefix}read_response": In(stream.Signature(
                        response_layout(p.lanes, p.element_width))),
                })
            else:
                streams[f"{prefix}input_data"] = In(stream.Signature(p.input_layout()))
            streams.update({
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
        max_out_beats = -(-p.max_output // lanes)
        out_left = Signal(range(max_out_beats + 1))
        out_last = Signal()                  # the beat in hand is the last (a register)
        last_en = Signal(lanes)
        with m.If(ctl.accept):
            m.d.sync += [
                out_left.eq((self.output_elements + (lanes - 1)) >> lanes_log2),
                out_last.eq(self.output_elements <= lanes),
                last_en.eq(last_enable_of(self.output_elements, lanes)),
            ]

        # ---- the plan: the dims' steps, lane 0's odometer start, the lanes' constants -------
        # (each lane loads on a flag of its own)
        plan_open, beat, beat_loads = registered_plan(m, p, self.plan, ctl)
        dy, da = dim_steps(m, p, beat, [beat_loads[d] for d in range(rank)])

        if p.memory == "external":
            # The memory's size, held for the run: no lane past it is ever read.
            self.n_in = Signal(range(p.max_input + 1), name="n_in")
            with m.If(ctl.accept):
                m.d.sync += self.n_in.eq(self.input_elements)
            # No load: the output starts a cycle after the last plan beat (the last lane's
            # odometer loads then).
            ready_to_generate = beat_loads[-1]
            load_open = Const(0)
            pipe_latency = p.address_latency + EXTERNAL_BREAK_LATENCY
            pipe = m.submodules.address_pipe = CreditPipeline(
                pipe_latency, p.address_beat_layout(), skid=False)
        else:
            ready_to_generate, load_open = self.load(m, ctl, running, plan_open, beat_loads)
            pipe = m.submodules.output_pipe = CreditPipeline(p.read_latency, p.output_layout())
            wiring.connect(m, pipe.o, wiring.flipped(self.output))
            pipe_latency = p.read_latency

        # ---- the address beats: free-running, behind a credit-counted queue ----------------
        # generating is set only while running (by the last input beat, or a cycle after the
        # last plan beat when there is no input: the last lane loads then) and
        # falls with the last output beat, so it is the pipeline's valid on its own.
        generating = Signal()                # an output beat is still to be issued
        m.d.comb += pipe.i_valid.eq(generating)
        take = pipe.take
        with m.If(take):
            m.d.sync += [out_left.eq(out_left - 1), out_last.eq(out_left == 2)]
        generating_next = Mux(ready_to_generate, 1, Mux(take & out_last, 0, generating))
        m.d.sync += generating.eq(generating_next)
        # The odometer's step: the take, formed per group of its dims from copies of its two
        # registers, so that no one net reaches every odometer register.
        # (Kept apart from generating and the pipeline's i_ready, which load the same values:
        # merged with them, the take reached the odometer from the pipeline's control across
        # the chip, 142.8 MHz at 16 lanes, 89 % routing.)
        generating_copy, = replicated(m, generating_next, name="generating_copy", copies=1,
                                      apart=True)
        ready_copy, = replicated(m, pipe.ready_next, name="ready_copy", copies=1, apart=True)
        addrs = lane_addresses(m, p, dy, da, beat, beat_loads, generating_copy & ready_copy)

        # The beat's lane enables and last flag travel beside it.
        flags = Signal(lanes + 1)
        m.d.comb += flags.eq(Cat(Mux(out_last, last_en, (1 << lanes) - 1), out_last))
        for stage in range(pipe_latency):
            reg = Signal(lanes + 1, name=f"flags{stage}", reset_less=True)
            m.d.sync += reg.eq(flags)
            flags = reg
        m.d.comb += [pipe.payload.enable.eq(flags[:lanes]), pipe.payload.last.eq(flags[lanes])]

        idle = ~plan_open & ~beat_loads[-1] & ~load_open & ~generating & ~pipe.busy
        if p.memory == "external":
            idle &= self.external_reads(m, pipe, addrs)
        else:
            self.read_copies(m, pipe, addrs)
        m.d.comb += ctl.finished.eq(running & idle)
        return m

    def load(self, m, ctl, running, plan_open, beat_loads):
        """The on-chip path's load: every input beat is one row of every lane's copy of the
        buffer (:meth:`buffer`). Returns ``(ready_to_generate, load_open)``: the flag that
        starts the output (the last input beat, or a cycle after the last plan beat when there
        is no input) and the register that is high while an input beat is still to come."""
        p = self.params
        lanes = p.lanes
        max_in_beats = p.rows
        load_row = Signal(range(max(2, max_in_beats)))
        load_left = Signal(range(max_in_beats + 1))
        load_open = Signal()                 # an input beat is still to come
        with m.If(ctl.accept):
            m.d.sync += [
                load_row.eq(0),
                load_left.eq((self.input_elements + (lanes - 1)) >> ceil_log2(lanes)),
                load_open.eq(self.input_elements != 0),
            ]
        loading = running & ~plan_open & load_open
        load_take = self.input_data.valid & loading
        m.d.comb += self.input_data.ready.eq(loading)
        self.buffer(m, load_row, load_take, self.input_data.payload.data)
        with m.If(load_take):
            m.d.sync += [load_row.eq(load_row + 1), load_left.eq(load_left - 1)]
            with m.If(load_left == 1):
                m.d.sync += load_open.eq(0)
        return (load_take & (load_left == 1)) | (beat_loads[-1] & ~load_open), load_open

    def buffer(self, m, row, write, row_data):
        """The on-chip buffer: per lane, :data:`ONCHIP_HALVES` LUT-RAM memories of ``rows``
        words, each word half a row. In a cycle ``write`` is high, ``row_data`` goes into row
        ``row`` of every lane's copy through two registers (the row and the enable a copy per
        group of up to four lanes, then one per lane, so that no flop reaches the cells of
        more than one lane; the data one register, then a copy per half of the lanes) and is
        written at the edge after them. Sets ``self.halves``, ``halves[lane]`` the lane's
        memories."""
        p = self.params
        lanes = p.lanes
        halves = min(lanes, ONCHIP_HALVES)
        # The write's row and enable: a copy per group of up to four lanes, then one per lane
        # (replicated: kept apart, where Yosys would merge copies loading the same value and
        # leave one flop driving the write port of every cell of every copy).
        groups = min(lanes, 4)
        group_writes = replicated(m, Cat(row, write), name="buffer_write_group", copies=groups)
        lane_writes = []
        for group, value in enumerate(group_writes):
            members = sum(1 for lane in range(lanes) if lane * groups // lanes == group)
            lane_writes += replicated(m, value, name=f"buffer_write{group}", copies=members)
        # The row's data: a register, then a copy per half of the lanes.
        held = Signal(len(Value.cast(row_data)), name="buffer_data", reset_less=True)
        m.d.sync += held.eq(row_data)
        data_copies = replicated(m, held, name="buffer_data_copy", copies=halves)
        half_width = p.element_width * (lanes // halves)
        self.halves = []
        for lane, value in enumerate(lane_writes):
            lane_data = data_copies[lane * halves // lanes]
            memories = []
            for half in range(halves):
                mem = memory.Memory(shape=data.ArrayLayout(p.element_width, lanes // halves),
                                    depth=p.rows, init=[], attrs={"ram_style": "distributed"})
                m.submodules[f"lane{lane}_buffer{half}"] = mem
                port = mem.write_port()
                m.d.comb += [port.addr.eq(value[:len(row)]), port.en.eq(value[len(row)]),
                             port.data.eq(lane_data[half * half_width:(half + 1) * half_width])]
                memories.append(mem)
            self.halves.append(memories)

    def read_copies(self, m, pipe, addrs):
        """The on-chip path's read (:data:`ONCHIP_READ_LATENCY` registered stages): lane l
        copies its address (a copy per half of its row), reads the row of it from its own
        copy of the buffer into registers, keeps the element at the address's low bits of
        each group of up to four (the column's low bits), then the group's (its high
        bits). Each stage is a LUT level or two: the row's register sits in the LUT RAM's
        slices, and the 16-to-1 choice of a 16-lane row is two registered 4-to-1 steps."""
        p = self.params
        lanes = p.lanes
        lanes_log2 = ceil_log2(lanes)
        low_bits = (lanes_log2 + 1) // 2         # the column bits of stage 3, the rest in 4
        group_size = 1 << low_bits
        for lane, (addr, memories) in enumerate(zip(addrs, self.halves)):
            # Stage 1: the address, a copy per half (each reaches half the row's cells).
            copies = replicated(m, addr, name=f"lane{lane}_addr_copy", copies=len(memories))
            # The group's place in the row, for stage 4.
            group_col = delay(m, addr[low_bits:lanes_log2], 3, 1, name=f"lane{lane}_group_col",
                              reset_less=True)
            # Stage 2: the row (the read ports' registers), and beside each half the column's
            # low bits (from the half's own address copy: each flop selects in half the row).
            row, low_cols = [], []
            for half, (copy, mem) in enumerate(zip(copies, memories)):
                port = mem.read_port(domain="sync")
                m.d.comb += port.addr.eq(copy >> lanes_log2)
                row += [port.data[i] for i in range(len(port.data))]
                low_cols.append(delay(m, copy[:low_bits], 1, 1, name=f"lane{lane}_col{half}",
                                      reset_less=True))
            # Stage 3: each group's element at the column's low bits.
            picks = []
            for first in range(0, lanes, group_size):
                pick = Signal(p.element_width, name=f"lane{lane}_pick{first // group_size}",
                              reset_less=True)
                group = Cat(*row[first:first + group_size])
                col = low_cols[first * len(memories) // lanes]
                m.d.sync += pick.eq(group.word_select(col, p.element_width))
                picks.append(pick)
            # Stage 4: the group's element.
            element = Signal(p.element_width, name=f"lane{lane}_element", reset_less=True)
            m.d.sync += element.eq(Cat(*picks).word_select(group_col, p.element_width))
            m.d.comb += pipe.payload.data[lane].eq(element)

    def external_reads(self, m, beats, addrs):
        """The external path: each address beat from ``beats`` (its addresses ``addrs``, a
        pipeline latency before the beat's payload) is cut into groups of neighbouring lanes,
        each group one read of the memory port; the responses are put back together into
        the output beats. Returns the flag that is high while nothing is inside."""
        p = self.params
        lanes = p.lanes
        lanes_log2 = ceil_log2(lanes)
        width = p.addr_width

        # ---- the breaks: lane l starts a group unless its address is the one before it or
        # that plus one (lane 0 always starts one). Two registered levels: the differences, then
        # the flags. (The address pipeline's latency holds both, EXTERNAL_BREAK_LATENCY.)
        diffs = []
        for lane in range(1, lanes):
            diff = Signal(signed(width + 1), name=f"lane{lane}_diff", reset_less=True)
            m.d.sync += diff.eq(addrs[lane] - addrs[lane - 1])
            diffs.append(diff)
        held = []
        for lane, addr in enumerate(addrs):
            reg = Signal(width, name=f"lane{lane}_addr_held", reset_less=True)
            m.d.sync += reg.eq(addr)
            reg2 = Signal(width, name=f"lane{lane}_addr_held2", reset_less=True)
            m.d.sync += reg2.eq(reg)
            held.append(reg2)
        starts = Signal(lanes, name="starts", reset_less=True)
        m.d.sync += starts.eq(Cat(Const(1, 1), *(diff[1:].any() for diff in diffs)))
        m.d.comb += [beats.payload.addr[lane].eq(held[lane]) for lane in range(lanes)]
        m.d.comb += beats.payload.starts.eq(starts)

        # ---- the issue: one group a cycle. first: the group's first lane (one-hot); rest: the
        # beat's later group starts; single: rest is empty (this group ends the beat).
        reads = m.submodules.read_pipe = CreditPipeline(EXTERNAL_ISSUE_LATENCY,
                                                        p.read_layout())
        have = Signal()
        beat = Signal(p.address_beat_layout(), name="issue_beat", reset_less=True)
        first = Signal(lanes, name="issue_first", reset_less=True)
        rest = Signal(lanes, name="issue_rest", reset_less=True)
        single = Signal(name="issue_single", reset_less=True)
        issue = have & reads.i_ready
        m.d.comb += reads.i_valid.eq(have)
        loads = beats.o.valid & (~have | (issue & single))
        m.d.comb += beats.o.ready.eq(~have | (issue & single))
        lowest = Signal(lanes)
        m.d.comb += lowest.eq(rest & -rest)
        with m.If(loads):
            incoming = beats.o.payload.starts
            m.d.sync += [beat.eq(beats.o.payload), first.eq(1),
                         rest.eq(incoming & ~1), single.eq(incoming[1:] == 0), have.eq(1)]
        with m.Elif(issue):
            m.d.sync += [first.eq(lowest), rest.eq(rest & ~lowest),
                         single.eq((rest & ~lowest) == 0)]
            with m.If(single):
                m.d.sync += have.eq(0)

        # Stage 1: the group's base address (the first lane's), its last lane (one-hot: the
        # lane before the next start, or the top lane), the lanes' low address bits.
        c1_base = Signal(width, name="c1_base", reset_less=True)
        c1_first = Signal(lanes, name="c1_first", reset_less=True)
        c1_end = Signal(lanes, name="c1_end", reset_less=True)
        c1_low = Signal(data.ArrayLayout(lanes_log2 or 1, lanes), name="c1_low",
                        reset_less=True)
        c1_flags = Signal(lanes + 2, name="c1_flags", reset_less=True)
        m.d.sync += [
            c1_base.eq(_select(first, beat.addr)),
            c1_first.eq(first),
            c1_end.eq(Mux(single, 1 << (lanes - 1), lowest >> 1)),
            c1_flags.eq(Cat(beat.enable, beat.last, single)),
        ]
        if lanes_log2:
            m.d.sync += [c1_low[lane].eq(beat.addr[lane][:lanes_log2])
                         for lane in range(lanes)]
        # Stage 2: the lanes served (first .. end), the group's extent (its last address
        # minus its first, below lanes: the addresses step by 0 or 1 from lane to lane) and
        # every lane's column in the response (its address minus the base, modulo lanes);
        # the room left in the memory from the base.
        c2_base = Signal(width, name="c2_base", reset_less=True)
        c2_served = Signal(lanes, name="c2_served", reset_less=True)
        c2_extent = Signal(lanes_log2 or 1, name="c2_extent", reset_less=True)
        c2_room = Signal(signed(width + 2), name="c2_room", reset_less=True)
        c2_flags = Signal(lanes + 2, name="c2_flags", reset_less=True)
        m.d.sync += [
            c2_base.eq(c1_base),
            c2_served.eq((c1_end << 1) - c1_first),
            c2_room.eq(self.n_in - c1_base),
            c2_flags.eq(c1_flags),
        ]
        if lanes_log2:
            m.d.sync += c2_extent.eq(_select(c1_end, c1_low) - c1_base[:lanes_log2])
            c2_col = Signal(data.ArrayLayout(lanes_log2, lanes), name="c2_col",
                            reset_less=True)
            m.d.sync += [c2_col[lane].eq(c1_low[lane] - c1_base[:lanes_log2])
                         for lane in range(lanes)]
            m.d.sync += reads.payload.col.eq(c2_col)
        else:
            m.d.sync += c2_extent.eq(0)
        # Stage 3: the request's lane enables: the group's extent, within the memory (a lane
        # past input_elements is never read, whatever the plan says).
        m.d.sync += [
            reads.payload.addr.eq(c2_base),
            reads.payload.enable.eq(Cat(*((lane <= c2_extent) & (c2_room > lane)
                                          for lane in range(lanes)))),
            reads.payload.served.eq(c2_served),
            reads.payload.out_enable.eq(c2_flags[:lanes]),
            reads.payload.out_last.eq(c2_flags[lanes]),
            reads.payload.read_last.eq(c2_flags[lanes + 1]),
        ]
        return ~have & ~reads.busy & self.responses(m, reads)

    def responses(self, m, reads):
        """The read requests out of ``reads`` (their tags into a FIFO of ``max_outstanding``
        entries, so that no more reads are ever unanswered), each response joined with its
        tag, its lanes' elements picked out and merged into the output beat, which leaves when
        its last read's response is in. Returns the flag that is high while nothing is
        inside."""
        p = self.params
        lanes = p.lanes
        tags = m.submodules.tags = RegisteredFIFO(p.tag_layout(), p.max_outstanding)
        o = reads.o
        m.d.comb += [
            self.read_request.valid.eq(o.valid & tags.w_rdy),
            self.read_request.payload.addr.eq(o.payload.addr),
            self.read_request.payload.enable.eq(o.payload.enable),
            o.ready.eq(self.read_request.ready & tags.w_rdy),
            tags.w_en.eq(o.valid & self.read_request.ready),
            tags.w_data.served.eq(o.payload.served),
            tags.w_data.col.eq(o.payload.col),
            tags.w_data.out_enable.eq(o.payload.out_enable),
            tags.w_data.out_last.eq(o.payload.out_last),
            tags.w_data.read_last.eq(o.payload.read_last),
        ]
        out = m.submodules.output_pipe = CreditPipeline(EXTERNAL_MERGE_LATENCY,
                                                        p.output_layout())
        wiring.connect(m, out.o, wiring.flipped(self.output))
        tag = tags.r_data
        room = ~tag.read_last | out.i_ready
        response_take = self.read_response.valid & tags.r_rdy & room
        m.d.comb += [
            self.read_response.ready.eq(tags.r_rdy & room),
            tags.r_en.eq(self.read_response.valid & room),
            out.i_valid.eq(self.read_response.valid & tags.r_rdy & tag.read_last),
        ]
        # Stage 1: every lane's element at its column (registers loaded every cycle), and the
        # lanes this response serves (none when nothing is taken).
        picked = Signal(data.ArrayLayout(p.element_width, lanes), name="picked",
                        reset_less=True)
        served = Signal(lanes, name="served")
        d1_flags = Signal(lanes + 1, name="d1_flags", reset_less=True)
        response = self.read_response.payload.data
        m.d.sync += [picked[lane].eq(response[tag.col[lane]] if lanes > 1 else response[0])
                     for lane in range(lanes)]
        m.d.sync += [served.eq(Mux(response_take, tag.served, 0)),
                     d1_flags.eq(Cat(tag.out_enable, tag.out_last))]
        # Stage 2: the beat so far, the served lanes replaced; the output beat a register.
        beat = Signal(data.ArrayLayout(p.element_width, lanes), name="merged_beat",
                      reset_less=True)
        merged = Signal(data.ArrayLayout(p.element_width, lanes), name="merged")
        m.d.comb += [merged[lane].eq(Mux(served[lane], picked[lane], beat[lane]))
                     for lane in range(lanes)]
        m.d.sync += beat.eq(merged)
        d2_flags = Signal(lanes + 1, name="d2_flags", reset_less=True)
        m.d.sync += d2_flags.eq(d1_flags)
        m.d.comb += [out.payload.data.eq(beat), out.payload.enable.eq(d2_flags[:lanes]),
                     out.payload.last.eq(d2_flags[lanes])]
        return ~tags.r_rdy & ~out.busy

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
            for name, member in core.signature.members.items():
                if not member.is_signature:
                    continue
                ours = wiring.flipped(getattr(self, f"{prefix}{name}"))
                if member.flow == wiring.In:
                    wiring.connect(m, ours, getattr(core, name))
                else:
                    wiring.connect(m, getattr(core, name), ours)
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
