"""IEEE-754 adder: round to nearest even, subnormals in and out, bit-exact against NumPy."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed

from .float_core import (FloatCore, FloatStreamUnit, StageRegisters, allocate_stages,
                         normalise, round_and_pack, shift_right_sticky, unpack)

__all__ = ["FloatAdderCore", "FloatAdder", "DEFAULT_ADDER_STAGES"]

#: Default pipeline depth per format: align + add | normalise | round, and for fp32 one more
#: register after the operand swap, ahead of the 27-bit alignment shifter and adder.
DEFAULT_ADDER_STAGES = {"fp32": 4, "fp16": 3, "bf16": 3}

# Register boundaries in the order they receive a register as ``stages`` grows; registers
# beyond the fourth all go after the add.
_BOUNDARY_PRIORITY = ("sum", "normalised", "rounded", "operands")
_EXTRA_BOUNDARY = "sum"


class FloatAdderCore(FloatCore):
    """``sum = a + b`` in ``format`` (fp32, fp16 or bf16), a pure pipeline.

    Ports ``a``, ``b``, ``en`` in and ``sum`` out, all raw bit patterns. Every register loads
    when ``en`` is high; ``sum`` is the result for the operands presented
    ``latency == stages`` enabled cycles earlier (``stages == 0``: combinational; default
    :data:`DEFAULT_ADDER_STAGES`). One result per enabled cycle.

    Semantics: IEEE-754 round to nearest, ties to even; subnormal operands and results (no
    flush to zero); overflow to Inf. An exact zero sum is +0 unless both operands are -0
    (``x + -x = +0``, ``+0 + -0 = +0``, ``-0 + -0 = -0``). ``Inf - Inf`` and any NaN operand
    give the canonical quiet NaN. Bit-exact against NumPy / ml_dtypes.

    Datapath: the operands are ordered by magnitude (comparing their bit patterns without the
    sign), the smaller significand is shifted right by the exponent difference keeping guard,
    round and sticky bits, the two are added or subtracted, the sum is normalised (leading-zero
    count, left shift, stopping at the subnormal range) and rounded.

    Register placement, filled in this order as ``stages`` grows:

    1. after alignment and the add (``sum``);
    2. after normalisation (``normalised``);
    3. after rounding and packing: a registered output (``rounded``);
    4. after unpacking and ordering the operands (``operands``);
    5. and beyond: more registers after the add (``sum``).
    """

    result_name = "sum"
    stages_name = "add_stages"
    default_stages = DEFAULT_ADDER_STAGES

    def elaborate(self, platform):
        m = Module()
        fmt = self._fmt
        mant_bits = fmt.mant_bits
        regs = StageRegisters(m, self.en, allocate_stages(
            self._stages, _BOUNDARY_PRIORITY, _EXTRA_BOUNDARY))

        a = unpack(m, fmt, self.a, name="a")
        b = unpack(m, fmt, self.b, name="b")
        # x is the operand of larger magnitude: it gives the result its sign and exponent.
        swap = b.magnitude > a.magnitude
        subtract = a.sign ^ b.sign
        cancel = subtract & (a.magnitude == b.magnitude)     # exactly zero: +0 under RNE
        ops = regs.boundary(
            "operands",
            sign=Mux(cancel, 0, Mux(swap, b.sign, a.sign)),
            subtract=subtract,
            exponent_x=Mux(swap, b.exponent, a.exponent),
            significand_x=Mux(swap, b.significand, a.significand),
            significand_y=Mux(swap, a.significand, b.significand),
            distance=Mux(swap, b.exponent - a.exponent, a.exponent - b.exponent)[:fmt.exp_bits],
            nan=a.nan | b.nan | (a.inf & b.inf & subtract),
            inf=a.inf | b.inf,
        )

        # Three bits below the significands (guard, round, sticky) are enough for a correctly
        # rounded sum; past mant_bits + 4 the smaller operand is all sticky.
        ext_width = mant_bits + 4
        max_shift = ext_width
        shift = Signal(range(max_shift + 1), name="align_shift")
        m.d.comb += shift.eq(Mux(ops.distance > max_shift, max_shift, ops.distance))
        x_ext = Cat(Const(0, 3), ops.significand_x)
        y_aligned = shift_right_sticky(m, Cat(Const(0, 3), ops.significand_y), shift,
                                       name="y_aligned")
        # |x| >= |y|, so the difference is never negative.
        total = Signal(ext_width + 1, name="total")
        m.d.comb += total.eq(Mux(ops.subtract, x_ext - y_aligned, x_ext + y_aligned))
        # total has its binary point after its top bit when the exponent is exponent_x + 1.
        exponent = Signal(signed(fmt.exp_bits + 2), name="sum_exponent")
        m.d.comb += exponent.eq(ops.exponent_x + 1)
        added = regs.boundary(
            "sum",
            sign=ops.sign, nan=ops.nan, inf=ops.inf, exponent=exponent, significand=total,
        )

        norm_exponent, norm_significand = normalise(m, added.exponent, added.significand,
                                                    name="normalise")
        norm = regs.boundary(
            "normalised",
            sign=added.sign, nan=added.nan, inf=added.inf, exponent=norm_exponent,
            significand=norm_significand,
        )

        packed = round_and_pack(m, fmt, norm.sign, norm.exponent, norm.significand,
                                nan=norm.nan, inf=norm.inf)
        out = regs.boundary("rounded", sum=packed)
        m.d.comb += self.sum.eq(out.sum)
        return m


class FloatAdder(FloatStreamUnit):
    """The stream unit ``fadd``: ``o.payload.sum = i.payload.a + i.payload.b``.

    Input payload ``{a, b}`` (``a`` in the low bits), output payload ``{sum}``. Latency
    ``stages`` cycles (default :data:`DEFAULT_ADDER_STAGES`), one result per cycle; the
    pipeline stalls only when its output holds a result the consumer has not taken, and
    ``o.valid`` never depends on ``o.ready``. Arithmetic as :class:`FloatAdderCore`.
    """

    core_class = FloatAdderCore
