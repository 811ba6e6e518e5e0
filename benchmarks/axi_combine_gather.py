"""combine_gather through its AXI wrapper: cycles and efficiency against one read beat per
cycle, with the expert buffer in a cocotbext-axi ``AxiRam`` whose read data comes
``latency`` cycles after each burst's address (README, "AXI wrappers").

    python benchmarks/axi_combine_gather.py [--tokens 256] [--hidden 512] [--lanes 8]
        [--experts 8] [--top-k 1] [--latency 20 100] [--outstanding 8]
        [--unit-outstanding 256] [--sim verilator]

Each run is bit-exact against ``golden.combine_gather`` (the same checks as
tests/test_combine_gather_axi.py) before its figures are printed. ``cycles`` counts from
the AXI-Lite write that starts the run to ``irq``; ``ideal`` is one read beat per cycle
(max(k, 1)*S*ceil(H/lanes)). The unit keeps at most ``--unit-outstanding`` reads in flight
(its ``max_outstanding``; behind AXI 256 by default, 16 on chip): the bus's round trip
must fit in it for one beat per cycle.
Options and table: benchmarks/axi_dispatch.py.
"""

import sys

from axi_dispatch import arguments, table

from moe_hw.axi import AxiParams
from moe_hw.host.combine_gather import UNIT, run_axi
from moe_hw.host.unit import AXI_READ_PARAMS
from moe_hw.problems import gather_problem


def main(argv=None):
    args = arguments(__doc__, argv, extra={
        "unit-outstanding": (AXI_READ_PARAMS["max_outstanding"],
                             "the unit's max_outstanding (reads in flight)")})
    problem = gather_problem(0, tokens=args.tokens, hidden=args.hidden, experts=args.experts,
                             k=args.top_k)
    inputs, runtime = UNIT.inputs_of(problem)
    params = UNIT.params_for(UNIT.problem(inputs, runtime),
                             {"lanes": args.lanes, "max_outstanding": args.unit_outstanding})
    axi = AxiParams(axi_outstanding=args.outstanding)
    ideal = UNIT.ideal_cycles(UNIT.problem(inputs, runtime), params)
    print(f"combine_gather via AXI: {args.tokens} tokens x {args.hidden}, top-{args.top_k}, "
          f"E={args.experts}, C={problem['capacity']}, lanes {args.lanes} fp32 "
          f"({args.lanes * 32}-bit bus), max burst {axi.axi_max_burst}, outstanding "
          f"{axi.axi_outstanding}, unit max_outstanding {args.unit_outstanding}; ideal "
          f"{ideal} cycles")

    def run(latency, progress):
        _, results, findings = run_axi(problem, params, axi, sim=args.sim, latency=latency,
                                       progress=progress)
        return results, findings

    return table(args.latency, ideal, run)


if __name__ == "__main__":
    sys.exit(main())
