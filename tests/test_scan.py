"""The scan block (SPEC 1.7, seed 003) in Amaranth's simulator: the seed's example, a prefix
sum and a float running sum on the project's adder, with sequences interleaved, each with and
without random valid/ready stalls on every stream; every beat scored against golden.scan, the
exact stall-free cycle count asserted; bad steps and parameters."""

import numpy as np
import pytest
from amaranth.hdl import Module, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from moe_hw import golden
from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.blocks.scan import CountingStep, FloatSumStep, PrefixSumStep, Scan
from moe_hw.formats import from_bits, to_bits, float_format
from moe_hw.params import ParameterError

from conftest import STALLS


def run_scan(scan, inits, xs, *, stall=0.0, seed=0, sizes=None):
    """Run ``scan`` on ``inits`` [K] and ``xs`` [K, T] (integers: carry and x bit patterns)
    in Amaranth's simulator, feeding ``x`` in the scan's group/round order. Returns the output
    beats (dicts), the cycles from the start cycle to ``done``, and the error flag."""
    sequences, length = xs.shape
    order = [(first + s, t) for first, n in zip(range(0, sequences, scan.max_interleave),
                                                scan.groups(sequences))
             for t in range(length) for s in range(n)]
    x_items = [int(xs[k, t]) for k, t in order]
    init_items = [int(v) for v in inits]
    rng = np.random.default_rng(seed)
    out_bits = Value.cast(scan.o.payload)
    layout = scan.out_layout
    beats, result = [], {}

    async def bench(ctx):
        ctx.set(scan.sequences, sequences if sizes is None else sizes[0])
        ctx.set(scan.length, length if sizes is None else sizes[1])
        ctx.set(scan.start, 1)
        await ctx.tick()
        ctx.set(scan.start, 0)
        sent_x = sent_init = 0
        cycles = 0
        while True:
            cycles += 1
            x_valid = sent_x < len(x_items) and not rng.random() < stall
            init_valid = sent_init < len(init_items) and not rng.random() < stall
            ready = not rng.random() < stall
            ctx.set(scan.x.valid, x_valid)
            ctx.set(scan.x.payload, x_items[sent_x] if x_valid else 0)
            ctx.set(scan.init.valid, init_valid)
            ctx.set(scan.init.payload, init_items[sent_init] if init_valid else 0)
            ctx.set(scan.o.ready, ready)
            if x_valid and ctx.get(scan.x.ready):
                sent_x += 1
            if init_valid and ctx.get(scan.init.ready):
                sent_init += 1
            if ready and ctx.get(scan.o.valid):
                word = ctx.get(out_bits)
                beats.append({name: (word >> field.offset) & ((1 << field.width) - 1)
                              for name, field in layout})
            await ctx.tick()
            if ctx.get(scan.done):
                break
            assert cycles < 50 * (len(x_items) + 10) + 200, "the scan did not finish"
        for _ in range(8):         # nothing leaves after done
            ctx.set(scan.o.ready, 1)
            assert not ctx.get(scan.o.valid)
            await ctx.tick()
        # Counted as the cocotb benches do: from the start cycle (0) to the cycle ``done`` is
        # first high (the testbench sees it a cycle after the edge that set it).
        result.update(cycles=cycles + 1, error=ctx.get(scan.error), x_taken=sent_x,
                      init_taken=sent_init)

    sim = Simulator(scan)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return beats, result


def check_scan(scan, fn, inits, xs, *, stall, seed, mask):
    """Score a run against golden.scan per sequence: every y (with ``ys``), every carry, the
    last flags, the order, and the stall-free cycle count."""
    sequences, length = xs.shape
    beats, result = run_scan(scan, inits, xs, stall=stall, seed=seed)
    assert result["error"] == 0
    assert result["x_taken"] == sequences * length and result["init_taken"] == sequences
    want = []
    for first, n in zip(range(0, sequences, scan.max_interleave), scan.groups(sequences)):
        runs = [golden.scan(fn, int(inits[first + s]), [int(v) for v in xs[first + s]])
                for s in range(n)]
        carries = [[int(inits[first + s])] for s in range(n)]
        for s in range(n):
            for t in range(length):
                carries[s].append(fn(carries[s][-1], int(xs[first + s, t]))[0] & mask)
        if scan.ys:
            want += [{"y": int(runs[s][1][t]) & mask, "carry": carries[s][t + 1],
                      "last": int(t == length - 1)} for t in range(length) for s in range(n)]
        else:
            want += [{"carry": int(runs[s][0]) & mask, "last": 1} for s in range(n)]
    assert len(beats) == len(want), f"{len(beats)} beats, expected {len(want)}"
    for index, (got, expected) in enumerate(zip(beats, want)):
        assert got == expected, f"beat {index}: {got} != {expected}"
    if stall == 0.0:
        assert result["cycles"] == scan.cycles(sequences, length)
    return beats, result


def test_seed_example():
    """init 0, xs [1, 2, 3], fn(c, x) = (c + 1, x + c) gives (3, [1, 3, 5])."""
    scan = Scan(CountingStep(16, latency=1), max_sequences=4, max_length=8, max_interleave=4)
    beats, result = check_scan(scan, lambda c, x: (c + 1, x + c), np.array([0]),
                               np.array([[1, 2, 3]]), stall=0.0, seed=0, mask=0xffff)
    assert [b["y"] for b in beats] == [1, 3, 5] and beats[-1]["carry"] == 3
    assert beats[-1]["last"] == 1
    # One sequence: one step per D + 1 cycles, D = 2 (the input register and the step); the
    # carry's read register adds one cycle to the run.
    assert result["cycles"] == 2 + 2 + 2 * 3 + 1 + 2 + 1 + 2 + 1 + 1


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("latency, interleave, sequences, length", [
    (1, 4, 1, 5),          # one sequence: bubbles between its steps
    (3, 4, 4, 6),          # 4 sequences hide a latency of 3 fully
    (3, 2, 5, 4),          # groups of 2, 2 and 1, each below the period
    (0, 3, 7, 3),          # a combinational step
    (5, 8, 19, 3),         # groups of 8, 8, 3
    (0, 1, 4, 1),          # one-cycle groups: the next group waits for its size
    (1, 2, 5, 1),          # two-cycle groups
])
def test_counting_step_interleaved(latency, interleave, sequences, length, stall):
    rng = np.random.default_rng(latency * 100 + sequences)
    scan = Scan(CountingStep(12, latency=latency), max_sequences=32, max_length=8,
                max_interleave=interleave)
    inits = rng.integers(0, 1 << 12, sequences)
    xs = rng.integers(0, 1 << 12, (sequences, length))
    check_scan(scan, lambda c, x: (c + 1, x + c), inits, xs, stall=stall, seed=3, mask=0xfff)


@pytest.mark.parametrize("stall", STALLS)
def test_prefix_sum_step(stall):
    """The prefix sum is a scan: the ys are golden.prefix_sum's exclusive offsets."""
    rng = np.random.default_rng(1)
    scan = Scan(PrefixSumStep(16), max_sequences=8, max_length=16, max_interleave=2)
    xs = rng.integers(0, 1 << 10, (3, 9))
    beats, _ = check_scan(scan, lambda c, x: (c + x, c), np.zeros(3, int), xs, stall=stall,
                          seed=4, mask=0xffff)
    total, offsets = golden.prefix_sum(xs[0])
    assert [b["y"] for b in beats[0:18:2]] == offsets.tolist()
    assert beats[16]["carry"] == total


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("format", ["fp32", "bf16", "fp16"])
def test_float_running_sum(format, stall):
    """A float running sum on FloatAdderCore: bit for bit the sequential sum in the format
    (one rounding per step, from init), every partial sum and the final one."""
    fmt = float_format(format)
    rng = np.random.default_rng(2)
    sequences, length = 6, 6                        # D = 5 (register + adder): 6 hide it
    values = (rng.standard_normal((sequences, length)) * 10.0 ** rng.integers(-3, 4, (
        sequences, length))).astype(fmt.dtype)
    values[1, 2] = -values[1, 1]                   # exact cancellation: +0
    values[2, 0] = np.inf
    inits = rng.standard_normal(sequences).astype(fmt.dtype)
    inits[3] = -0.0
    scan = Scan(FloatSumStep(format, stages=4), max_sequences=8, max_length=8,
                max_interleave=6, ys=True)
    xs = to_bits(values, fmt).astype(np.int64)
    beats, _ = run_scan(scan, to_bits(inits, fmt).astype(np.int64), xs, stall=stall, seed=5)
    for s in range(sequences):
        carry, ys = golden.scan(lambda c, x: (fmt.dtype.type(c + x),) * 2, inits[s], values[s])
        got = [b["y"] for b in beats[s::sequences]]
        assert np.array_equal(from_bits(np.array(got, dtype=fmt.uint_dtype), fmt).view(
            fmt.uint_dtype), np.asarray(ys, dtype=fmt.dtype).view(fmt.uint_dtype))
        assert beats[(length - 1) * sequences + s]["carry"] == \
            int(np.asarray(carry, dtype=fmt.dtype).view(fmt.uint_dtype))
    if stall == 0.0:
        _, result = run_scan(scan, to_bits(inits, fmt).astype(np.int64), xs)
        assert result["cycles"] == scan.cycles(sequences, length) == \
            2 + 2 + (length - 1) * 6 + 6 + 5 + 1 + 2 + 1 + 1


@pytest.mark.parametrize("stall", STALLS)
def test_final_carries_only(stall):
    """``ys=False``: one beat per sequence, its final carry, in sequence order."""
    rng = np.random.default_rng(6)
    scan = Scan(CountingStep(10, latency=2), max_sequences=16, max_length=8,
                max_interleave=4, ys=False)
    xs = rng.integers(0, 1 << 10, (10, 5))
    check_scan(scan, lambda c, x: (c + 1, x + c), rng.integers(0, 1 << 10, 10), xs,
               stall=stall, seed=7, mask=0x3ff)


@pytest.mark.parametrize("sizes", [(0, 4), (3, 0)])
def test_empty_runs(sizes):
    scan = Scan(CountingStep(8, latency=2), max_sequences=4, max_length=4, max_interleave=2)
    beats, result = run_scan(scan, np.zeros(sizes[0], int), np.zeros(sizes, int))
    assert beats == [] and result["cycles"] == EMPTY_CYCLES and result["error"] == 0
    assert result["x_taken"] == result["init_taken"] == 0


def test_too_big_sets_error():
    scan = Scan(CountingStep(8, latency=2), max_sequences=4, max_length=4, max_interleave=2)
    beats, result = run_scan(scan, np.zeros(2, int), np.zeros((2, 2), int), sizes=(5, 2))
    assert beats == [] and result["error"] == 1 and result["cycles"] == EMPTY_CYCLES


class _NoCarryNext(wiring.Component):
    latency = 1

    def __init__(self):
        super().__init__({"carry": In(4), "x": In(4), "y": Out(4)})

    def elaborate(self, platform):
        return Module()


def test_bad_steps_and_parameters():
    with pytest.raises(TypeError, match="step must be an amaranth.lib.wiring.Component"):
        Scan(3, max_sequences=1, max_length=1, max_interleave=1)
    with pytest.raises(ValueError, match="step must have an out port 'carry_next'"):
        Scan(_NoCarryNext(), max_sequences=1, max_length=1, max_interleave=1)
    with pytest.raises(ParameterError, match="max_interleave must be an integer between 1 and "
                                             "65536, not 0"):
        Scan(CountingStep(), max_sequences=1, max_length=1, max_interleave=0)
    with pytest.raises(ParameterError, match="max_length must be an integer at least 1, "
                                             "not -2"):
        Scan(CountingStep(), max_sequences=1, max_length=-2, max_interleave=1)
    with pytest.raises(ParameterError, match="latency must be an integer, not 'x'"):
        CountingStep(latency="x")
    step = CountingStep()
    del step.__dict__["latency"]
    with pytest.raises(ParameterError, match="step latency must be an integer"):
        Scan(step, max_sequences=1, max_length=1, max_interleave=1)
