"""Logic levels of a synthesized ECP5 netlist, before placement: every register input's
deepest path, counted in cells reached over a routed net, and an estimate of its delay.

On this project's units the critical paths nextpnr reports are 3 to 5 LUTs with 60-80 % of
the delay in routing, and which of them a placement makes critical moves from seed to seed
(a unit's Fmax by 10-15 %). A placement takes minutes to most of an hour and shows one
path. This count takes a second after Yosys and shows every path at once, the same for
every run: how many register inputs sit 4 or more levels behind a register, and which.
Each level is a net and a cell, so a level costs about a net's delay whatever the cell.

The estimate adds nextpnr's ECP5 speed-8 figures as its reports for these units show them:
:data:`CLOCK_TO_OUT` from a register, :data:`NET` for each routed net (about the median of
the reported nets), :data:`LUT` per LUT, PFUMX or L6MUX (the two muxes follow their LUTs in
the slice, no net), :data:`CARRY_ENTRY` from an input of a carry chain to its first carry
out, :data:`CARRY_STEP` per further CCU2C, :data:`CARRY_EXIT` from the carry in to a sum,
:data:`LUT_RAM_READ` from a distributed RAM's read address to its data. A register's clock
enable and set/reset inputs need :data:`CONTROL_SETUP` more than its data input. Block RAM
and DSP outputs start at :data:`HARD_BLOCK_OUT` (their output registers are on in these
units). It ranks paths and counts them; it is not a timing analysis (routing is placement's
business): an endpoint the estimate puts at 3.8 ns may route at 3.3 or at 4.6.
"""

import json
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Endpoint", "LevelsReport", "logic_levels", "format_levels"]

CLOCK_TO_OUT = 0.40
NET = 0.60
LUT = 0.20
CARRY_ENTRY = 0.35
CARRY_STEP = 0.06
CARRY_EXIT = 0.20
LUT_RAM_READ = 0.50
CONTROL_SETUP = 0.20
HARD_BLOCK_OUT = 0.60

# A flip-flop's inputs, as the report names them.
_PINS = {"DI": "data", "M": "data", "CE": "clock enable", "LSR": "set/reset"}
_HARD_BLOCKS = ("DP16KD", "MULT18X18D", "ALU54B", "PDPW16KD")


@dataclass(frozen=True)
class Endpoint:
    """A register input (or a block RAM / DSP / LUT RAM write input) and its deepest path."""

    sink: str            # the signal the input belongs to (or the block's cell name)
    pin: str             # "data", "clock enable", "set/reset", or the block's port
    levels: int          # cells reached over a routed net, from the source register
    estimate_ns: float   # CLOCK_TO_OUT + the nets + the cells + the setup
    source: str          # the register (or port) the path starts at
    bits: int = 1        # inputs (bits) of the same signal and pin

    def to_json(self):
        return {"sink": self.sink, "pin": self.pin, "levels": self.levels,
                "estimate_ns": round(self.estimate_ns, 2), "source": self.source,
                "bits": self.bits}


@dataclass
class LevelsReport:
    """Every endpoint's levels as a histogram, and the endpoints grouped by signal and pin,
    worst first."""

    histogram: dict                       # levels -> endpoints (bits)
    groups: list = field(default_factory=list)   # of Endpoint, worst first

    def over(self, period_ns):
        """The groups whose estimate exceeds ``period_ns``."""
        return [group for group in self.groups if group.estimate_ns > period_ns]

    def deep(self, levels=4):
        """Endpoints (bits) at ``levels`` or more."""
        return sum(count for depth, count in self.histogram.items() if depth >= levels)

    def to_json(self, limit=50):
        return {"histogram": {str(k): v for k, v in sorted(self.histogram.items())},
                "endpoints": [group.to_json() for group in self.groups[:limit]]}


def _top(netlist):
    for module in netlist["modules"].values():
        if module.get("attributes", {}).get("top"):
            return module
    raise ValueError("the netlist has no top module")


def _names(module):
    """Net bit -> a readable name (the shortest public name of the signal it is a bit of)."""
    names = {}
    for name, net in module["netnames"].items():
        if net.get("hide_name") or "$" in name:
            continue
        for bit in net["bits"]:
            if isinstance(bit, int) and (bit not in names or len(name) < len(names[bit])):
                names[bit] = name
    return names


def logic_levels(netlist):
    """The :class:`LevelsReport` of a Yosys JSON netlist for ECP5 (a dict, or the path of
    ``netlist.json``): every flip-flop input, and the inputs of block RAM, DSP and LUT RAM
    cells."""
    if not isinstance(netlist, dict):
        with open(netlist) as file:
            netlist = json.load(file)
    module = _top(netlist)
    cells = module["cells"]
    names = _names(module)
    driver = {}
    for name, cell in cells.items():
        directions = cell.get("port_directions", {})
        for port, bits in cell["connections"].items():
            if directions.get(port) == "output":
                for bit in bits:
                    if isinstance(bit, int):
                        driver[bit] = (name, port)

    arrival = {}

    def inputs(cell, ports):
        for port in ports:
            for bit in cell["connections"].get(port, ()):
                if isinstance(bit, int):
                    yield bit

    def fanin(bit):
        """``(input bit, delay added, levels added)`` for each input of the combinational
        cell driving ``bit``; None where ``bit`` starts a path (a register, a block's
        output, a port)."""
        if bit not in driver:
            return None
        name, port = driver[bit]
        cell = cells[name]
        kind = cell["type"]
        if kind == "LUT4":
            return [(b, NET + LUT, 1) for b in inputs(cell, "ABCD")]
        if kind in ("PFUMX", "L6MUX21"):
            return ([(b, NET + LUT, 1) for b in inputs(cell, ("C0", "SD"))] +
                    [(b, LUT, 0) for b in inputs(cell, ("ALUT", "BLUT", "D0", "D1"))])
        if kind == "CCU2C":
            exit_ = 0.0 if port == "COUT" else CARRY_EXIT
            data = ("A0", "B0", "C0", "D0", "A1", "B1", "C1", "D1")
            # (the carry in: the chain's previous cell, its entry counted there)
            return ([(b, NET + CARRY_ENTRY + exit_, 1) for b in inputs(cell, data)] +
                    [(b, CARRY_STEP + exit_, 0) for b in inputs(cell, ("CIN",))])
        if kind == "TRELLIS_DPR16X4" and port.startswith("DO"):
            return [(b, NET + LUT_RAM_READ, 1) for b in inputs(cell, ("RAD",))]
        return None

    def resolve(root):
        """``(estimate, levels, source)`` at ``root``, the latest of its fan-in's; depth
        first without recursion: a bit's once all its inputs' are known."""
        stack = [root]
        while stack:
            bit = stack[-1]
            if bit in arrival:
                stack.pop()
                continue
            edges = fanin(bit)
            if edges is None:
                kind = cells[driver[bit][0]]["type"] if bit in driver else None
                out = HARD_BLOCK_OUT if kind in _HARD_BLOCKS else CLOCK_TO_OUT
                arrival[bit] = (out, 0, names.get(bit, "?"))
                stack.pop()
                continue
            pending = [b for b, _, _ in edges if b not in arrival]
            if pending:
                stack.extend(pending)
                continue
            arrival[bit] = max(((arrival[b][0] + delay, arrival[b][1] + levels, arrival[b][2])
                                for b, delay, levels in edges),
                               default=(CLOCK_TO_OUT, 0, "constant"))
            stack.pop()
        return arrival[root]

    endpoints = []
    for name, cell in cells.items():
        kind = cell["type"]
        if kind == "TRELLIS_FF":
            ports = tuple(_PINS)
            sink = names.get(cell["connections"]["Q"][0], name)
        elif kind in _HARD_BLOCKS or kind == "TRELLIS_DPR16X4":
            directions = cell.get("port_directions", {})
            ports = [port for port in cell["connections"]
                     if directions.get(port) == "input" and port != "WCK"
                     and not port.startswith(("CLK", "RAD"))]
            sink = name
        else:
            continue
        for port in ports:
            for bit in cell["connections"].get(port, ()):
                if not isinstance(bit, int):
                    continue
                t, levels, source = resolve(bit)
                setup = CONTROL_SETUP if port in ("CE", "LSR") else 0.0
                endpoints.append((t + NET + setup, levels, sink, _PINS.get(port, port),
                                  source))
    histogram = Counter(levels for _, levels, *_ in endpoints)
    grouped = {}
    for t, levels, sink, pin, source in endpoints:
        key = (sink, pin)
        if key not in grouped:
            grouped[key] = [t, levels, source, 1]
        else:
            entry = grouped[key]
            entry[3] += 1
            if (t, levels) > (entry[0], entry[1]):
                entry[:3] = [t, levels, source]
    groups = [Endpoint(sink=sink, pin=pin, levels=levels, estimate_ns=t, source=source,
                       bits=bits)
              for (sink, pin), (t, levels, source, bits) in grouped.items()]
    groups.sort(key=lambda group: (-group.estimate_ns, -group.levels, group.sink, group.pin))
    return LevelsReport(histogram=dict(sorted(histogram.items())), groups=groups)


def format_levels(report, period_ns, *, rows=12):
    """The histogram and the worst ``rows`` groups as text lines."""
    total = sum(report.histogram.values())
    lines = ["logic levels (register inputs by cells behind the nearest register):",
             "  " + ", ".join(f"{levels}: {count}" for levels, count in
                              report.histogram.items()) + f"  ({total} inputs)"]
    over = report.over(period_ns)
    lines.append(f"  {len(over)} signals estimated over {period_ns:.2f} ns "
                 f"({NET:g} ns a net, before placement)" + ("; the worst:" if rows else ""))
    for group in report.groups[:rows]:
        lines.append(f"  {group.estimate_ns:5.2f} ns {group.levels} levels  "
                     f"{group.source} -> {group.sink} ({group.pin}, {group.bits} "
                     f"bit{'s' if group.bits != 1 else ''})")
    return "\n".join(lines)
