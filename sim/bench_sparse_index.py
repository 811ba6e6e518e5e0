"""cocotb bench for the sparse dispatcher's index unit: streams the gate matrix in twice (pass 1
counts, pass 3 places), takes every part_sizes beat and every write with random ready stalls,
and records both streams in arrival order, the status outputs and the exact cycle count. The
host side (moe_hw.host.sparse_index) builds batch_index / nonzero_gates from the writes and
scores them."""

import numpy as np

import cocotb
from harness import (Pauses, Run, StreamSink, StreamSource, high, pack_lanes, reset,
                     run_once)


@cocotb.test()
async def sparse_index(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    row = run.layout("rows__payload")
    beats = st["beats"]                            # [S * ceil(E/lanes), lanes] bit patterns
    items = [row.pack(gates=pack_lanes(b, width)) for b in beats]
    second = st["second"] if "second" in st else beats
    items += [row.pack(gates=pack_lanes(b, width)) for b in second]   # pass 3 re-reads

    await reset(dut, inputs=["start", "tokens", "num_experts"])
    stall, seed = s["stall"], s["seed"]
    source = StreamSource(dut, "rows", items, Pauses(stall, seed))
    part_sink = StreamSink(dut, "part_sizes", Pauses(stall, seed + 1))
    write_sink = StreamSink(dut, "write", Pauses(stall, seed + 2))
    actors = [source, part_sink, write_sink]

    cycles = await run_once(dut, actors, {"tokens": s["tokens"], "num_experts": s["num_experts"]},
                            limit=40 * (len(items) + s["num_experts"] + lanes * len(beats)) + 1000,
                            what="sparse_index",
                            moved=lambda: (len(part_sink.items), len(write_sink.items)))

    part = run.layout("part_sizes__payload")
    write = run.layout("write__payload")
    run.save(part_size=np.array([part.unpack(w, "part_size") for w in part_sink.items],
                                dtype=np.int64),
             offset=np.array([part.unpack(w, "offset") for w in part_sink.items],
                             dtype=np.int64),
             addr=np.array([write.unpack(w, "addr") for w in write_sink.items], dtype=np.int64),
             token=np.array([write.unpack(w, "token") for w in write_sink.items],
                            dtype=np.int64),
             gate=np.array([write.unpack(w, "gate") for w in write_sink.items],
                           dtype=np.uint64),
             beats_taken=source.sent, beats_offered=len(items), cycles=cycles,
             nonzeros=dut.nonzeros.value.to_unsigned(), error=int(high(dut.error)),
             busy_after=int(high(dut.busy)))
