"""cocotb bench for the scan_layers_backward unit (``moe_hw.units.scan_layers_backward``):
drives the layer parameter stream (scale, bias; layer-major), the input and the grad_output
beats (token-major), takes every beat of both outputs with random ready pauses, and records
them, how many beats each input gave, the status outputs and the exact cycle count. The
host side (``moe_hw.host.scan_layers_backward``) scores them."""

import numpy as np

import cocotb
from harness import Pauses, Run, StreamSink, StreamSource, high, pack_lanes, reset, run_once, \
    unpack_lanes


@cocotb.test()
async def scan_layers_backward(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    runtime = s["runtime"]
    feed = s["feed"]

    layer = run.layout("layer_params__payload")
    params = [layer.pack(scale=pack_lanes(a, width), bias=pack_lanes(b, width))
              for a, b in zip(st["scale"], st["bias"])] if feed else []
    beats = [pack_lanes(row, width) for row in st["input"]] if feed else []
    grads = [pack_lanes(row, width) for row in st["grad_output"]] if feed else []

    await reset(dut, inputs=["start", *runtime])
    stall, seed = s["stall"], s["seed"]
    param_source = StreamSource(dut, "layer_params", params, Pauses(stall, seed))
    input_source = StreamSource(dut, "input", beats, Pauses(stall, seed + 1))
    grad_source = StreamSource(dut, "grad_output", grads, Pauses(stall, seed + 2))
    grad_sink = StreamSink(dut, "grad_input", Pauses(stall, seed + 3))
    sum_sink = StreamSink(dut, "param_grad", Pauses(stall, seed + 4))
    actors = [param_source, input_source, grad_source, grad_sink, sum_sink]

    cycles = await run_once(dut, actors, runtime, limit=20 * s["work"] + 2000,
                            what="scan_layers_backward",
                            moved=lambda: (len(grad_sink.items), len(sum_sink.items),
                                           param_source.sent, input_source.sent,
                                           grad_source.sent))
    mask = (1 << (width * lanes)) - 1

    def lanes_of(words):
        return np.array([unpack_lanes(w, width, lanes) for w in words],
                        dtype=np.uint64).reshape(len(words), lanes)

    run.save(grad=lanes_of(grad_sink.items),
             sum_scale=lanes_of([w & mask for w in sum_sink.items]),
             sum_bias=lanes_of([w >> (width * lanes) for w in sum_sink.items]),
             params_taken=param_source.sent, input_taken=input_source.sent,
             grad_taken=grad_source.sent, cycles=cycles, error=int(high(dut.error)),
             busy_after=int(high(dut.busy)))
