"""The ``fmul`` unit's declaration: the IEEE-754 multiplier as a stream unit
(``moe_hw/arith/fmul.py``), checked bit for bit against NumPy's ``a * b``."""

import numpy as np

from ..arith.fmul import FloatMultiplier
from ..arith.params import FmulParams
from .binop import FloatBinop

__all__ = ["UNIT"]


class Fmul(FloatBinop):
    name = "fmul"
    summary = ("IEEE-754 multiplier, round to nearest even, subnormals; stream of "
               "(a, b) -> product")
    golden = "NumPy a * b"
    params = FmulParams
    result = "product"
    component = FloatMultiplier
    numpy = staticmethod(np.multiply)
    stages_name = "mul_stages"

    def build(self, params):
        return FloatMultiplier(params.format, params.mul_stages, dsp=params.dsp)


UNIT = Fmul()
