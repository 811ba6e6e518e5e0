"""The float multiplier: core and stream unit ``fmul`` in the Amaranth simulator, and the
emitted Verilog under cocotb (the shared cases are in ``float_block_cases.py``)."""

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import Fragment, Instance

from moe_hw.arith.ecp5_dsp import MULT18X18D_SIM
from moe_hw.arith.fmul import DEFAULT_MULTIPLIER_STAGES, FloatMultiplier, FloatMultiplierCore
from moe_hw.arith.vectors import (bits_equal, float_test_vectors, reference_mul,
                                  simulate_core_verilog)
from moe_hw.params import ParameterError
from moe_hw.formats import FORMATS, from_bits, to_bits
from moe_hw.host.fmul import UNIT
from moe_hw.host.unit import run

from conftest import STALLS, simulator_params
from float_block_cases import FORMAT_NAMES, FloatBlockCases


def test_process_keeps_subnormals():
    # The references run in this process: a flush-to-zero / denormals-are-zero mode set by
    # some native library would silently change them.
    assert np.float32(2.0 ** -126) * np.float32(0.5) == np.float32(2.0 ** -127)
    for fmt in FORMATS.values():
        smallest = from_bits(np.array([1]), fmt)
        assert smallest[0] != 0
        assert to_bits(smallest * np.array([1.0], dtype=fmt.dtype), fmt)[0] == 1



class TestFmul(FloatBlockCases):
    unit = UNIT
    core = FloatMultiplierCore
    stream = FloatMultiplier
    reference = staticmethod(reference_mul)
    symbol = "*"
    defaults = DEFAULT_MULTIPLIER_STAGES
    seed_base = 1
    depth_cases = (("fp32", 0), ("bf16", 1))

    def subnormal_cases(self, fmt):
        fmt = FORMATS[fmt]
        m, bias, sign = fmt.mant_bits, fmt.bias, 1 << (fmt.width - 1)
        one, half, quarter = bias << m, (bias - 1) << m, (bias - 2) << m
        min_normal, max_sub, top_sub_bit = 1 << m, (1 << m) - 1, 1 << (m - 1)
        return [
            (min_normal, half, top_sub_bit),                  # min normal * 0.5
            (min_normal | sign, half, top_sub_bit | sign),    # -min normal * 0.5
            (min_normal, quarter, top_sub_bit >> 1),          # min normal * 0.25
            (1, one, 1),                                      # min subnormal * 1
            (1 | sign, one | sign, 1),                        # -min subnormal * -1
            (max_sub, one, max_sub),                          # max subnormal * 1
            (3, half, 2),                                     # 1.5 ulp: tie to even -> 2 ulp
            (5, half, 2),                                     # 2.5 ulp: tie to even -> 2 ulp
            (7, half, 4),                                     # 3.5 ulp: tie to even -> 4 ulp
            (min_normal | 1, half, top_sub_bit),              # tie -> even (top bit only)
            (min_normal | 3, half, top_sub_bit | 2),          # tie -> even, rounds up
            ((1 << m) * 2, half, min_normal),                 # 2 min normal * 0.5: normal
        ]


def instance_types(fragment):
    """The cell types of the instances in ``fragment`` and its subfragments."""
    if isinstance(fragment, Instance):
        yield fragment.type
    for subfragment, *_ in fragment.subfragments:
        yield from instance_types(subfragment)


@pytest.mark.parametrize("stages", [0, 1, 4, 6, None, 16])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_ecp5_dsp_variant(fmt, stages):
    # MULT18X18D instances whose registers are pipeline registers, in Icarus with the
    # behavioural model, at depths where the DSP registers are off, partly and fully on.
    if simulate_core_verilog.unavailable():
        pytest.skip(simulate_core_verilog.unavailable())
    core = FloatMultiplierCore(fmt, stages, dsp="ecp5")
    assert "MULT18X18D" in instance_types(Fragment.get(core, None))     # elaborated, not emitted
    a, b = float_test_vectors(fmt, 1500, seed=20 + core.latency)
    got = simulate_core_verilog(FloatMultiplierCore(fmt, stages, dsp="ecp5"), a, b,
                                output="product", sources=[MULT18X18D_SIM],
                                enable_probability=0.7, seed=core.latency)
    want = reference_mul(a, b, fmt)
    assert len(got) == len(want)
    assert bits_equal(got, want, FORMATS[fmt]).all(), TestFmul().describe(a, b, got, want, fmt)


@pytest.mark.parametrize("cls", [FloatMultiplierCore, FloatMultiplier])
def test_dsp_choice(cls):
    with pytest.raises(ParameterError, match=r"^dsp must be generic or ecp5, not 'xilinx'$"):
        cls("fp32", dsp="xilinx")
    assert "MULT18X18D" in verilog.convert(cls("bf16", 2, dsp="ecp5"), name="fmul")
    assert "MULT18X18D" not in verilog.convert(cls("bf16", 2), name="fmul")


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim", simulator_params("verilator", "icarus"))
def test_ecp5_dsp_unit_on_the_simulators(sim, stall):
    # The fmul unit built with registered MULT18X18D blocks, through the same driver as
    # every unit: the DSP model is simulated with the emitted Verilog.
    a, b = float_test_vectors("fp32", 1500, seed=40)
    inputs = {"a": from_bits(a, "fp32"), "b": from_bits(b, "fp32")}
    outcome = run(UNIT, inputs, {"dsp": "ecp5"}, sim=sim, stall=stall, seed=41)
    assert outcome.passed, outcome.problems
    assert outcome.params.dsp == "ecp5"
