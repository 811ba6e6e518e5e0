"""cocotb bench for the dispatch_backward_gate unit: drives the (index, location) headers,
serves the unit's two read ports from memory models of ``input`` [S, H] and
``grad_dispatch`` [E*C, H], takes the grad_gate results, with random valid/ready pauses on
every stream and port, and records the results, both read logs, the status outputs and the
exact cycle count. The host side (moe_hw.host.dispatch_backward_gate) scores them."""

import numpy as np

import cocotb
from harness import (MemoryReader, Pauses, Run, StreamSink, StreamSource, high, reset,
                     run_once)

SIZES = ("tokens", "top_k", "hidden", "capacity", "num_experts")


@cocotb.test()
async def dispatch_backward_gate(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    header = run.layout("header__payload")
    headers = [header.pack(index=i, location=l) for i, l in
               zip(st["index"].tolist(), st["location"].tolist())]
    if not s["feed"]:                        # no pairs: nothing is offered
        headers = []
    input_memory = st["input"].reshape(-1).astype(np.uint64)
    grad_memory = st["grad_dispatch"].reshape(-1).astype(np.uint64)

    await reset(dut, inputs=["start", *SIZES])
    stall, seed, latency = s["stall"], s["seed"], s["memory_latency"]
    header_source = StreamSource(dut, "header", headers, Pauses(stall, seed))
    input_reader = MemoryReader(dut, "input_read", "input_data", input_memory, lanes=lanes,
                                width=width, request_layout=run.layout("input_read__payload"),
                                response_layout=run.layout("input_data__payload"),
                                latency=latency, request_pauses=Pauses(stall, seed + 1),
                                response_pauses=Pauses(stall, seed + 2))
    grad_reader = MemoryReader(dut, "grad_read", "grad_data", grad_memory, lanes=lanes,
                               width=width, request_layout=run.layout("grad_read__payload"),
                               response_layout=run.layout("grad_data__payload"),
                               latency=latency, request_pauses=Pauses(stall, seed + 3),
                               response_pauses=Pauses(stall, seed + 4))
    sink = StreamSink(dut, "grad_gate", Pauses(stall, seed + 5))
    actors = [header_source, input_reader, grad_reader, sink]

    beats = max(1, -(-s["hidden"] // lanes))
    cycles = await run_once(
        dut, actors, {name: s[name] for name in SIZES},
        limit=40 * (len(headers) * beats + 16) + 2000, what="dispatch_backward_gate",
        moved=lambda: (len(sink.items), len(input_reader.requests), len(grad_reader.requests)))
    # Every offered header must have been taken.
    for reader in (input_reader, grad_reader):
        assert not reader.queue, f"{len(reader.queue)} read responses never taken"
    assert header_source.done, f"{header_source.sent} of {len(headers)} headers taken"

    result = run.layout("grad_gate__payload")
    run.save(
        grad_gate=np.array([result.unpack(w, "value") for w in sink.items], dtype=np.uint64),
        cycles=cycles,
        input_addr=np.array([r[0] for r in input_reader.requests], dtype=np.int64),
        input_enable=np.array([r[1] for r in input_reader.requests], dtype=np.int64),
        grad_addr=np.array([r[0] for r in grad_reader.requests], dtype=np.int64),
        grad_enable=np.array([r[1] for r in grad_reader.requests], dtype=np.int64),
        out_of_bounds=input_reader.out_of_bounds + grad_reader.out_of_bounds,
        dropped=dut.dropped.value.to_unsigned(), error=int(high(dut.error)),
        busy_after=int(high(dut.busy)))
