"""cocotb bench for the expand unit (``expand``, ``repeat`` and ``expand_backward`` share it):
drives the run-time sizes (``settings["runtime"]``), streams the plan's beats
(``settings["plan"]``, packed by the host) and the input's beats in with random pauses (the
unit's input and output streams are ``settings["streams"]``, by default ``input_data`` and
``output``; ``expand_backward`` takes ``grad_output`` and gives ``input_grad``),
takes every output beat with random ready pauses, and records the output beats, the input
beats taken, the status outputs and the exact cycle count. A split expand (``parts`` > 1)
has these streams once per part (``settings["parts"]``), all driven at once. The host side
(``moe_hw.host.expand``) scores them."""

import numpy as np

import cocotb
from harness import MemoryReader, Pauses, Run, StreamSink, StreamSource, high, pack_lanes, \
    reset, run_once, unpack_lanes


def moved_by(source):
    """What a source has moved so far: input beats sent, or reads taken."""
    return len(source.requests) if isinstance(source, MemoryReader) else source.sent


@cocotb.test()
async def expand(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width, runtime = s["lanes"], s["width"], s["runtime"]

    in_name, out_name = s.get("streams", ("input_data", "output"))
    # One unit, or the parts of a split expand (``settings["parts"]``): each part has its own
    # plan, input and output streams, their names prefixed, and its results saved under its
    # index (``data0``, ``input_taken0``, ...).
    split = "parts" in s
    external = s.get("external", False)
    store = "memory" if external else "input"
    parts = s["parts"] if split else [{"prefix": "", store: store, "plan": s["plan"],
                                       "expected_beats": s["expected_beats"],
                                       "expected_reads": s.get("expected_reads", 0)}]

    await reset(dut, inputs=["start", *runtime])
    stall, seed = s["stall"], s["seed"]
    plans, sources, sinks = [], [], []
    for index, part in enumerate(parts):
        prefix, part_seed = part["prefix"], seed + 3 * index
        plans.append(StreamSource(dut, f"{prefix}plan", [int(word) for word in part["plan"]],
                                  Pauses(stall, part_seed + 2)))
        if external:
            # The input in a memory model behind the unit's read port.
            sources.append(MemoryReader(
                dut, f"{prefix}read_request", f"{prefix}read_response",
                st[part["memory"]].astype(np.uint64), lanes=lanes, width=width,
                request_layout=run.layout(f"{prefix}read_request__payload"),
                response_layout=run.layout(f"{prefix}read_response__payload"),
                latency=s["memory_latency"], request_pauses=Pauses(stall, part_seed),
                response_pauses=Pauses(stall, part_seed + 7)))
        else:
            in_layout = run.layout(f"{prefix}{in_name}__payload")
            beats = [in_layout.pack(data=pack_lanes(row, width))
                     for row in st[part["input"]].astype(np.uint64)]
            sources.append(StreamSource(dut, f"{prefix}{in_name}", beats,
                                        Pauses(stall, part_seed)))
        # ``sink_stall``: the consumer's own pause probability (a test of a queue's room).
        sinks.append(StreamSink(dut, f"{prefix}{out_name}",
                                Pauses(s.get("sink_stall", stall), part_seed + 1)))
    work = sum(part["expected_beats"] + part.get("expected_reads", 0) + len(part["plan"])
               + (s["memory_latency"] if external else len(source.items))
               for part, source in zip(parts, sources))
    cycles = await run_once(dut, [*plans, *sources, *sinks], runtime, limit=40 * work + 2000,
                            what=run.manifest["top"],
                            moved=lambda: tuple((len(sink.items), moved_by(source), plan.sent)
                                                for plan, source, sink in
                                                zip(plans, sources, sinks)))

    results = {}
    for index, (part, plan, source, sink) in enumerate(zip(parts, plans, sources, sinks)):
        out = run.layout(f"{part['prefix']}{out_name}__payload")
        data = np.array([unpack_lanes(out.unpack(w, "data"), width, lanes) for w in sink.items],
                        dtype=np.uint64).reshape(len(sink.items), lanes)
        key = str(index) if split else ""
        results.update({
            f"data{key}": data,
            f"enable{key}": np.array([out.unpack(w, "enable") for w in sink.items],
                                     dtype=np.int64),
            f"last{key}": np.array([out.unpack(w, "last") for w in sink.items], dtype=np.int64),
            f"plan_taken{key}": plan.sent})
        if external:
            requests = np.array(source.requests, dtype=np.int64).reshape(len(source.requests), 2)
            assert not source.queue, "a response was left untaken"
            results.update({f"request_addr{key}": requests[:, 0],
                            f"request_enable{key}": requests[:, 1],
                            f"out_of_bounds{key}": source.out_of_bounds,
                            f"input_taken{key}": 0})
        else:
            results[f"input_taken{key}"] = source.sent
    run.save(**results, cycles=cycles, error=int(high(dut.error)),
             busy_after=int(high(dut.busy)))
