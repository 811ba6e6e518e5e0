"""The one declaration of a unit, and the one way every unit is run on its emitted Verilog.

Each unit ``U`` declares itself once, in ``moe_hw/host/U.py``, as an instance of a
:class:`Unit` subclass. The declaration carries everything the entry points need:

* what it is: ``name``, ``summary``, ``golden`` (the golden model it is checked against);
* the hardware: ``params`` (its :class:`~moe_hw.params.UnitParams` class) and ``build``
  (params -> component);
* the adapter, which turns a user's tensors into a simulation and back:
  :meth:`Unit.problem` (check the tensors), :meth:`Unit.params_for` (size the hardware to
  them), :meth:`Unit.pack` (stimulus for the cocotb bench ``sim/bench_U.py``),
  :meth:`Unit.unpack` (the bench's results -> the golden model's outputs) and
  :meth:`Unit.score` (bit for bit against the golden model, plus the scoreboard);
* the analytic stall-free cycle count :meth:`Unit.cycles` and the one-beat-per-cycle ideal
  :meth:`Unit.ideal_cycles`;
* the benchmark problem :meth:`Unit.bench_problems`, and a design point's random problem
  :meth:`Unit.point_inputs` (by default the benchmark's at the point's sizes).

``python -m moe_hw.gen``, ``run``, ``bench`` (and the synthesis and exploration flows) read
only this declaration (through :mod:`moe_hw.registry`); :func:`run` below is the one driver.

A :class:`Composition` chains several units' hardware on the host (``moe_hw/host/C.py``,
``COMPOSITION = C()``): each unit runs through :func:`run`, the host moves the data between
them, and the whole is checked against one golden model. It has no Verilog of its own, so
``python -m moe_hw.run`` knows it and ``gen emit``, ``bench`` and ``synth`` do not.
"""

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..flows.fastsim import FAST_SIMULATORS, FastCheckError, harness_line
from ..formats import FORMATS
from ..params import ParameterError, canonical_name, check_choice
from .checks import HostError, check_count, check_stall_seed

__all__ = ["Unit", "Composition", "Outcome", "BenchShape", "run", "AXI_READ_PARAMS"]

#: :attr:`Unit.axi_params` of a unit with a memory read port: 256 beats in flight (its row
#: reader's in-flight queue, ``max_outstanding``; 16 on chip). Through the wrapper's AXI
#: read master the round trip is the memory's latency plus about 10 cycles of the master's
#: own; with 16 in flight combine_gather moved 0.328 and 0.132 of a beat per cycle at RAM
#: latencies 20 and 100, with 256 0.987 and 0.982.
AXI_READ_PARAMS = {"max_outstanding": 256}


@dataclass(frozen=True)
class BenchShape:
    """The one problem ``python -m moe_hw.bench units`` puts through every unit."""

    tokens: int = 1024
    hidden: int = 512
    experts: int = 8
    top_k: int = 2
    lanes: int = 16
    format: str = "fp32"
    capacity: int | None = None    # slots per expert; None: the unit's default capacity factor


#: A design point's ``[problem]`` keys that size the benchmark problem, and the BenchShape
#: fields they set (:meth:`Unit.point_inputs`).
POINT_SHAPE = {"tokens": "tokens", "hidden": "hidden", "num_experts": "experts",
               "top_k": "top_k", "format": "format", "capacity": "capacity"}


@dataclass
class Outcome:
    """What one run of a unit gave."""

    unit: str
    params: object
    problem: dict
    outputs: dict                  # the golden model's output names, plus ``cycles``
    results: dict                  # the bench's raw results (write logs, counters)
    cycles: int
    ideal_cycles: int              # one beat per cycle
    expected_cycles: int | None    # the analytic stall-free count (None: not defined)
    stall: float
    problems: list | None = None   # the score's findings; None when not checked
    report: list = field(default_factory=list)
    harness: dict | None = None    # the fast path's counters and flags (None on cocotb)

    @property
    def efficiency(self):
        return self.ideal_cycles / self.cycles if self.cycles else float("nan")

    @property
    def passed(self):
        return self.problems == []


class Unit:
    """Base of every unit's declaration. Subclasses set the class attributes and implement
    the adapter methods; see the module docstring."""

    name = None                # the unit's one name: units/U.py, host/U.py, sim/bench_U.py
    summary = ""
    golden = ""                # the golden model(s), e.g. "golden.dispatch_forward"
    params = None              # the UnitParams subclass
    inputs = ()                # npz input keys
    optional = ()              # npz input keys that may be left out
    outputs = ()               # npz output keys (``cycles`` is added)
    runtime = ()               # run-time values, from --set or scalars in the npz
    ideal = "one beat per cycle"   # what ideal_cycles counts, for reports
    axi_rows = {}              # AXI wrapper: {stream: size} for streams of token rows
    axi_names = {}             # AXI wrapper: {port: bus name} (a port's name otherwise)
    axi_reads = {}             # AXI wrapper: {read port: (request, response)} not X_request
    # AXI wrapper: defaults of the unit's own parameters behind the bus, under the user's
    # settings (``make_params(..., interface="axi")``): a read port's beats in flight must
    # cover the bus's round trip, about a hundred cycles to DDR, where on chip 16 do.
    axi_params = {}

    @property
    def bench(self):
        """The cocotb bench module in ``sim/``."""
        return f"bench_{self.name}"

    # ---- hardware --------------------------------------------------------------------
    def build(self, params):
        """The component for ``params``."""
        raise NotImplementedError

    def build_axi(self, params, axi=None, *, own_clock=True):
        """The component for ``params`` behind AXI interfaces (:mod:`moe_hw.axi`), with the
        wrapper's parameters ``axi`` (an :class:`~moe_hw.axi.AxiParams`); ``own_clock``:
        see :class:`~moe_hw.axi.AxiWrapper`."""
        from ..axi import AxiWrapper
        return AxiWrapper(self.build(params), name=self.name, axi=axi, rows=self.axi_rows,
                          names=self.axi_names, reads=self.axi_reads, own_clock=own_clock)

    def make_params(self, settings=None, base=None, *, interface="native"):
        """``params`` from ``settings`` (name -> value) on top of ``base``; unknown names are
        an error listing the known ones; old names are accepted with a deprecation warning.
        ``interface="axi"``: :attr:`axi_params` under both."""
        names = [f.name for f in dataclasses.fields(self.params)]
        values = {}
        under = self.axi_params if interface == "axi" else {}
        for name, value in [*under.items(), *(base or {}).items(), *(settings or {}).items()]:
            name = canonical_name(name, self.params)
            if name not in names:
                raise ParameterError(f"unit {self.name} has no parameter {name!r}; its "
                                     f"parameters are {', '.join(names)}")
            values[name] = value
        return self.params(**values)

    # ---- adapter ---------------------------------------------------------------------
    def problem(self, inputs, runtime):
        """Check the npz arrays ``inputs`` and the run-time values ``runtime``; return the
        problem as a dict (canonical arrays and sizes). Raises HostError naming the input."""
        raise NotImplementedError

    def params_for(self, problem, settings):
        """The parameters for ``problem``: ``settings`` (a dict) on top of the smallest
        maxima that hold it. Raises HostError when a given maximum is too small."""
        raise NotImplementedError

    def pack(self, problem, params, *, stall, seed):
        """``(stimulus arrays, settings dict)`` for the bench."""
        raise NotImplementedError

    def unpack(self, problem, params, results):
        """The bench's results -> the output arrays (golden names, without ``cycles``)."""
        raise NotImplementedError

    def score(self, problem, params, outputs, results):
        """Bit-for-bit comparison with the golden model and the scoreboard's checks: a list
        of findings, empty when the run is right."""
        raise NotImplementedError

    def ideal_cycles(self, problem, params):
        """One beat per cycle."""
        raise NotImplementedError

    def cycles(self, problem, params):
        """The exact stall-free cycle count, from the unit's formula (None: not defined)."""
        return None

    def fast(self, stimulus, settings):
        """The fast path's description of one run (a :class:`~moe_hw.flows.fastsim.FastBench`)
        from the bench's ``stimulus`` and ``settings`` (what :meth:`pack` gives, with
        ``stall`` and ``seed``); ``None``: the unit has no fast path yet."""
        return None

    @property
    def has_fast(self):
        return type(self).fast is not Unit.fast

    def describe(self, problem, params):
        """One line naming the problem and the design point."""
        return f"{self.name}"

    def point_inputs(self, problem, seed=0):
        """Random ``(inputs, run-time values)`` at a design point's ``[problem]`` table
        (gen/*.toml). By default the benchmark problem (:meth:`bench_problems`) at the
        table's ``tokens``, ``hidden``, ``num_experts``, ``top_k``, ``format`` and
        ``capacity`` (BenchShape's defaults for the others), its ``variant`` (default: the
        first); any other key is one of the unit's run-time values, set over the benchmark's.
        The generation-time parameters are the point's ``[params]``, not these."""
        sizes, runtime = self.point_table(problem, (*POINT_SHAPE, "variant"))
        check_choice("format", sizes.get("format", "fp32"), list(FORMATS))
        shape = BenchShape(**{POINT_SHAPE[name]: value for name, value in sizes.items()
                              if name in POINT_SHAPE})
        variants = self.bench_problems(shape, seed)
        variant = sizes.get("variant", next(iter(variants)))
        if variant not in variants:
            raise HostError(f"[problem] variant must be one of {', '.join(map(repr, variants))} "
                            f"for unit {self.name}, not {variant!r}")
        inputs, settings = variants[variant]
        runtime = {**self.split_settings(settings)[1], **runtime}
        if "capacity" in sizes and runtime.get("capacity") != sizes["capacity"]:
            raise HostError(f"[problem] capacity = {sizes['capacity']}: unit {self.name}'s "
                            "problem has no capacity")
        return inputs, runtime

    def point_table(self, problem, sizes, required=()):
        """A design point's ``[problem]`` table split into ``(sizes, run-time values)``:
        ``sizes`` names the keys that size the random problem (``required`` the ones it
        cannot do without); every other key must be a run-time value of the unit."""
        for name in required:
            if name not in problem:
                raise HostError(f"unit {self.name}'s design point needs [problem] {name}")
        chosen = {name: value for name, value in problem.items() if name in sizes}
        runtime = {name: value for name, value in problem.items() if name not in sizes}
        for name, value in runtime.items():
            if name not in self.runtime:
                raise HostError(f"[problem] {name} = {value!r}: unit {self.name} has no such "
                                f"size or run-time value; known: "
                                f"{', '.join([*sizes, *self.runtime])}")
        return chosen, runtime

    def bench_problems(self, shape, seed=0):
        """The benchmark: ``{variant: (inputs, settings)}`` at ``shape`` (a BenchShape);
        ``settings`` mixes generation-time parameters and run-time values."""
        raise NotImplementedError

    # ---- shared helpers ----------------------------------------------------------------
    def inputs_of(self, problem):
        """``(inputs, run-time values)`` for :func:`run` from a problem dict of the golden
        model's arguments (one of :mod:`moe_hw.problems`)."""
        return ({name: problem[name] for name in self.inputs},
                {name: problem[name] for name in self.runtime})

    def simulator(self, sim):
        """``sim`` as this unit runs it: the fast path ("fast", "fast-icarus") falls back to
        the cocotb bench in the same simulator when the unit has no fast description."""
        if sim in ("fast", "fast-icarus") and not self.has_fast:
            return "verilator" if sim == "fast" else "icarus"
        return sim

    def simulate(self, params, stimulus, settings, *, sim="verilator", stall=0.0, seed=0,
                 progress=None, expected_cycles=None, trace=None):
        """Drive the bench with ``stimulus`` and ``settings`` as given, with no checks (how a
        test puts a size above its maximum or a hostile value in front of the hardware);
        returns the bench's raw results."""
        from ..flows.simulate import simulate
        return simulate(lambda: self.build(params), self.name, self.bench, stimulus,
                        sim=self.simulator(sim),
                        settings={**settings, "stall": float(stall), "seed": int(seed)},
                        progress=progress, key=(self.name, params),
                        fast=self.fast if self.has_fast else None,
                        expected_cycles=expected_cycles, trace=trace)

    def split_settings(self, settings):
        """``(generation-time parameters, run-time values)`` from one ``--set`` dict."""
        names = {f.name for f in dataclasses.fields(self.params)}
        params, runtime = {}, {}
        for name, value in (settings or {}).items():
            if name in self.runtime:
                runtime[name] = value
                continue
            name = canonical_name(name, self.params)
            if name in names:
                params[name] = value
            else:
                known = sorted(names) + list(self.runtime)
                raise ParameterError(f"unit {self.name} has no parameter or run-time value "
                                     f"{name!r}; known: {', '.join(known)}")
        return params, runtime

    def sized(self, settings, **smallest):
        """``params`` from ``smallest`` (the maxima the problem needs) overridden by
        ``settings``; a given maximum below what the problem needs is a HostError."""
        for name, need in smallest.items():
            given = settings.get(name)
            if isinstance(need, (int, np.integer)) and isinstance(given, (int, np.integer)) \
                    and not isinstance(given, bool) and given < need:
                raise HostError(f"the problem needs {name} >= {need}, but {name} = {given}")
        try:
            return self.make_params(settings, base=smallest)
        except ParameterError as error:
            # A maximum sized to the problem (not given) that no unit can have: say so.
            for name, need in smallest.items():
                if name not in settings and str(error).startswith(f"{name} "):
                    raise ParameterError(f"the problem needs {name} = {need}, which the unit "
                                         f"cannot have: {error}") from None
            raise


def run(unit, inputs, settings=None, *, params=None, sim="verilator", stall=0.0, seed=0,
        check=True, progress=None, trace=None, reset_at=None):
    """Run ``unit`` (a :class:`Unit`) on the npz-style ``inputs`` (a dict of arrays).

    ``settings`` mixes generation-time parameters and run-time values (``--set``);
    ``params`` (a parameter object) replaces the generation-time ones; ``sim`` "fast" (the
    default of the command line) falls back to cocotb in Verilator for a unit without a fast
    description; ``trace`` (fast path only) writes a waveform there. ``reset_at`` (cocotb
    benches only): first start an old problem and reset it that many cycles after its start
    (``sim/harness.py``, ``reset_mid_problem``); the results then hold ``reset_busy``.
    Returns an :class:`Outcome`; with ``check`` its ``problems`` list the differences from
    the golden model (the caller decides whether they are fatal). On the fast path the
    outcome's ``harness`` holds the testbench's counters (a report line sums them up); a run
    that fails a check names its waveform (see :func:`failure_waveform`).
    """
    check_stall_seed(stall, seed)
    gen_settings, runtime = unit.split_settings(settings)
    problem = unit.problem(inputs, runtime)
    if params is None:
        params = unit.params_for(problem, gen_settings)
    elif gen_settings:
        params = dataclasses.replace(params, **gen_settings)
    stimulus, bench_settings = unit.pack(problem, params, stall=float(stall), seed=int(seed))
    if reset_at is not None:
        if unit.simulator(sim) not in ("verilator", "icarus"):
            raise HostError(f"reset_at needs a cocotb bench (sim verilator or icarus), not "
                            f"{sim}")
        reset_at = check_count("reset_at", reset_at)
        bench_settings = {**bench_settings, "reset_at": reset_at}
    def simulate(trace):
        return unit.simulate(params, stimulus, bench_settings, sim=sim, stall=stall, seed=seed,
                             progress=progress, expected_cycles=unit.cycles(problem, params),
                             trace=trace)

    try:
        results = simulate(trace)
    except FastCheckError as error:
        waveform = failure_waveform(unit, sim, trace, simulate)
        if waveform is None:
            raise
        raise FastCheckError(f"{error}; waveform of the failing run: {waveform}") from error
    harness = results.pop("harness", None)
    outputs = unit.unpack(problem, params, results)
    cycles = int(results["cycles"])
    outcome = Outcome(unit.name, params, problem, {**outputs, "cycles": np.int64(cycles)},
                      results, cycles, unit.ideal_cycles(problem, params),
                      unit.cycles(problem, params), float(stall), harness=harness)
    outcome.report.append(unit.describe(problem, params))
    if harness:
        outcome.report.append(harness_line(harness))
    line = (f"cycles: {cycles} (ideal {outcome.ideal_cycles}, efficiency "
            f"{outcome.efficiency:.4f}")
    if outcome.expected_cycles is not None and stall == 0:
        line += f"; the formula gives {outcome.expected_cycles}"
    outcome.report.append(line + ")")
    if check:
        outcome.problems = list(unit.score(problem, params, outputs, results))
        if stall == 0 and outcome.expected_cycles is not None and \
                cycles != outcome.expected_cycles:
            outcome.problems.append(f"{cycles} cycles, but the stall-free formula gives "
                                    f"{outcome.expected_cycles}")
        if outcome.problems:
            waveform = failure_waveform(unit, sim, trace, simulate)
            if waveform is not None:
                outcome.problems.append(f"waveform of the failing run: {waveform}")
            outcome.report.append(f"check: DIFFERS from {unit.golden}: "
                                  + "; ".join(outcome.problems))
        else:
            outcome.report.append(f"check: bit-exact against {unit.golden}; scoreboard clean "
                                  "(nothing lost, duplicated, reordered or out of bounds)")
    return outcome


def failure_waveform(unit, sim, trace, simulate):
    """The waveform of a failing fast-path run: ``trace`` if the run wrote one; else, when
    ``MOE_HW_FAILURE_WAVEFORMS`` names a folder (the tests set it), the run again with a
    trace into a new file there (the run is deterministic: its seed drives the pauses), FST
    from Icarus and VCD from Verilator (whose FST needs lz4's headers). ``None``: no
    waveform (the cocotb path, or no folder)."""
    if unit.simulator(sim) not in FAST_SIMULATORS:
        return None
    if trace is not None:
        return Path(trace)
    folder = os.environ.get("MOE_HW_FAILURE_WAVEFORMS")
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    handle, path = tempfile.mkstemp(prefix=f"{unit.name}-{sim}-", dir=folder,
                                    suffix=".fst" if sim == "fast-icarus" else ".vcd")
    os.close(handle)
    try:
        simulate(path)
    except FastCheckError:
        pass                            # the same failure again, now with its waveform
    return Path(path)


class Composition:
    """Base of a host-level composition's declaration (see the module docstring).

    Subclasses set the class attributes and implement :meth:`run` (the composition's
    :class:`Outcome`) and :meth:`random_inputs` (its problem when no input file is given)."""

    name = None                # host/C.py, tests/test_C.py
    summary = ""
    golden = ""                # the golden model of the whole path
    units = ()                 # the units it runs, by name
    inputs = ()                # npz input keys
    optional = ()              # npz input keys that may be left out
    outputs = ()               # npz output keys (``cycles`` is added)
    runtime = ()               # run-time values, from --set or scalars in the npz
    settings = ()              # generation-time settings it passes on to its units
    random_problem = {}        # name -> default: the problem run when no input file is given

    def run(self, inputs, settings=None, *, params=None, sim="verilator", stall=0.0, seed=0,
            check=True, progress=None):
        """Run the units on ``inputs`` (npz-style arrays) and score the whole against the
        golden model: an :class:`Outcome` (``params``: the units' parameters by unit name)."""
        raise NotImplementedError

    def random_inputs(self, settings, seed=0):
        """``(inputs, settings)``: seeded random inputs at :attr:`random_problem`, whose
        entries ``settings`` may override (they are taken out of the returned settings)."""
        raise NotImplementedError

    def describe_random(self, settings):
        """The random problem's sizes, ``settings`` over the defaults, for a progress line."""
        return ", ".join(f"{name}={(settings or {}).get(name, default)}"
                         for name, default in self.random_problem.items())
