"""cocotb bench for the dispatch unit: drives the header and data streams, takes every write
into a memory model with random ready stalls, and records the write log, the memory image, the
status outputs and the exact cycle count. The host side (moe_hw.host.dispatch) scores them."""

import numpy as np

import cocotb
from harness import (Pauses, Run, StreamSink, StreamSource, high, pack_lanes, reset,
                     run_once, unpack_lanes)


@cocotb.test()
async def dispatch(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    hidden, capacity, num_experts, pairs = s["hidden"], s["capacity"], s["num_experts"], s["pairs"]
    beats = -(-hidden // lanes)

    header = run.layout("header__payload")
    headers = [header.pack(gate=g, index=i, location=l) for g, i, l in
               zip(st["gate"].tolist(), st["index"].tolist(), st["location"].tolist())]
    rows = st["input"]                   # [S, H] bit patterns
    padded = np.zeros((rows.shape[0], beats * lanes), dtype=np.uint64)
    padded[:, :hidden] = rows
    padded = padded.reshape(rows.shape[0], beats, lanes)
    beat_words = [pack_lanes(padded[row, b], width)
                  for row in st["row"].tolist() for b in range(beats)]
    if not s["feed"]:                    # zero-element problem: nothing is offered
        headers, beat_words = [], []

    await reset(dut, inputs=["start", "pairs", "hidden", "capacity", "num_experts"])
    stall, seed = s["stall"], s["seed"]
    header_source = StreamSource(dut, "header", headers, Pauses(stall, seed))
    data_source = StreamSource(dut, "data", beat_words, Pauses(stall, seed + 1))
    sink = StreamSink(dut, "write", Pauses(stall, seed + 2))
    actors = [header_source, data_source, sink]

    sizes = {"pairs": pairs, "hidden": hidden, "capacity": capacity, "num_experts": num_experts}
    cycles = await run_once(dut, actors, sizes, limit=40 * (len(beat_words) + len(headers)) + 1000,
                            what="dispatch", moved=lambda: (len(sink.items),))
    # Every offered beat must have been taken.
    assert header_source.done, f"{header_source.sent} of {len(headers)} headers taken"
    assert data_source.done, f"{data_source.sent} of {len(beat_words)} data beats taken"

    write = run.layout("write__payload")
    addr = np.array([write.unpack(w, "addr") for w in sink.items], dtype=np.int64)
    enable = np.array([write.unpack(w, "enable") for w in sink.items], dtype=np.int64)
    data = np.array([unpack_lanes(write.unpack(w, "data"), width, lanes) for w in sink.items],
                    dtype=np.uint64).reshape(len(sink.items), lanes)
    run.save(addr=addr, enable=enable, data=data, cycles=cycles,
             dropped=dut.dropped.value.to_unsigned(), error=int(high(dut.error)),
             busy_after=int(high(dut.busy)))
