"""The float stream units ``fmul`` and ``fadd`` on their emitted Verilog (cocotb, Verilator and
Icarus), scored bit for bit against the NumPy references (any NaN equals any NaN, +0 != -0).

* 100k random pairs (plus every special/boundary pair) per unit and format, stall-free, at the
  default depth, with the exact cycle count ``count + latency``;
* subnormal results come out as the exact subnormal patterns (no flush to zero);
* random valid/ready stalls in Verilator and Icarus, and pipeline depths 0 and 1.

Every distinct (unit, format, depth) is one simulator build (cached under the build root).
"""

import numpy as np
import pytest

from moe_hw.arith.fadd import FloatAdder
from moe_hw.arith.fmul import FloatMultiplier
from moe_hw.arith.vectors import (bits_equal, float_test_vectors, reference_add, reference_mul,
                                  special_values)
from moe_hw.formats import FORMATS, from_bits, to_bits
from moe_hw.host.binop import run_binop

from conftest import STALLS, simulator_params

UNITS = {"fmul": (FloatMultiplier, reference_mul, "*"),
         "fadd": (FloatAdder, reference_add, "+")}
FORMAT_NAMES = list(FORMATS)
LONG_PAIRS = 100_000            # random pairs per unit and format, on top of the special pairs
STALL_PAIRS = 3_000


def seed_of(*keys):
    """A fixed, distinct seed per test case (stable across runs and Python versions)."""
    names = list(UNITS) + FORMAT_NAMES + ["verilator", "icarus"]
    return sum((names.index(k) + 1) * 10 ** i if isinstance(k, str) else k * 10 ** i
               for i, k in enumerate(keys))


def special_pairs(fmt):
    specials = special_values(fmt)
    return np.repeat(specials, len(specials)), np.tile(specials, len(specials))


def describe_mismatches(unit, a, b, got, want, fmt, limit=8):
    fmt = FORMATS[fmt]
    digits = fmt.width // 4
    op = UNITS[unit][2]
    wrong = np.nonzero(~bits_equal(got, want, fmt))[0]
    lines = [f"{len(wrong)} of {len(a)} {unit} results wrong ({fmt}); first (a, b, got, want):"]
    for i in wrong[:limit]:
        x, y = from_bits(a[i:i + 1], fmt)[0], from_bits(b[i:i + 1], fmt)[0]
        lines.append(f"  #{i}: ({int(a[i]):#0{digits + 2}x}, {int(b[i]):#0{digits + 2}x}, "
                     f"{int(got[i]):#0{digits + 2}x}, {int(want[i]):#0{digits + 2}x})"
                     f"   [{x!r} {op} {y!r}]")
    return "\n".join(lines)


def check(unit, fmt, a, b, *, stages=None, sim="verilator", stall=0.0, seed=0):
    """Run the pairs (bit patterns) through the unit's Verilog; check the results bit for bit
    and the cycle count (exactly ``count + latency`` stall-free, no less with stalls)."""
    cls, reference, _ = UNITS[unit]
    result, cycles = run_binop(unit, from_bits(a, fmt), from_bits(b, fmt), stages=stages,
                               sim=sim, stall=stall, seed=seed)
    got, want = to_bits(result, fmt), reference(a, b, fmt)
    assert got.shape == want.shape
    assert bits_equal(got, want, fmt).all(), describe_mismatches(unit, a, b, got, want, fmt)
    latency = cls(fmt, stages).latency
    if stall == 0.0:
        assert cycles == len(a) + latency, \
            f"{cycles} cycles for {len(a)} pairs, expected {len(a)} + latency {latency}"
    else:
        assert cycles >= len(a) + latency, f"{cycles} cycles for {len(a)} pairs is too few"
    return got


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("unit", list(UNITS))
def test_random_100k(unit, fmt):
    a, b = float_test_vectors(fmt, LONG_PAIRS, seed_of(unit, fmt))
    assert len(a) >= LONG_PAIRS + len(special_values(fmt)) ** 2
    check(unit, fmt, a, b)


def subnormal_cases(unit, fmt):
    """(a, b, exact result) bit patterns whose results are subnormal (or the rounding edge
    between subnormals), written out by hand."""
    fmt = FORMATS[fmt]
    m, bias, sign = fmt.mant_bits, fmt.bias, 1 << (fmt.width - 1)
    one, half, quarter = bias << m, (bias - 1) << m, (bias - 2) << m
    min_normal, max_sub, top_sub_bit = 1 << m, (1 << m) - 1, 1 << (m - 1)
    if unit == "fmul":
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
    return [
        (1, 1, 2),                                            # min sub + min sub
        (1 | sign, 1 | sign, 2 | sign),                       # -min sub + -min sub
        (max_sub, 1, min_normal),                             # carries into the normals
        (min_normal, 1 | sign, max_sub),                      # min normal - min sub
        (min_normal | 1, min_normal | sign, 1),               # cancellation to min sub
        (min_normal, max_sub | sign, 1),                      # min normal - max sub
        (1, 0 | sign, 1),                                     # min sub + -0
        (1 | sign, 0, 1 | sign),                              # -min sub + 0
        (top_sub_bit, top_sub_bit, min_normal),               # two halves make min normal
        (3, 5 | sign, 2 | sign),                              # 3 ulp - 5 ulp
    ]


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("unit", list(UNITS))
def test_no_flush_to_zero(unit, fmt):
    cases = subnormal_cases(unit, fmt)
    dtype = FORMATS[fmt].uint_dtype
    a, b, want = (np.array(column, dtype=dtype) for column in zip(*cases))
    # The hand-written results agree with NumPy (so this process does not flush either).
    reference = UNITS[unit][1]
    assert (reference(a, b, fmt) == want).all(), describe_mismatches(
        unit, a, b, reference(a, b, fmt), want, fmt)
    got = check(unit, fmt, a, b)
    assert (got == want).all(), describe_mismatches(unit, a, b, got, want, fmt)


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("unit", list(UNITS))
@pytest.mark.parametrize("sim", simulator_params("verilator", "icarus"))
def test_stalls(sim, unit, fmt, stall):
    if sim == "verilator":          # special pairs and 3k random ones
        a, b = float_test_vectors(fmt, STALL_PAIRS, seed_of(unit, fmt, sim))
    else:                           # Icarus is slow: the special pairs only
        a, b = special_pairs(fmt)
    check(unit, fmt, a, b, sim=sim, stall=stall, seed=seed_of(fmt, unit, sim))


# Non-default depths, each format once: latency 0 (combinational) and 1.
DEPTHS = [("fmul", "fp32", 0), ("fmul", "bf16", 1), ("fadd", "fp16", 0), ("fadd", "fp32", 1)]


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("unit,fmt,stages", [pytest.param(*d, id=f"{d[0]}-{d[1]}-depth{d[2]}")
                                             for d in DEPTHS])
def test_depths(unit, fmt, stages, stall):
    assert UNITS[unit][0](fmt, stages).latency == stages
    a, b = float_test_vectors(fmt, STALL_PAIRS, seed_of(unit, fmt, stages + 1))
    check(unit, fmt, a, b, stages=stages, stall=stall, seed=seed_of(fmt, unit, stages + 1))
