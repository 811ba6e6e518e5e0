"""cocotb bench for the re-routing unit: streams the count matrix (and the scales) in, answers
the token read port from a memory model, takes every token write into an output memory, every
per-token write and every expert_token_num beat, all with random pauses, and records the logs,
the status outputs and the exact cycle count. The host side (moe_hw.host.moe_re_routing)
builds the outputs and scores them."""

import numpy as np

import cocotb
from harness import (MemoryReader, MemoryWriter, Pauses, Run, StreamSink, StreamSource,
                     high, reset, run_once)


@cocotb.test()
async def moe_re_routing(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width, runtime = s["lanes"], s["width"], s["runtime"]

    count_layout = run.layout("counts__payload")
    counts = [count_layout.pack(count=int(c)) for c in st["counts"].tolist()]
    memory = st["memory"].astype(np.uint64)
    out = np.zeros(s["out_elements"], dtype=np.uint64)

    inputs = ["start", *runtime]
    await reset(dut, inputs=inputs)
    stall, seed = s["stall"], s["seed"]
    count_source = StreamSource(dut, "counts", counts, Pauses(stall, seed))
    reader = MemoryReader(dut, "read_request", "read_response", memory, lanes=lanes,
                          width=width, request_layout=run.layout("read_request__payload"),
                          response_layout=run.layout("read_response__payload"),
                          latency=s["memory_latency"], request_pauses=Pauses(stall, seed + 1),
                          response_pauses=Pauses(stall, seed + 2))
    writer = MemoryWriter(dut, "write", out, lanes=lanes, width=width,
                          layout=run.layout("write__payload"), pauses=Pauses(stall, seed + 3))
    row_sink = StreamSink(dut, "row_write", Pauses(stall, seed + 4))
    num_sink = StreamSink(dut, "expert_token_num", Pauses(stall, seed + 5))
    actors = [count_source, reader, writer, row_sink, num_sink]
    scale_source = None
    if s["scales"]:
        scale_layout = run.layout("scales__payload")
        scale_source = StreamSource(dut, "scales",
                                    [scale_layout.pack(scale=int(v))
                                     for v in st["scales"].tolist()], Pauses(stall, seed + 6))
        actors.append(scale_source)

    limit = 40 * (len(counts) + runtime["num_experts"] + s["expected_beats"] +
                  runtime["tokens"]) + 2000
    cycles = await run_once(dut, actors, runtime, limit=limit, what="moe_re_routing",
                            moved=lambda: (len(writer.log), len(row_sink.items),
                                           len(num_sink.items), len(reader.requests)))

    row = run.layout("row_write__payload")
    num = run.layout("expert_token_num__payload")
    log = writer.log
    data = np.array([[(d >> (width * lane)) & ((1 << width) - 1) for lane in range(lanes)]
                     for _, _, d in log], dtype=np.uint64).reshape(len(log), lanes)
    requests = np.array(reader.requests, dtype=np.int64).reshape(len(reader.requests), 2)
    fields = {name: np.array([row.unpack(w, name) for w in row_sink.items], dtype=np.int64)
              for name in ("row", "idx_addr", "idx")}
    fields["scale"] = (np.array([row.unpack(w, "scale") for w in row_sink.items],
                                dtype=np.int64) if s["scales"]
                       else np.zeros(len(row_sink.items), np.int64))
    run.save(memory=out,
             write_addr=np.array([a for a, _, _ in log], dtype=np.int64),
             write_enable=np.array([e for _, e, _ in log], dtype=np.int64),
             write_data=data, write_out_of_bounds=writer.out_of_bounds,
             request_addr=requests[:, 0], request_enable=requests[:, 1],
             read_out_of_bounds=reader.out_of_bounds,
             expert_token_num=np.array([num.unpack(w, "value") for w in num_sink.items],
                                       dtype=np.int64),
             counts_taken=count_source.sent,
             scales_taken=scale_source.sent if scale_source else 0,
             cycles=cycles, error=int(high(dut.error)), busy_after=int(high(dut.busy)),
             **fields)
