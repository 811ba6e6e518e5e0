"""The ULX3S self-checking top (moe_hw/flows/board.py) in Amaranth's simulator: the dispatch
unit's buffer, read back into a CRC-32, matches the golden model's, and a wrong signature or a
different stimulus is caught; the board's variant (DP16KD block RAM) once more in Icarus. (The
bitstream itself is built by ``python -m moe_hw.board``.)"""

import subprocess

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from moe_hw import golden
from moe_hw.flows.board import (BoardTop, DispatchSelfCheck, expected_checksum, float_masks,
                                lfsr_sequence, lfsr_step, self_check_problem)
from moe_hw.blocks.block_memory import DP16KD_SIM
from moe_hw.flows.simulate import simulator_available
from moe_hw.formats import FORMATS, to_bits


def run(check):
    """Simulate ``check`` from reset to ``done`` (with a margin past its cycle count); returns
    the first cycle ``done`` is seen and the outputs then."""
    top = Module()
    top.domains.sync = ClockDomain()
    top.submodules.check = check
    sim = Simulator(top)
    sim.add_clock(1e-6)
    seen = {}

    async def bench(ctx):
        for cycle in range(check.cycles + 20):
            if ctx.get(check.done):
                seen.update(cycle=cycle, passed=ctx.get(check.passed),
                            failed=ctx.get(check.failed))
                return
            assert not ctx.get(check.passed) and not ctx.get(check.failed)
            await ctx.tick()

    sim.add_testbench(bench)
    sim.run()
    return seen


def test_lfsr_is_the_galois_register():
    # x^32 + x^22 + x^2 + x + 1, shifted right: period 2**32 - 1, so no early repeat
    states = lfsr_sequence(1, 4)
    assert [int(s) for s in states] == [1, 0x80200003, 0xC0300002, 0x60180001]
    assert lfsr_step(0x60180001) == 0xB02C0003
    assert len(set(lfsr_sequence(0x5EED1234, 5000).tolist())) == 5000


def test_problem_is_valid_and_drops_some_pairs():
    problem = self_check_problem(format="bf16", lanes=4, pairs=48, hidden=8, num_experts=4,
                                 capacity=6, seed=0x5EED1234)
    assert np.all(np.isfinite(problem.gates.astype(np.float32)))
    assert np.all(np.isfinite(problem.input.astype(np.float32)))
    magnitudes = np.abs(problem.input.astype(np.float32))
    assert magnitudes.min() >= 2.0 ** -7 and magnitudes.max() < 2
    dropped = golden.dispatch_dropped(problem.indices, problem.locations, num_experts=4,
                                      capacity=6)
    assert 0 < dropped < 48
    assert np.count_nonzero(problem.dispatch()) > 0


def test_float_masks_force_the_exponent():
    keep, set_ = float_masks(FORMATS["fp32"])
    bits = (np.uint32(0xFFFFFFFF) & np.uint32(keep)) | np.uint32(set_)
    assert bits == to_bits(np.float32(-2.0 + 2.0 ** -23), "fp32")   # largest magnitude: < 2


@pytest.mark.parametrize("settings", [
    {},                                     # the board's design point: bf16, 4 lanes, E=4, C=6
    # fp32 on 2 lanes; E=3 (indices 0-3: some past E) and C=8 (locations 0-15)
    {"format": "fp32", "lanes": 2, "pairs": 24, "hidden": 6, "num_experts": 3, "capacity": 8},
], ids=["bf16", "fp32"])
def test_self_check_passes(settings):
    check = DispatchSelfCheck(**settings)
    seen = run(check)
    # the cycle count is exact: the sources never stall and write.ready is always high
    assert seen == {"cycle": check.cycles, "passed": 1, "failed": 0}


@pytest.mark.parametrize("change", ["checksum", "seed"])
def test_self_check_fails_on_a_mismatch(change):
    right = DispatchSelfCheck()
    if change == "checksum":
        check = DispatchSelfCheck(checksum=right.checksum ^ 1)
    else:
        # the hardware runs another stimulus, checked against the first one's signature
        check = DispatchSelfCheck(seed=right.seed + 1, checksum=right.checksum)
        assert expected_checksum(check.problem, check.fmt, check.lanes) != right.checksum
    seen = run(check)
    assert seen == {"cycle": check.cycles, "passed": 0, "failed": 1}


def test_board_top_drives_the_leds():
    # Amaranth's platform flow up to the build files (no tool runs): the LEDs and the button
    # are the top's, on the ULX3S's pins, and the clock is the 25 MHz oscillator.
    ulx3s = pytest.importorskip("amaranth_boards.ulx3s")
    plan = ulx3s.ULX3S_85F_Platform().build(BoardTop(DispatchSelfCheck()), name="top",
                                            do_build=False)
    lpf = plan.files["top.lpf"]
    for port, pin in (("led_0__io", "B2"), ("led_1__io", "C2"), ("led_2__io", "C1"),
                      ("led_7__io", "H3"), ("button_fire_0__io", "R1"), ("clk25_0__io", "G2")):
        assert f'LOCATE COMP "{port}" SITE "{pin}";' in lpf
    assert 'FREQUENCY PORT "clk25_0__io" 25000000' in lpf


ICARUS_BENCH = """
module bench;
  reg clk = 0, rst = 0;
  wire done, passed, failed;
  integer cycle;
  top dut(.clk(clk), .rst(rst), .done(done), .passed(passed), .failed(failed));
  always #5 clk = ~clk;
  initial begin
    #1 rst = 1;                         // an edge on rst at time 0 wakes Icarus's always @*
    repeat (2) @(posedge clk);
    #1 rst = 0;
    for (cycle = 0; cycle < LIMIT && done !== 1; cycle = cycle + 1) begin
      if (passed !== 0 || failed !== 0) $display("EARLY %0d", cycle);
      @(posedge clk) #1;
    end
    $display("RESULT %0d %0d %0d %0d", cycle, done, passed, failed);
    $finish;
  end
endmodule
"""


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "wrong-checksum"])
def test_board_variant_in_icarus(tmp_path, wrong):
    """The design the bitstream is built from (``bram=ecp5``: DP16KD instances, here their
    behavioural model) as Verilog in Icarus: the same verdict at the same cycle."""
    reason = simulator_available("icarus")
    if reason:
        pytest.skip(reason)
    check = DispatchSelfCheck(bram="ecp5")
    if wrong:
        check = DispatchSelfCheck(bram="ecp5", checksum=check.checksum ^ 0x80000000)
    (tmp_path / "top.v").write_text(verilog.convert(check, name="top"))
    (tmp_path / "dp16kd.v").write_text(DP16KD_SIM)
    (tmp_path / "bench.v").write_text(ICARUS_BENCH.replace("LIMIT", str(check.cycles + 20)))
    subprocess.run(["iverilog", "-g2012", "-o", "bench", "bench.v", "top.v", "dp16kd.v"],
                   cwd=tmp_path, check=True)
    out = subprocess.run(["vvp", "-n", "bench"], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    assert "EARLY" not in out
    assert f"RESULT {check.cycles} 1 {int(not wrong)} {int(wrong)}" in out, out
