"""Amaranth-simulator tests of the float adder (core and stream unit ``fadd``).

Results are compared bit for bit with NumPy / ml_dtypes (any NaN equals any NaN, +0 != -0).
The long random runs (100k pairs per format) are done on the emitted Verilog by the cocotb
bench; these tests keep to a few thousand pairs per format.
"""

import shutil
import subprocess

import numpy as np
import pytest
from amaranth.back import verilog

from moe_hw.arith.fadd import DEFAULT_ADDER_STAGES, FloatAdder, FloatAdderCore
from moe_hw.arith.vectors import (bits_equal, float_test_vectors, reference_add,
                                  simulate_core, simulate_core_verilog, simulate_stream,
                                  special_values)
from moe_hw.formats import FORMATS, from_bits, to_bits

FORMAT_NAMES = list(FORMATS)
DEEP = 8                        # a depth beyond the named register boundaries
RANDOM_PAIRS = 2000


def _describe_mismatches(a, b, got, expected, fmt, limit=8):
    lines = []
    for index in np.nonzero(~bits_equal(got, expected, fmt))[0][:limit]:
        x, y = from_bits(a[index:index + 1], fmt)[0], from_bits(b[index:index + 1], fmt)[0]
        lines.append(f"  #{index}: {int(a[index]):#x} + {int(b[index]):#x} ({x!r} + {y!r}): "
                     f"got {int(got[index]):#x}, expected {int(expected[index]):#x}")
    return "\n".join(lines)


def check_core(fmt, stages, a, b, **kwargs):
    got = simulate_core(FloatAdderCore(fmt, stages), a, b, output="sum", **kwargs)
    expected = reference_add(a, b, fmt)
    assert len(got) == len(expected)
    ok = bits_equal(got, expected, FORMATS[fmt])
    assert ok.all(), (f"{(~ok).sum()} of {len(a)} sums wrong ({fmt}, {stages} stages):\n"
                      + _describe_mismatches(a, b, got, expected, FORMATS[fmt]))


def random_pairs(fmt, count, seed):
    a, b = float_test_vectors(fmt, count, seed)
    skip = len(special_values(fmt)) ** 2
    return a[skip:], b[skip:]


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_reference_is_correctly_rounded(fmt):
    # float64 has more than twice the precision plus two bits of every format, so rounding
    # the float64 sum once more is the correctly rounded sum; NumPy's own must agree.
    a, b = float_test_vectors(fmt, 5000, seed=11)
    with np.errstate(all="ignore"):         # signalling NaNs raise "invalid" when cast
        x = from_bits(a, fmt).astype(np.float64)
        y = from_bits(b, fmt).astype(np.float64)
        exact = to_bits((x + y).astype(FORMATS[fmt].dtype), fmt)
    assert bits_equal(reference_add(a, b, fmt), exact, FORMATS[fmt]).all()


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_signed_zeros_and_infinities(fmt):
    # The IEEE rules spelled out, each checked against NumPy and against the stated answer.
    inf, nan = float("inf"), float("nan")
    cases = [               # a, b, a + b
        (0.0, -0.0, 0.0), (-0.0, 0.0, 0.0), (-0.0, -0.0, -0.0), (0.0, 0.0, 0.0),
        (1.5, -1.5, 0.0), (-1.5, 1.5, 0.0), (-1.0, 0.0, -1.0), (-0.0, 2.0, 2.0),
        (inf, -inf, nan), (-inf, inf, nan), (inf, inf, inf), (-inf, -inf, -inf),
        (-inf, 1.0, -inf), (3.0, inf, inf), (nan, 1.0, nan), (inf, nan, nan),
    ]
    a = to_bits(np.array([case[0] for case in cases]), fmt)
    b = to_bits(np.array([case[1] for case in cases]), fmt)
    stated = to_bits(np.array([case[2] for case in cases]), fmt)
    assert bits_equal(reference_add(a, b, fmt), stated, FORMATS[fmt]).all()
    check_core(fmt, None, a, b)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_special_pairs(fmt):
    a, b = float_test_vectors(fmt, 0, seed=0)
    check_core(fmt, None, a, b)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_random_pairs(fmt):
    a, b = random_pairs(fmt, RANDOM_PAIRS, seed=1)
    check_core(fmt, None, a, b)


@pytest.mark.parametrize("stages", [0, 1, 2, 3, 4, DEEP])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_pipeline_depths(fmt, stages):
    # Every depth, with en dropping at random so that each register's hold is exercised.
    specials = special_values(fmt)
    a, b = random_pairs(fmt, 300, seed=2 + stages)
    a = np.concatenate([specials, specials[::-1], a])
    b = np.concatenate([specials[::-1], specials, b])
    check_core(fmt, stages, a, b, enable_probability=0.7, seed=stages)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_stream_one_result_per_cycle(fmt):
    a, b = random_pairs(fmt, 200, seed=3)
    unit = FloatAdder(fmt)
    results, cycles = simulate_stream(unit, a, b, output="sum")
    assert bits_equal(results, reference_add(a, b, fmt), FORMATS[fmt]).all()
    assert cycles == list(range(unit.latency, unit.latency + len(a)))


@pytest.mark.parametrize("stages", [0, 1, None, DEEP])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_stream_random_stalls(fmt, stages):
    a, b = float_test_vectors(fmt, 400, seed=4)
    a, b = a[::7], b[::7]       # a spread of the special pairs plus random ones
    unit = FloatAdder(fmt, stages)
    results, _ = simulate_stream(unit, a, b, output="sum", valid_probability=0.6,
                                 ready_probability=0.5, seed=5)
    # The scoreboard: every result, in order, none lost or duplicated.
    assert len(results) == len(a)
    assert bits_equal(results, reference_add(a, b, fmt), FORMATS[fmt]).all()


def test_latency_and_defaults():
    for fmt, stages in DEFAULT_ADDER_STAGES.items():
        assert FloatAdderCore(fmt).latency == stages
        assert FloatAdder(fmt).latency == stages
    assert FloatAdderCore("fp16", 0).latency == 0
    assert FloatAdder("bf16", DEEP).latency == DEEP
    unit = FloatAdder("fp16", 2)
    assert unit.i.payload.shape().size == 32 and unit.o.payload.shape().size == 16


@pytest.mark.parametrize("cls", [FloatAdderCore, FloatAdder])
def test_parameter_validation(cls):
    with pytest.raises(ValueError, match=r"^Format must be one of fp32, fp16, bf16, not 'fp64'$"):
        cls("fp64", 2)
    with pytest.raises(ValueError, match=r"^Pipeline depth must be a non-negative integer, "
                                         r"not -1$"):
        cls("fp32", -1)
    with pytest.raises(TypeError, match=r"^Pipeline depth must be a non-negative integer, "
                                        r"not 1\.5$"):
        cls("fp32", 1.5)


@pytest.mark.parametrize("fmt,stages", [("fp32", 3), ("fp16", 0), ("bf16", DEEP)])
def test_verilog(tmp_path, fmt, stages):
    text = verilog.convert(FloatAdder(fmt, stages), name="fadd")
    assert "module fadd(" in text
    iverilog = shutil.which("iverilog")
    if iverilog is None:
        pytest.skip("Icarus Verilog (iverilog) is not installed; Verilog not compiled")
    (tmp_path / "fadd.v").write_text(text)
    subprocess.run([iverilog, "-g2012", "-o", str(tmp_path / "fadd.vvp"),
                    str(tmp_path / "fadd.v")], check=True, capture_output=True)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_verilog_random_100k(fmt):
    # The emitted Verilog at the default depth, in Icarus: every special pair and 100k random
    # ones, with en dropping at random.
    if shutil.which("iverilog") is None or shutil.which("vvp") is None:
        pytest.skip("Icarus Verilog (iverilog, vvp) is not installed; Verilog not simulated")
    a, b = float_test_vectors(fmt, 100_000, seed=30)
    got = simulate_core_verilog(FloatAdderCore(fmt), a, b, output="sum",
                                enable_probability=0.9, seed=31)
    expected = reference_add(a, b, fmt)
    assert len(got) == len(expected)
    ok = bits_equal(got, expected, FORMATS[fmt])
    assert ok.all(), (f"{(~ok).sum()} of {len(a)} sums wrong ({fmt}, Verilog):\n"
                      + _describe_mismatches(a, b, got, expected, FORMATS[fmt]))
