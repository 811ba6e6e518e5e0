"""cocotb bench for the row-gather units (``sparse_gather``, ``combine_gather``,
``dispatch_backward_data``): they share one shape, a header stream in, a memory read port and
a row-beat stream out, so one bench drives all three.

It drives the run-time size ports (``settings["runtime"]``), the header stream (one word per
row of the stimulus header arrays, packed by the manifest's layout), answers the read port
from a memory model holding ``stimulus["memory"]`` (random request/response pauses, fixed
latency), takes every output beat with random ready pauses, and records the output beats, the
request log, the status outputs and the exact cycle count. The host side
(``moe_hw.host.row_gather`` and the three declarations) scores them.
"""

import numpy as np

import cocotb
from harness import (MemoryReader, Pauses, Run, StreamSink, StreamSource, high,
                     pack_lanes, reset, run_once, unpack_lanes)


def header_words(layout, stimulus):
    """One header word per row of the stimulus arrays named like the header's fields (a field
    that is an array takes one row of a 2-D stimulus array, entry 0 in the low bits)."""
    names = [name for name in layout.desc["fields"] if f"header_{name}" in stimulus]
    columns = {name: stimulus[f"header_{name}"] for name in names}
    count = len(columns[names[0]]) if names else 0
    words = []
    for row in range(count):
        values = {}
        for name in names:
            field = layout.field(name)
            if "array" in field:
                width = field["array"]["element"]["width"]
                mask = (1 << width) - 1
                entries = np.asarray(columns[name][row]).astype(np.int64).tolist()
                values[name] = pack_lanes(np.array([e & mask for e in entries], dtype=object),
                                          width)
            else:
                values[name] = int(columns[name][row])
        words.append(layout.pack(**values))
    return words


@cocotb.test()
async def row_gather(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    runtime = s["runtime"]

    headers = header_words(run.layout("header__payload"), st) if s["feed"] else []
    memory = st["memory"].astype(np.uint64)

    await reset(dut, inputs=["start", *runtime])
    stall, seed = s["stall"], s["seed"]
    source = StreamSource(dut, "header", headers, Pauses(stall, seed))
    reader = MemoryReader(dut, "read_request", "read_response", memory, lanes=lanes,
                          width=width, request_layout=run.layout("read_request__payload"),
                          response_layout=run.layout("read_response__payload"),
                          latency=s["memory_latency"],
                          request_pauses=Pauses(stall, seed + 1),
                          response_pauses=Pauses(stall, seed + 2))
    sink = StreamSink(dut, "data", Pauses(stall, seed + 3))
    actors = [source, reader, sink]

    cycles = await run_once(
        dut, actors, runtime,
        limit=40 * (s["expected_beats"] + s["expected_reads"] + len(headers)) + 2000,
        what=run.manifest["top"], moved=lambda: (len(sink.items), len(reader.requests)))

    out = run.layout("data__payload")
    data = np.array([unpack_lanes(out.unpack(w, "data"), width, lanes) for w in sink.items],
                    dtype=np.uint64).reshape(len(sink.items), lanes)
    enable = np.array([out.unpack(w, "enable") for w in sink.items], dtype=np.int64)
    last = np.array([out.unpack(w, "last") for w in sink.items], dtype=np.int64)
    requests = np.array(reader.requests, dtype=np.int64).reshape(len(reader.requests), 2)
    run.save(data=data, enable=enable, last=last, request_addr=requests[:, 0],
             request_enable=requests[:, 1], out_of_bounds=reader.out_of_bounds,
             headers_taken=source.sent, cycles=cycles,
             dropped=dut.dropped.value.to_unsigned(), error=int(high(dut.error)),
             busy_after=int(high(dut.busy)))
