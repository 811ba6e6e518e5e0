"""The memories: the block memory with a registered read (``moe_hw.blocks.block_memory``):
the generic build in Amaranth's simulator against a dictionary, with random read enables and
per-element write enables; the ECP5 build's structure (its DP16KD blocks with the output
register on). The ECP5 build's behaviour, under the DP16KD simulation model, is checked
through the MoE layer's pair memory (``test_moe_layer.py``). The banked LUT-RAM memory
(``moe_hw.blocks.banked_memory``) against a dictionary, with words wide enough for several
column groups per bank."""

import numpy as np
import pytest
from amaranth.back import rtlil

from moe_hw.blocks.banked_memory import BankedMemory
from moe_hw.blocks.block_memory import DP16KD_SIM, BlockMemory
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


def test_block_memory_ecp5_blocks():
    """1500 words of two 20-bit elements: two rows of two 18-bit columns per element, every
    block read through its output register."""
    dut = BlockMemory(20, 1500, granules=2, target="ecp5")
    assert dut.rows == 2 and dut.blocks == 8
    text = rtlil.convert(dut)
    assert text.count("cell \\DP16KD ") == 8
    assert text.count('"OUTREG"') == 8
    assert "REGMODE_B" in DP16KD_SIM and "module DP16KD" in DP16KD_SIM


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
