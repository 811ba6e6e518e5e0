"""Verilog emission and the JSON manifest of ports and parameters.

The manifest is what testbenches and tools read to drive a unit without knowing Amaranth:
every port with its direction and width and, for structured payloads, every field with its
bit offset (the first field of a layout is the least significant).
"""

import dataclasses
import json

from amaranth.back import verilog
from amaranth.hdl import ClockDomain, Module, Shape, Value
from amaranth.lib import data, wiring

__all__ = ["describe_shape", "port_manifest", "emit_verilog", "write_unit"]


def describe_shape(shape):
    """A JSON-able description of an Amaranth shape or layout."""
    if isinstance(shape, data.ArrayLayout):
        return {"width": shape.size, "array": {"count": shape.length,
                                               "element": describe_shape(shape.elem_shape)}}
    if isinstance(shape, data.Layout):
        fields = {}
        for name, field in shape:
            fields[name] = {"offset": field.offset, **describe_shape(field.shape)}
        return {"width": shape.size, "fields": fields}
    shape = Shape.cast(shape)
    return {"width": shape.width, "signed": shape.signed}


def port_manifest(component):
    ports = {}
    for path, member in component.signature.members.flatten():
        if not member.is_port:
            continue
        ports["__".join(str(part) for part in path)] = {
            "direction": "input" if member.flow == wiring.In else "output",
            **describe_shape(member.shape),
        }
    return ports


def emit_verilog(component, name):
    """The Verilog text of ``component`` as a top-level module called ``name``.

    Every emitted unit has ``clk`` and ``rst`` inputs, so that one testbench and one
    integration recipe serve all of them: a purely combinational unit (a float block with
    zero pipeline stages) gets them unused.
    """
    text = verilog.convert(component, name=name, emit_src=False)
    if "input clk;" in text:
        return text
    top = Module()
    top.domains.sync = domain = ClockDomain()
    top.submodules.unit = component
    ports = [domain.clk, domain.rst]
    for path, member in component.signature.members.flatten():
        if member.is_port:
            ports.append(Value.cast(_lookup(component, path)))
    return verilog.convert(top, name=name, ports=ports, emit_src=False)


def _lookup(component, path):
    obj = component
    for part in path:
        obj = obj[part] if isinstance(part, int) else getattr(obj, part)
    return obj


def write_unit(component, name, out_dir, *, unit, params, runtime=None):
    """Write ``<name>.v`` and ``<name>.json`` into ``out_dir``; return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    v_path = out_dir / f"{name}.v"
    j_path = out_dir / f"{name}.json"
    v_path.write_text(emit_verilog(component, name))
    manifest = {
        "unit": unit,
        "top": name,
        "parameters": dataclasses.asdict(params) if dataclasses.is_dataclass(params) else params,
        "ports": port_manifest(component),
    }
    for attr in ("latency",):
        if hasattr(component, attr):
            manifest[attr] = getattr(component, attr)
    if runtime:
        manifest["runtime"] = runtime
    j_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return v_path, j_path
