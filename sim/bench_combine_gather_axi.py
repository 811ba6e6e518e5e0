"""cocotb bench for combine_gather behind its AXI wrapper (``--set interface=axi``), driven
with cocotbext-axi: ``AxiLiteMaster`` programs the sizes and the buffer's base and starts the
run, ``AxiStreamSource`` sends the headers (one frame each), ``AxiRamRead`` (the read half of
``AxiRam``) holds the expert buffer inside a guard pattern and sends each burst's data
``latency`` cycles after its address, ``AxiStreamSink`` takes the combined rows (one frame a
row: ``tlast`` ends a row, ``tkeep`` trims its last beat). With ``stall`` > 0, the header
source, the sink's ready and the RAM's AR and R channels pause at random. The bench checks
every read burst (INCR, at most ``max_burst`` beats, none crossing 4 KiB) and that none
reaches outside the buffer, and records the rows."""

import numpy as np

import cocotb
from cocotbext.axi import (AxiRamRead, AxiReadBus, AxiStreamBus, AxiStreamFrame, AxiStreamSink,
                           AxiStreamSource)
from axi_harness import (BusMonitor, begin, check_bursts, delay_reads, pauses, program,
                         release, reset_of, run_to_irq)
from bench_row_gather import header_words
from harness import Layout, Run


@cocotb.test()
async def combine_gather_axi(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    runtime = s["runtime"]
    tokens, hidden = runtime["tokens"], runtime["hidden"]
    reg = {r["name"]: r["offset"] for r in s["registers"]}
    bus = s["bus"]                              # "m_axi_expert_out"
    elem_bytes, bus_bytes = width // 8, lanes * width // 8
    base, size = s["base"], s["buffer_bytes"]
    dtype = {16: "<u2", 32: "<u4"}[width]

    frames = [word.to_bytes(s["header_bytes"], "little")
              for word in header_words(Layout(s["header_layout"]), st)] if s["feed"] else []

    axil = begin(dut)
    kwargs = reset_of(dut)
    ram = AxiRamRead(AxiReadBus.from_prefix(dut, bus), dut.aclk, size=s["ram_size"], **kwargs)
    headers = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_header"), dut.aclk,
                              **kwargs)
    sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_data"), dut.aclk, **kwargs)
    monitor = BusMonitor(dut, bus, writes=False, reads=True)
    delay_reads(ram, dut.aclk, s["latency"], monitor)
    if s["stall"] > 0:
        headers.set_pause_generator(pauses(s["stall"], s["seed"]))
        sink.set_pause_generator(pauses(s["stall"], s["seed"] + 1))
        ram.ar_channel.set_pause_generator(pauses(s["stall"], s["seed"] + 2))
        ram.r_channel.set_pause_generator(pauses(s["stall"], s["seed"] + 3))
    ram.write(0, b"\xa5" * s["ram_size"])
    ram.write(base, st["memory"].astype(dtype).tobytes())
    await release(dut, [monitor])

    info = await axil.read_dword(reg["INFO"])
    assert info == lanes | width << 8, f"INFO reads {info:#x}"
    await program(axil, reg, {name: runtime[name] for name in ("tokens", "hidden", "top_k",
                                                               "capacity", "num_experts")})
    await axil.write_dword(reg[f"{bus[len('m_axi_'):].upper()}_BASE"], base)
    for frame in frames:
        headers.send_nowait(AxiStreamFrame(frame))
    beats = max(1, runtime["top_k"]) * tokens * -(-hidden // lanes)
    cycles, status, irq_after = await run_to_irq(dut, axil, reg, monitor,
                                                 40 * beats + 20 * tokens + 3000)
    dropped = await axil.read_dword(reg["DROPPED"])
    assert headers.empty(), "the header stream was not read to its end"

    check_bursts(monitor.ar, bus_bytes, s["max_burst"])
    end = base + -(-size // bus_bytes) * bus_bytes
    inside = all(base <= addr and addr + (length + 1) * bus_bytes <= end
                 for addr, length, _, _ in monitor.ar)
    rows = []
    while not sink.empty():
        rows.append(sink.recv_nowait().tdata)
    frames_ok = all(len(row) == hidden * elem_bytes for row in rows)
    combined = np.frombuffer(b"".join(rows), dtype=dtype).astype(np.uint64) if frames_ok \
        else np.zeros(0, np.uint64)
    run.save(combined=combined, frames=len(rows), frames_ok=int(frames_ok),
             reads_inside=int(inside), cycles=cycles, status=status, dropped=dropped,
             irq_after=irq_after, bursts=len(monitor.ar),
             burst_beats=np.array([a[1] + 1 for a in monitor.ar], dtype=np.int64),
             burst_addr=np.array([a[0] for a in monitor.ar], dtype=np.int64))
