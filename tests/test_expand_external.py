"""The expand unit's external path (``memory`` = external, SPEC 1.6): the input stays in a
memory model behind the unit's read port, and each output beat is one read per group of
neighbouring lanes. Every case runs on the emitted Verilog (Verilator's fast path; one case also
through the cocotb bench in Verilator and Icarus) with and without random pauses on every
stream, the memory's request and response included, and is scored bit for bit against
``golden.expand`` with two scoreboards: every output beat (nothing lost, duplicated or
reordered) and every memory read (address and lane enables in order, none out of bounds, no
response left untaken). Stall-free runs take exactly the documented cycles, written out here
from the read count. Two designs (fp32 at 4 lanes with 8 reads in flight, int8 at 16 lanes)
serve the cases."""

import numpy as np
import pytest

from moe_hw import golden
from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.host.expand import (UNIT, external_reads, lane_addresses, odometer_addresses, plan,
                                read_findings, split, stimulus)
from moe_hw.host.repeat import UNIT as REPEAT
from moe_hw.host.unit import run
from moe_hw.params import ParameterError
from moe_hw.units.expand import ExpandParams

from conftest import FAST_SIM, SIM, STALLS, simulator_cases
from test_expand import CASES, expand_case, random_expand

PARAMS = {
    "fp32": ExpandParams(format="fp32", lanes=4, max_rank=6, max_input=64, max_output=4096,
                         memory="external", max_outstanding=8),
    "int8": ExpandParams(format="int8", lanes=16, max_rank=6, max_input=64, max_output=4096,
                         memory="external"),
}


def formula(params, problem, latency):
    """The stall-free cycles written out: plan beats (max_rank + 2 x lanes), the last
    lane's plan load, one cycle per read, the memory's latency, the waits for tags when the
    latency exceeds them, and the fixed overhead (24 at rank 6: run control 2, lane addresses 7, group flags 2,
    address queue 1, issue 1, request stages 3, request queue 2, merge 2, output queue 2,
    busy 1, done 1)."""
    if problem["output_elements"] == 0:
        return EMPTY_CYCLES
    reads = len(external_reads(plan(problem["input"].shape, problem["expand_size"], params),
                               -(-problem["output_elements"] // params.lanes),
                               problem["input_elements"])[0])
    waits = (reads - 1) // params.max_outstanding * max(0, latency + 1 - params.max_outstanding)
    assert params.max_rank == 6
    return params.max_rank + 2 * params.lanes + 1 + reads + latency + waits + 24


def check(inputs, fmt, *, sim=SIM, stall=0.0, seed=0, latency=2):
    params = PARAMS[fmt]
    outcome = run(UNIT, inputs, {"memory_latency": latency}, params=params, sim=sim,
                  stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        want = formula(params, outcome.problem, latency)
        assert outcome.cycles == outcome.expected_cycles == want
    return outcome


EXTERNAL_CASES = [name for name in CASES if not name.endswith("bf16")]


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize(("sim", "name"), simulator_cases(
    {name: CASES[name] for name in EXTERNAL_CASES}, cocotb=["seed_fp32"]))
def test_external_cases(sim, name, stall):
    fmt, make = CASES[name]
    inputs = make()
    outcome = check(inputs, fmt, sim=sim, stall=stall, seed=sorted(CASES).index(name))
    want = golden.expand(inputs["input"], inputs["expand_size"])
    assert outcome.outputs["output"].shape == want.shape
    if name == "seed_fp32":
        assert outcome.problem["out_stride"] == [0, 0, 15, 0, 5, 1]


@pytest.mark.parametrize("latency", [1, 7, 13])
def test_external_latency(latency):
    """Latencies below, at and above the 8 reads in flight: bit-exact, and the stall-free
    count is the formula's, the tag waits included (a [6, 1] gate to [6, 40]: 60 reads)."""
    check(expand_case([6, 1], [6, 40], "fp32", seed=latency), "fp32", latency=latency)


def test_external_one_read_per_beat():
    """An innermost broadcast, a row broadcast and a replication of rows of a multiple of
    lanes elements are one read per beat; kept runs of 3 at 16 lanes are a read per run."""
    params = PARAMS["int8"]
    for shape, sizes, beats_per_read in (([3, 1], [3, 64], 1), ([1, 32], [4, 32], 1),
                                         ([2, 32], [2, 2, 32], 1)):
        the_plan = plan(shape, sizes, params)
        beats = -(-the_plan.output_elements // 16)
        assert len(external_reads(the_plan, beats, int(np.prod(shape)))[0]) == beats
    the_plan = plan([5, 1, 3], [5, 4, 3], params)     # runs 0 1 2 0 1 2 .. 3 4 5 3 4 5 ..
    beats = -(-60 // 16)
    addr, _ = external_reads(the_plan, beats, 15)
    assert len(addr) > 5 * beats


def test_external_read_model():
    """The read model's addresses are the odometers' (every lane, the lanes past the end
    too), and every lane of a beat lies inside its group's read: at or above the base,
    within the enabled extent, below the input's size."""
    rng = np.random.default_rng(11)
    for lanes in (1, 2, 4, 8, 16):
        params = ExpandParams(lanes=lanes, max_rank=6, max_input=4096, max_output=1 << 16,
                              memory="external")
        for _ in range(40):
            shape, sizes = random_expand(rng, int(rng.integers(1, 7)))
            the_plan = plan(shape, sizes, params)
            n = the_plan.output_elements
            if n == 0:
                continue
            beats = -(-n // lanes)
            addresses = lane_addresses(the_plan, beats)
            assert (addresses == odometer_addresses(the_plan, beats)).all()
            addr, enable = external_reads(the_plan, beats, int(np.prod(shape)))
            read = -1
            for row in addresses:
                for lane, a in enumerate(row):
                    if lane == 0 or not 0 <= a - row[lane - 1] <= 1:
                        read += 1
                        assert addr[read] == a
                    offset = a - addr[read]
                    assert 0 <= offset < lanes and enable[read] >> offset & 1
            assert read == len(addr) - 1


def test_external_read_scoreboard_bites():
    """The read scoreboard fails a run whose reads differ from the model's: one address
    moved, one lane enable dropped, one lane read out of bounds."""
    outcome = run(UNIT, expand_case([4, 3], [2, 4, 3], "fp32"), params=PARAMS["fp32"],
                  sim=FAST_SIM)
    assert outcome.passed, outcome.problems
    reads = (outcome.results["request_addr"], outcome.results["request_enable"])
    assert read_findings(outcome.results, reads) == []
    for change in ({"request_addr": reads[0] + (np.arange(len(reads[0])) == 2)},
                   {"request_enable": reads[1] & ~(np.arange(len(reads[1])) == 0)},
                   {"out_of_bounds": 1}):
        assert read_findings({**outcome.results, **change}, reads)


def test_external_hostile_sizes():
    """Sizes driven straight into the hardware: a size above its maximum sets error and
    moves nothing; no input but some output (a run the host never makes) reads no lane at
    all (every request's enables are 0) and never out of bounds."""
    params = PARAMS["fp32"]
    problem = UNIT.problem(expand_case([3, 1], [3, 4], "fp32"), {})
    stim, settings = stimulus(problem, params, UNIT.plan(problem, params))
    high = dict(settings, runtime={**settings["runtime"], "input_elements": 65})
    results = UNIT.simulate(params, stim, high)
    assert int(results["error"]) == 1 and int(results["cycles"]) == EMPTY_CYCLES
    assert len(results["data"]) == 0 and len(results["request_addr"]) == 0
    empty = dict(settings, runtime={**settings["runtime"], "input_elements": 0})
    results = UNIT.simulate(params, stim, empty)
    assert int(results["error"]) == 0 and len(results["data"]) == 3
    assert len(results["request_addr"]) > 0 and not results["request_enable"].any()
    assert int(results["out_of_bounds"]) == 0


SPLIT = ExpandParams(format="bf16", lanes=4, max_rank=6, max_input=32, max_output=1024,
                     parts=2, memory="external")


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize(("shape", "sizes", "split_dim"), [
    ([4, 3, 1, 2], [2, 4, 3, 4, 2], 3),       # seed 002's split(3) example
    ([1, 13], [5, 13], 1),                    # a row split unevenly: 7 + 6
])
def test_external_split(shape, sizes, split_dim, stall):
    """Two parts, each its own read port and memory (its physical slice): the logical output
    bit-exact, every part's beat and read scoreboards clean, stall-free the slowest part's
    formula plus the registered done."""
    inputs = expand_case(shape, sizes, "bf16", seed=5)
    outcome = run(UNIT, inputs, {"split_dim": split_dim, "memory_latency": 3}, params=SPLIT,
                  sim=FAST_SIM, stall=stall, seed=2)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        parts = split(outcome.problem, 2).parts
        want = max(formula(SPLIT, part, 3) for part in parts) + 1
        assert outcome.cycles == want


def test_external_repeat_run_command(tmp_path):
    """``python -m moe_hw.run repeat --set memory=external``: tokens replicated for k = 2
    from memory, bit-exact, the npz keys unchanged."""
    from moe_hw.run import main
    rng = np.random.default_rng(4)
    tokens = rng.standard_normal((5, 24)).astype(np.float32)
    np.savez(tmp_path / "in.npz", input=tokens, repeat_size=np.array([2, 1]))
    assert main(["repeat", "--in", str(tmp_path / "in.npz"), "--out",
                 str(tmp_path / "out.npz"), "--set", "memory=external", "--set", "lanes=8",
                 "--set", "memory_latency=5", "--sim", FAST_SIM]) == 0
    out = np.load(tmp_path / "out.npz")
    assert out["output"].tobytes() == golden.repeat(tokens, [2, 1]).tobytes()


@pytest.mark.parametrize(("changes", "message"), [
    ({"memory": "dram"}, "memory must be onchip or external, not 'dram'"),
    ({"memory": "external", "max_outstanding": 1},
     "max_outstanding must be an integer between 2 and 1024, not 1"),
])
def test_external_bad_params(changes, message):
    with pytest.raises(ParameterError, match=message):
        ExpandParams(**changes)


def test_external_ports():
    """The external unit has the read port and no input stream; max_input only sizes the
    addresses (far above the on-chip limit)."""
    from moe_hw.units.expand import ExpandUnit
    unit = ExpandUnit(ExpandParams(lanes=16, memory="external", max_input=1 << 20))
    names = set(unit.signature.members)
    assert {"read_request", "read_response", "plan", "output"} <= names
    assert "input_data" not in names
    assert len(unit.read_request.payload.addr) == 20
    assert REPEAT.params_for(REPEAT.problem({"input": np.zeros((4, 8), np.float32),
                                             "repeat_size": np.array([2, 1])}, {}),
                             {"memory": "external"}).memory == "external"
