"""The pipelined unsigned integer product: run-time address products such as ``index*C`` and
``slot*H``, and the tiling onto 18x18 DSP blocks that the float multiplier shares.

A single-cycle ``a * b`` of run-time values is a long path: ``synth_ecp5`` maps it onto
MULT18X18D blocks with their registers off, and the adders that join the tiles follow in the
same cycle. :func:`pipelined_product` registers the operands and the tiles' products inside the
blocks (``dsp="ecp5"``), then sums the tiles in a tree of registered adders, one level per
stage.

Latency (:func:`product_latency`): ``2 + ceil(log2(tiles))`` enabled cycles, where ``tiles``
is the number of 18x18 tiles of the operand widths; the same for ``dsp="generic"`` (a plain
``*`` between registers, for simulation and other targets), so that a unit's cycle counts do
not depend on the target.

:func:`signed_product` is the same product of two's-complement operands (the integer
layers of ``scan_layers``).
"""

from amaranth.hdl import Signal
from amaranth.utils import ceil_log2

from ..params import check_choice
from ..stream import delay
from .ecp5_dsp import mult18x18d

__all__ = ["DSP_TARGETS", "DSP_WIDTH", "dsp_tiles", "product_latency", "pipelined_product",
           "signed_product_latency", "signed_product"]

#: The ``dsp`` choices: ``"generic"`` (a plain ``*``, for simulation and any target) and
#: ``"ecp5"`` (MULT18X18D instances with their input and output registers on).
DSP_TARGETS = ("generic", "ecp5")

#: MULT18X18D: unsigned operands of up to 18 bits.
DSP_WIDTH = 18


def _chunks(width):
    return [(low, min(DSP_WIDTH, width - low)) for low in range(0, max(width, 1), DSP_WIDTH)]


def dsp_tiles(m, a, b, *, en, reg_inputs, reg_outputs, name):
    """``a * b`` as partial products on MULT18X18D blocks: a list of ``(shift, product)``
    whose sum (each product shifted left by its shift) is ``a * b``. One block per pair of
    18-bit chunks of the operands; ``reg_inputs``/``reg_outputs`` turn on the blocks' input
    and output registers, which load when ``en`` is high."""
    tiles = []
    for a_low, a_width in _chunks(len(a)):
        for b_low, b_width in _chunks(len(b)):
            block = mult18x18d(m, a[a_low:a_low + a_width], b[b_low:b_low + b_width], en=en,
                               reg_inputs=reg_inputs, reg_outputs=reg_outputs,
                               name=f"{name}_{a_low}_{b_low}")
            tiles.append((a_low + b_low, block[:a_width + b_width]))
    return tiles


def product_latency(a_width, b_width):
    """Enabled cycles from the operands to the product of :func:`pipelined_product`."""
    tiles = len(_chunks(a_width)) * len(_chunks(b_width))
    return 2 + ceil_log2(tiles)


def pipelined_product(m, a, b, *, en, dsp, name):
    """``a * b`` (unsigned), :func:`product_latency` stages later; every register loads when
    ``en`` is high. Returns the ``len(a) + len(b)``-bit product."""
    check_choice("dsp", dsp, DSP_TARGETS)
    width = len(a) + len(b)
    latency = product_latency(len(a), len(b))
    if dsp == "generic":
        a_reg = delay(m, a, 1, en, name=f"{name}_a", reset_less=True)
        b_reg = delay(m, b, 1, en, name=f"{name}_b", reset_less=True)
        product = Signal(width, name=f"{name}_product")
        m.d.comb += product.eq(a_reg * b_reg)
        return delay(m, product, latency - 1, en, name=f"{name}_p", reset_less=True)
    terms = [(shift, value) for shift, value in
             dsp_tiles(m, a, b, en=en, reg_inputs=True, reg_outputs=True, name=name)]
    level = 0
    while len(terms) > 1:
        # One registered adder per pair of terms; an odd term out waits a register.
        summed = []
        for i in range(0, len(terms), 2):
            pair = terms[i:i + 2]
            low = min(shift for shift, _ in pair)
            total = Signal(width - low, name=f"{name}_sum{level}_{i // 2}", reset_less=True)
            with m.If(en):
                m.d.sync += total.eq(sum(value << (shift - low) for shift, value in pair))
            summed.append((low, total))
        terms = summed
        level += 1
    shift, value = terms[0]
    product = Signal(width, name=f"{name}_product")
    m.d.comb += product.eq(value << shift)
    return product


def signed_product_latency(a_width, b_width):
    """Enabled cycles from the operands to the product of :func:`signed_product`."""
    width = a_width + b_width
    return product_latency(width, width)


def signed_product(m, a, b, *, en, dsp, name):
    """``a * b`` of two two's-complement values, :func:`signed_product_latency` stages later,
    as a signed value of ``len(a) + len(b)`` bits.

    It is :func:`pipelined_product` of the operands sign-extended to that width: the low
    ``width`` bits of the unsigned product are the signed product modulo ``2**width``, and the
    signed product fits ``width`` bits. Operands of up to 9 bits take one 18x18 tile (two
    cycles)."""
    width = len(a) + len(b)
    a_wide = Signal(width, name=f"{name}_a_signed")
    b_wide = Signal(width, name=f"{name}_b_signed")
    m.d.comb += [a_wide.eq(a.as_signed()), b_wide.eq(b.as_signed())]
    return pipelined_product(m, a_wide, b_wide, en=en, dsp=dsp, name=name)[:width].as_signed()
