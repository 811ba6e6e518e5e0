"""OneFlow ``repeat`` (SPEC 1.6) on the expand unit's Verilog: the host maps it to reshape +
expand + reshape (seed 002) and runs the very same hardware (the builds of
``tests/test_expand.py``). Every case with and without random stalls, bit for bit against
``golden.repeat`` with the expand scoreboard and the exact stall-free cycle count; bad repeat
sizes fail on the host naming the dim and its value."""

import numpy as np
import pytest

from moe_hw import golden
from moe_hw.host.checks import HostError
from moe_hw.host.expand import random_elements
from moe_hw.host.repeat import UNIT
from moe_hw.host.unit import run

from conftest import FAST_SIM, STALLS, simulator_cases
from test_expand import PARAMS, check, check_split


def repeat_case(shape, repeat_size, fmt, seed=0):
    rng = np.random.default_rng(seed)
    return {"input": random_elements(rng, shape, fmt),
            "repeat_size": np.array(repeat_size, np.int64)}


def random_repeat(index, fmt):
    """A random 2-D input (a 0-sized dim in one case) repeated over 2 or 3 dims."""
    rng = np.random.default_rng(index)
    shape = tuple(int(v) for v in rng.integers(0 if index == 2 else 1, 4, 2))
    return repeat_case(shape, rng.integers(1, 4, 2 + index % 2), fmt, seed=index + 50)


CASES = {
    # seed 002: [3, 1, 5] repeated by [2, 5, 3, 1] gives [2, 15, 3, 5]
    "seed_fp32": ("fp32", lambda: repeat_case((3, 1, 5), [2, 5, 3, 1], "fp32")),
    # seed 002 examples 1 and 2
    "seed_one_dim_int8": ("int8", lambda: repeat_case((5,), [3], "int8")),
    "seed_two_bf16": ("bf16", lambda: repeat_case((3, 1, 5), [5, 3, 1], "bf16")),
    # tokens replicated for k = 2 experts
    "tokens_k2_int8": ("int8", lambda: repeat_case((4, 9), [2, 1], "int8")),
    **{f"random{index}_{fmt}": (fmt, (lambda index=index, fmt=fmt: random_repeat(index, fmt)))
       for index, fmt in enumerate(["bf16", "int8", "fp32"])},
}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize(("sim", "name"), simulator_cases(CASES, cocotb=["seed_fp32"]))
def test_repeat_cases(sim, name, stall):
    fmt, make = CASES[name]
    inputs = make()
    outcome = check(UNIT, inputs, fmt, sim=sim, stall=stall, seed=sorted(CASES).index(name))
    want = golden.repeat(inputs["input"], inputs["repeat_size"])
    tiled = np.tile(inputs["input"], inputs["repeat_size"])
    assert outcome.outputs["output"].shape == want.shape == tiled.shape
    if name == "seed_fp32":
        assert want.shape == (2, 15, 3, 5)
        # reshape [1, 3, 1, 5], expand [2, 5, 3, 3, 5]
        assert outcome.problem["expand_size"] == [2, 5, 3, 3, 5]


@pytest.mark.parametrize(("shape", "sizes", "message"), [
    ((2, 3), [2, 0], r"repeat_size\[1\] must be >= 1, not 0"),
    ((2, 3), [-1, 1], r"repeat_size\[0\] must be >= 1, not -1"),
    ((2, 3), [2], r"repeat_size must have at least as many dims as the input"),
    ((2,), [1, 1, 1, 1, 1, 1, 3], r"repeat_size\[6\] = 3 is past the unit's max_rank of 6"),
])
def test_repeat_bad_sizes(shape, sizes, message):
    inputs = {"input": np.zeros(shape, np.float32), "repeat_size": np.array(sizes)}
    with pytest.raises(HostError, match=message):
        run(UNIT, inputs, params=PARAMS["fp32"])
    with pytest.raises(HostError, match=message):
        run(UNIT, inputs)


@pytest.mark.parametrize("stall", STALLS)
def test_repeat_split(stall):
    """Tokens replicated for k = 2 on a unit of 2 parts (the build of test_expand's split
    cases), split along the hidden dim (repeated once): each part repeats its half."""
    inputs = repeat_case((4, 6), [2, 1], "fp32", seed=7)
    outcome = check_split(UNIT, inputs, 2, split_dim=1, stall=stall, seed=7)
    assert outcome.outputs["output"].shape == (8, 6)
    # reshape [1, 4, 6], expand [2, 4, 6]; input dim 1 is the expand's dim 2
    assert outcome.problem["split_dim"] == 2


@pytest.mark.parametrize(("shape", "sizes", "split_dim", "message"), [
    ((4, 6), [2, 1], 0, r"split_dim 0 is repeated by repeat_size\[0\] = 2; only a dim "
                        r"repeated once can be split"),
    ((4, 6), [3, 2, 1], 0, r"split_dim 0 is repeated by repeat_size\[1\] = 2"),
    ((4, 6), [2, 1], 2, r"split_dim must be an input dim, 0 to 1, not 2"),
])
def test_repeat_split_bad(shape, sizes, split_dim, message):
    inputs = {"input": np.zeros(shape, np.float32), "repeat_size": np.array(sizes)}
    with pytest.raises(HostError, match=message):
        run(UNIT, inputs, {"parts": 2, "split_dim": split_dim})


def test_repeat_address_dims_above_max_rank():
    """Repeat doubles each repeated dim; when the merged address dims exceed max_rank the
    error says so."""
    inputs = {"input": np.zeros((2, 3, 2, 3), np.float32),
              "repeat_size": np.array([2, 2, 2, 2])}
    with pytest.raises(HostError, match=r"needs 8 address dims .* above the unit's max_rank "
                                        r"of 6"):
        run(UNIT, inputs)


def test_repeat_run_command(tmp_path):
    """``python -m moe_hw.run repeat`` on an npz file: ``input`` and ``repeat_size`` in,
    ``output`` and ``cycles`` out, the seed's example bit-exact."""
    from moe_hw.run import main
    inputs = repeat_case((3, 1, 5), [2, 5, 3, 1], "fp32", seed=4)
    np.savez(tmp_path / "in.npz", **inputs)
    params = PARAMS["fp32"]
    sets = [f"--set={name}={getattr(params, name)}"
            for name in ("format", "lanes", "max_rank", "max_input", "max_output")]
    assert main(["repeat", "--in", str(tmp_path / "in.npz"), "--out",
                 str(tmp_path / "out.npz"), *sets, "--sim", FAST_SIM]) == 0
    with np.load(tmp_path / "out.npz") as out:
        assert sorted(out.files) == ["cycles", "output"]
        want = golden.repeat(inputs["input"], inputs["repeat_size"])
        assert out["output"].shape == (2, 15, 3, 5)
        assert (out["output"].view(np.uint32) == want.view(np.uint32)).all()
        assert int(out["cycles"]) == params.cycles(15, 2 * 15 * 3 * 5)
