"""The scan_layers_backward unit: the backward pass of ``scan_layers`` on ONE layer datapath
(SPEC 1.7, backward; the seed's scan differentiated, with checkpointing).

For the forward ``h_{l+1} = relu?(a_l * h_l + b_l)`` (:mod:`moe_hw.units.scan_layers`) and
the gradient ``grad_output`` with respect to ``h_L``, it computes, for l = L-1 down to 0,
with ``g`` the gradient with respect to ``h_{l+1}``::

    g_pre          = g, or with relu +0.0 where h_{l+1} is +0.0 (pre-activation <= 0)
    grad_bias[l]   = sum over tokens of g_pre
    grad_scale[l]  = sum over tokens of g_pre * h_l
    g (for h_l)    = g_pre * a_l              (after layer 0: grad_input)

bit for bit as ``golden.scan_layers_backward``: in ``format`` (fp32, fp16, bf16), every
product and sum rounded once (the project's :class:`~moe_hw.arith.fmul.FloatMultiplierCore`
and :class:`~moe_hw.arith.fadd.FloatAdderCore`, no FMA). relu's derivative is 0 at a
pre-activation of exactly 0 (as PyTorch); the mask is read from the relu's own result
(+0.0 exactly when the pre-activation is <= 0), so a NaN pre-activation passes the gradient,
as PyTorch's ``threshold_backward`` does.

Summation order (``golden.token_sum``): per element, sequential in token order from +0.0.
The items of a sweep come token-major (token t, beat b), so an element's accumulator is
revisited every B = ceil(H / lanes) cycles; it lives in a small memory of B entries read
(asynchronously, into a register) the cycle before the item's products arrive and written
back ``add_latency`` (A) cycles after they do. A token therefore takes ``period = max(B,
A + 2)`` cycles: from H >= lanes * (A + 2) on (H >= 208 at 16 fp32 lanes and the default
adder, A = 11) one item per cycle, below that the padding keeps the sum sequential.

The hardware: one layer datapath, reused for every layer and every pass:

* the forward layer, the scan_layers units' own :class:`~moe_hw.units.scan_layers.
  AffineLayerStep` (``lanes`` multipliers and adders): ``h_{l+1}`` in a forward sweep, the
  relu mask in a backward one;
* the backward part: the mask, ``lanes`` multipliers for ``g_pre * a_l`` and as many for
  ``g_pre * h_l``, ``2 * lanes`` adders accumulating ``grad_scale`` and ``grad_bias``.

Memories (:class:`~moe_hw.blocks.block_memory.BlockMemory`, a two-cycle registered read,
and a register of the unit after it):
the parameters (``max_layers * ceil(max_hidden / lanes)`` beats, read at ``l * Bmax + b``),
the activations (``slabs`` slabs of ``max_tokens * ceil(max_hidden / lanes)`` beats, slab
``s`` at ``s * SBmax``), the gradient ``g`` (one slab, read and rewritten in place by every
backward sweep); the accumulators (B beats) in distributed RAM. Only the parameter and the
activation memories grow with ``max_layers``.

Activations and ``checkpoint`` (c; 0, store all, is the same as c = 1). Slab ``l // c`` holds
the checkpoint ``h_l`` when ``l % c == 0``; the other activations of a segment go to the
``c - 1`` scratch slabs after the ``ceil(max_layers / c)`` checkpoint slabs (``h_l`` in
scratch ``l % c - 1``). With c = 1 every activation has its own slab (L slabs); with c > 1
only ``ceil(L/c) + c - 1``. The run is a list of *sweeps*, each one pass of the S*B items
through the datapath at one layer:

1. load: ``layer_params``, ``input`` (into slab 0) and ``grad_output`` (into ``g``), taken
   side by side, each at its own pace;
2. forward: layers 0 .. L-2, each reading ``h_l`` and writing ``h_{l+1}``;
3. backward, segment by segment from the last: layers ``end-1`` down to ``kc`` of segment k
   (reading ``h_l``, the parameters, ``g``; writing ``g``; the last sweep, layer 0, sends
   ``g`` out as ``grad_input``); before each segment but the last, whose activations the
   forward pass left in scratch, the ``c - 1`` forward sweeps that recompute its
   activations from its checkpoint.

Sweeps follow each other after the pipeline has drained, so a sweep never reads what its
predecessor is still writing: S*B items per sweep with a fixed overhead (``SWEEP_OVERHEAD``
plus the drain).

Streams and ports (payload fields least significant first; lanes: lane 0 first):

``layer_params`` (in)
    L * B beats, layer-major: ``scale`` then ``bias`` (a_l and b_l, ``lanes`` elements).
``input``, ``grad_output`` (in)
    S * B beats each, token-major: ``data`` (``lanes`` elements). Lanes past H on a token's
    last beat are carried along; their results are whatever the layers make of them.
``param_grad`` (out)
    L * B beats: ``scale`` and ``bias`` (grad_scale[l], grad_bias[l] of the beat), layer
    L-1 first, down to layer 0 (the backward order), beats in order within a layer.
``grad_input`` (out)
    S * B beats, token-major: ``data``, the gradient with respect to ``input``.
``start``, ``tokens`` (S), ``hidden`` (H), ``layers`` (L), ``relu`` (in)
    Sampled when ``start`` is high while idle (:class:`~moe_hw.blocks.run_control.RunControl`).
``busy``, ``done``, ``error`` (out)
    ``error`` (and nothing done) when a size exceeds its maximum. S, H or L zero: an empty
    run, ``done`` after ``EMPTY_CYCLES``, nothing taken (the host then gives the sums of no
    tokens, +0.0).

The datapath is free running (no enable); the two outputs leave through
:class:`~moe_hw.stream.CreditPipeline` queues, and an item that produces an output beat is
issued only with a credit for it. Stall-free cycle count, start to ``done``:
:meth:`ScanLayersBackwardParams.cycles`.
"""

from dataclasses import dataclass

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..arith.fadd import FloatAdderCore
from ..arith.fmul import FloatMultiplierCore
from ..arith.params import FORMAT_NAMES, FloatDatapathParams, dsp_param
from ..arith.product import pipelined_product, product_latency
from ..blocks.block_memory import BlockMemory, bram_param
from ..blocks.run_control import EMPTY_CYCLES, RunControl, run_ports
from ..params import LANES, ParameterError, UnitParams, param, resolve_params
from ..stream import CreditPipeline, delay
from .scan_layers import AffineLayerStep

__all__ = ["ScanLayersBackwardParams", "ScanLayersBackwardUnit", "sweep_plan",
           "LOAD_TO_SWEEP", "SWEEP_OVERHEAD"]

#: Cycles from the load's last take to the first sweep's set-up cycle (the load flags
#: fall, then the sweeps start from them).
LOAD_TO_SWEEP = 2
#: Cycles of a sweep beyond its issue slots and its drain: the decision of the next sweep
#: and the set-up of its addresses.
SWEEP_OVERHEAD = 2
#: Cycles from an item's issue to its operands: the memories' registered read, then one
#: register more (the activation memory's row multiplexer on ECP5 otherwise reached the
#: multipliers' first stage: 162.4 MHz).
READ_LATENCY = BlockMemory.latency + 1
#: Cycles from ``h_{l+1}`` to ``g_pre``: ``h_{l+1}`` registered, its zero test registered (one
#: flag a lane), then the choice between g and +0.0 registered. The test fed straight from
#: the adder's output logic into the multipliers' input registers (as their synchronous
#: reset) was the unit's critical path: 171.9 MHz on ECP5-85 speed 8.
MASK_LATENCY = 3
#: The largest activation memory (BlockMemory's depth limit).
MAX_ACTIVATION_WORDS = 1 << 20


def sweep_plan(layers, checkpoint):
    """The sweeps of a run of ``layers`` layers: a list of ``(kind, layer)``, kind
    ``"forward"`` (``h_{l+1}`` from ``h_l``) or ``"backward"``, in run order (the module
    docstring's steps 2 and 3). ``checkpoint`` 0 stores all (as 1)."""
    c = max(1, checkpoint)
    plan = [("forward", layer) for layer in range(layers - 1)]
    segments = -(-layers // c)
    for k in reversed(range(segments)):
        end = min(layers, (k + 1) * c)
        if k < segments - 1:
            plan += [("forward", layer) for layer in range(k * c, end - 1)]
        plan += [("backward", layer) for layer in reversed(range(k * c, end))]
    return plan


@dataclass(frozen=True)
class ScanLayersBackwardParams(FloatDatapathParams, UnitParams):
    """Generation-time parameters of :class:`ScanLayersBackwardUnit`."""

    format: str = param("fp32", choices=FORMAT_NAMES)
    lanes: int = param(4, choices=LANES)
    # Modest defaults: Amaranth writes every memory's initial contents into the Verilog, and
    # the activation memory is max_layers * max_tokens * ceil(max_hidden / lanes) beats.
    max_tokens: int = param(64, minimum=1, maximum=1 << 20, doc="S")
    max_hidden: int = param(256, minimum=1, maximum=1 << 16, doc="H")
    max_layers: int = param(16, minimum=1, maximum=1 << 12,
                            doc="L: the parameter memory's depth in layers")
    checkpoint: int = param(0, minimum=0, maximum=1 << 12,
                            doc="c: keep every c-th activation and recompute the others "
                                "(0: keep all L)")
    mul_stages: int | None = param(None, minimum=0, maximum=16, optional=True)
    add_stages: int | None = param(None, minimum=0, maximum=16, optional=True)
    dsp: str = dsp_param()
    bram: str = bram_param()

    def check(self):
        if self.checkpoint > self.max_layers:
            raise ParameterError(f"checkpoint must be at most max_layers "
                                 f"({self.max_layers}), not {self.checkpoint}")
        words = self.slabs * self.slab_words
        if words > MAX_ACTIVATION_WORDS:
            raise ParameterError(
                f"the activation memory needs {self.slabs} slabs of max_tokens * "
                f"ceil(max_hidden / lanes) = {self.slab_words} beats, {words} words, more "
                f"than {MAX_ACTIVATION_WORDS}: lower max_tokens, max_hidden or max_layers, "
                f"or set checkpoint")

    # ---- derived sizes -------------------------------------------------------------------

    @property
    def interval(self):
        """c: the distance of two checkpoints (store all: 1)."""
        return max(1, self.checkpoint)

    @property
    def checkpoint_slabs(self):
        return -(-self.max_layers // self.interval)

    @property
    def slabs(self):
        """Activation slabs: the checkpoints, then the scratch of a segment."""
        return self.checkpoint_slabs + self.interval - 1

    @property
    def max_beats(self):
        return -(-self.max_hidden // self.lanes)

    @property
    def slab_words(self):
        return self.max_tokens * self.max_beats

    @property
    def latency(self):
        """D: the forward layer's cycles (multiply, then add)."""
        return self.mul_latency + self.add_latency

    @property
    def forward_latency(self):
        """F: issue to ``h_{l+1}`` (the memory read and its register, the layer)."""
        return READ_LATENCY + self.latency

    @property
    def grad_latency(self):
        """G: issue to ``g_pre * a_l`` and ``g_pre * h_l`` (the mask's
        :data:`MASK_LATENCY` registers, a multiply)."""
        return self.forward_latency + MASK_LATENCY + self.mul_latency

    @property
    def sum_latency(self):
        """Z: issue to the accumulators' new sums."""
        return self.grad_latency + self.add_latency

    @property
    def drain(self):
        """Cycles a sweep waits after its last issue: every write of it has landed."""
        return self.sum_latency + 1

    @property
    def setup(self):
        """RunControl's setup: S * B and L * B on pipelined products."""
        return max(product_latency(bits_for(self.max_tokens), bits_for(self.max_beats)),
                   product_latency(bits_for(self.max_layers), bits_for(self.max_beats))) + 1

    def period(self, hidden):
        """Cycles per token in a sweep: B, or A + 2 when fewer (the accumulators' loop: the
        read register, the adder)."""
        return max(-(-hidden // self.lanes), self.add_latency + 2)

    def sweeps(self, layers):
        return sweep_plan(layers, self.checkpoint)

    def sweep_cycles(self, tokens, hidden):
        """One sweep: its issue span, the drain, the decision and set-up."""
        beats = -(-hidden // self.lanes)
        return (tokens - 1) * self.period(hidden) + beats + self.drain + SWEEP_OVERHEAD

    def cycles(self, tokens, hidden, layers):
        """Exact stall-free cycles from the start cycle to the first cycle ``done`` is high:
        ``setup + 1 + max(L*B, S*B) + LOAD_TO_SWEEP (2) + sweeps * ((S-1) * period + B + drain
        + SWEEP_OVERHEAD) + 1`` (the done register), ``sweeps = len(sweep_plan(L, c))`` =
        ``2L - 1`` storing all, ``2L - 1 + (ceil(L/c) - 1) * (c - 1)`` with checkpoints."""
        if not (tokens and hidden and layers):
            return EMPTY_CYCLES
        beats = -(-hidden // self.lanes)
        return (self.setup + 1 + max(layers * beats, tokens * beats) + LOAD_TO_SWEEP
                + len(self.sweeps(layers)) * self.sweep_cycles(tokens, hidden) + 1)

    def memory_bits(self):
        """Bits of every memory: ``{name: bits}`` (parameters, activations, gradient,
        accumulators)."""
        width = self.fmt.width * self.lanes
        return {"parameters": self.max_layers * self.max_beats * 2 * width,
                "activations": self.slabs * self.slab_words * width,
                "gradient": self.slab_words * width,
                "accumulators": self.max_beats * 2 * width}

    # ---- layouts ---------------------------------------------------------------------------

    def lanes_layout(self):
        return data.ArrayLayout(self.fmt.width, self.lanes)

    def params_layout(self):
        return data.StructLayout({"scale": self.lanes_layout(), "bias": self.lanes_layout()})

    def data_layout(self):
        return data.StructLayout({"data": self.lanes_layout()})


class ScanLayersBackwardUnit(wiring.Component):
    """The backward pass of L layers ``relu?(a_l * h + b_l)`` on one datapath; see the module
    docstring."""

    def __init__(self, params=None, **kwargs):
        params = resolve_params(ScanLayersBackwardParams, params, kwargs)
        self.params = p = params
        super().__init__({
            "layer_params": In(stream.Signature(p.params_layout())),
            "input": In(stream.Signature(p.data_layout())),
            "grad_output": In(stream.Signature(p.data_layout())),
            "param_grad": Out(stream.Signature(p.params_layout())),
            "grad_input": Out(stream.Signature(p.data_layout())),
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
        c = p.interval
        lanes_log2 = ceil_log2(p.lanes)
        ctl = m.submodules.control = RunControl(
            self.sizes, empty_when_zero=("tokens", "hidden", "layers"), setup=p.setup)
        ctl.connect(m, self)
        layers = ctl.size("layers")
        tokens = ctl.size("tokens")

        beats = Signal(range(p.max_beats + 1))
        period = Signal(range(max(p.max_beats, p.add_latency + 2) + 1))
        relu = Signal()
        with m.If(ctl.accept):
            m.d.sync += [beats.eq((self.hidden + (p.lanes - 1)) >> lanes_log2),
                         relu.eq(self.relu)]
        with m.If(ctl.decide):
            m.d.sync += period.eq(Mux(beats > p.add_latency + 2, beats, p.add_latency + 2))
        # S * B and L * B, ready by ``begin`` (RunControl's setup covers the products).
        items = pipelined_product(m, tokens, beats, en=1, dsp=p.dsp,
                                  name="items")[:bits_for(p.slab_words)]
        param_beats = pipelined_product(m, layers, beats, en=1, dsp=p.dsp,
                                        name="param_beats")[:bits_for(p.max_layers *
                                                                       p.max_beats)]

        # (The writes pass a register, after the load's and the sweeps' choice of what to
        # write: a sweep reads a slab written by an earlier one, after the drain, and the
        # load's last write lands cycles before the first sweep's first read.)
        params_mem = m.submodules.parameters = BlockMemory(
            p.params_layout(), p.max_layers * p.max_beats, target=p.bram,
            registered_write=True)
        acts = m.submodules.activations = BlockMemory(
            p.lanes_layout(), p.slabs * p.slab_words, target=p.bram, registered_write=True)
        grads = m.submodules.gradient = BlockMemory(p.lanes_layout(), p.slab_words,
                                                    target=p.bram, registered_write=True)

        # ---- 1. the load: three streams side by side ------------------------------------------
        load_params, load_input, load_grad = (Signal(name=n) for n in (
            "load_params", "load_input", "load_grad"))
        param_count = Signal(range(p.max_layers * p.max_beats + 1))
        param_beat = Signal(range(p.max_beats))
        param_row = Signal(range(p.max_layers * p.max_beats))   # l * Bmax
        input_count = Signal(range(p.slab_words + 1))
        grad_count = Signal(range(p.slab_words + 1))
        loading = Signal()
        take_param = self.layer_params.valid & load_params
        take_input = self.input.valid & load_input
        take_grad = self.grad_output.valid & load_grad
        m.d.comb += [self.layer_params.ready.eq(load_params),
                     self.input.ready.eq(load_input),
                     self.grad_output.ready.eq(load_grad),
                     params_mem.write_addr.eq(param_row + param_beat),
                     params_mem.write_data[0].eq(self.layer_params.payload),
                     params_mem.write_en.eq(take_param)]
        # The last-beat tests are registers kept beside the counts (each the count's compare
        # with a register, L*B - 2, S*B - 2, B - 2, loaded at the run's begin; signed: -1
        # matches nothing), so that no adder stands before a compare in a take's cycle.
        param_last, param_beat_last, input_last, grad_last = (Signal(name=n) for n in (
            "param_last", "param_beat_last", "input_last", "grad_last"))
        beats_one = Signal()
        beats_m1 = Signal(signed(len(beats) + 1))
        beats_m2 = Signal(signed(len(beats) + 1))
        items_m2 = Signal(signed(len(items) + 1))
        param_beats_m2 = Signal(signed(len(param_beats) + 1))
        with m.If(ctl.begin):
            m.d.sync += [load_params.eq(1), load_input.eq(1), load_grad.eq(1), loading.eq(1),
                         param_count.eq(0), param_beat.eq(0), param_row.eq(0),
                         input_count.eq(0), grad_count.eq(0),
                         beats_one.eq(beats == 1), beats_m1.eq(beats - 1),
                         beats_m2.eq(beats - 2), items_m2.eq(items - 2),
                         param_beats_m2.eq(param_beats - 2),
                         param_last.eq(param_beats == 1), param_beat_last.eq(beats == 1),
                         input_last.eq(items == 1), grad_last.eq(items == 1)]
        with m.If(take_param):
            m.d.sync += [param_count.eq(param_count + 1),
                         param_last.eq(param_count == param_beats_m2)]
            with m.If(param_beat_last):
                m.d.sync += [param_beat.eq(0), param_row.eq(param_row + p.max_beats),
                             param_beat_last.eq(beats_one)]
            with m.Else():
                m.d.sync += [param_beat.eq(param_beat + 1),
                             param_beat_last.eq(param_beat == beats_m2)]
            with m.If(param_last):
                m.d.sync += load_params.eq(0)
        with m.If(take_input):
            m.d.sync += [input_count.eq(input_count + 1),
                         input_last.eq(input_count == items_m2)]
            with m.If(input_last):
                m.d.sync += load_input.eq(0)
        with m.If(take_grad):
            m.d.sync += [grad_count.eq(grad_count + 1), grad_last.eq(grad_count == items_m2)]
            with m.If(grad_last):
                m.d.sync += load_grad.eq(0)

        # ---- the sweeps: which layer, which kind, which slabs ----------------------------------
        # layer, pos = layer % c and seg = layer // c are counted, never divided.
        layer = Signal(range(p.max_layers))
        pos = Signal(range(c))
        seg = Signal(range(p.checkpoint_slabs + 1))
        backward = Signal()            # this sweep is a backward one
        recompute = Signal()           # a forward sweep of a segment's recomputation
        deciding = Signal()            # the cycle the next sweep is chosen
        setting = Signal()             # the cycle its addresses are registered
        issuing = Signal()
        draining = Signal()
        drain_left = Signal(range(p.drain + 1))
        finished_sweeps = Signal()

        # the first sweep: forward at 0, or backward at 0 when L = 1
        with m.If(loading & ~load_params & ~load_input & ~load_grad):
            m.d.sync += [loading.eq(0), setting.eq(1), layer.eq(0), pos.eq(0), seg.eq(0),
                         backward.eq(layers == 1), recompute.eq(0)]
        with m.If(ctl.accept):
            m.d.sync += finished_sweeps.eq(0)

        pos_up_wraps = pos + 1 == c
        with m.If(deciding):
            m.d.sync += [deciding.eq(0), setting.eq(1)]
            with m.If(~backward):
                # h_{l+1} is written: on to layer l + 1, forward or (at a segment's or the
                # forward pass's last activation) backward
                to_backward = Mux(recompute, pos + 2 == c, layer + 2 == layers)
                m.d.sync += [layer.eq(layer + 1), pos.eq(Mux(pos_up_wraps, 0, pos + 1)),
                             seg.eq(seg + pos_up_wraps), backward.eq(to_backward)]
                with m.If(to_backward):
                    m.d.sync += recompute.eq(0)
            with m.Elif(layer == 0):
                m.d.sync += [setting.eq(0), finished_sweeps.eq(1)]
            if c > 1:
                with m.Elif(pos == 0):
                    # a segment done: recompute the previous one from its checkpoint
                    m.d.sync += [layer.eq(layer - c), seg.eq(seg - 1), backward.eq(0),
                                 recompute.eq(1)]
            with m.Else():
                m.d.sync += [layer.eq(layer - 1), pos.eq(Mux(pos == 0, c - 1, pos - 1)),
                             seg.eq(seg - (pos == 0))]

        # set-up: the slabs' bases and the parameter row (constant strides)
        read_base = Signal(range(p.slabs * p.slab_words))
        write_base = Signal(range(p.slabs * p.slab_words))
        row_base = Signal(range(p.max_layers * p.max_beats))
        read_slab = Mux(pos == 0, seg, p.checkpoint_slabs + pos - 1)
        write_slab = Mux(pos_up_wraps, seg + 1, p.checkpoint_slabs + pos)
        last_layer_sweep = Signal()    # the backward sweep of layer 0: grad_input leaves
        token_last = Signal()
        token_first = Signal()
        token = Signal(range(p.max_tokens))
        beat = Signal(range(p.max_beats))
        slot = Signal.like(period)
        item = Signal(range(p.slab_words))
        # The issue's tests are registers, kept beside the counters as they step (no adder
        # before a compare in the issue's cycle): ``in_slot`` (issuing and slot < B),
        # ``slot_last`` (slot == period - 1), ``beat_last`` (beat == B - 1); they step
        # against B - 1, B - 2 (above), period - 2 and S - 2, registered at the run's begin
        # (signed: -1 matches nothing).
        in_slot = Signal()
        slot_last = Signal()
        beat_last = Signal()
        period_m2 = Signal(signed(len(period) + 1))
        tokens_m2 = Signal(signed(len(tokens) + 1))
        with m.If(ctl.begin):
            m.d.sync += [period_m2.eq(period - 2), tokens_m2.eq(tokens - 2)]
        with m.If(setting):
            # (slot 0 is never a token's last: period >= A + 2 > 1)
            m.d.sync += [setting.eq(0), issuing.eq(1),
                         read_base.eq(read_slab * p.slab_words),
                         write_base.eq(write_slab * p.slab_words),
                         row_base.eq(layer * p.max_beats),
                         last_layer_sweep.eq(backward & (layer == 0)),
                         token.eq(0), token_first.eq(1), token_last.eq(tokens == 1),
                         beat.eq(0), slot.eq(0), item.eq(0),
                         in_slot.eq(1), slot_last.eq(0), beat_last.eq(beats_one)]

        # ---- issue: token-major, B items in each period of a token ---------------------------
        grad_queue = m.submodules.grad_queue = CreditPipeline(p.grad_latency,
                                                              p.data_layout())
        sum_queue = m.submodules.sum_queue = CreditPipeline(p.sum_latency,
                                                            p.params_layout())
        wiring.connect(m, grad_queue.o, wiring.flipped(self.grad_input))
        wiring.connect(m, sum_queue.o, wiring.flipped(self.param_grad))
        wants_grad = last_layer_sweep
        wants_sum = backward & token_last
        grad_ok = ~wants_grad | grad_queue.i_ready
        sum_ok = ~wants_sum | sum_queue.i_ready
        issue = in_slot & grad_ok & sum_ok
        m.d.comb += [grad_queue.i_valid.eq(in_slot & wants_grad & sum_ok),
                     sum_queue.i_valid.eq(in_slot & wants_sum & grad_ok)]
        last_item = token_last & beat_last
        with m.If(issue):
            m.d.sync += item.eq(item + 1)
            with m.If(beat_last):
                m.d.sync += [beat.eq(0), beat_last.eq(beats_one)]
            with m.Else():
                m.d.sync += [beat.eq(beat + 1), beat_last.eq(beat == beats_m2)]
        with m.If(issuing & (issue | ~in_slot)):
            with m.If(issue & last_item):
                m.d.sync += [issuing.eq(0), in_slot.eq(0), draining.eq(1),
                             drain_left.eq(p.drain - 1)]
            with m.Elif(slot_last):
                m.d.sync += [slot.eq(0), slot_last.eq(0), in_slot.eq(1),
                             token.eq(token + 1), token_first.eq(0),
                             token_last.eq(token == tokens_m2)]
            with m.Else():
                m.d.sync += [slot.eq(slot + 1), slot_last.eq(slot == period_m2),
                             in_slot.eq(in_slot & (slot != beats_m1))]
        with m.If(draining):
            m.d.sync += drain_left.eq(drain_left - 1)
            with m.If(drain_left == 0):
                m.d.sync += [draining.eq(0), deciding.eq(1)]

        # ---- the datapath (free running) -------------------------------------------------------
        m.d.comb += [params_mem.read_addr.eq(row_base + beat), params_mem.read_en.eq(1),
                     acts.read_addr.eq(read_base + item), acts.read_en.eq(1),
                     grads.read_addr.eq(item), grads.read_en.eq(1)]
        read = READ_LATENCY
        valid_r = delay(m, issue, read, 1, name="valid_r")
        first_r = delay(m, token_first, read, 1, name="first_r", reset_less=True)
        # a register after each memory: the activations' row multiplexer (a memory deeper
        # than one row of DP16KD blocks) then ends in it, not in the multipliers' first stage
        h = p.lanes_layout()(delay(m, acts.read_data[0].as_value(), 1, 1, name="h_read",
                                   reset_less=True))
        g = p.lanes_layout()(delay(m, grads.read_data[0].as_value(), 1, 1, name="g_read",
                                   reset_less=True))
        layer_params = p.params_layout()(delay(m, params_mem.read_data[0].as_value(), 1, 1,
                                               name="params_read", reset_less=True))

        step = m.submodules.layer = AffineLayerStep(p)
        m.d.comb += [step.carry.eq(h), step.x.eq(layer_params), step.relu.eq(relu)]
        f = p.forward_latency
        h_next = step.carry_next
        # forward sweeps: h_{l+1} into its slab
        write_addr_f = delay(m, write_base + item, f, 1, name="write_addr_f", reset_less=True)
        valid_f = delay(m, valid_r, p.latency, 1, name="valid_f")
        forward_f = delay(m, ~backward, f, 1, name="forward_f", reset_less=True)
        # the operands of the backward part, beside the forward layer and the mask
        g_k = delay(m, g.as_value(), p.latency + MASK_LATENCY - 1, 1, name="g_k",
                    reset_less=True)
        h_m = delay(m, h.as_value(), p.latency + MASK_LATENCY, 1, name="h_m", reset_less=True)
        a_m = delay(m, layer_params.scale.as_value(), p.latency + MASK_LATENCY, 1, name="a_m",
                    reset_less=True)
        relu_f = delay(m, relu, f + 1, 1, name="relu_f")

        # the input load and the forward sweeps share the activations' write port
        m.d.comb += [
            acts.write_addr.eq(Mux(loading, input_count, write_addr_f)),
            acts.write_data[0].eq(Mux(loading, self.input.payload.data, h_next)),
            acts.write_en.eq(Mux(loading, take_input, valid_f & forward_f)),
        ]

        # the mask (MASK_LATENCY registers): g_pre = +0.0 where relu's result is +0.0
        h_next_r = Signal(p.lanes_layout(), name="h_next_r")
        m.d.sync += h_next_r.eq(h_next)
        blocked = Signal(p.lanes, name="blocked")
        g_pre = Signal(p.lanes_layout(), name="g_pre")
        g_k_lanes = data.ArrayLayout(p.fmt.width, p.lanes)(g_k)
        for lane in range(p.lanes):
            m.d.sync += [blocked[lane].eq(relu_f & (h_next_r[lane] == 0)),
                         g_pre[lane].eq(Mux(blocked[lane], 0, g_k_lanes[lane]))]
        a_m_lanes = data.ArrayLayout(p.fmt.width, p.lanes)(a_m)
        h_m_lanes = data.ArrayLayout(p.fmt.width, p.lanes)(h_m)
        g_pre_g = data.ArrayLayout(p.fmt.width, p.lanes)(
            delay(m, g_pre.as_value(), p.mul_latency, 1, name="g_pre_g", reset_less=True))

        g_new = Signal(p.lanes_layout(), name="g_new")
        grad_scale = Signal(p.lanes_layout(), name="grad_scale_sum")
        grad_bias = Signal(p.lanes_layout(), name="grad_bias_sum")

        # the accumulators: B beats of (scale, bias) sums, read as the products arrive
        gl = p.grad_latency
        valid_g = delay(m, valid_r, gl - read, 1, name="valid_g")
        backward_g = delay(m, backward, gl, 1, name="backward_g", reset_less=True)
        # the accumulator is read a cycle ahead, into a register (+0.0 for the first token):
        # the read's address-to-data path then ends there, not in the adders
        first_early = delay(m, first_r, gl - read - 1, 1, name="first_early",
                            reset_less=True)
        beat_early = delay(m, beat, gl - 1, 1, name="beat_early", reset_less=True)
        beat_g = delay(m, beat_early, 1, 1, name="beat_g", reset_less=True)
        item_g = delay(m, item, gl, 1, name="item_g", reset_less=True)
        sums_layout = p.params_layout()
        acc = m.submodules.accumulators = memory.Memory(shape=sums_layout,
                                                        depth=max(p.max_beats, 2), init=[])
        acc_read = acc.read_port(domain="comb")
        acc_write = acc.write_port()
        m.d.comb += acc_read.addr.eq(beat_early)
        running = Signal(sums_layout, name="running_sums")
        m.d.sync += running.eq(Mux(first_early, 0, acc_read.data))
        for lane in range(p.lanes):
            mul_grad = m.submodules[f"mul_grad{lane}"] = FloatMultiplierCore(
                p.format, p.mul_latency, dsp=p.dsp)
            mul_scale = m.submodules[f"mul_scale{lane}"] = FloatMultiplierCore(
                p.format, p.mul_latency, dsp=p.dsp)
            add_scale = m.submodules[f"add_scale{lane}"] = FloatAdderCore(p.format,
                                                                          p.add_latency)
            add_bias = m.submodules[f"add_bias{lane}"] = FloatAdderCore(p.format,
                                                                        p.add_latency)
            m.d.comb += [
                mul_grad.a.eq(g_pre[lane]), mul_grad.b.eq(a_m_lanes[lane]), mul_grad.en.eq(1),
                mul_scale.a.eq(g_pre[lane]), mul_scale.b.eq(h_m_lanes[lane]),
                mul_scale.en.eq(1),
                g_new[lane].eq(mul_grad.product),
                # the first token adds to +0.0: the sums start from +0.0
                add_scale.a.eq(running.scale[lane]),
                add_scale.b.eq(mul_scale.product), add_scale.en.eq(1),
                add_bias.a.eq(running.bias[lane]),
                add_bias.b.eq(g_pre_g[lane]), add_bias.en.eq(1),
                grad_scale[lane].eq(add_scale.sum), grad_bias[lane].eq(add_bias.sum),
            ]
        # backward sweeps: g_pre * a_l back into g, the new sums into the accumulators
        z = p.sum_latency
        valid_z = delay(m, valid_g, p.add_latency, 1, name="valid_z")
        backward_z = delay(m, backward_g, p.add_latency, 1, name="backward_z",
                           reset_less=True)
        beat_z = delay(m, beat_g, p.add_latency, 1, name="beat_z", reset_less=True)
        m.d.comb += [
            acc_write.addr.eq(beat_z), acc_write.en.eq(valid_z & backward_z),
            acc_write.data.scale.eq(grad_scale), acc_write.data.bias.eq(grad_bias),
            grads.write_addr.eq(Mux(loading, grad_count, item_g)),
            grads.write_data[0].eq(Mux(loading, self.grad_output.payload.data, g_new)),
            grads.write_en.eq(Mux(loading, take_grad, valid_g & backward_g)),
            grad_queue.payload.data.eq(g_new),
            sum_queue.payload.scale.eq(grad_scale), sum_queue.payload.bias.eq(grad_bias),
        ]
        assert z == gl + p.add_latency

        m.d.comb += ctl.finished.eq(ctl.running & finished_sweeps & ~grad_queue.busy &
                                    ~sum_queue.busy)
        return m
