"""The units ``python -m moe_hw.gen`` and ``python -m moe_hw.run`` know, and the named design
points under ``gen/``."""

import dataclasses
import functools
import importlib
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .formats import FORMATS, float_format
from .params import ParameterError, check_int

__all__ = ["Unit", "units", "ArithParams", "DesignPoint", "design_points", "design_point",
           "make_params", "parse_value"]


@dataclass(frozen=True)
class ArithParams:
    """Generation-time parameters of the float blocks (``fmul``, ``fadd``)."""

    format: str = "fp32"
    stages: int | None = None  # pipeline depth; None: the block's default for the format

    def __post_init__(self):
        float_format(self.format)
        if self.stages is not None:
            check_int("stages", self.stages, minimum=0, maximum=16)


@dataclass(frozen=True)
class Unit:
    """A unit of ``gen list``: its parameters, how to build it, and how ``moe_hw.run`` runs it.

    ``run(inputs, params, runtime, *, sim, stall, seed, check, progress)`` takes the npz
    arrays, the :class:`ParameterError`-checked generation-time settings (a dict, not yet sized
    to the problem), the run-time values (``runtime`` names), and returns ``(outputs, report
    lines)``; it raises AssertionError when ``check`` finds a mismatch with the golden model.
    """

    name: str
    summary: str
    params: type
    build: object              # params -> wiring.Component
    run: object
    runtime: tuple = ()        # names of run-time values (from --set or the npz)
    inputs: tuple = ()         # npz input keys
    outputs: tuple = ()        # npz output keys (plus cycles)


# Each module registers its units in a module-level ``UNITS`` list; a new unit adds its module
# here and nowhere else.
UNIT_MODULES = ("moe_hw.host.dispatch", "moe_hw.host.binop", "moe_hw.host.locations",
                "moe_hw.host.sparse", "moe_hw.host.gather", "moe_hw.host.combine_scatter",
                "moe_hw.host.backward_gate", "moe_hw.host.moe_layer")


@functools.cache
def units():
    """The units by name, from the modules of :data:`UNIT_MODULES` (imported on first use:
    they import this module)."""
    found = {}
    for module in UNIT_MODULES:
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name == module:      # a unit module not written yet
                continue
            raise
        for unit in loaded.UNITS:
            found[unit.name] = unit
    return found


def parse_value(text):
    """A ``--set`` value: integer, ``none``, ``true``/``false``, float, or the string itself."""
    lowered = text.strip().lower()
    if lowered in ("none", "default"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def make_params(unit, settings, base=None):
    """``unit``'s parameter object from ``settings`` (a name -> value dict), on top of
    ``base`` (a dict of defaults). Unknown names are an error that lists the known ones."""
    names = [f.name for f in dataclasses.fields(unit.params)]
    values = dict(base or {})
    for name, value in settings.items():
        if name not in names:
            raise ParameterError(f"Unit {unit.name} has no parameter {name!r}; its parameters "
                                 f"are {', '.join(names)}")
        values[name] = value
    return unit.params(**values)


@dataclass(frozen=True)
class DesignPoint:
    name: str
    path: Path
    unit: str
    description: str
    params: dict
    problem: dict


def _points_dir():
    return Path(__file__).resolve().parents[1] / "gen"


def design_points():
    points = {}
    for path in sorted(_points_dir().glob("*.toml")):
        data = tomllib.loads(path.read_text())
        points[path.stem] = DesignPoint(path.stem, path, data["unit"],
                                        data.get("description", ""), data.get("params", {}),
                                        data.get("problem", {}))
    return points


def design_point(name):
    points = design_points()
    if name not in points:
        raise ParameterError(f"Design point must be one of {', '.join(points)}, not {name!r}")
    return points[name]


def unit_or_point(name):
    """``(Unit, DesignPoint or None)`` for a unit name or a design point name."""
    if name in units():
        return units()[name], None
    points = design_points()
    if name in points:
        return units()[points[name].unit], points[name]
    raise ParameterError(f"Unit must be one of {', '.join(units())} or a design point "
                         f"({', '.join(points)}), not {name!r}")


__all__ += ["unit_or_point", "FORMATS"]
