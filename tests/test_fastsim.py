"""The fast simulation path (moe_hw/flows/fastsim.py): for every unit with a fast description,
the same results, bit for bit, and the same cycle count as the cocotb bench on the same
stall-free problem; stalled runs bit-exact with a clean scoreboard; hangs reported. Icarus
for the many (no build), one Verilator model for dispatch."""

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from moe_hw.flows.simulate import SimulationError
from moe_hw.golden._common import slot_rows
from moe_hw.host.dispatch import UNIT as DISPATCH
from moe_hw.host.unit import run
from moe_hw.registry import units

from conftest import DISPATCH_MAXIMA, TINY, bench_runs, simulator_params

FAST_UNITS = [name for name, unit in units().items() if unit.has_fast]


def same_results(fast, cocotb):
    assert sorted(fast) == sorted(cocotb)
    for key in cocotb:
        got, want = np.asarray(fast[key]), np.asarray(cocotb[key])
        assert got.shape == want.shape and np.array_equal(got, want), \
            f"{key}: fast {got!r}, cocotb {want!r}"


@pytest.mark.parametrize("cocotb", simulator_params("icarus"))
@pytest.mark.parametrize("name", FAST_UNITS)
def test_fast_path_equals_cocotb(name, cocotb):
    for unit, inputs, settings in bench_runs(name):
        reference = run(unit, inputs, settings, sim=cocotb)
        fast = run(unit, inputs, settings, sim="fast-icarus")
        assert fast.passed and reference.passed, fast.problems + reference.problems
        assert fast.cycles == reference.cycles
        same_results(fast.results, reference.results)


@pytest.mark.parametrize("sim", simulator_params("icarus"))
@pytest.mark.parametrize("name", FAST_UNITS)
def test_fast_path_with_stalls_is_exact(name, sim):
    for unit, inputs, settings in bench_runs(name):
        calm = run(unit, inputs, settings, sim="fast-icarus")
        stalled = run(unit, inputs, settings, sim="fast-icarus", stall=0.4, seed=7)
        assert stalled.passed, stalled.problems
        assert stalled.cycles > calm.cycles         # the pauses cost cycles


@pytest.mark.parametrize("cocotb", simulator_params("icarus"))
def test_fast_path_drives_every_part_of_a_split_expand(cocotb):
    """expand split over two parts (the seed's split(3) example, expanded): each part's
    streams on the fast path, the same results and cycles as the cocotb bench; stalled,
    bit-exact."""
    unit = units()["expand"]
    inputs = {"input": np.random.default_rng(4).standard_normal((4, 3, 1, 2)).astype(
        np.float32), "expand_size": np.array([2, 4, 3, 4, 2])}
    settings = {"parts": 2, "split_dim": 3, "lanes": 4}
    reference = run(unit, inputs, settings, sim=cocotb)
    fast = run(unit, inputs, settings, sim="fast-icarus")
    assert fast.passed and reference.passed, fast.problems + reference.problems
    assert fast.cycles == reference.cycles == fast.expected_cycles
    same_results(fast.results, reference.results)
    stalled = run(unit, inputs, settings, sim="fast-icarus", stall=0.3, seed=3)
    assert stalled.passed and stalled.cycles > fast.cycles, stalled.problems


@pytest.mark.parametrize("sim", simulator_params("verilator"))
def test_fast_verilator_dispatch(sim):
    """The Verilator executable: the same results and cycles as the Icarus testbench, and a
    stalled run bit-exact (on tests/test_dispatch.py's design at 4 lanes: its model)."""
    shape = dataclasses.replace(TINY, tokens=24, hidden=13, lanes=4)
    (_, inputs, settings), = bench_runs("dispatch", shape)
    settings = {**settings, "format": "fp32", **DISPATCH_MAXIMA}
    fast = run(DISPATCH, inputs, settings, sim="fast")
    icarus = run(DISPATCH, inputs, settings, sim="fast-icarus")
    assert fast.passed, fast.problems
    assert fast.cycles == icarus.cycles == fast.expected_cycles
    same_results(fast.results, icarus.results)
    stalled = run(DISPATCH, inputs, settings, sim="fast", stall=0.3, seed=2)
    assert stalled.passed and stalled.cycles > fast.cycles, stalled.problems


@pytest.mark.parametrize("sim", simulator_params("icarus"))
@pytest.mark.parametrize("tokens,hidden,capacity", [(0, 8, 4), (5, 0, 4), (5, 8, 0)])
def test_fast_path_zero_element_problems(sim, tokens, hidden, capacity):
    (_, inputs, settings), = bench_runs("dispatch", dataclasses.replace(
        TINY, tokens=tokens or 1, hidden=hidden or 1))
    inputs = {**inputs, "input": inputs["input"][:tokens, :hidden],
              "gates": inputs["gates"][:, :tokens], "indices": inputs["indices"][:, :tokens],
              "locations": inputs["locations"][:, :tokens]}
    # One design for the three (emitted once); max_pairs 16 also because the cocotb bench
    # cannot read a one-bit dropped port (a Logic, not an array).
    settings = {**settings, "capacity": capacity, "max_pairs": 16, "max_hidden": 8,
                "max_capacity": 4, "max_experts": 3}
    fast = run(DISPATCH, inputs, settings, sim="fast-icarus")
    assert fast.passed and fast.cycles == fast.expected_cycles, fast.problems
    same_results(fast.results, run(DISPATCH, inputs, settings, sim=sim).results)


@pytest.mark.parametrize("sim", simulator_params("icarus"))
def test_fast_path_reports_a_hang(sim, monkeypatch):
    (_, inputs, settings), = bench_runs("dispatch")
    original = type(DISPATCH).fast

    def short(self, stimulus, settings):
        return dataclasses.replace(original(self, stimulus, settings), limit=5)

    monkeypatch.setattr(type(DISPATCH), "fast", short)
    with pytest.raises(SimulationError, match="dispatch did not finish within 5 cycles"):
        run(DISPATCH, inputs, settings, sim="fast-icarus")


@pytest.mark.parametrize("sim", simulator_params("icarus"))
def test_fast_path_writes_a_waveform(sim, tmp_path):
    (_, inputs, settings), = bench_runs("dispatch")
    outcome = run(DISPATCH, inputs, settings, sim="fast-icarus", trace=tmp_path / "run.fst")
    assert outcome.passed, outcome.problems
    assert (tmp_path / "run.fst").stat().st_size > 0


def test_units_without_a_fast_path_fall_back_to_cocotb():
    for unit in units().values():
        expected = "fast" if unit.has_fast else "verilator"
        assert unit.simulator("fast") == expected


def _fake_compiler(tmp_path, writes):
    """``(calls, script)``: a stand-in compiler that logs each command line to ``calls`` and
    runs ``writes`` (Python, with ``out`` the ``-o`` file) to make its output."""
    calls = tmp_path / "calls"
    compiler = tmp_path / "cxx.py"
    compiler.write_text(
        "import sys\n"
        f"open({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "out = sys.argv[sys.argv.index('-o') + 1]\n" + writes)
    return calls, compiler


def test_verilator_runtime_objects_are_compiled_once(tmp_path, monkeypatch):
    """The compiler wrapper behind Verilator's makefiles (moe_hw/flows/objcache.py): a runtime
    object (verilated.o) is compiled once per command line and copied afterwards, with its
    dependency file; a model's own object, and a runtime object that depends on a header of
    the model's directory, are compiled every time."""
    import subprocess
    import sys

    from moe_hw.flows import objcache

    calls, compiler = _fake_compiler(
        tmp_path,
        "open(out, 'w').write('object of ' + sys.argv[-1])\n"
        "extra = ' Vtop.h' if 'vpi' in sys.argv[-1] else ''\n"
        "open(out[:-2] + '.d', 'w').write(out + ': ' + sys.argv[-1] + extra)\n")
    source = tmp_path / "verilated.cpp"
    source.write_text("int x;\n")
    monkeypatch.setenv("MOE_HW_OBJCACHE_DIR", str(tmp_path / "cache"))

    def build(directory, out, source=source):
        directory.mkdir()
        monkeypatch.chdir(directory)
        args = [sys.executable, str(compiler), "-O0", "-c", "-o", out, str(source)]
        assert objcache.main(args) == 0
        return (directory / out).read_text(), (directory / out.replace(".o", ".d")).read_text()

    first = build(tmp_path / "a", "verilated.o")
    second = build(tmp_path / "b", "verilated.o")
    assert first == second == (f"object of {source}", f"verilated.o: {source}")
    assert len(calls.read_text().splitlines()) == 1          # the second was a copy
    build(tmp_path / "c", "Vtop.o")
    build(tmp_path / "d", "Vtop.o")
    assert len(calls.read_text().splitlines()) == 3          # model objects: always compiled
    # A runtime object whose dependencies name a header of the model's directory (as
    # cocotb's main includes Vtop.h) is compiled every time too.
    vpi = tmp_path / "verilated_vpi.cpp"
    vpi.write_text("int y;\n")
    build(tmp_path / "e", "verilated_vpi.o", vpi)
    build(tmp_path / "f", "verilated_vpi.o", vpi)
    assert len(calls.read_text().splitlines()) == 5
    # As make runs it: a script, not an import of moe_hw.
    done = subprocess.run([sys.executable, objcache.__file__, sys.executable, "-c", "pass"])
    assert done.returncode == 0


def hold_writes_to_one(monkeypatch, unit):
    """Patch ``unit``'s fast description so that its write port allows one write an element."""
    original = type(unit).fast

    def write_once(self, stimulus, settings):
        bench = original(self, stimulus, settings)
        streams = {**bench.streams,
                   "write": dataclasses.replace(bench.streams["write"], max_writes=1)}
        return dataclasses.replace(bench, streams=streams)

    monkeypatch.setattr(type(unit), "fast", write_once)


@pytest.mark.parametrize("sim", simulator_params("icarus"))
def test_fast_path_counts_writes_per_element(sim, monkeypatch):
    """The writer's counters: a clean dispatch writes every element of its valid pairs' rows
    once (reported in the outcome). Two pairs sent to one (expert, slot) write its row twice,
    which dispatch allows (the last one wins: the limit is the most pairs of one slot); held
    to one write per element, the run fails naming the element."""
    (_, inputs, settings), = bench_runs("dispatch")
    outcome = run(DISPATCH, inputs, settings, sim="fast-icarus")
    assert outcome.passed, outcome.problems
    counters = outcome.harness
    stimulus, bench = DISPATCH.pack(outcome.problem, outcome.params, stall=0.0, seed=0)
    rows = slot_rows(stimulus["index"], stimulus["location"], bench["num_experts"],
                     bench["capacity"])          # -1: the pair writes no row
    pairs = np.flatnonzero(rows >= 0)
    assert counters["write.written"] == len(pairs) * bench["hidden"] > 0
    assert (counters["write.most_writes"], counters["write.max_writes"],
            counters["write.rewrites"]) == (1, 1, 0)
    assert counters["header.sent"] == counters["header.words"] == bench["pairs"]
    assert any(line.startswith("harness: ") and "at most 1 writes to one (limit 1)" in line
               for line in outcome.report)
    first, second = pairs[:2]
    shared = {name: inputs[name].copy() for name in ("indices", "locations")}
    for name in shared:         # the inputs are [k, S]; the stimulus's pairs k-major
        shared[name].reshape(-1)[second] = shared[name].reshape(-1)[first]
    outcome = run(DISPATCH, {**inputs, **shared}, settings, sim="fast-icarus")
    assert outcome.passed, outcome.problems
    assert (outcome.harness["write.most_writes"], outcome.harness["write.max_writes"],
            outcome.harness["write.rewrites"]) == (2, 2, 0)
    hold_writes_to_one(monkeypatch, DISPATCH)
    element = rows[first] * bench["hidden"]
    with pytest.raises(SimulationError, match=f"dispatch wrote element {element} of the write "
                       "memory more than 1 time, the most its semantics allow"):
        run(DISPATCH, {**inputs, **shared}, settings, sim="fast-icarus")


@pytest.mark.parametrize("sim", simulator_params("icarus"))
def test_fast_path_write_limit_bites_and_keeps_a_waveform(sim, monkeypatch):
    """combine_scatter rewrites a token's row once per slot naming it (its limit is the most
    slots of one token); held to one write per element it fails, and the failure names the
    waveform of the failing run, which exists."""
    (unit, inputs, settings), *_ = bench_runs("combine_scatter")
    clean = run(unit, inputs, settings, sim="fast-icarus")
    assert clean.passed and clean.harness["write.most_writes"] == \
        clean.harness["write.max_writes"] > 1, clean.harness
    hold_writes_to_one(monkeypatch, unit)
    with pytest.raises(SimulationError, match="more than 1 time") as failure:
        run(unit, inputs, settings, sim="fast-icarus")
    waveform = str(failure.value).split("waveform of the failing run: ")[1]
    assert waveform.endswith(".fst") and Path(waveform).stat().st_size > 0


@pytest.mark.parametrize("sim", simulator_params("icarus"))
def test_a_mismatch_names_the_element_and_keeps_a_waveform(sim, monkeypatch):
    """A wrong element (one input bit flipped on its way into the hardware: every row of its
    token's pairs differs) fails the score with the first mismatching element (index, got and
    expected bits), the write log's first wrong lane, and the path of the waveform of the
    failing run, which exists."""
    (_, inputs, settings), = bench_runs("dispatch")
    original = type(DISPATCH).fast

    def flipped(self, stimulus, settings):
        stimulus = {**stimulus, "input": stimulus["input"].copy()}
        stimulus["input"][stimulus["row"][0], 0] ^= 1
        return original(self, stimulus, settings)

    monkeypatch.setattr(type(DISPATCH), "fast", flipped)
    outcome = run(DISPATCH, inputs, settings, sim="fast-icarus")
    assert not outcome.passed
    element = re.search(r"dispatch: 2 elements differ from golden; first at \[(\d+), (\d+)\]: "
                        r"got 0x([0-9a-f]+), want 0x([0-9a-f]+)", outcome.problems[0])
    row, column, got, want = (int(text, 0 if n < 2 else 16)
                              for n, text in enumerate(element.groups()))
    assert got != want and got == int(outcome.outputs["dispatch"].view(np.uint32)[row, column])
    lane = re.search(r"write log beat (\d+): data lane (\d+) got 0x([0-9a-f]+), expected "
                     r"0x([0-9a-f]+)", outcome.problems[1])
    beat, index, got, want = (int(text, 0 if n < 2 else 16) for n, text in enumerate(lane.groups()))
    assert got != want and got == int(outcome.results["data"][beat][index])
    waveform = outcome.problems[-1].split("waveform of the failing run: ")[1]
    assert waveform.endswith(".fst") and Path(waveform).stat().st_size > 0


def test_payload_words_move_whole_byte_fields_as_the_bit_by_bit_path_does():
    """Fields of 8, 16, 32 or 64-bit elements move between values and words as shifted byte
    views and strided reads (pack_words, unpack_field): every offset in the byte, scalar and
    array fields, zero words, give exactly the words and values of the bit-by-bit path
    (_put_bits, _get_bits)."""
    from moe_hw.flows import fastsim

    rng = np.random.default_rng(1)
    for _ in range(400):
        width = int(rng.choice([8, 16, 32, 64]))
        count = int(rng.integers(1, 5)) if rng.random() < 0.7 else None
        offset = int(rng.integers(0, 40))
        field = {"offset": offset, **({"array": {"count": count, "element": {"width": width}}}
                                      if count else {"width": width})}
        desc = {"width": offset + width * (count or 1) + int(rng.integers(0, 20)),
                "fields": {"a": field}}
        n = int(rng.integers(0, 7))
        values = rng.integers(0, 1 << 63, size=(n, count or 1), dtype=np.uint64) * 2 + 1
        if rng.random() < 0.5:                   # a field's rows need not be contiguous
            values = np.asfortranarray(values)
        words = fastsim.pack_words(desc, {"a": values if count else values[:, 0]}, "p")
        want = np.zeros_like(words)
        for e, (bit, w) in enumerate(fastsim._columns(offset, width, count)):
            fastsim._put_bits(want, bit, w, values[:, e])
        assert np.array_equal(words, want), (width, count, offset)
        padded = np.concatenate([words, np.zeros((n, -words.shape[1] % 4), np.uint8)], axis=1)
        got = fastsim.unpack_field(padded, desc, "a", "p")
        expected = np.stack([fastsim._get_bits(padded, bit, w) for bit, w in
                             fastsim._columns(offset, width, count)], axis=1) if n else \
            np.zeros((0, count or 1), np.uint64)
        expected = expected if count else expected[:, 0].astype(np.int64)
        assert got.dtype == expected.dtype and np.array_equal(got, expected), \
            (width, count, offset)


def test_memory_image_keeps_the_last_write_and_counts_lanes_outside():
    """The write log replayed into memory: an element written twice keeps the later write,
    disabled lanes write nothing, lanes past the memory are counted, not written."""
    from moe_hw.formats import FORMATS
    from moe_hw.host.dispatch import memory_image

    log = {"addr": np.array([0, 4, 2, 6]), "enable": np.array([0b1111, 0b0101, 0b0011, 0b1111]),
           "data": np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])}
    memory, outside = memory_image(log, 8, 4, FORMATS["fp32"])
    assert memory.tolist() == [1, 2, 9, 10, 5, 0, 13, 14] and outside == 2
    memory, outside = memory_image({key: value[:2] for key, value in log.items()}, 8, 4,
                                   FORMATS["fp32"])
    assert memory.tolist() == [1, 2, 3, 4, 5, 0, 7, 0] and outside == 0


def test_bits_equal_takes_any_nan_for_any_nan_and_tells_the_zeros_apart():
    """The comparison of every check: equal bits, or two NaNs of any payload; +0 != -0; mixed
    integer widths and shapes broadcast; a scalar gives a scalar answer."""
    from moe_hw.formats import FORMATS, bits_equal

    fp32, bf16 = FORMATS["fp32"], FORMATS["bf16"]
    got = np.array([[0x7fc00000, 0x7f800001, 0x00000000, 0x3f800000, 0x7f800000]], np.uint32)
    want = np.array([0xffc00001, 0x7fc00000, 0x80000000, 0x3f800000, 0x7f800001], np.uint64)
    assert bits_equal(got, want, fp32).tolist() == [[True, True, False, True, False]]
    assert bits_equal(np.uint16(0x7fc1), np.uint16(0xff81), bf16)
    assert not bits_equal(np.uint16(0x7f80), np.uint16(0xff80), bf16)
    assert bits_equal(np.int64(-1), np.uint64((1 << 64) - 1), fp32)
