"""cocotb bench for a two-operand float stream unit (fmul, fadd): streams the (a, b) pairs in
with random valid pauses, takes every result with random ready pauses, and records the results
in order and the exact cycle count. The host side scores them bit for bit."""

import numpy as np

import cocotb
from harness import (Pauses, Run, StreamSink, StreamSource, edge, reset, reset_mid_problem,
                     run_until)


@cocotb.test()
async def binop(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    i_layout, o_layout = run.layout("i__payload"), run.layout("o__payload")
    items = [i_layout.pack(a=a, b=b) for a, b in zip(st["a"].tolist(), st["b"].tolist())]
    await reset(dut)
    source = StreamSource(dut, "i", items, Pauses(s["stall"], s["seed"]))
    sink = StreamSink(dut, "o", Pauses(s["stall"], s["seed"] + 1))
    await reset_mid_problem(dut, [source, sink], {}, moved=lambda: (len(sink.items),))
    for actor in (source, sink):
        actor.step()                   # the first operands are offered from cycle 0 on
    # cycles: from the edge that takes the first operands to the one that takes the last
    # result, both counted (stall-free: count + latency).
    cycles = await run_until(dut, [source, sink], lambda: len(sink.items) == len(items),
                             40 * len(items) + 1000, s["unit"])
    for _ in range(8 + run.manifest.get("latency", 0)):   # nothing extra may come out
        await edge(dut, [sink])
    assert len(sink.items) == len(items), f"{len(sink.items) - len(items)} extra results"
    field = s["result"]
    run.save(result=np.array([o_layout.unpack(w, field) for w in sink.items], dtype=np.uint64),
             cycles=cycles)
