"""cocotb bench for dispatch_backward_gate behind its AXI wrapper (``--set
interface=axi``), driven with cocotbext-axi: ``AxiLiteMaster`` programs the sizes and both
buffers' bases and starts the run, ``AxiStreamSource`` sends the (index, location) headers
(one frame each), two ``AxiRamRead`` (the read half of ``AxiRam``) hold ``input`` and
``grad_dispatch`` inside a guard pattern, each answering a burst ``latency`` cycles after its
address on its own master (``m_axi_input``, ``m_axi_grad``), and a sink takes the gate
gradients (one item a beat). With ``stall`` > 0, the header source, the sink and both RAMs'
AR and R channels pause at random. The bench checks every read burst (INCR, at most
``max_burst`` beats, none crossing 4 KiB) and whether any reaches outside its buffer, and
records the results."""

import numpy as np

import cocotb
from cocotbext.axi import (AxiRamRead, AxiReadBus, AxiStreamBus, AxiStreamFrame, AxiStreamSink,
                           AxiStreamSource)
from axi_harness import (BusMonitor, ItemBus, begin, check_bursts, delay_reads, pauses, program,
                         release, reset_of, run_to_irq, take_items)
from bench_dispatch_backward_gate import SIZES
from harness import Layout, Run

BUSES = ("m_axi_input", "m_axi_grad")


@cocotb.test()
async def dispatch_backward_gate_axi(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    reg = {r["name"]: r["offset"] for r in s["registers"]}
    bus_bytes = lanes * width // 8
    dtype = {16: "<u2", 32: "<u4"}[width]
    header = Layout(s["header_layout"])
    frames = [header.pack(index=int(i) & 0xFFFFFFFF, location=int(l) & 0xFFFFFFFF)
              .to_bytes(s["header_bytes"], "little")
              for i, l in zip(st["index"].tolist(), st["location"].tolist())] \
        if s["feed"] else []

    axil = begin(dut)
    kwargs = reset_of(dut)
    rams = [AxiRamRead(AxiReadBus.from_prefix(dut, bus), dut.aclk, size=size, **kwargs)
            for bus, size in zip(BUSES, s["ram_sizes"])]
    headers = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_header"), dut.aclk,
                              **kwargs)
    sink = AxiStreamSink(ItemBus.from_prefix(dut, "m_axis_grad_gate"), dut.aclk, **kwargs)
    monitors = [BusMonitor(dut, bus, writes=False, reads=True) for bus in BUSES]
    for ram, monitor in zip(rams, monitors):
        delay_reads(ram, dut.aclk, s["latency"], monitor)
    if s["stall"] > 0:
        channels = [headers, sink, *(c for ram in rams for c in (ram.ar_channel,
                                                                ram.r_channel))]
        for n, channel in enumerate(channels):
            channel.set_pause_generator(pauses(s["stall"], s["seed"] + n))
    for ram, size, base, name in zip(rams, s["ram_sizes"], s["bases"],
                                     ("input", "grad_dispatch")):
        ram.write(0, b"\xa5" * size)
        ram.write(base, st[name].reshape(-1).astype(dtype).tobytes())
    await release(dut, monitors)

    info = await axil.read_dword(reg["INFO"])
    assert info == lanes | width << 8, f"INFO reads {info:#x}"
    await program(axil, reg, {name: s[name] for name in SIZES})
    for bus, base in zip(BUSES, s["bases"]):
        await axil.write_dword(reg[f"{bus[len('m_axi_'):].upper()}_BASE"], base)
    for frame in frames:
        headers.send_nowait(AxiStreamFrame(frame))
    beats = len(frames) * max(1, -(-s["hidden"] // lanes))
    cycles, status, irq_after = await run_to_irq(dut, axil, reg, monitors[0],
                                                 40 * beats + 3000)
    dropped = await axil.read_dword(reg["DROPPED"])

    inside = True
    for monitor, base, size in zip(monitors, s["bases"], s["buffer_bytes"]):
        check_bursts(monitor.ar, bus_bytes, s["max_burst"])
        end = base + -(-size // bus_bytes) * bus_bytes
        inside &= all(base <= addr and addr + (length + 1) * bus_bytes <= end
                      for addr, length, _, _ in monitor.ar)
    result = Layout(s["result_layout"])
    run.save(grad_gate=np.array(take_items(sink, result, "value"), dtype=np.uint64),
             dropped=dropped, headers_taken=int(headers.empty()), reads_inside=int(inside),
             cycles=cycles, status=status, irq_after=irq_after,
             input_bursts=len(monitors[0].ar), grad_bursts=len(monitors[1].ar),
             burst_beats=np.array([a[1] + 1 for m in monitors for a in m.ar], dtype=np.int64))
