"""cocotb bench for the scan_layers units (``moe_hw.units.scan_layers`` and
``scan_layers_unrolled``): drives the layer parameter stream (scale, bias; layer-major) and
the input beats (token-major), takes every output beat with random ready pauses, and records
the output beats, how many beats each input gave, the status outputs and the exact cycle
count. The host side (``moe_hw.host.scan_layers``) scores them."""

import numpy as np

import cocotb
from harness import Pauses, Run, StreamSink, StreamSource, high, pack_lanes, reset, run_once, \
    unpack_lanes


@cocotb.test()
async def scan_layers(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    runtime = s["runtime"]
    feed = s["feed"]

    layer = run.layout("layer_params__payload")
    params = [layer.pack(scale=pack_lanes(a, width), bias=pack_lanes(b, width))
              for a, b in zip(st["scale"], st["bias"])] if feed else []
    beats = [pack_lanes(row, width) for row in st["input"]] if feed else []

    await reset(dut, inputs=["start", *runtime])
    stall, seed = s["stall"], s["seed"]
    param_source = StreamSource(dut, "layer_params", params, Pauses(stall, seed))
    input_source = StreamSource(dut, "input", beats, Pauses(stall, seed + 1))
    sink = StreamSink(dut, "output", Pauses(stall, seed + 2))
    actors = [param_source, input_source, sink]

    cycles = await run_once(dut, actors, runtime, limit=40 * s["work"] + 2000, what="scan_layers",
                            moved=lambda: (len(sink.items), param_source.sent,
                                           input_source.sent))
    data = np.array([unpack_lanes(w, width, lanes) for w in sink.items],
                    dtype=np.uint64).reshape(len(sink.items), lanes)
    run.save(data=data, params_taken=param_source.sent, input_taken=input_source.sent,
             cycles=cycles, error=int(high(dut.error)), busy_after=int(high(dut.busy)))
