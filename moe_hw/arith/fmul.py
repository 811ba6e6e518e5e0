"""IEEE-754 multiplier: round to nearest even, subnormals in and out, bit-exact against NumPy."""

from amaranth.hdl import Module, Signal, signed

from .float_core import (FloatCore, FloatStreamUnit, StageRegisters, allocate_stages, compress,
                         normalise, round_and_pack, unpack)

__all__ = ["FloatMultiplierCore", "FloatMultiplier", "DEFAULT_MULTIPLIER_STAGES"]

#: Default pipeline depth per format: unpack + multiply | normalise | round, and for fp32 one
#: more register in front of the multiplier, whose 24x24 product spans several DSP tiles.
DEFAULT_MULTIPLIER_STAGES = {"fp32": 4, "fp16": 3, "bf16": 3}

# Register boundaries in the order they receive a register as ``stages`` grows; registers
# beyond the fourth all go after the multiplier (for DSP output pipelining and retiming).
_BOUNDARY_PRIORITY = ("product", "normalised", "rounded", "operands")
_EXTRA_BOUNDARY = "product"


class FloatMultiplierCore(FloatCore):
    """``product = a * b`` in ``format`` (fp32, fp16 or bf16), a pure pipeline.

    Ports ``a``, ``b``, ``en`` in and ``product`` out, all raw bit patterns. Every register
    loads when ``en`` is high; ``product`` is the result for the operands presented
    ``latency == stages`` enabled cycles earlier (``stages == 0``: combinational; default
    :data:`DEFAULT_MULTIPLIER_STAGES`). One result per enabled cycle.

    Semantics: IEEE-754 round to nearest, ties to even; subnormal operands and results (no
    flush to zero); overflow to Inf; ``0 * Inf`` and any NaN operand give the canonical quiet
    NaN. Bit-exact against NumPy / ml_dtypes.

    Register placement, filled in this order as ``stages`` grows:

    1. after unpack and the significand multiply (``product``);
    2. after normalisation (``normalised``);
    3. after rounding and packing: a registered output (``rounded``);
    4. before the multiplier, after unpacking the operands (``operands``);
    5. and beyond: more registers after the multiply (``product``).
    """

    result_name = "product"
    stages_name = "mul_stages"
    default_stages = DEFAULT_MULTIPLIER_STAGES

    def elaborate(self, platform):
        m = Module()
        fmt = self._fmt
        mant_bits = fmt.mant_bits
        regs = StageRegisters(m, self.en, allocate_stages(
            self._stages, _BOUNDARY_PRIORITY, _EXTRA_BOUNDARY))

        a = unpack(m, fmt, self.a, name="a")
        b = unpack(m, fmt, self.b, name="b")
        ops = regs.boundary(
            "operands",
            sign=a.sign ^ b.sign,
            exponent_a=a.exponent, exponent_b=b.exponent,
            significand_a=a.significand, significand_b=b.significand,
            nan=a.nan | b.nan | (a.inf & b.zero) | (a.zero & b.inf),
            inf=a.inf | b.inf,
        )

        # The product of the significands has 2 * mant_bits + 2 bits with the binary point
        # after its top bit when the exponent is ea + eb - bias + 1.
        exponent = Signal(signed(fmt.exp_bits + 3), name="product_exponent")
        m.d.comb += exponent.eq(ops.exponent_a + ops.exponent_b - (fmt.bias - 1))
        prod = regs.boundary(
            "product",
            sign=ops.sign, nan=ops.nan, inf=ops.inf, exponent=exponent,
            significand=ops.significand_a * ops.significand_b,
        )

        # A subnormal operand leaves leading zeros; everything below the guard bit folds into
        # a sticky bit so only mant_bits + 4 bits go on to rounding.
        norm_exponent, norm_significand = normalise(m, prod.exponent, prod.significand,
                                                    name="normalise")
        norm = regs.boundary(
            "normalised",
            sign=prod.sign, nan=prod.nan, inf=prod.inf, exponent=norm_exponent,
            significand=compress(m, norm_significand, mant_bits + 4, name="normalise_sticky"),
        )

        packed = round_and_pack(m, fmt, norm.sign, norm.exponent, norm.significand,
                                nan=norm.nan, inf=norm.inf)
        out = regs.boundary("rounded", product=packed)
        m.d.comb += self.product.eq(out.product)
        return m


class FloatMultiplier(FloatStreamUnit):
    """The stream unit ``fmul``: ``o.payload.product = i.payload.a * i.payload.b``.

    Input payload ``{a, b}`` (``a`` in the low bits), output payload ``{product}``. Latency
    ``stages`` cycles (default :data:`DEFAULT_MULTIPLIER_STAGES`), one result per cycle; the
    pipeline stalls only when its output holds a result the consumer has not taken, and
    ``o.valid`` never depends on ``o.ready``. Arithmetic as :class:`FloatMultiplierCore`.
    """

    core_class = FloatMultiplierCore
