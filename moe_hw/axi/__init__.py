"""Standard bus interfaces around a unit (``--set interface=axi``): AXI4-Stream for its
streams, an AXI4 master for each memory read and write port, an AXI4-Lite register file for
its run control, written once for every unit (:class:`AxiWrapper`)."""

from .read_master import AxiReadMaster
from .registers import AxiLiteRegisters, Field, Register, c_header, markdown_table
from .streams import AxisToStream, StreamToAxis
from .wrapper import INTERFACES, AxiParams, AxiWrapper
from .write_master import AxiWriteMaster, WriteRealign

__all__ = ["AxiLiteRegisters", "AxiParams", "AxiReadMaster", "AxiWrapper", "AxiWriteMaster",
           "AxisToStream", "Field", "INTERFACES", "Register", "StreamToAxis", "WriteRealign",
           "c_header", "markdown_table"]
