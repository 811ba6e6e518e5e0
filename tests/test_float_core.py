"""The float cores' shared helpers on their own: the two-step right shift with its sticky
bit (every amount) and the two-step leading-zero count (every value of a small width),
against Python."""

import numpy as np
import pytest
from amaranth.hdl import Module, Signal

from conftest import comb_outputs
from moe_hw.arith.float_core import leading_zeros, shift_bits, shift_right_sticky_step

WIDTH = 13           # odd: the shifter's two halves differ, the count's last group is short
MAX_SHIFT = 15


def _shifter(inverted):
    m = Module()
    value = Signal(WIDTH)
    amount = Signal(4)
    sticky_in = Signal()
    coarse_bits, fine_bits = shift_bits(MAX_SHIFT)
    inverted_amount = ~amount if inverted else None
    coarse, sticky = shift_right_sticky_step(m, value, sticky_in, amount, coarse_bits,
                                             name="coarse", inverted_amount=inverted_amount)
    shifted, sticky = shift_right_sticky_step(m, coarse, sticky, amount, fine_bits,
                                              name="fine", inverted_amount=inverted_amount)
    out_value, out_sticky = Signal(WIDTH), Signal()
    m.d.comb += [out_value.eq(shifted), out_sticky.eq(sticky)]
    return m, (value, amount, sticky_in), (out_value, out_sticky)


@pytest.mark.parametrize("inverted", [False, True], ids=["amount", "inverted-copy"])
def test_shift_right_sticky(inverted):
    m, inputs, outputs = _shifter(inverted)
    rng = np.random.default_rng(5)
    # Every amount, against values that have a single one (each position), none, all, and
    # random ones; the sticky bit in both states.
    values = ([0, (1 << WIDTH) - 1] + [1 << bit for bit in range(WIDTH)]
              + [int(v) for v in rng.integers(0, 1 << WIDTH, 24)])
    cases = [(v, s, k) for v in values for s in range(MAX_SHIFT + 1) for k in (0, 1)]
    seen = comb_outputs(m, inputs, outputs, cases)
    assert len(seen) == len(cases)
    for (v, s, k), got in zip(cases, seen):
        assert got == (v >> s, int(k or (v & ((1 << s) - 1)) != 0)), (v, s, k)


def test_leading_zeros_every_value():
    m = Module()
    value = Signal(WIDTH)
    count = Signal(8)
    m.d.comb += count.eq(leading_zeros(m, value, name="zeros"))
    seen = comb_outputs(m, [value], [count], [(v,) for v in range(1 << WIDTH)])
    assert seen == [(WIDTH - v.bit_length(),) for v in range(1 << WIDTH)]
