"""The dispatch backward-data unit (SPEC 1.1 backward) on its emitted Verilog (every case
on Verilator's fast path; a few also through the cocotb bench in Verilator and Icarus), with
and without random valid/ready stalls on the header
stream, the read port's request and response streams and the output, scored bit for bit
against ``golden.dispatch_backward_data`` (``term_0 + term_1 + ...``, no leading +0.0) with
scoreboards over every output beat and every read; stall-free runs must take exactly the
documented cycle count. The hardware is the combine-gather datapath with the other summation
start rule, so the cases are the combine unit's and the tests here pin the difference."""

import numpy as np
import pytest

from moe_hw.blocks.run_control import EMPTY_CYCLES
from moe_hw.blocks.slot_address import slot_latency
from moe_hw import golden
from moe_hw.formats import to_bits
from moe_hw.host import combine_gather
from moe_hw.host.checks import HostError
from moe_hw.host.dispatch_backward_data import UNIT
from moe_hw.host.unit import run
from moe_hw.units.dispatch_backward_data import (DispatchBackwardDataParams,
                                                 DispatchBackwardDataUnit)

from conftest import SIM, STALLS, simulator_cases
from test_combine_gather import check as combine_check, gather_problem, variant

PARAMS = DispatchBackwardDataParams(format="fp32", lanes=4, max_tokens=64, max_hidden=64,
                                    max_capacity=32, max_experts=8, max_top_k=3)

CASES = {
    # DUET toy scale (S=21, E=6, H=16), one routing row ([S] arrays), every token fits.
    "duet_toy": dict(tokens=21, hidden=16, experts=6, capacity=21, k=1),
    # top-2 with capacity drops; H not a multiple of the lanes.
    "k2_drops": dict(tokens=37, hidden=29, experts=5, capacity=9, k=2),
    # Out-of-range and negative indices and locations (the field extremes are added below).
    "out_of_range": dict(tokens=30, hidden=7, experts=6, capacity=5, k=2,
                         index_range=(-3, 9), location_range=(-2, 8)),
    # NaN, Inf, subnormals and -0.0 in gates and gradients.
    "special_values": dict(tokens=24, hidden=13, experts=4, capacity=12, k=2, specials=0.4),
    # top-3, two-beat rows, experts 1 and 3 get no tokens, specials.
    "k3_empty_experts": dict(tokens=25, hidden=5, experts=5, capacity=20, k=3,
                             experts_used=[0, 2, 4], specials=0.3),
    # One-beat rows (a window is five tokens) and rows longer than a window.
    "one_beat_rows": dict(tokens=40, hidden=4, experts=3, capacity=30, k=2, specials=0.2),
    "long_rows": dict(tokens=6, hidden=64, experts=2, capacity=6, k=2, specials=0.1),
    "zero_tokens": dict(tokens=0, hidden=16, experts=2, capacity=4, k=2),
}


def problem(name):
    prob = gather_problem(CASES, name, extremes_k=1)
    if name == "duet_toy":           # the [S] form of the routing arrays
        prob = variant(prob, **{key: prob[key][0] for key in ("gates", "indices", "locations")})
    return prob


def check(prob, sim, stall, **options):
    """The combine tests' check (bit-exact, clean scoreboards, the exact stall-free cycle
    count) on this unit."""
    return combine_check(prob, sim, stall, unit=UNIT, **{"params": PARAMS, **options})


def manual(gates, indices, locations, grad, num_experts, capacity):
    """A hand-written problem."""
    return {"gates": gates, "indices": indices, "locations": locations, "buffer": grad,
            "num_experts": num_experts, "capacity": capacity}


@pytest.mark.parametrize("stall", STALLS)
@pytest.mark.parametrize("sim, name", simulator_cases(
    CASES, cocotb=["duet_toy", "out_of_range", "zero_tokens"]))
def test_dispatch_backward_data_cases(sim, name, stall):
    check(problem(name), sim, stall)


def test_dispatch_backward_data_sum_start():
    """The first term is the sum (no leading +0.0): a -0.0 product stays -0.0 for k = 1 and
    for k = 2 when the second term is -0.0 too, and -0.0 + (+0.0 of a dropped pair) is +0.0.
    The combine unit, whose sum starts from +0.0, gives +0.0 for all of these."""
    minus, plus = np.float32(-1.0), np.float32(1.0)
    grad = np.array([[0.0, 1.5, -2.0, 0.0], [0.0, 0.0, 0.0, 3.0]], dtype=np.float32)
    # token 0: -1 * row 0 (k=0), then -1 * row 1 (k=1): -0.0 + -0.0 on lane 0
    # token 1: -1 * row 0 (k=0), then a dropped pair: -0.0 + +0.0 = +0.0 on lane 0
    # token 2: +1 * row 1 (k=0), then -1 * row 0 (k=1)
    gates = np.array([[minus, minus, plus], [minus, plus, minus]], dtype=np.float32)
    indices = np.array([[0, 0, 0], [0, 5, 0]])
    locations = np.array([[0, 0, 1], [1, 0, 0]])
    outcome = check(manual(gates, indices, locations, grad, 1, 2), SIM, 0.0)
    bits = to_bits(outcome.outputs["grad_input"], "fp32")
    assert bits[0, 0] == 0x80000000                          # -0.0 + -0.0 = -0.0
    assert bits[1, 0] == bits[1, 3] == 0                     # -0.0 + +0.0 = +0.0
    one = check(manual(gates[0], indices[0], locations[0], grad, 1, 2), SIM, 0.0)
    assert to_bits(one.outputs["grad_input"], "fp32")[0, 0] == 0x80000000  # k = 1: -1 * +0.0
    combined = run(combine_gather.UNIT, {"gates": gates, "indices": indices,
                                         "locations": locations, "expert_out": grad},
                   {"capacity": 2}, params=PARAMS, sim=SIM)
    assert to_bits(combined.outputs["combined"], "fp32")[0, 0] == 0   # +0.0 + -0.0 + -0.0
    assert np.array_equal(bits, to_bits(golden.dispatch_backward_data(
        gates, indices, locations, grad, num_experts=1, capacity=2), "fp32"))


def test_dispatch_backward_data_edge_sizes():
    """top_k = 0 (every output +0.0), zero capacity or experts (every pair dropped), zero
    hidden, and a single short window, on the one build."""
    prob = problem("k2_drops")
    gates, indices, locations, grad = (prob[name] for name in
                                       ("gates", "indices", "locations", "buffer"))
    outcome = check(variant(prob, gates=gates[:0], indices=indices[:0],
                            locations=locations[:0]), SIM, 0.0)
    assert not outcome.outputs["grad_input"].view(np.uint32).any()
    for sizes in (dict(capacity=0), dict(num_experts=0)):
        outcome = check(variant(prob, buffer=grad[:0], **sizes), SIM, 0.0)
        assert not outcome.outputs["grad_input"].view(np.uint32).any()
        assert outcome.results["dropped"] == gates.size
    outcome = check(variant(prob, buffer=grad[:, :0]), SIM, 0.0)
    assert outcome.cycles == EMPTY_CYCLES and outcome.outputs["grad_input"].shape == (37, 0)
    check(variant(prob, gates=gates[:, :2], indices=indices[:, :2], locations=locations[:, :2],
                  buffer=grad[:, :3]), SIM, 0.0)
    assert DispatchBackwardDataUnit.SUM_START == "first"
    # start and setup, ring write, ring read, the pass's pair register and slot address,
    # command queue, reader command, memory, reader skid buffer, operand registers,
    # multiplier, adder operand registers, adder, output queue, its idle register and done
    assert PARAMS.overhead(2) == (PARAMS.setup + 1 + 1 + 1 + 1 + slot_latency(PARAMS) + 2 + 1 + 2
                                  + 1 + 1 + PARAMS.mul_latency + 1 + PARAMS.add_latency + 4)


def test_dispatch_backward_data_host_errors():
    inputs, runtime = UNIT.inputs_of(problem("k2_drops"))

    def attempt(settings=None, params=None, **changes):
        run(UNIT, {**inputs, **changes}, {**runtime, **(settings or {})}, params=params)

    with pytest.raises(HostError, match=r"grad_dispatch must have num_experts \* capacity = "
                                        r"36 rows \[E\*C, H\], not 45"):
        attempt({"num_experts": 4})
    with pytest.raises(HostError, match="num_experts = 5 exceeds the unit's max_experts of 2"):
        attempt(params=DispatchBackwardDataParams(max_experts=2))
    with pytest.raises(HostError, match="grad_dispatch must have 2 dimension"):
        attempt(grad_dispatch=inputs["grad_dispatch"][0])
    with pytest.raises(HostError, match="num_experts must be a non-negative integer"):
        attempt({"num_experts": -1})
