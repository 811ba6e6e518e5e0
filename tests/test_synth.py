"""``python -m moe_hw.synth``: the flow runs on a small design on iCE40 and on ECP5 and its
report parses; the out-of-context wrapper reaches every output bit; bad arguments and tool
failures end in one line.

No timing is asserted: Fmax is a figure to read, not a property of the code. The sweeps over
the units at their default parameters are benchmarks, run by hand (README).
"""

import importlib.util
import json
import random
import statistics
from pathlib import Path

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from moe_hw import synth
from moe_hw.blocks.banked_memory import BankedMemory
from moe_hw.blocks.block_memory import BlockMemory
from moe_hw.blocks.counter_bank import CounterBank
from moe_hw.flows import levels as levels_flow
from moe_hw.flows import synth as flow
from moe_hw.flows.out_of_context import OutOfContext, ReferenceAdder
from moe_hw.flows.synth import (RESOURCES, TARGETS, CriticalPath, report_clocks,
                                report_resources)

PROG = "python -m moe_hw.synth"


def _error_lines(capsys, argv, code):
    with pytest.raises(SystemExit) as exit:
        synth.main(argv)
    assert exit.value.code == code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return [line for line in captured.err.splitlines() if not line.startswith("[moe_hw.synth]")]


# ---- the flow on real tools ----------------------------------------------------------------

SMALL_DESIGNS = [
    pytest.param("ice40-up5k", "fmul", ["format=bf16", "mul_stages=2"], id="ice40-fmul-bf16"),
    pytest.param("ecp5-85k", "dispatch",
                 ["lanes=1", "format=bf16", "max_pairs=8", "max_hidden=8", "max_capacity=8",
                  "max_experts=4", "index_width=8"], id="ecp5-dispatch-tiny"),
]


@pytest.mark.parametrize("target, unit, sets", SMALL_DESIGNS)
def test_synth_runs_and_its_report_parses(tmp_path, capsys, target, unit, sets):
    report_path = tmp_path / "report.json"
    argv = [unit, "--target", target, "--seeds", "1", "--json", str(report_path),
            "--long-nets", "4", "--work", str(tmp_path / "work")]
    for setting in sets:
        argv += ["--set", setting]
    assert synth.main(argv) == 0
    table = capsys.readouterr().out

    report = json.loads(report_path.read_text())
    assert report["target"] == target and report["seeds"] == 1
    assert report["freq_mhz"] == TARGETS[target].default_freq
    assert set(report["tools"]) == {"yosys", f"nextpnr-{target.split('-')[0]}"}
    for key, name in (("reference", "reference adder"), ("design", unit)):
        design = report[key]
        assert design["name"] == name
        assert design["fmax_mhz"] > 0
        assert list(design["seed_fmax_mhz"]) == ["1"] and design["best_seed"] == 1
        assert list(design["clocks"]) == ["clk"]
        clock = design["clocks"]["clk"]
        assert clock["fmax_mhz"] == design["fmax_mhz"]
        path = clock["critical_path"]
        assert path["start"] and path["end"] and path["start_cell"] and path["end_cell"]
        assert isinstance(path["logic_levels"], int) and path["logic_levels"] >= 1
        assert 0 <= path["routing_ns"] <= path["delay_ns"]
        assert set(design["resources"]) == set(RESOURCES)
        for figures in design["resources"].values():
            assert isinstance(figures["used"], int) and figures["used"] >= 0
        assert design["resources"]["lut4"]["used"] > 0
        assert design["resources"]["ff"]["used"] > 0
    # the reference adder uses no DSP, no RAM
    assert report["reference"]["resources"]["dsp"]["used"] == 0
    assert report["reference"]["resources"]["bram"]["used"] == 0
    # both designs multiply once, in one DSP block (an 8x8 significand product)
    assert report["design"]["resources"]["dsp"]["used"] >= 1
    assert report["ratio"] == pytest.approx(report["design"]["fmax_mhz"] /
                                            report["reference"]["fmax_mhz"])
    # the parameters reported are the unit's, with the --set values in them
    assert report["design"]["params"]["format"] == "bf16"

    rows = {line.split()[0]: line for line in table.splitlines()
            if line.startswith(("reference", unit + " "))}
    assert f"{report['design']['fmax_mhz']:.1f}" in rows[unit]
    assert f"{report['reference']['fmax_mhz']:.1f}" in rows["reference"]
    assert f"{report['ratio']:.2f}" in rows[unit]
    assert "Fmax MHz" in table and "critical path" in table
    # --long-nets: the design's nets with sinks routed over half the period, if any
    half = 500.0 / report["freq_mhz"]
    assert len(report["design"]["long_nets"]) <= 4 and "Long nets (" in table
    for net in report["design"]["long_nets"]:
        assert 1 <= net["long_sinks"] <= net["sinks"] and net["max_delay_ns"] > half
        assert sum(net["pins"].values()) == net["long_sinks"]
        assert net["net"] in table
    assert report["reference"]["long_nets"] == []
    # --work keeps what the tools wrote, for reading the critical path in full
    assert (tmp_path / "work" / unit / "seed1.log").exists()

    # --resources: synthesis and packing only, the same counts as the placed design's
    packed_path = tmp_path / "packed.json"
    assert synth.main([*argv[:argv.index("--seeds")], "--resources", "--parts", "3",
                       "--json", str(packed_path), *argv[argv.index("--work") + 2:]]) == 0
    table = capsys.readouterr().out
    packed = json.loads(packed_path.read_text())
    assert packed["name"] == unit and packed["params"]["format"] == "bf16"
    assert packed["resources"] == report["design"]["resources"]
    assert packed["wrapper_registers"] == report["design"]["wrapper_registers"]
    assert "no Fmax" in table and "LUT4" in table
    assert str(packed["resources"]["lut4"]["used"]) in table.splitlines()[2]
    # --parts: the unit first (it counts every part inside it), then its largest parts
    parts = packed["parts"]
    assert 2 <= len(parts) <= 3 and parts[0]["part"] == "" and parts[0]["LUT4"] > 0
    assert "Largest parts" in table and "(the unit)" in table
    for part in parts[1:]:
        assert part["part"] and part["part"] in table
        assert all(part[column] <= parts[0][column] for column in flow.PART_COLUMNS)
    # on ECP5 the logic levels of every register input, counted in the netlist
    if target.startswith("ecp5"):
        histogram = {int(k): v for k, v in packed["levels"]["histogram"].items()}
        assert sum(histogram.values()) > 0
        assert max(histogram) >= 2
        worst = packed["levels"]["endpoints"][0]
        assert worst["estimate_ns"] == max(e["estimate_ns"]
                                           for e in packed["levels"]["endpoints"])
        assert f"{worst['source']} -> {worst['sink']}" in table
        assert "logic levels" in table
    else:
        assert packed["levels"] is None and "logic levels" not in table


def test_board_target_writes_a_bitstream(tmp_path, capsys):
    report_path = tmp_path / "report.json"
    argv = ["fmul", "--target", "ulx3s-85f", "--seeds", "1", "--set", "format=bf16", "--set",
            "mul_stages=2", "--json", str(report_path), "--work", str(tmp_path / "work")]
    assert synth.main(argv) == 0
    table = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    bitstream = Path(report["design"]["bitstream"])
    assert bitstream == tmp_path / "work" / "fmul" / "top.bit"
    assert f"bitstream: {bitstream}" in table
    # ecppack's header names the part the board carries
    assert b"Part: LFE5U-85F-6CABGA381" in bitstream.read_bytes()[:64]
    # the four wrapper ports sit on the board's pins
    log = (tmp_path / "work" / "fmul" / "seed1.log").read_text()
    assert "constraining clock net 'clk' to 25.00 MHz" in log
    for port in ("clk", "rst", "si", "so"):
        assert f"pin '{port}$tr_io' constrained to Bel" in log


class _ElementNamed(wiring.Component):
    """Two 2-bit registers, ``x`` and one named ``x[1]``, the name Amaranth gives element 1
    of an array-layout signal ``x``: ABC's bit 1 of ``x`` and bit 0 of ``x[1]`` share a
    name."""

    a: In(4)
    y: Out(4)

    def elaborate(self, platform):
        m = Module()
        x, x1 = Signal(2, name="x"), Signal(2, name="x[1]")
        m.d.sync += [x.eq(self.a[:2] ^ x1), x1.eq(self.a[2:] & x)]
        m.d.comb += self.y.eq(Cat(x ^ x1, x & x1))
        return m


def _yosys_cells(tmp_path, component):
    """The cell counts by type of the flow's Yosys synthesis of ``component`` on ECP5 (no
    place and route)."""
    (tmp_path / "top.il").write_text(rtlil.convert(component, name="top"))
    flow._yosys_synth(tmp_path, TARGETS["ecp5-85k"], 600, "test design")
    return json.loads((tmp_path / "stat.json").read_text())["design"]["num_cells_by_type"]


def test_yosys_keeps_nets_whose_names_meet(tmp_path):
    """Yosys 0.70's ABC9 step maps nets back by name (``flow.YOSYS_PREPARE``): without the
    flow's renaming this design stops Yosys on a failed assertion, or (named otherwise) loses
    a flip-flop. With it, all four flip-flops are there."""
    assert _yosys_cells(tmp_path, _ElementNamed())["TRELLIS_FF"] == 4


@pytest.mark.parametrize("fanout, levels, flip_flops", [
    (None, [], 13 + 20 + 1),
    # a level of 3 registers: the read address (13 bits each), the write address and enable;
    # the read data's register after the blocks
    (4, [3], 3 * 13 + 3 * (13 + 1) + 20 + 20)])
def test_block_memory_address_tree_survives_yosys(tmp_path, fanout, levels, flip_flops):
    """A BlockMemory's address tree on ECP5 (10 blocks of 8192 x 2, ``fanout`` 4): Yosys
    keeps every register of it, each a copy of the same address, where it would merge
    registers of its own into one (without the tree: the registered write's address, data
    and enable)."""
    mem = BlockMemory(20, 8192, target="ecp5", registered_write=True, fanout=fanout)
    assert mem.tree_levels == levels and mem.latency == 2 + len(levels) + bool(levels)
    cells = _yosys_cells(tmp_path, mem)
    assert (cells["TRELLIS_FF"], cells["DP16KD"]) == (flip_flops, 10)


@pytest.mark.parametrize("banks", [1, 8])
def test_banked_memory_keeps_an_address_copy_per_bank(tmp_path, banks):
    """A BankedMemory's banks each keep their own read and write address registers (kept
    registers: the flow gives their flip-flops ``keep``), where Yosys would merge the copies
    of one address into one register per bit (8 banks: 8 + 8 flip-flops, not 64 + 64)."""
    mem = BankedMemory(8, 16 * banks, bank_depth=16)
    cells = _yosys_cells(tmp_path, mem)
    # Per bank of 16 words of 8 bits: the read and write addresses (4 + 4), the write enable,
    # the read port's word (8) and, with more than one bank, its hit flag. Shared: the write
    # data (8: the banks' registers of it merge), the selected word (8) and the bank number.
    per_bank = 4 + 4 + 1 + 8 + (banks > 1)
    shared = 8 + 8 + (3 if banks > 1 else 0)
    assert cells["TRELLIS_FF"] == banks * per_bank + shared, cells


@pytest.mark.parametrize("counters", ["lut", "auto"])
def test_counter_bank_memory_at_256_experts(tmp_path, counters):
    """A counter bank of 256 (the location unit's at 256 experts, ``bram=ecp5``): with
    ``counters="lut"`` LUT RAM, not a block RAM that Yosys infers (whose read has no output
    register, its data 4.5 ns after the clock: 148-153 MHz against 187-204 in LUT RAM); by
    default (``auto``, past 32 counters) one DP16KD, its output register on, and no LUT RAM
    (246.3 MHz mean, README "Synthesis and timing")."""
    from moe_hw.units.locations import LocationsParams, LocationsUnit
    params = LocationsParams(max_experts=256, counters=counters, bram="ecp5")
    cells = _yosys_cells(tmp_path, LocationsUnit(params))
    if counters == "lut":
        assert "DP16KD" not in cells and cells.get("TRELLIS_DPR16X4", 0) >= 256 // 16, cells
    else:
        assert cells.get("DP16KD") == 1 and "TRELLIS_DPR16X4" not in cells, cells


class _TwoBanks(wiring.Component):
    """Two block-RAM counter banks taking the same requests, each its own increments (as
    sparse_index's lanes do), their values XOR-ed out."""

    valid: In(1)
    index: In(6)
    increment: In(2)
    value: Out(8)

    def __init__(self, apart):
        self.apart = apart
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        banks = [CounterBank(64, 8, memory="block", target="ecp5", apart=self.apart)
                 for _ in range(2)]
        for lane, bank in enumerate(banks):
            m.submodules[f"bank{lane}"] = bank
            m.d.comb += [bank.en.eq(1), bank.valid.eq(self.valid), bank.index.eq(self.index),
                         bank.increment.eq(self.increment[lane])]
        m.d.comb += self.value.eq(banks[0].value ^ banks[1].value)
        return m


def test_counter_banks_apart_keep_their_stage_registers(tmp_path):
    """Banks side by side with the same requests share one set of stage registers after
    Yosys (the valid flags and the index, four and five stages), unless built ``apart``:
    then the second bank has its own, at least 4 + 4 * 6 flip-flops more."""
    flops = {}
    for apart in (False, True):
        (tmp_path / str(apart)).mkdir()
        flops[apart] = _yosys_cells(tmp_path / str(apart), _TwoBanks(apart))["TRELLIS_FF"]
    shared, apart = flops[False], flops[True]
    assert apart - shared >= 4 + 4 * 6, (shared, apart)


def test_scan_layers_synthesises_at_small_maxima(tmp_path):
    """scan_layers at the smallest maxima whose ABC9 step failed (its array-layout fields'
    names met), through Yosys only."""
    unit, params, _ = synth.synth_params("scan_layers", "ecp5-85k", {
        "format": "bf16", "max_tokens": 32, "max_hidden": 64, "max_layers": 8})
    cells = _yosys_cells(tmp_path, OutOfContext(unit.build(params)))
    assert cells["TRELLIS_FF"] > 0 and cells["LUT4"] > 0


def test_board_target_without_work_is_one_line(capsys):
    lines = _error_lines(capsys, ["fmul", "--target", "ulx3s-85f"], 2)
    assert lines == [f"{PROG}: error: target ulx3s-85f writes a bitstream: name --work DIR "
                     "to keep it"]


def test_a_tool_that_does_not_finish_is_one_line(capsys):
    lines = _error_lines(capsys, ["fmul", "--target", "ice40-up5k", "--timeout", "0.2"], 1)
    assert lines == [f"{PROG}: error: reference adder on ice40-up5k: yosys did not finish "
                     "in 0.2 s"]


def test_a_seed_that_does_not_finish_is_skipped(monkeypatch):
    """A seed whose place and route passes the time limit is left out of the best-of; only
    when no seed finishes is it the run's error."""
    real = flow._run_tool
    calls = []

    def seed_one_never_finishes(tool, args, cwd, log_path, timeout):
        if tool.startswith("nextpnr") and "--seed" in args and \
                args[args.index("--seed") + 1] == "1":
            calls.append(tool)
            Path(log_path).write_text("Info: still routing\n")
            return None
        return real(tool, args, cwd, log_path, timeout)

    monkeypatch.setattr(flow, "_run_tool", seed_one_never_finishes)
    report = flow.synthesize("adder", lambda: ReferenceAdder(8), "ice40-up5k", seeds=2)
    assert calls == ["nextpnr-ice40", "nextpnr-ice40"]       # the reference's and the design's
    assert report.design.unfinished_seeds == (1,) and list(report.design.seed_fmax_mhz) == [2]
    assert report.design.best_seed == 2 and report.design.fmax_mhz > 0
    assert ("adder: seed 1 did not finish place and route in the time limit (skipped)"
            in flow.format_table(report).splitlines())
    with pytest.raises(flow.SynthError, match=r"adder on ice40-up5k: nextpnr-ice40 \(seed 1\) "
                                              r"did not finish place-and-route"):
        flow.synthesize_design("adder", lambda: ReferenceAdder(8), "ice40-up5k", seeds=1)


def test_seeds_in_parallel_give_each_seed_its_own_figures():
    """``jobs`` places seeds at once: each seed's Fmax is the one it gets placed alone, the
    best is chosen among them as before, and the table shows every seed's figure."""
    # (the 32-bit adder on ECP5: its seeds place it differently, 351.2 and 354.9 MHz on
    # seeds 1 and 2)
    alone = flow.synthesize_design("adder", ReferenceAdder, "ecp5-85k", seeds=3, jobs=1)
    report = flow.synthesize("adder", ReferenceAdder, "ecp5-85k", seeds=3, jobs=2)
    together = report.design
    assert together.seed_fmax_mhz == alone.seed_fmax_mhz and len(alone.seed_fmax_mhz) == 3
    assert len(set(alone.seed_fmax_mhz.values())) > 1
    assert together.best_seed == alone.best_seed
    assert together.fmax_mhz == max(alone.seed_fmax_mhz.values())
    spread, = [line for line in flow.format_table(report).splitlines()
               if line.startswith("Fmax by seed")]
    figures = ", ".join(f"{mhz:.1f}" + ("*" if seed == together.best_seed else "")
                        for seed, mhz in sorted(together.seed_fmax_mhz.items()))
    mean = sum(together.seed_fmax_mhz.values()) / 3
    sd = statistics.stdev(together.seed_fmax_mhz.values())
    assert f"adder: {figures} (mean {mean:.1f}, sd {sd:.1f})" in spread
    # every seed's critical path: the best seed's is the one reported, a seed's the same
    # placed alone or beside another, and the table lists them and the registers they end in
    assert together.seed_paths == alone.seed_paths and sorted(together.seed_paths) == [1, 2, 3]
    assert together.seed_paths[together.best_seed] == together.clocks["clk"].critical_path
    table = flow.format_table(report).splitlines()
    at = table.index("Critical path by seed (adder):")
    for row, seed in enumerate((1, 2, 3), start=at + 1):
        path = together.seed_paths[seed]
        assert table[row].startswith(f"  seed {seed}: {together.seed_fmax_mhz[seed]:6.1f} MHz")
        assert f"{path.start} -> {path.end} ({path.logic_levels} levels" in table[row]
        assert table[row].endswith("% routing)")
        assert ("*" in table[row].split("MHz")[1][:1]) == (seed == together.best_seed)
    ends = {path.end for path in together.seed_paths.values()}
    assert table[at + 4].startswith("  ends: ") and all(end in table[at + 4] for end in ends)
    assert report.to_json()["design"]["seed_paths"]["2"]["end"] == together.seed_paths[2].end
    # ``first_seed``: seeds 2 and 3 alone are the run of three's seeds 2 and 3, and the
    # table names them
    later = flow.synthesize("adder", ReferenceAdder, "ecp5-85k", seeds=2, jobs=2,
                            first_seed=2)
    assert later.design.seed_fmax_mhz == {seed: alone.seed_fmax_mhz[seed] for seed in (2, 3)}
    assert later.to_json()["first_seed"] == 2
    table = flow.format_table(later).splitlines()
    assert "best of 2 seeds (2-3) each" in table[1]
    assert [line for line in table if line.startswith("Fmax by seed (seeds 2-3; MHz")]


# ---- bad arguments: one line, before any tool runs -----------------------------------------

def test_bad_target_is_one_line(capsys):
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-12k"], 2)
    assert lines == [f"{PROG}: error: target must be ecp5-85k, ice40-up5k, nexus-40k or "
                     "ulx3s-85f, not 'ecp5-12k'"]


@pytest.mark.parametrize("setting, message", [
    ("format=fp8", "format must be fp32, fp16 or bf16, not 'fp8'"),
    ("lanes=4", "unit fmul has no parameter 'lanes'; its parameters are format, mul_stages, dsp"),
    ("format", "--set takes NAME=VALUE, not 'format'"),
])
def test_bad_set_is_one_line(capsys, setting, message):
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--set", setting], 2)
    assert lines == [f"{PROG}: error: {message}"]


def test_bad_first_seed_is_one_line(capsys):
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--first-seed", "0"], 2)
    assert lines == [f"{PROG}: error: first_seed must be a positive integer, not 0"]


def test_resources_with_check_is_one_line(capsys):
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--resources", "--check"], 2)
    assert lines == [f"{PROG}: error: --check needs an Fmax: leave out --resources"]


def test_compare_seeds_by_mean_and_standard_error():
    """--against's comparison: each side's mean and standard deviation, the difference of
    the means, its standard error and the verdict at two standard errors."""
    before = {1: 226.0, 2: 226.1, 3: 215.1, 4: 205.5}
    mean, sd = flow.seed_statistics(before.values())
    assert mean == pytest.approx(218.175) and sd == pytest.approx(statistics.stdev(
        before.values()))
    assert flow.seed_statistics([251.0]) == (251.0, None)
    with pytest.raises(ValueError, match="no figures"):
        flow.seed_statistics([])
    faster = {seed: mhz + 25.0 + (seed % 2) for seed, mhz in before.items()}
    lines = flow.compare_seeds(faster, before, names=("new", "old"))
    error = (statistics.variance(faster.values()) / 4 +
             statistics.variance(before.values()) / 4) ** 0.5
    difference = statistics.mean(faster.values()) - mean
    assert len(lines) == 3
    assert lines[0].startswith(f"new: 4 seeds, mean {mean + difference:.1f}, sd ")
    assert lines[1] == f"old: 4 seeds, mean {mean:.1f}, sd {sd:.1f}"
    assert lines[2].startswith(f"difference {difference:+.1f} MHz, standard error {error:.1f}")
    assert lines[2].endswith("beyond two standard errors: new is faster")
    slower = flow.compare_seeds(before, faster, names=("new", "old"))
    assert slower[2].endswith("beyond two standard errors: new is slower")
    # a shift well inside the spread: no difference shown
    near = {seed: mhz + 2.0 for seed, mhz in before.items()}
    assert flow.compare_seeds(near, before)[2].endswith("no difference shown beyond the "
                                                        "seeds' spread")
    assert "needs two seeds or more" in flow.compare_seeds({1: 240.0}, before)[2]


def test_against_compares_with_an_earlier_report(tmp_path, capsys, monkeypatch):
    """--against FILE prints the comparison under the table; a file that is no placement
    report, a missing one, or --against with --resources is one line, before any tool
    runs."""
    from types import SimpleNamespace
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"design": {"name": "fmul", "seed_fmax_mhz": {
        "1": 226.0, "2": 226.1, "3": 215.1}}}))
    now = {1: 240.0, 2: 238.5, 3: 241.0}
    monkeypatch.setattr(synth, "synth", lambda *args, **kwargs: SimpleNamespace(
        design=SimpleNamespace(name="fmul", seed_fmax_mhz=now)))
    monkeypatch.setattr(synth, "format_table", lambda report: "the table")
    assert synth.main(["fmul", "--target", "ecp5-85k", "--against", str(earlier)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "the table"
    assert out[1:] == [f"Against {earlier} (fmul):", *(
        "  " + line for line in flow.compare_seeds(now, {1: 226.0, 2: 226.1, 3: 215.1},
                                                    names=("this run", "that report")))]

    packed = tmp_path / "packed.json"
    packed.write_text(json.dumps({"name": "fmul", "resources": {}}))
    for path, message in ((packed, f"--against: {packed} is not a placement report"),
                          (tmp_path / "none.json", f"--against: no file {tmp_path}")):
        lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--against", str(path)],
                             2)
        assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: {message}")
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--resources", "--against",
                                  str(earlier)], 2)
    assert lines == [f"{PROG}: error: --against compares placements: leave out --resources"]


def test_levels_table_runs_for_one_design(tmp_path, capsys):
    # benchmarks/levels_table.py: the row of one design, its figures those of the JSON
    spec = importlib.util.spec_from_file_location(
        "levels_table", Path(__file__).resolve().parent.parent / "benchmarks" /
        "levels_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert table.main(["--only", "fmul", "--json", str(tmp_path / "l.json")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| fmul |")]
    record, = json.loads((tmp_path / "l.json").read_text())
    histogram = {int(k): v for k, v in record["levels"]["histogram"].items()}
    cells = [cell.strip() for cell in rows[-1].split("|")[1:-1]]
    assert cells[1:4] == [str(histogram.get(3, 0)), str(histogram.get(4, 0)),
                          str(sum(v for k, v in histogram.items() if k >= 5))]
    worst = record["levels"]["endpoints"][0]
    assert f"`{worst['source']}` -> `{worst['sink']}`" in cells[5]


def test_negative_paths_is_one_line(capsys):
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--resources", "--paths",
                                  "-1"], 2)
    assert lines == [f"{PROG}: error: --paths must be 0 or more, not -1"]


def test_bad_parts_is_one_line(capsys):
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--resources", "--parts",
                                  "-1"], 2)
    assert lines == [f"{PROG}: error: --parts must be 0 or more, not -1"]
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--parts", "3"], 2)
    assert lines == [f"{PROG}: error: --parts counts a packed design: add --resources"]


def test_parts_count_each_part_with_its_subparts():
    """Yosys's ``stat -json`` of a design with the hierarchy kept: the wrapper is left out,
    a subpart's instance is not a cell of its parent, a part counts its subparts, and the
    largest come first, the unit (named "") with everything in it."""
    stat = {"modules": {
        "\\top": {"num_cells_by_type": {"LUT4": 500, "TRELLIS_FF": 900, "top.unit": 1}},
        "\\top.unit": {"num_cells_by_type": {"LUT4": 10, "TRELLIS_FF": 20, "PFUMX": 7,
                                              "top.unit.lane0": 1, "top.unit.lane1": 1,
                                              "top.unit.queue": 1}},
        "\\top.unit.lane0": {"num_cells_by_type": {"LUT4": 100, "CCU2C": 8,
                                                    "MULT18X18D": 2, "TRELLIS_FF": 50}},
        "\\top.unit.lane1": {"num_cells_by_type": {"LUT4": 100, "CCU2C": 8,
                                                    "MULT18X18D": 2, "TRELLIS_FF": 60}},
        "\\top.unit.queue": {"num_cells_by_type": {"LUT4": 30, "TRELLIS_FF": 5,
                                                    "top.unit.queue.ring": 1}},
        "\\top.unit.queue.ring": {"num_cells_by_type": {"LUT4": 40, "TRELLIS_DPR16X4": 6,
                                                         "DP16KD": 1}},
    }}
    parts = flow.parts_from_stat(stat, 4)
    assert parts == [
        ("", {"LUT4": 280, "carry": 16, "FF": 135, "DSP": 4, "BRAM": 1, "DRAM": 6}),
        ("lane1", {"LUT4": 100, "carry": 8, "FF": 60, "DSP": 2, "BRAM": 0, "DRAM": 0}),
        ("lane0", {"LUT4": 100, "carry": 8, "FF": 50, "DSP": 2, "BRAM": 0, "DRAM": 0}),
        ("queue", {"LUT4": 70, "carry": 0, "FF": 5, "DSP": 0, "BRAM": 1, "DRAM": 6}),
    ]
    assert flow.parts_from_stat(stat, 1) == parts[:1]
    # iCE40's primitives in the same columns
    ice40 = {"modules": {"\\top.unit": {"num_cells_by_type": {
        "SB_LUT4": 3, "SB_CARRY": 2, "SB_DFFE": 4, "SB_DFFSR": 1, "SB_MAC16": 1,
        "SB_RAM40_4K": 2}}}}
    assert flow.parts_from_stat(ice40, 5) == [
        ("", {"LUT4": 3, "carry": 2, "FF": 5, "DSP": 1, "BRAM": 2, "DRAM": 0})]


def test_bad_long_nets_is_one_line(capsys):
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--long-nets", "-1"], 2)
    assert lines == [f"{PROG}: error: --long-nets must be 0 or more, not -1"]
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--resources",
                                  "--long-nets", "3"], 2)
    assert lines == [f"{PROG}: error: --long-nets needs a placement: leave out --resources"]


def test_bad_seeds_is_one_line(capsys):
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--seeds", "0"], 2)
    assert lines == [f"{PROG}: error: seeds must be a positive integer, not 0"]


def test_bad_jobs_is_one_line(capsys):
    lines = _error_lines(capsys, ["fmul", "--target", "ecp5-85k", "--jobs", "0"], 2)
    assert lines == [f"{PROG}: error: jobs must be a positive integer, not 0"]


# ---- the wrapper -----------------------------------------------------------------------------

def test_wrapper_reaches_every_output_bit():
    """``so`` is the parity of every output bit some cycles late; here, of the reference
    adder's sum of the two words shifted in through ``si``."""
    dut = OutOfContext(ReferenceAdder())
    assert (dut.input_bits, dut.output_bits) == (64, 32)
    rng = random.Random(12)
    bits = [rng.randrange(2) for _ in range(160)]
    seen = []

    async def bench(ctx):
        for bit in bits:
            ctx.set(dut.si, bit)
            ctx.set(dut.clk, 1)
            await ctx.delay(1e-9)
            ctx.set(dut.clk, 0)
            await ctx.delay(1e-9)
            seen.append(ctx.get(dut.so))

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()

    chain, expected = 0, []
    for bit in bits:   # the chain after each edge, shifted up, si into bit 0; Cat(a, b) is
        # its inverse (the port registers load the inverse of their chain bits)
        chain = ((chain << 1) | bit) & ((1 << 64) - 1)
        ports = ~chain & ((1 << 64) - 1)
        expected.append(bin(((ports & 0xFFFF_FFFF) + (ports >> 32)) & 0xFFFF_FFFF).count("1")
                        & 1)
    latencies = [latency for latency in range(1, 12)
                 if all(seen[t + latency] == expected[t] for t in range(64, 140))]
    assert len(latencies) == 1


def test_wrapper_takes_a_component():
    with pytest.raises(TypeError, match="unit must be an Amaranth wiring.Component, not 3"):
        OutOfContext(3)


# ---- reading nextpnr's report ------------------------------------------------------------------

def _segment(kind, delay, cell, net=None):
    segment = {"type": kind, "delay": delay, "from": {"cell": cell, "port": "Q"},
               "to": {"cell": cell, "port": "D"}}
    if net:
        segment["net"] = net
    return segment


def _netlist(cells, names):
    """A one-module Yosys JSON netlist of ``cells`` ({name: (type, {port: (direction,
    bits)})}) with net names ``names`` ({name: bits})."""
    return {"modules": {"top": {
        "attributes": {"top": 1},
        "cells": {name: {"type": kind,
                         "port_directions": {port: d for port, (d, _) in ports.items()},
                         "connections": {port: bits for port, (_, bits) in ports.items()}}
                  for name, (kind, ports) in cells.items()},
        "netnames": {name: {"bits": bits, "hide_name": 0} for name, bits in names.items()}}}}


def _ff(d, q, ce=None):
    ports = {"CLK": ("input", [1]), "DI": ("input", [d]), "Q": ("output", [q]),
             "LSR": ("input", ["0"])}
    if ce is not None:
        ports["CE"] = ("input", [ce])
    return ("TRELLIS_FF", ports)


def _lut(inputs, z):
    return ("LUT4", {**{pin: ("input", [bit]) for pin, bit in zip("ABCD", inputs)},
                     "Z": ("output", [z])})


def test_logic_levels_count_and_estimate():
    # a -> LUT -> LUT -> PFUMX (its LUTs' outputs in the slice, no level) -> b; c -> b's
    # clock enable through one LUT; a carry chain of three cells from a into d; an input
    # port into e directly.
    cells = {
        "ra": _ff(2, 10), "rc": _ff(2, 11),
        "l1": _lut([10], 20), "l2": _lut([20, 10], 21), "l3": _lut([10], 22),
        "mux": ("PFUMX", {"ALUT": ("input", [21]), "BLUT": ("input", [22]),
                          "C0": ("input", [10]), "Z": ("output", [23])}),
        "le": _lut([11], 24),
        "rb": _ff(23, 30, ce=24),
        "c0": ("CCU2C", {"A0": ("input", [10]), "CIN": ("input", ["0"]),
                         "COUT": ("output", [40]), "S0": ("output", [41])}),
        "c1": ("CCU2C", {"A0": ("input", ["0"]), "CIN": ("input", [40]),
                         "COUT": ("output", [42]), "S0": ("output", [43])}),
        "c2": ("CCU2C", {"A0": ("input", ["0"]), "CIN": ("input", [42]),
                         "COUT": ("output", [44]), "S1": ("output", [45])}),
        "rd": _ff(45, 50), "re": _ff(60, 61),
    }
    names = {"a": [10], "c": [11], "b": [30], "d": [50], "e": [61], "port": [60]}
    report = levels_flow.logic_levels(_netlist(cells, names))
    groups = {(g.sink, g.pin): g for g in report.groups}
    b = groups[("b", "data")]
    assert (b.levels, b.source) == (2, "a")
    l, n = levels_flow.LUT, levels_flow.NET
    clock = levels_flow.CLOCK_TO_OUT
    assert b.estimate_ns == pytest.approx(clock + 3 * n + 3 * l)
    enable = groups[("b", "clock enable")]
    assert (enable.levels, enable.source) == (1, "c")
    assert enable.estimate_ns == pytest.approx(clock + 2 * n + l + levels_flow.CONTROL_SETUP)
    d = groups[("d", "data")]
    assert (d.levels, d.source) == (1, "a")
    assert d.estimate_ns == pytest.approx(clock + 2 * n + levels_flow.CARRY_ENTRY +
                                          2 * levels_flow.CARRY_STEP + levels_flow.CARRY_EXIT)
    assert (groups[("e", "data")].levels, groups[("e", "data")].source) == (0, "port")
    # the inputs: a, c, e (0), d and b's enable (1), b's data (2); the clock and constant
    # pins are not
    assert report.histogram == {0: 3, 1: 2, 2: 1}
    assert report.deep(2) == 1 and report.over(b.estimate_ns - 0.01) == [b]
    assert report.groups[0] == b
    text = levels_flow.format_levels(report, 2.0, rows=2)
    assert "a -> b (data, 1 bit)" in text and "0: 3, 1: 2, 2: 1  (6 inputs)" in text
    # --paths 0: the histogram and the count over the period, no rows
    packed = flow.PackResult(name="x", description="x", params={}, resources={
        column: {"used": 1, "available": 2} for column in RESOURCES}, input_bits=1,
        output_bits=1, wrapper_registers=0, seconds=0.0, levels=report, period_ns=2.0)
    text = synth.format_resources(packed, "ecp5-85k", paths=0)
    assert "0: 3, 1: 2, 2: 1  (6 inputs)" in text
    assert f"{len(report.over(2.0))} signals estimated over 2.00 ns" in text
    assert " -> " not in text and "the worst" not in text


def test_report_parses_per_clock():
    """The clock's own critical path, not a path from or to a pad; names with Yosys's
    mapping suffixes and the wrapper's ``unit.`` stripped."""
    clock = "$glbnet$clk$TRELLIS_IO_IN"
    start = "unit.core.normalised_exponent_TRELLIS_FF_Q_1"
    end = "unit.core.rounded_product_TRELLIS_FF_Q_12"
    report = {
        "fmax": {clock: {"achieved": 123.456, "constraint": 250}},
        "critical_paths": [
            {"from": "<async>", "to": f"posedge {clock}",
             "path": [_segment("routing", 5.0, "rst$tr_io", "rst")]},
            {"from": f"posedge {clock}", "to": f"posedge {clock}", "path": [
                _segment("clk-to-q", 0.4, start),
                _segment("routing", 1.0, start, "unit.core.normalised_exponent[3]"),
                _segment("logic", 0.25, "x_LUT4_Z"),
                _segment("routing", 0.5, "x_LUT4_Z", "n"),
                _segment("logic", 0.25, "y_PFUMX_Z"),
                _segment("routing", 0.5, end, "m"),
                _segment("setup", 0.1, end)]}],
        "utilization": {"TRELLIS_COMB": {"used": 70, "available": 83640},
                        "TRELLIS_FF": {"used": 129, "available": 83640},
                        "MULT18X18D": {"used": 4, "available": 156}},
    }
    clocks = report_clocks(report)
    assert list(clocks) == ["clk"]
    assert clocks["clk"].fmax_mhz == 123.46 and clocks["clk"].constraint_mhz == 250
    assert clocks["clk"].critical_path == CriticalPath(
        start="core.normalised_exponent[3]", end="core.rounded_product", start_cell=start,
        end_cell=end, logic_levels=2, delay_ns=3.0, routing_ns=2.0)
    resources = report_resources(TARGETS["ecp5-85k"], report, {})
    assert resources == {"lut4": {"used": 70, "available": 83640},
                         "ff": {"used": 129, "available": 83640},
                         "dsp": {"used": 4, "available": 156},
                         "bram": {"used": 0, "available": 0},
                         "dram": {"used": 0, "available": 0}}
    # an iCE40 flip-flop is part of a logic cell: counted from Yosys's netlist
    ice40 = report_resources(TARGETS["ice40-up5k"], {"utilization": {}},
                             {"SB_DFFESR": 56, "SB_DFF": 1, "SB_LUT4": 9})
    assert ice40["ff"] == {"used": 57, "available": None}


def test_long_nets_rank_the_sinks_routed_over_the_threshold():
    """The nets with the most sinks whose routing delay is over the threshold, longest
    first; clock networks and nets with no such sink left out; names readable."""
    def net(name, driver, sinks):
        return {"net": name, "driver": driver, "port": "Q", "event": "posedge clk",
                "sources": [], "endpoints": [{"cell": f"c{i}", "port": port,
                                              "delay": [delay * 0.9, delay]}
                                             for i, (port, delay) in enumerate(sinks)]}
    report = {"detailed_net_timings": [
        net("$glbnet$clk$TRELLIS_IO_IN", "clk", [("CLK", 9.0)] * 50),
        net("unit.ctl.take_LUT4_Z", "unit.ctl.take_LUT4_Z",
            [("CE", 2.5), ("CE", 2.2), ("LSR", 3.1), ("A", 1.0)]),
        net("unit.q_TRELLIS_FF_Q", "unit.q_TRELLIS_FF_Q", [("B", 2.7), ("C", 1.9)]),
        net("unit.flag_TRELLIS_FF_Q", "unit.flag_TRELLIS_FF_Q", [("D", 3.9)]),
        net("unit.short", "unit.short", [("A", 0.5)] * 9)]}
    found = flow.long_nets(report, 2.0, 10)
    assert [(n.net, n.long_sinks, n.sinks) for n in found] == [
        ("ctl.take", 3, 4), ("flag", 1, 1), ("q", 1, 2)]
    assert found[0].max_delay_ns == 3.1 and found[0].pins == {"CE": 2, "LSR": 1}
    assert found[0].driver == "ctl.take"
    assert flow.long_nets(report, 2.0, 1) == found[:1]
    assert flow.long_nets(report, 5.0, 10) == ()
    # (an older nextpnr writes one delay per sink, not a pair)
    single = {"detailed_net_timings": [dict(report["detailed_net_timings"][3],
                                            endpoints=[{"cell": "c", "port": "D",
                                                        "delay": 3.9}])]}
    assert [n.max_delay_ns for n in flow.long_nets(single, 2.0, 5)] == [3.9]
    # a bad count is refused before any tool runs (the reference adder's included)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="long_nets must be 0 or more"):
            flow.synthesize("adder", ReferenceAdder, "ecp5-85k", long_nets=bad)


def test_timing_bar_verdict():
    """--check's verdict: both the absolute Fmax and the ratio to the reference count."""
    from types import SimpleNamespace

    from moe_hw.synth import at_bar, meets_bar

    assert at_bar(250.0, 357.0) and not at_bar(250.0, 358.0)         # 0.7003, 0.6983
    assert not at_bar(249.9, 300.0)

    def report(fmax, reference, seeds=None):
        return SimpleNamespace(
            design=SimpleNamespace(fmax_mhz=fmax, description="d",
                                   seed_fmax_mhz=seeds or {1: fmax}),
            reference=SimpleNamespace(fmax_mhz=reference))

    assert meets_bar(report(260.0, 354.0)).startswith("meets")
    assert meets_bar(report(249.9, 354.0)).startswith("below")      # under 250 MHz
    assert meets_bar(report(251.0, 400.0)).startswith("below")      # ratio 0.63
    # 0.697 is below 0.70: the ratio is printed to three places, so that it does not read
    # "0.70 (>= 0.70)" under a verdict of "below"
    line = meets_bar(report(252.6, 362.2))
    assert line.startswith("below") and "ratio 0.697 (>= 0.70)" in line
    # Over several seeds: how many meet the bar each on its own (250 MHz and 0.70 of the
    # reference adder's best), and which: not seed 3 (249.9 MHz), nor seed 2 (251.4 MHz,
    # 0.698 of 360).
    seeds = {1: 243.1, 2: 251.4, 3: 249.9, 4: 260.0, 5: 255.0}
    line = meets_bar(report(260.0, 360.0, seeds))
    assert line.startswith("meets") and line.endswith("; 2 of 5 seeds meet it (4, 5)")
    assert meets_bar(report(249.0, 354.0, {1: 249.0, 2: 240.0})).endswith(
        "; 0 of 2 seeds meet it")
    assert "seeds meet" not in meets_bar(report(260.0, 354.0))       # one seed: no count
