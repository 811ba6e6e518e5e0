"""cocotb bench for the dispatch unit behind its AXI wrapper (``--set interface=axi``), driven
with cocotbext-axi: ``AxiLiteMaster`` programs the sizes and the base address and starts the
run, ``AxiStreamSource`` sends the headers (one frame each) and the token rows (one frame a
row, so ``tlast`` ends a row and ``tkeep`` trims its last beat), ``AxiRamWrite`` (the write
half of ``AxiRam``) holds the expert buffer, with its write response delayed by ``latency``
cycles. With ``stall`` > 0, every stream source and the RAM's AW and W channels pause at
random. A monitor records every AW and W handshake; the bench checks the bursts (INCR, at
most ``max_burst`` beats, ``wlast`` on each burst's last beat only, none crossing 4 KiB)
and records the element addresses each burst's strobes enable, and the memory image."""

import numpy as np

import cocotb
from cocotbext.axi import (AxiRamWrite, AxiStreamBus, AxiStreamFrame, AxiStreamSource,
                           AxiWriteBus)
from axi_harness import (BusMonitor, begin, check_bursts, delay_responses, pauses, program,
                         release, reset_of, run_to_irq)
from harness import Layout, Run


@cocotb.test()
async def dispatch_axi(dut):
    run = Run()
    s, st = run.settings, run.stimulus
    lanes, width = s["lanes"], s["width"]
    hidden, pairs = s["hidden"], s["pairs"]
    reg = {r["name"]: r["offset"] for r in s["registers"]}
    bus = s["bus"]                              # "m_axi_dispatch"
    elem_bytes = width // 8
    base, size = s["base"], s["buffer_elements"] * elem_bytes

    header = Layout(s["header_layout"])
    header_bytes = s["header_bytes"]
    frames = [header.pack(gate=g, index=i, location=l).to_bytes(header_bytes, "little")
              for g, i, l in zip(st["gate"].tolist(), st["index"].tolist(),
                                 st["location"].tolist())]
    dtype = {16: "<u2", 32: "<u4"}[width]
    rows = [st["input"][row].astype(dtype).tobytes() for row in st["row"].tolist()]
    if not s["feed"]:
        frames, rows = [], []

    axil = begin(dut)
    kwargs = reset_of(dut)
    ram = AxiRamWrite(AxiWriteBus.from_prefix(dut, bus), dut.aclk, size=s["ram_size"],
                      **kwargs)
    headers = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_header"), dut.aclk,
                              **kwargs)
    data = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_data"), dut.aclk, **kwargs)
    delay_responses(ram, dut.aclk, s["latency"])
    if s["stall"] > 0:
        headers.set_pause_generator(pauses(s["stall"], s["seed"]))
        data.set_pause_generator(pauses(s["stall"], s["seed"] + 1))
        ram.aw_channel.set_pause_generator(pauses(s["stall"], s["seed"] + 2))
        ram.w_channel.set_pause_generator(pauses(s["stall"], s["seed"] + 3))
    # The buffer starts zeroed (as the golden model's output) inside a guard pattern.
    ram.write(0, b"\xa5" * s["ram_size"])
    ram.write(base, bytes(size))
    monitor = BusMonitor(dut, bus)
    await release(dut, [monitor])

    info = await axil.read_dword(reg["INFO"])
    assert info == lanes | width << 8, f"INFO reads {info:#x}"
    await program(axil, reg, {name: s[name] for name in ("pairs", "hidden", "capacity",
                                                         "num_experts")})
    await axil.write_dword(reg["DISPATCH_BASE"], base)
    for frame in frames:
        headers.send_nowait(AxiStreamFrame(frame))
    for row in rows:
        data.send_nowait(AxiStreamFrame(row))
    limit = 40 * (pairs * -(-hidden // lanes) + pairs) + 2000
    cycles, status, irq_after = await run_to_irq(dut, axil, reg, monitor, limit)
    dropped = await axil.read_dword(reg["DROPPED"])
    assert headers.empty() and data.empty(), "a stream was not read to its end"

    # ---- bursts: INCR, lengths, wlast, 4 KiB, strobes -> element addresses ----------------
    bus_bytes = lanes * elem_bytes
    beats = iter(monitor.w)
    strobed = []
    check_bursts(monitor.aw, bus_bytes, s["max_burst"])
    for addr, length, _, _ in monitor.aw:
        for beat in range(length + 1):
            word, strb, last = next(beats)
            assert last == (beat == length), f"wlast {last} on beat {beat} of {length + 1}"
            for lane in range(lanes):
                lane_strb = (strb >> (lane * elem_bytes)) & ((1 << elem_bytes) - 1)
                assert lane_strb in (0, (1 << elem_bytes) - 1), f"partial strobes {strb:#x}"
                if lane_strb:
                    byte = addr + beat * bus_bytes + lane * elem_bytes
                    strobed.append((byte - base) // elem_bytes)
    assert next(beats, None) is None, "W beats without a burst"

    memory = np.frombuffer(ram.read(base, size), dtype=dtype).astype(np.uint64)
    guard = ram.read(0, base) + ram.read(base + size, s["ram_size"] - base - size)
    run.save(memory=memory, cycles=cycles, status=status, dropped=dropped,
             strobed=np.array(strobed, dtype=np.int64), bursts=len(monitor.aw),
             burst_beats=np.array([a[1] + 1 for a in monitor.aw], dtype=np.int64),
             burst_addr=np.array([a[0] for a in monitor.aw], dtype=np.int64),
             guard_ok=int(guard == b"\xa5" * len(guard)), irq_after=irq_after)
