"""cocotb bench for the combine_scatter unit: drives the slot headers and the expert-output
beats, serves the unit's read and write ports from ONE memory model (the token buffer
out[S, H], +0.0 at the start), with random valid/ready pauses on every stream and port, and
records the memory image, the read and write logs, the status outputs and the exact cycle
count. The host side (moe_hw.host.combine_scatter) scores them.

The memory reader is stepped before the writer at each edge, so a read taken in the same
cycle as a write to its address sees the OLD data: a unit that relied on same-cycle
forwarding through the memory would fail here.
"""

import numpy as np

import cocotb
from harness import (MemoryReader, MemoryWriter, Pauses, Run, StreamSource, high,
                     pack_lanes, reset, run_once, unpack_lanes)


@cocotb.test()
async def combine_scatter(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    tokens, slots, hidden = s["tokens"], s["slots"], s["hidden"]
    beats = -(-hidden // lanes) if hidden else 0
    header = run.layout("header__payload")
    headers = [header.pack(token=t, gate=g) for t, g in
               zip(st["token"].tolist(), st["gate"].tolist())]
    rows = st["expert_out"].reshape(slots, hidden)         # [slots, H] bit patterns
    padded = np.zeros((slots, beats * lanes), dtype=np.uint64)
    padded[:, :hidden] = rows
    padded = padded.reshape(slots, beats, lanes)
    beat_words = [pack_lanes(padded[slot, b], width)
                  for slot in range(slots) for b in range(beats)]
    if not s["feed"]:                                      # zero-element: nothing is offered
        headers, beat_words = [], []
    memory = np.zeros(tokens * hidden, dtype=np.uint64)    # the token buffer, +0.0

    await reset(dut, inputs=["start", "tokens", "slots", "hidden"])
    stall, seed = s["stall"], s["seed"]
    header_source = StreamSource(dut, "header", headers, Pauses(stall, seed))
    data_source = StreamSource(dut, "data", beat_words, Pauses(stall, seed + 1))
    reader = MemoryReader(dut, "read", "read_data", memory, lanes=lanes, width=width,
                          request_layout=run.layout("read__payload"),
                          response_layout=run.layout("read_data__payload"),
                          latency=s["memory_latency"],
                          request_pauses=Pauses(stall, seed + 2),
                          response_pauses=Pauses(stall, seed + 3))
    writer = MemoryWriter(dut, "write", memory, lanes=lanes, width=width,
                          layout=run.layout("write__payload"), pauses=Pauses(stall, seed + 4))
    actors = [header_source, data_source, reader, writer]

    cycles = await run_once(dut, actors, {"tokens": tokens, "slots": slots, "hidden": hidden},
                            limit=60 * (len(beat_words) + len(headers)) + 2000,
                            what="combine_scatter",
                            moved=lambda: (len(writer.log), len(reader.requests)))
    # Every offered beat must have been taken.
    assert not reader.queue, f"{len(reader.queue)} read responses never taken"
    assert header_source.done, f"{header_source.sent} of {len(headers)} headers taken"
    assert data_source.done, f"{data_source.sent} of {len(beat_words)} data beats taken"

    count = len(writer.log)
    run.save(
        memory=memory, cycles=cycles,
        write_addr=np.array([w[0] for w in writer.log], dtype=np.int64),
        write_enable=np.array([w[1] for w in writer.log], dtype=np.int64),
        write_data=np.array([unpack_lanes(w[2], width, lanes) for w in writer.log],
                            dtype=np.uint64).reshape(count, lanes),
        read_addr=np.array([r[0] for r in reader.requests], dtype=np.int64),
        read_enable=np.array([r[1] for r in reader.requests], dtype=np.int64),
        out_of_bounds=reader.out_of_bounds + writer.out_of_bounds,
        dropped=dut.dropped.value.to_unsigned(), error=int(high(dut.error)),
        busy_after=int(high(dut.busy)))
