"""The scan_layers unit: L structurally identical layers on ONE layer datapath (SPEC 1.7,
seed 003, the PyTorch/XLA ``scan_layers``).

Each layer is the elementwise affine ``h = relu?(a_l * h + b_l)`` over a token's H elements,
in ``format``. Bit-exact against ``golden.scan_layers(golden.affine_layer, ...)`` in every
format:

* fp32, fp16, bf16: the product rounded, then the sum rounded (the project's
  :class:`~moe_hw.arith.fmul.FloatMultiplierCore` and
  :class:`~moe_hw.arith.fadd.FloatAdderCore`, no FMA), then relu when ``relu`` is set: a
  negative result (and -0) becomes +0, a NaN stays a NaN (the adder's NaN is the canonical,
  positive quiet NaN, so the sign bit alone decides).
* int8 (two's complement): ``h = relu?(sat(a_l * h + b_l))``. The product is exact (16
  bits, a :func:`~moe_hw.arith.product.signed_product` on one 18x18 tile; -128 * -128 =
  16384), the sum is exact (17 bits), and ``sat`` clamps the sum once, at the end of the
  layer, to [-128, 127]; then relu gives 0 for a negative result. No rounding, no shift.
  ``mul_stages`` is at least 2 (the product's registers; more add registers after it),
  ``add_stages`` at least 2 (the exact sum registered, then the clamp and relu registered;
  more add registers after them): D = 4 by default.

The hardware is the seed's point: one :class:`AffineLayerStep` (``lanes`` multipliers and
adders), a carry store and a loop counter (the :class:`~moe_hw.blocks.scan.Scan` block), and
a parameter memory read at the loop count (the shared
:class:`~moe_hw.blocks.block_memory.BlockMemory`: a registered two-cycle read, DP16KD blocks
with their output registers on ECP5 with ``bram="ecp5"``; past :data:`TREE_BLOCKS` blocks
its addresses pass a tree of registers, each reaching at most :data:`PARAMETER_FANOUT`
blocks or registers, a cycle per level, and the read data a register after the blocks: at
the defaults 128 blocks, levels of 2 and 16 registers): ``max_layers`` rows of
``2**ceil(log2(ceil(max_hidden / lanes)))`` beats, a power of two, so that the address of
layer l's beat b is the two counters side by side (no adder before the memory's address
register; a ``max_hidden / lanes`` that is not a power of two leaves the rest of each row
unused). Only the parameter memory grows with ``max_layers``.

Loop order (layer-outer over a token-beat buffer): every beat of every token is a sequence
of the scan (carry: the beat's activations; x: its layer's parameters; length L). The scan
interleaves up to ``max_interleave`` consecutive beats (across tokens) and runs all L layers
on them, one beat per cycle, before it takes the next ones: the loop's latency
``D = 1 + mul_latency + add_latency`` (the scan's input register, then the layer datapath:
27 for the floats, 5 for int8 at the default depths) is hidden when ``max_interleave >= D +
1`` (the default).

Streams and ports (payload fields least significant first; lanes: lane 0 first):

``layer_params`` (in)
    L * ceil(H / lanes) beats, layer-major: ``scale`` then ``bias``, ``lanes`` elements each
    (a_l and b_l for elements ``lanes*b`` .. of layer l). Taken first, into the memory.
``input`` (in)
    S * ceil(H / lanes) beats, token-major: ``data`` (``lanes`` elements). Lanes past H on a
    token's last beat are carried along and come out as whatever the layers make of them.
``output`` (out)
    S * ceil(H / lanes) beats in the same order: ``data`` after the L layers.
``start``, ``tokens`` (S), ``hidden`` (H), ``layers`` (L), ``relu`` (in)
    Sampled when ``start`` is high while idle (:class:`~moe_hw.blocks.run_control.RunControl`).
``busy``, ``done``, ``error`` (out)
    ``error`` (and nothing done) when a size exceeds its maximum. S, H or L zero: an empty
    run, ``done`` after ``EMPTY_CYCLES``, nothing taken (the host rejects L = 0 as
    ``golden.stack_layer_params`` does).

Stall-free cycle count, start cycle to ``done``: :meth:`ScanLayersParams.cycles` =
``setup + 1 + L*B + LOAD_TO_SCAN + fetch_start + scan_cycles(S*B, L)`` with
B = ceil(H / lanes), ``setup = product_latency + 1`` (S*B and L*B on pipelined products),
LOAD_TO_SCAN = 1, ``fetch_start`` = FETCH_START (3) + the parameter memory's address tree's
levels and, with a tree, its read data's register (:attr:`ScanLayersParams.fetch_start`: none
up to 64 blocks, 3 up to 512), and
``scan_cycles(K, L) = START_LATENCY + GROUP_SETUP + sum over groups ((L-1) * max(n, D+1) + n) +
D + 5`` (D the loop latency above) (plus ``PENDING_LATENCY - span`` between two groups whose
first spans fewer than PENDING_LATENCY = 3 cycles), groups of ``n = min(max_interleave, beats
left)``. At full interleave that is ``L*B + S*B*L`` cycles plus a constant: one layer-beat per
cycle.
"""

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Cat, Module, Mux, Shape, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.fadd import FloatAdderCore
from ..arith.fmul import FloatMultiplierCore
from ..arith.params import FORMAT_NAMES, FloatDatapathParams, dsp_param
from ..arith.product import (pipelined_product, product_latency, signed_product,
                             signed_product_latency)
from ..blocks.block_memory import (BlockMemory, block_count, bram_param, read_latency,
                                   tree_levels)
from ..blocks.run_control import EMPTY_CYCLES, RunControl, run_ports
from ..blocks.scan import INPUT_LATENCY, Scan, scan_cycles
from ..formats import float_format
from ..params import LANES, ParameterError, UnitParams, param, resolve_params
from ..stream import CreditPipeline, delay, lut_increment, replicated

__all__ = ["ScanLayersParams", "ScanLayersUnit", "AffineLayerStep", "LayerFormatParams",
           "INT_FORMATS", "LAYER_FORMATS", "layer_dtype", "LOAD_TO_SCAN", "FETCH_START",
           "PARAMETER_FANOUT", "TREE_BLOCKS"]

#: The layer's integer formats: name -> element width (the saturating rule of the module
#: docstring).
INT_FORMATS = {"int8": 8}
#: The ``format`` choices of the scan_layers units: the float formats, then the integer ones.
LAYER_FORMATS = FORMAT_NAMES + tuple(INT_FORMATS)

#: An integer layer's shortest depths: the signed product's registers; the sum's register,
#: then the clamp's and relu's.
INT_MUL_LATENCY = signed_product_latency(8, 8)
INT_ADD_LATENCY = 2


def layer_dtype(format):
    """The NumPy dtype of a layer format (float32, float16, bfloat16 or int8)."""
    return np.dtype(f"int{INT_FORMATS[format]}") if format in INT_FORMATS else \
        float_format(format).dtype


#: Cycles from the last parameter beat's take to the scan's start cycle.
LOAD_TO_SCAN = 1
#: Cycles the scan's first issue waits for the first parameters, besides the parameter
#: memory's address tree (:attr:`ScanLayersParams.fetch_start`): the fetch starts with the
#: scan (its group set-up, the memory read, its queue), then stays ahead of it.
FETCH_START = 3
#: The most blocks (or registers of the next level) that a register of the parameter
#: memory's addresses reaches (see :class:`~moe_hw.blocks.block_memory.BlockMemory`).
PARAMETER_FANOUT = 8
#: The parameter memory's addresses pass the tree only past this many blocks on ECP5: at
#: the defaults' 128 (62 % of an LFE5U-85F's) the addresses' nets spanned the chip (176.6
#: MHz without the tree, 229.5 with it), at 29 (16 layers, H 512) they were not the path and
#: the tree's cycle only moved the placement (best of three seeds 244.7 without, 226.4 with).
TREE_BLOCKS = 64


class LayerFormatParams(FloatDatapathParams):
    """Mixin of the scan_layers units' parameters: a float format (the float blocks' depths)
    or an integer one of :data:`INT_FORMATS` (a signed product, then an add with
    saturation)."""

    @property
    def is_int(self):
        return self.format in INT_FORMATS

    @property
    def width(self):
        """Bits of one element."""
        return INT_FORMATS[self.format] if self.is_int else self.fmt.width

    @property
    def dtype(self):
        """The NumPy dtype of the format (int8 for int8)."""
        return layer_dtype(self.format)

    @property
    def mul_latency(self):
        if self.is_int:
            return INT_MUL_LATENCY if self.mul_stages is None else self.mul_stages
        return super().mul_latency

    @property
    def add_latency(self):
        if self.is_int:
            return INT_ADD_LATENCY if self.add_stages is None else self.add_stages
        return super().add_latency

    def check(self):
        super().check()
        if not self.is_int:
            return
        for name, least in (("mul_stages", INT_MUL_LATENCY), ("add_stages", INT_ADD_LATENCY)):
            value = getattr(self, name)
            if value is not None and value < least:
                raise ParameterError(f"{name} must be at least {least} for format "
                                     f"{self.format}, not {value}")


@dataclass(frozen=True)
class ScanLayersParams(LayerFormatParams, UnitParams):
    """Generation-time parameters of :class:`ScanLayersUnit`."""

    format: str = param("fp32", choices=LAYER_FORMATS,
                        doc="fp32, fp16, bf16 or int8 (exact, saturated once per layer)")
    lanes: int = param(4, choices=LANES)
    max_tokens: int = param(1024, minimum=1, maximum=1 << 24, doc="S")
    max_hidden: int = param(1024, minimum=1, maximum=1 << 16, doc="H")
    max_layers: int = param(32, minimum=1, maximum=1 << 12,
                            doc="L: the parameter memory's depth in layers")
    max_interleave: int | None = param(None, minimum=1, maximum=1 << 12, optional=True,
                                       doc="beats the scan interleaves (the carry store); "
                                           "None: mul + add latency + 2, the full rate")
    mul_stages: int | None = param(None, minimum=0, maximum=16, optional=True)
    add_stages: int | None = param(None, minimum=0, maximum=16, optional=True)
    dsp: str = dsp_param()
    bram: str = bram_param()

    @property
    def latency(self):
        """D: the layer datapath's cycles (multiply, then add)."""
        return self.mul_latency + self.add_latency

    @property
    def loop_latency(self):
        """The scan's loop latency: the step's input register, then D."""
        return INPUT_LATENCY + self.latency

    @property
    def interleave(self):
        return self.loop_latency + 1 if self.max_interleave is None else self.max_interleave

    @property
    def max_beats(self):
        return -(-self.max_hidden // self.lanes)

    @property
    def setup(self):
        """RunControl's setup: S * B and L * B on pipelined products."""
        return max(product_latency(bits_for(self.max_tokens), bits_for(self.max_beats)),
                   product_latency(bits_for(self.max_layers), bits_for(self.max_beats))) + 1

    def cycles(self, tokens, hidden, layers):
        """Exact stall-free cycles from the start cycle to the first cycle ``done`` is high."""
        if not (tokens and hidden and layers):
            return EMPTY_CYCLES
        beats = -(-hidden // self.lanes)
        return (self.setup + 1 + layers * beats + LOAD_TO_SCAN
                + self.fetch_start + scan_cycles(self.loop_latency, self.interleave,
                                                 tokens * beats, layers))

    def lanes_layout(self):
        return data.ArrayLayout(self.width, self.lanes)

    @property
    def parameter_depth(self):
        """The parameter memory's words: L rows of B beats at a power-of-two stride."""
        return self.max_layers << ceil_log2(self.max_beats)

    @property
    def parameter_blocks(self):
        """The parameter memory's DP16KD blocks on ECP5."""
        return block_count(Shape.cast(self.params_layout()).width, self.parameter_depth)

    @property
    def parameter_fanout(self):
        """The parameter memory's ``fanout``: :data:`PARAMETER_FANOUT` past
        :data:`TREE_BLOCKS` blocks on ECP5, else none (no address tree)."""
        return PARAMETER_FANOUT if self.parameter_blocks > TREE_BLOCKS else None

    @property
    def parameter_tree(self):
        """The parameter memory's address tree's levels (registers per level)."""
        return tree_levels(self.parameter_blocks, self.parameter_fanout)

    @property
    def fetch_start(self):
        """Cycles the scan's first issue waits for the first parameters: FETCH_START and
        the parameter memory's read beyond its two cycles (its address tree's levels and, with
        a tree, the read data's register)."""
        return (FETCH_START + read_latency(self.parameter_blocks, self.parameter_fanout)
                - BlockMemory.latency)

    def params_layout(self):
        return data.StructLayout({"scale": self.lanes_layout(), "bias": self.lanes_layout()})

    def data_layout(self):
        return data.StructLayout({"data": self.lanes_layout()})


class AffineLayerStep(wiring.Component):
    """The layer datapath as a scan step: ``carry_next = relu?(x.scale * carry + x.bias)``
    over ``lanes`` elements, a free-running pipeline of ``latency = mul + add`` cycles (the
    bias waits beside the multiplier). ``relu`` (in) is held for a run.

    Float formats: a float multiplier and a float adder per lane. Integer formats
    (:data:`INT_FORMATS`): a signed product per lane, then a registered stage that adds the
    bias (exact) and one that clamps the sum to the format's range and applies relu.

    ``spread`` (float formats), for a step whose lanes lie far apart
    (:mod:`~moe_hw.units.scan_layers_unrolled`'s chain): the relu flag in a copy per group of
    lanes, and each lane's clamp decided a cycle ahead into a register of its own, beside the
    sum registered once more (:meth:`latency_of`: one cycle more)."""

    def __init__(self, params, *, spread=False):
        self.params = p = params
        self.spread = self._spreads(p, spread)
        self.latency = self.latency_of(p, spread=spread)
        super().__init__({"carry": In(p.lanes_layout()), "x": In(p.params_layout()),
                          "relu": In(1), "carry_next": Out(p.lanes_layout())})

    @staticmethod
    def _spreads(params, spread):
        """Whether a step asked to ``spread`` does: float formats only."""
        return bool(spread) and params.format not in INT_FORMATS

    @staticmethod
    def latency_of(params, *, spread=False):
        """The step's latency: D, and one more for a ``spread`` float step."""
        return params.latency + int(AffineLayerStep._spreads(params, spread))

    def elaborate(self, platform):
        m = Module()
        p = self.params
        bias = delay(m, self.x.bias, p.mul_latency, 1, name="bias", reset_less=True)
        if p.format in INT_FORMATS:
            self._int_lanes(m, bias, delay(m, self.relu, p.mul_latency + 1, 1, name="relu"))
            return m
        # Each lane's clamp is the reset of the register after its sum. Spread: the relu flag
        # (a run constant) in a copy per group of lanes, and the clamp a register of its own
        # (``zero``), beside the sum registered once more, so that the flag's net ends at
        # that one register. In the unrolled chain one flag's net to every lane's reset was
        # 3.5 ns long (197.5 MHz); with copies alone, each copy sat by the flag's delay chain
        # and its net to its lane's reset was 2.6-2.8 ns (238.1, 226.6, 239.4 MHz). (Copies
        # at the head of a chain per group of lanes: the chain's end as far, 224.7, 214.6.)
        copies = min(p.lanes, 4) if self.spread else 1
        if copies == 1:
            relus = [delay(m, self.relu, p.latency, 1, name="relu")]
        else:
            relus = replicated(m, delay(m, self.relu, p.latency - 1, 1, name="relu"),
                               name="relu_copy", copies=copies, apart=False)
        sign = p.fmt.width - 1
        for lane in range(p.lanes):
            mul = m.submodules[f"mul{lane}"] = FloatMultiplierCore(p.format, p.mul_latency,
                                                                   dsp=p.dsp)
            add = m.submodules[f"add{lane}"] = FloatAdderCore(p.format, p.add_latency)
            m.d.comb += [mul.a.eq(self.x.scale[lane]), mul.b.eq(self.carry[lane]),
                         mul.en.eq(1), add.a.eq(mul.product), add.b.eq(bias[lane]),
                         add.en.eq(1)]
            zero = relus[lane * copies // p.lanes] & add.sum[sign]
            total = add.sum
            if self.spread:
                zero = delay(m, zero, 1, 1, name=f"zero{lane}")
                total = delay(m, total, 1, 1, name=f"sum{lane}", reset_less=True)
            m.d.comb += self.carry_next[lane].eq(Mux(zero, 0, total))
        return m

    def _int_lanes(self, m, bias, relu):
        """``relu?(sat(scale * carry + bias))`` per lane: the exact product (2w bits), the
        exact sum (2w + 1 bits) in a register, then the clamp to
        [-2**(w-1), 2**(w-1) - 1] and relu in the next (the carry chain and the compare
        after it do not fit one 250 MHz cycle on ECP5 behind the DSP's route)."""
        p = self.params
        width = p.width
        for lane in range(p.lanes):
            product = signed_product(m, self.x.scale[lane], self.carry[lane], en=1,
                                     dsp=p.dsp, name=f"mul{lane}")
            product = delay(m, product, p.mul_latency - INT_MUL_LATENCY, 1,
                            name=f"product{lane}", reset_less=True)
            total = Signal(signed(2 * width + 1), name=f"sum{lane}", reset_less=True)
            m.d.sync += total.eq(product + bias[lane].as_signed())
            # In range when the bits above the result's sign bit all equal the sum's sign.
            upper = total[width - 1:-1]
            negative = total[-1]
            above = ~negative & upper.any()
            below = negative & ~upper.all()
            result = Signal(width, name=f"result{lane}", reset_less=True)
            m.d.sync += result.eq(
                Mux(negative & relu, 0,
                    Mux(above, (1 << (width - 1)) - 1,
                        Mux(below, 1 << (width - 1), total[:width]))))
            m.d.comb += self.carry_next[lane].eq(
                delay(m, result, p.add_latency - INT_ADD_LATENCY, 1, name=f"result{lane}_d",
                      reset_less=True))


class ScanLayersUnit(wiring.Component):
    """L layers of ``relu?(a_l * h + b_l)`` on one datapath; see the module docstring."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(ScanLayersParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "layer_params": In(stream.Signature(p.params_layout())),
            "input": In(stream.Signature(p.data_layout())),
            "output": Out(stream.Signature(p.data_layout())),
            **run_ports(self.sizes),
            "relu": In(1),
        })

    @property
    def sizes(self):
        p = self.params
        return {"tokens": p.max_tokens, "hidden": p.max_hidden, "layers": p.max_layers}

    def elaborate(self, platform):
        m = Module()
        p = self.params
        lanes_log2 = ceil_log2(p.lanes)
        max_sequences = p.max_tokens * p.max_beats
        ctl = m.submodules.control = RunControl(
            self.sizes, empty_when_zero=("tokens", "hidden", "layers"), setup=p.setup)
        ctl.connect(m, self)
        layers = ctl.size("layers")

        beats = Signal(range(p.max_beats + 1))
        relu = Signal()
        with m.If(ctl.accept):
            m.d.sync += [beats.eq((self.hidden + (p.lanes - 1)) >> lanes_log2),
                         relu.eq(self.relu)]
        # S * B, ready by ``begin`` (RunControl's setup covers the product's stages).
        # Registered once more in the fabric (the scan starts after the parameters are loaded,
        # at least two cycles after ``begin``): the scan's size checks start at a flop beside
        # them, not at the DSP's output register across the chip.
        sequences = delay(m, pipelined_product(m, ctl.size("tokens"), beats, en=1, dsp=p.dsp,
                                               name="sequences")[:bits_for(max_sequences)],
                          1, 1, name="sequences_fabric", reset_less=True)

        # ---- the parameter memory: L rows of B beats, at a power-of-two stride -----------
        # Layer l's beat b is at address (l << stride_log2) | b: the read address is the
        # fetch's layer and beat registers side by side (see the module docstring).
        stride_log2 = ceil_log2(p.max_beats)
        total_beats = p.max_layers * p.max_beats
        # (Its writes pass a register, or as many as its address tree's levels, as its reads
        # do: the scan reads the first parameters several cycles after the last write.)
        store = m.submodules.parameters = BlockMemory(
            p.params_layout(), p.parameter_depth, target=p.bram, registered_write=True,
            fanout=p.parameter_fanout)
        beats_m1 = Signal.like(beats)
        beats_one = Signal()
        # (L - 2, B - 2 and the group's n - 2, signed, so that the last-layer, last-beat and
        # last-slot tests compare a counter with a register.)
        layers_m2 = Signal(signed(len(layers) + 1))
        beats_m2 = Signal(signed(len(beats) + 1))
        with m.If(ctl.decide):
            m.d.sync += [beats_m1.eq(beats - 1), beats_one.eq(beats == 1),
                         layers_m2.eq(layers - 2), beats_m2.eq(beats - 2)]
        loading = Signal()
        load_beat = Signal(range(p.max_beats))         # the next parameter beat's place
        load_layer = Signal(range(p.max_layers))
        load_row_last = Signal()                       # load_beat == B - 1
        load_left = Signal(range(total_beats + 1))     # parameter beats still to come
        load_last = Signal()                           # the next parameter beat is the last
        total = pipelined_product(m, layers, beats, en=1, dsp=p.dsp, name="load_total")
        m.d.comb += [
            self.layer_params.ready.eq(loading),
            store.write_addr.eq(Cat(load_beat[:stride_log2], load_layer)),
            store.write_data[0].eq(self.layer_params.payload),
            store.write_en.eq(self.layer_params.valid & loading),
        ]
        scan_start = Signal()
        # (The count loads from the product's DSP register, and the last-beat flag is a
        # register: L * B == 1 from the sizes at the start, then the count's compare with 2
        # at each beat taken, so that neither a compare after the DSP's output nor one of the
        # count reaches ``loading``.)
        total_one = Signal()
        with m.If(ctl.decide):
            m.d.sync += total_one.eq((beats == 1) & (layers == 1))
        with m.If(ctl.begin):
            m.d.sync += [loading.eq(1), load_beat.eq(0), load_layer.eq(0),
                         load_row_last.eq(beats == 1), load_left.eq(total),
                         load_last.eq(total_one)]
        with m.If(self.layer_params.valid & loading):
            m.d.sync += [load_left.eq(load_left - 1), load_last.eq(load_left == 2)]
            with m.If(load_row_last):
                m.d.sync += [load_beat.eq(0), load_layer.eq(load_layer + 1),
                             load_row_last.eq(beats_one)]
            with m.Else():
                m.d.sync += [load_beat.eq(load_beat + 1),
                             load_row_last.eq(load_beat == beats_m2)]
            with m.If(load_last):
                m.d.sync += [loading.eq(0), scan_start.eq(1)]
        with m.If(scan_start):
            m.d.sync += scan_start.eq(0)

        # ---- the scan over the layers, one step datapath ---------------------------------
        step = AffineLayerStep(p)
        scan = m.submodules.scan = Scan(step, max_sequences=max_sequences,
                                        max_length=p.max_layers,
                                        max_interleave=p.interleave, ys=False)
        m.d.comb += [
            scan.start.eq(scan_start), scan.sequences.eq(sequences), scan.length.eq(layers),
            step.relu.eq(relu),
            scan.init.valid.eq(self.input.valid), self.input.ready.eq(scan.init.ready),
            scan.init.payload.eq(self.input.payload.data),
            self.output.valid.eq(scan.o.valid), scan.o.ready.eq(self.output.ready),
            self.output.payload.data.eq(scan.o.payload.carry),
        ]

        # ---- the parameters in the scan's order -------------------------------------------
        # x[g, l, s] is layer l's parameters for the beat of the group's sequence s: beat
        # index (first_g + s) mod B, memory address l*B + beat. The generator follows the
        # scan's groups (n = min(max_interleave, left)); the memory's registered read (two
        # cycles, always enabled) is the datapath of a credit pipeline in front of the scan's
        # ``x``.
        # (The parameters wait in the queue's skid buffer in two registers written in turn:
        # the scan registers them anyway, and its take then reaches only the buffer's flags,
        # not the clock enable of a register as wide as the two lanes' vectors.)
        fetch = m.submodules.fetch = CreditPipeline(store.latency, p.params_layout(),
                                                    alternate=("scale", "bias"))
        wiring.connect(m, fetch.o, scan.x)
        left = Signal(range(max_sequences + 1))
        group = Signal(range(p.interleave + 1))
        slot = Signal(range(p.interleave))
        layer = Signal(range(p.max_layers))          # the layer and beat of the beat offered
        beat = Signal(range(p.max_beats))
        m.d.comb += [store.read_addr.eq(Cat(beat[:stride_log2], layer)), store.read_en.eq(1),
                     fetch.payload.eq(store.read_data[0])]
        group_beat = Signal(range(p.max_beats))      # the beat of the group's first sequence
        # Kept beside them, so that no compare or add waits for another add: beat + 1, the
        # group's first beat is the last (group_beat == B - 1), B - 1, B == 1.
        beat_inc = Signal(range(p.max_beats + 1))
        group_last = Signal()
        group_m2 = Signal(signed(bits_for(p.interleave) + 1))
        generating = Signal()
        last_slot, last_layer, last_beat, final_group = (Signal(name=n) for n in (
            "x_last_slot", "x_last_layer", "x_last_beat", "x_final_group"))
        # The next group's size is worked out while a group is fetched (as in the scan), so
        # that the groups follow each other without a gap.
        pending_group = Signal.like(group)
        pending_final = Signal()
        pending_ready = Signal()
        compute = Signal()
        waiting = Signal()
        m.d.comb += fetch.i_valid.eq(generating)
        next_beat = Mux(last_beat, 0, beat_inc)
        next_inc = Mux(last_beat, 1, beat_inc + 1)
        next_last = Mux(last_beat, beats_one, beat_inc == beats_m1)     # next_beat == B - 1
        # The load of the next group: now if waiting, or with the take of the group's last
        # beat (the take's part is the last gate: the rest is formed from registers).
        load_at_end = pending_ready & last_slot & last_layer & ~final_group
        load = (pending_ready & waiting) | (fetch.take & load_at_end)
        # A group loaded as the last one ends starts from the beat after its last one.
        start_beat = Mux(generating, next_beat, group_beat)
        start_inc = Mux(generating, next_inc, group_beat + 1)
        start_last = Mux(generating, next_last, group_last)
        with m.If(scan_start):
            m.d.sync += [left.eq(sequences), compute.eq(1), pending_ready.eq(0),
                         waiting.eq(1), group_beat.eq(0), group_last.eq(beats_one)]
        with m.If(compute):
            m.d.sync += [pending_group.eq(Mux(left > p.interleave, p.interleave, left)),
                         pending_final.eq(left <= p.interleave),
                         compute.eq(0), pending_ready.eq(1)]
        with m.If(fetch.take):
            with m.If(last_slot):
                # The round's last beat: the next layer from the group's first beat, or the
                # next group from the beat after this one.
                m.d.sync += [slot.eq(0), last_slot.eq(group == 1),
                             layer.eq(layer + 1), last_layer.eq(layer == layers_m2),
                             beat.eq(group_beat), beat_inc.eq(group_beat + 1),
                             last_beat.eq(group_last)]
                with m.If(last_layer):
                    m.d.sync += [generating.eq(0), group_beat.eq(next_beat),
                                 group_last.eq(next_last)]
                    with m.If(~final_group):
                        m.d.sync += waiting.eq(1)
            with m.Else():
                m.d.sync += [slot.eq(lut_increment(slot)), last_slot.eq(slot == group_m2),
                             beat.eq(next_beat), beat_inc.eq(next_inc), last_beat.eq(next_last)]
        with m.If(load):                             # after the above: it wins
            m.d.sync += [group.eq(pending_group), final_group.eq(pending_final),
                         left.eq(left - pending_group), pending_ready.eq(0), compute.eq(1),
                         waiting.eq(0), generating.eq(1),
                         slot.eq(0), layer.eq(0),
                         last_slot.eq(pending_group == 1), last_layer.eq(layers == 1),
                         group_m2.eq(pending_group - 2),
                         beat.eq(start_beat), beat_inc.eq(start_inc), group_beat.eq(start_beat),
                         group_last.eq(start_last), last_beat.eq(start_last)]

        scan_started = Signal()
        with m.If(ctl.accept):
            m.d.sync += scan_started.eq(0)
        with m.If(scan_start):
            m.d.sync += scan_started.eq(1)
        m.d.comb += ctl.finished.eq(ctl.running & scan_started & scan.done)
        return m

