"""``python -m moe_hw.gen``: list the units and design points, emit Verilog and a manifest.

    python -m moe_hw.gen list
    python -m moe_hw.gen emit UNIT|POINT --out DIR [--set NAME=VALUE ...]
    python -m moe_hw.gen emit UNIT --out DIR --set interface=axi [--set axi_outstanding=8 ...]
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from .cli import parse_sets, run_main
from .params import ParameterError, check_choice
from .flows.emit import write_unit
from .registry import compositions, design_points, unit_or_point, units

__all__ = ["main", "emit"]


def _list():
    print("Units (python -m moe_hw.gen emit UNIT --out DIR --set NAME=VALUE):")
    for unit in units().values():
        print(f"\n  {unit.name}: {unit.summary}")
        print(f"    checked against {unit.golden}")
        print(f"    run: in {', '.join(unit.inputs)}"
              + (f"; run-time {', '.join(unit.runtime)}" if unit.runtime else "")
              + f"; out {', '.join(unit.outputs)}, cycles")
        for field in dataclasses.fields(unit.params):
            doc = field.metadata.get("doc", "")
            print(f"      {field.name:<16} default {field.default!r:<8} {doc}".rstrip())
    from .axi import AxiParams
    print("\nBus interfaces (--set interface=axi: AXI4-Stream, AXI4 master, AXI4-Lite; "
          "moe_hw/axi), with:")
    for field in dataclasses.fields(AxiParams):
        print(f"      {field.name:<16} default {field.default!r:<8} "
              f"{field.metadata.get('doc', '')}".rstrip())
    print("\nCompositions (python -m moe_hw.run NAME [--in FILE.npz]: units' Verilog chained "
          "on the host; no Verilog of their own):")
    for composition in compositions().values():
        print(f"\n  {composition.name}: {composition.summary}")
        print(f"    checked against {composition.golden}; runs {', '.join(composition.units)}")
        print(f"    run: in {', '.join(composition.inputs)}; run-time "
              f"{', '.join(composition.runtime)}; out {', '.join(composition.outputs)}, cycles")
        print(f"    settings: {', '.join(composition.settings)}")
        print(f"    without --in: random data at {composition.describe_random({})}")
    print("\nDesign points (gen/*.toml; python -m moe_hw.gen emit POINT --out DIR):")
    points = design_points().values()
    name_width = max((len(point.name) for point in points), default=0)
    unit_width = max((len(point.unit) for point in points), default=0)
    for point in points:
        print(f"  {point.name:<{name_width}} {point.unit:<{unit_width}} {point.description}")


def emit(name, out_dir, settings=None):
    """Emit unit or design point ``name`` into ``out_dir``; return the written paths.
    ``interface=axi`` (and the ``axi_*`` settings) among ``settings`` wraps the unit in
    standard bus interfaces (:mod:`moe_hw.axi`)."""
    unit, point = unit_or_point(name)
    settings, interface, axi = split_interface(settings)
    params = unit.make_params(settings, base=point.params if point else None,
                              interface=interface)
    component = unit.build(params) if axi is None else unit.build_axi(params, axi)
    return write_unit(component, unit.name, Path(out_dir), unit=unit.name, params=params,
                      runtime=point.problem if point else None, interface=axi)


def split_interface(settings):
    """``(unit settings, interface, AxiParams or None)`` from ``--set`` settings: the
    ``interface`` setting (native, the default, or axi) and the ``axi_*`` ones."""
    from .axi import INTERFACES, AxiParams
    settings = dict(settings or {})
    interface = check_choice("interface", settings.pop("interface", "native"), INTERFACES)
    axi_settings = {name: settings.pop(name) for name in list(settings)
                    if name.startswith("axi_")}
    if interface != "axi":
        if axi_settings:
            raise ParameterError(f"{next(iter(axi_settings))} needs interface=axi")
        return settings, interface, None
    names = [f.name for f in dataclasses.fields(AxiParams)]
    for name in axi_settings:
        if name not in names:
            raise ParameterError(f"the AXI wrapper has no parameter {name!r}; its parameters "
                                 f"are {', '.join(names)}")
    return settings, interface, AxiParams(**axi_settings)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m moe_hw.gen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the units, their parameters and the design points")
    emit_parser = sub.add_parser("emit", help="write UNIT.v and UNIT.json into --out")
    emit_parser.add_argument("unit", help="a unit name or a design point name (see list)")
    emit_parser.add_argument("--out", required=True, type=Path, help="output directory")
    emit_parser.add_argument("--set", action="append", metavar="NAME=VALUE", default=[],
                             help="a generation-time parameter (repeatable)")
    args = parser.parse_args(argv)
    if args.command == "list":
        _list()
        return 0

    def body():
        start = time.perf_counter()
        v_path, j_path = emit(args.unit, args.out, parse_sets(args.set))
        others = [name for name in json.loads(j_path.read_text())["files"]
                  if name not in (v_path.name, j_path.name)]
        print(f"wrote {v_path} ({v_path.stat().st_size} bytes), {j_path} and "
              f"{', '.join(others)} in {time.perf_counter() - start:.1f} s")
        return 0

    return run_main(parser.prog, body)


if __name__ == "__main__":
    sys.exit(main())
