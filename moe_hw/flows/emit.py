"""Verilog emission and the JSON manifest of ports and parameters.

The manifest is what testbenches and tools read to drive a unit without knowing Amaranth:
every port with its direction and width and, for structured payloads, every field with its
bit offset (the first field of a layout is the least significant).
"""

import contextlib
import dataclasses
import itertools
import json
import re

from amaranth.back import rtlil, verilog
from amaranth.hdl import ClockDomain, Module, Shape, Value
from amaranth.lib import data, wiring

__all__ = ["describe_shape", "port_manifest", "emit_verilog", "fusesoc_core", "write_unit"]


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
    zero pipeline stages) gets them unused. A component that names its own ``clock_ports``
    (the AXI wrapper: ``aclk``, ``aresetn``) keeps those instead.
    """
    with _zero_init_as_loops():
        text = verilog.convert(component, name=name, emit_src=False)
        if "input clk;" not in text and not getattr(component, "clock_ports", None):
            top = Module()
            top.domains.sync = domain = ClockDomain()
            top.submodules.unit = component
            ports = [domain.clk, domain.rst]
            for path, member in component.signature.members.flatten():
                if member.is_port:
                    ports.append(Value.cast(_lookup(component, path)))
            text = verilog.convert(top, name=name, ports=ports, emit_src=False)
    return _zero_loops(text)


# A memory's initial contents go into the netlist bit by bit (Amaranth's ``$meminit_v2``:
# width x depth constant bits built one at a time in Python), and Yosys writes them out word
# by word: for the zero contents of every memory here (``init=[]``) that made emission time
# and the Verilog grow with the memory (scan_layers' parameter memory: 8.4 Mbit at L = 128,
# 36 s). Zero contents are left out of the netlist instead, and each such memory gets one
# ``initial`` loop that zeroes it: the same contents in every simulator (four-state ones
# included) and in synthesis, in a few lines whatever the depth.
_MEMORY = re.compile(r"^(\s*)reg (?:\[\d+:0\] )?(\S+) \[(\d+):0\];\n(?!\s*initial begin)",
                     re.MULTILINE)


@contextlib.contextmanager
def _zero_init_as_loops():
    emit_memory = rtlil.ModuleEmitter.emit_memory

    def emit_nonzero(self, cell_idx, cell):
        if any(cell.init):
            emit_memory(self, cell_idx, cell)

    rtlil.ModuleEmitter.emit_memory = emit_nonzero
    try:
        yield
    finally:
        rtlil.ModuleEmitter.emit_memory = emit_memory


def _zero_loops(text):
    """Add a zeroing ``initial`` loop after every memory declared without initial contents."""
    count = itertools.count()

    def zero(match):
        indent, name, top = match.groups()
        index = f"zero_init_{next(count)}"
        return (f"{match.group(0)}{indent}integer {index};\n"
                f"{indent}initial for ({index} = 0; {index} <= {top}; {index} = {index} + 1) "
                f"{name} [{index}] = 0;\n")

    return _MEMORY.sub(zero, text)


def _lookup(component, path):
    obj = component
    for part in path:
        obj = obj[part] if isinstance(part, int) else getattr(obj, part)
    return obj


def fusesoc_core(name, files, description):
    """A FuseSoC CAPI2 core file for the emitted Verilog ``files`` of top module ``name``."""
    listed = "\n".join(f"      - {file}" for file in files)
    return (f"CAPI=2:\n\nname: moe_hw:units:{name}:0.1.0\ndescription: "
            f"{json.dumps(description)}\n\nfilesets:\n  rtl:\n    files:\n{listed}\n"
            f"    file_type: verilogSource\n\ntargets:\n  default:\n    filesets: [rtl]\n"
            f"    toplevel: {name}\n")


def write_unit(component, name, out_dir, *, unit, params, runtime=None, interface=None):
    """Write ``<name>.v``, ``<name>.json`` and the FuseSoC core ``<name>.core`` into
    ``out_dir``; return the Verilog's and the manifest's paths. A component with a register
    map (the AXI wrapper) also gets ``<name>_regs.md`` and ``<name>_regs.h``, and its buses
    and registers in the manifest; ``interface`` (the wrapper's parameters) goes in the
    manifest too."""
    from ..axi import c_header, markdown_table
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
    files = [v_path.name, j_path.name]
    if hasattr(component, "register_map"):
        title = f"Register map of {name} (AXI4-Lite s_axil, 32-bit registers)"
        md_path, h_path = out_dir / f"{name}_regs.md", out_dir / f"{name}_regs.h"
        md_path.write_text(markdown_table(component.registers, title))
        h_path.write_text(c_header(component.registers, name, title))
        manifest["interface"] = {"name": "axi", **(dataclasses.asdict(interface)
                                                   if interface is not None else {})}
        manifest["buses"] = component.buses()
        manifest["registers"] = component.register_map()
        files += [md_path.name, h_path.name]
    core_path = out_dir / f"{name}.core"
    core_path.write_text(fusesoc_core(name, [v_path.name], f"moe_hw {unit} ({name})"))
    manifest["files"] = files + [core_path.name]
    for attr in ("latency",):
        if hasattr(component, attr):
            manifest[attr] = getattr(component, attr)
    if runtime:
        manifest["runtime"] = runtime
    j_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return v_path, j_path
