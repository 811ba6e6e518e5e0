"""The pieces every IEEE-754 unit shares: unpack, normalise, round-and-pack, stage registers.

Each datapath helper is a Python function that adds combinational logic to a :class:`Module`
and returns the values it computed, so a unit can be cut into pipeline stages anywhere between
helpers (:class:`StageRegisters` puts ``en``-gated registers on a named boundary).
:class:`FloatCore` (ports, parameter checks, latency) and :class:`FloatStreamUnit` (the core
behind :class:`~moe_hw.stream.pipeline.PipelineControl` as a stream unit) are the common
bases of the multiplier and the adder.

Conventions shared by the helpers:

* An unpacked operand has a biased exponent and a significand of ``mant_bits + 1`` bits whose
  top bit is the hidden bit. Subnormals (and zero) get exponent 1 and no hidden bit, so
  ``value = significand * 2**(exponent - bias - mant_bits)`` holds for every finite operand.
* An unrounded result is ``(sign, exponent, significand)`` where ``exponent`` is a signed,
  biased exponent wider than the format's and ``significand`` is ``W`` bits wide with the
  binary point after its top bit: ``value = significand * 2**(exponent - bias - (W - 1))``.
  Bits below the format's fraction are guard and sticky bits; the lowest bit may be a sticky
  bit (the OR of everything shifted out below it).
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..formats import float_format
from ..params import check_int
from ..stream.pipeline import PipelineControl, delay

__all__ = [
    "FloatCore", "FloatStreamUnit", "operand_layout", "result_layout",
    "pipeline_depth", "allocate_stages", "StageRegisters",
    "unpack", "leading_zeros", "normalise", "compress", "shift_right_sticky",
    "round_and_pack",
]


def pipeline_depth(stages, name="stages"):
    """Validate a pipeline depth ``name``: an integer from 0 to 16."""
    return check_int(name, stages, minimum=0, maximum=16)


def operand_layout(fmt):
    """Input payload of the two-operand stream units: ``a`` in the low bits, then ``b``."""
    fmt = float_format(fmt)
    return data.StructLayout({"a": fmt.width, "b": fmt.width})


def result_layout(fmt, name):
    """Output payload of the stream units: one field, ``name``."""
    fmt = float_format(fmt)
    return data.StructLayout({name: fmt.width})


class FloatCore(wiring.Component):
    """Base of the two-operand pipelines: ports ``a``, ``b``, ``en`` and the result.

    Subclasses set ``result_name`` (the output port) and ``default_stages`` (per format name)
    and build the datapath in ``elaborate``. Every register loads when ``en`` is high;
    ``latency == stages``.
    """

    result_name = None
    default_stages = None
    stages_name = "stages"       # the depth's name in the vocabulary: mul_stages, add_stages

    def __init__(self, format, stages=None):
        self._fmt = float_format(format)
        self._stages = (self.default_stages[self._fmt.name] if stages is None
                        else pipeline_depth(stages, self.stages_name))
        width = self._fmt.width
        super().__init__({
            "a": In(width),
            "b": In(width),
            "en": In(1),
            self.result_name: Out(width),
        })

    @property
    def format(self):
        return self._fmt

    @property
    def stages(self):
        return self._stages

    @property
    def latency(self):
        return self._stages


class FloatStreamUnit(wiring.Component):
    """Base of the stream units: a :class:`FloatCore` driven by :class:`PipelineControl`.

    ``i`` carries :func:`operand_layout` (``a`` low, ``b`` high), ``o`` carries
    :func:`result_layout` with the core's result field. Latency ``stages`` cycles, one result
    per cycle; the pipeline stalls only when its output holds a result the consumer has not
    taken, and ``o.valid`` never depends on ``o.ready``. With ``stages == 0`` the unit is
    combinational (``i.ready`` is ``o.ready``, ``o.valid`` is ``i.valid``).

    Subclasses set ``core_class``.
    """

    core_class = None

    def __init__(self, format, stages=None):
        self._fmt = float_format(format)
        self._stages = (self.core_class.default_stages[self._fmt.name] if stages is None
                        else pipeline_depth(stages, self.core_class.stages_name))
        super().__init__({
            "i": In(stream.Signature(operand_layout(self._fmt))),
            "o": Out(stream.Signature(result_layout(self._fmt, self.core_class.result_name))),
        })

    @property
    def format(self):
        return self._fmt

    @property
    def stages(self):
        return self._stages

    @property
    def latency(self):
        return self._stages

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core_class(self._fmt, self._stages)
        m.submodules.control = control = PipelineControl(self._stages)
        result = self.core_class.result_name
        m.d.comb += [
            control.i_valid.eq(self.i.valid),
            control.o_ready.eq(self.o.ready),
            self.i.ready.eq(control.en),
            core.en.eq(control.en),
            core.a.eq(self.i.payload.a),
            core.b.eq(self.i.payload.b),
            self.o.valid.eq(control.o_valid),
            self.o.payload[result].eq(getattr(core, result)),
        ]
        return m


def allocate_stages(stages, priority, extra):
    """How many registers each boundary gets for a pipeline of ``stages`` registers.

    ``priority`` lists the boundaries in the order they get their first register; every
    register beyond ``len(priority)`` goes to the boundary ``extra``.
    """
    counts = {name: 0 for name in priority}
    for index in range(stages):
        counts[priority[index] if index < len(priority) else extra] += 1
    return counts


class StageRegisters:
    """Put ``counts[name]`` register stages, loading when ``en`` is high, on each boundary."""

    def __init__(self, m, en, counts):
        self._m = m
        self._en = en
        self._counts = dict(counts)

    def boundary(self, name, **values):
        """The ``values`` as seen after boundary ``name`` (unchanged if it has no register)."""
        count = self._counts[name]
        return SimpleNamespace(**{
            key: delay(self._m, value, count, self._en, name=f"{name}_{key}")
            for key, value in values.items()
        })


def unpack(m, fmt, bits, *, name):
    """Split a raw bit pattern into sign, biased exponent, significand and class flags.

    Subnormals get exponent 1 and no hidden bit (see the module docstring); zero is a
    subnormal with significand 0 as far as the arithmetic goes, and is also flagged.
    """
    frac = bits[:fmt.mant_bits]
    exp_field = bits[fmt.mant_bits:fmt.mant_bits + fmt.exp_bits]
    exp_zero = exp_field == 0
    exp_ones = exp_field == fmt.exp_max

    out = SimpleNamespace(
        sign=Signal(name=f"{name}_sign"),
        exponent=Signal(fmt.exp_bits, name=f"{name}_exponent"),
        significand=Signal(fmt.mant_bits + 1, name=f"{name}_significand"),
        magnitude=Signal(fmt.width - 1, name=f"{name}_magnitude"),
        zero=Signal(name=f"{name}_zero"),
        subnormal=Signal(name=f"{name}_subnormal"),
        inf=Signal(name=f"{name}_inf"),
        nan=Signal(name=f"{name}_nan"),
    )
    m.d.comb += [
        out.sign.eq(bits[fmt.width - 1]),
        out.exponent.eq(Mux(exp_zero, 1, exp_field)),
        out.significand.eq(Cat(frac, ~exp_zero)),
        out.magnitude.eq(bits[:fmt.width - 1]),
        out.zero.eq(exp_zero & (frac == 0)),
        out.subnormal.eq(exp_zero & (frac != 0)),
        out.inf.eq(exp_ones & (frac == 0)),
        out.nan.eq(exp_ones & (frac != 0)),
    ]
    return out


def _leading_zeros_pow2(value):
    # A balanced tree: (any bit set, leading zeros when one is) for a power-of-two width.
    if len(value) == 2:
        return value.any(), ~value[1]
    half = len(value) // 2
    hi_any, hi_count = _leading_zeros_pow2(value[half:])
    lo_any, lo_count = _leading_zeros_pow2(value[:half])
    return hi_any | lo_any, Cat(Mux(hi_any, hi_count, lo_count), ~hi_any)


def leading_zeros(m, value, *, name):
    """The number of leading zeros of ``value`` (``len(value)`` when it is zero)."""
    width = len(value)
    # Pad below the LSB with a single one, then zeros, to a power of two: the padded word is
    # never zero and its leading-zero count is exactly the answer, zero input included.
    padded_width = 1 << ceil_log2(width + 1)
    padded = Cat(Const(0, padded_width - width - 1), Const(1, 1), value)
    count = Signal(range(width + 1), name=name)
    m.d.comb += count.eq(_leading_zeros_pow2(padded)[1])
    return count


def normalise(m, exponent, significand, *, name):
    """Shift ``significand`` left until its top bit is set, but not below exponent 1.

    Returns ``(exponent, significand)`` with the same value. If ``exponent`` would drop below
    1 the shift stops there and the result is a subnormal (exponent 1, top bit clear); an
    exponent already below 1 is left for :func:`round_and_pack` to denormalise.
    """
    width = len(significand)
    zeros = leading_zeros(m, significand, name=f"{name}_zeros")
    room = Signal(range(width + 1), name=f"{name}_room")  # min(exponent - 1, width), >= 0
    m.d.comb += room.eq(Mux(exponent < 1, 0, Mux(exponent > width, width, exponent - 1)))
    shift = Signal(range(width + 1), name=f"{name}_shift")
    m.d.comb += shift.eq(Mux(zeros < room, zeros, room))

    out_exponent = Signal(signed(len(exponent) + 1), name=f"{name}_exponent")
    out_significand = Signal(width, name=f"{name}_significand")
    m.d.comb += [
        out_exponent.eq(exponent - shift),
        out_significand.eq((significand << shift)[:width]),
    ]
    return out_exponent, out_significand


def compress(m, significand, width, *, name):
    """Keep the top ``width - 1`` bits of ``significand``; the last bit ORs all the rest."""
    if len(significand) <= width:
        return Cat(Const(0, width - len(significand)), significand)
    drop = len(significand) - (width - 1)
    out = Signal(width, name=name)
    m.d.comb += out.eq(Cat(significand[:drop].any(), significand[drop:]))
    return out


def shift_right_sticky(m, value, amount, *, name):
    """``value >> amount`` with the shifted-out bits ORed into the result's lowest bit.

    ``amount`` must not exceed ``len(value)``.
    """
    width = len(value)
    wide = Signal(2 * width, name=f"{name}_wide")
    m.d.comb += wide.eq(Cat(Const(0, width), value) >> amount)
    out = Signal(width, name=name)
    m.d.comb += out.eq(Cat(wide[width] | wide[:width].any(), wide[width + 1:]))
    return out


def round_and_pack(m, fmt, sign, exponent, significand, *, nan, inf, name="round"):
    """Round an unrounded result to nearest, ties to even, and pack it into ``fmt``'s bits.

    ``significand`` (at least ``mant_bits + 2`` bits) must be normalised (top bit set) unless
    ``exponent <= 1``: the subnormal range has a fixed grid, so leading zeros do no harm
    there. Handles gradual
    underflow (``exponent < 1`` is shifted right into the subnormal range, collecting a sticky
    bit), a carry that rounds into the next binade (subnormal into the smallest normal,
    largest finite into Inf) and overflow to Inf. A zero significand packs to a zero of the
    given sign. ``nan`` selects the canonical quiet NaN, ``inf`` an Inf of sign ``sign``.
    """
    mant_bits = fmt.mant_bits
    width = len(significand)
    assert width >= mant_bits + 2

    # Gradual underflow: shifting by more than mant_bits + 2 leaves nothing but sticky.
    max_shift = mant_bits + 2
    underflow_shift = Signal(range(max_shift + 1), name=f"{name}_underflow_shift")
    m.d.comb += underflow_shift.eq(
        Mux(exponent < 1 - max_shift, max_shift, Mux(exponent < 1, 1 - exponent, 0)))
    # One extra sticky bit at the bottom so the shifted-out bits are not lost.
    aligned = shift_right_sticky(m, Cat(Const(0, 1), significand), underflow_shift,
                                 name=f"{name}_aligned")

    kept = aligned[-(mant_bits + 1):]                      # hidden bit and fraction
    guard = aligned[-(mant_bits + 2)]
    sticky = aligned[:-(mant_bits + 2)].any()
    round_up = guard & (sticky | kept[0])

    normal = kept[mant_bits]
    # For a normal result exponent is in 1..exp_max-1 here (overflow is handled below); a
    # subnormal or zero packs with exponent field 0.
    exp_field = Mux(normal, exponent[:fmt.exp_bits], 0)
    # Exponent and fraction side by side: a carry out of the fraction bumps the exponent,
    # which turns the largest subnormal into the smallest normal and the largest finite
    # number into Inf, both correctly.
    magnitude = Signal(fmt.width - 1, name=f"{name}_magnitude")
    m.d.comb += magnitude.eq(Cat(kept[:mant_bits], exp_field) + round_up)

    overflow = normal & (exponent >= fmt.exp_max)
    inf_bits = Const(fmt.exp_max << mant_bits, fmt.width - 1)
    packed = Signal(fmt.width, name=f"{name}_packed")
    m.d.comb += packed.eq(Mux(nan, fmt.quiet_nan,
                              Cat(Mux(inf | overflow, inf_bits, magnitude), sign)))
    return packed
