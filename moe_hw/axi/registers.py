"""An AXI4-Lite register file built from a list of registers, and its documentation (a
Markdown table and a C header) from the same list.

A :class:`Register` is one 32-bit word at a fixed offset, made of :class:`Field` s. A field's
``access`` says what software and hardware see:

``rw``
    Software writes and reads it back; the hardware reads it (an ``Out`` port of the field's
    name). Written bytes follow ``wstrb``.
``ro``
    The hardware drives it (an ``In`` port); writes are ignored.
``const``
    A constant (``value``), read-only, with no port: the build's facts for a driver.
``w1p``
    Writing 1 pulses the ``Out`` port for one cycle; reads as 0.
``w1c``
    The hardware sets it (an ``In`` port ``<name>_set``, a pulse); it stays set (the ``Out``
    port of its name) until software writes 1 to it.

:class:`AxiLiteRegisters` serves one transaction at a time (enough for a register file):
``awready``/``wready`` are a one-cycle register pulse once both ``awvalid`` and ``wvalid``
are seen and no response waits, ``arready`` likewise for reads; ``bvalid``, ``rvalid`` and
``rdata`` are registers. Every output port is a register, and no input reaches an output
port in the same cycle. An offset with no register reads 0 and ignores writes (response
OKAY). A read's ``rvalid`` and ``rdata`` come three cycles after its handshake (the address
passes a register, the word two registered choices). A write lands a cycle after its
handshake (at the end of the cycle ``bvalid`` rises in; a ``w1p`` pulse is high in the
cycle after that), from registers: the written register's hit flag, the data and the byte
mask, so that the handshake and the address decode do not reach the fields' clock enables
and set/reset inputs.
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Field", "Register", "AxiLiteRegisters", "layout_registers", "markdown_table",
           "c_header", "axil_members"]

ACCESS = ("rw", "ro", "const", "w1p", "w1c")


@dataclass(frozen=True)
class Field:
    """``width`` bits at bit ``bit`` of a register; see the module docstring for ``access``."""

    name: str
    width: int = 1
    access: str = "rw"
    doc: str = ""
    bit: int = 0
    value: int = 0          # a const field's value; an rw field's reset value

    def __post_init__(self):
        if self.access not in ACCESS:
            raise ValueError(f"access of field {self.name!r} must be one of "
                             f"{', '.join(ACCESS)}, not {self.access!r}")
        if not 1 <= self.width <= 32 or not 0 <= self.bit or self.bit + self.width > 32:
            raise ValueError(f"field {self.name!r} must fit in 32 bits, not {self.width} "
                             f"bits at bit {self.bit}")


@dataclass(frozen=True)
class Register:
    name: str
    fields: tuple
    doc: str = ""
    offset: int | None = None     # None: the next free word (layout_registers)


def layout_registers(registers):
    """The registers with their offsets: a given offset is kept, the others take the next
    word after the previous register. Checks that offsets and field names are unique and
    that no two fields of a register overlap."""
    placed, used, names, offset = [], set(), set(), 0
    for reg in registers:
        offset = offset if reg.offset is None else reg.offset
        if offset % 4 or offset in used:
            raise ValueError(f"register {reg.name} cannot sit at offset {offset:#x}")
        bits = 0
        for f in reg.fields:
            if f.name in names:
                raise ValueError(f"field name {f.name!r} is used twice")
            names.add(f.name)
            mask = ((1 << f.width) - 1) << f.bit
            if bits & mask:
                raise ValueError(f"field {f.name!r} overlaps another field of {reg.name}")
            bits |= mask
        used.add(offset)
        placed.append(Register(reg.name, tuple(reg.fields), reg.doc, offset))
        offset += 4
    return placed


def axil_members(addr_width, prefix="s_axil"):
    """The AXI4-Lite slave ports (``<prefix>_awaddr`` ...), as signature members."""
    return {
        f"{prefix}_awaddr": In(addr_width), f"{prefix}_awprot": In(3),
        f"{prefix}_awvalid": In(1), f"{prefix}_awready": Out(1),
        f"{prefix}_wdata": In(32), f"{prefix}_wstrb": In(4),
        f"{prefix}_wvalid": In(1), f"{prefix}_wready": Out(1),
        f"{prefix}_bresp": Out(2), f"{prefix}_bvalid": Out(1), f"{prefix}_bready": In(1),
        f"{prefix}_araddr": In(addr_width), f"{prefix}_arprot": In(3),
        f"{prefix}_arvalid": In(1), f"{prefix}_arready": Out(1),
        f"{prefix}_rdata": Out(32), f"{prefix}_rresp": Out(2),
        f"{prefix}_rvalid": Out(1), f"{prefix}_rready": In(1),
    }


class AxiLiteRegisters(wiring.Component):
    """The register file of ``registers`` (see the module docstring) behind an AXI4-Lite
    slave ``s_axil_*`` of ``addr_width`` address bits (at least enough for the map)."""

    def __init__(self, registers, *, addr_width=None):
        self.registers = layout_registers(registers)
        need = max(2, (max(r.offset for r in self.registers) + 3).bit_length())
        addr_width = need if addr_width is None else addr_width
        if not isinstance(addr_width, int) or addr_width < need:
            raise ValueError(f"addr_width must be an integer of at least {need} for this map, "
                             f"not {addr_width!r}")
        self.addr_width = addr_width
        members = axil_members(addr_width)
        for reg in self.registers:
            for f in reg.fields:
                if f.access == "rw":
                    members[f.name] = Out(f.width, init=f.value)
                elif f.access == "ro":
                    members[f.name] = In(f.width)
                elif f.access == "w1p":
                    members[f.name] = Out(f.width)
                elif f.access == "w1c":
                    members[f.name] = Out(f.width)
                    members[f"{f.name}_set"] = In(f.width)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        p = lambda name: getattr(self, f"s_axil_{name}")     # noqa: E731

        # ---- write: one transaction at a time ---------------------------------------------
        write = Signal()                     # the write handshake happens this cycle
        m.d.comb += [write.eq(p("awready") & p("awvalid") & p("wvalid"))]
        m.d.sync += p("awready").eq(~p("awready") & p("awvalid") & p("wvalid") & ~p("bvalid"))
        m.d.comb += p("wready").eq(p("awready"))
        with m.If(write):
            m.d.sync += p("bvalid").eq(1)
        with m.Elif(p("bready")):
            m.d.sync += p("bvalid").eq(0)
        m.d.comb += p("bresp").eq(0)
        # (the write's data and byte mask, a cycle after the handshake, as its hit flags)
        w_data = Signal(32)
        w_mask = Signal(32)
        m.d.sync += [w_data.eq(p("wdata")),
                     w_mask.eq(Cat(p("wstrb")[i].replicate(8) for i in range(4)))]
        w_index = p("awaddr")[2:]

        # ---- read --------------------------------------------------------------------------
        # The address is registered at the handshake, and the word is chosen in two
        # registered steps (among the words of each group of four, then among the groups),
        # so that neither the port's address nor a choice of every word reaches ``rdata``.
        read = Signal()
        reading = Signal()                   # the read's word is chosen in its group
        grouped = Signal()                   # the read's group is chosen
        r_index = Signal(len(p("araddr")) - 2)
        r_group = Signal(max(len(r_index) - 2, 0))
        m.d.comb += read.eq(p("arready") & p("arvalid"))
        m.d.sync += [p("arready").eq(~p("arready") & p("arvalid") & ~p("rvalid") & ~reading &
                                     ~grouped),
                     reading.eq(read), grouped.eq(reading), r_index.eq(p("araddr")[2:]),
                     r_group.eq(r_index[2:])]
        with m.If(grouped):
            m.d.sync += p("rvalid").eq(1)
        with m.Elif(p("rready")):
            m.d.sync += p("rvalid").eq(0)
        m.d.comb += p("rresp").eq(0)

        # w1p fields fall after one cycle; rw, w1c fields hold.
        for reg in self.registers:
            for f in reg.fields:
                if f.access == "w1p":
                    m.d.sync += getattr(self, f.name).eq(0)
        words = {}
        for reg in self.registers:
            word = Signal(32, name=f"{reg.name.lower()}_word")
            hit = Signal(name=f"{reg.name.lower()}_hit")    # written in the cycle before
            m.d.sync += hit.eq(write & (w_index == reg.offset // 4))
            for f in reg.fields:
                bits = slice(f.bit, f.bit + f.width)
                data, mask = w_data[bits], w_mask[bits]
                if f.access == "const":
                    m.d.comb += word[bits].eq(Const(f.value, f.width))
                    continue
                port = getattr(self, f.name)
                if f.access == "rw":
                    with m.If(hit):
                        m.d.sync += port.eq((port & ~mask) | (data & mask))
                    m.d.comb += word[bits].eq(port)
                elif f.access == "ro":
                    m.d.comb += word[bits].eq(port)
                elif f.access == "w1p":
                    with m.If(hit):
                        m.d.sync += port.eq(data & mask)
                elif f.access == "w1c":
                    cleared = Mux(hit, data & mask, 0)
                    m.d.sync += port.eq((port & ~cleared) | getattr(self, f"{f.name}_set"))
                    m.d.comb += word[bits].eq(port)
            words[reg.offset // 4] = word
        groups = {}
        for index in sorted(words):
            groups.setdefault(index // 4, {})[index % 4] = words[index]
        group_words = {}
        for group, members in groups.items():
            group_words[group] = Signal(32, name=f"group{group}_word")
            _choose(m, reading, group_words[group], r_index[:2], members)
        _choose(m, grouped, p("rdata"), r_group, group_words)
        return m


def _choose(m, load, target, index, words):
    """``target`` (a register) loads, when ``load``, the word of ``words`` (a dict) at
    ``index``, or 0 where it has none."""
    with m.If(load):
        with m.Switch(index):
            for key, word in words.items():
                with m.Case(key):
                    m.d.sync += target.eq(word)
            with m.Default():
                m.d.sync += target.eq(0)


def _bits(f):
    return f"{f.bit}" if f.width == 1 else f"{f.bit + f.width - 1}:{f.bit}"


def markdown_table(registers, title):
    """The register map as a Markdown table (one row per field)."""
    lines = [f"# {title}", "", "| Offset | Register | Bits | Field | Access | Description |",
             "|---|---|---|---|---|---|"]
    for reg in layout_registers(registers):
        for i, f in enumerate(reg.fields):
            doc = f.doc + (f" (reads {f.value})" if f.access == "const" else "")
            lines.append(f"| {f'0x{reg.offset:02X}' if i == 0 else ''} | "
                         f"{reg.name if i == 0 else ''} | {_bits(f)} | {f.name} | {f.access} | "
                         f"{doc} |")
    return "\n".join(lines) + "\n"


def c_header(registers, prefix, title):
    """The register map as a C header: ``<PREFIX>_<REG>`` offsets, and per field its
    ``_SHIFT`` and ``_MASK`` (the mask in place)."""
    prefix = prefix.upper()
    guard = f"{prefix}_REGS_H"
    lines = [f"/* {title} (generated by python -m moe_hw.gen; do not edit). */",
             f"#ifndef {guard}", f"#define {guard}", ""]
    for reg in layout_registers(registers):
        name = f"{prefix}_{reg.name.upper()}"
        lines.append(f"#define {name:<40} 0x{reg.offset:02X}u  /* {reg.doc} */")
        for f in reg.fields:
            fname = f"{prefix}_{reg.name.upper()}_{f.name.upper()}"
            lines.append(f"#define {fname + '_SHIFT':<40} {f.bit}u")
            lines.append(f"#define {fname + '_MASK':<40} 0x{((1 << f.width) - 1) << f.bit:08X}u")
        lines.append("")
    lines.append(f"#endif /* {guard} */")
    return "\n".join(lines) + "\n"
