"""Amaranth-simulator tests of the float multiplier (core and stream unit ``fmul``).

Results are compared bit for bit with NumPy / ml_dtypes (any NaN equals any NaN, +0 != -0).
The long random runs (100k pairs per format) are done on the emitted Verilog by the cocotb
bench; these tests keep to a few thousand pairs per format.
"""

import shutil
import subprocess

import numpy as np
import pytest
from amaranth.back import verilog

from moe_hw.arith.fmul import DEFAULT_MULTIPLIER_STAGES, FloatMultiplier, FloatMultiplierCore
from moe_hw.arith.ecp5_dsp import MULT18X18D_SIM
from moe_hw.arith.vectors import (bits_equal, float_test_vectors, reference_mul,
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
        lines.append(f"  #{index}: {int(a[index]):#x} * {int(b[index]):#x} ({x!r} * {y!r}): "
                     f"got {int(got[index]):#x}, expected {int(expected[index]):#x}")
    return "\n".join(lines)


def check_core(fmt, stages, a, b, **kwargs):
    got = simulate_core(FloatMultiplierCore(fmt, stages), a, b, output="product", **kwargs)
    expected = reference_mul(a, b, fmt)
    assert len(got) == len(expected)
    ok = bits_equal(got, expected, FORMATS[fmt])
    assert ok.all(), (f"{(~ok).sum()} of {len(a)} products wrong ({fmt}, {stages} stages):\n"
                      + _describe_mismatches(a, b, got, expected, FORMATS[fmt]))


def random_pairs(fmt, count, seed):
    a, b = float_test_vectors(fmt, count, seed)
    skip = len(special_values(fmt)) ** 2
    return a[skip:], b[skip:]


def test_process_keeps_subnormals():
    # The references run in this process: a flush-to-zero / denormals-are-zero mode set by
    # some native library would silently change them.
    assert np.float32(2.0 ** -126) * np.float32(0.5) == np.float32(2.0 ** -127)
    for fmt in FORMATS.values():
        smallest = from_bits(np.array([1]), fmt)
        assert smallest[0] != 0
        assert to_bits(smallest * np.array([1.0], dtype=fmt.dtype), fmt)[0] == 1


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_reference_is_correctly_rounded(fmt):
    # The product of two operands is exact in float64, so rounding it once to the format is
    # the correctly rounded result; NumPy's native arithmetic must agree.
    a, b = float_test_vectors(fmt, 5000, seed=11)
    with np.errstate(all="ignore"):         # signalling NaNs raise "invalid" when cast
        x = from_bits(a, fmt).astype(np.float64)
        y = from_bits(b, fmt).astype(np.float64)
        exact = to_bits((x * y).astype(FORMATS[fmt].dtype), fmt)
    assert bits_equal(reference_mul(a, b, fmt), exact, FORMATS[fmt]).all()


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
    unit = FloatMultiplier(fmt)
    results, cycles = simulate_stream(unit, a, b, output="product")
    assert bits_equal(results, reference_mul(a, b, fmt), FORMATS[fmt]).all()
    assert cycles == list(range(unit.latency, unit.latency + len(a)))


@pytest.mark.parametrize("stages", [0, 1, None, DEEP])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_stream_random_stalls(fmt, stages):
    a, b = float_test_vectors(fmt, 400, seed=4)
    a, b = a[::7], b[::7]       # a spread of the special pairs plus random ones
    unit = FloatMultiplier(fmt, stages)
    results, _ = simulate_stream(unit, a, b, output="product", valid_probability=0.6,
                                 ready_probability=0.5, seed=5)
    # The scoreboard: every result, in order, none lost or duplicated.
    assert len(results) == len(a)
    assert bits_equal(results, reference_mul(a, b, fmt), FORMATS[fmt]).all()


def test_latency_and_defaults():
    for fmt, stages in DEFAULT_MULTIPLIER_STAGES.items():
        assert FloatMultiplierCore(fmt).latency == stages
        assert FloatMultiplier(fmt).latency == stages
    assert FloatMultiplierCore("fp16", 0).latency == 0
    assert FloatMultiplier("bf16", DEEP).latency == DEEP
    unit = FloatMultiplier("fp16", 2)
    assert unit.i.payload.shape().size == 32 and unit.o.payload.shape().size == 16


@pytest.mark.parametrize("cls", [FloatMultiplierCore, FloatMultiplier])
def test_parameter_validation(cls):
    with pytest.raises(ValueError, match=r"^Format must be one of fp32, fp16, bf16, not 'fp64'$"):
        cls("fp64", 2)
    with pytest.raises(ValueError, match=r"^Pipeline depth must be a non-negative integer, "
                                         r"not -1$"):
        cls("fp32", -1)
    with pytest.raises(TypeError, match=r"^Pipeline depth must be a non-negative integer, "
                                        r"not 1\.5$"):
        cls("fp32", 1.5)
    with pytest.raises(TypeError, match=r"^Pipeline depth must be a non-negative integer, "
                                        r"not '3'$"):
        cls("fp32", "3")


@pytest.mark.parametrize("fmt,stages", [("fp32", 3), ("fp16", 0), ("bf16", DEEP)])
def test_verilog(tmp_path, fmt, stages):
    text = verilog.convert(FloatMultiplier(fmt, stages), name="fmul")
    assert "module fmul(" in text
    iverilog = shutil.which("iverilog")
    if iverilog is None:
        pytest.skip("Icarus Verilog (iverilog) is not installed; Verilog not compiled")
    (tmp_path / "fmul.v").write_text(text)
    subprocess.run([iverilog, "-g2012", "-o", str(tmp_path / "fmul.vvp"),
                    str(tmp_path / "fmul.v")], check=True, capture_output=True)


def check_core_verilog(fmt, stages, a, b, **kwargs):
    if shutil.which("iverilog") is None or shutil.which("vvp") is None:
        pytest.skip("Icarus Verilog (iverilog, vvp) is not installed; Verilog not simulated")
    core = FloatMultiplierCore(fmt, stages, **kwargs.pop("core", {}))
    got = simulate_core_verilog(core, a, b, output="product", **kwargs)
    expected = reference_mul(a, b, fmt)
    assert len(got) == len(expected)
    ok = bits_equal(got, expected, FORMATS[fmt])
    assert ok.all(), (f"{(~ok).sum()} of {len(a)} products wrong ({fmt}, {core.latency} "
                      f"stages, dsp={core.dsp}, Verilog):\n"
                      + _describe_mismatches(a, b, got, expected, FORMATS[fmt]))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_verilog_random_100k(fmt):
    # The emitted Verilog at the default depth: every special pair and 100k random ones.
    a, b = float_test_vectors(fmt, 100_000, seed=30)
    check_core_verilog(fmt, None, a, b, enable_probability=0.9, seed=31)


@pytest.mark.parametrize("stages", [0, 1, 3, 4, 6, None, 16])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_ecp5_dsp_variant(fmt, stages):
    # MULT18X18D instances with their registers as pipeline registers, in Icarus with the
    # behavioural model, at depths where the DSP registers are off, partly and fully on.
    core = FloatMultiplierCore(fmt, stages, dsp="ecp5")
    assert "MULT18X18D" in verilog.convert(core, name="fmul_core")
    a, b = float_test_vectors(fmt, 1500, seed=20 + core.latency)
    check_core_verilog(fmt, stages, a, b, core={"dsp": "ecp5"}, sources=[MULT18X18D_SIM],
                       enable_probability=0.7, seed=core.latency)


@pytest.mark.parametrize("cls", [FloatMultiplierCore, FloatMultiplier])
def test_dsp_validation(cls):
    with pytest.raises(ValueError, match=r"^DSP target must be one of generic, ecp5, "
                                         r"not 'xilinx'$"):
        cls("fp32", dsp="xilinx")
    assert "MULT18X18D" in verilog.convert(cls("bf16", 2, dsp="ecp5"), name="fmul")
    assert "MULT18X18D" not in verilog.convert(cls("bf16", 2), name="fmul")
