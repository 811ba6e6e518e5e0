"""Shared pytest fixtures: the simulators (Icarus skipped, with the reason, when absent), and
the tiny problem of the tests that run every unit."""

import os

import pytest
from amaranth.sim import Simulator
from hypothesis import settings as hypothesis_settings

from moe_hw.flows.simulate import build_root, simulator_available
from moe_hw.host.unit import BenchShape
from moe_hw.registry import units

# The tests' problems are small: a Verilator model compiled at -O0 builds in less than half
# the time it takes at Verilator's own levels and simulates them about as fast
# (moe_hw/flows/simulate.py).
os.environ.setdefault("MOE_HW_VERILATOR_OPT", "-O0")

# A fast-path run that fails a check in a test is run again with a trace, and the failure
# names the waveform kept here (moe_hw/host/unit.py, failure_waveform).
os.environ.setdefault("MOE_HW_FAILURE_WAVEFORMS", str(build_root() / "failed-waveforms"))

# Property tests are reproducible by default: the examples are derandomized (the same ones
# every run) and no example database is kept. HYPOTHESIS_PROFILE=fuzz draws fresh ones.
hypothesis_settings.register_profile("moe_hw", derandomize=True, database=None, deadline=None)
hypothesis_settings.register_profile("fuzz", database=None, deadline=None)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "moe_hw"))


def simulator_params(*sims):
    """pytest params for the given simulators; unavailable ones are skipped with the reason."""
    params = []
    for sim in sims:
        reason = simulator_available(sim)
        marks = [pytest.mark.skip(reason=f"{sim}: {reason}")] if reason else []
        params.append(pytest.param(sim, marks=marks, id=sim))
    return params


# The tests' runs of a unit: Verilator's fast path (moe_hw/flows/fastsim.py: the problem
# inside the simulator, seeded stalls from LFSRs, the scoreboard's checks as counters and
# flags): one build per design serves all of a file's problems, and a run takes milliseconds.
# The cocotb benches (the per-beat scoreboards in Python: order, loss, duplication, bounds;
# about 0.5 s a run to start the simulator and cocotb) run a few cases of each unit, in
# Verilator and in Icarus (the four-state check).
SIM = "fast"


def simulator_cases(cases, *, cocotb, icarus=()):
    """pytest params ``(sim, case)``: every case on the fast path (``SIM``), the cases named
    in ``cocotb`` (ones that reach the unit's normal, masked and empty paths, on one design:
    one Verilator model) through the cocotb bench in Verilator and in Icarus, and those named
    in ``icarus`` (the other designs' cases; Icarus builds no model) in Icarus."""
    unknown = [name for name in [*cocotb, *icarus] if name not in cases]
    if unknown:
        raise ValueError(f"cocotb and icarus cases must be among the cases, not {unknown}")
    params = []
    for sim, names in ((SIM, list(cases)), ("verilator", list(cocotb)),
                       ("icarus", [*cocotb, *icarus])):
        reason = simulator_available(sim)
        marks = [pytest.mark.skip(reason=f"{sim}: {reason}")] if reason else []
        params += [pytest.param(sim, name, marks=marks, id=f"{sim}-{name}") for name in names]
    return params


STALLS = [pytest.param(0.0, id="no-stall"), pytest.param(0.3, id="stall")]

# The tiny shape of the tests that run every unit (tests/test_fastsim.py, test_reset.py and
# test_bench.py's command line): one shape, so that they run the same designs and each is
# emitted once (an emission takes 1 to 12 s).
TINY = BenchShape(tokens=6, hidden=8, experts=3, top_k=2, lanes=2)

# dispatch's maxima in tests/test_dispatch.py, also those of the fast path's Verilator test of
# dispatch (tests/test_fastsim.py): one design for both.
DISPATCH_MAXIMA = dict(max_pairs=256, max_hidden=64, max_capacity=32, max_experts=8)


def bench_runs(name, shape=TINY):
    """``(unit, inputs, settings)`` for each variant of the unit's benchmark problem."""
    unit = units()[name]
    if name == "scan_layers_backward":
        # Its benchmark runs 32 layers (a long run here): the benchmark's two designs (the
        # bench command's, emitted once), on a run of 3 layers.
        problems = list(unit.bench_problems(shape).values())
        bench_inputs = problems[0][0]
        designs = {"max_tokens": len(bench_inputs["input"]),
                   "max_layers": len(bench_inputs["scale"])}
        inputs = unit.random_inputs(tokens=3, hidden=shape.hidden, layers=3,
                                    format=shape.format, seed=3)
        return [(unit, inputs, {**settings, **designs}) for _, settings in problems]
    return [(unit, inputs, settings) for inputs, settings in
            unit.bench_problems(shape, seed=3).values()]


# The fast path for tests whose subject is not the simulator (the run command's files, a
# design point's run): Icarus, which compiles a design in well under a second, where a
# Verilator model takes 5 to 20 s to build; the fast path itself is tested in Icarus too,
# with one Verilator model (tests/test_fastsim.py). Verilator's fast path without Icarus.
FAST_SIM = "fast-icarus" if simulator_available("icarus") is None else "fast"

# The cocotb bench for a test of one of its own knobs on a design of the test's own (the
# consumer's pause probability, ``sink_stall``, has no knob on the fast path): Icarus, which
# builds no model; Verilator without Icarus.
BENCH_SIM = "icarus" if simulator_available("icarus") is None else "verilator"


def comb_outputs(m, inputs, outputs, cases):
    """The values of ``outputs`` (a tuple per case) of the combinational circuit ``m`` for
    each of ``cases`` (a tuple of values of ``inputs`` each), in Amaranth's simulator."""
    seen = []

    async def bench(ctx):
        for case in cases:
            for signal, value in zip(inputs, case, strict=True):
                ctx.set(signal, value)
            seen.append(tuple(ctx.get(output) for output in outputs))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    return seen


def run_pysim(top, *benches):
    """Run ``benches`` as testbenches on ``top`` with a clock, in Amaranth's simulator."""
    sim = Simulator(top)
    sim.add_clock(1e-6)
    for bench in benches:
        sim.add_testbench(bench)
    sim.run()
