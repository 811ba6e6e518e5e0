"""The ``fadd`` unit's declaration: the IEEE-754 adder as a stream unit
(``moe_hw/arith/fadd.py``), checked bit for bit against NumPy's ``a + b``."""

import numpy as np

from ..arith.fadd import FloatAdder
from ..arith.params import FaddParams
from .binop import FloatBinop

__all__ = ["UNIT"]


class Fadd(FloatBinop):
    name = "fadd"
    summary = ("IEEE-754 adder, round to nearest even, subnormals; stream of (a, b) -> sum")
    golden = "NumPy a + b"
    params = FaddParams
    result = "sum"
    component = FloatAdder
    numpy = staticmethod(np.add)
    stages_name = "add_stages"


UNIT = Fadd()
