"""The memories: the block memory with a registered read (``moe_hw.blocks.block_memory``):
the generic build in Amaranth's simulator against a dictionary, with random read enables and
per-element write enables; the ECP5 build's structure (its DP16KD blocks with the output
register on, in the widest aspect that holds every word). The ECP5 build's behaviour,
under the DP16KD simulation model, against the generic build's in Icarus, cycle by cycle,
and through the MoE layer's pair memory (``test_moe_layer.py``). The banked LUT-RAM memory
(``moe_hw.blocks.banked_memory``) against a dictionary, with words wide enough for several
column groups per bank."""

import re
import subprocess

import numpy as np
import pytest
from amaranth.back import rtlil, verilog

from moe_hw.blocks.banked_memory import BankedMemory
from moe_hw.blocks.block_memory import DP16KD_SIM, TRELLIS_FF_SIM, BlockMemory
from moe_hw.flows.simulate import simulator_available
from moe_hw.params import ParameterError

from test_stream import run_pysim


@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("depth, granules", [(2, 1), (40, 3), (1500, 2)])
def test_block_memory_reads_what_was_written(depth, granules, registered):
    """Random writes and reads against a dictionary; with ``registered_write`` a write lands
    an edge later (a read given in the next cycle does not see it yet)."""
    dut = BlockMemory(12, depth, granules=granules, registered_write=registered)
    rng = np.random.default_rng(depth)
    model = {}
    mismatches = []

    async def bench(ctx):
        pending = []                 # (address, expected word) per read, oldest first
        last = None                  # the write given in the cycle before (registered)
        for cycle in range(600):
            write_addr = int(rng.integers(depth))
            write_en = int(rng.integers(1 << granules))
            values = [int(v) for v in rng.integers(1 << 12, size=granules)]
            read_addr = int(rng.integers(depth))
            read_en = int(rng.random() < 0.6)
            if read_addr == write_addr:          # not allowed in the same cycle
                write_en = 0
            if registered and last is not None and last[0] == read_addr and last[1]:
                read_en = 0                      # the registered write lands at this edge
            ctx.set(dut.write_addr, write_addr)
            ctx.set(dut.write_en, write_en)
            for g in range(granules):
                ctx.set(dut.write_data[g], values[g])
            ctx.set(dut.read_addr, read_addr)
            ctx.set(dut.read_en, read_en)
            if read_en:
                pending.append([model.get((read_addr, g), 0) for g in range(granules)])
                # The word leaves after two enabled cycles: the oldest of three is on the
                # output after this edge.
            await ctx.tick()
            given = (write_addr, write_en, values)
            landed, last = (last, given) if registered else (given, None)
            if landed is not None:
                for g in range(granules):
                    if landed[1] >> g & 1:
                        model[landed[0], g] = landed[2][g]
            if read_en and len(pending) >= 2:
                want = pending[-2]
                got = [ctx.get(dut.read_data[g]) for g in range(granules)]
                if got != want:
                    mismatches.append((cycle, got, want))

    run_pysim(dut, bench)
    assert not mismatches, mismatches[:3]


@pytest.mark.parametrize("depth, width, granules, aspect, rows, blocks", [
    (1000, 20, 2, (18, 10), 1, 4),        # 1024 x 18: two columns per element
    (1500, 20, 2, (9, 11), 1, 6),         # 2048 x 9: three columns per element, one row
    (8192, 256, 1, (2, 13), 1, 128),      # scan_layers' parameters at its defaults
    (16384, 3, 1, (1, 14), 1, 3),
    (20000, 20, 1, (18, 10), 20, 40),     # past 16384 words: rows of 1024 x 18
])
def test_block_memory_ecp5_blocks(depth, width, granules, aspect, rows, blocks):
    """The widest aspect that holds every word, in one row of blocks, each read through its
    output register; rows of 1024 x 18 blocks only past 16384 words."""
    dut = BlockMemory(width, depth, granules=granules, target="ecp5")
    assert (dut.aspect, dut.rows, dut.blocks) == (aspect, rows, blocks)
    text = rtlil.convert(dut)
    assert text.count("cell \\DP16KD ") == blocks
    assert text.count('"OUTREG"') == blocks
    assert text.count(f"parameter \\DATA_WIDTH_B {aspect[0]}") == blocks
    assert "REGMODE_B" in DP16KD_SIM and "module DP16KD" in DP16KD_SIM


_LOCKSTEP_TB = """
module tb #(parameter AW = 1, G = 1, W = 1, DEPTH = 1, SEED = 1, REGISTERED = 0);
    reg clk = 0;
    reg [AW-1:0] write_addr = 0, read_addr = 0, last_addr = 0;
    reg [G-1:0] write_en = 0, last_en = 0;
    reg [G*W-1:0] write_data = 0;
    reg read_en = 0;
    wire [G*W-1:0] generic_data, ecp5_data;
    integer cycle, mismatches = 0, reads = 0, nonzero = 0, k, seed = SEED;
    mem_generic generic(.clk(clk), .rst(1'b0), .write_addr(write_addr),
        .write_data(write_data), .write_en(write_en), .read_addr(read_addr),
        .read_en(read_en), .read_data(generic_data));
    mem_ecp5 ecp5(.clk(clk), .rst(1'b0), .write_addr(write_addr),
        .write_data(write_data), .write_en(write_en), .read_addr(read_addr),
        .read_en(read_en), .read_data(ecp5_data));
    function [AW-1:0] address(input integer r);
        // near the bottom, near the top, or anywhere: every row and aspect edge is hit
        case (r % 3)
            0: address = $unsigned($random(seed)) % 64 % DEPTH;
            1: address = DEPTH - 1 - $unsigned($random(seed)) % 64 % DEPTH;
            default: address = $unsigned($random(seed)) % DEPTH;
        endcase
    endfunction
    initial begin
        for (cycle = 0; cycle < 4000; cycle = cycle + 1) begin
            write_addr = address($unsigned($random(seed)));
            write_en = $random(seed);
            for (k = 0; k < G; k = k + 1)
                write_data[k*W +: W] = $random(seed);
            read_addr = address($unsigned($random(seed)));
            read_en = $unsigned($random(seed)) % 5 < 3;
            // not a word that a write reaches at this edge
            if (read_addr == write_addr) write_en = 0;
            if (REGISTERED && read_addr == last_addr && last_en != 0) read_en = 0;
            #1 clk = 1;
            #1 clk = 0;
            last_addr = write_addr; last_en = write_en;
            if (read_en) reads = reads + 1;
            // (from the third read on: the generic build's output register starts unknown,
            // and so, a read later, does the read data's register of a memory with a tree)
            if (reads >= 3 && generic_data !== ecp5_data) begin
                mismatches = mismatches + 1;
                if (mismatches <= 3)
                    $display("cycle %0d: generic %h, ecp5 %h", cycle, generic_data, ecp5_data);
            end
            if (generic_data != 0) nonzero = nonzero + 1;
        end
        $display("mismatches %0d reads %0d nonzero %0d", mismatches, reads, nonzero);
        $finish;
    end
endmodule
"""


@pytest.mark.skipif(simulator_available("icarus") is not None,
                    reason=str(simulator_available("icarus")))
@pytest.mark.parametrize("depth, width, granules, registered, fanout", [
    (700, 12, 3, False, None), (1500, 20, 2, True, None), (5000, 12, 1, False, None),
    (16384, 3, 2, True, None), (20000, 7, 1, False, None),
    # address trees: one level (10 blocks, 3 registers), three levels (10 blocks: 2, 3, 5
    # registers), three levels over rows (40 blocks: 2, 5, 14; a register's blocks span rows)
    (8192, 20, 1, True, 4), (2000, 40, 2, False, 2), (20000, 7, 2, True, 3)])
def test_block_memory_ecp5_matches_generic(tmp_path, depth, width, granules, registered,
                                           fanout):
    """The ECP5 build (DP16KD blocks and flip-flops under their simulation models) and the
    generic build side by side in Icarus, the same random writes (per-element enables) and
    reads (random read enables): the same ``read_data`` in every cycle, in every aspect, with
    rows, and with address trees (a read ``latency`` cycles after its address on both)."""
    mems = [BlockMemory(width, depth, granules=granules, target=target,
                        registered_write=registered, fanout=fanout)
            for target in ("generic", "ecp5")]
    levels = mems[1].tree_levels
    assert mems[0].latency == mems[1].latency == 2 + len(levels) + bool(levels)
    designs = [verilog.convert(mem, name=f"mem_{mem.target}") for mem in mems]
    sources = []
    for name, text in (("generic.v", designs[0]),
                       ("ecp5.v", designs[1] + DP16KD_SIM + TRELLIS_FF_SIM),
                       ("tb.v", _LOCKSTEP_TB)):
        (tmp_path / name).write_text(text)
        sources.append(str(tmp_path / name))
    params = {"AW": max(1, (depth - 1).bit_length()), "G": granules, "W": width,
              "DEPTH": depth, "SEED": depth, "REGISTERED": int(registered)}
    subprocess.run(["iverilog", "-g2012", "-s", "tb", "-o", str(tmp_path / "tb.vvp"),
                    *[f"-Ptb.{name}={value}" for name, value in params.items()], *sources],
                   check=True, capture_output=True, text=True)
    out = subprocess.run(["vvp", "-n", str(tmp_path / "tb.vvp")], check=True,
                         capture_output=True, text=True).stdout
    found = re.search(r"mismatches (\d+) reads (\d+) nonzero (\d+)", out)
    assert found, out
    mismatches, reads, nonzero = map(int, found.groups())
    assert reads > 2000 and nonzero > 500
    assert mismatches == 0, out


def test_block_memory_errors():
    with pytest.raises(ParameterError, match="^target must be generic or ecp5, not 'xilinx'$"):
        BlockMemory(8, 16, target="xilinx")
    with pytest.raises(ParameterError, match="depth"):
        BlockMemory(8, 0)


@pytest.mark.parametrize("width, depth, bank_depth, latency",
                         [(40, 200, 64, 3), (7, 64, 64, 3), (16, 1, 64, 3),
                          (12, 600, 16, 4), (5, 600, 2, 5)])
def test_banked_memory_reads_what_was_written(width, depth, bank_depth, latency):
    """Random writes and reads with random read enables, against a dictionary. A read's
    address is registered at one enabled edge and the banks are read at the next: the word
    is the one written by the writes given two or more cycles before that second edge (a
    write is registered, then written); it is out ``latency`` enabled edges after the
    address (3 up to 8 banks, a cycle more per level of the select tree: 38 banks, 300)."""
    dut = BankedMemory(width, depth, bank_depth=bank_depth)
    assert dut.latency == BankedMemory.read_latency(depth, bank_depth) == latency
    rng = np.random.default_rng(width + depth)
    writes = []                     # (cycle, address, value)
    mismatches = []

    def state(last_cycle):
        words = {}
        for cycle, addr, value in writes:
            if cycle <= last_cycle:
                words[addr] = value
        return words

    async def bench(ctx):
        presented = None            # the address registered at the last enabled edge
        expected = []               # the words read at the banks, oldest first
        for cycle in range(600):
            write_en = int(rng.random() < 0.5)
            write_addr, value = int(rng.integers(depth)), int(rng.integers(1 << width))
            read_en = int(rng.random() < 0.7)
            read_addr = int(rng.integers(depth))
            ctx.set(dut.write_en, write_en)
            ctx.set(dut.write_addr, write_addr)
            ctx.set(dut.write_data, value)
            ctx.set(dut.read_en, read_en)
            ctx.set(dut.read_addr, read_addr)
            if read_en:
                if presented is not None:        # the banks read it at this edge
                    expected.append(state(cycle - 2).get(presented))
                presented = read_addr
            await ctx.tick()
            if write_en:
                writes.append((cycle, write_addr, value))
            if read_en and len(expected) >= latency - 1:   # read latency - 1 edges ago
                want, got = expected[1 - latency], ctx.get(dut.read_data)
                if want is not None and got != want:
                    mismatches.append((cycle, got, want))

    run_pysim(dut, bench)
    assert not mismatches, mismatches[:3]
    assert len(writes) > 100


def _memory_unit(depth, init):
    from amaranth.hdl import Module
    from amaranth.lib import memory, wiring
    from amaranth.lib.wiring import In, Out

    class Unit(wiring.Component):
        addr: In(range(depth))
        data: In(8)
        en: In(1)
        q: Out(8)

        def elaborate(self, platform):
            m = Module()
            m.submodules.store = store = memory.Memory(shape=8, depth=depth, init=init)
            write, read = store.write_port(), store.read_port()
            m.d.comb += [write.addr.eq(self.addr), write.data.eq(self.data),
                         write.en.eq(self.en), read.addr.eq(self.addr), self.q.eq(read.data)]
            return m

    return Unit()


def test_zero_initialised_memories_emit_one_loop():
    """A zero-initialised memory's contents stay out of the netlist: one zeroing ``initial``
    loop, whatever the depth (the text does not grow with it); a memory with contents keeps
    them word by word."""
    from moe_hw.flows.emit import emit_verilog

    small = emit_verilog(_memory_unit(4, []), "top")
    large = emit_verilog(_memory_unit(65536, []), "top")
    for text, top in ((small, 3), (large, 65535)):
        assert f"zero_init_0 <= {top}; zero_init_0 = zero_init_0 + 1) store [zero_init_0] = 0;" \
            in text
        assert "store[0] = " not in text
    assert len(large) - len(small) < 64
    initialised = emit_verilog(_memory_unit(4, [1, 2, 3, 4]), "top")
    assert "store[3] = 8'h04;" in initialised and "zero_init" not in initialised
