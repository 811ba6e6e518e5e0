"""A unit behind standard bus interfaces: ``python -m moe_hw.gen emit UNIT --set interface=axi``.

:class:`AxiWrapper` reads the unit's signature and puts, around it:

* each input stream behind an AXI4-Stream slave ``s_axis_<name>_*``
  (:class:`~moe_hw.axi.streams.AxisToStream`), each output stream behind a master
  ``m_axis_<name>_*`` (:class:`~moe_hw.axi.streams.StreamToAxis`); a stream the unit's
  declaration lists in ``axi_rows`` carries token rows (``tlast`` on each row's last beat);
* each memory write port (a stream of ``addr``, ``data``, ``enable``) behind an AXI4 master
  ``m_axi_<name>_*`` (:class:`~moe_hw.axi.write_master.WriteRealign` then
  :class:`~moe_hw.axi.write_master.AxiWriteMaster`), its base address a register;
* each memory read port (a request stream ``<name>_request`` of ``addr``, ``enable`` and
  its response stream ``<name>_response`` of ``data``, or a pair the unit's declaration
  names in ``axi_reads``) behind an AXI4 master
  ``m_axi_<name>_*`` with AR and R channels (:class:`~moe_hw.axi.read_master.AxiReadMaster`),
  its base address a register;
* the run control (``start``, the sizes, ``busy``, ``done``, ``error``) and the unit's other
  plain ports (counters such as ``dropped``) in an AXI4-Lite register file ``s_axil_*``
  (:class:`~moe_hw.axi.registers.AxiLiteRegisters`), with ``irq``;
* one clock ``aclk`` and the active-low synchronous reset ``aresetn``.

Run protocol (the register map: :meth:`AxiWrapper.register_map`): software writes the sizes
and the base addresses, then 1 to ``CTRL.start``. A start while the wrapper is busy is
ignored. The base addresses are taken at the start. ``STATUS.done`` rises when the unit is
done and every write has been answered on the bus (B), and stays until the next start;
``IRQ.done`` is set at that moment and stays until software writes 1 to it; ``irq`` is
``IRQ.done & CTRL.irq_enable``. ``STATUS.bus_error`` (a read or write response other than
OKAY) and
``STATUS.stream_error`` (a ``tlast`` that disagrees with the row size) hold until the next
start. Base addresses are in bytes; their bits below the bus width are ignored.

A unit's streams and ports are named in its declaration (``moe_hw/host/U.py``): ``axi_rows``
(``{stream: size}``: the stream carries rows of that run-time size, in elements; on an
output stream whose payload has a ``data`` array beside other fields, such as a row's lane
enables and last flag, ``tdata`` is the ``data`` alone, the rest said by ``tkeep`` and
``tlast``) and
``axi_names`` (``{port: bus name}``, a port's name otherwise) and ``axi_reads`` (``{read
port: (request stream, response stream)}``, for a read port whose streams are not named
``X_request`` and ``X_response``).
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, ClockDomain, Const, Module, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..blocks.block_memory import bram_param
from ..params import UnitParams, param
from ..stream import replicated
from .registers import AxiLiteRegisters, Field, Register, axil_members, layout_registers
from .streams import AxisToStream, StreamToAxis, axis_members, tdata_width
from .read_master import AxiReadMaster, axi_read_members
from .write_master import AxiWriteMaster, WriteRealign, axi_write_members

__all__ = ["AxiParams", "AxiWrapper", "INTERFACES"]

INTERFACES = ("native", "axi")
RUN_PORTS = ("start", "busy", "done", "error")


@dataclass(frozen=True)
class AxiParams(UnitParams):
    """The wrapper's generation-time parameters (``--set axi_...=``)."""

    axi_addr_width: int = param(32, minimum=12, maximum=64, doc="AXI4 master address bits")
    axi_max_burst: int = param(256, minimum=1, maximum=256, doc="beats per burst, at most")
    # 8: at 16 lanes a token row is a 32-beat burst, and 4 bursts in flight left the W
    # channel waiting on a 100-cycle write response (0.943 of a beat per cycle; 0.994 at 8).
    axi_outstanding: int = param(8, minimum=1, maximum=64,
                                 doc="bursts in flight per AXI4 master, at most")
    axi_fifo_depth: int = param(512, minimum=2, maximum=1 << 16, power_of_two=True,
                                doc="bus words buffered per AXI4 master (a block RAM)")
    axi_bram: str = bram_param()


def _is_write_port(member):
    if not member.is_signature or not isinstance(member.signature, stream.Signature):
        return False
    shape = member.signature.members["payload"].shape
    return isinstance(shape, data.StructLayout) and \
        {"addr", "data", "enable"} <= set(shape.members)


def _is_read_pair(members, request, response):
    """Whether ports ``request`` (out: ``addr``, ``enable``) and ``response`` (in: ``data``)
    are a memory read port."""
    shapes = []
    for port, flow in ((request, Out), (response, In)):
        member = members.get(port)
        if member is None or not member.is_signature or member.flow != flow or \
                not isinstance(member.signature, stream.Signature):
            return False
        shapes.append(member.signature.members["payload"].shape)
    return all(isinstance(shape, data.StructLayout) for shape in shapes) and \
        set(shapes[0].members) == {"addr", "enable"} and set(shapes[1].members) == {"data"}


def _read_ports(members, declared, name):
    """``{read port name: (request port, response port)}``: every ``X_request`` /
    ``X_response`` pair, and the pairs a unit declares with other names (``axi_reads``)."""
    reads = {port[:-len("_request")]: (port, port[:-len("_request")] + "_response")
             for port in members if port.endswith("_request")}
    reads = {read: pair for read, pair in reads.items() if _is_read_pair(members, *pair)}
    for read, pair in declared.items():
        if not _is_read_pair(members, *pair):
            raise ValueError(f"axi_reads: {pair!r} of {name} is not a read port (a request "
                             f"stream of addr and enable out, a response stream of data in)")
        reads[read] = tuple(pair)
    return reads


def _lanes_of(shape):
    """(lanes, element width) of a payload's ``data`` array."""
    array = shape["data"].shape
    return array.length, Shape.cast(array.elem_shape).width


class AxiWrapper(wiring.Component):
    """``unit`` (a component with :func:`~moe_hw.blocks.run_control.run_ports` and a
    ``sizes`` property) behind AXI interfaces; see the module docstring."""

    def __init__(self, unit, *, name, axi=None, rows=None, names=None, reads=None,
                 own_clock=True):
        self.unit, self.name = unit, name
        # ``own_clock=False``: no ``aclk``/``aresetn``, the ambient ``sync`` domain (for a
        # harness that clocks the wrapper itself: the synthesis flow's out-of-context one).
        self.clock_ports = ("aclk", "aresetn") if own_clock else None
        self.axi = axi = axi or AxiParams()
        self.rows, self.names = dict(rows or {}), dict(names or {})
        members = unit.signature.members
        for port in RUN_PORTS:
            if port not in members:
                raise ValueError(f"unit {name} has no {port!r} port; the AXI wrapper needs "
                                 f"the run-control ports")
        sizes = dict(unit.sizes)
        self.inputs, self.outputs, self.writes, self.counters, self.settings = [], [], [], [], []
        self.read_ports = _read_ports(members, dict(reads or {}), name)
        self.reads = list(self.read_ports)
        read_streams = {port for pair in self.read_ports.values() for port in pair}
        for port, member in members.items():
            if port in read_streams:
                continue
            if member.is_signature:
                if _is_write_port(member):
                    self.writes.append(port)
                elif member.flow == In:
                    self.inputs.append(port)
                else:
                    self.outputs.append(port)
            elif port in RUN_PORTS or port in sizes:
                continue
            elif member.flow == Out:
                self.counters.append(port)
            else:
                self.settings.append(port)
        for port in self.rows:
            if port not in self.inputs + self.outputs:
                raise ValueError(f"axi_rows names {port!r}, which is not a stream of {name}")
            if self.rows[port] not in sizes:
                raise ValueError(f"axi_rows: {self.rows[port]!r} is not a size of {name}")
        self.registers = layout_registers(self._registers())
        self.axil_addr_width = max(12, (max(r.offset for r in self.registers) + 3).bit_length())
        signature = {**({"aclk": In(1), "aresetn": In(1)} if own_clock else {}),
                     "irq": Out(1), **axil_members(self.axil_addr_width)}
        for port in self.inputs:
            signature.update(axis_members(self.bus(port, "s_axis"), self._shape(port), In))
        for port in self.outputs:
            signature.update(axis_members(self.bus(port, "m_axis"), self._axis_shape(port),
                                          Out))
        for port in self.writes:
            lanes, width = _lanes_of(self._shape(port))
            signature.update(axi_write_members(self.bus(port, "m_axi"),
                                               addr_width=axi.axi_addr_width,
                                               data_width=lanes * width))
        for port in self.reads:
            lanes, width = self._read_lanes(port)
            signature.update(axi_read_members(self.bus(port, "m_axi"),
                                              addr_width=axi.axi_addr_width,
                                              data_width=lanes * width))
        super().__init__(signature)

    # ---- description --------------------------------------------------------------------

    def bus(self, port, kind):
        return f"{kind}_{self.names.get(port, port)}"

    def _shape(self, port):
        return self.unit.signature.members[port].signature.members["payload"].shape

    def _axis_shape(self, port):
        """The shape an AXI4-Stream carries for ``port``: a row stream's ``data`` alone."""
        shape = self._shape(port)
        if port in self.rows and isinstance(shape, data.StructLayout) and \
                "data" in shape.members and len(shape.members) > 1:
            if port in self.inputs:
                raise ValueError(f"axi_rows: input stream {port!r} of {self.name} has fields "
                                 f"beside its data; only an output row stream may")
            return shape["data"].shape
        return shape

    def _read_lanes(self, port):
        return _lanes_of(self.unit.signature.members[self.read_ports[port][1]].signature
                         .members["payload"].shape)

    def _row_beats_width(self, port, lanes):
        """Bits of row stream ``port``'s beat count: the most beats of ``lanes`` elements
        that its row size's register can hold."""
        size_bits = max(1, self.unit.sizes[self.rows[port]].bit_length())
        return max(1, (((1 << size_bits) - 1 + lanes - 1) >> exact_log2(lanes)).bit_length())

    def _width(self, port):
        member = self.unit.signature.members[port]
        width = Shape.cast(member.shape).width
        if width > 32:
            raise ValueError(f"port {port!r} of {self.name} is {width} bits wide; a register "
                             f"holds 32 at most")
        return width

    def _registers(self):
        lane_ports = [port for port in self.writes + self.inputs + self.outputs
                      if isinstance(self._shape(port), data.StructLayout) and
                      isinstance(self._shape(port).members.get("data"), data.ArrayLayout)]
        lanes, width = (_lanes_of(self._shape(lane_ports[0])) if lane_ports else
                        self._read_lanes(self.reads[0]) if self.reads else (1, 0))
        regs = [
            Register("CTRL", (Field("start", access="w1p", doc="write 1: start a run"),
                              Field("irq_enable", bit=1, doc="irq follows IRQ.done")),
                     "control", offset=0x00),
            Register("STATUS", (
                Field("busy", access="ro", doc="a run is on (from start to done)"),
                Field("done", bit=1, access="ro",
                      doc="the last run is done and all its bus transfers answered"),
                Field("error", bit=2, access="ro", doc="a size exceeded its maximum"),
                Field("bus_error", bit=3, access="ro",
                      doc="a read or write response was not OKAY"),
                Field("stream_error", bit=4, access="ro",
                      doc="a tlast disagreed with the row size")), "status", offset=0x04),
            Register("IRQ", (Field("done_irq", access="w1c",
                                   doc="set at done; write 1 to clear"),), "interrupt",
                     offset=0x08),
            Register("INFO", (Field("lanes", 8, "const", "elements per beat", value=lanes),
                              Field("element_width", 8, "const", "bits per element", bit=8,
                                    value=width)), "build facts", offset=0x0C),
        ]
        for size, maximum in self.unit.sizes.items():
            regs.append(Register(size.upper(), (
                Field(size, max(1, maximum.bit_length()), doc=f"run-time size, at most "
                      f"{maximum}"),), "run-time size"))
        for port in self.settings:
            regs.append(Register(port.upper(), (Field(port, self._width(port)),), "setting"))
        for port in self.counters:
            regs.append(Register(port.upper(), (
                Field(port, self._width(port), "ro", "counter of the last run"),), "counter"))
        for port in self.writes + self.reads:
            bus = self.names.get(port, port)
            wide = self.axi.axi_addr_width > 32
            regs.append(Register(f"{bus.upper()}_BASE" + ("_LO" if wide else ""), (
                Field(f"{bus}_base" + ("_lo" if wide else ""), 32,
                      doc=f"m_axi_{bus} base address" + (", bits 31:0" if wide else "")),),
                "base address"))
            if wide:
                regs.append(Register(f"{bus.upper()}_BASE_HI", (
                    Field(f"{bus}_base_hi", self.axi.axi_addr_width - 32,
                          doc=f"m_axi_{bus} base address, high bits"),), "base address"))
        return regs

    def buses(self):
        """The manifest's list of buses, each with its parameters."""
        buses = [{"name": "s_axil", "kind": "axi4-lite", "role": "slave",
                  "addr_width": self.axil_addr_width, "data_width": 32}]
        for port in self.inputs + self.outputs:
            role = "slave" if port in self.inputs else "master"
            bus = {"name": self.bus(port, "s_axis" if role == "slave" else "m_axis"),
                   "kind": "axi4-stream", "role": role, "port": port,
                   "tdata_width": tdata_width(self._axis_shape(port))}
            if port in self.rows:
                bus["tlast"] = f"last beat of a row of {self.rows[port]} elements"
            buses.append(bus)
        masters = [(port, "write", _lanes_of(self._shape(port))) for port in self.writes]
        masters += [(port, "read", self._read_lanes(port)) for port in self.reads]
        for port, channels, (lanes, width) in masters:
            buses.append({"name": self.bus(port, "m_axi"), "kind": "axi4", "role": "master",
                          "port": port, "channels": channels, "addr_width":
                          self.axi.axi_addr_width, "data_width": lanes * width, "id_width": 1,
                          "max_burst": self.axi.axi_max_burst,
                          "outstanding": self.axi.axi_outstanding,
                          "fifo_depth": self.axi.axi_fifo_depth, "burst": "INCR",
                          "boundary": 4096})
        buses.append({"name": "irq", "kind": "interrupt", "sensitivity": "level-high"})
        return buses

    def register_map(self):
        """The manifest's register map: one entry per register, with its fields."""
        return [{"name": r.name, "offset": r.offset, "doc": r.doc,
                 "fields": [{"name": f.name, "bit": f.bit, "width": f.width,
                             "access": f.access, "doc": f.doc,
                             **({"value": f.value} if f.access == "const" else {})}
                            for f in r.fields]} for r in self.registers]

    # ---- hardware -----------------------------------------------------------------------

    def _base(self, regs, bus):
        """The base address register(s) of the master ``bus``."""
        if self.axi.axi_addr_width > 32:
            return getattr(regs, f"{bus}_base_lo") | (getattr(regs, f"{bus}_base_hi") << 32)
        return getattr(regs, f"{bus}_base")

    def _forward(self, m, inner, names):
        """Connect the wrapper's ports ``names`` to the same-named ports of ``inner``."""
        for name in names:
            outer_port, inner_port = getattr(self, name), getattr(inner, name)
            if self.signature.members[name].flow == In:
                m.d.comb += inner_port.eq(outer_port)
            else:
                m.d.comb += outer_port.eq(inner_port)

    def elaborate(self, platform):
        m = Module()
        if self.clock_ports:
            m.domains.sync = sync = ClockDomain("sync")
            m.d.comb += [sync.clk.eq(self.aclk), sync.rst.eq(~self.aresetn)]
        unit = m.submodules.unit = self.unit
        regs = m.submodules.registers = AxiLiteRegisters(self.registers,
                                                         addr_width=self.axil_addr_width)
        self._forward(m, regs, axil_members(self.axil_addr_width))

        drained = []                       # each is high when its bus holds nothing
        accept = Signal()
        armed = Signal()                   # from an accepted start to done
        bus_error, stream_error = Signal(), Signal()

        # ---- run-time sizes, settings, counters ---------------------------------------------
        for size in self.unit.sizes:
            m.d.comb += getattr(unit, size).eq(getattr(regs, size))
        for port in self.settings:
            m.d.comb += getattr(unit, port).eq(getattr(regs, port))
        for port in self.counters:
            m.d.comb += getattr(regs, port).eq(getattr(unit, port))

        # ---- streams -------------------------------------------------------------------------
        errors = []
        for port in self.inputs + self.outputs:
            shape = self._axis_shape(port)
            slave = port in self.inputs
            lanes = _lanes_of(self._shape(port))[0] if port in self.rows else 0
            adapter_class = AxisToStream if slave else StreamToAxis
            prefix = self.bus(port, "s_axis" if slave else "m_axis")
            # A row stream counts beats in the width of its row's size register, not 32
            # bits: the beat counter's carry chain was the wrapped dispatch's path.
            row_bits = self._row_beats_width(port, lanes) if lanes else 1
            adapter = adapter_class(prefix, shape, rows=lanes, row_beats_width=row_bits)
            m.submodules[f"axis_{port}"] = adapter
            self._forward(m, adapter, axis_members(prefix, shape, In if slave else Out))
            if slave:
                wiring.connect(m, adapter.o, getattr(unit, port))
            elif shape == self._shape(port):
                wiring.connect(m, getattr(unit, port), adapter.i)
                drained.append(~adapter.busy)
            else:                           # a row stream's data alone
                source = getattr(unit, port)
                m.d.comb += [adapter.i.valid.eq(source.valid), source.ready.eq(adapter.i.ready),
                             adapter.i.payload.eq(source.payload.data)]
                drained.append(~adapter.busy)
            if lanes:
                row_beats = Signal(row_bits, name=f"{port}_row_beats")
                row = getattr(regs, self.rows[port])
                shift = exact_log2(lanes)
                m.d.sync += row_beats.eq((row + lanes - 1) >> shift)
                m.d.comb += [adapter.row_beats.eq(row_beats), adapter.restart.eq(accept)]
                if slave:
                    errors.append(adapter.tlast_error)
                else:
                    m.d.sync += adapter.last_lanes.eq(row - ((row_beats - 1) << shift))

        # ---- memory write ports --------------------------------------------------------------
        bus_errors = []
        for port in self.writes:
            shape = self._shape(port)
            lanes, width = _lanes_of(shape)
            bus = self.names.get(port, port)
            prefix = f"m_axi_{bus}"
            realign = m.submodules[f"realign_{port}"] = WriteRealign(shape)
            master = m.submodules[f"axi_{port}"] = AxiWriteMaster(
                prefix, lanes=lanes, width=width, word_width=realign.word_width,
                addr_width=self.axi.axi_addr_width, max_burst=self.axi.axi_max_burst,
                outstanding=self.axi.axi_outstanding, fifo_depth=self.axi.axi_fifo_depth,
                bram=self.axi.axi_bram)
            self._forward(m, master, axi_write_members(prefix,
                                                       addr_width=self.axi.axi_addr_width,
                                                       data_width=lanes * width))
            wiring.connect(m, getattr(unit, port), realign.i)
            wiring.connect(m, realign.o, master.i)
            with m.If(accept):
                m.d.sync += master.base_word.eq(self._base(regs, bus) >> master.size)
            drained.append(~realign.busy & master.idle)
            bus_errors.append(master.bus_error)

        # ---- memory read ports ---------------------------------------------------------------
        for port in self.reads:
            lanes, width = self._read_lanes(port)
            bus = self.names.get(port, port)
            prefix = f"m_axi_{bus}"
            request, response = (getattr(unit, name) for name in self.read_ports[port])
            master = m.submodules[f"axi_{port}"] = AxiReadMaster(
                prefix, request.payload.shape(), response.payload.shape(),
                addr_width=self.axi.axi_addr_width, max_burst=self.axi.axi_max_burst,
                outstanding=self.axi.axi_outstanding, fifo_depth=self.axi.axi_fifo_depth,
                bram=self.axi.axi_bram)
            self._forward(m, master, axi_read_members(prefix, addr_width=self.axi.axi_addr_width,
                                                      data_width=lanes * width))
            wiring.connect(m, request, master.request)
            wiring.connect(m, master.response, response)
            with m.If(accept):
                m.d.sync += master.base_word.eq(self._base(regs, bus) >> master.size)
            drained.append(master.idle)
            bus_errors.append(master.bus_error)

        # ---- run control ---------------------------------------------------------------------
        # ``all_drained`` and ``unit_done`` are their flags a cycle ago (registers: the start
        # and done decisions are then one LUT from flip-flops). While no run is on nothing
        # enters the buses, so a start sees the buses drained as they are; a run finishes
        # once the unit was done and the buses drained in the cycle before (the unit then has
        # nothing more to give, so they stay drained). ``all_drained`` is two registers kept
        # apart, one for the start and one for the done: the drained flags sit by the buses,
        # the start by the unit and the done by the register file (one register for both
        # was the wrapped dispatch's path, a net across the unit into the done).
        # (Copy 1 reads 1 from reset, as the one register did; copy 0 reads 0, but only
        # while no run is armed.)
        drained_done, drained_start = replicated(
            m, Cat(*drained).all() if drained else Const(1), name="all_drained", copies=2)
        unit_done = Signal()
        m.d.sync += unit_done.eq(unit.done)
        m.d.comb += [accept.eq(regs.start & ~unit.busy & ~armed & drained_start),
                     unit.start.eq(accept)]
        finish = armed & unit.done & unit_done & drained_done
        done = Signal()
        with m.If(accept):
            m.d.sync += [armed.eq(1), done.eq(0), bus_error.eq(0), stream_error.eq(0)]
        with m.Elif(finish):
            m.d.sync += [armed.eq(0), done.eq(1)]
        for flag in bus_errors:
            with m.If(flag):
                m.d.sync += bus_error.eq(1)
        for flag in errors:
            with m.If(flag):
                m.d.sync += stream_error.eq(1)
        m.d.comb += [regs.busy.eq(armed), regs.done.eq(done), regs.error.eq(unit.error),
                     regs.bus_error.eq(bus_error), regs.stream_error.eq(stream_error),
                     regs.done_irq_set.eq(finish)]
        m.d.sync += self.irq.eq(regs.done_irq & regs.irq_enable)
        return m
