"""The AXI wrapper's two masters synthesized alone, out of context, so that their Fmax is
read without a unit beside them (README, "AXI wrappers"):

    python benchmarks/axi_masters.py [--lanes 8] [--seeds 1] [--first-seed 1] [--freq 250]
                                     [--only write] [--work DIR]

``write``: :class:`~moe_hw.axi.WriteRealign` into :class:`~moe_hw.axi.AxiWriteMaster`, the
write port of dispatch at ``lanes`` fp32 lanes; ``read``: :class:`~moe_hw.axi.AxiReadMaster`
serving a row reader's read port. Both with the wrapper's defaults (256-beat bursts, 8
outstanding, 512-word FIFOs in DP16KD blocks). Each prints the synthesis table of
``python -m moe_hw.synth`` (reference adder, Fmax, ratio, resources, critical path).
"""

import argparse
import sys

from amaranth.hdl import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In

from moe_hw.axi import AxiParams, AxiReadMaster, AxiWriteMaster, WriteRealign
from moe_hw.blocks.row_reader import request_layout, response_layout
from moe_hw.flows.synth import format_table, synthesize

ADDR_WIDTH = 24          # element addresses of the unit's port
WIDTH = 32               # fp32


class WritePath(wiring.Component):
    """A unit's write port (``i``) through the realigner into the write master."""

    def __init__(self, lanes, axi):
        layout = data.StructLayout({"addr": ADDR_WIDTH, "data": data.ArrayLayout(WIDTH, lanes),
                                    "enable": lanes})
        self.realign = WriteRealign(layout)
        self.master = AxiWriteMaster("m_axi_w", lanes=lanes, width=WIDTH,
                                     word_width=self.realign.word_width,
                                     addr_width=axi.axi_addr_width,
                                     max_burst=axi.axi_max_burst,
                                     outstanding=axi.axi_outstanding,
                                     fifo_depth=axi.axi_fifo_depth, bram="ecp5")
        self.bus = {name: member for name, member in self.master.signature.members.items()
                    if name != "i"}
        super().__init__({"i": In(stream.Signature(layout)), **self.bus})

    def elaborate(self, platform):
        m = Module()
        m.submodules.realign, m.submodules.master = self.realign, self.master
        wiring.connect(m, wiring.flipped(self.i), self.realign.i)
        wiring.connect(m, self.realign.o, self.master.i)
        for name, member in self.bus.items():
            outer, inner = getattr(self, name), getattr(self.master, name)
            m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
        return m


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=1,
                        help="the first placement seed (--seeds 4 --first-seed 5: seeds 5-8)")
    parser.add_argument("--freq", type=float, default=250.0)
    parser.add_argument("--only", choices=("write", "read"), default=None)
    parser.add_argument("--work", default=None,
                        help="keep the netlists, logs and nextpnr reports in WORK/write, "
                             "WORK/read")
    args = parser.parse_args(argv)
    axi = AxiParams()
    builds = {
        "write": lambda: WritePath(args.lanes, axi),
        "read": lambda: AxiReadMaster(
            "m_axi_r", request_layout(args.lanes, ADDR_WIDTH),
            response_layout(args.lanes, WIDTH), addr_width=axi.axi_addr_width,
            max_burst=axi.axi_max_burst, outstanding=axi.axi_outstanding,
            fifo_depth=axi.axi_fifo_depth, bram="ecp5"),
    }
    for name, build in builds.items():
        if args.only and name != args.only:
            continue
        report = synthesize(f"{name} master", build, "ecp5-85k", seeds=args.seeds,
                            first_seed=args.first_seed, freq=args.freq,
                            work_dir=args.work and f"{args.work}/{name}",
                            description=f"AXI {name} master, lanes "
                            f"{args.lanes} fp32",
                            progress=lambda text: print(f"[axi masters] {text}",
                                                        file=sys.stderr, flush=True))
        print(format_table(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
