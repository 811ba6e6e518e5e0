"""The tests the two float blocks share, written once: ``tests/test_fmul.py`` and
``tests/test_fadd.py`` each subclass :class:`FloatBlockCases` with their block, their NumPy
reference and their own extra cases.

Amaranth-simulator tests of the pipeline core and the stream unit (a few thousand pairs per
format), and tests of the emitted Verilog: on Verilator's fast path 100k random pairs plus
every special pair per format with the exact cycle count ``count + latency``, hand-written
subnormal results (no flush to zero) and depths 0 and 1; random valid/ready stalls on the fast
path and through the cocotb bench (Icarus every format, Verilator fp32).
Results are compared bit for bit (any NaN equals any NaN, +0 != -0).
"""

import shutil
import subprocess

import numpy as np
import pytest
from amaranth.back import verilog

from moe_hw.arith.vectors import (bits_equal, float_test_vectors, simulate_core,
                                  simulate_stream, special_values)
from moe_hw.formats import FORMATS, from_bits, to_bits
from moe_hw.host.unit import run
from moe_hw.params import ParameterError

from conftest import SIM, STALLS, simulator_params

FORMAT_NAMES = list(FORMATS)
DEEP = 8                        # a depth beyond the named register boundaries
RANDOM_PAIRS = 2000             # Amaranth simulator
LONG_PAIRS = 100_000            # emitted Verilog, per format, on top of the special pairs
STALL_PAIRS = 3_000
# The stalled runs: every format on the fast path (the models test_random_100k builds), in
# Icarus through the cocotb bench; the cocotb bench in Verilator on one format (one model).
STALL_RUNS = [pytest.param(SIM, fmt, id=f"{SIM}-{fmt}") for fmt in FORMAT_NAMES] + \
    [pytest.param(*param.values, "fp32", marks=param.marks, id=f"{param.id}-fp32")
     for param in simulator_params("verilator")] + \
    [pytest.param(*param.values, fmt, marks=param.marks, id=f"{param.id}-{fmt}")
     for param in simulator_params("icarus") for fmt in FORMAT_NAMES]


def random_pairs(fmt, count, seed):
    a, b = float_test_vectors(fmt, count, seed)
    skip = len(special_values(fmt)) ** 2
    return a[skip:], b[skip:]


def special_pairs(fmt):
    specials = special_values(fmt)
    return np.repeat(specials, len(specials)), np.tile(specials, len(specials))


class FloatBlockCases:
    """Subclasses set: ``unit`` (the declaration), ``core`` and ``stream`` (the classes),
    ``reference`` (bits, bits, fmt -> bits), ``symbol``, ``defaults`` (depth per format),
    ``seed_base`` and ``subnormal_cases(fmt)``."""

    unit = core = stream = reference = None
    symbol = "?"
    defaults = {}
    seed_base = 0

    # ---- helpers -------------------------------------------------------------------------
    def describe(self, a, b, got, want, fmt, limit=8):
        fmt = FORMATS[fmt]
        digits = fmt.width // 4 + 2
        wrong = np.nonzero(~bits_equal(got, want, fmt))[0]
        lines = [f"{len(wrong)} of {len(a)} {self.unit.name} results wrong ({fmt}); first "
                 "(a, b, got, want):"]
        for i in wrong[:limit]:
            x, y = from_bits(a[i:i + 1], fmt)[0], from_bits(b[i:i + 1], fmt)[0]
            lines.append(f"  #{i}: ({int(a[i]):#0{digits}x}, {int(b[i]):#0{digits}x}, "
                         f"{int(got[i]):#0{digits}x}, {int(want[i]):#0{digits}x})   "
                         f"[{x!r} {self.symbol} {y!r}]")
        return "\n".join(lines)

    def check_core(self, fmt, stages, a, b, **kwargs):
        got = simulate_core(self.core(fmt, stages), a, b, output=self.unit.result, **kwargs)
        want = self.reference(a, b, fmt)
        assert len(got) == len(want)
        assert bits_equal(got, want, FORMATS[fmt]).all(), self.describe(a, b, got, want, fmt)

    def check_verilog(self, fmt, a, b, *, stages=None, sim=SIM, stall=0.0, seed=0):
        """The pairs (bit patterns) through the emitted Verilog: bit for bit, and exactly
        ``count + latency`` cycles stall-free (no fewer with stalls)."""
        inputs = {"a": from_bits(a, fmt), "b": from_bits(b, fmt)}
        outcome = run(self.unit, inputs, {self.unit.stages_name: stages}, sim=sim,
                      stall=stall, seed=seed, check=False)
        got, want = to_bits(outcome.outputs[self.unit.result], fmt), self.reference(a, b, fmt)
        assert got.shape == want.shape
        assert bits_equal(got, want, fmt).all(), self.describe(a, b, got, want, fmt)
        latency = self.unit.latency(outcome.params)
        if stall == 0.0:
            assert outcome.cycles == len(a) + latency == self.unit.cycles(
                outcome.problem, outcome.params)
        else:
            assert outcome.cycles >= len(a) + latency
        return got

    def seed(self, *keys):
        """A fixed, distinct seed per case."""
        names = FORMAT_NAMES + ["verilator", "icarus"]
        return self.seed_base + sum((names.index(k) + 1 if isinstance(k, str) else k) * 10 ** i
                                    for i, k in enumerate(keys))

    # ---- the reference ---------------------------------------------------------------------
    @pytest.mark.parametrize("fmt", FORMAT_NAMES)
    def test_reference_is_correctly_rounded(self, fmt):
        # float64 holds a product exactly, and a sum to more than twice the precision plus
        # two bits of every format: rounding it once to the format is the correctly rounded
        # result, and NumPy's native arithmetic must agree.
        a, b = float_test_vectors(fmt, 5000, seed=11)
        with np.errstate(all="ignore"):     # signalling NaNs raise "invalid" when cast
            x = from_bits(a, fmt).astype(np.float64)
            y = from_bits(b, fmt).astype(np.float64)
            exact = to_bits(self.unit.numpy(x, y).astype(FORMATS[fmt].dtype), fmt)
        assert bits_equal(self.reference(a, b, fmt), exact, FORMATS[fmt]).all()

    # ---- Amaranth simulator ------------------------------------------------------------------
    @pytest.mark.parametrize("fmt", FORMAT_NAMES)
    def test_special_pairs(self, fmt):
        a, b = float_test_vectors(fmt, 0, seed=0)
        self.check_core(fmt, None, a, b)

    @pytest.mark.parametrize("fmt", FORMAT_NAMES)
    def test_random_pairs(self, fmt):
        a, b = random_pairs(fmt, RANDOM_PAIRS, seed=1)
        self.check_core(fmt, None, a, b)

    @pytest.mark.parametrize("stages", [0, 1, 2, 3, 4, DEEP])
    @pytest.mark.parametrize("fmt", FORMAT_NAMES)
    def test_pipeline_depths(self, fmt, stages):
        # Every depth, with en dropping at random so that each register's hold is exercised.
        specials = special_values(fmt)
        a, b = random_pairs(fmt, 300, seed=2 + stages)
        a = np.concatenate([specials, specials[::-1], a])
        b = np.concatenate([specials[::-1], specials, b])
        self.check_core(fmt, stages, a, b, enable_probability=0.7, seed=stages)

    @pytest.mark.parametrize("fmt", FORMAT_NAMES)
    def test_stream_one_result_per_cycle(self, fmt):
        a, b = random_pairs(fmt, 200, seed=3)
        block = self.stream(fmt)
        results, cycles = simulate_stream(block, a, b, output=self.unit.result)
        assert bits_equal(results, self.reference(a, b, fmt), FORMATS[fmt]).all()
        assert cycles == list(range(block.latency, block.latency + len(a)))

    @pytest.mark.parametrize("stages", [0, 1, None, DEEP])
    @pytest.mark.parametrize("fmt", FORMAT_NAMES)
    def test_stream_random_stalls(self, fmt, stages):
        a, b = float_test_vectors(fmt, 400, seed=4)
        a, b = a[::7], b[::7]       # a spread of the special pairs plus random ones
        results, _ = simulate_stream(self.stream(fmt, stages), a, b, output=self.unit.result,
                                     valid_probability=0.6, ready_probability=0.5, seed=5)
        # The scoreboard: every result, in order, none lost or duplicated.
        assert len(results) == len(a)
        assert bits_equal(results, self.reference(a, b, fmt), FORMATS[fmt]).all()

    def test_latency_and_defaults(self):
        for fmt, stages in self.defaults.items():
            params = self.unit.make_params({"format": fmt})
            assert self.unit.latency(params) == stages
        params = self.unit.make_params({"format": "bf16", self.unit.stages_name: DEEP})
        assert self.unit.latency(params) == DEEP

    @pytest.mark.parametrize("which", ["core", "stream"])
    def test_parameter_validation(self, which):
        cls = getattr(self, which)
        name = self.unit.stages_name
        with pytest.raises(ParameterError, match=r"^format must be fp32, fp16 or bf16, "
                                                 r"not 'fp64'$"):
            cls("fp64", 2)
        with pytest.raises(ParameterError, match=rf"^{name} must be an integer between 0 and "
                                                 r"16, not -1$"):
            cls("fp32", -1)
        for bad in ("1.5", "'3'"):
            with pytest.raises(ParameterError, match=rf"^{name} must be an integer, not "
                                                     rf"{bad}$"):
                cls("fp32", eval(bad))

    def test_old_parameter_name_is_an_alias(self):
        with pytest.warns(DeprecationWarning, match=rf"'stages' is deprecated; it is now "
                                                    rf"called '{self.unit.stages_name}'"):
            params = self.unit.make_params({"stages": 2})
        assert getattr(params, self.unit.stages_name) == 2

    @pytest.mark.parametrize("fmt,stages", [("fp32", 3), ("fp16", 0), ("bf16", DEEP)])
    def test_verilog_compiles(self, tmp_path, fmt, stages):
        text = verilog.convert(self.stream(fmt, stages), name=self.unit.name)
        assert f"module {self.unit.name}(" in text
        iverilog = shutil.which("iverilog")
        if iverilog is None:
            pytest.skip("Icarus Verilog (iverilog) is not installed; Verilog not compiled")
        (tmp_path / "unit.v").write_text(text)
        subprocess.run([iverilog, "-g2012", "-o", str(tmp_path / "unit.vvp"),
                        str(tmp_path / "unit.v")], check=True, capture_output=True)

    # ---- the emitted Verilog (cocotb) --------------------------------------------------------
    @pytest.mark.parametrize("fmt", FORMAT_NAMES)
    def test_random_100k(self, fmt):
        # On the fast path (Verilator, the pairs loaded into the simulator): 0.3 s a run
        # against 14 s through the cocotb bench, which the stall cases below run on.
        a, b = float_test_vectors(fmt, LONG_PAIRS, self.seed(fmt))
        assert len(a) >= LONG_PAIRS + len(special_values(fmt)) ** 2
        self.check_verilog(fmt, a, b, sim="fast")

    @pytest.mark.parametrize("fmt", FORMAT_NAMES)
    def test_no_flush_to_zero(self, fmt):
        dtype = FORMATS[fmt].uint_dtype
        a, b, want = (np.array(column, dtype=dtype)
                      for column in zip(*self.subnormal_cases(fmt)))
        # The hand-written results agree with NumPy (so this process does not flush either).
        assert (self.reference(a, b, fmt) == want).all(), self.describe(
            a, b, self.reference(a, b, fmt), want, fmt)
        got = self.check_verilog(fmt, a, b)
        assert (got == want).all(), self.describe(a, b, got, want, fmt)

    @pytest.mark.parametrize("stall", STALLS)
    @pytest.mark.parametrize("sim, fmt", STALL_RUNS)
    def test_stalls(self, sim, fmt, stall):
        if sim != "icarus":             # special pairs and 3k random ones
            a, b = float_test_vectors(fmt, STALL_PAIRS, self.seed(fmt, "verilator"))
        else:                           # Icarus is slow: the special pairs only
            a, b = special_pairs(fmt)
        self.check_verilog(fmt, a, b, sim=sim, stall=stall,
                           seed=self.seed("verilator" if sim == SIM else sim, fmt))

    @pytest.mark.parametrize("stall", STALLS)
    @pytest.mark.parametrize("case", [0, 1], ids=["first-depth", "second-depth"])
    def test_depths(self, case, stall):
        # Non-default depths on the Verilog: latency 0 (combinational) and 1.
        fmt, stages = self.depth_cases[case]
        a, b = float_test_vectors(fmt, STALL_PAIRS, self.seed(fmt, stages + 1))
        self.check_verilog(fmt, a, b, stages=stages, stall=stall,
                           seed=self.seed(stages + 1, fmt))

    depth_cases = ()

    def subnormal_cases(self, fmt):
        """(a, b, exact result) bit patterns whose results are subnormal (or the rounding
        edge between subnormals), written out by hand."""
        raise NotImplementedError
