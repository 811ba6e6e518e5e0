"""moe_re_routing behind its AXI wrapper (``--set interface=axi``), on its emitted Verilog
with cocotbext-axi (sim/bench_moe_re_routing_axi.py): one AxiRam holds ``tokens`` (read
through the read master: rows of H = 29 and 13 bf16 elements start off the 64-bit bus words)
and ``permute_tokens`` (written through the write master), with reads and writes in flight
at once; AxiLiteMaster programs and starts the run; the counts and scales come in and
``expert_token_num`` and the per-token writes go out on AXI4-Streams; with and without random
pauses on every stream and every RAM channel. The four outputs are compared bit for bit with
golden.moe_re_routing; every burst is checked (INCR, length, 4 KiB, reads inside ``tokens``,
no byte written outside ``permute_tokens``)."""

import dataclasses

import numpy as np
import pytest

from moe_hw.axi import AxiParams
from moe_hw.host.moe_re_routing import random_problem, run_axi
from moe_hw.units.moe_re_routing import MoeReRoutingParams

from conftest import simulator_params

PARAMS = MoeReRoutingParams(format="bf16", lanes=4, count_type="int32", scales=True,
                            max_tokens=64, max_hidden=32, max_ranks=4, max_experts=8,
                            max_blocks=32)
AXI = AxiParams(axi_max_burst=16, axi_outstanding=2, axi_fifo_depth=64)


@pytest.mark.parametrize("hidden, stall, idx_type", [(29, 0.0, 0), (13, 0.3, 1)])
def test_moe_re_routing_axi(hidden, stall, idx_type):
    inputs = random_problem(np.random.default_rng(hidden), 48, hidden, 3, 5, "bf16",
                            scales=True)
    _, results, findings = run_axi(inputs, {"expert_token_num_type": 1, "idx_type": idx_type},
                                   PARAMS, AXI, stall=stall, seed=4)
    assert findings == [], "\n".join(findings)
    assert results["read_bursts"] > 0 and results["write_bursts"] > 0


@pytest.mark.parametrize("sim", simulator_params("icarus"))
def test_moe_re_routing_axi_icarus(sim):
    """On Icarus (the four-state check), reads and writes in flight at once, with pauses on
    every stream and RAM channel and both masters' FIFOs in DP16KD blocks (their simulation
    model)."""
    inputs = random_problem(np.random.default_rng(13), 48, 13, 3, 5, "bf16", scales=True)
    _, results, findings = run_axi(inputs, {"expert_token_num_type": 1, "idx_type": 1},
                                   PARAMS, dataclasses.replace(AXI, axi_bram="ecp5"),
                                   sim=sim, stall=0.3, seed=4)
    assert findings == [], "\n".join(findings)
    assert results["read_bursts"] > 0 and results["write_bursts"] > 0
