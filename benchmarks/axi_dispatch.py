"""Dispatch through its AXI wrapper: cycles and efficiency against one beat per cycle, with
the expert buffer in a cocotbext-axi ``AxiRam`` whose write responses come ``latency`` cycles
after each burst (README, "AXI wrappers").

    python benchmarks/axi_dispatch.py [--tokens 256] [--hidden 512] [--lanes 8]
        [--experts 8] [--top-k 1] [--latency 20 100] [--outstanding 8] [--sim verilator]

Each run is bit-exact against ``golden.dispatch_forward`` (the same checks as
tests/test_dispatch_axi.py) before its figures are printed. ``cycles`` counts from the
AXI-Lite write that starts the run to ``irq``; ``ideal`` is one data beat per cycle
(k*S*ceil(H/lanes)); ``native`` is the bare unit's exact stall-free count
(``DispatchParams.overhead`` included), for comparison. benchmarks/axi_combine_gather.py
measures combine_gather's reads the same way (:func:`arguments`, :func:`table`).
"""

import argparse
import sys
import time

from moe_hw.axi import AxiParams
from moe_hw.host.dispatch import UNIT, run_axi
from moe_hw.problems import routed_problem


def arguments(doc, argv, **defaults):
    """The AXI benchmarks' shared options (problem shape, latencies, wrapper), parsed."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=defaults.get("tokens", 256))
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=1)
    parser.add_argument("--latency", type=int, nargs="+", default=[20])
    parser.add_argument("--outstanding", type=int, default=AxiParams().axi_outstanding,
                        help="the wrapper's axi_outstanding (default: its default)")
    parser.add_argument("--sim", default="verilator")
    for name, (default, help) in defaults.get("extra", {}).items():
        parser.add_argument(f"--{name}", type=int, default=default, help=help)
    return parser.parse_args(argv)


def table(latencies, ideal, run):
    """Run ``run(latency, progress)`` (returning ``(results, findings)``) at each latency and
    print cycles, efficiency against ``ideal`` and the bursts; 1 on a finding, else 0."""
    print(f"{'latency':>8} {'cycles':>8} {'eff':>6} {'bursts':>7} {'mean beats':>11} "
          f"{'wall s':>7}")
    for latency in latencies:
        start = time.perf_counter()
        results, findings = run(latency, lambda line: print(f"  ({line})", file=sys.stderr))
        if findings:
            print("\n".join(findings))
            return 1
        cycles = int(results["cycles"])
        beats = results["burst_beats"]
        print(f"{latency:>8} {cycles:>8} {ideal / cycles:>6.3f} {len(beats):>7} "
              f"{beats.mean():>11.1f} {time.perf_counter() - start:>7.1f}")
    return 0


def main(argv=None):
    args = arguments(__doc__, argv)
    problem = routed_problem(tokens=args.tokens, hidden=args.hidden, experts=args.experts,
                             top_k=args.top_k, seed=0)
    params = UNIT.params_for(problem, {"lanes": args.lanes})
    axi = AxiParams(axi_outstanding=args.outstanding)
    ideal = UNIT.ideal_cycles(problem, params)
    native = UNIT.cycles(problem, params)
    print(f"dispatch via AXI: {args.tokens} tokens x {args.hidden}, top-{args.top_k}, "
          f"E={args.experts}, C={problem['capacity']}, lanes {args.lanes} fp32 "
          f"({args.lanes * 32}-bit bus), max burst {axi.axi_max_burst}, outstanding "
          f"{axi.axi_outstanding}; ideal {ideal} cycles, bare unit {native} cycles")

    def run(latency, progress):
        _, results, findings = run_axi(problem, params, axi, sim=args.sim, latency=latency,
                                       progress=progress)
        return results, findings

    return table(args.latency, ideal, run)


if __name__ == "__main__":
    sys.exit(main())
