"""A compiler wrapper that keeps Verilator's runtime objects between builds.

Every Verilator model links the same runtime: Verilator's own (``verilated.cpp``, its VPI,
DPI and thread support). Compiling it is about 20 s of a small model's build, repeated for
every design. (cocotb's ``verilator.cpp`` is not among them: it includes the model's own
``Vtop.h``.) Verilator's makefiles run
each compile as ``$(OBJCACHE) $(CXX) ... -c -o NAME.o SOURCE.cpp``; with ``OBJCACHE`` set to
this script (:func:`moe_hw.flows.simulate._setup_verilator` does it, unless ``OBJCACHE`` is
already set, for example to ccache), a compile of a runtime source into one of the runtime
objects is looked up in a cache directory (``MOE_HW_OBJCACHE_DIR``) by its whole command
line and the source's size and time: a hit copies the object and its dependency file, a miss
compiles and keeps them, unless the dependency file names a header of the build directory
(a relative path: the object would then depend on the model). Every other compile (the
model's own files) runs as it is.

A model's precompiled header is built once for both of its uses. Verilator's makefiles build
it twice, as ``Vtop__pch.h.fast.gch`` with ``OPT_FAST`` and ``.slow.gch`` with ``OPT_SLOW``;
when a level given after both (the test suite's ``-CFLAGS -O0``) makes the two compiles
alike (the last ``-O`` flag is the one the compiler takes), the second waits for the first
and links its file: about 4 s of every test model's build (82 MB headers for moe_layer).

Run as a script (``python objcache.py CXX ARGS...``): it imports nothing of moe_hw, so it
starts in tens of milliseconds.
"""

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

#: The objects kept: Verilator's runtime.
RUNTIME = ("verilated.o", "verilated_vpi.o", "verilated_dpi.o", "verilated_threads.o",
           "verilated_cov.o", "verilated_vcd_c.o", "verilated_fst_c.o")


def _model_free(dep):
    """Whether the dependency file ``dep`` names only absolute paths (no header of the
    model's build directory)."""
    try:
        text = open(dep).read()
    except OSError:
        return False
    names = text.replace("\\\n", " ").split(":", 1)[-1].split()
    return all(os.path.isabs(name) for name in names)


def _cached_compile(args, cache):
    """Compile ``args`` through the cache; the compiler's exit code."""
    out = args[args.index("-o") + 1]
    source = args[-1]
    if os.path.basename(out) not in RUNTIME or not source.endswith(".cpp") \
            or not os.path.isfile(source):
        return None
    info = os.stat(source)
    key = repr((args, os.path.abspath(source), info.st_size, info.st_mtime_ns))
    entry = os.path.join(cache, hashlib.sha1(key.encode()).hexdigest()[:20])
    dep = os.path.splitext(out)[0] + ".d"
    if os.path.isfile(os.path.join(entry, "object")):
        shutil.copy(os.path.join(entry, "object"), out)
        if os.path.isfile(os.path.join(entry, "depend")):
            shutil.copy(os.path.join(entry, "depend"), dep)
        return 0
    code = subprocess.call(args)
    if code == 0 and _model_free(dep):
        os.makedirs(cache, exist_ok=True)
        staging = tempfile.mkdtemp(prefix="staging.", dir=cache)
        shutil.copy(out, os.path.join(staging, "object"))
        if os.path.isfile(dep):
            shutil.copy(dep, os.path.join(staging, "depend"))
        try:
            os.rename(staging, entry)
        except OSError:                       # another build kept it first
            shutil.rmtree(staging, ignore_errors=True)
    return code


#: The precompiled headers of a model, one per half of its code.
PCH_SUFFIXES = (".fast.gch", ".slow.gch")


def _shared_header(args):
    """Build the precompiled header ``args`` makes, or link the one an alike compile made
    in the same directory; the compiler's exit code, or ``None`` for any other compile."""
    out = args[args.index("-o") + 1]
    if not out.endswith(PCH_SUFFIXES) or "-x" not in args:
        return None
    stem = out[:-len(".fast.gch")]
    levels = [arg for arg in args if arg.startswith("-O")]
    alike = [stem if arg == out else arg for arg in args if not arg.startswith("-O")]
    directory = os.path.dirname(out) or "."
    headers = sorted((name, os.stat(name).st_size, os.stat(name).st_mtime_ns)
                     for name in glob.glob(os.path.join(directory, "*.h")))
    key = hashlib.sha1(repr((alike, levels[-1:], headers)).encode()).hexdigest()[:20]
    kept = os.path.join(directory, f".pch-{key}.gch")
    with open(os.path.join(directory, f".pch-{key}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(out):
            os.unlink(out)                    # never write through a link to the other
        if os.path.isfile(kept):
            _link(kept, out)
            return 0
        code = subprocess.call(args)
        if code == 0:
            _link(out, kept)
        return code


def _link(source, target):
    try:
        os.link(source, target)
    except OSError:                           # a file system without hard links
        shutil.copyfile(source, target)


def main(args):
    if "-o" in args[:-1]:
        code = _shared_header(args)
        if code is not None:
            return code
    cache = os.environ.get("MOE_HW_OBJCACHE_DIR")
    if cache and "-c" in args and "-o" in args[:-1]:
        code = _cached_compile(args, cache)
        if code is not None:
            return code
    return subprocess.call(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
