"""Bench for a stream stage that passes items through unchanged (the skid buffer): every item
comes out once, in order, with random stalls on both sides."""

import cocotb

from harness import Pauses, Run, StreamSink, StreamSource, reset, run_until


@cocotb.test()
async def passthrough(dut):
    run = Run()
    items = [int(x) for x in run.stimulus["items"]]
    p = run.settings.get("stall", 0.0)
    seed = run.settings.get("seed", 0)
    await reset(dut)
    source = StreamSource(dut, "i", items, Pauses(p, seed))
    sink = StreamSink(dut, "o", Pauses(p, seed + 1))
    cycles = run_until(dut, [source, sink], lambda: len(sink.items) == len(items),
                       limit=10 * len(items) + 100)
    cycles = await cycles
    assert sink.items == items, "items lost, duplicated or reordered"
    run.save(items=sink.items, cycles=cycles)
