"""IEEE-754 adder: round to nearest even, subnormals in and out, bit-exact against NumPy."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed

from .float_core import (FloatCore, FloatStreamUnit, StageRegisters, allocate_stages,
                         leading_zeros_combine, leading_zeros_groups, round_pack, round_prepare,
                         shift_bits, shift_left_step, shift_right_sticky_step, unpack)

__all__ = ["FloatAdderCore", "FloatAdder", "DEFAULT_ADDER_STAGES", "adder_tree",
           "registered_adder"]

#: Default pipeline depth per format: every register boundary of :class:`FloatAdderCore`
#: gets one register, so that no stage has more than a few LUT levels and a carry chain
#: (250 MHz or more on ECP5-85 speed 8).
DEFAULT_ADDER_STAGES = {"fp32": 11, "fp16": 11, "bf16": 11}

# Register boundaries in pipeline order, and the order in which they receive a register as
# ``stages`` grows: each new register cuts the longest remaining combinational path.
# Registers beyond the last all go on the output.
_BOUNDARIES = ("compared", "operands", "align_coarse", "aligned", "sum", "zero_groups",
               "zeros", "normalise_coarse", "normalised", "round_prepared", "rounded")
_BOUNDARY_PRIORITY = ("sum", "normalised", "rounded", "operands", "aligned", "zeros",
                      "round_prepared", "compared", "align_coarse", "normalise_coarse",
                      "zero_groups")
_EXTRA_BOUNDARY = "rounded"
assert sorted(_BOUNDARIES) == sorted(_BOUNDARY_PRIORITY)


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

    Datapath, with a register boundary (named) after each step:

    1. ``compared``: unpack; compare the magnitudes (bit patterns without the sign) both
       ways in halves of 16 bits and take both exponent differences;
    2. ``operands``: combine the halves' compares and swap, so that x has the larger magnitude;
       saturate the alignment distance;
    3. ``align_coarse``, ``aligned``: shift the smaller significand right by the distance in
       two steps, keeping guard, round and sticky bits; mark where normalisation must stop
       (the subnormal range);
    4. ``sum``: add or subtract (one carry chain);
    5. ``zero_groups``, ``zeros``: count leading zeros (per group of four bits, then the
       groups), limited so that the exponent stays at 1 or above;
    6. ``normalise_coarse``, ``normalised``: the normalising left shift in two steps;
    7. ``round_prepared``: decide the rounding (round to nearest, ties to even);
    8. ``rounded``: the increment and packing: a registered output.

    Registers are given to the boundaries in the order ``sum``, ``normalised``, ``rounded``,
    ``operands``, ``aligned``, ``zeros``, ``round_prepared``, ``compared``,
    ``align_coarse``, ``normalise_coarse``, ``zero_groups`` as ``stages`` grows (default: all
    eleven); any beyond eleven go on the output.
    """

    result_name = "sum"
    stages_name = "add_stages"
    default_stages = DEFAULT_ADDER_STAGES

    def elaborate(self, platform):
        m = Module()
        fmt = self._fmt
        mant_bits, exp_bits = fmt.mant_bits, fmt.exp_bits
        regs = StageRegisters(m, self.en, allocate_stages(
            self._stages, _BOUNDARY_PRIORITY, _EXTRA_BOUNDARY))

        # Raw exponent fields: a subnormal has exponent 0 and its fraction shifted left by
        # one, so the exponent differences are plain subtractions of the fields. The
        # normalising shift below stops at exponent 1 all the same.
        a = unpack(m, fmt, self.a, name="a", raw_exponent=True)
        b = unpack(m, fmt, self.b, name="b", raw_exponent=True)
        subtract = a.sign ^ b.sign
        # Three bits below the significands (guard, round, sticky) are enough for a correctly
        # rounded sum; past mant_bits + 4 the smaller operand is all sticky, and so it is
        # for any shift that does not fit the shift amount's bits: saturate them. Both
        # distances here (carry chains, registered as they come out), saturated and the one
        # that applies chosen after the register.
        ext_width = mant_bits + 4
        shift_width = ext_width.bit_length()
        distances = {}
        for key, (x, y) in (("ab", (a, b)), ("ba", (b, a))):
            distances[key] = Signal(exp_bits, name=f"distance_{key}")
            m.d.comb += distances[key].eq(x.exponent - y.exponent)
        # x is the operand of larger magnitude: it gives the result its sign and exponent.
        # The magnitudes (bit patterns without the sign) are compared in halves of 16 bits
        # here, each both ways: "b greater" is the borrow of a - b and "a greater" the
        # borrow of b - a, the carry chains' own outputs (no LUT after them, and no equality
        # LUT tree: a half is equal when neither is greater). After the register, the swap
        # is one LUT of the halves' flags.
        chunks = range(0, fmt.width - 1, 16)
        greater = Cat((a.magnitude[i:i + 16].as_unsigned() - b.magnitude[i:i + 16])[-1]
                      for i in chunks)
        less = Cat((b.magnitude[i:i + 16].as_unsigned() - a.magnitude[i:i + 16])[-1]
                   for i in chunks)
        cmp = regs.boundary(
            "compared",
            greater=greater, less=less,
            subtract=subtract,
            sign_a=a.sign, sign_b=b.sign,
            exponent_a=a.exponent, exponent_b=b.exponent,
            significand_a=a.significand, significand_b=b.significand,
            distance_ab=distances["ab"], distance_ba=distances["ba"],
            # The class flags are combined after the register (fewer LUT levels here).
            exp_ones_a=a.exp_ones, frac_zero_a=a.frac_zero,
            exp_ones_b=b.exp_ones, frac_zero_b=b.frac_zero,
        )
        inf_a, inf_b = cmp.exp_ones_a & cmp.frac_zero_a, cmp.exp_ones_b & cmp.frac_zero_b
        nan = ((cmp.exp_ones_a & ~cmp.frac_zero_a) | (cmp.exp_ones_b & ~cmp.frac_zero_b)
               | (inf_a & inf_b & cmp.subtract))

        swap = Signal(name="swap")
        cancel = Signal(name="cancel")                     # exactly zero: +0 under RNE
        greater_so_far = Const(0)
        for i in range(len(cmp.greater)):                   # from the low half up
            greater_so_far = cmp.greater[i] | (~cmp.less[i] & greater_so_far)
        m.d.comb += [
            swap.eq(greater_so_far),
            cancel.eq(cmp.subtract & ~(cmp.greater | cmp.less).any()),
        ]
        shift = Signal(shift_width, name="align_shift")
        saturated = {}
        for key in ("ab", "ba"):
            distance = getattr(cmp, f"distance_{key}")
            saturated[key] = Signal(shift_width, name=f"align_shift_{key}")
            m.d.comb += saturated[key].eq(
                distance[:shift_width] | distance[shift_width:].any().replicate(shift_width))
        m.d.comb += shift.eq(Mux(swap, saturated["ba"], saturated["ab"]))
        exponent_x = Mux(swap, cmp.exponent_b, cmp.exponent_a)
        ops = regs.boundary(
            "operands",
            sign=Mux(cancel, 0, Mux(swap, cmp.sign_b, cmp.sign_a)),
            subtract=cmp.subtract,
            exponent_x=exponent_x,
            significand_x=Mux(swap, cmp.significand_b, cmp.significand_a),
            significand_y=Mux(swap, cmp.significand_a, cmp.significand_b),
            shift=shift, nan=nan, inf=inf_a | inf_b,
        )

        coarse_bits, fine_bits = shift_bits((1 << shift_width) - 1)
        y, sticky = shift_right_sticky_step(m, Cat(Const(0, 3), ops.significand_y), Const(0),
                                            ops.shift, coarse_bits, name="align")
        passing = dict(sign=ops.sign, nan=ops.nan, inf=ops.inf, exponent_x=ops.exponent_x)
        coarse = regs.boundary("align_coarse", **passing, subtract=ops.subtract,
                               significand_x=ops.significand_x, shift=ops.shift,
                               y=y, sticky=sticky)
        y, sticky = shift_right_sticky_step(m, coarse.y, coarse.sticky, coarse.shift, fine_bits,
                                            name="align")
        # Inverted here for a subtraction (see "sum"), to keep the LUT out of the adder stage.
        y_aligned = Signal(ext_width, name="y_aligned")
        m.d.comb += y_aligned.eq(Cat(y[0] | sticky, y[1:])
                                 ^ coarse.subtract.replicate(ext_width))
        # The sum has sum_width bits and its binary point after the top bit at exponent
        # exponent_x + 1. Normalising may shift it left by at most exponent_x (down to exponent
        # 1): a one at bit sum_width - 1 - exponent_x stops the leading-zero count there.
        sum_width = ext_width + 1
        stop = Signal(sum_width, name="normalise_stop")
        m.d.comb += stop.eq(Const(1 << (sum_width - 1), sum_width) >> coarse.exponent_x)
        passing = dict(sign=coarse.sign, nan=coarse.nan, inf=coarse.inf,
                       exponent_x=coarse.exponent_x)
        aligned = regs.boundary("aligned", **passing, subtract=coarse.subtract, stop=stop,
                                significand_x=coarse.significand_x, y=y_aligned)

        # One carry chain for both: x - y is x + ~y + 1, the + 1 entering as a carry from a
        # bit below. |x| >= |y|, so the difference is never negative and its carry out (bit
        # ext_width, always set) is dropped.
        x_ext = Cat(Const(0, 3), aligned.significand_x)
        sub = aligned.subtract
        raw = Signal(ext_width + 2, name="sum_raw")
        m.d.comb += raw.eq(Cat(sub, x_ext) + Cat(sub, aligned.y))
        total = Signal(sum_width, name="total")
        m.d.comb += total.eq(Cat(raw[1:ext_width + 1], raw[ext_width + 1] & ~sub))
        passing = dict(sign=aligned.sign, nan=aligned.nan, inf=aligned.inf,
                       exponent_x=aligned.exponent_x)
        added = regs.boundary("sum", **passing, stop=aligned.stop, significand=total)

        zero_any, zero_counts = leading_zeros_groups(m, added.significand | added.stop,
                                                     name="normalise_zeros")
        passing = dict(sign=added.sign, nan=added.nan, inf=added.inf,
                       exponent_x=added.exponent_x)
        grouped = regs.boundary("zero_groups", **passing, significand=added.significand,
                                any=zero_any, counts=zero_counts)
        zeros = leading_zeros_combine(m, grouped.any, grouped.counts, sum_width,
                                      name="normalise_zeros")
        passing = dict(sign=grouped.sign, nan=grouped.nan, inf=grouped.inf,
                       exponent_x=grouped.exponent_x)
        counted = regs.boundary("zeros", **passing, significand=grouped.significand,
                                zeros=zeros)

        coarse_bits, fine_bits = shift_bits(sum_width)
        shifted = shift_left_step(m, counted.significand, counted.zeros, coarse_bits,
                                  name="normalise")
        # The exponent beside the coarse shift (at least 1: the count stops at the subnormal
        # range), whether it overflows beside the fine shift: one carry chain per stage.
        exponent = Signal(signed(exp_bits + 2), name="normalised_exponent")
        m.d.comb += exponent.eq(counted.exponent_x + 1 - counted.zeros)
        passing = dict(sign=counted.sign, nan=counted.nan, inf=counted.inf, exponent=exponent)
        coarse = regs.boundary("normalise_coarse", **passing, significand=shifted,
                               zeros=counted.zeros)
        shifted = shift_left_step(m, coarse.significand, coarse.zeros, fine_bits,
                                  name="normalise")
        norm = regs.boundary("normalised", sign=coarse.sign, nan=coarse.nan, inf=coarse.inf,
                             exponent=coarse.exponent, at_max=coarse.exponent >= fmt.exp_max,
                             significand=shifted)

        prep = round_prepare(m, fmt, norm.exponent, norm.significand, Const(0),
                             sign=norm.sign, nan=norm.nan, inf=norm.inf, at_max=norm.at_max)
        prepared = regs.boundary("round_prepared", sign=prep.sign, magnitude=prep.magnitude,
                                 round_up=prep.round_up)
        packed = round_pack(m, fmt, prepared.sign, prepared.magnitude, prepared.round_up)
        out = regs.boundary("rounded", sum=packed)
        m.d.comb += self.sum.eq(out.sum)
        return m


def registered_adder(m, format, latency, a, b, *, name):
    """A :class:`FloatAdderCore` of ``latency`` in all whose operands ``a`` and ``b`` (each a
    choice among memory outputs and flags that reach many adders) pass a register first: the
    core has ``latency - 1`` stages, so that the choices and the core's first carry chains
    are in different cycles, and the sum is where a core of ``latency`` would give it. The
    caller names the core as a submodule; the registers are ``{name}_a`` and ``{name}_b``."""
    core = FloatAdderCore(format, latency - 1)
    operands = [Signal(len(a), name=f"{name}_{side}", reset_less=True) for side in "ab"]
    m.d.sync += [operands[0].eq(a), operands[1].eq(b)]
    m.d.comb += [core.a.eq(operands[0]), core.b.eq(operands[1]), core.en.eq(1)]
    return core


def adder_tree(m, values, format, latency, *, name="tree", lent=None):
    """The fixed pairwise float sum of ``values`` (a power of two of them, raw bit patterns):
    while more than one remains, ``p[m] = p[2m] + p[2m + 1]``, one free-running
    :class:`FloatAdderCore` of ``latency`` per pair (submodules ``{name}{level}_{pos}``). The
    sum comes ``log2(len(values)) * latency`` cycles after its operands.

    ``lent``: ``(selects, operands)``, the tree's adders lent to other sums while the tree is
    idle. Adder ``i`` (in level order, the first level first: ``len(values) - 1`` of them)
    adds the pair ``operands[i]`` in place of its tree operands where ``selects[i]`` is high,
    and every adder then takes its operands through a register (:func:`registered_adder`;
    the same latency). Returns the root's sum, and with ``lent`` the list of every adder's
    sum in level order too."""
    selects, operands = (None, None) if lent is None else lent
    level = 0
    sums = []
    while len(values) > 1:
        reduced = []
        for pos in range(len(values) // 2):
            a, b = values[2 * pos], values[2 * pos + 1]
            submodule = f"{name}{level}_{pos}"
            if lent is None:
                add = FloatAdderCore(format, latency)
                m.d.comb += [add.a.eq(a), add.b.eq(b), add.en.eq(1)]
            else:
                select, (lent_a, lent_b) = selects[len(sums)], operands[len(sums)]
                add = registered_adder(m, format, latency, Mux(select, lent_a, a),
                                       Mux(select, lent_b, b), name=submodule)
            m.submodules[submodule] = add
            reduced.append(add.sum)
            sums.append(add.sum)
        values = reduced
        level += 1
    return values[0] if lent is None else (values[0], sums)


class FloatAdder(FloatStreamUnit):
    """The stream unit ``fadd``: ``o.payload.sum = i.payload.a + i.payload.b``.

    Input payload ``{a, b}`` (``a`` in the low bits), output payload ``{sum}``. Latency
    ``stages`` cycles (default :data:`DEFAULT_ADDER_STAGES`), one result per cycle; the
    pipeline stalls only when its output holds a result the consumer has not taken, and
    ``o.valid`` never depends on ``o.ready``. Arithmetic as :class:`FloatAdderCore`.
    """

    core_class = FloatAdderCore
