"""Simulated cycles per second: the fast path against the cocotb path, same run.

    python benchmarks/fast_sim.py [--lanes 1 4 16] [--tokens 1024] [--hidden 512]
                                  [--top-k 1] [--no-cocotb] [--point tutel_swin]

For dispatch at each lane count, on the benchmark problem of ``python -m moe_hw.bench``
(``--tokens`` x ``--hidden``, E=8, top-1 as in the README's dispatch figures, fp32), the
same packed stimulus runs through
``Unit.simulate`` on the fast path (Verilator) and on the cocotb bench (Verilator). Each
simulator's model is built first (the build time is printed apart), then the run is timed:
stimulus files written, simulation, results read back. Both runs are checked to give the
same cycle count and results.

``--point NAME`` also times ``python -m moe_hw.run NAME`` end to end (a subprocess: Verilog
emission, the Verilator build when not cached, the run and the check). Figures are printed,
never asserted.
"""

import argparse
import re
import subprocess
import sys
import time

import numpy as np

from moe_hw.host.dispatch import UNIT
from moe_hw.host.unit import BenchShape


def timed_simulate(params, stimulus, settings, sim):
    """``(results, seconds, core seconds)``: core is the fast path's own time from the
    clock's start to done (None for cocotb)."""
    core = []

    def progress(text):
        found = re.match(r"simulated \d+ cycles in ([0-9.]+) s", text)
        if found:
            core.append(float(found.group(1)))

    started = time.perf_counter()
    results = UNIT.simulate(params, stimulus, settings, sim=sim, progress=progress)
    seconds = time.perf_counter() - started
    results.pop("harness", None)              # the fast path's counters: not a bench result
    return results, seconds, (core or [None])[0]


def lanes_row(lanes, shape, cocotb):
    (inputs, settings), = UNIT.bench_problems(BenchShape(**{**shape, "lanes": lanes})).values()
    gen, runtime = UNIT.split_settings(settings)
    problem = UNIT.problem(inputs, runtime)
    params = UNIT.params_for(problem, gen)
    stimulus, bench_settings = UNIT.pack(problem, params, stall=0.0, seed=0)
    row = {"lanes": lanes}
    for sim in ["fast"] + (["verilator"] if cocotb else []):
        # The first run builds the model (or finds it built); the second is the one timed.
        _, first, _ = timed_simulate(params, stimulus, bench_settings, sim)
        results, seconds, core = timed_simulate(params, stimulus, bench_settings, sim)
        row[sim] = (int(results["cycles"]), seconds, first - seconds, results, core)
    if cocotb:
        fast, slow = row["fast"][3], row["verilator"][3]
        same = sorted(fast) == sorted(slow) and all(
            np.array_equal(np.asarray(fast[key]), np.asarray(slow[key])) for key in slow)
        row["same"] = same and row["fast"][0] == row["verilator"][0]
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--top-k", dest="top_k", type=int, default=1)
    parser.add_argument("--no-cocotb", action="store_true", help="time the fast path only")
    parser.add_argument("--point", help="also time python -m moe_hw.run POINT end to end")
    args = parser.parse_args(argv)
    shape = {"tokens": args.tokens, "hidden": args.hidden, "top_k": args.top_k}
    print(f"dispatch: {args.tokens} tokens x {args.hidden}, E=8, top-{args.top_k}, fp32, "
          "no stalls")
    print("fast: the whole run (files written, simulator, results read back); fast core: "
          "the simulator from the clock's start to done")
    print(f"{'lanes':>5}  {'cycles':>9}  {'fast cyc/s':>11}  {'fast run s':>10}  "
          f"{'core cyc/s':>11}  {'cocotb cyc/s':>12}  {'cocotb run s':>12}  {'speed-up':>8}  "
          "same")
    for lanes in args.lanes:
        row = lanes_row(lanes, shape, not args.no_cocotb)
        cycles, fast_s, build_s, _, core = row["fast"]
        line = (f"{lanes:>5}  {cycles:>9}  {cycles / fast_s:>11.0f}  {fast_s:>10.2f}  "
                f"{cycles / core:>11.0f}")
        if "verilator" in row:
            _, slow_s, _, _, _ = row["verilator"]
            line += (f"  {cycles / slow_s:>12.0f}  {slow_s:>12.2f}  {slow_s / fast_s:>7.0f}x  "
                     f"{'yes' if row['same'] else 'NO'}")
        print(line + f"   (fast build/first run extra: {build_s:.1f} s)", flush=True)
    if args.point:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "moe_hw.run", args.point],
                              capture_output=True, text=True)
        wall = time.perf_counter() - started
        print(done.stdout.strip())
        print(f"python -m moe_hw.run {args.point}: exit {done.returncode}, wall time "
              f"{wall:.1f} s end to end")
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
