"""cocotb bench for the whole MoE layer (``moe_hw.units.moe_layer``): drives the pair stream
(gate, index; k-major), the token-row data stream (k-major, once per choice) and the expert
parameter stream, models the external expert buffer as ONE array behind a read port
(:class:`MemoryReader`) and a write port (:class:`MemoryWriter`), takes every output beat with
random ready pauses, and records the output beats, the write and read logs, the final buffer
image, the cycle each phase began, the status outputs and the exact cycle count. The host side
(``moe_hw.host.moe_layer``) scores them."""

import numpy as np

import cocotb
from harness import (MemoryReader, MemoryWriter, Pauses, Run, StreamSink, StreamSource,
                     high, pack_lanes, reset, run_once, unpack_lanes)


class PhaseMonitor:
    """Logs (cycle, phase) whenever the unit's ``phase`` output changes."""

    def __init__(self, dut):
        self.dut = dut
        self.cycle = 0
        self.phase = 0
        self.log = []

    def restart(self):
        self.cycle, self.phase, self.log = 0, 0, []

    def step(self):
        self.cycle += 1
        phase = self.dut.phase.value.to_unsigned()
        if phase != self.phase:
            self.log.append((self.cycle, phase))
            self.phase = phase


@cocotb.test()
async def moe_layer(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    runtime = s["runtime"]
    hidden = runtime["hidden"]
    beats = -(-hidden // lanes)

    pair = run.layout("pair__payload")
    pairs = [pair.pack(gate=g, index=i) for g, i in
             zip(st["pair_gate"].tolist(), st["pair_index"].tolist())]
    rows = st["input"]                   # [S, H] bit patterns
    padded = np.zeros((rows.shape[0], beats * lanes), dtype=np.uint64)
    padded[:, :hidden] = rows
    padded = padded.reshape(rows.shape[0], beats, lanes)
    beat_words = [pack_lanes(padded[row, b], width)
                  for row in st["row"].tolist() for b in range(beats)] if s["feed_data"] else []
    expert = run.layout("expert_params__payload")
    # Affine experts: one scale and bias per beat; expert stacks: lanes of each per beat.
    if not s["feed_params"]:
        expert_words = []
    elif np.ndim(st["scale"]) == 2:
        expert_words = [expert.pack(scale=pack_lanes(a, width), bias=pack_lanes(b, width))
                        for a, b in zip(st["scale"], st["bias"])]
    else:
        expert_words = [expert.pack(scale=a, bias=b)
                        for a, b in zip(st["scale"].tolist(), st["bias"].tolist())]
    if not s["feed_pairs"]:
        pairs = []
    memory = np.zeros(int(s["memory_size"]), dtype=np.uint64)

    await reset(dut, inputs=["start", *runtime])
    stall, seed = s["stall"], s["seed"]
    pair_source = StreamSource(dut, "pair", pairs, Pauses(stall, seed))
    data_source = StreamSource(dut, "data", beat_words, Pauses(stall, seed + 1))
    expert_source = StreamSource(dut, "expert_params", expert_words, Pauses(stall, seed + 2))
    # Reader before writer: a read taken at the same edge as a write of the same address
    # would see the old value, so a read-after-write hazard cannot hide.
    reader = MemoryReader(dut, "read_request", "read_response", memory, lanes=lanes,
                          width=width, request_layout=run.layout("read_request__payload"),
                          response_layout=run.layout("read_response__payload"),
                          latency=s["memory_latency"],
                          request_pauses=Pauses(stall, seed + 3),
                          response_pauses=Pauses(stall, seed + 4))
    writer = MemoryWriter(dut, "write", memory, lanes=lanes, width=width,
                          layout=run.layout("write__payload"), pauses=Pauses(stall, seed + 5))
    sink = StreamSink(dut, "output", Pauses(stall, seed + 6))
    phases = PhaseMonitor(dut)
    actors = [pair_source, data_source, expert_source, reader, writer, sink, phases]

    work = s["expected_beats"] + s["expected_reads"] + len(beat_words) + len(pairs)

    def started():                       # the phase log counts cycles from the start edge
        phases.cycle = 0

    cycles = await run_once(dut, actors, runtime, limit=40 * work + 4000, what="moe_layer",
                            moved=lambda: (len(sink.items), len(reader.requests),
                                           len(writer.log)),
                            started=started)

    out = run.layout("output__payload")
    data = np.array([unpack_lanes(out.unpack(w, "data"), width, lanes) for w in sink.items],
                    dtype=np.uint64).reshape(len(sink.items), lanes)
    enable = np.array([out.unpack(w, "enable") for w in sink.items], dtype=np.int64)
    last = np.array([out.unpack(w, "last") for w in sink.items], dtype=np.int64)
    requests = np.array(reader.requests, dtype=np.int64).reshape(len(reader.requests), 2)
    write_data = np.array([unpack_lanes(d, width, lanes) for _, _, d in writer.log],
                          dtype=np.uint64).reshape(len(writer.log), lanes)
    phase_log = np.array(phases.log, dtype=np.int64).reshape(len(phases.log), 2)
    run.save(data=data, enable=enable, last=last,
             request_addr=requests[:, 0], request_enable=requests[:, 1],
             write_addr=np.array([a for a, _, _ in writer.log], dtype=np.int64),
             write_enable=np.array([e for _, e, _ in writer.log], dtype=np.int64),
             write_data=write_data, memory=memory,
             read_out_of_bounds=reader.out_of_bounds, write_out_of_bounds=writer.out_of_bounds,
             pairs_taken=pair_source.sent, data_taken=data_source.sent,
             params_taken=expert_source.sent, phase_log=phase_log, cycles=cycles,
             dropped=dut.dropped.value.to_unsigned(), error=int(high(dut.error)),
             busy_after=int(high(dut.busy)))
