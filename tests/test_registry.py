"""The one declaration per unit: every unit of ``gen list`` is found by its name alone
(hardware, declaration and adapter, bench, tests), names its golden model, and is read by
every entry point from that one declaration."""

import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from moe_hw.host.unit import Composition, Unit
from moe_hw.params import ParameterError, UnitParams
from moe_hw.registry import compositions, design_points, runnable, unit_or_point, units

ROOT = Path(__file__).resolve().parents[1]
FLOAT_BLOCKS = {"fmul", "fadd"}      # their hardware is the arithmetic block of arith/


@pytest.mark.parametrize("name", list(units()))
def test_unit_is_found_by_name(name):
    unit = units()[name]
    assert isinstance(unit, Unit) and unit.name == name
    hardware = ROOT / ("moe_hw/arith" if name in FLOAT_BLOCKS else "moe_hw/units") / f"{name}.py"
    assert hardware.is_file(), hardware
    assert (ROOT / "moe_hw/host" / f"{name}.py").is_file()
    assert (ROOT / "sim" / f"{unit.bench}.py").is_file()
    assert (ROOT / "tests" / f"test_{name}.py").is_file()
    assert importlib.import_module(f"moe_hw.host.{name}").UNIT is unit
    assert unit.golden and unit.summary and unit.inputs and unit.outputs


@pytest.mark.parametrize("name", list(units()))
def test_parameters_share_one_base(name):
    params = units()[name].params
    assert issubclass(params, UnitParams)
    params()                                    # the defaults are valid
    for field in dataclasses.fields(params):    # the vocabulary
        assert field.name not in ("max_k", "outstanding", "max_inflight", "width", "stages")


def test_units_in_gen_list_order():
    assert list(units())[:2] == ["dispatch", "locations"]
    assert FLOAT_BLOCKS <= set(units())


def test_design_points_name_declared_units():
    points = design_points()
    assert {"duet_toy", "tutel_swin"} <= set(points)
    for point in points.values():
        unit, found = unit_or_point(point.name)
        assert found == point and unit is units()[point.unit]
        unit.make_params(point.params)          # the point's parameters are valid


def test_registry_is_imported_by_nobody_below_it():
    # Data flows one way: the entry points read the registry, the registry reads the
    # declarations; no declaration, unit or flow imports the registry.
    for path in (ROOT / "moe_hw").rglob("*.py"):
        if path.parent.name in ("host", "units", "blocks", "arith", "stream", "flows", "golden"):
            imports = [line for line in path.read_text().splitlines()
                       if line.lstrip().startswith(("import ", "from "))]
            assert not [line for line in imports if "registry" in line], path


def test_gen_list_shows_every_unit():
    result = subprocess.run([sys.executable, "-m", "moe_hw.gen", "list"], capture_output=True,
                            text=True, check=True)
    for name in units():
        assert f"  {name}: " in result.stdout


@pytest.mark.parametrize("name", list(compositions()))
def test_composition_is_found_by_name(name):
    composition = compositions()[name]
    assert isinstance(composition, Composition) and composition.name == name
    assert (ROOT / "moe_hw/host" / f"{name}.py").is_file()
    assert (ROOT / "tests" / f"test_{name}.py").is_file()
    assert importlib.import_module(f"moe_hw.host.{name}").COMPOSITION is composition
    assert composition.golden and composition.summary and composition.inputs
    assert set(composition.units) <= set(units())
    assert name not in units() and name not in design_points()
    assert runnable(name) == (composition, None)


def test_compositions_are_run_not_emitted():
    for name in compositions():
        with pytest.raises(ParameterError, match=f"{name} is a host-level composition.*no "
                                                 "Verilog of its own"):
            unit_or_point(name)
    with pytest.raises(ParameterError, match="a composition"):
        runnable("no_such_unit")
    result = subprocess.run([sys.executable, "-m", "moe_hw.gen", "list"], capture_output=True,
                            text=True, check=True)
    for name in compositions():
        assert f"  {name}: " in result.stdout.split("Compositions")[1]
