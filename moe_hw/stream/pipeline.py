"""Fixed-latency pipelines with a global stall.

Arithmetic blocks (the float multiplier and adder) are pure pipelines: every register stage
loads when ``en`` is high. :class:`PipelineControl` turns such a pipeline into a stream stage:
it tracks which stages hold a valid item and stalls the whole pipeline only when the last
stage holds an item the consumer does not take. Bubbles inside the pipeline therefore never
cost throughput: with ``o_ready`` high the pipeline accepts one item per cycle, and an empty
output stage never blocks the input.
"""

from amaranth.hdl import Cat, Const, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["KEPT", "PipelineControl", "RegisterCopies", "delay", "kept_signal", "lut_increment",
           "replicated"]

#: The attributes of a register kept apart from every other register: Yosys merges registers
#: that load the same value bit by bit (``opt_merge``), but not two flip-flop cells that both
#: carry ``keep``. Amaranth puts a signal's attributes on its wire, not on the flip-flop cell
#: that drives it, so the synthesis flow copies ``keep`` from such a wire to its flip-flops
#: before it synthesizes (``moe_hw.flows.synth.YOSYS_PREPARE``); in the emitted Verilog the
#: attribute is on the ``reg``, where vendor tools look for it. For a copy per bank or per
#: lane of an address or a flag, as many copies as needed (:class:`RegisterCopies` makes at
#: most four kinds from reset values and inversions, and needs no flow step).
KEPT = {"keep": 1}


def kept_signal(shape, *, name, **kwargs):
    """A ``Signal`` (``shape``, ``name``, further keyword arguments as ``Signal``'s) whose
    register the synthesis flow keeps apart from registers loading the same value
    (:data:`KEPT`)."""
    return Signal(shape, name=name, attrs=KEPT, **kwargs)


def delay(m, value, latency, en, *, name="delayed", reset_less=False):
    """``value`` delayed by ``latency`` register stages that load when ``en`` is high.

    ``reset_less`` for data that is read only beside a valid flag of its own: such registers
    then leave the reset out of their slices' set/reset input, so that the reset net reaches
    only the registers that hold state (on ECP5 it otherwise fans out to every register of
    every pipeline, and a register whose slice has a data-dependent set/reset must have the
    reset folded into that logic)."""
    for stage in range(latency):
        reg = Signal.like(value, name=f"{name}_{stage}", reset_less=reset_less)
        with m.If(en):
            m.d.sync += reg.eq(value)
        value = reg
    return value


def lut_increment(value):
    """``value + 1`` modulo ``2**len(value)``, written as bit k = ``value[k]`` XOR the AND of
    the bits below it: for a narrow counter (a few bits), which Yosys then maps into LUTs
    beside its register. Written as ``value + 1`` it becomes a carry chain, a macro that
    nextpnr places as a whole, and not always near the register: scan's slot (5 bits) went
    over a 1.2 ns net into its chain 11 rows away and back over 1.05 ns (237.9 MHz)."""
    value = Value.cast(value)
    bits = [value[0] ^ 1]
    for k in range(1, len(value)):
        bits.append(value[k] ^ value[:k].all())
    return Cat(*bits)


def thermometer_up(code):
    """A count in thermometer code (bit k: more than k) plus one: the code shifted up, a one
    in at bit 0, so that a step is one choice per bit, no carry chain (the top bit falls out:
    the count never passes ``len(code)``)."""
    code = Value.cast(code)
    return Cat(Const(1, 1), code[:-1])


def thermometer_down(code):
    """A count in thermometer code less one (it is not zero): the code shifted down."""
    code = Value.cast(code)
    return Cat(code[1:], Const(0, 1))


class RegisterCopies:
    """``copies`` registers of ``width`` bits that take the same loads (``eq``), one for each
    group of a wide fan-out: a flag or a counter whose value chooses, enables or addresses
    the bits of a wide datapath, so that no single register, and no logic computed from it
    alone, drives every group. ``values`` reads them (one value per copy).

    Yosys merges registers with the same input bit by bit (``opt_merge``), and then the
    identical logic behind them, which would undo the copies. The copies therefore differ in
    every bit: copy k has the reset value all ones when k is odd (all zeros when even), and
    copies 2 and 3 hold the inverted value (read back through an inverter that folds into the
    LUTs after them). A bit has two values and two reset values: four kinds at most.

    ``apart`` (the default): the copies are also kept apart from the register they copy (a
    register with reset value 0 taking the same loads, which copy 0 would merge with): they
    are made from the last kinds, copy 3 first (the inverted value, reset all ones: it reads
    0 from reset, like that register), at most three. The others read all ones from reset,
    so a copy is read only after a load (or where its reset value is not used)."""

    def __init__(self, width, *, name, copies=3, apart=True):
        if not 1 <= copies <= (3 if apart else 4):
            raise ValueError(f"copies must be 1 to {3 if apart else 4}, not {copies!r}")
        self._registers = []
        self.values = []
        for copy in (range(3, 3 - copies, -1) if apart else range(copies)):
            invert = Const((1 << width) - 1 if copy >= 2 else 0, width)   # unsigned
            reg = Signal(width, name=f"{name}_{copy}", init=-(copy % 2) % (1 << width))
            self._registers.append((reg, invert))
            self.values.append(reg ^ invert if copy >= 2 else reg)

    def eq(self, value):
        """The statements that load every copy with ``value``."""
        return [reg.eq(value ^ invert) for reg, invert in self._registers]


def replicated(m, value, *, name, copies=2, en=None, apart=False):
    """``copies`` (1 to 4; with ``apart``, 1 to 3) :class:`RegisterCopies` that each load
    ``value`` every cycle (or in the cycles of ``en``, when given): one copy of a broadcast
    value (a gate every lane multiplies by) for each group of lanes of a wide datapath.
    Returns the copies' values (``value`` a cycle late, each). The reset value is never
    used: a copy is read only after a load.

    ``apart``: the copies are also kept apart from the register that ``value`` is the next
    value of (a register with reset value 0 loading ``value`` every cycle)."""
    copy_registers = RegisterCopies(len(value), name=name, copies=copies, apart=apart)
    with m.If(1 if en is None else en):
        m.d.sync += copy_registers.eq(value)
    return copy_registers.values


class PipelineControl(wiring.Component):
    """Valid tracking and stall for a ``latency``-stage pipeline.

    Inputs ``i_valid`` (an item enters) and ``o_ready`` (the consumer takes the item at the
    output); outputs ``en`` (every stage advances; the producer's ``ready``) and ``o_valid``.
    With ``latency == 0`` the pipeline is combinational and ``en``/``o_valid`` pass through.
    """

    def __init__(self, latency):
        self.latency = latency
        super().__init__({"i_valid": In(1), "o_ready": In(1),
                          "en": Out(1), "o_valid": Out(1), "busy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        if self.latency == 0:
            m.d.comb += [self.en.eq(self.o_ready), self.o_valid.eq(self.i_valid)]
            return m
        m.d.comb += self.en.eq(self.o_ready | ~self.o_valid)
        valids = []
        valid = self.i_valid
        for stage in range(self.latency):
            valid = delay(m, valid, 1, self.en, name=f"valid{stage}")
            valids.append(valid)
        m.d.comb += [self.o_valid.eq(valid), self.busy.eq(Cat(*valids).any())]
        return m
