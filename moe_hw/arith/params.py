"""What the parameter objects of the float datapath units share: the number format and the
depths of their multipliers and adders (None: the block's default for the format)."""

from .fadd import DEFAULT_ADDER_STAGES
from .fmul import DEFAULT_MULTIPLIER_STAGES
from .product import DSP_TARGETS
from ..formats import FORMATS, float_format

__all__ = ["FloatDatapathParams", "FORMAT_NAMES"]

#: The ``format`` parameter's choices.
FORMAT_NAMES = tuple(FORMATS)


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


def dsp_param():
    """The ``dsp`` parameter of every unit with a multiplier."""
    from ..params import param
    return param("generic", choices=DSP_TARGETS,
                 doc="multiplier: generic (a plain *) or ecp5 (registered MULT18X18D)")


def _float_unit_params(name, stages_name, doc, extra=()):
    """The parameter class of a float stream unit: ``format``, its depth, and ``extra``
    fields."""
    from dataclasses import make_dataclass

    from ..params import UnitParams, param
    return make_dataclass(
        name, [("format", str, param("fp32", choices=FORMAT_NAMES)),
               (stages_name, "int | None", param(None, minimum=0, maximum=16, optional=True,
                                                 doc=doc)), *extra],
        bases=(FloatDatapathParams, UnitParams), frozen=True,
        namespace={"ALIASES": {"stages": stages_name},
                   "__doc__": f"Generation-time parameters of the {name[:4].lower()} unit."})


#: Parameters of the ``fmul`` unit: ``format``, ``mul_stages``.
FmulParams = _float_unit_params(
    "FmulParams", "mul_stages", "None: the default depth for the format",
    extra=[("dsp", str, dsp_param())])
#: Parameters of the ``fadd`` unit: ``format``, ``add_stages``.
FaddParams = _float_unit_params("FaddParams", "add_stages",
                                "None: the default depth for the format")
__all__ += ["FmulParams", "FaddParams", "dsp_param"]
