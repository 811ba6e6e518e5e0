"""The scan_layers_unrolled unit: the same L layers as :mod:`~moe_hw.units.scan_layers`, as
a chain of L copies of the layer datapath (generation-time L), for comparison (SPEC 1.7: the
cost the scan avoids). Bit-exact against the same golden model,
``golden.scan_layers(golden.affine_layer, ...)``, in the same formats (fp32, fp16, bf16 and
int8, with the integer layer's saturating rule of :mod:`~moe_hw.units.scan_layers`).

Each copy l is a parameter memory of ``ceil(max_hidden / lanes)`` beats (layer l's ``scale``
and ``bias``; a :class:`~moe_hw.blocks.block_memory.BlockMemory`, its read registered twice,
in block RAM with the output register on under ``bram="ecp5"``, its writes registered), read
at the beat index that travels with the data, a register in the fabric after the read, and
one :class:`~moe_hw.units.scan_layers.AffineLayerStep`: ``3 + D`` cycles per layer
(``D``: the step's latency, ``mul_latency + add_latency + 1`` for the floats, whose clamp is
decided into a register of its own, ``spread``: 27 at the default depths; 4 for int8). The
chain is free running behind a credit-counted output queue
(:class:`~moe_hw.stream.CreditPipeline`): one beat per cycle whatever L is, but cells and the
queue grow linearly with L.

Streams and ports: as :class:`~moe_hw.units.scan_layers.ScanLayersUnit` (``layer_params``,
``input``, ``output``, ``start``, ``tokens``, ``hidden``, ``relu``, ``busy``, ``done``,
``error``), without the ``layers`` size: L is the parameter ``layers``.

Stall-free cycle count, start cycle to ``done``: :meth:`ScanLayersUnrolledParams.cycles` =
``setup + 3 + L*B + S*B + L*(D + 3) + 4`` with B = ceil(H / lanes) (``setup``: S*B on a
pipelined product, plus one; the stream starts a cycle after the load's last beat, when the
registered write has landed; the first layer's read address is a register of its own).
"""

from dataclasses import dataclass

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.utils import bits_for, ceil_log2

from ..arith.params import dsp_param
from ..arith.product import pipelined_product, product_latency
from ..blocks.block_memory import BlockMemory, bram_param
from ..blocks.row_beats import row_beats
from ..blocks.run_control import EMPTY_CYCLES, RunControl, run_ports
from ..params import LANES, UnitParams, param, resolve_params
from ..stream import CreditPipeline, delay
from .scan_layers import LAYER_FORMATS, AffineLayerStep, LayerFormatParams, ScanLayersParams

__all__ = ["ScanLayersUnrolledParams", "ScanLayersUnrolledUnit"]


@dataclass(frozen=True)
class ScanLayersUnrolledParams(LayerFormatParams, UnitParams):
    """Generation-time parameters of :class:`ScanLayersUnrolledUnit`."""

    format: str = param("fp32", choices=LAYER_FORMATS,
                        doc="fp32, fp16, bf16 or int8 (exact, saturated once per layer)")
    lanes: int = param(4, choices=LANES)
    max_tokens: int = param(1024, minimum=1, maximum=1 << 24, doc="S")
    max_hidden: int = param(1024, minimum=1, maximum=1 << 16, doc="H")
    layers: int = param(2, minimum=1, maximum=1 << 10, doc="L: the copies of the layer")
    mul_stages: int | None = param(None, minimum=0, maximum=16, optional=True)
    add_stages: int | None = param(None, minimum=0, maximum=16, optional=True)
    dsp: str = dsp_param()
    bram: str = bram_param()

    @property
    def layer(self):
        """The one layer's parameters (the datapath each copy is)."""
        return ScanLayersParams(format=self.format, lanes=self.lanes, max_tokens=self.max_tokens,
                                max_hidden=self.max_hidden, max_layers=1,
                                mul_stages=self.mul_stages, add_stages=self.add_stages,
                                dsp=self.dsp)

    @property
    def latency(self):
        """Cycles through the chain: the first read's address register, then per layer the
        parameter read and the datapath."""
        return 1 + self.layers * (self.read_latency
                                  + AffineLayerStep.latency_of(self.layer, spread=True))

    @property
    def read_latency(self):
        """Cycles of a layer's parameter read: the block memory's, then a register in the
        fabric."""
        return BlockMemory.latency + 1

    @property
    def max_beats(self):
        return -(-self.max_hidden // self.lanes)

    @property
    def setup(self):
        return product_latency(bits_for(self.max_tokens), bits_for(self.max_beats)) + 1

    def cycles(self, tokens, hidden, layers=None):
        """Exact stall-free cycles from the start cycle to the first cycle ``done`` is high."""
        if not (tokens and hidden):
            return EMPTY_CYCLES
        beats = -(-hidden // self.lanes)
        return (self.setup + 2 + self.layers * beats + tokens * beats + self.latency
                + CreditPipeline.QUEUE_LATENCY + CreditPipeline.IDLE_LATENCY + 1)


class ScanLayersUnrolledUnit(wiring.Component):
    """L copies of the layer datapath in a chain; see the module docstring."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(ScanLayersUnrolledParams, params, kwargs)
        self.params = p = params
        layer = p.layer
        super().__init__({
            "layer_params": wiring.In(stream.Signature(layer.params_layout())),
            "input": wiring.In(stream.Signature(layer.data_layout())),
            "output": wiring.Out(stream.Signature(layer.data_layout())),
            **run_ports(self.sizes),
            "relu": wiring.In(1),
        })

    @property
    def sizes(self):
        return {"tokens": self.params.max_tokens, "hidden": self.params.max_hidden}

    def elaborate(self, platform):
        m = Module()
        p = self.params
        layer = p.layer
        lanes_log2 = ceil_log2(p.lanes)
        max_total = p.max_tokens * p.max_beats
        ctl = m.submodules.control = RunControl(self.sizes, empty_when_zero=("tokens", "hidden"),
                                                setup=p.setup)
        ctl.connect(m, self)
        beats = Signal(range(p.max_beats + 1))
        relu = Signal()
        with m.If(ctl.accept):
            m.d.sync += [beats.eq((self.hidden + (p.lanes - 1)) >> lanes_log2),
                         relu.eq(self.relu)]
        total = pipelined_product(m, ctl.size("tokens"), beats, en=1, dsp=p.dsp,
                                  name="total")[:bits_for(max_total)]

        # ---- load: L * B parameter beats, layer-major, into the copies' memories ---------
        loading = Signal()
        load_layer = Signal(range(p.layers))
        streaming = Signal()
        load_take = self.layer_params.valid & loading
        m.d.comb += self.layer_params.ready.eq(loading)
        last_layer = Signal()                      # load_layer == L - 1
        with m.If(ctl.begin):
            m.d.sync += [loading.eq(1), load_layer.eq(0), last_layer.eq(p.layers == 1)]
        # (The beat counters' last-beat flags are registers, row_beats: the compare
        # ``load_beat + 1 == beats`` into ``load_layer`` was a critical path, 191.0 MHz.)
        load_beat, load_last = row_beats(m, beats, start=ctl.begin, step=load_take,
                                         name="load", wrap=True)
        # The writes pass a register (``registered_write``: the take of the parameter port
        # reached the far block RAMs' write enables over a 2.5 ns net, 223.6 MHz), so a read
        # sees a write two cycles after it is given: the stream starts a cycle after the load.
        loaded = Signal()
        with m.If(load_take & load_last):
            m.d.sync += [load_layer.eq(load_layer + 1), last_layer.eq(load_layer == p.layers - 2)]
            with m.If(last_layer):
                m.d.sync += [loading.eq(0), loaded.eq(1)]
        with m.If(loaded):
            m.d.sync += [loaded.eq(0), streaming.eq(1)]

        # ---- the chain ----------------------------------------------------------------------
        chain = m.submodules.chain = CreditPipeline(p.latency, layer.data_layout())
        wiring.connect(m, chain.o, wiring.flipped(self.output))
        left = Signal(range(max_total + 1))
        all_in = Signal()
        m.d.comb += [chain.i_valid.eq(self.input.valid & streaming),
                     self.input.ready.eq(chain.i_ready & streaming)]
        beat, _ = row_beats(m, beats, start=ctl.begin, step=chain.take, name="beat", wrap=True)
        with m.If(ctl.begin):
            m.d.sync += [left.eq(total), all_in.eq(0)]
        with m.If(chain.take):
            m.d.sync += left.eq(left - 1)
            with m.If(left == 1):
                m.d.sync += [streaming.eq(0), all_in.eq(1)]
        # The first layer's read address is a register of its own, loaded from the beat
        # counter a cycle late (the input beside it): the counter's net to the first block
        # RAM's address pins was 3.5 ns (243.4 MHz).
        h = delay(m, self.input.payload.data, 1, 1, name="h_in", reset_less=True)
        tag = delay(m, beat, 1, 1, name="beat_in", reset_less=True)
        for index in range(p.layers):
            # (a block RAM read straight from its output register: with the plain memory's
            # one-cycle read, Yosys left the DP16KD's output register off, and its 4.3 ns
            # clock-to-output went on into the multiplier's operand unpacking: 122.0 MHz)
            # The read data passes a register in the fabric before the multipliers (from the
            # block's output register, a 1.0 ns net, the operand classification and two more
            # nets of 1.6 and 1.1 ns across the lanes: 196.5 MHz).
            store = m.submodules[f"parameters{index}"] = BlockMemory(
                layer.params_layout(), p.max_beats, target=p.bram, registered_write=True)
            step = m.submodules[f"layer{index}"] = AffineLayerStep(layer, spread=True)
            read = p.read_latency
            m.d.comb += [
                store.write_addr.eq(load_beat), store.write_data[0].eq(self.layer_params.payload),
                store.write_en.eq(load_take & (load_layer == index)),
                store.read_addr.eq(tag), store.read_en.eq(1),
                step.carry.eq(delay(m, h, read, 1, name=f"h{index}", reset_less=True)),
                step.x.eq(delay(m, store.read_data[0], 1, 1, name=f"x{index}",
                                reset_less=True)),
                step.relu.eq(relu),
            ]
            tag = delay(m, tag, read + step.latency, 1, name=f"beat{index}", reset_less=True)
            h = step.carry_next
        m.d.comb += chain.payload.data.eq(h)
        m.d.comb += ctl.finished.eq(ctl.running & all_in & ~chain.busy)
        return m
