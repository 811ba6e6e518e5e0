"""The expand_backward unit (SPEC 1.6 backward: ``input_grad[addr(x)] += grad_output[x]``) on
its emitted Verilog (every case on Verilator's fast path; a small one also through the cocotb
bench in Verilator and Icarus), with and without random valid/ready stalls on every stream,
scored bit for bit against ``golden.expand_backward_hw`` (the hardware's summation order) with a
scoreboard over every output beat (nothing lost, duplicated or reordered; lane enables and the
last flag), the plan and grad_output beats taken. Stall-free runs must take exactly the
documented count (:meth:`ExpandBackwardParams.cycles`)::

    (max_rank + 3) + items + ceil(G/2)*W*ceil(rows / W) - (W - 1 - (rows - 1) % W)
                   + F + 3*L + 13

(items: one per grad_output beat in the reduce and rows modes, one per element in elements
mode; rows = ceil(input elements / lanes); G = L + 3 banks, drained a pair per pass, W = L + 1
drain rows in turn,
F = max(T + 1, 1 + log2(lanes)*L) in reduce mode and T + 1 in the others, T =
ceil(log2(max_rank)) at least 1 (the address tree, then the read address register), L the
adder latency), and in stream mode
(one bank, each row out at its last item, no drain)::

    (max_rank + 3) + items + F + L + 8

Integer-valued data,
for which every summation order gives the same bits, is also checked against the plain
sequential ``golden.expand_backward``. Bad sizes fail on the host with one line naming the
parameter and the value. Three designs (fp32 at 4 lanes, bf16 at 8, and fp32 with a
4-stage adder: G = 7, an odd number of banks, and 64 rows: more than its output queue holds,
so that stream mode waits for room under stalls) serve every case.
"""

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from moe_hw import golden
from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.golden.expand import BACKWARD_MODES, _plan
from moe_hw.golden.testing import bit_equal, random_floats
from moe_hw.host.checks import HostError
from moe_hw.host.expand_backward import UNIT
from moe_hw.host.unit import run
from moe_hw.params import ParameterError
from moe_hw.units.expand_backward import ExpandBackwardParams, ExpandBackwardUnit

from conftest import BENCH_SIM, FAST_SIM, SIM, STALLS, simulator_cases

PARAMS = {
    "fp32": ExpandBackwardParams(format="fp32", lanes=4, max_rank=4, max_input=64,
                                 max_output=4096),
    "bf16": ExpandBackwardParams(format="bf16", lanes=8, max_rank=4, max_input=64,
                                 max_output=4096),
    "fp32_l4": ExpandBackwardParams(format="fp32", lanes=4, max_rank=4, max_input=256,
                                    max_output=4096, add_stages=4),
}
DTYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp32_l4": np.float32}


def backward_case(input_shape, expand_size, fmt, seed=0, *, integers=False):
    rng = np.random.default_rng(seed)
    output_shape = _plan(input_shape, expand_size)[0]
    n = int(np.prod(output_shape))
    if integers:
        grad = rng.integers(-8, 9, n).astype(DTYPES[fmt])
    else:
        grad = random_floats(rng, n, DTYPES[fmt], specials=0.1)
    return {"output_grad": grad.reshape(output_shape),
            "input_shape": np.array(input_shape, np.int64),
            "expand_size": np.array(expand_size, np.int64)}


def expected_cycles(params, n_in, n_out, mode):
    """The docstring's formula, written out from the parameters."""
    if n_out == 0:
        return EMPTY_CYCLES
    lanes, lat = params.lanes, params.add_latency
    pairs, w = -(-(lat + 3) // 2), lat + 1
    items = n_out if mode == "elements" else n_out // lanes
    rows = -(-n_in // lanes)
    short = max(1, (params.max_rank - 1).bit_length()) + 1     # the tree, the read address
    front = max(short, 1 + (lanes.bit_length() - 1) * lat) if mode == "reduce" else short
    if mode == "stream" and items >= rows:
        return params.max_rank + 3 + items + front + lat + 8
    return (params.max_rank + 3 + items + pairs * w * -(-rows // w) - (w - 1 - (rows - 1) % w)
            + front + 3 * lat + 13)


def check(inputs, fmt, *, sim=SIM, stall=0.0, seed=0, mode=None):
    """Run, require bit-exact with a clean scoreboard, the mode, and the exact stall-free
    count."""
    params = PARAMS[fmt]
    outcome = run(UNIT, inputs, params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    problem = outcome.problem
    if mode is not None:
        assert UNIT.mode(problem, params) == mode
    if stall == 0.0:
        want = expected_cycles(params, problem["input_elements"], problem["output_elements"],
                               UNIT.mode(problem, params))
        assert outcome.cycles == outcome.expected_cycles == want
    return outcome


CASES = {
    # a gate broadcast across H ([S, 1] -> [S, H]): every beat is one item, its lanes' sum
    "gate_fp32": ("fp32", "reduce", lambda: backward_case([6, 1], [6, 8], "fp32")),
    "gate_bf16": ("bf16", "reduce", lambda: backward_case([5, 1], [5, 16], "bf16", 1)),
    # an innermost broadcast shorter than a beat: a beat adds into two or three elements
    "inner_broadcast_fp32": ("fp32", "elements", lambda: backward_case([5, 1], [5, 3],
                                                                       "fp32", 2)),
    # a kept innermost dim in whole beats (a row broadcast over tokens): rows
    "row_fp32": ("fp32", "rows", lambda: backward_case([1, 8], [5, 8], "fp32", 3)),
    "row_bf16": ("bf16", "rows", lambda: backward_case([1, 16], [3, 16], "bf16", 4)),
    # a kept innermost dim shorter than a beat: elements
    "kept_short_bf16": ("bf16", "elements", lambda: backward_case([5, 3], [4, 5, 3],
                                                                  "bf16", 5)),
    # rank 3 and more: broadcast and kept dims alternating
    "rank4_reduce_fp32": ("fp32", "reduce", lambda: backward_case([3, 1, 2, 1], [3, 4, 2, 8],
                                                                  "fp32", 6)),
    "rank4_elements_fp32": ("fp32", "elements", lambda: backward_case([4, 1, 3, 5],
                                                                      [4, 4, 3, 5], "fp32", 7)),
    # a 0-dim input: every element adds into the one input element
    "scalar_bf16": ("bf16", "reduce", lambda: backward_case([], [3, 8], "bf16", 8)),
    # a zero-sized dim: an empty run
    "empty_fp32": ("fp32", "elements", lambda: backward_case([0, 1], [3, -1, 4], "fp32")),
    # an odd number of banks (G = 7): the drain's last pass adds the last bank to +0.0;
    # 13 rows: three drain groups of W = 5, the last one short
    "odd_banks_reduce": ("fp32_l4", "reduce", lambda: backward_case([13, 4, 1], [13, 4, 8],
                                                                    "fp32_l4", 9)),
    "odd_banks_elements": ("fp32_l4", "elements", lambda: backward_case([9, 1], [9, 3],
                                                                        "fp32_l4", 10)),
    # stream mode: whole rows under one broadcast dim, a pass of at least G items (16 rows
    # >= 14 at L = 11): one bank, each row out at its last add
    "stream_row_fp32": ("fp32", "stream", lambda: backward_case([1, 64], [3, 64], "fp32", 13)),
    "stream_repeat_fp32": ("fp32", "stream", lambda: backward_case([2, 32], [3, 2, 32],
                                                                   "fp32", 14)),
    "stream_identity_fp32": ("fp32", "stream", lambda: backward_case([16, 4], [16, 4],
                                                                     "fp32", 15)),
    # 64 rows, more than the output queue's 23 slots: under stalls items wait for room
    "stream_long_l4": ("fp32_l4", "stream", lambda: backward_case([1, 256], [3, 256],
                                                                  "fp32_l4", 16)),
    # a pass of 8 rows, fewer than G = 14: rows mode and its drain
    "short_pass_rows_fp32": ("fp32", "rows", lambda: backward_case([1, 32], [3, 32],
                                                                   "fp32", 17)),
}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize(("sim", "name"), simulator_cases(CASES, cocotb=["gate_fp32"]))
def test_expand_backward_cases(sim, name, stall):
    fmt, mode, make = CASES[name]
    inputs = make()
    index = sorted(CASES).index(name)
    outcome = check(inputs, fmt, sim=sim, stall=stall, seed=index, mode=mode)
    assert list(outcome.outputs["input_grad"].shape) == list(inputs["input_shape"])


def test_expand_backward_stream_waits_for_room():
    """Stream mode with the producer always valid and a consumer ready one cycle in ten: the
    output queue (23 slots) fills, and the last pass's items wait for room: all 64 rows,
    bit-exact, in order (without the wait the queue overflows and rows are lost)."""
    params = PARAMS["fp32_l4"]
    inputs = backward_case([1, 256], [3, 256], "fp32_l4", 18)
    problem = UNIT.problem(inputs, {})
    assert UNIT.mode(problem, params) == "stream" and params.output_depth < 64
    stimulus, settings = UNIT.pack(problem, params, stall=0.0, seed=3)
    results = UNIT.simulate(params, stimulus, {**settings, "sink_stall": 0.9},
                            sim=BENCH_SIM)
    outputs = UNIT.unpack(problem, params, results)
    assert list(UNIT.score(problem, params, outputs, results)) == []
    assert int(results["cycles"]) > 5 * 64


@pytest.mark.parametrize(("fmt", "shape", "sizes"), [
    ("fp32", [6, 1], [6, 16]),          # reduce
    ("bf16", [1, 16], [7, 16]),         # rows
    ("fp32", [1, 64], [5, 64]),         # stream
    ("fp32", [3, 1, 2], [4, 3, 5, 2]),  # elements
])
def test_expand_backward_integers_match_sequential(fmt, shape, sizes):
    """Integer-valued data small enough to be exact: every summation order gives the same
    bits, so the hardware matches the plain sequential golden.expand_backward too."""
    inputs = backward_case(shape, sizes, fmt, 11, integers=True)
    outcome = check(inputs, fmt)
    want = golden.expand_backward(inputs["output_grad"], shape, sizes)
    assert bit_equal(outcome.outputs["input_grad"], want)


def test_expand_backward_order_is_visible():
    """With random data the hardware's order differs from the sequential one (so the
    bit-exact check above really checks the order)."""
    inputs = backward_case([4, 1], [4, 64], "fp32", 12)
    inputs["output_grad"] = random_floats(np.random.default_rng(12), (4, 64), np.float32,
                                          specials=0.0)
    params = PARAMS["fp32"]
    hw = golden.expand_backward_hw(inputs["output_grad"], [4, 1], [4, 64], params.lanes,
                                   params.add_latency)
    assert not bit_equal(hw, golden.expand_backward(inputs["output_grad"], [4, 1], [4, 64]))


def test_expand_backward_cycle_formula():
    """The documented formula at the defaults (fp32, L = 12: G = 15 in 8 pairs, W = 13, lanes
    16, F = 49 in reduce mode, 4 otherwise) and the benchmark's shapes: the gate [1024, 512]
    -> [1024, 1] (reduce; 64 rows in 5 groups) and the row [1024, 512] -> [1, 512] (rows; 32
    rows in 3 groups)."""
    params = ExpandBackwardParams()
    assert (params.banks, params.pairs, params.ring, params.front_latency) == (15, 8, 13, 49)
    assert params.cycles(1024, 1024 * 512, "reduce") == 9 + 32768 + 519 + 49 + 36 + 13
    # F = 4 (the address tree, the read address register) outside reduce mode: no lane tree
    assert params.short_front_latency == 4
    assert params.cycles(512, 1024 * 512, "rows") == 9 + 32768 + 305 + 4 + 36 + 13
    # stream mode: the row backward and the repeat [2, 1] backward, no drain
    assert params.cycles(512, 1024 * 512, "stream") == 9 + 32768 + 4 + 12 + 8
    assert params.cycles(1024 * 512, 2048 * 512, "stream") == 9 + 65536 + 4 + 12 + 8
    # fewer items than rows: no whole last pass, the run drains as rows mode does
    assert params.cycles(512, 256, "stream") == params.cycles(512, 256, "rows")
    assert params.cycles(3, 0, "elements") == EMPTY_CYCLES
    for args in ((1024, 1024 * 512, "reduce"), (512, 1024 * 512, "rows"), (7, 63, "elements"),
                 (512, 1024 * 512, "stream"), (512, 256, "stream")):
        assert params.cycles(*args) == expected_cycles(params, *args)


def test_expand_backward_bench_problems():
    """The benchmark's problems plan in the fast modes at lanes 16 (python -m moe_hw.bench
    expand_backward prints the simulated figures)."""
    from moe_hw.host.unit import BenchShape
    problems = UNIT.bench_problems(BenchShape())
    modes = {}
    for variant, (inputs, settings) in problems.items():
        problem = UNIT.problem(inputs, {})
        params = UNIT.params_for(problem, settings)
        modes[variant] = UNIT.mode(problem, params)
    assert modes == {"gate": "reduce", "row": "stream", "repeat": "stream", "rank5": "rows"}


@pytest.mark.parametrize(("inputs", "message"), [
    (backward_case([4, 3], [2, 4, 3], "fp32") | {"expand_size": np.array([-1, 4, 3])},
     r"expand_size\[0\] is a new dim and must be >= 1, not -1"),
    (backward_case([4, 1], [4, 2], "fp32") | {"expand_size": np.array([4, -2])},
     r"expand_size\[1\] must be >= 1 or -1 .* not -2"),
    (backward_case([4, 3], [4, 3], "fp32") | {"expand_size": np.array([4, 5])},
     r"expand_size\[1\] must be 3 or -1 .* not 5"),
    (backward_case([2], [1, 1, 1, 9, 2], "fp32"),
     r"expand_size\[4\] = 2 is past the unit's max_rank of 4"),
    (backward_case([4, 1], [4, 2], "fp32") | {"input_shape": np.array([4, -1])},
     r"input_shape\[1\] must be a non-negative size, not -1"),
    (backward_case([4, 1], [4, 2], "fp32") | {"output_grad": np.zeros((4, 3), np.float32)},
     r"output_grad must have the expanded shape \[4, 2\], not \[4, 3\]"),
    (backward_case([4, 1], [4, 2], "fp32") | {"output_grad": np.zeros((4, 2), np.float64)},
     r"output_grad must have dtype float32, float16 or bfloat16, not float64"),
    (backward_case([4, 1], [4, 2], "fp32") | {"input_shape": np.array([4.0, 1.0])},
     r"input_shape must be a one-dimensional integer array"),
    (backward_case([4, 1], [4, 2], "fp32") | {"output_grad": np.zeros((4, 2), np.float16)},
     r"output_grad has dtype float16, but the unit's format is fp32"),
    (backward_case([100], [100], "fp32"), r"input elements \(100\) exceed the unit's "
     r"max_input of 64"),
    ({"output_grad": np.zeros(3, np.float32)}, r"lacks input_shape"),
])
def test_expand_backward_bad_inputs(inputs, message):
    """One line naming the parameter and its value, before anything is built."""
    with pytest.raises(HostError, match=message):
        run(UNIT, inputs, params=PARAMS["fp32"])


def test_expand_backward_hostile_mode():
    """Stream mode driven straight into the hardware for problems that are not a stream of
    passes: the run still ends in the formula's cycles with every input beat taken and one
    output beat per row (wrong values, but no hang, no row lost or added). A gate problem
    (3 beats, 1 row: the last beat is the row), and fewer items than rows (8 beats, 16 rows:
    the run drains as rows mode does)."""
    params = PARAMS["fp32"]
    for shape, size, elements in (([3, 1], [3, 4], None), ([16, 4], [16, 4], 32)):
        problem = UNIT.problem(backward_case(shape, size, "fp32"), {})
        stimulus, settings = UNIT.pack(problem, params, stall=0.0, seed=0)
        settings["runtime"]["mode"] = BACKWARD_MODES.index("stream")
        if elements is not None:
            settings["runtime"]["output_elements"] = elements
        n_in, n_out = (settings["runtime"][name]
                       for name in ("input_elements", "output_elements"))
        results = UNIT.simulate(params, stimulus, settings)
        assert int(results["error"]) == 0
        assert int(results["cycles"]) == params.cycles(n_in, n_out, "stream")
        assert len(results["data"]) == -(-n_in // params.lanes)
        assert int(results["input_taken"]) == n_out // params.lanes


@pytest.mark.parametrize(("changes", "message"), [
    ({"lanes": 3}, "lanes must be 1, 2, 4, 8 or 16, not 3"),
    ({"format": "int8"}, "format must be fp32, fp16 or bf16, not 'int8'"),
    ({"add_stages": 0}, "add_stages must be an integer between 1 and 16, not 0"),
    ({"max_input": 0}, "max_input must be an integer between 1 and"),
])
def test_expand_backward_bad_params(changes, message):
    with pytest.raises(ParameterError, match=message):
        ExpandBackwardParams(**changes)


def test_expand_backward_run_command(tmp_path, capsys):
    """``python -m moe_hw.run expand_backward`` on an npz file (bfloat16, stored as 2-byte
    voids): ``output_grad``, ``input_shape``, ``expand_size`` in; ``input_grad`` and
    ``cycles`` out, bit-exact; a bad size fails with one line."""
    from moe_hw.run import main
    inputs = backward_case([3, 1], [3, 16], "bf16", seed=3)
    np.savez(tmp_path / "in.npz", **inputs)
    params = PARAMS["bf16"]
    sets = [f"--set={name}={getattr(params, name)}"
            for name in ("format", "lanes", "max_rank", "max_input", "max_output")]
    assert main(["expand_backward", "--in", str(tmp_path / "in.npz"), "--out",
                 str(tmp_path / "out.npz"), *sets, "--sim", FAST_SIM]) == 0
    with np.load(tmp_path / "out.npz") as out:
        assert sorted(out.files) == ["cycles", "input_grad"]
        got = out["input_grad"].view(ml_dtypes.bfloat16)
        want = golden.expand_backward_hw(inputs["output_grad"], [3, 1], [3, 16], 8,
                                         params.add_latency)
        assert bit_equal(got, want)
        assert int(out["cycles"]) == params.cycles(3, 48, "reduce")
    np.savez(tmp_path / "bad.npz", **(inputs | {"expand_size": np.array([3, 0])}))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        main(["expand_backward", "--in", str(tmp_path / "bad.npz"), "--out",
              str(tmp_path / "o.npz"), *sets])
    assert exit.value.code != 0
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "expand_size[1] must be >= 1 or -1 (input dim 1 has size 1), not 0")


def test_expand_backward_expand_size_defaults_to_the_expanded_shape():
    """Without ``expand_size`` the host plans the expanded shape itself: the same problem."""
    unit = UNIT
    inputs = backward_case([2, 1, 3], [4, 2, 5, 3], "fp32", seed=5)
    given = unit.problem(inputs, {})
    default = unit.problem({k: v for k, v in inputs.items() if k != "expand_size"}, {})
    assert default["expand_size"] == [4, 2, 5, 3]
    assert default["out_stride"] == given["out_stride"]
    assert default["output_shape"] == given["output_shape"]


def _runs_back_to_back(params, runs):
    """The runs ``(stimulus beats, meta)`` one after another on one unit in Amaranth's
    simulator; each run's ``input_grad`` beats, flat, as uint32."""
    dut = ExpandBackwardUnit(params)
    top = Module()
    top.domains.sync = ClockDomain()
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-6)
    results = []

    async def bench(ctx):
        ctx.set(dut.input_grad.ready, 1)
        for beats, meta in runs:
            for name, value in meta["runtime"].items():
                ctx.set(getattr(dut, name), value)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            plan, data, out = list(meta["plan"]), [list(b) for b in beats], []
            for _ in range(2000):
                ctx.set(dut.plan.valid, bool(plan))
                if plan:
                    ctx.set(dut.plan.payload.as_value(), plan[0])
                ctx.set(dut.grad_output.valid, bool(data))
                if data:
                    for j, value in enumerate(data[0]):
                        ctx.set(dut.grad_output.payload.data[j], int(value))
                plan_take = plan and ctx.get(dut.plan.ready)
                data_take = data and ctx.get(dut.grad_output.ready)
                if ctx.get(dut.input_grad.valid):
                    out.append([ctx.get(dut.input_grad.payload.data[j])
                                for j in range(params.lanes)])
                done = ctx.get(dut.done)
                await ctx.tick()
                if plan_take:
                    plan.pop(0)
                if data_take:
                    data.pop(0)
                if done:
                    break
            assert done and not ctx.get(dut.error)
            ctx.set(dut.plan.valid, 0)
            ctx.set(dut.grad_output.valid, 0)
            results.append(np.array(out, np.uint32).reshape(-1))

    sim.add_testbench(bench)
    sim.run()
    return results


BACK_TO_BACK = dict(format="fp32", lanes=2, max_rank=2, max_input=16, max_output=64,
                    add_stages=2)


def test_expand_backward_second_run_starts_from_clear_banks():
    """Two runs back to back on one unit (Amaranth's simulator, small sizes): the drain clears
    every bank word it reads and a stream run writes +0.0 behind each row's last add, so the
    second run's result is its own, bit for bit, with nothing left of the first. (The clear
    or the stream's +0.0 write a cycle off leaves the first run's sums in the banks: the
    second run's rows then differ.)"""
    params = ExpandBackwardParams(**BACK_TO_BACK)
    rng = np.random.default_rng(21)
    runs = []
    # a drained run (reduce), a streamed one (a row repeated), and a drained one again
    for input_shape, output_shape in (([4, 1], [4, 6]), ([1, 12], [3, 12]), ([4, 1], [4, 6])):
        grad = rng.standard_normal(output_shape).astype(np.float32)
        problem = UNIT.problem({"output_grad": grad, "input_shape": np.array(input_shape)}, {})
        stimulus, meta = UNIT.pack(problem, params, stall=False, seed=0)
        runs.append((problem, stimulus["input"], meta))
    assert [BACKWARD_MODES[meta["runtime"]["mode"]] for _, _, meta in runs] == \
        ["reduce", "stream", "reduce"]
    results = _runs_back_to_back(params, [(beats, meta) for _, beats, meta in runs])
    for (problem, _, _), got in zip(runs, results):
        want = UNIT.want(problem, params).reshape(-1).view(np.uint32)
        assert got[:want.size].tolist() == want.tolist()


@pytest.mark.parametrize("mode_shapes", [([8, 1], [8, 6]), ([1, 8], [3, 8]), ([8, 1], [8, 3])],
                         ids=["reduce", "rows", "elements"])
def test_expand_backward_never_writes_past_its_rows(mode_shapes):
    """A run whose plan addresses more input rows than its ``input_elements`` holds (a plan
    for four rows of 2 lanes, run with one row) writes none of the rows past its own: its one
    row is the golden's first, and a full run of the same problem after it on the same unit
    is bit-exact. A write past the run's rows would stay in the banks (the drain reads and
    clears a group of W = 3 rows here, so the fourth row keeps it) and add into the second
    run: without the row bound test all three cases fail. (Stream mode's rows leave by
    position, not by address, so its first run is not the golden's first row.)"""
    params = ExpandBackwardParams(**BACK_TO_BACK)
    input_shape, output_shape = mode_shapes
    grad = np.random.default_rng(5).standard_normal(output_shape).astype(np.float32)
    problem = UNIT.problem({"output_grad": grad, "input_shape": np.array(input_shape)}, {})
    stimulus, meta = UNIT.pack(problem, params, stall=False, seed=0)
    short = dict(meta, runtime=dict(meta["runtime"], input_elements=params.lanes))
    first, second = _runs_back_to_back(params, [(stimulus["input"], short),
                                                (stimulus["input"], meta)])
    want = UNIT.want(problem, params).reshape(-1).view(np.uint32)
    assert first.tolist() == want[:params.lanes].tolist()
    assert second[:want.size].tolist() == want.tolist()


@pytest.mark.parametrize("max_rank, input_shape, output_shape", [
    (1, [1], [6]),
    (3, [2, 1, 4], [2, 3, 4]),
    (5, [2, 1, 2, 1, 2], [2, 3, 2, 2, 2]),
], ids=["rank1", "rank3", "rank5"])
def test_expand_backward_odd_ranks(max_rank, input_shape, output_shape):
    """The address tree's first level sums both odometers' shares in pairs of dims, a dim
    alone in the last pair of an odd rank, and with one pair (rank 1 or 2) the item's sum is
    chosen straight after it: units of rank 1, 3 and 5 (Amaranth's simulator) are bit-exact
    on a problem of their full rank, two runs back to back. (The other tests' designs have
    ranks 2 and 4.)"""
    params = ExpandBackwardParams(**dict(BACK_TO_BACK, max_rank=max_rank))
    grad = np.random.default_rng(max_rank).standard_normal(output_shape).astype(np.float32)
    problem = UNIT.problem({"output_grad": grad, "input_shape": np.array(input_shape)}, {})
    stimulus, meta = UNIT.pack(problem, params, stall=False, seed=0)
    want = UNIT.want(problem, params).reshape(-1).view(np.uint32)
    for got in _runs_back_to_back(params, [(stimulus["input"], meta)] * 2):
        assert got[:want.size].tolist() == want.tolist()
