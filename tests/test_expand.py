"""The expand unit (OneFlow ``expand``, SPEC 1.6) on its emitted Verilog (every case
on Verilator's fast path; a few also through the cocotb bench in Verilator and Icarus), with
and without random valid/ready stalls
on both streams, scored bit for bit against ``golden.expand`` / ``golden.repeat`` with a
scoreboard over every output beat (nothing lost, duplicated or reordered; lane enables and
the last flag) and the input beats taken; stall-free runs must take exactly the documented
cycle count. The planner's odometers are checked against the golden addresses in Python;
bad sizes fail on the host naming the dim and its value; hostile sizes driven straight into
the bench raise the error flag and move nothing; bad parameters fail at generation time.
Three designs (fp32 at 4 lanes, bf16 at 8, int8 at 16) serve every simulated case."""

import ml_dtypes
import numpy as np
import pytest

from moe_hw import golden
from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.golden.expand import _addresses, _plan
from moe_hw.host.checks import HostError
from moe_hw.host.expand import UNIT, odometer_addresses, plan, random_elements, split, stimulus
from moe_hw.host.unit import run
from moe_hw.params import ParameterError
from moe_hw.units.expand import ExpandParams, ExpandUnit

from conftest import FAST_SIM, SIM, STALLS, simulator_cases

PARAMS = {
    "fp32": ExpandParams(format="fp32", lanes=4, max_rank=6, max_input=64, max_output=4096),
    "bf16": ExpandParams(format="bf16", lanes=8, max_rank=6, max_input=64, max_output=4096),
    "int8": ExpandParams(format="int8", lanes=16, max_rank=6, max_input=64, max_output=4096),
}
DTYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "int8": np.int8}


def check(unit, inputs, fmt, *, sim=SIM, stall=0.0, seed=0):
    """Run, require bit-exact with a clean scoreboard, and the exact stall-free count:
    ceil(n_in / lanes) load beats + ceil(n_out / lanes) output beats + the overhead."""
    params = PARAMS[fmt]
    outcome = run(unit, inputs, params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    n_in = outcome.problem["input_elements"]
    n_out = outcome.problem["output_elements"]
    if stall == 0.0:
        lanes = params.lanes
        want = (params.max_rank + 2 * lanes + max(1, -(-n_in // lanes)) + -(-n_out // lanes)
                + params.address_latency + 10 if n_out else EMPTY_CYCLES)
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
    # rows longer than the lanes' narrow digit range (lanes 4: -32 .. 31): a pair's digit
    # far below every lane's constants
    "long_row_fp32": ("fp32", lambda: expand_case([1, 50], [3, 50], "fp32")),
    "long_rows_fp32": ("fp32", lambda: expand_case([1, 1, 55], [2, 3, 55], "fp32")),
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
    CASES, cocotb=["seed_fp32", "zero_kept_fp32"]))
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
    cycle; only the plan beats (6 dims + 2 x 16 lanes), the load beats and the fixed
    overhead come on top."""
    params = PARAMS["int8"]
    inputs = expand_case([48, 1], [48, 64], "int8")
    outcome = check(UNIT, inputs, "int8")
    assert outcome.ideal_cycles == 48 * 64 // 16
    assert outcome.cycles == outcome.ideal_cycles + 38 + 3 + params.overhead


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
            # Every lane's digit constant fits the hardware's narrow compare.
            assert all(-2 * lanes - 1 <= v <= 2 * lanes for u in the_plan.u for v in u)
            addresses = odometer_addresses(the_plan, -(-n // lanes))
            assert (addresses.reshape(-1)[:n] == _addresses(output_shape, out_stride)).all()
            assert ((addresses >= 0) & (addresses < max(1, int(np.prod(shape))))).all()


def test_planner_seed_strides():
    the_plan = plan([4, 1, 3, 5], [2, 1, 4, 4, 3, 5], ExpandParams())
    assert the_plan.out_stride == [0, 0, 15, 0, 5, 1]
    # The size-1 dim dropped, the contiguous (3, 5) run merged, padded in front to rank 6;
    # the odometer's step, a pair of beats of 16 lanes, is (2, 2) in the radix of the two
    # inner dims (15, 4).
    assert the_plan.dims == [(1, 0), (1, 0), (2, 0), (4, 15), (4, 0), (15, 1)]
    assert the_plan.digits == [0, 0, 0, 0, 2, 2]


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
    ({"parts": 3}, "parts must be 1, 2, 4 or 8, not 3"),
])
def test_expand_bad_params(changes, message):
    with pytest.raises(ParameterError, match=message):
        ExpandParams(**changes)


def test_expand_cycle_formula():
    """The documented formula: plan beats (max_rank + 2 x lanes) + load beats + output
    beats + overhead (17 at rank 6: run control 2, lane addresses 7, buffer read 3, lane
    select 1, queue 2, busy 1, done 1)."""
    params = ExpandParams()
    assert params.plan_beats == 38 and params.address_latency == 7
    assert params.overhead == 17
    assert params.cycles(1024, 1024 * 512) == 38 + 64 + 32768 + 17
    assert params.cycles(5, 0) == EMPTY_CYCLES
    # No input but some output (only a hostile run): the load still takes its one cycle.
    assert params.cycles(0, 16) == params.cycles(1, 16) == 38 + 1 + 1 + 17


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
                 str(tmp_path / "out.npz"), *sets, "--sim", FAST_SIM]) == 0
    with np.load(tmp_path / "out.npz") as out:
        assert sorted(out.files) == ["cycles", "output"]
        want = golden.expand(inputs["input"], inputs["expand_size"])
        assert out["output"].shape == want.shape
        assert (out["output"].view(np.uint16) == want.view(np.uint16)).all()
        assert int(out["cycles"]) == params.cycles(6, 48)


# ---- the split across P parallel units (SBP split(d), SPEC 1.6) -----------------------------

#: One design per part count serves every simulated split case (and repeat's).
SPLIT_PARAMS = {
    2: ExpandParams(format="fp32", lanes=4, max_rank=6, max_input=32, max_output=1024, parts=2),
    4: ExpandParams(format="fp32", lanes=2, max_rank=6, max_input=16, max_output=256, parts=4),
}


def part_cycles(params, n_in, n_out):
    """One part's stall-free cycles, the formula written out: plan, load, output, overhead."""
    lanes = params.lanes
    return (params.max_rank + 2 * lanes + max(1, -(-n_in // lanes)) + -(-n_out // lanes)
            + params.address_latency + 10 if n_out else EMPTY_CYCLES)


def check_split(unit, inputs, parts, *, split_dim=None, sim=SIM, stall=0.0, seed=0):
    """Run on a split unit: bit-exact logical output, every part's scoreboard clean, and
    stall-free exactly the slowest part's cycles plus the registered done."""
    params = SPLIT_PARAMS[parts]
    settings = {} if split_dim is None else {"split_dim": split_dim}
    outcome = run(unit, inputs, settings, params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        cut = split(outcome.problem, parts)
        want = max(part_cycles(params, part["input_elements"], part["output_elements"])
                   for part in cut.parts) + 1
        assert outcome.cycles == outcome.expected_cycles == want
    return outcome


SPLIT_CASES = {
    # seed 002: [4, 3, 1, 2] by [2, 4, 3, 4, 2], split(3): physical [2, 4, 3, 4, 1] per part
    "seed_split3_p2": (2, 3, lambda: expand_case([4, 3, 1, 2], [2, 4, 3, 4, 2], "fp32")),
    # a gate broadcast across H, split over the tokens (the default split_dim: dim 0)
    "gate_p2": (2, None, lambda: expand_case([6, 1], [6, 9], "fp32", seed=1)),
    # a row broadcast split along the row, unevenly: 7 + 6 elements
    "row_uneven_p2": (2, 1, lambda: expand_case([1, 13], [5, 13], "fp32", seed=2)),
    # a kept dim of size 1 over 2 parts: part 1 is empty
    "empty_part_p2": (2, 0, lambda: expand_case([1, 4], [3, 1, 4], "fp32", seed=3)),
    "gate_p4": (4, None, lambda: expand_case([8, 1], [8, 5], "fp32", seed=4)),
    # 3 rows over 4 parts: 1, 1, 1 and an empty part
    "uneven_p4": (4, 0, lambda: expand_case([3, 2], [2, 3, 2], "fp32", seed=5)),
}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize(("sim", "name"), simulator_cases(SPLIT_CASES,
                                                          cocotb=[], icarus=["seed_split3_p2"]))
def test_expand_split_cases(sim, name, stall):
    parts, split_dim, make = SPLIT_CASES[name]
    inputs = make()
    outcome = check_split(UNIT, inputs, parts, split_dim=split_dim, sim=sim, stall=stall,
                          seed=sorted(SPLIT_CASES).index(name))
    want = golden.expand(inputs["input"], inputs["expand_size"])
    assert outcome.outputs["output"].shape == want.shape


def test_split_seed_physical_plan():
    """The seed's example, on the host alone: [4, 3, 1, 2] split(3) over 2 parts gives each
    part input [4, 3, 1, 1], expand_size [2, 4, 3, 4, 1] and out_stride [0, 3, 1, 0, 1]; the
    parts' golden outputs concatenate along output dim 4 to the logical output."""
    inputs = expand_case([4, 3, 1, 2], [2, 4, 3, 4, 2], "fp32")
    problem = UNIT.problem(inputs, {"split_dim": 3})
    cut = split(problem, 2)
    assert (cut.split_dim, cut.out_dim) == (3, 4)
    for index, part in enumerate(cut.parts):
        assert list(part["input"].shape) == [4, 3, 1, 1]
        assert part["expand_size"] == [2, 4, 3, 4, 1]
        assert part["out_stride"] == [0, 3, 1, 0, 1]
        assert (part["input"].view(np.uint32)
                == inputs["input"][..., index:index + 1].view(np.uint32)).all()
    plans = UNIT.part_plans(problem, SPLIT_PARAMS[2])
    assert [the_plan.out_stride for _, the_plan in plans] == [[0, 3, 1, 0, 1]] * 2
    pieces = [golden.expand(part["input"], part["expand_size"]) for part in cut.parts]
    assert (np.concatenate(pieces, axis=4).view(np.uint32)
            == golden.expand(inputs["input"], inputs["expand_size"]).view(np.uint32)).all()


def test_split_uneven_and_default_dim():
    """The balanced split (golden.physical_expand): the first size % parts parts one longer;
    without split_dim the outermost input dim above 1 is split (the row of a row
    broadcast)."""
    problem = UNIT.problem(expand_case([1, 13], [5, 13], "fp32"), {})
    cut = split(problem, 4)
    assert cut.split_dim == 1 and cut.out_dim == 1
    assert [part["output_shape"] for part in cut.parts] == [[5, 4], [5, 3], [5, 3], [5, 3]]
    assert split(problem, 1).parts == [problem]


def test_split_cycle_formula():
    """max over the parts of the one-part formula, plus 1 (the registered done); an empty
    part counts EMPTY_CYCLES."""
    params = ExpandParams(parts=4)
    assert params.split_cycles([(256, 1 << 17)] * 4) == params.cycles(256, 1 << 17) + 1
    assert params.split_cycles([(5, 20), (4, 16), (0, 0), (4, 16)]) == params.cycles(5, 20) + 1
    assert ExpandParams().split_cycles([(5, 20)]) == ExpandParams().cycles(5, 20)
    with pytest.raises(ValueError, match="part_sizes must have 4 entries"):
        params.split_cycles([(5, 20)])


def test_split_ports():
    """One part keeps the unit's names; P parts prefix their streams and sizes and share the
    status."""
    from amaranth.lib import wiring
    one = set(ExpandUnit(PARAMS["fp32"]).signature.members)
    assert one == {"input_data", "output", "plan", "start", "input_elements",
                   "output_elements", "busy", "done", "error"}
    two = set(ExpandUnit(SPLIT_PARAMS[2]).signature.members)
    assert two == {f"part{p}_{name}" for p in range(2) for name in
                   ("input_data", "output", "plan", "input_elements", "output_elements")} \
        | {"start", "busy", "done", "error"}
    assert isinstance(ExpandUnit(SPLIT_PARAMS[2]), wiring.Component)


@pytest.mark.parametrize(("shape", "sizes", "settings", "message"), [
    ((4, 3, 1, 2), [2, 4, 3, 4, 2], {"parts": 2, "split_dim": 2},
     r"split_dim 2 is broadcast by expand_size\[3\] = 4; only a kept dim can be split"),
    ((4, 3, 1, 2), [2, 4, 3, 4, 2], {"parts": 2, "split_dim": 4},
     r"split_dim must be an input dim, 0 to 3, not 4"),
    ((4, 3), [4, 3], {"parts": 2, "split_dim": -1},
     r"split_dim must be a non-negative integer, not -1"),
    ((1, 1), [3, 1, 5], {"parts": 2},
     r"parts = 2 needs a dim to split: give split_dim \(input \[1, 1\] has no kept dim"),
    ((80, 1), [80, 2], {"parts": 2, "max_input": 32},
     r"the problem needs max_input >= 40, but max_input = 32"),
])
def test_split_bad(shape, sizes, settings, message):
    """Errors name the parameter or the dim and its value, before anything is built."""
    inputs = {"input": np.zeros(shape, np.float32), "expand_size": np.array(sizes)}
    with pytest.raises(HostError, match=message):
        run(UNIT, inputs, settings)


def test_split_part_too_big():
    """max_input is per part: on a given unit, the part that does not fit is named."""
    inputs = {"input": np.zeros((80, 1), np.float32), "expand_size": np.array([80, 2])}
    with pytest.raises(HostError, match=r"part 0's input elements \(40\) exceed the unit's "
                                        r"max_input of 32"):
        run(UNIT, inputs, params=SPLIT_PARAMS[2])


def test_split_bad_parts():
    inputs = expand_case([4, 3], [4, 3], "fp32")
    with pytest.raises(ParameterError, match="parts must be 1, 2, 4 or 8, not 3"):
        run(UNIT, inputs, {"parts": 3})
    with pytest.raises(ParameterError, match="parts must be 1, 2, 4 or 8, not 3"):
        ExpandParams(parts=3)


def test_split_hostile_part_size():
    """A size above its maximum driven straight into one part: that part errs and moves
    nothing, the other runs to the end; done (with error) when both are done."""
    params = SPLIT_PARAMS[2]
    problem = UNIT.problem(expand_case([6, 1], [6, 9], "fp32"), {})
    stim, settings = UNIT.pack(problem, params, stall=0.0, seed=0)
    settings["runtime"]["part1_input_elements"] = params.max_input + 1
    results = UNIT.simulate(params, stim, settings, sim=SIM)
    assert int(results["error"]) == 1
    assert int(results["cycles"]) == part_cycles(params, 3, 27) + 1
    assert len(results["data0"]) == -(-27 // params.lanes) and int(results["input_taken0"]) == 1
    assert len(results["data1"]) == 0 and int(results["input_taken1"]) == 0
    assert int(results["plan_taken1"]) == 0


def test_split_run_command(tmp_path):
    """``python -m moe_hw.run expand --set parts=2 --set split_dim=1``: the logical output,
    concatenated along the split dim, and the split cycle count."""
    from moe_hw.run import main
    inputs = expand_case([1, 13], [5, 13], "fp32", seed=6)
    np.savez(tmp_path / "in.npz", **inputs)
    params = SPLIT_PARAMS[2]
    sets = [f"--set={name}={getattr(params, name)}"
            for name in ("format", "lanes", "max_rank", "max_input", "max_output", "parts")]
    assert main(["expand", "--in", str(tmp_path / "in.npz"), "--out",
                 str(tmp_path / "out.npz"), *sets, "--set=split_dim=1", "--sim", FAST_SIM]) == 0
    with np.load(tmp_path / "out.npz") as out:
        want = golden.expand(inputs["input"], inputs["expand_size"])
        assert (out["output"].view(np.uint32) == want.view(np.uint32)).all()
        assert int(out["cycles"]) == params.split_cycles([(7, 35), (6, 30)])
