"""A LUT-RAM memory with a pipelined read: deep tables that a 250 MHz stage can read.

One distributed-RAM memory of a few hundred words is read through a wide multiplexer tree
behind an address that fans out to every LUT-RAM cell: on ECP5 a 512-word read is 6 ns. Here
the words are split into banks of ``bank_depth`` (64: four LUT-RAM rows and one 4:1 multiplexer
each) and the read takes three enabled cycles: the address is registered once per bank, every
bank reads its word into a register, and a last register selects the bank's word. More than
``select_fanin`` (:data:`SELECT_FANIN`, 8) banks select in a registered tree, a cycle per level
of up to eight: 9-64 banks read in four cycles (:meth:`BankedMemory.read_latency`); one AND-OR
over 32 banks was three LUT levels behind a flag routed across the banks.

Yosys merges registers with the same input bit by bit (``opt_merge``), which would leave one
address register driving every bank's cells. Each bank's copies of the read and the write
address are therefore kept registers (:data:`moe_hw.stream.KEPT`), as many as there are
banks. (They were the address XOR the bank's number, which keeps apart only two kinds of
register per bit: 32 banks shared 8 registers of their 4 address bits, each driving 16
banks' cells.)

Ports:

``write_addr``, ``write_data``, ``write_en`` (in)
    A write: registered (per bank) at the clock edge of the cycle ``write_en`` is high, and
    written into the bank at the next edge.
``read_addr``, ``read_en`` (in); ``read_data`` (out)
    A read: every read register loads when ``read_en`` is high; the word at ``read_addr`` (given
    in a cycle with ``read_en`` high) is on ``read_data`` after :attr:`latency` (3 up to 8
    banks, 4 up to 64) such cycles, and holds while ``read_en`` is low. A write is seen by a
    read whose address is registered after the write's edge.

Memories: ``amaranth.lib.memory`` with ``ram_style = "distributed"`` (an inferred ECP5 block
RAM has no output register: its 4 ns clock-to-output would fill the cycle).
"""

import operator
from functools import reduce

from amaranth.hdl import Module, Signal, Value
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..params import check_int
from ..stream.pipeline import kept_signal

__all__ = ["BankedMemory", "SELECT_FANIN"]

#: Banks (or groups of banks) that one registered level of the bank select combines.
SELECT_FANIN = 8


class BankedMemory(wiring.Component):
    """``depth`` words of ``shape`` in LUT-RAM banks with a pipelined read of
    :attr:`latency` cycles; see the module docstring."""

    @staticmethod
    def read_latency(depth, bank_depth=64, select_fanin=SELECT_FANIN):
        """The read latency of a memory of ``depth`` words in banks of ``bank_depth``: the
        address copy, the bank's read, then one level of the bank select per factor of
        ``select_fanin`` banks (one level for one bank)."""
        banks = -(-depth // min(bank_depth, depth))
        levels = 1
        while banks > select_fanin:
            banks = -(-banks // select_fanin)
            levels += 1
        return 2 + levels

    def __init__(self, shape, depth, *, bank_depth=64, select_fanin=SELECT_FANIN):
        self.shape = shape
        self.select_fanin = check_int("select_fanin", select_fanin, minimum=2)
        self.depth = check_int("depth", depth, minimum=1, maximum=1 << 16)
        self.bank_depth = min(check_int("bank_depth", bank_depth, minimum=2), self.depth)
        super().__init__({
            "write_addr": In(range(self.depth)), "write_data": In(shape), "write_en": In(1),
            "read_addr": In(range(self.depth)), "read_en": In(1), "read_data": Out(shape),
        })

    @property
    def banks(self):
        return -(-self.depth // self.bank_depth)

    @property
    def latency(self):
        return self.read_latency(self.depth, self.bank_depth, self.select_fanin)

    def elaborate(self, platform):
        m = Module()
        low_bits = ceil_log2(self.bank_depth)
        words = []
        for index in range(self.banks):
            bank = memory.Memory(shape=self.shape, depth=self.bank_depth, init=[],
                                 attrs={"ram_style": "distributed"})
            m.submodules[f"bank{index}"] = bank
            write = bank.write_port()
            read = bank.read_port(domain="sync")
            # The write is registered per bank, the bank decoded before the register: the
            # LUT RAM's write enable and address are flip-flops.
            write_addr = kept_signal(low_bits, name=f"bank{index}_write_addr")
            write_data = Signal(self.shape, name=f"bank{index}_write_data")
            write_en = Signal(name=f"bank{index}_write_en")
            m.d.sync += [
                write_addr.eq(self.write_addr[:low_bits]),
                write_data.eq(self.write_data),
                write_en.eq(self.write_en & ((self.write_addr >> low_bits) == index)),
            ]
            m.d.comb += [write.addr.eq(write_addr), write.data.eq(write_data),
                         write.en.eq(write_en)]
            # Stage 1: this bank's own copy of the address.
            addr = kept_signal(low_bits, name=f"bank{index}_addr")
            with m.If(self.read_en):
                m.d.sync += addr.eq(self.read_addr[:low_bits])
            # Stage 2: the bank's word (the read port's register).
            m.d.comb += [read.addr.eq(addr), read.en.eq(self.read_en)]
            words.append(read.data)
        # Stage 3 on: the selected word, as an AND-OR of the banks' words with a "this bank"
        # flag registered beside each bank's word in stage 2: each flag drives its own bank's
        # bits only, where one bank number would fan out to a multiplexer for every bit. Past
        # SELECT_FANIN banks the OR is a registered tree (the flags then select a group's
        # word, and the groups' ORs meet a cycle later).
        if self.banks == 1:
            with m.If(self.read_en):
                m.d.sync += self.read_data.eq(words[0])
            return m
        select = Signal(range(self.banks))
        terms = []
        for index in range(self.banks):
            hit = Signal(name=f"bank{index}_hit")
            with m.If(self.read_en):
                m.d.sync += hit.eq(select == index)
            word = Value.cast(words[index])
            terms.append(word & hit.replicate(len(word)))
        with m.If(self.read_en):
            m.d.sync += select.eq(self.read_addr >> low_bits)
        level = 0
        fanin = self.select_fanin
        while len(terms) > fanin:
            groups = []
            for first in range(0, len(terms), fanin):
                group = Signal(len(terms[0]), name=f"select{level}_group{first // fanin}")
                with m.If(self.read_en):
                    m.d.sync += group.eq(reduce(operator.or_, terms[first:first + fanin]))
                groups.append(group)
            terms, level = groups, level + 1
        with m.If(self.read_en):
            m.d.sync += self.read_data.eq(reduce(operator.or_, terms))
        return m
