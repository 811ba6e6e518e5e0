"""What the parameter objects of the float datapath units share: the number format and the
depths of their multipliers and adders (None: the block's default for the format)."""

from ..arith.fadd import DEFAULT_ADDER_STAGES
from ..arith.fmul import DEFAULT_MULTIPLIER_STAGES
from ..formats import float_format

__all__ = ["FloatDatapathParams"]


class FloatDatapathParams:
    """Mixin for a frozen parameter dataclass with fields ``format``, ``mul_stages`` and, for
    units that add, ``add_stages``."""

    @property
    def fmt(self):
        return float_format(self.format)

    @property
    def mul_latency(self):
        stages = getattr(self, "mul_stages", None)
        return DEFAULT_MULTIPLIER_STAGES[self.format] if stages is None else stages

    @property
    def add_latency(self):
        stages = getattr(self, "add_stages", None)
        return DEFAULT_ADDER_STAGES[self.format] if stages is None else stages
