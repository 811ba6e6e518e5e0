"""A compiler wrapper that keeps Verilator's runtime objects between builds.

Every Verilator model links the same runtime: Verilator's own (``verilated.cpp``, its VPI,
DPI and thread support). Compiling it is about 20 s of a small model's build, repeated for
every design. (cocotb's ``verilator.cpp`` is not among them: it includes the model's own
``Vtop.h``.) Verilator's makefiles run
each compile as ``$(OBJCACHE) $(CXX) ... -c -o NAME.o SOURCE.cpp``; with ``OBJCACHE`` set to
this script (:func:`moe_hw.flows.sim_build._setup_verilator` does it, unless ``OBJCACHE`` is
already set, for example to ccache), a compile of a runtime source into one of the runtime
objects is looked up in a cache directory (``MOE_HW_OBJCACHE_DIR``) by its whole command
line and the source's size and time: a hit copies the object and its dependency file, a miss
compiles and keeps them, unless the dependency file names a header of the build directory
(a relative path: the object would then depend on the model). Every other compile (the
model's own files) runs as it is.

Run as a script (``python objcache.py CXX ARGS...``): it imports nothing of moe_hw, so it
starts in tens of milliseconds.
"""

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


def main(args):
    cache = os.environ.get("MOE_HW_OBJCACHE_DIR")
    if cache and "-c" in args and "-o" in args[:-1]:
        code = _cached_compile(args, cache)
        if code is not None:
            return code
    return subprocess.call(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
