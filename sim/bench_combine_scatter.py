"""cocotb bench for the combine_scatter unit: runs a batch of problems back to back on one
unit (each started after the previous one's ``done``, without a reset). For each it drives
the slot headers and the expert-output beats, serves the unit's read and write ports from ONE
memory model (the token buffer out[S, H], +0.0 at the start), with random valid/ready pauses
on every stream and port, and records the memory image, the read and write logs, the status
outputs and the exact cycle count. The host side (moe_hw.host.combine_scatter) scores them.

The memory reader is stepped before the writer at each edge, so a read taken in the same
cycle as a write to its address sees the OLD data: a unit that relied on same-cycle
forwarding through the memory would fail here.
"""

import numpy as np

import cocotb
from harness import (MemoryReader, MemoryWriter, Pauses, Run, StreamSource, edge, high,
                     pack_lanes, reset, run_until, unpack_lanes)


async def one_problem(dut, run, number, problem, stimulus, lanes, width):
    tokens, slots, hidden = problem["tokens"], problem["slots"], problem["hidden"]
    beats = -(-hidden // lanes) if hidden else 0
    prefix = f"p{number}_"
    header = run.layout("header__payload")
    headers = [header.pack(token=t, gate=g) for t, g in
               zip(stimulus[prefix + "token"].tolist(), stimulus[prefix + "gate"].tolist())]
    rows = stimulus[prefix + "expert_out"]                 # [slots, H] bit patterns
    padded = np.zeros((rows.shape[0], beats * lanes), dtype=np.uint64)
    padded[:, :hidden] = rows
    padded = padded.reshape(rows.shape[0], beats, lanes)
    beat_words = [pack_lanes(padded[slot, b], width)
                  for slot in range(rows.shape[0]) for b in range(beats)]
    if not problem["feed"]:                                # zero-element: nothing is offered
        headers, beat_words = [], []
    memory = stimulus[prefix + "initial"].astype(np.uint64).copy()

    stall, seed = problem["stall"], problem["seed"]
    header_source = StreamSource(dut, "header", headers, Pauses(stall, seed))
    data_source = StreamSource(dut, "data", beat_words, Pauses(stall, seed + 1))
    reader = MemoryReader(dut, "read", "read_data", memory, lanes=lanes, width=width,
                          request_layout=run.layout("read__payload"),
                          response_layout=run.layout("read_data__payload"),
                          latency=problem["read_latency"],
                          request_pauses=Pauses(stall, seed + 2),
                          response_pauses=Pauses(stall, seed + 3))
    writer = MemoryWriter(dut, "write", memory, lanes=lanes, width=width,
                          layout=run.layout("write__payload"), pauses=Pauses(stall, seed + 4))
    actors = [header_source, data_source, reader, writer]

    dut.tokens.value = tokens
    dut.slots.value = slots
    dut.hidden.value = hidden
    dut.start.value = 1
    for actor in actors:
        actor.step()
    await edge(dut, actors)                                # cycle 0: the unit samples start
    dut.start.value = 0
    limit = 60 * (len(beat_words) + len(headers)) + 2000
    cycles = await run_until(dut, actors, lambda: high(dut.done), limit,
                             f"combine_scatter (problem {number})")
    # Nothing may move after done, and every offered beat must have been taken.
    writes_at_done, reads_at_done = len(writer.log), len(reader.requests)
    for _ in range(16):
        await edge(dut, actors)
    where = f"problem {number}"
    assert len(writer.log) == writes_at_done, f"{where}: writes left the unit after done"
    assert len(reader.requests) == reads_at_done, f"{where}: reads left the unit after done"
    assert not reader.queue, f"{where}: {len(reader.queue)} read responses never taken"
    assert header_source.done, f"{where}: {header_source.sent} of {len(headers)} headers taken"
    assert data_source.done, \
        f"{where}: {data_source.sent} of {len(beat_words)} data beats taken"

    count = len(writer.log)
    return {
        "memory": memory, "cycles": cycles,
        "write_addr": np.array([w[0] for w in writer.log], dtype=np.int64),
        "write_enable": np.array([w[1] for w in writer.log], dtype=np.int64),
        "write_data": np.array([unpack_lanes(w[2], width, lanes) for w in writer.log],
                               dtype=np.uint64).reshape(count, lanes),
        "read_addr": np.array([r[0] for r in reader.requests], dtype=np.int64),
        "read_enable": np.array([r[1] for r in reader.requests], dtype=np.int64),
        "out_of_bounds": reader.out_of_bounds + writer.out_of_bounds,
        "dropped": dut.dropped.value.to_unsigned(), "error": int(high(dut.error)),
    }


@cocotb.test()
async def combine_scatter(dut):
    run = Run()
    s = run.settings
    await reset(dut, inputs=["start", "tokens", "slots", "hidden"])
    results = {}
    for number, problem in enumerate(s["problems"]):
        result = await one_problem(dut, run, number, problem, run.stimulus, s["lanes"],
                                   s["width"])
        results.update({f"p{number}_{key}": value for key, value in result.items()})
    run.save(**results)
