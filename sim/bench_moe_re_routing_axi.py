"""cocotb bench for moe_re_routing behind its AXI wrapper (``--set interface=axi``), driven
with cocotbext-axi: ``AxiLiteMaster`` programs the sizes, the two settings and the two base
addresses and starts the run; one RAM holds ``tokens`` (``AxiRamRead`` on ``m_axi_tokens``,
each burst's data ``latency`` cycles after its address) and ``permute_tokens``
(``AxiRamWrite`` on ``m_axi_permute_tokens``, each write answered ``latency`` cycles late),
inside a guard pattern; ``AxiStreamSource`` sends the counts and the scales, sinks take
``expert_token_num`` and ``row_write`` beat by beat. With ``stall`` > 0, the sources, the
sinks and the RAM's AR, R, AW and W channels pause at random. The bench checks every burst
(INCR, at most ``max_burst`` beats, none crossing 4 KiB, the reads inside ``tokens``) and
records the memory and the per-token writes."""

import numpy as np

import cocotb
from cocotbext.axi import (AxiRamRead, AxiRamWrite, AxiReadBus, AxiStreamBus, AxiStreamFrame,
                           AxiStreamSink, AxiStreamSource, AxiWriteBus)
from axi_harness import (BusMonitor, ItemBus, begin, check_bursts, delay_reads,
                         delay_responses, pauses, program, release, reset_of, run_to_irq,
                         take_items)
from harness import Layout, Run


@cocotb.test()
async def moe_re_routing_axi(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    runtime = s["runtime"]
    reg = {r["name"]: r["offset"] for r in s["registers"]}
    read_bus, write_bus = s["buses"]["read"], s["buses"]["write"]
    bus_bytes = lanes * width // 8
    (in_base, out_base), size = s["bases"], s["buffer_bytes"]
    dtype = {8: "<u1", 16: "<u2"}[width]
    stall, seed = s["stall"], s["seed"]

    axil = begin(dut)
    kwargs = reset_of(dut)
    reader = AxiRamRead(AxiReadBus.from_prefix(dut, read_bus), dut.aclk, size=s["ram_size"],
                        **kwargs)
    writer = AxiRamWrite(AxiWriteBus.from_prefix(dut, write_bus), dut.aclk, mem=reader.mem,
                         size=s["ram_size"], **kwargs)
    counts = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_counts"), dut.aclk,
                             **kwargs)
    scales = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_scales"), dut.aclk,
                             **kwargs) if s["scales"] else None
    totals = AxiStreamSink(ItemBus.from_prefix(dut, "m_axis_expert_token_num"), dut.aclk,
                           **kwargs)
    rows = AxiStreamSink(ItemBus.from_prefix(dut, "m_axis_row_write"), dut.aclk, **kwargs)
    monitors = [BusMonitor(dut, read_bus, writes=False, reads=True), BusMonitor(dut, write_bus)]
    delay_reads(reader, dut.aclk, s["latency"], monitors[0])
    delay_responses(writer, dut.aclk, s["latency"])
    if stall > 0:
        for n, channel in enumerate([counts, totals, rows, reader.ar_channel,
                                     reader.r_channel, writer.aw_channel, writer.w_channel,
                                     *([scales] if scales else [])]):
            channel.set_pause_generator(pauses(stall, seed + n))
    reader.write(0, b"\xa5" * s["ram_size"])
    reader.write(in_base, st["memory"].astype(dtype).tobytes())
    await release(dut, monitors)

    info = await axil.read_dword(reg["INFO"])
    assert info == lanes | width << 8, f"INFO reads {info:#x}"
    await program(axil, reg, runtime)
    await axil.write_dword(reg[f"{read_bus[len('m_axi_'):].upper()}_BASE"], in_base)
    await axil.write_dword(reg[f"{write_bus[len('m_axi_'):].upper()}_BASE"], out_base)
    count_bytes = s["count_bytes"]
    counts.send_nowait(AxiStreamFrame(b"".join(int(c).to_bytes(count_bytes, "little")
                                               for c in st["counts"].tolist())))
    if scales is not None and len(st["scales"]):
        scales.send_nowait(AxiStreamFrame(b"".join(int(c).to_bytes(4, "little")
                                                   for c in st["scales"].tolist())))
    beats = s["expected_beats"]
    limit = 40 * (len(st["counts"]) + runtime["num_experts"] + beats + runtime["tokens"]) + 3000
    cycles, status, irq_after = await run_to_irq(dut, axil, reg, monitors[0], limit)

    check_bursts(monitors[0].ar, bus_bytes, s["max_burst"])
    check_bursts(monitors[1].aw, bus_bytes, s["max_burst"])
    end = in_base + -(-size // bus_bytes) * bus_bytes
    inside = all(in_base <= addr and addr + (length + 1) * bus_bytes <= end
                 for addr, length, _, _ in monitors[0].ar)
    layout = Layout(s["row_write_layout"])
    words = take_items(rows)
    fields = {name: np.array([layout.unpack(w, name) for w in words], dtype=np.int64)
              for name in ("row", "idx_addr", "idx", *(["scale"] if s["scales"] else []))}
    if not s["scales"]:
        fields["scale"] = np.zeros(len(words), np.int64)
    memory = np.frombuffer(writer.read(out_base, size), dtype=dtype).astype(np.uint64)
    guard = writer.read(0, in_base) + writer.read(in_base + size, out_base - in_base - size) + \
        writer.read(out_base + size, s["ram_size"] - out_base - size)
    run.save(memory=memory, expert_token_num=np.array(take_items(totals), dtype=np.int64),
             **fields, counts_taken=len(st["counts"]) if counts.empty() else -1,
             scales_taken=(len(st["scales"]) if scales.empty() else -1) if scales else 0,
             guard_ok=int(guard == b"\xa5" * len(guard)), reads_inside=int(inside),
             cycles=cycles, status=status, irq_after=irq_after,
             read_bursts=len(monitors[0].ar), write_bursts=len(monitors[1].aw))
