"""The units and the named design points: what ``gen``, ``run``, ``bench`` (and the synthesis
and exploration flows) know.

Every unit declares itself once, as ``UNIT`` in ``moe_hw/host/U.py`` (a
:class:`~moe_hw.host.unit.Unit`); this module lists those declarations, and nothing else
does. Adding a unit adds one line to :func:`units`. Data flows one way: the entry points read
this module, this module reads the declarations, the declarations read the hardware and the
golden models.

Host-level compositions (a :class:`~moe_hw.host.unit.Composition`, ``COMPOSITION`` in
``moe_hw/host/C.py``) chain several units' hardware on the host; they have no Verilog of
their own, so only ``run`` knows them (:func:`runnable`), and :func:`compositions` lists them.

Design points are the TOML files of the project's ``gen/`` folder, shipped inside the
package as ``moe_hw.design_points`` so that an installed wheel finds them too.
"""

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .params import ParameterError

__all__ = ["units", "unit", "compositions", "DesignPoint", "design_points", "design_point",
           "unit_or_point", "runnable", "parse_value"]


@functools.cache
def units():
    """The unit declarations by name, in ``gen list`` order."""
    from .host import (combine_gather, combine_scatter, dispatch, dispatch_backward_data,
                       dispatch_backward_gate, expand, expand_backward, fadd, fmul, locations,
                       moe_layer, moe_re_routing, repeat, scan_layers, scan_layers_backward,
                       scan_layers_unrolled, sparse_gather, sparse_index)
    declared = (dispatch, locations, sparse_index, sparse_gather, combine_gather,
                combine_scatter, dispatch_backward_data, dispatch_backward_gate, moe_layer,
                moe_re_routing, expand, repeat, expand_backward, scan_layers,
                scan_layers_unrolled, scan_layers_backward, fmul, fadd)
    return {module.UNIT.name: module.UNIT for module in declared}


@functools.cache
def compositions():
    """The host-level compositions by name (run by ``python -m moe_hw.run``)."""
    from .host import ep_layer
    return {module.COMPOSITION.name: module.COMPOSITION for module in (ep_layer,)}


def unit(name):
    """The declaration of unit ``name``, or an error listing the units."""
    if name not in units():
        raise ParameterError(f"unit must be one of {', '.join(units())}, not {name!r}")
    return units()[name]


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


@dataclass(frozen=True)
class DesignPoint:
    """A named design point: a unit, its generation-time parameters and a problem size."""

    name: str
    path: Path
    unit: str
    description: str
    params: dict
    problem: dict


def _points_dir():
    # A source checkout reads its own gen/ (an editable install elsewhere maps
    # moe_hw.design_points to that other checkout's gen/), as flows/simulate.py does for sim/.
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file() and (checkout / "gen" / "__init__.py").is_file():
        return checkout / "gen"
    from . import design_points as package
    return Path(package.__file__).parent


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
        raise ParameterError(f"design point must be one of {', '.join(points)}, not {name!r}")
    return points[name]


def unit_or_point(name):
    """``(Unit, DesignPoint or None)`` for a unit name or a design point name."""
    if name in units():
        return units()[name], None
    points = design_points()
    if name in points:
        return units()[points[name].unit], points[name]
    if name in compositions():
        raise ParameterError(f"{name} is a host-level composition of "
                             f"{', '.join(compositions()[name].units)}, with no Verilog of its "
                             f"own: run it with python -m moe_hw.run {name}, or name one of "
                             "its units")
    raise ParameterError(f"unit must be one of {', '.join(units())} or a design point "
                         f"({', '.join(points)}), not {name!r}")


def runnable(name):
    """What ``python -m moe_hw.run`` accepts: ``(Unit or Composition, DesignPoint or
    None)`` for a unit, a composition or a design point name."""
    if name in compositions():
        return compositions()[name], None
    if name in units() or name in design_points():
        return unit_or_point(name)
    raise ParameterError(f"unit must be one of {', '.join(units())}, a composition "
                         f"({', '.join(compositions())}) or a design point "
                         f"({', '.join(design_points())}), not {name!r}")
