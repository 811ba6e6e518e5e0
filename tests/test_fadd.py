"""The float adder: core and stream unit ``fadd`` in the Amaranth simulator, and the emitted
Verilog under cocotb (the shared cases are in ``float_block_cases.py``)."""

import numpy as np
import pytest

from moe_hw.arith.fadd import DEFAULT_ADDER_STAGES, FloatAdder, FloatAdderCore
from moe_hw.arith.vectors import bits_equal, reference_add
from moe_hw.formats import FORMATS, to_bits
from moe_hw.host.fadd import UNIT

from float_block_cases import FORMAT_NAMES, FloatBlockCases



class TestFadd(FloatBlockCases):
    unit = UNIT
    core = FloatAdderCore
    stream = FloatAdder
    reference = staticmethod(reference_add)
    symbol = "+"
    defaults = DEFAULT_ADDER_STAGES
    seed_base = 2
    depth_cases = (("fp16", 0), ("fp32", 1))

    @pytest.mark.parametrize("fmt", FORMAT_NAMES)
    def test_signed_zeros_and_infinities(self, fmt):
        # The IEEE rules spelled out, each checked against NumPy and the stated answer.
        inf, nan = float("inf"), float("nan")
        cases = [               # a, b, a + b
            (0.0, -0.0, 0.0), (-0.0, 0.0, 0.0), (-0.0, -0.0, -0.0), (0.0, 0.0, 0.0),
            (1.5, -1.5, 0.0), (-1.5, 1.5, 0.0), (-1.0, 0.0, -1.0), (-0.0, 2.0, 2.0),
            (inf, -inf, nan), (-inf, inf, nan), (inf, inf, inf), (-inf, -inf, -inf),
            (-inf, 1.0, -inf), (3.0, inf, inf), (nan, 1.0, nan), (inf, nan, nan),
        ]
        a = to_bits(np.array([case[0] for case in cases]), fmt)
        b = to_bits(np.array([case[1] for case in cases]), fmt)
        stated = to_bits(np.array([case[2] for case in cases]), fmt)
        assert bits_equal(reference_add(a, b, fmt), stated, FORMATS[fmt]).all()
        self.check_core(fmt, None, a, b)

    def subnormal_cases(self, fmt):
        fmt = FORMATS[fmt]
        m, sign = fmt.mant_bits, 1 << (fmt.width - 1)
        min_normal, max_sub, top_sub_bit = 1 << m, (1 << m) - 1, 1 << (m - 1)
        return [
            (1, 1, 2),                                        # min sub + min sub
            (1 | sign, 1 | sign, 2 | sign),                   # -min sub + -min sub
            (max_sub, 1, min_normal),                         # carries into the normals
            (min_normal, 1 | sign, max_sub),                  # min normal - min sub
            (min_normal | 1, min_normal | sign, 1),           # cancellation to min sub
            (min_normal, max_sub | sign, 1),                  # min normal - max sub
            (1, 0 | sign, 1),                                 # min sub + -0
            (1 | sign, 0, 1 | sign),                          # -min sub + 0
            (top_sub_bit, top_sub_bit, min_normal),           # two halves make min normal
            (3, 5 | sign, 2 | sign),                          # 3 ulp - 5 ulp
        ]
