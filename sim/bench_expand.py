"""cocotb bench for the expand unit (``expand``, ``repeat`` and ``expand_backward`` share it):
drives the run-time sizes (``settings["runtime"]``), streams the plan's beats
(``settings["plan"]``, packed by the host) and the input's beats in with random pauses (the
unit's input and output streams are ``settings["streams"]``, by default ``input_data`` and
``output``; ``expand_backward`` takes ``grad_output`` and gives ``input_grad``),
takes every output beat with random ready pauses, and records the output beats, the input
beats taken, the status outputs and the exact cycle count. The host side
(``moe_hw.host.expand``) scores them."""

import numpy as np

import cocotb
from harness import Pauses, Run, StreamSink, StreamSource, high, pack_lanes, reset, run_once, \
    unpack_lanes


@cocotb.test()
async def expand(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width, runtime = s["lanes"], s["width"], s["runtime"]

    in_name, out_name = s.get("streams", ("input_data", "output"))
    in_layout = run.layout(f"{in_name}__payload")
    beats = [in_layout.pack(data=pack_lanes(row, width)) for row in st["input"].astype(np.uint64)]

    await reset(dut, inputs=["start", *runtime])
    stall, seed = s["stall"], s["seed"]
    plan = StreamSource(dut, "plan", [int(word) for word in s["plan"]], Pauses(stall, seed + 2))
    source = StreamSource(dut, in_name, beats, Pauses(stall, seed))
    sink = StreamSink(dut, out_name, Pauses(stall, seed + 1))
    cycles = await run_once(dut, [plan, source, sink], runtime,
                            limit=40 * (s["expected_beats"] + len(beats) + len(s["plan"]))
                            + 2000, what=run.manifest["top"],
                            moved=lambda: (len(sink.items), source.sent, plan.sent))

    out = run.layout(f"{out_name}__payload")
    data = np.array([unpack_lanes(out.unpack(w, "data"), width, lanes) for w in sink.items],
                    dtype=np.uint64).reshape(len(sink.items), lanes)
    run.save(data=data,
             enable=np.array([out.unpack(w, "enable") for w in sink.items], dtype=np.int64),
             last=np.array([out.unpack(w, "last") for w in sink.items], dtype=np.int64),
             input_taken=source.sent, plan_taken=plan.sent, cycles=cycles, error=int(high(dut.error)),
             busy_after=int(high(dut.busy)))
