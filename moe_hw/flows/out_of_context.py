"""The out-of-context wrapper that the synthesis flow places and routes, and the reference adder
every synthesis run measures beside the unit.

A unit has hundreds or thousands of port bits, more than any package has pins, and a path from
a pin to a register measures the pad, not the unit. :class:`OutOfContext` therefore gives a
unit registers on every port and needs four pins whatever the unit:

* ``clk`` and ``rst`` (the reset is registered once before it reaches the unit, so that it
  starts at a register too);
* ``si``: one serial input shifted through a chain of registers, one register per input bit
  of the unit; each input port bit is a register loaded from its own register of the chain.
  Every input bit therefore changes independently, so no input can be treated as a constant
  and nothing the unit computes can be optimised away. The port registers are apart from the
  chain so that the placer can put each next to the logic it drives: were the chain itself
  the port registers, each would be pulled towards its neighbours in the chain, and a path
  from an input port (a stream's ``ready``) would measure the chain's meander across the
  die, not the unit. (A port register loads the inverse of its chain bit: loading the bit
  itself, it would be the same cell as the next register of the chain, and Yosys would
  merge the two);
* ``so``: every output bit is registered, then XOR-reduced through a pipelined tree of
  registers into the one output pin. Every output bit reaches the pin, so nothing the unit
  drives is dead logic either.

The XOR tree folds :data:`FOLD` bits per register stage (one LUT4), and the chain has no
logic at all, so neither is ever the critical path: the paths that limit Fmax start and end at
the unit's own registers or at the port registers around it. (Folding 16 bits per stage made
the tree the critical path of the reference adder on ECP5: ABC builds a 16-input XOR from
LUT4s and the PFU's wide-function muxes, five levels.)
"""

from amaranth.hdl import Cat, ClockDomain, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["OutOfContext", "ReferenceAdder", "FOLD"]

#: Output bits XOR-folded into one register per stage of the output tree: one LUT4.
FOLD = 4


def _port_values(component):
    """``[(name, Value, is_input)]`` for every port of ``component``'s signature."""
    ports = []
    for path, member in component.signature.members.flatten():
        if not member.is_port:
            continue
        value = component
        for part in path:
            value = value[part] if isinstance(part, int) else getattr(value, part)
        ports.append(("__".join(str(part) for part in path), Value.cast(value),
                      member.flow == In))
    return ports


class OutOfContext(wiring.Component):
    """``unit`` with registers on every port, a serial input and an XOR-reduced output.

    Ports: ``clk``, ``rst`` (active high, registered once), ``si`` (the serial input),
    ``so`` (the XOR of every output bit of the unit, some cycles late). The unit's ``sync``
    domain is the wrapper's.

    ``input_bits`` and ``output_bits`` count the unit's port bits; ``wrapper_registers`` is
    the number of registers the wrapper itself adds, for reading the flip-flop count of a
    synthesis report.
    """

    clk: In(1)
    rst: In(1)
    si: In(1)
    so: Out(1)

    def __init__(self, unit):
        if not isinstance(unit, wiring.Component):
            raise TypeError(f"unit must be an Amaranth wiring.Component, not {unit!r}")
        self._unit = unit
        self._ports = _port_values(unit)
        super().__init__()

    @property
    def input_bits(self):
        return sum(len(value) for _, value, is_input in self._ports if is_input)

    @property
    def output_bits(self):
        return sum(len(value) for _, value, is_input in self._ports if not is_input)

    @property
    def wrapper_registers(self):
        # the input chain and the port registers, the registered reset, the output pin's
        # register, the XOR tree
        total, width = 2 * self.input_bits + self.output_bits + 2, self.output_bits
        while width > 1:
            width = -(-width // FOLD)
            total += width
        return total

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = sync = ClockDomain()
        # The reset pin is registered once (a reset-less register, so it does not reset
        # itself), so that the reset net starts at a register like every other input.
        rst_q = Signal(reset_less=True)
        m.d.sync += rst_q.eq(self.rst)
        m.d.comb += [sync.clk.eq(self.clk), sync.rst.eq(rst_q)]

        m.submodules.unit = self._unit

        # One register per port bit, named after the port, so that a critical path that
        # starts or ends at the wrapper reads "in_header__payload[3]", "out_write__valid".
        # The wrapper's registers need no reset: only the unit's registers hang on its net.
        inputs = [(Signal(len(value), name=f"in_{name}", reset_less=True), value)
                  for name, value, is_input in self._ports if is_input]
        outputs = [(Signal(len(value), name=f"out_{name}", reset_less=True), value)
                   for name, value, is_input in self._ports if not is_input]

        if inputs:
            chain = Signal(self.input_bits, name="si_chain", reset_less=True)
            m.d.sync += [chain.eq(Cat(self.si, chain[:-1])),
                         Cat(register for register, _ in inputs).eq(~chain)]
            m.d.comb += [port.eq(register) for register, port in inputs]

        if outputs:
            m.d.sync += [register.eq(port) for register, port in outputs]
            level, depth = Cat(register for register, _ in outputs), 0
            while len(level) > 1:
                folded = Signal(-(-len(level) // FOLD), name=f"out_xor{depth}",
                                reset_less=True)
                m.d.sync += folded.eq(Cat(level[start:start + FOLD].xor()
                                          for start in range(0, len(level), FOLD)))
                level, depth = folded, depth + 1
            m.d.sync += self.so.eq(level)
        else:
            m.d.sync += self.so.eq(self.si)
        return m


class ReferenceAdder(wiring.Component):
    """A registered ``width``-bit adder: ``sum`` is ``a + b`` of the cycle before.

    The synthesis flow places and routes it beside every unit, with the same wrapper, tool
    versions and seeds, and reports the unit's Fmax as a ratio to it: absolute MHz wander
    with the load of a shared machine and the tool version, the ratio much less. A 32-bit
    carry chain is about the fastest useful thing the fabric does.
    """

    def __init__(self, width=32):
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"width must be a positive integer, not {width!r}")
        self.width = width
        super().__init__({"a": In(width), "b": In(width), "sum": Out(width)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.sum.eq(self.a + self.b)
        return m
