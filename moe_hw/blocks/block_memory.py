"""A block-RAM memory with a registered read: deep tables read at the clock of the fabric.

An ECP5 block RAM (DP16KD) that Yosys infers has no output register (its memory library
does not offer one): the read data leaves the block 4.3 ns after the clock on LFE5U-85F speed
8, more than a 250 MHz cycle before any logic. With the block's own output register on
(``REGMODE_B = "OUTREG"``) the data comes from a register inside the block. This memory
therefore has a two-cycle read on every target:

``target="generic"``
    ``amaranth.lib.memory`` with a synchronous read port and one register after it (on ECP5
    Yosys infers an unregistered DP16KD and a fabric register: correct, not fast).
``target="ecp5"``
    explicit DP16KD instances, written on port A and read on port B with the output
    register on, in the widest of the block's aspects (1024 x 18, 2048 x 9, 4096 x 4,
    8192 x 2, 16384 x 1) that holds every word: a word is split into its granules, and each
    granule into columns of that width, one row of blocks, read straight from their output
    registers. Past 16384 words, rows of 1024 x 18 blocks, one row per 1024 words, written
    by an address decode and read through a multiplexer after the output registers.
    :data:`DP16KD_SIM` is a behavioural model of that subset for Verilator and Icarus (Yosys
    ships only a black box).

Both have the same ports and the same timing, so a unit's cycle count does not depend on
the target.

``fanout`` (a memory of many blocks): the most blocks, or registers of the next level, that
one register of the addresses reaches. The read address, and the write address and enables,
then pass a tree of registers on their way to the blocks, each register driving at most
``fanout`` of the next level, so that no net of the address spans a large memory's whole
row of blocks (128 blocks of 8192 x 2 are most of an LFE5U-85F's). Each level is a cycle of
:attr:`latency` more, on both targets (the generic build delays its addresses as much). The
read data of such a memory comes back from blocks as far apart, so it also passes a register
in the fabric after the blocks' own output registers: one cycle more (:func:`read_latency`;
at scan_layers' defaults the path was a block's output over a 4.0 ns net to the reader). On
ECP5 the tree's registers are flip-flop instances (``TRELLIS_FF``, :data:`TRELLIS_FF_SIM` its
model): Yosys merges flip-flops that load the same value (``opt_merge``), which would make
the tree one register again, but only its own cells, not instances.

Ports:

``write_addr``, ``write_data``, ``write_en`` (in)
    A write of the granules whose ``write_en`` bit is high (``write_data`` is an array of
    ``granules`` elements of ``shape``), at the clock edge of the cycle it is given; with
    ``registered_write``, one edge later (the write passes a register, on ECP5 after the
    row's decode, so that the blocks' write pins hang off flip-flops: a block row spread over
    the device is a 3 ns net).
``read_addr``, ``read_en`` (in); ``read_data`` (out)
    A read: the word at ``read_addr`` (given in a cycle with ``read_en`` high) is on
    ``read_data`` after :attr:`latency` such cycles (2, or :func:`read_latency` with an
    address tree), and holds while ``read_en`` is low.
    A read sees a write given in an earlier cycle (two cycles earlier with
    ``registered_write`` and no ``fanout``); a read and a write of the same address in the
    same cycle are not allowed (the block's result is undefined). With ``fanout`` the writes
    pass as many levels of registers as the reads (``registered_write`` is then the tree's
    first level).
"""

from amaranth.hdl import Cat, ClockSignal, Const, Instance, Module, Mux, Shape, Signal, Value
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..params import check_choice, check_int, param
from ..stream import delay

__all__ = ["BlockMemory", "MEMORY_TARGETS", "DP16KD_SIM", "TRELLIS_FF_SIM",
           "bram_param", "block_aspect", "block_rows", "block_count", "tree_levels",
           "read_latency"]

#: The ``target`` values: how the memory is built.
MEMORY_TARGETS = ("generic", "ecp5")


def bram_param():
    """The ``bram`` parameter of every unit with a :class:`BlockMemory`."""
    return param("generic", choices=MEMORY_TARGETS,
                 doc="block memory: generic (inferred) or ecp5 (DP16KD, output register on)")


#: The DP16KD's aspects, widest first: (data bits, address bits). A block holds
#: 2**address_bits words of that many bits; its 14 address pins take the word address from
#: pin ``14 - address_bits`` up (the pins below are 0, except the 18-bit mode's write byte
#: enables, pins 0 and 1 of port A), and its data pins are the first ``data bits`` ones.
_ASPECTS = ((18, 10), (9, 11), (4, 12), (2, 13), (1, 14))
_WIDTH = 18        # data pins per port


def block_aspect(depth):
    """The blocks' ``(data bits, address bits)`` on ECP5 for ``depth`` words: the widest
    aspect deep enough for the whole memory, so that one row of blocks holds it and the read
    needs no multiplexer after the blocks (at 8192 words of 256 bits: 128 blocks of 8192 x 2
    in one row, not 8 rows of 15 blocks of 1024 x 18 and a row choice spanning the chip);
    past 16384 words, rows of 1024 x 18."""
    for width, bits in _ASPECTS:
        if depth <= 1 << bits:
            return width, bits
    return _ASPECTS[0]


def block_rows(depth):
    """Rows of blocks on ECP5 for ``depth`` words (one up to 16384 words)."""
    return -(-depth // (1 << block_aspect(depth)[1]))


def block_count(width, depth, granules=1):
    """DP16KD blocks on ECP5 of a :class:`BlockMemory` of ``depth`` words of ``granules``
    elements of ``width`` bits."""
    return block_rows(depth) * granules * -(-width // block_aspect(depth)[0])


def tree_levels(blocks, fanout):
    """Registers in each level of the address tree of a memory of ``blocks`` blocks, from the
    first (fed by the ports) to the last (at the blocks), each register reaching at most
    ``fanout`` blocks or registers of the next level: empty without ``fanout`` (None) or with
    at most ``fanout`` blocks (the ports reach them)."""
    if fanout is None or blocks <= fanout:
        return []
    levels = [-(-blocks // fanout)]
    while levels[0] > fanout:
        levels.insert(0, -(-levels[0] // fanout))
    return levels


def read_latency(blocks, fanout):
    """Cycles of a read of a memory of ``blocks`` blocks with ``fanout``: 2, and with an
    address tree its levels and the read data's register after the blocks."""
    levels = tree_levels(blocks, fanout)
    return 2 + len(levels) + bool(levels)


class BlockMemory(wiring.Component):
    """``depth`` words of ``granules`` elements of ``shape`` with a 2-cycle registered read
    and a write enable per element; see the module docstring."""

    #: Cycles of a read without ``fanout`` (an instance's :attr:`latency` adds the address
    #: tree's levels and the read data's register: :func:`read_latency`).
    latency = 2

    def __init__(self, shape, depth, *, granules=1, target="generic", registered_write=False,
                 fanout=None):
        self.shape = shape
        self.registered_write = bool(registered_write)
        self.depth = check_int("depth", depth, minimum=1, maximum=1 << 20)
        self.granules = check_int("granules", granules, minimum=1, maximum=64)
        self.target = check_choice("target", target, MEMORY_TARGETS)
        self.fanout = None if fanout is None else check_int("fanout", fanout, minimum=2,
                                                            maximum=1024)
        self.word = data.ArrayLayout(shape, self.granules)
        self.latency = read_latency(self.blocks, self.fanout)
        super().__init__({
            "write_addr": In(range(self.depth)), "write_data": In(self.word),
            "write_en": In(self.granules),
            "read_addr": In(range(self.depth)), "read_en": In(1), "read_data": Out(self.word),
        })

    @property
    def aspect(self):
        """The blocks' ``(data bits, address bits)`` on ECP5: see :func:`block_aspect`."""
        return block_aspect(self.depth)

    @property
    def rows(self):
        """Rows of blocks on ECP5 (:func:`block_rows`)."""
        return block_rows(self.depth)

    @property
    def blocks(self):
        """DP16KD blocks on ECP5 (:func:`block_count`)."""
        return block_count(self._granule_width, self.depth, self.granules)

    @property
    def tree_levels(self):
        """The address tree's levels (:func:`tree_levels`)."""
        return tree_levels(self.blocks, self.fanout)

    @property
    def _granule_width(self):
        return Shape.cast(self.shape).width

    def _write(self, m, value, name):
        """A write input as the memory sees it: through a register with ``registered_write``,
        through as many as the address tree's levels with ``fanout``."""
        stages = len(self.tree_levels) or int(self.registered_write)
        return delay(m, value, stages, 1, name=name, reset_less=name != "write_en_r")

    def elaborate(self, platform):
        m = Module()
        levels = self.tree_levels
        # (The write address's registers before the data's, as before the tree: a netlist
        # in another order places differently. The ECP5 tree registers its own addresses.)
        write_addr = (None if levels and self.target == "ecp5" else
                      self._write(m, self.write_addr, "write_addr_r"))
        write_data = self._write(m, self.write_data.as_value(), "write_data_r")
        if self.target == "generic":
            mem = m.submodules.memory = memory.Memory(shape=self.word, depth=self.depth, init=[])
            write = mem.write_port(granularity=1)
            read = mem.read_port(domain="sync")
            read_addr = delay(m, self.read_addr, len(levels), self.read_en, name="read_addr_r",
                              reset_less=True)
            m.d.comb += [write.addr.eq(write_addr),
                         write.data.eq(write_data),
                         write.en.eq(self._write(m, self.write_en, "write_en_r")),
                         read.addr.eq(read_addr), read.en.eq(self.read_en)]
            m.d.comb += self.read_data.eq(self._data_register(m, delay(
                m, read.data.as_value(), 1, self.read_en, name="read_data_r", reset_less=True)))
            return m

        width = self._granule_width
        block_width, block_bits = self.aspect
        columns = -(-width // block_width)
        row_bits = ceil_log2(self.rows)
        low_bits = ceil_log2(min(self.depth, 1 << block_bits))
        blocks = [(row, granule, column) for row in range(self.rows)
                  for granule in range(self.granules) for column in range(columns)]
        if levels:
            # Each block's addresses and write enable from a register of the tree's last
            # level; that level's write registers hold the enables of their blocks' rows and
            # granules, decoded from the level before.
            read_leaves = _address_tree(m, "read_addr", self.read_addr[:low_bits], levels,
                                        self.fanout, self.read_en)
            addr_bits = len(self.write_addr)
            leaf_pairs = [sorted({(row, granule) for row, granule, _ in
                                  blocks[leaf * self.fanout:(leaf + 1) * self.fanout]})
                          for leaf in range(levels[-1])]

            def write_leaf(leaf, parent):
                addr, enables = parent[:addr_bits], parent[addr_bits:]
                return Cat(addr[:low_bits], *[
                    enables[granule] & (addr[block_bits:] == row if self.rows > 1 else 1)
                    for row, granule in leaf_pairs[leaf]])

            write_leaves = _address_tree(m, "write", Cat(self.write_addr, self.write_en),
                                         levels, self.fanout, 1, leaf=write_leaf)

            def block_ports(index, row, granule):
                leaf = index // self.fanout
                enable = leaf_pairs[leaf].index((row, granule))
                return (read_leaves[leaf], write_leaves[leaf][:low_bits],
                        write_leaves[leaf][low_bits + enable])
        else:
            low = write_addr[:low_bits]
            write_row = self.write_addr[block_bits:] if self.rows > 1 else Const(0)
            enables = {}
            for row in range(self.rows):
                for granule in range(self.granules):
                    # (Registered after the row's decode: the enable is a flip-flop at the
                    # pins.)
                    we = self.write_en[granule] & (write_row == row)
                    if self.registered_write:
                        we = delay(m, we, 1, 1, name=f"write_en_r{row}_g{granule}")
                    enables[row, granule] = we

            def block_ports(index, row, granule):
                return self.read_addr[:low_bits], low, enables[row, granule]

        row_words = [[] for _ in range(self.rows)]
        for index, (row, granule, column) in enumerate(blocks):
            bits = write_data[granule * width:(granule + 1) * width]
            chunk = bits[column * block_width:min(width, (column + 1) * block_width)]
            out = Signal(_WIDTH, name=f"r{row}_g{granule}_c{column}")
            read_addr, write_addr, write_en = block_ports(index, row, granule)
            _dp16kd(m, f"block_r{row}_g{granule}_c{column}", self.aspect,
                    write_addr=write_addr, write_data=chunk, write_en=write_en,
                    read_addr=read_addr, read_en=self.read_en, read_data=out)
            row_words[row].append(out[:len(chunk)])
        row_words = [Cat(*word) for word in row_words]
        if self.rows == 1:
            m.d.comb += self.read_data.eq(self._data_register(m, row_words[0]))
            return m
        # The row of the word on the blocks' output registers: the read address's high bits,
        # delayed as the data is up to there (the blocks' read and the address tree).
        row = delay(m, self.read_addr[block_bits:block_bits + row_bits],
                    BlockMemory.latency + len(levels), self.read_en, name="read_row",
                    reset_less=True)
        # The row's word by a balanced tree of two-way choices, one level per bit of the row
        # (lowest first): log2(rows) levels, where a choice per row compared with the row
        # number (``row == index``, one after another) was as many levels as rows (23 at
        # scan_layers_backward's defaults).
        words = row_words
        for bit in range(row_bits):
            words = [Mux(row[bit], words[i + 1], words[i]) if i + 1 < len(words) else words[i]
                     for i in range(0, len(words), 2)]
        m.d.comb += self.read_data.eq(self._data_register(m, words[0]))
        return m

    def _data_register(self, m, word):
        """The read data as it leaves the memory: through a fabric register with an address
        tree (its blocks span the chip), else as it is."""
        if not self.tree_levels:
            return word
        return delay(m, word, 1, self.read_en, name="read_data_far", reset_less=True)


def _address_tree(m, name, value, levels, fanout, en, *, leaf=None):
    """``value`` through register levels of ``levels`` registers each (first to last),
    loading when ``en`` is high: register ``i`` of a level loads its parent's value,
    register ``i // fanout`` of the level before (the first level loads ``value``), or, in
    the last level, ``leaf(i, parent's value)``. Returns the last level's registers."""
    parents = [value]
    for depth, count in enumerate(levels):
        registers = []
        for index in range(count):
            parent = parents[index // fanout]
            loads = leaf(index, parent) if leaf and depth == len(levels) - 1 else parent
            registers.append(_kept_register(m, f"{name}_t{depth}_{index}", loads, en))
        parents = registers
    return parents


def _kept_register(m, name, value, en):
    """A register of ``value`` that loads when ``en`` is high, as ECP5 flip-flop instances
    (one ``TRELLIS_FF`` per bit), which Yosys does not merge with a register of the same
    input."""
    value = Value.cast(value)
    always = isinstance(en, int)
    q = Signal(len(value), name=name)
    for bit in range(len(value)):
        m.submodules[f"{name}_ff{bit}"] = Instance(
            "TRELLIS_FF", p_GSR="DISABLED", p_CEMUX="1" if always else "CE", p_CLKMUX="CLK",
            p_LSRMUX="LSR", p_REGSET="RESET", p_SRMODE="LSR_OVER_CE",
            i_CLK=ClockSignal(), i_LSR=Const(0), i_CE=Const(1) if always else en,
            i_DI=value[bit], o_Q=q[bit])
    return q


def _dp16kd(m, name, aspect, *, write_addr, write_data, write_en, read_addr, read_en,
            read_data):
    """One DP16KD in ``aspect`` (data bits, address bits): port A writes, port B reads
    through its output register (both read stages load when ``read_en`` is high)."""
    block_width, block_bits = aspect
    low = 14 - block_bits                        # the address pins below the word address
    ports = {}
    for i in range(_WIDTH):
        ports[f"i_DIA{i}"] = write_data[i] if i < len(write_data) else Const(0)
        ports[f"i_DIB{i}"] = Const(0)
        ports[f"o_DOB{i}"] = read_data[i]
    for i in range(14):
        # The word address on pins 13..low; in the 18-bit mode pins 1..0 of port A are the
        # write's two 9-bit byte enables (both on).
        ports[f"i_ADA{i}"] = (Const(int(block_width == 18 and i < 2)) if i < low else
                              write_addr[i - low] if i - low < len(write_addr) else Const(0))
        ports[f"i_ADB{i}"] = (Const(0) if i < low else
                              read_addr[i - low] if i - low < len(read_addr) else Const(0))
    for i in range(3):
        ports[f"i_CSA{i}"] = Const(0)
        ports[f"i_CSB{i}"] = Const(0)
    m.submodules[name] = Instance(
        "DP16KD",
        p_DATA_WIDTH_A=block_width, p_DATA_WIDTH_B=block_width,
        p_REGMODE_A="NOREG", p_REGMODE_B="OUTREG",
        p_RESETMODE="SYNC", p_ASYNC_RESET_RELEASE="SYNC",
        p_CSDECODE_A="0b000", p_CSDECODE_B="0b000",
        p_WRITEMODE_A="NORMAL", p_WRITEMODE_B="NORMAL", p_GSR="DISABLED",
        i_CLKA=ClockSignal(), i_CEA=Const(1), i_OCEA=Const(1), i_WEA=write_en, i_RSTA=Const(0),
        i_CLKB=ClockSignal(), i_CEB=read_en, i_OCEB=read_en, i_WEB=Const(0), i_RSTB=Const(0),
        **ports)


def _sim_model():
    def names(prefix, count):
        return ", ".join(f"{prefix}{i}" for i in range(count))

    def bus(prefix, count):
        return "{" + ", ".join(f"{prefix}{i}" for i in reversed(range(count))) + "}"

    assigns = "\n".join(f"    assign DOB{i} = out[{i}];\n    assign DOA{i} = 1'b0;"
                        for i in range(_WIDTH))
    return f"""// Behavioural model of the ECP5 DP16KD subset used by moe_hw: one aspect on both
// ports (1024 x 18 to 16384 x 1), port A writes (both byte enables on), port B reads,
// REGMODE_B NOREG or OUTREG, CEB and OCEB as clock enables, no reset, no chip select.
module DP16KD({names("DIA", 18)}, {names("ADA", 14)}, CEA, OCEA, CLKA, WEA, RSTA,
    CSA2, CSA1, CSA0, {names("DOA", 18)},
    {names("DIB", 18)}, {names("ADB", 14)}, CEB, OCEB, CLKB, WEB, RSTB,
    CSB2, CSB1, CSB0, {names("DOB", 18)});
    parameter DATA_WIDTH_A = 18;
    parameter DATA_WIDTH_B = 18;
    parameter REGMODE_A = "NOREG";
    parameter REGMODE_B = "NOREG";
    parameter RESETMODE = "SYNC";
    parameter ASYNC_RESET_RELEASE = "SYNC";
    parameter CSDECODE_A = "0b000";
    parameter CSDECODE_B = "0b000";
    parameter WRITEMODE_A = "NORMAL";
    parameter WRITEMODE_B = "NORMAL";
    parameter GSR = "DISABLED";
    input {names("DIA", 18)}, {names("ADA", 14)}, CEA, OCEA, CLKA, WEA, RSTA, CSA2, CSA1, CSA0;
    input {names("DIB", 18)}, {names("ADB", 14)}, CEB, OCEB, CLKB, WEB, RSTB, CSB2, CSB1, CSB0;
    output {names("DOA", 18)}, {names("DOB", 18)};
    // The word address's bits: 1024 x 18, 2048 x 9, 4096 x 4, 8192 x 2 or 16384 x 1 (the
    // same width on both ports; the unused data pins are 0 in and out).
    localparam BITS = DATA_WIDTH_B == 18 ? 10 : DATA_WIDTH_B == 9 ? 11 :
                      DATA_WIDTH_B == 4 ? 12 : DATA_WIDTH_B == 2 ? 13 : 14;
    reg [17:0] mem [0:(1 << BITS) - 1];
    reg [17:0] latch = 18'd0;
    reg [17:0] out_reg = 18'd0;
    wire [13:0] ada = {bus("ADA", 14)};
    wire [13:0] adb = {bus("ADB", 14)};
    wire [17:0] data_mask = (18'd1 << DATA_WIDTH_A) - 18'd1;
    integer i;
    initial for (i = 0; i < (1 << BITS); i = i + 1) mem[i] = 18'd0;
    always @(posedge CLKA)
        if (CEA && WEA) mem[ada[13:14 - BITS]] <= {bus("DIA", 18)} & data_mask;
    always @(posedge CLKB) begin
        if (CEB) latch <= mem[adb[13:14 - BITS]];
        if (OCEB) out_reg <= latch;
    end
    wire [17:0] out = (REGMODE_B == "OUTREG") ? out_reg : latch;
{assigns}
endmodule
"""


#: Verilog simulation model of the DP16KD subset that :class:`BlockMemory` instantiates.
DP16KD_SIM = _sim_model()

#: Verilog simulation model of the ECP5 flip-flop as :class:`BlockMemory`'s address tree
#: instantiates it: a register with a clock enable (``CEMUX`` ``"1"`` or ``"CE"``), no set
#: or reset (``LSR`` is 0), 0 at start.
TRELLIS_FF_SIM = """// Behavioural model of the ECP5 TRELLIS_FF subset used by moe_hw: DI
// registered on the rising edge when CE is high (always with CEMUX "1"), LSR unused
// (0), 0 at start.
module TRELLIS_FF(CLK, LSR, CE, DI, M, Q);
    parameter GSR = "ENABLED";
    parameter CEMUX = "1";
    parameter CLKMUX = "CLK";
    parameter LSRMUX = "LSR";
    parameter SRMODE = "LSR_OVER_CE";
    parameter REGSET = "RESET";
    parameter LSRMODE = "LSR";
    input CLK, LSR, CE, DI, M;
    output reg Q = 1'b0;
    always @(posedge CLK)
        if (CEMUX == "1" || CE) Q <= DI;
endmodule
"""
