"""A FIFO in block RAM whose output and flags are registers, and the level counter it
keeps its flags with: the AXI masters' word and response FIFOs, the row reader's deep
in-flight queue (256 beats behind an AXI read master) and dispatch_backward_gate's deep
descriptor queue (:func:`block_queue`).

:func:`block_fifo` writes the entries into a :class:`~moe_hw.blocks.block_memory.BlockMemory`
(through a register; a two-cycle read) and reads them ahead into a
:class:`~moe_hw.stream.CreditPipeline`'s queue, so that no block RAM output and no flag is
combinational logic's input; an entry written in cycle c is on the output from cycle
c + :data:`BLOCK_FIFO_LATENCY`. :func:`block_queue` is such a FIFO with the ports of a
:class:`~moe_hw.stream.CreditPipeline` without a datapath, for a queue too deep for a
LUT-RAM ring. :func:`count_level` keeps a level count and flags of it
whose next values are choices among compares of the count with constants (no carry chain
between the count and a flag). :func:`next_slot` steps a ring pointer.
"""

from types import SimpleNamespace

from amaranth.hdl import Const, Mux, Signal
from amaranth.lib.data import StructLayout, View

from ..stream import CreditPipeline, delay
from .block_memory import BlockMemory

__all__ = ["block_fifo", "block_fifo_depth", "block_queue", "count_level", "next_slot",
           "BLOCK_FIFO_AHEAD", "BLOCK_FIFO_LATENCY"]

#: Cycles from an entry's write (``write`` high in cycle c) to it on the output (``o.valid``
#: from cycle c + this, stall-free, the FIFO empty before): the write register, the flag
#: that the RAM can be read (a register), the block's two-cycle read and the read-ahead queue.
BLOCK_FIFO_LATENCY = 2 + BlockMemory.latency + CreditPipeline.QUEUE_LATENCY

#: Entries the read-ahead queue holds at most, beside the block RAM's ``depth - 1``: its
#: credits, the :class:`~moe_hw.stream.CreditPipeline`'s depth (the least for one entry per
#: cycle at the RAM's latency), which :func:`block_fifo` gives it.
BLOCK_FIFO_AHEAD = BlockMemory.latency + 3


def block_fifo(m, name, *, width, depth, target, write, data, room=None, wide=False,
               group_bits=None):
    """A FIFO of ``depth`` entries of ``width`` bits in a
    :class:`~moe_hw.blocks.block_memory.BlockMemory` (``target``; written through a
    register, read in two cycles) read ahead into a
    :class:`~moe_hw.stream.CreditPipeline`'s queue, so that no block RAM output and no flag
    is combinational logic's input. ``write``, ``data``: an entry goes in (the caller makes
    sure there is room); ``room`` (optional, a register the caller made with init 1): set
    to whether an entry fits in the next cycle, from this cycle's count (a compare of a
    register, which no handshake reaches), so that the FIFO holds up to ``depth - 1``
    entries. Its submodules are
    ``<name>_store`` and ``<name>_ahead`` (``store`` and ``ahead`` without a name).
    ``wide``: the output is a bus word whose consumer registers it: the output skid buffer
    holds it in two registers written in turn (its ``alternate``), so that the consumer's take
    reaches no bus-wide clock enable; ``o.payload`` is then a layout of one field, ``data``;
    ``group_bits``: the skid buffer's, for an early ``o.ready`` (see
    :class:`~moe_hw.stream.SkidBuffer`). Returns ``(ahead, empty)``: the pipeline (its ``o``
    the FIFO's output stream, ``busy`` an entry in its queue) and a register that is high while
    the block RAM holds no entry."""
    prefix = f"{name}_" if name else ""
    store = m.submodules[f"{prefix}store"] = BlockMemory(width, depth, target=target,
                                                          registered_write=True)
    ahead = m.submodules[f"{prefix}ahead"] = (
        CreditPipeline(BlockMemory.latency, StructLayout({"data": width}),
                       depth=BLOCK_FIFO_AHEAD, alternate=("data",), group_bits=group_bits)
        if wide else CreditPipeline(BlockMemory.latency, width, depth=BLOCK_FIFO_AHEAD))
    w_ptr = Signal(range(depth), name=f"{prefix}w_ptr")
    r_ptr = Signal(range(depth), name=f"{prefix}r_ptr")
    used = Signal(range(depth + 1), name=f"{prefix}used")     # written and not yet read
    empty = Signal(init=1, name=f"{prefix}empty")               # used == 0 (a register)
    readable = Signal(range(depth + 1), name=f"{prefix}readable")   # the RAM can be read for
    nonempty = Signal(name=f"{prefix}nonempty")                 # readable != 0 (a register)
    written = delay(m, write, 1, 1, name=f"{prefix}written")   # an entry reaches the RAM
    read = ahead.take
    m.d.comb += [
        store.write_addr.eq(w_ptr), store.write_data.eq(data), store.write_en.eq(write),
        store.read_addr.eq(r_ptr), store.read_en.eq(1),
        ahead.i_valid.eq(nonempty), ahead.payload.eq(store.read_data),
    ]
    with m.If(write):
        m.d.sync += w_ptr.eq(next_slot(w_ptr, depth))
    with m.If(read):
        m.d.sync += r_ptr.eq(next_slot(r_ptr, depth))
    if room is not None:
        # (as the next count's flag, the take and the FIFO's read ran through the count's
        # choice into it: 4 levels in the write master)
        m.d.sync += room.eq(used < depth - 1)
    count_level(m, used, write, read, [(empty, True, 0)])
    count_level(m, readable, written, read, [(nonempty, False, 0)])
    return ahead, empty


def block_fifo_depth(entries):
    """The ``depth`` to give :func:`block_fifo` for a FIFO that holds ``entries`` in all (a
    queue of that many credits): ``depth - 1`` in the block RAM (``room``'s bound) and
    :data:`BLOCK_FIFO_AHEAD` in the read-ahead queue."""
    return entries - BLOCK_FIFO_AHEAD + 1


def block_queue(m, name, layout, *, entries, target):
    """A queue of up to ``entries`` items of ``layout`` (a ``StructLayout``) in block RAM
    (:func:`block_fifo` on ``target``, ``entries`` in all: :func:`block_fifo_depth`), with
    the ports of ``CreditPipeline(0, layout, depth=entries)`` for the code that drives it:
    ``i_valid`` (in), ``i_ready`` (a register: an item fits), ``take``, ``payload`` (in, the
    item taken), ``o`` (``valid``, ``ready``, ``payload`` as a view of ``layout``) and
    ``busy`` (an item is inside). An item taken in cycle c is at the head from cycle
    c + :data:`BLOCK_FIFO_LATENCY` (the ring's is
    :attr:`~moe_hw.stream.CreditPipeline.QUEUE_LATENCY`)."""
    room = Signal(init=1)                       # an item fits (a register)
    i_valid, take = Signal(), Signal()
    pushed = Signal(layout)
    fifo, fifo_empty = block_fifo(m, name, width=layout.size,
                                  depth=block_fifo_depth(entries), target=target,
                                  write=take, data=pushed, room=room)
    m.d.comb += take.eq(i_valid & room)
    return SimpleNamespace(
        i_valid=i_valid, i_ready=room, take=take, payload=pushed,
        o=SimpleNamespace(valid=fifo.o.valid, ready=fifo.o.ready,
                          payload=View(layout, fifo.o.payload)),
        busy=~fifo_empty | fifo.busy)


def next_slot(ptr, depth):
    """The slot after ``ptr`` in a ring of ``depth`` slots."""
    if depth & (depth - 1):
        return Mux(ptr == depth - 1, 0, ptr + 1)
    return (ptr + 1)[:len(ptr)]


def count_level(m, level, grows_by, shrinks_by, flags):
    """``level`` (a register) counts ``grows_by`` up and ``shrinks_by`` down; each of
    ``flags`` (``(register, equal, constant)``) is whether the next level equals ``constant``
    (differs from it, when not ``equal``): a choice by the two among three compares of the
    level with constants (``constant`` - 1, + 1 and itself), so that no carry chain lies
    between the level and the flag."""
    grows = grows_by & ~shrinks_by
    shrinks = shrinks_by & ~grows_by
    m.d.sync += level.eq(Mux(grows, level + 1, Mux(shrinks, level - 1, level)))
    for flag, equal, constant in flags:
        def at(value):
            hit = (level == value) if 0 <= value < 1 << len(level) else Const(0, 1)
            return hit if equal else ~hit
        m.d.sync += flag.eq(Mux(grows, at(constant - 1),
                                Mux(shrinks, at(constant + 1), at(constant))))
