"""The dispatch unit on its emitted Verilog (every case on Verilator's fast path; a few
also through the cocotb bench in Verilator and Icarus), with and without random valid/ready
stalls, scored bit for bit against golden.dispatch_forward with a
scoreboard over the whole write log; plus generation-time parameter errors."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from moe_hw.arith.vectors import special_values
from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.formats import is_nan_bits
from moe_hw.golden.testing import random_floats
from moe_hw.problems import routed_locations
from moe_hw.host.checks import HostError
from moe_hw.host.dispatch import UNIT
from moe_hw.host.unit import run
from moe_hw.params import ParameterError
from moe_hw.run import from_npz
from moe_hw.units.dispatch import DispatchParams

from conftest import DISPATCH_MAXIMA, FAST_SIM, SIM, STALLS, simulator_cases

FP32_L4 = DispatchParams(format="fp32", lanes=4, **DISPATCH_MAXIMA)


def problem(seed, *, tokens, hidden, experts, capacity, k=1, dtype=np.float32, specials=0.0,
            index_range=None, location_range=None):
    """A random dispatch problem; locations from compute_locations unless ranges are given."""
    rng = np.random.default_rng(seed)
    if index_range is None:
        indices = rng.integers(0, max(experts, 1), (k, tokens))
    else:
        indices = rng.integers(*index_range, (k, tokens))
    locations = routed_locations(rng, indices, experts, location_range)
    gates = random_floats(rng, (k, tokens), dtype, specials=specials)
    data = random_floats(rng, (tokens, hidden), dtype, specials=specials)
    return dict(gates=gates, indices=indices, locations=locations, input=data,
                num_experts=experts, capacity=capacity)


def dispatch(prob, params=None, sim=SIM, stall=0.0, seed=0):
    """Run a problem dict (the golden model's arguments) through the emitted Verilog."""
    inputs = {name: prob[name] for name in UNIT.inputs}
    sizes = {name: prob[name] for name in UNIT.runtime}
    return run(UNIT, inputs, sizes, params=params, sim=sim, stall=stall, seed=seed)


def check(prob, params, sim, stall, seed=0):
    """Bit-exact, scoreboard clean (the driver also holds stall-free runs to the formula),
    and the formula itself checked here in its plain form."""
    outcome = dispatch(prob, params, sim, stall, seed)
    assert outcome.passed, "\n".join(outcome.problems)
    if stall == 0.0:
        pairs, hidden = prob["gates"].size, prob["input"].shape[1]
        if outcome.ideal_cycles:
            assert outcome.cycles == pairs * -(-hidden // params.lanes) + params.overhead
        else:
            assert outcome.cycles == EMPTY_CYCLES, "a zero-element problem must finish at once"
    return outcome


CASES = {
    # DUET toy scale: S=21, E=6, H=L=16, every token fits.
    "duet_toy": dict(tokens=21, hidden=16, experts=6, capacity=21),
    # top-2 with capacity drops; H not a multiple of the lanes.
    "random_k2_drops": dict(tokens=37, hidden=29, experts=5, capacity=9, k=2),
    # Out-of-range and negative indices and locations, including the extremes of the field.
    "out_of_range": dict(tokens=40, hidden=7, experts=6, capacity=5, k=2,
                         index_range=(-3, 9), location_range=(-2, 8)),
    # NaN, Inf, subnormals and -0.0 in gates and data.
    "special_values": dict(tokens=24, hidden=13, experts=4, capacity=8, specials=0.4),
    # Every pair into one slot: the last one must win.
    "shared_slot": dict(tokens=12, hidden=9, experts=3, capacity=2,
                        index_range=(1, 2), location_range=(1, 2)),
    # The three zero-element cases of seed 001, scaled down.
    "zero_tokens": dict(tokens=0, hidden=32, experts=2, capacity=8),
    "zero_hidden": dict(tokens=8, hidden=0, experts=2, capacity=8),
    "zero_capacity": dict(tokens=8, hidden=32, experts=2, capacity=0),
}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, case", simulator_cases(
    CASES, cocotb=["duet_toy", "out_of_range", "zero_tokens"]))
def test_dispatch_cases(sim, case, stall):
    check(problem(sorted(CASES).index(case), **CASES[case]), FP32_L4, sim, stall, seed=7)


def test_dispatch_field_extremes():
    prob = problem(3, tokens=10, hidden=6, experts=4, capacity=10)
    prob["indices"][0, :4] = [-(1 << 31), (1 << 31) - 1, 4, -1]
    prob["locations"][0, 4:8] = [(1 << 31) - 1, -(1 << 31), 10, -1]
    outcome = check(prob, FP32_L4, SIM, 0.0)
    assert outcome.outputs["dropped"] == 8


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("lanes", [1, 16])
def test_dispatch_lanes(lanes, stall):
    params = DispatchParams(format="fp32", lanes=lanes, **DISPATCH_MAXIMA)
    for seed, hidden in enumerate((1, 17, 64)):
        prob = problem(seed, tokens=19, hidden=hidden, experts=3, capacity=7, k=2)
        check(prob, params, SIM, stall, seed=seed)


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("fmt,dtype,lanes", [("fp16", np.float16, 4),
                                             ("bf16", ml_dtypes.bfloat16, 8)])
def test_dispatch_formats(fmt, dtype, lanes, stall):
    params = DispatchParams(format=fmt, lanes=lanes, **DISPATCH_MAXIMA)
    prob = problem(11, tokens=30, hidden=21, experts=4, capacity=6, k=2, dtype=dtype,
                   specials=0.3)
    check(prob, params, SIM, stall, seed=3)


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("fmt,dtype,lanes", [("fp32", np.float32, 4), ("fp16", np.float16, 8),
                                             ("bf16", ml_dtypes.bfloat16, 16)])
def test_dispatch_gate_one(fmt, dtype, lanes, stall):
    """``gate_one`` (moe_layer's postscore dispatch): the header's gates (random here) are not
    read, every element is ``1.0 * x`` as the multiplier gives it, a NaN its canonical quiet
    NaN, in ``mul_latency - 1`` fewer cycles than the multiplier's build."""
    params = DispatchParams(format=fmt, lanes=lanes, gate_one=True, **DISPATCH_MAXIMA)
    assert params.overhead == (DispatchParams(format=fmt, lanes=lanes).overhead -
                               params.mul_latency + 1)
    prob = problem(5, tokens=23, hidden=19, experts=4, capacity=7, k=2, dtype=dtype,
                   specials=0.4)
    # NaNs other than the canonical one: the special values' signalling and negative ones,
    # and a quiet NaN with a payload.
    specials = special_values(fmt)
    payload = params.fmt.quiet_nan | 5
    nans = [*(v for v in specials[is_nan_bits(specials, fmt)] if v != params.fmt.quiet_nan),
            payload]
    bits = prob["input"].view(f"u{prob['input'].itemsize}")
    for column, nan_bits in enumerate(nans):
        bits[column::len(nans), column] = nan_bits
    outcome = check(prob, params, SIM, stall, seed=2)
    got = outcome.outputs["dispatch"].view(f"u{outcome.outputs['dispatch'].itemsize}")
    nan = is_nan_bits(got, fmt)
    assert nan.any(), "the problem must carry NaNs"
    assert (got[nan] == params.fmt.quiet_nan).all()


def test_dispatch_runtime_errors():
    prob = problem(0, tokens=4, hidden=8, experts=2, capacity=4)
    with pytest.raises(HostError, match="hidden = 8 exceeds the unit's max_hidden of 4"):
        dispatch(prob, DispatchParams(max_hidden=4, max_pairs=8))
    with pytest.raises(HostError, match="gates has dtype float32"):
        dispatch(prob, DispatchParams(format="fp16"))
    with pytest.raises(HostError, match="the problem needs max_pairs >= 4, but max_pairs = 2"):
        run(UNIT, {name: prob[name] for name in UNIT.inputs},
            {"num_experts": 2, "capacity": 4, "max_pairs": 2})
    bad = dict(prob, indices=prob["indices"].copy())
    bad["indices"][0, 1] = 1 << 40
    with pytest.raises(HostError, match=r"indices.flat\[1\] = 1099511627776 does not fit"):
        dispatch(bad)
    with pytest.raises(ValueError, match="capacity must be a non-negative integer"):
        dispatch(dict(prob, capacity=-1))


@pytest.mark.parametrize("settings,message", [
    (dict(lanes=3), "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (dict(format="fp64"), "format must be fp32, fp16 or bf16, not 'fp64'"),
    (dict(max_pairs=0), "max_pairs must be an integer between 1 and"),
    (dict(max_experts=-2), "max_experts must be an integer between 1 and"),
    (dict(mul_stages="deep"), "mul_stages must be an integer, not 'deep'"),
    (dict(index_width=8, max_capacity=4096),
     r"index_width must hold max_capacity \(4096\) as a signed value, not 8"),
])
def test_dispatch_parameter_errors(settings, message):
    with pytest.raises(ParameterError, match=message):
        DispatchParams(**settings)


def test_old_parameter_names_are_aliases():
    with pytest.warns(DeprecationWarning, match="'max_tokens' is deprecated; it is now "
                                                "called 'max_pairs'"):
        params = UNIT.make_params({"max_tokens": 12})
    assert params.max_pairs == 12


@pytest.mark.parametrize("args,message", [
    (["--set", "lanes=3"], "lanes must be 1, 2, 4, 8 or 16, not 3"),
    (["--set", "format=fp64"], "format must be fp32, fp16 or bf16, not 'fp64'"),
    (["--set", "max_hidden=0"], "max_hidden must be an integer between 1 and"),
    (["--set", "lane=4"], "has no parameter 'lane'"),
])
def test_gen_parameter_errors_are_one_line(tmp_path, args, message):
    result = subprocess.run([sys.executable, "-m", "moe_hw.gen", "emit", "dispatch", "--out",
                             str(tmp_path), *args], capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_run_bad_input_file_is_one_line(tmp_path):
    bad = tmp_path / "x.npz"
    bad.write_text("not an npz")
    result = subprocess.run([sys.executable, "-m", "moe_hw.run", "dispatch", "--in", str(bad)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a readable .npz file" in lines[0], result.stderr


def test_run_reads_bfloat16_from_npz(tmp_path):
    """NumPy writes a bfloat16 array to an npz as 2-byte raw values; ``--in`` reads them as
    bfloat16 again (here through the bf16 multiplier), and ``from_npz`` restores an output."""
    a = np.array([1.5, -2.0, 3e-3, 7.0, 0.0, -0.0], dtype=ml_dtypes.bfloat16)
    b = np.array([2.0, 0.25, -1e30, 1e-30, 5.0, 3.0], dtype=ml_dtypes.bfloat16)
    np.savez(tmp_path / "in.npz", a=a, b=b)
    result = subprocess.run([sys.executable, "-m", "moe_hw.run", "fmul", "--in",
                             str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz"),
                             "--sim", FAST_SIM],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "bf16" in result.stdout and "bit-exact" in result.stdout, result.stdout
    with np.load(tmp_path / "out.npz") as npz:
        product = from_npz(npz["product"])
    assert product.dtype == ml_dtypes.bfloat16
    assert np.array_equal((a * b).view(np.uint16), product.view(np.uint16))
