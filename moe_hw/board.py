"""``python -m moe_hw.board``: the ULX3S bitstream of the self-checking dispatch top
(:class:`~moe_hw.flows.board.DispatchSelfCheck`), through Amaranth's platform flow.

    python -m moe_hw.board [--out DIR] [--set NAME=VALUE ...] [--seed N]

Builds for amaranth-boards' ``ULX3S_85F_Platform`` (LFE5U-85F, CABGA381, speed 6, 25 MHz
oscillator) with YoWASP's Yosys, nextpnr-ecp5 and ecppack, and prints the bitstream's path and
size, the resources and the post-route Fmax from nextpnr's report. ``--set`` changes a
parameter of the top (``format``, ``lanes``, ``pairs``, ``hidden``, ``num_experts``,
``capacity``, ``seed``, ``bram``, ``dsp``); the buffer is in DP16KD block RAM
(``bram=ecp5``: the simulated top's ``generic`` memory is small enough for Yosys to put it
in LUT RAM), the multipliers are inferred (``dsp=generic``). On the board: LED 0 lit = the
buffer's CRC-32 matched the golden model's, LED 1 = it did not, LED 2 = the check is over,
LED 7 blinks (the clock runs); button FIRE1 runs the check again.
"""

import argparse
import sys
from pathlib import Path

from .cli import parse_sets, run_main
from .flows.board import DispatchSelfCheck, build_bitstream

__all__ = ["main"]

PROG = "python -m moe_hw.board"


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/ulx3s"), metavar="DIR",
                        help="the build directory (default build/ulx3s)")
    parser.add_argument("--set", action="append", metavar="NAME=VALUE", default=[],
                        help="a parameter of the self-checking top (repeatable)")
    parser.add_argument("--seed", type=int, default=1, metavar="N",
                        help="nextpnr's placement seed (default 1)")
    args = parser.parse_args(argv)

    def body():
        # The buffer is a few dozen words: Yosys would map an inferred memory that small to
        # LUT RAM, so the board's is the project's explicit DP16KD block RAM.
        check = DispatchSelfCheck(**{"bram": "ecp5", **parse_sets(args.set)})
        print(f"[moe_hw.board] {check.pairs} pairs, H={check.hidden}, E={check.num_experts}, "
              f"C={check.capacity}, lanes={check.lanes}, {check.fmt}: expected CRC-32 "
              f"{check.checksum:#010x}, {check.cycles} cycles to done", file=sys.stderr,
              flush=True)
        result = build_bitstream(check, args.out, seed=args.seed)
        print(f"bitstream: {result['bitstream']} ({result['bytes']} bytes)")
        for column, figure in result["resources"].items():
            print(f"{column}: {figure['used']} / {figure['available']}")
        for clock, fmax in result["clocks"].items():
            print(f"Fmax {clock}: {fmax:.1f} MHz (25 MHz needed)")
        print(f"built in {result['seconds']:.0f} s")

    run_main(PROG, body)


if __name__ == "__main__":
    main()
