"""Reset mid-problem (SPEC section 2): every unit, on its cocotb bench, starts an old problem
under random valid/ready pauses, is reset at a seeded random cycle of it, keeps still (no
output beat, read or write, busy and done low) until the next start, and then runs a fresh
problem bit-exact against the golden model, its scoreboard seeing that problem's beats and
writes and nothing else (``sim/harness.py``, ``reset_mid_problem``).

The problems are each unit's first benchmark problem at the tests' tiny shape (conftest.py:
the designs test_fastsim.py and the bench command's test run, emitted once for all three),
one seed per unit. They run in Icarus: it builds a model in seconds where Verilator takes
most of a minute per unit, and its four-state values show a register that reset leaves
unknown."""

import zlib

import numpy as np
import pytest

from moe_hw.host.unit import run
from moe_hw.registry import units

from conftest import bench_runs, simulator_params

STALL = 0.3
SEED = 9


def tiny_problem(unit):
    """``(inputs, settings)``: the unit's first benchmark variant at the tiny shape."""
    (_, inputs, settings), *_ = bench_runs(unit.name)
    return inputs, settings


@pytest.mark.parametrize("sim", simulator_params("icarus"))
@pytest.mark.parametrize("name", list(units()))
def test_reset_mid_problem(name, sim):
    unit = units()[name]
    inputs, settings = tiny_problem(unit)
    gen_settings, runtime = unit.split_settings(settings)
    problem = unit.problem(inputs, runtime)
    ideal = unit.ideal_cycles(problem, unit.params_for(problem, gen_settings))
    # A cycle inside the old problem: its stall-free length is at least the ideal count.
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
    reset_at = int(rng.integers(1, max(2, ideal)))
    outcome = run(unit, inputs, settings, sim=sim, stall=STALL, seed=SEED, reset_at=reset_at)
    print(f"\n{name}: reset {reset_at} cycles into a problem of >= {ideal} cycles "
          f"(busy then: {int(outcome.results['reset_busy'])}); fresh problem "
          f"{outcome.cycles} cycles, {'bit-exact' if outcome.passed else outcome.problems}")
    assert int(outcome.results["reset_at"]) == reset_at
    assert outcome.passed, "\n".join(outcome.problems)
    if int(outcome.results["reset_busy"]) != -1:      # -1: a pipeline without busy
        assert outcome.results["reset_busy"] == 1, \
            f"the unit was idle at cycle {reset_at}: the reset was not mid-problem"


def test_reset_at_needs_a_cocotb_bench():
    unit = units()["dispatch"]
    inputs, settings = tiny_problem(unit)
    with pytest.raises(ValueError, match="reset_at needs a cocotb bench"):
        run(unit, inputs, settings, sim="fast", reset_at=3)
