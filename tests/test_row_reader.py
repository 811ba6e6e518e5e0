"""The row reader (``moe_hw.blocks.row_reader``) by itself, in Amaranth's simulator: random
row segments (read and skipped, one beat and more, partial last beats) against a memory of
fixed latency, with and without random stalls on every stream. A scoreboard checks every
beat and every request; without stalls, one beat per cycle."""

from collections import deque

import numpy as np
import pytest
from amaranth.hdl import Value
from amaranth.lib import data

from moe_hw.blocks.row_reader import RowReader

from conftest import STALLS, run_pysim

LANES, WIDTH, ADDR = 4, 16, 12
LAST_ENABLE = 0b0011


def segments(seed, n=60, max_count=4):
    """Random commands: (addr, count, tail, skip, id)."""
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(0, 1 << (ADDR - 1))), int(rng.integers(1, max_count + 1)),
             bool(rng.random() < 0.5), bool(rng.random() < 0.25), n_id)
            for n_id in range(n)]


def expected(commands):
    """The beats (data per lane, enable, last, id) and the reads (addr, enable) the
    commands make."""
    beats, reads = [], []
    for addr, count, tail, skip, n_id in commands:
        for k in range(count):
            last = k == count - 1
            enable = LAST_ENABLE if last and tail else (1 << LANES) - 1
            at = addr + k * LANES
            element = [0 if skip else (at + lane) % (1 << WIDTH) for lane in range(LANES)]
            beats.append((element, enable, last, n_id))
            if not skip:
                reads.append((at % (1 << ADDR), enable))
    return beats, reads


def make_reader(max_count=4, buffered=False, skips=True):
    return RowReader(lanes=LANES, width=WIDTH, addr_width=ADDR, max_count=max_count,
                     tag_layout=data.StructLayout({"id": 8}), outstanding=8,
                     buffered_command=buffered, skips=skips)


def run_reader(commands, p, seed, *, latency=3, max_count=4, buffered=False, skips=True):
    dut = make_reader(max_count, buffered, skips)
    rng = np.random.default_rng(seed)
    got, reads, cycles = [], [], []
    total = sum(count for _, count, *_ in commands)
    response_bits = Value.cast(dut.response.payload)

    async def producer(ctx):
        ctx.set(dut.last_enable, LAST_ENABLE)
        for addr, count, tail, skip, n_id in commands:
            while rng.random() < p:
                await ctx.tick()
            ctx.set(dut.command.payload, {"addr": addr, "count": count, "tail": tail,
                                          "skip": skip, "tag": {"id": n_id}})
            ctx.set(dut.command.valid, 1)
            await ctx.tick().until(dut.command.ready)
            ctx.set(dut.command.valid, 0)

    async def memory(ctx):
        pending = deque()                        # (cycle it may answer, addr)
        cycle = 0
        while len(got) < total:
            ready = not rng.random() < p
            ctx.set(dut.request.ready, ready)
            answer = bool(pending) and pending[0][0] <= cycle and not rng.random() < p
            ctx.set(dut.response.valid, answer)
            if answer:
                at = pending[0][1]
                ctx.set(response_bits, sum(((at + lane) % (1 << WIDTH)) << (lane * WIDTH)
                                           for lane in range(LANES)))
            _, _, r_valid, addr, enable, s_ready = await ctx.tick().sample(
                dut.request.valid, dut.request.payload.addr, dut.request.payload.enable,
                dut.response.ready)
            if r_valid and ready:
                reads.append((addr, enable))
                pending.append((cycle + latency, addr))
                assert len(pending) <= 8, "more reads in flight than the reader allows"
            if answer and s_ready:
                pending.popleft()
            cycle += 1
            assert cycle < 40 * total + 200, "the reader hangs"

    async def consumer(ctx):
        cycle = 0
        while len(got) < total:
            ready = not rng.random() < p
            ctx.set(dut.beats.ready, ready)
            _, _, valid, beat = await ctx.tick().sample(dut.beats.valid, dut.beats.payload)
            if valid and ready:
                got.append(([int(beat.data[lane]) for lane in range(LANES)], beat.enable,
                            bool(beat.last), beat.tag.id))
                cycles.append(cycle)
            cycle += 1
            assert cycle < 40 * total + 200, "the reader hangs"

    run_pysim(dut, producer, memory, consumer)
    return got, reads, cycles


@pytest.mark.parametrize("skips", [True, False], ids=["skips", "reads_only"])
@pytest.mark.parametrize("buffered", [False, True], ids=["direct", "buffered"])
@pytest.mark.parametrize("max_count", [4, 1])    # 1: one beat per command (combine_gather)
@pytest.mark.parametrize("p", STALLS)
def test_row_reader_beats_and_reads(p, max_count, buffered, skips):
    """The reads and beats in order; ``skips=False`` (moe_layer's expert reader) with
    commands that skip nothing."""
    commands = segments(7, max_count=max_count)
    if not skips:
        commands = [(addr, count, tail, 0, n_id) for addr, count, tail, _, n_id in commands]
    got, reads, cycles = run_reader(commands, p, 11, max_count=max_count, buffered=buffered,
                                    skips=skips)
    beats, wanted = expected(commands)
    assert reads == wanted
    assert got == beats
    if not p:
        # one beat per cycle once the first is out (the memory's latency, 3, is below the
        # 8 beats in flight)
        assert cycles == list(range(cycles[0], cycles[0] + len(cycles)))


@pytest.mark.parametrize("buffered", [False, True], ids=["direct", "buffered"])
def test_row_reader_first_beat_latency(buffered):
    """Stall-free, a command taken at the end of cycle t issues its first read in cycle
    t + 1, buffered or not; and a reader of one-beat segments takes one command per cycle."""
    commands = segments(3, n=20, max_count=1)
    dut = make_reader(1, buffered)
    taken, issued = [], []

    async def bench(ctx):
        ctx.set(dut.last_enable, LAST_ENABLE)
        ctx.set(dut.request.ready, 1)
        ctx.set(dut.response.valid, 1)          # a memory that answers at once
        ctx.set(dut.beats.ready, 1)
        cycle = 0
        for addr, count, tail, _, n_id in commands:
            ctx.set(dut.command.payload, {"addr": addr, "count": count, "tail": tail,
                                          "skip": 0, "tag": {"id": n_id}})
            ctx.set(dut.command.valid, 1)
            while cycle < 100:
                _, _, ready, r_valid = await ctx.tick().sample(dut.command.ready,
                                                               dut.request.valid)
                if r_valid:
                    issued.append(cycle)
                cycle += 1
                if ready:
                    taken.append(cycle - 1)
                    break
        ctx.set(dut.command.valid, 0)
        for _ in range(3):
            _, _, r_valid = await ctx.tick().sample(dut.request.valid)
            if r_valid:
                issued.append(cycle)
            cycle += 1

    run_pysim(dut, bench)
    assert taken == list(range(len(commands)))
    assert issued == [t + 1 for t in taken]


def test_row_reader_buffered_command_ready_is_a_register():
    """With ``buffered_command`` the command's ready does not follow the memory's ready
    within a cycle (it is the buffer's empty flag); without, it does: a segment that is
    issuing its last beat frees the reader only while the memory takes it."""
    seen = {}
    for buffered in (False, True):
        dut = make_reader(4, buffered)
        follows = []

        async def bench(ctx, dut=dut, follows=follows):
            ctx.set(dut.last_enable, LAST_ENABLE)
            ctx.set(dut.beats.ready, 1)
            ctx.set(dut.request.ready, 0)
            ctx.set(dut.command.valid, 1)
            ctx.set(dut.command.payload, {"addr": 8, "count": 1, "tail": 1, "skip": 0,
                                          "tag": {"id": 1}})
            for _ in range(4):
                await ctx.tick()
                ctx.set(dut.request.ready, 0)
                low = ctx.get(dut.command.ready)
                ctx.set(dut.request.ready, 1)
                high = ctx.get(dut.command.ready)
                follows.append(low != high)
                ctx.set(dut.request.ready, 0)

        run_pysim(dut, bench)
        seen[buffered] = follows
    assert any(seen[False]), "the direct reader's ready should follow the memory's"
    assert not any(seen[True]), "the buffered reader's ready follows the memory's ready"


@pytest.mark.parametrize("p", STALLS)
def test_row_reader_buffered_slow_memory(p):
    """A memory slower than the in-flight queue is deep: every slot of the queue holds a
    one-beat segment, and the buffered reader's tags of those segments, the current one's and
    the waiting one's are all held at once."""
    commands = segments(5, max_count=1)
    got, reads, _ = run_reader(commands, p, 13, latency=14, max_count=1, buffered=True)
    beats, wanted = expected(commands)
    assert reads == wanted
    assert got == beats
