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

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..formats import float_format
from ..params import check_int
from ..stream.pipeline import PipelineControl, delay

__all__ = [
    "FloatCore", "FloatStreamUnit", "operand_layout", "result_layout",
    "pipeline_depth", "allocate_stages", "StageRegisters",
    "unpack", "leading_zeros", "leading_zeros_groups", "leading_zeros_combine",
    "shift_right_sticky_step", "shift_left_step", "shift_bits", "round_prepare", "round_pack",
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

    def __init__(self, format, stages=None, **core_options):
        self._core_options = core_options   # more keyword arguments of the core (``dsp``)
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
        m.submodules.core = core = self.core_class(self._fmt, self._stages,
                                                   **self._core_options)
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

    def count(self, name):
        """How many registers boundary ``name`` has."""
        return self._counts[name]

    def boundary(self, name, **values):
        """The ``values`` as seen after boundary ``name`` (unchanged if it has no register)."""
        count = self.count(name)
        return SimpleNamespace(**{
            key: delay(self._m, value, count, self._en, name=f"{name}_{key}",
                       reset_less=True)
            for key, value in values.items()
        })


def unpack(m, fmt, bits, *, name, raw_exponent=False):
    """Split a raw bit pattern into sign, biased exponent, significand and class flags.

    Subnormals get exponent 1 and no hidden bit (see the module docstring); zero is a
    subnormal with significand 0 as far as the arithmetic goes, and is also flagged. With
    ``raw_exponent`` the exponent is the field itself (no mux in front of exponent
    arithmetic) and a subnormal's significand is its fraction shifted left by one instead:
    ``value = significand * 2**(exponent - bias - mant_bits)`` holds either way.

    Besides the flags ``zero``, ``subnormal``, ``inf`` and ``nan``, the parts they are made
    of (``exp_zero``, ``exp_ones``, ``frac_zero``) are returned, so that a pipeline can
    register those and combine them a stage later.
    """
    frac = bits[:fmt.mant_bits]
    exp_field = bits[fmt.mant_bits:fmt.mant_bits + fmt.exp_bits]

    out = SimpleNamespace(
        sign=Signal(name=f"{name}_sign"),
        exponent=Signal(fmt.exp_bits, name=f"{name}_exponent"),
        significand=Signal(fmt.mant_bits + 1, name=f"{name}_significand"),
        magnitude=Signal(fmt.width - 1, name=f"{name}_magnitude"),
        exp_zero=Signal(name=f"{name}_exp_zero"),
        exp_ones=Signal(name=f"{name}_exp_ones"),
        frac_zero=Signal(name=f"{name}_frac_zero"),
        zero=Signal(name=f"{name}_zero"),
        subnormal=Signal(name=f"{name}_subnormal"),
        inf=Signal(name=f"{name}_inf"),
        nan=Signal(name=f"{name}_nan"),
    )
    m.d.comb += [
        out.exp_zero.eq(exp_field == 0),
        out.exp_ones.eq(exp_field == fmt.exp_max),
        out.frac_zero.eq(frac == 0),
        out.sign.eq(bits[fmt.width - 1]),
        out.magnitude.eq(bits[:fmt.width - 1]),
        out.zero.eq(out.exp_zero & out.frac_zero),
        out.subnormal.eq(out.exp_zero & ~out.frac_zero),
        out.inf.eq(out.exp_ones & out.frac_zero),
        out.nan.eq(out.exp_ones & ~out.frac_zero),
    ]
    if raw_exponent:
        m.d.comb += [
            out.exponent.eq(exp_field),
            out.significand.eq(Mux(out.exp_zero, frac << 1, Cat(frac, 1))),
        ]
    else:
        m.d.comb += [
            out.exponent.eq(Mux(out.exp_zero, 1, exp_field)),
            out.significand.eq(Cat(frac, ~out.exp_zero)),
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


def leading_zeros_groups(m, value, *, name, group=4):
    """First step of a leading-zero count that can be split by a register: for each group of
    ``group`` bits (a power of two), whether it has a one (``any``, one bit per group) and its
    own leading zeros (``counts``, ``log2(group)`` bits per group). Finish with
    :func:`leading_zeros_combine`. Wider groups put more of the count before the register
    (a group of 8 is two LUT levels) and leave a shallower tree after it."""
    if group < 2 or group & (group - 1):
        raise ValueError(f"group must be a power of two of at least 2, not {group}")
    width = len(value)
    count_bits = ceil_log2(group)
    groups = 1 << ceil_log2(-(-(width + 1) // group))
    # Pad below the LSB with a single one, then zeros: the padded word is never zero and its
    # leading-zero count is exactly the answer, zero input included.
    padded = Cat(Const(0, groups * group - width - 1), Const(1, 1), value)
    any_ = Signal(groups, name=f"{name}_any")
    counts = Signal(count_bits * groups, name=f"{name}_counts")
    for index in range(groups):
        chunk = padded[index * group:(index + 1) * group]
        chunk_any, chunk_count = _leading_zeros_pow2(chunk)
        m.d.comb += [any_[index].eq(chunk_any),
                     counts[count_bits * index:count_bits * (index + 1)].eq(chunk_count)]
    return any_, counts


def leading_zeros_combine(m, any_, counts, width, *, name):
    """Second step: the leading zeros of the ``width``-bit value given its groups (the group
    size follows from ``len(counts) // len(any_)``)."""
    count_bits = len(counts) // len(any_)

    def tree(low, high):
        if high - low == 1:
            return any_[low], counts[count_bits * low:count_bits * (low + 1)]
        middle = (low + high) // 2
        high_any, high_count = tree(middle, high)
        low_any, low_count = tree(low, middle)
        return high_any | low_any, Cat(Mux(high_any, high_count, low_count), ~high_any)

    count = Signal(range(width + 1), name=name)
    m.d.comb += count.eq(tree(0, len(any_))[1])
    return count


def leading_zeros(m, value, *, name):
    """The number of leading zeros of ``value`` (``len(value)`` when it is zero)."""
    any_, counts = leading_zeros_groups(m, value, name=f"{name}_groups")
    return leading_zeros_combine(m, any_, counts, len(value), name=name)


def shift_right_sticky_step(m, value, sticky, amount, bits, *, name, inverted_amount=None):
    """One step of a pipelined right shift: ``value >> (amount & mask)`` for the ``bits`` of
    ``amount`` (indices), with every bit shifted out ORed into ``sticky``.

    Returns ``(value, sticky)``, both plain signals so a :class:`StageRegisters` boundary can
    follow. Applying the steps for every bit of ``amount`` in any order gives the full shift;
    the sticky bit is kept apart until :func:`round_prepare` folds it in.

    ``inverted_amount``, when given, is a second register holding ``~amount``: it drives the
    upper half of the result and the sticky bit, ``amount`` the lower half, so that neither
    drives every bit of the shifter. (A copy that held ``amount`` itself would be merged with
    it by Yosys's ``opt_merge``.)
    """
    width = len(value)
    half = width // 2
    high_amount = amount if inverted_amount is None else ~inverted_amount
    for bit in bits:
        distance = 1 << bit
        lost = value[:min(distance, width)].any()
        moved = Cat(value[distance:], Const(0, min(distance, width)))     # value >> distance
        shifted = Signal(width, name=f"{name}_{bit}")
        new_sticky = Signal(name=f"{name}_{bit}_sticky")
        m.d.comb += [
            shifted.eq(Cat(Mux(amount[bit], moved[:half], value[:half]),
                           Mux(high_amount[bit], moved[half:], value[half:]))),
            new_sticky.eq(sticky | (high_amount[bit] & lost)),
        ]
        value, sticky = shifted, new_sticky
    return value, sticky


def shift_left_step(m, value, amount, bits, *, name):
    """One step of a pipelined left shift: ``value << (amount & mask)`` for the ``bits`` of
    ``amount`` (indices), keeping the width of ``value``."""
    width = len(value)
    for bit in bits:
        shifted = Signal(width, name=f"{name}_{bit}")
        m.d.comb += shifted.eq(Mux(amount[bit], (value << (1 << bit))[:width], value))
        value = shifted
    return value


def shift_bits(max_shift, coarse=2):
    """The bits of a shift amount up to ``max_shift`` split into a coarse step (the top
    ``coarse`` bits, but at most all but one) and a fine step (the rest)."""
    bits = list(range(max(1, int(max_shift).bit_length())))[::-1]
    fine = max(len(bits) - coarse, 1)
    return bits[:len(bits) - fine], bits[len(bits) - fine:]


def round_prepare(m, fmt, exponent, significand, sticky, *, sign, nan, inf, at_max=None,
                  name="round"):
    """The first half of rounding to nearest, ties to even: which way to round, and the
    unrounded exponent field and fraction side by side, with the special cases already in.

    ``significand`` (at least ``mant_bits + 2`` bits, binary point after its top bit) must be
    normalised (top bit set) unless it is a subnormal already on the format's grid, i.e.
    ``exponent`` is 1 (or below, with the significand already shifted right into place);
    ``sticky`` is the OR of anything shifted out below it. Returns ``sign``, ``magnitude``
    (exponent field and fraction, before the increment) and ``round_up``. ``nan`` selects the
    canonical quiet NaN, ``inf`` or a normal result at or past ``exp_max`` (overflow) an Inf
    of sign ``sign``; both with ``round_up`` low, so that :func:`round_pack` is the increment
    alone and nothing sits between its carry chain and the register after it. ``at_max``,
    when given, is ``exponent >= exp_max`` computed a stage earlier (the compare's carry chain
    then stays out of this stage).
    """
    mant_bits = fmt.mant_bits
    assert len(significand) >= mant_bits + 2
    kept = significand[-(mant_bits + 1):]                  # hidden bit and fraction
    guard = significand[-(mant_bits + 2)]
    rest = significand[:-(mant_bits + 2)].any() | sticky
    normal = kept[mant_bits]
    out = SimpleNamespace(
        sign=Signal(name=f"{name}_sign"),
        magnitude=Signal(fmt.width - 1, name=f"{name}_magnitude"),
        round_up=Signal(name=f"{name}_up"),
    )
    # For a normal result the exponent is in 1..exp_max-1 here (overflow aside); a subnormal
    # or zero packs with exponent field 0.
    overflow = normal & (exponent >= fmt.exp_max if at_max is None else at_max)
    inf_bits = Const(fmt.exp_max << fmt.mant_bits, fmt.width - 1)
    nan_bits = Const(fmt.quiet_nan, fmt.width)
    m.d.comb += [
        out.sign.eq(Mux(nan, nan_bits[-1], sign)),
        out.magnitude.eq(Mux(nan, nan_bits[:-1], Mux(
            inf | overflow, inf_bits,
            Cat(kept[:mant_bits], Mux(normal, exponent[:fmt.exp_bits], 0))))),
        out.round_up.eq(guard & (rest | kept[0]) & ~nan & ~inf & ~overflow),
    ]
    return out


def round_pack(m, fmt, sign, magnitude, round_up, *, name="round"):
    """The second half of rounding: the increment. Exponent field and fraction are
    incremented together: a carry out of the fraction bumps the exponent, which turns the
    largest subnormal into the smallest normal and the largest finite number into Inf, both
    correctly. (The special cases are in :func:`round_prepare`'s operands already; a zero
    magnitude packs to a signed zero.)"""
    rounded = Signal(fmt.width - 1, name=f"{name}_rounded")
    m.d.comb += rounded.eq(magnitude + round_up)
    packed = Signal(fmt.width, name=f"{name}_packed")
    m.d.comb += packed.eq(Cat(rounded, sign))
    return packed
