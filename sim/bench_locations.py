"""cocotb bench for the location generator: drives the index stream (one beat per (k, i) pair,
k-major), takes every location and every expert count with random ready stalls, and records
both streams in arrival order, the status outputs and the exact cycle count. The host side
(moe_hw.host.locations) scores them."""

import numpy as np

import cocotb
from harness import Pauses, Run, StreamSink, StreamSource, high, reset, run_once


@cocotb.test()
async def locations(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    index = run.layout("index__payload")
    items = [index.pack(index=i) for i in st["index"].tolist()]

    await reset(dut, inputs=["start", "pairs", "num_experts", "capacity"])
    stall, seed = s["stall"], s["seed"]
    source = StreamSource(dut, "index", items, Pauses(stall, seed))
    location_sink = StreamSink(dut, "location", Pauses(stall, seed + 1))
    count_sink = StreamSink(dut, "counts", Pauses(stall, seed + 2))
    actors = [source, location_sink, count_sink]

    cycles = await run_once(dut, actors, {name: s[name] for name in ("pairs", "num_experts",
                                                                     "capacity")},
                            limit=40 * (len(items) + s["num_experts"]) + 1000, what="locations",
                            moved=lambda: (len(location_sink.items), len(count_sink.items)))
    # Every offered pair must have been taken.
    assert source.done or s["expect_error"], f"{source.sent} of {len(items)} pairs taken"

    location = run.layout("location__payload")
    count = run.layout("counts__payload")
    run.save(location=np.array([location.unpack(w, "location", signed=True)
                                for w in location_sink.items], dtype=np.int64),
             counts=np.array([count.unpack(w, "count") for w in count_sink.items],
                             dtype=np.int64),
             pairs_taken=source.sent, cycles=cycles,
             dropped=dut.dropped.value.to_unsigned(), error=int(high(dut.error)),
             busy_after=int(high(dut.busy)))
