"""IEEE-754 multiplier: round to nearest even, subnormals in and out, bit-exact against NumPy."""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed

from ..params import check_choice
from .float_core import (FloatCore, FloatStreamUnit, StageRegisters, allocate_stages,
                         leading_zeros_combine, leading_zeros_groups, round_pack, round_prepare,
                         shift_bits, shift_left_step, shift_right_sticky_step, unpack)
from .product import DSP_TARGETS, DSP_WIDTH, dsp_tiles

__all__ = ["FloatMultiplierCore", "FloatMultiplier", "DEFAULT_MULTIPLIER_STAGES"]

#: Default pipeline depth per format: every register boundary of
#: :class:`FloatMultiplierCore` gets one register, so that no stage has more than a few LUT
#: levels and a carry chain (250 MHz or more on ECP5-85 speed 8 with ``dsp="ecp5"``).
DEFAULT_MULTIPLIER_STAGES = {"fp32": 15, "fp16": 15, "bf16": 15}

# Register boundaries in pipeline order, and the order in which they receive a register as
# ``stages`` grows: each new register cuts the longest remaining combinational path.
# Registers beyond the last all go on the output.
_BOUNDARIES = ("classified", "unpacked", "zeros", "x_coarse", "mul_staged", "mul_inputs",
               "mul_outputs", "mul_routed", "mul_partial",
               "product", "product_normalised", "denormalise_coarse", "denormalised",
               "round_prepared", "rounded")
_BOUNDARY_PRIORITY = ("mul_outputs", "denormalised", "rounded", "mul_inputs",
                      "product_normalised", "zeros", "product", "round_prepared",
                      "denormalise_coarse", "unpacked", "x_coarse", "mul_partial",
                      "classified", "mul_routed", "mul_staged")
_EXTRA_BOUNDARY = "rounded"
# Bits per group of the first step of x's leading-zero count, taken before the "classified"
# register: groups of 8 (two LUT levels there) leave a two-level tree after "unpacked".
_ZERO_GROUP = 8
assert sorted(_BOUNDARIES) == sorted(_BOUNDARY_PRIORITY)


class FloatMultiplierCore(FloatCore):
    """``product = a * b`` in ``format`` (fp32, fp16 or bf16), a pure pipeline.

    Ports ``a``, ``b``, ``en`` in and ``product`` out, all raw bit patterns. Every register
    loads when ``en`` is high; ``product`` is the result for the operands presented
    ``latency == stages`` enabled cycles earlier (``stages == 0``: combinational; default
    :data:`DEFAULT_MULTIPLIER_STAGES`). One result per enabled cycle.

    Semantics: IEEE-754 round to nearest, ties to even; subnormal operands and results (no
    flush to zero); overflow to Inf; ``0 * Inf`` and any NaN operand give the canonical quiet
    NaN. Bit-exact against NumPy / ml_dtypes.

    ``dsp`` selects how the significands are multiplied: ``"generic"`` (default) is a plain
    ``*``; ``"ecp5"`` instantiates MULT18X18D blocks (four for fp32, as 18+6 by 18+6 bits,
    one otherwise) whose input and output registers are the ``mul_inputs`` and
    ``mul_outputs`` registers below, with their clock enable on ``en``. Simulating it needs
    :data:`~moe_hw.arith.ecp5_dsp.MULT18X18D_SIM`.

    Datapath, with a register boundary (named) after each step:

    1. ``classified``: each operand on its own: its fields, class flags and the first step
       of its fraction's leading-zero count (a unit that gives every lane the same operand,
       like a gate, shares this logic between lanes: the register keeps the lanes' own logic
       behind it short);
       ``unpacked``: the operand with a zero exponent field (a subnormal or zero), if
       any, becomes x, the one that is normalised (if both are subnormal the product is far
       below the subnormal range whatever is done, so one normaliser is enough);
    2. ``zeros``, ``x_coarse``, ``mul_staged``, ``mul_inputs``: count the leading zeros of x
       and shift it left in two steps, so that both significands have their hidden bit set
       (x's exponent may go below 1); ``mul_staged`` holds the factors in fabric registers
       (the multiplier's inputs are then a plain route from registers: on ECP5 the DSP blocks
       sit in rows of their own, a long route from the shifter);
    3. ``mul_outputs``, ``mul_routed``, ``mul_partial``, ``product``: the significand product
       (for fp32 on ECP5: four partial products, held again in fabric registers
       (``mul_routed``) before two registered additions; otherwise a plain product with
       registers after it, for tools that retime them into the multiplier);
    4. ``product_normalised``: the product of two significands in [1, 2) needs at most a
       one-bit shift; bits below the guard bits fold into a sticky bit;
    5. ``denormalise_coarse``, ``denormalised``: a result below the normal range is shifted
       right into the subnormal grid in two steps, keeping the sticky bit;
    6. ``round_prepared``: decide the rounding (round to nearest, ties to even);
    7. ``rounded``: the increment and packing: a registered output.

    Registers are given to the boundaries in the order ``mul_outputs``, ``denormalised``,
    ``rounded``, ``mul_inputs``, ``product_normalised``, ``zeros``, ``product``,
    ``round_prepared``, ``denormalise_coarse``, ``unpacked``, ``x_coarse``, ``mul_partial``,
    ``classified``, ``mul_routed``, ``mul_staged`` as ``stages`` grows (default: all
    fifteen); any beyond fifteen go on the output.
    """

    result_name = "product"
    stages_name = "mul_stages"
    default_stages = DEFAULT_MULTIPLIER_STAGES

    def __init__(self, format, stages=None, *, dsp="generic"):
        self._dsp = check_choice("dsp", dsp, DSP_TARGETS)
        super().__init__(format, stages)

    @property
    def dsp(self):
        return self._dsp

    def elaborate(self, platform):
        m = Module()
        fmt = self._fmt
        mant_bits, exp_bits = fmt.mant_bits, fmt.exp_bits
        sig_bits = mant_bits + 1
        regs = StageRegisters(m, self.en, allocate_stages(
            self._stages, _BOUNDARY_PRIORITY, _EXTRA_BOUNDARY))

        operands = {}
        for key, bits in (("a", self.a), ("b", self.b)):
            op = unpack(m, fmt, bits, name=key)
            # The first step of x's leading-zero count, on both fractions (straight from the
            # input bits) with a zero hidden bit; a normal x has a hidden one and no zeros.
            any_, counts = leading_zeros_groups(
                m, Cat(op.significand[:mant_bits], Const(0, 1)), name=f"{key}_zeros",
                group=_ZERO_GROUP)
            operands.update({f"{key}_{name}": getattr(op, name) for name in (
                "sign", "exponent", "significand", "exp_zero", "exp_ones")})
            operands.update({f"{key}_zeros_any": any_, f"{key}_zeros_counts": counts})
            # Whether the fraction is zero, in two steps: an OR per group of bits here, the
            # groups' OR after the register (the fraction's whole OR was three LUT levels
            # from the operand register, the longest logic of this stage).
            frac = bits[:mant_bits]
            operands[f"{key}_frac_parts"] = Cat(frac[start:start + _ZERO_GROUP].any()
                                                for start in range(0, mant_bits, _ZERO_GROUP))
        cls = regs.boundary("classified", **operands)
        a = SimpleNamespace(**{name: getattr(cls, f"a_{name}") for name in (
            "sign", "exponent", "significand", "exp_zero", "exp_ones")},
            frac_zero=~cls.a_frac_parts.any())
        b = SimpleNamespace(**{name: getattr(cls, f"b_{name}") for name in (
            "sign", "exponent", "significand", "exp_zero", "exp_ones")},
            frac_zero=~cls.b_frac_parts.any())
        groups_a = (cls.a_zeros_any, cls.a_zeros_counts)
        groups_b = (cls.b_zeros_any, cls.b_zeros_counts)
        swap = b.exp_zero
        hidden_x = Mux(swap, 0, ~a.exp_zero)
        top_group = len(groups_a[0]) - 1
        count_bits = len(groups_a[1]) // len(groups_a[0])
        zero_any = Signal.like(groups_a[0], name="x_zeros_any")
        zero_counts = Signal.like(groups_a[1], name="x_zeros_counts")
        m.d.comb += [
            zero_any.eq(Mux(swap, groups_b[0], groups_a[0]) | (hidden_x << top_group)),
            zero_counts.eq(Mux(swap, groups_b[1], groups_a[1])
                           & ~(hidden_x.replicate(count_bits) << (count_bits * top_group))),
        ]
        ops = regs.boundary(
            "unpacked",
            sign=a.sign ^ b.sign,
            # The class flags are combined after the register (fewer LUT levels here).
            exp_zero_a=a.exp_zero, exp_ones_a=a.exp_ones, frac_zero_a=a.frac_zero,
            exp_zero_b=b.exp_zero, exp_ones_b=b.exp_ones, frac_zero_b=b.frac_zero,
            zero_any=zero_any, zero_counts=zero_counts,
            exponent_x=Mux(swap, b.exponent, a.exponent),
            exponent_y=Mux(swap, a.exponent, b.exponent),
            significand_x=Mux(swap, b.significand, a.significand),
            significand_y=Mux(swap, a.significand, b.significand),
        )

        # The product of the significands has 2 * sig_bits bits with the binary point after
        # its top bit when the exponent is ex + ey - bias + 1.
        exp_shape = signed(exp_bits + 3)
        exponent_sum = Signal(exp_shape, name="exponent_sum")
        m.d.comb += exponent_sum.eq(ops.exponent_x + ops.exponent_y - (fmt.bias - 1))
        zeros = leading_zeros_combine(m, ops.zero_any, ops.zero_counts, sig_bits,
                                      name="x_zeros")
        inf_a, inf_b = ops.exp_ones_a & ops.frac_zero_a, ops.exp_ones_b & ops.frac_zero_b
        zero_a, zero_b = ops.exp_zero_a & ops.frac_zero_a, ops.exp_zero_b & ops.frac_zero_b
        nan = ((ops.exp_ones_a & ~ops.frac_zero_a) | (ops.exp_ones_b & ~ops.frac_zero_b)
               | (inf_a & zero_b) | (zero_a & inf_b))
        passing = dict(sign=ops.sign, nan=nan, inf=inf_a | inf_b)
        counted = regs.boundary("zeros", **passing, exponent=exponent_sum, zeros=zeros,
                                significand_x=ops.significand_x,
                                significand_y=ops.significand_y)

        # A zero x has sig_bits leading zeros and shifts out to zero: the product is zero.
        # The fine step is a single bit: the DSP inputs are a long route away.
        shift_amount_bits = len(range(sig_bits + 1))
        coarse_bits, fine_bits = shift_bits(sig_bits, coarse=shift_amount_bits - 1)
        x_shifted = shift_left_step(m, counted.significand_x, counted.zeros, coarse_bits,
                                    name="x_normalised")
        exponent = Signal(exp_shape, name="product_exponent")
        m.d.comb += exponent.eq(counted.exponent - counted.zeros)
        passing = dict(sign=counted.sign, nan=counted.nan, inf=counted.inf)
        coarse = regs.boundary("x_coarse", **passing, exponent=exponent, zeros=counted.zeros,
                               significand_x=x_shifted, significand_y=counted.significand_y)
        x_normalised = shift_left_step(m, coarse.significand_x, coarse.zeros, fine_bits,
                                       name="x_normalised")
        passing = dict(sign=coarse.sign, nan=coarse.nan, inf=coarse.inf)
        # The factors in fabric registers next to the multiplier's inputs (on ECP5 the DSP
        # blocks are a long route away from the shifter, which then ends in a register).
        staged = regs.boundary("mul_staged", **passing, exponent=coarse.exponent,
                               x=x_normalised, y=coarse.significand_y)
        passing = dict(sign=staged.sign, nan=staged.nan, inf=staged.inf)
        # With dsp="ecp5" the significands are registered inside the DSP blocks instead.
        factors = dict(x=staged.x, y=staged.y) if self._dsp == "generic" else {}
        mul_in = regs.boundary("mul_inputs", **passing, exponent=staged.exponent, **factors)

        # While the multiplier works: the exponent and the underflow shift for either
        # position of the product's leading one (bit 2 * sig_bits - 1, or the one below).
        max_shift = mant_bits + 2       # past this, everything is sticky
        round_width = mant_bits + 4     # hidden bit, fraction, guard and two more

        # Shift right by target - e (clamped) to bring the exponent to 1, the subnormal grid,
        # for target 1 (leading one at the top) and 2 (one below), spread over the stages
        # while the multiplier works: the differences (parallel carry chains), then after
        # mul_outputs the compares, after mul_partial the clamped shifts.
        e = mul_in.exponent
        exponent_low = Signal(exp_shape, name="exponent_low")
        m.d.comb += exponent_low.eq(e - 1)
        exponents = dict(exponent_high=e, exponent_low=exponent_low)
        for key, target in (("high", 1), ("low", 2)):
            difference = Signal(exp_shape, name=f"underflow_{key}")
            m.d.comb += difference.eq(target - e)
            exponents[f"difference_{key}"] = difference
        keys = ("sign", "nan", "inf", "exponent_high", "exponent_low")

        def compares(stage):
            out = {}
            for key in ("high", "low"):
                difference = getattr(stage, f"difference_{key}")
                out.update({f"difference_{key}": difference,
                            f"saturate_{key}": difference > max_shift,
                            f"underflow_{key}": difference > 0})
            return out

        def shifts(stage):
            out = {}
            for key in ("high", "low"):
                out[f"shift_{key}"] = Mux(
                    getattr(stage, f"saturate_{key}"), max_shift,
                    Mux(getattr(stage, f"underflow_{key}"),
                        getattr(stage, f"difference_{key}")[:len(range(max_shift + 1))], 0))
            return out

        def carry(stage, step=None):
            return {key: getattr(stage, key) for key in keys} | step(stage)

        ahead = dict(sign=mul_in.sign, nan=mul_in.nan, inf=mul_in.inf, **exponents)

        def routed(stage, **products):
            # The products in fabric registers next to where they are summed or used (on
            # ECP5 the DSP blocks' outputs are a long route away).
            return regs.boundary("mul_routed", **{key: getattr(stage, key) for key in ahead},
                                 **products)

        if self._dsp == "generic":
            mul_out = regs.boundary("mul_outputs", **ahead, product=mul_in.x * mul_in.y)
            near = routed(mul_out, product=mul_out.product)
            partial = regs.boundary("mul_partial", **carry(near, compares),
                                    product=near.product)
            prod = regs.boundary("product", **carry(partial, shifts), product=partial.product)
        else:
            assert regs.count("mul_inputs") <= 1 and regs.count("mul_outputs") <= 1
            dsp = dict(en=self.en, reg_inputs=regs.count("mul_inputs") > 0,
                       reg_outputs=regs.count("mul_outputs") > 0)
            x, y = staged.x, staged.y
            # The DSP blocks' output registers are mul_outputs for the product.
            mul_out = regs.boundary("mul_outputs", **ahead)
            tiles = dsp_tiles(m, x, y, **dsp, name="mult")
            if len(tiles) == 1:
                near = routed(mul_out, product=tiles[0][1])
                partial = regs.boundary("mul_partial", **carry(near, compares),
                                        product=near.product)
                prod = regs.boundary("product", **carry(partial, shifts),
                                     product=partial.product)
            else:
                # x = xh * 2**18 + xl, y likewise: four partial products, one block each.
                assert [shift for shift, _ in tiles] == [0, DSP_WIDTH, DSP_WIDTH, 2 * DSP_WIDTH]
                (_, ll), (_, lh), (_, hl), (_, hh) = tiles
                low = DSP_WIDTH
                near = routed(mul_out, ll=ll, lh=lh, hl=hl, hh=hh)
                cross = Signal(len(lh) + 1, name="mult_cross")
                m.d.comb += cross.eq(near.lh + near.hl)
                partial = regs.boundary("mul_partial", **carry(near, compares),
                                        ll=near.ll, hh=near.hh, cross=cross)
                # ll and hh << 36 do not overlap: one carry chain from bit 18 up.
                product = Signal(2 * sig_bits, name="mult_product")
                m.d.comb += product.eq(Cat(partial.ll, partial.hh) + (partial.cross << low))
                prod = regs.boundary("product", **carry(partial, shifts), product=product)

        # Both significands were in [1, 2) (or x is zero): the leading one is at the top bit
        # or the one below it.
        top = prod.product[-1]
        normalised = Signal(2 * sig_bits, name="product_normalised")
        m.d.comb += normalised.eq(Mux(top, prod.product, prod.product << 1))
        drop = 2 * sig_bits - round_width
        passing = dict(sign=prod.sign, nan=prod.nan, inf=prod.inf)
        # The shift amount is registered twice, the second copy inverted, for the two halves
        # of the underflow shift (each copy then drives half of the shifter).
        shift = Mux(top, prod.shift_high, prod.shift_low)
        norm = regs.boundary(
            "product_normalised", **passing,
            exponent=Mux(top, prod.exponent_high, prod.exponent_low),
            shift=shift, shift_inverted=~shift,
            significand=normalised[drop:], sticky=normalised[:drop].any(),
        )

        # Gradual underflow: one zero bit below so that the guard bits shifted out are kept.
        coarse_bits, fine_bits = shift_bits(max_shift)
        shifted, sticky = shift_right_sticky_step(m, Cat(Const(0, 1), norm.significand),
                                                  norm.sticky, norm.shift, coarse_bits,
                                                  name="denormalise",
                                                  inverted_amount=norm.shift_inverted)
        # Whether a normal result overflows, decided here (a compare's carry chain) for the
        # rounding stage.
        passing = dict(sign=norm.sign, nan=norm.nan, inf=norm.inf, exponent=norm.exponent,
                       at_max=norm.exponent >= fmt.exp_max)
        coarse = regs.boundary("denormalise_coarse", **passing, shift=norm.shift,
                               shift_inverted=norm.shift_inverted,
                               significand=shifted, sticky=sticky)
        shifted, sticky = shift_right_sticky_step(m, coarse.significand, coarse.sticky,
                                                  coarse.shift, fine_bits, name="denormalise",
                                                  inverted_amount=coarse.shift_inverted)
        passing = dict(sign=coarse.sign, nan=coarse.nan, inf=coarse.inf,
                       exponent=coarse.exponent, at_max=coarse.at_max)
        denorm = regs.boundary("denormalised", **passing, significand=shifted, sticky=sticky)

        prep = round_prepare(m, fmt, denorm.exponent, denorm.significand, denorm.sticky,
                             sign=denorm.sign, nan=denorm.nan, inf=denorm.inf,
                             at_max=denorm.at_max)
        prepared = regs.boundary("round_prepared", sign=prep.sign, magnitude=prep.magnitude,
                                 round_up=prep.round_up)
        packed = round_pack(m, fmt, prepared.sign, prepared.magnitude, prepared.round_up)
        out = regs.boundary("rounded", product=packed)
        m.d.comb += self.product.eq(out.product)
        return m


class FloatMultiplier(FloatStreamUnit):
    """The stream unit ``fmul``: ``o.payload.product = i.payload.a * i.payload.b``.

    Input payload ``{a, b}`` (``a`` in the low bits), output payload ``{product}``. Latency
    ``stages`` cycles (default :data:`DEFAULT_MULTIPLIER_STAGES`), one result per cycle; the
    pipeline stalls only when its output holds a result the consumer has not taken, and
    ``o.valid`` never depends on ``o.ready``. Arithmetic (and ``dsp``) as
    :class:`FloatMultiplierCore`.
    """

    core_class = FloatMultiplierCore

    def __init__(self, format, stages=None, *, dsp="generic"):
        super().__init__(format, stages, dsp=check_choice("dsp", dsp, DSP_TARGETS))
