"""The expand unit (OneFlow ``expand``, SPEC 1.6) on its emitted Verilog (cocotb,
Verilator, and Icarus on a few cases), every case with and without random valid/ready stalls
on both streams, scored bit for bit against ``golden.expand`` / ``golden.repeat`` with a
scoreboard over every output beat (nothing lost, duplicated or reordered; lane enables and
the last flag) and the input beats taken; stall-free runs must take exactly the documented
cycle count. The planner's odometers are checked against the golden addresses in Python;
bad sizes fail on the host naming the dim and its value; hostile sizes driven straight into
the bench raise the error flag and move nothing; bad parameters fail at generation time.
Three Verilator builds (fp32 at 4 lanes, bf16 at 8, int8 at 16) serve every simulated case."""

import ml_dtypes
import numpy as np
import pytest

from moe_hw import golden
from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.golden.expand import _addresses, _plan
from moe_hw.host.checks import HostError
from moe_hw.host.expand import UNIT, odometer_addresses, plan, random_elements, stimulus
from moe_hw.host.unit import run
from moe_hw.params import ParameterError
from moe_hw.units.expand import ExpandParams

from conftest import STALLS, simulator_cases

PARAMS = {
    "fp32": ExpandParams(format="fp32", lanes=4, max_rank=6, max_input=64, max_output=4096),
    "bf16": ExpandParams(format="bf16", lanes=8, max_rank=6, max_input=64, max_output=4096),
    "int8": ExpandParams(format="int8", lanes=16, max_rank=6, max_input=64, max_output=4096),
}
DTYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "int8": np.int8}


def check(unit, inputs, fmt, *, sim="verilator", stall=0.0, seed=0):
    """Run, require bit-exact with a clean scoreboard, and the exact stall-free count:
    ceil(n_in / lanes) load beats + ceil(n_out / lanes) output beats + the overhead."""
    params = PARAMS[fmt]
    outcome = run(unit, inputs, params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    n_in = outcome.problem["input_elements"]
    n_out = outcome.problem["output_elements"]
    if stall == 0.0:
        lanes = params.lanes
        want = (params.max_rank + lanes + -(-n_in // lanes) + -(-n_out // lanes)
                + params.tree_latency + 10 if n_out else EMPTY_CYCLES)
        assert outcome.cycles == outcome.expected_cycles == want
    return outcome


def random_expand(rng, rank, *, zeros=False, max_input=64, max_output=2000):
    """A random input shape and a valid expand_size of ``rank`` dims (some -1, some new
    dims, some broadcast size-1 dims; with ``zeros`` a 0-sized dim), at most ``max_input``
    input and ``max_output`` output elements."""
    while True:
        in_rank = int(rng.integers(0, rank + 1))
        shape = [int(rng.choice([1, 1, 2, 3, 4, 5])) for _ in range(in_rank)]
        if zeros and in_rank:
            shape[int(rng.integers(in_rank))] = 0
        sizes = [int(rng.integers(1, 4)) for _ in range(rank - in_rank)]
        for n in shape:
            if n == 1:
                sizes.append(int(rng.choice([1, -1, 2, 3, 5])))
            else:
                sizes.append(n if rng.random() < 0.5 else -1)
        output = np.prod([n if s == -1 else s for n, s in zip([1] * (rank - in_rank) + shape,
                                                               sizes)])
        if np.prod(shape) <= max_input and output <= max_output:
            return shape, sizes


def expand_case(shape, sizes, fmt, seed=0):
    rng = np.random.default_rng(seed)
    return {"input": random_elements(rng, shape, fmt), "expand_size": np.array(sizes, np.int64)}


CASES = {
    # seed 002: [4, 1, 3, 5] -> [2, 1, 4, 4, 3, 5], out_stride [0, 0, 15, 0, 5, 1]
    "seed_fp32": ("fp32", lambda: expand_case([4, 1, 3, 5], [2, 1, 4, 4, 3, 5],
                                                         "fp32")),
    "seed_int8": ("int8", lambda: expand_case([4, 1, 3, 5], [2, 1, 4, 4, 3, 5],
                                                         "int8")),
    # seed 002 example 2 with -1 for kept dims
    "seed_keep_bf16": ("bf16", lambda: expand_case([1, 4, 3, 5],
                                                              [2, 1, 2, -1, -1, 5], "bf16")),
    # an innermost broadcast: every beat repeats one element (a gate across H)
    "inner_broadcast_int8": ("int8", lambda: expand_case([6, 1], [6, 37], "int8")),
    "inner_broadcast_fp32": ("fp32", lambda: expand_case([9, 1], [9, 6], "fp32")),
    # kept runs shorter than the lanes: a beat gathers several runs
    "short_runs_int8": ("int8", lambda: expand_case([5, 3], [7, 5, 3], "int8")),
    "short_runs_bf16": ("bf16", lambda: expand_case([3, 1, 2], [4, 3, 5, 2],
                                                               "bf16")),
    # a broadcast of a whole row
    "row_broadcast_bf16": ("bf16", lambda: expand_case([1, 13], [11, 13], "bf16")),
    # 0-dim input, a one-element output and a broadcast scalar
    "scalar_fp32": ("fp32", lambda: expand_case([], [], "fp32")),
    "scalar_broadcast_int8": ("int8", lambda: expand_case([], [3, 1, 7], "int8")),
    # zero-sized dims: empty runs that finish
    "zero_kept_fp32": ("fp32", lambda: expand_case([0, 3], [2, 0, 3], "fp32")),
    "zero_keep_int8": ("int8", lambda: expand_case([3, 0], [2, 3, -1], "int8")),
    # random shapes up to rank 6 in every format, some with a 0-sized dim
    **{f"random{index}_{fmt}": (fmt, (lambda index=index, fmt=fmt: expand_case(
        *random_expand(np.random.default_rng(index), 6 - index % 3, zeros=index % 4 == 3),
        fmt, seed=index)))
       for index, fmt in enumerate(["fp32", "bf16", "int8"] * 3)},
}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize(("sim", "name"), simulator_cases(
    CASES, icarus=["seed_fp32", "zero_kept_fp32"]))
def test_expand_cases(sim, name, stall):
    fmt, make = CASES[name]
    inputs = make()
    index = sorted(CASES).index(name)
    outcome = check(UNIT, inputs, fmt, sim=sim, stall=stall, seed=index)
    want = golden.expand(inputs["input"], inputs["expand_size"])
    assert outcome.outputs["output"].shape == want.shape
    if name == "seed_fp32":
        assert outcome.problem["out_stride"] == [0, 0, 15, 0, 5, 1]


def test_expand_one_beat_per_cycle_on_chip():
    """A broadcast of a gate column to many lanes: the output phase runs at one beat per
    cycle; only the plan beats (6 dims + 16 lanes), the load beats and the fixed overhead
    come on top."""
    params = PARAMS["int8"]
    inputs = expand_case([48, 1], [48, 64], "int8")
    outcome = check(UNIT, inputs, "int8")
    assert outcome.ideal_cycles == 48 * 64 // 16
    assert outcome.cycles == outcome.ideal_cycles + 22 + 3 + params.overhead


def test_planner_matches_golden_addresses():
    """The lanes' odometers, stepped as the hardware steps them, give every output element's
    golden address, for every lane count and random shapes up to rank 6; every lane's address
    stays inside the input, past the end too."""
    rng = np.random.default_rng(7)
    for lanes in (1, 2, 4, 8, 16):
        params = ExpandParams(lanes=lanes, max_rank=6, max_input=4096, max_output=1 << 16)
        for _ in range(60):
            shape, sizes = random_expand(rng, int(rng.integers(0, 7)))
            output_shape, out_stride = _plan(shape, sizes)
            n = int(np.prod(output_shape))
            if n == 0:
                continue
            the_plan = plan(shape, sizes, params)
            addresses = odometer_addresses(the_plan, -(-n // lanes))
            assert (addresses.reshape(-1)[:n] == _addresses(output_shape, out_stride)).all()
            assert ((addresses >= 0) & (addresses < max(1, int(np.prod(shape))))).all()


def test_planner_seed_strides():
    the_plan = plan([4, 1, 3, 5], [2, 1, 4, 4, 3, 5], ExpandParams())
    assert the_plan.out_stride == [0, 0, 15, 0, 5, 1]
    # The size-1 dim dropped, the contiguous (3, 5) run merged, padded in front to rank 6;
    # 16 lanes are (1, 1) in the radix of the two inner dims (15, 4).
    assert the_plan.dims == [(1, 0), (1, 0), (2, 0), (4, 15), (4, 0), (15, 1)]
    assert the_plan.digits == [0, 0, 0, 0, 1, 1]


@pytest.mark.parametrize(("shape", "sizes", "message"), [
    ((4, 3), [-1, 4, 3], r"expand_size\[0\] is a new dim and must be >= 1, not -1"),
    ((3,), [0, 3], r"expand_size\[0\] is a new dim and must be >= 1, not 0"),
    ((4, 3), [4, 5], r"expand_size\[1\] must be 3 or -1 .* not 5"),
    ((4, 1), [0, 2], r"expand_size\[0\] must be 4 or -1 .* not 0"),
    ((4, 1), [4, -2], r"expand_size\[1\] must be >= 1 or -1 .* not -2"),
    ((2,), [1, 1, 1, 1, 1, 9, 2],
     r"expand_size\[6\] = 2 is past the unit's max_rank of 6"),
    ((2, 3), [2], r"expand_size must have at least as many dims as the input"),
])
def test_expand_bad_sizes(shape, sizes, message):
    """One clear error naming the dim and its value (SPEC 1.6), before anything is built."""
    inputs = {"input": np.zeros(shape, np.float32), "expand_size": np.array(sizes)}
    with pytest.raises(HostError, match=message):
        run(UNIT, inputs, params=PARAMS["fp32"])
    with pytest.raises(HostError, match=message):
        run(UNIT, inputs)          # sized to the problem: the same rules (max_rank 6)


@pytest.mark.parametrize(("inputs", "message"), [
    ({"input": np.zeros(3, np.float64), "expand_size": np.array([3])},
     r"input must have dtype float32, float16, bfloat16 or int8, not float64"),
    ({"input": np.zeros(3, np.float32), "expand_size": np.array([3.0])},
     r"expand_size must be a one-dimensional integer array"),
    ({"input": np.zeros(3, np.float32)}, r"lacks expand_size"),
    ({"input": np.zeros(100, np.float32), "expand_size": np.array([100])},
     r"input elements \(100\) exceed the unit's max_input of 64"),
    ({"input": np.zeros(3, np.int8), "expand_size": np.array([3])},
     r"input has dtype int8, but the unit's format is fp32"),
])
def test_expand_bad_inputs(inputs, message):
    with pytest.raises(HostError, match=message):
        run(UNIT, inputs, params=PARAMS["fp32"])


@pytest.mark.parametrize("size", ["input_elements", "output_elements"])
def test_expand_hostile_sizes(size):
    """A size above its maximum driven straight into the hardware: error, done after
    EMPTY_CYCLES, nothing taken, nothing out."""
    params = PARAMS["fp32"]
    problem = UNIT.problem(expand_case([3, 1], [3, 4], "fp32"), {})
    stim, settings = stimulus(problem, params, UNIT.plan(problem, params))
    settings["runtime"][size] = getattr(params, "max_" + size.split("_")[0]) + 1
    results = UNIT.simulate(params, stim, settings)
    assert int(results["error"]) == 1
    assert int(results["cycles"]) == EMPTY_CYCLES
    assert len(results["data"]) == 0 and int(results["input_taken"]) == 0
    assert int(results["plan_taken"]) == 0


@pytest.mark.parametrize(("changes", "message"), [
    ({"lanes": 3}, "lanes must be 1, 2, 4, 8 or 16, not 3"),
    ({"format": "fp64"}, "format must be fp32, fp16, bf16 or int8, not 'fp64'"),
    ({"max_rank": 0}, "max_rank must be an integer between 1 and 16, not 0"),
    ({"max_input": 0}, "max_input must be an integer between 1 and"),
    ({"max_output": "big"}, "max_output must be an integer, not 'big'"),
])
def test_expand_bad_params(changes, message):
    with pytest.raises(ParameterError, match=message):
        ExpandParams(**changes)


def test_expand_cycle_formula():
    """The documented formula: plan beats (max_rank + lanes) + load beats + output beats +
    overhead (13 at rank 6: run control 2, address tree 3, buffer read 3, lane select 1,
    queue 2, busy 1, done 1)."""
    params = ExpandParams()
    assert params.overhead == 13
    assert params.cycles(1024, 1024 * 512) == 22 + 64 + 32768 + 13
    assert params.cycles(5, 0) == EMPTY_CYCLES


def test_expand_bench_problems_on_chip_efficiency():
    """The benchmark's problems (python -m moe_hw.bench) plan on the on-chip path, and the
    exact cycle formula puts a [1024, 1] gate and a [1, 512] row broadcast to [1024, 512] at
    lanes 16 above 0.99 of a beat per cycle (the README's simulated figures)."""
    from moe_hw.host.unit import BenchShape
    for variant, (inputs, settings) in UNIT.bench_problems(BenchShape()).items():
        problem = UNIT.problem(inputs, {})
        params = UNIT.params_for(problem, settings)
        assert params.lanes == 16 and params.max_input >= problem["input_elements"]
        efficiency = UNIT.ideal_cycles(problem, params) / UNIT.cycles(problem, params)
        assert efficiency > 0.99, (variant, efficiency)


def test_expand_run_command(tmp_path):
    """``python -m moe_hw.run expand`` on an npz file (bfloat16, which an npz file stores as
    2-byte voids): the keys ``input`` and ``expand_size`` in, ``output`` and ``cycles`` out,
    bit-exact."""
    from moe_hw.run import main
    inputs = expand_case([3, 1, 2], [2, 3, 4, 2], "bf16", seed=3)
    np.savez(tmp_path / "in.npz", **inputs)
    params = PARAMS["bf16"]
    sets = [f"--set={name}={getattr(params, name)}"
            for name in ("format", "lanes", "max_rank", "max_input", "max_output")]
    assert main(["expand", "--in", str(tmp_path / "in.npz"), "--out",
                 str(tmp_path / "out.npz"), *sets]) == 0
    with np.load(tmp_path / "out.npz") as out:
        assert sorted(out.files) == ["cycles", "output"]
        want = golden.expand(inputs["input"], inputs["expand_size"])
        assert out["output"].shape == want.shape
        assert (out["output"].view(np.uint16) == want.view(np.uint16)).all()
        assert int(out["cycles"]) == params.cycles(6, 48)
