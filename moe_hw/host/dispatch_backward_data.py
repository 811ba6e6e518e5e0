"""The dispatch_backward_data unit's declaration and host adapter (SPEC 1.1 backward):
``grad_input[i] = sum over k of gates[k, i] * grad_dispatch[index*C + location]``, summed as
``term_0 + term_1 + ...`` (no leading +0.0), scored against
``golden.dispatch_backward_data``. The hardware, the run and the scoreboards are the
combine_gather unit's (:class:`~moe_hw.host.combine_gather.CombineGather`).

npz inputs: ``gates``, ``indices``, ``locations`` ([S] or [k, S]), ``grad_dispatch``
[E*C, H]; run-time ``num_experts``, ``capacity`` and ``memory_latency`` (the memory model's,
default 2). Output: ``grad_input`` [S, H].
"""

from .. import golden
from ..units.dispatch_backward_data import DispatchBackwardDataParams, DispatchBackwardDataUnit
from .checks import HostError, runtime_int
from . import combine_gather
from .combine_gather import CombineGather

__all__ = ["UNIT", "DispatchBackwardData", "run_axi"]


class DispatchBackwardData(CombineGather):
    name = "dispatch_backward_data"
    summary = ("dispatch backward, data: gates * grad_dispatch[index*C+location], "
               "term_0 + term_1 + ... over k (SPEC 1.1)")
    golden = "golden.dispatch_backward_data"
    params = DispatchBackwardDataParams
    component = DispatchBackwardDataUnit
    buffer = "grad_dispatch"
    result = "grad_input"
    inputs = ("gates", "indices", "locations", "grad_dispatch")
    outputs = ("grad_input",)
    runtime = ("num_experts", "capacity", "memory_latency")

    def expert_sizes(self, buffer, runtime, inputs):
        num_experts = runtime_int("num_experts", runtime, inputs)
        capacity = runtime_int("capacity", runtime, inputs)
        if buffer.shape[0] != num_experts * capacity:
            raise HostError(f"grad_dispatch must have num_experts * capacity = "
                            f"{num_experts * capacity} rows [E*C, H], not {buffer.shape[0]}")
        return num_experts, capacity

    def reference(self, problem):
        return golden.dispatch_backward_data(problem["gates"], problem["indices"],
                                             problem["locations"], problem["buffer"],
                                             num_experts=problem["num_experts"],
                                             capacity=problem["capacity"])


UNIT = DispatchBackwardData()


def run_axi(problem, params, axi=None, **kwargs):
    """Run ``problem`` (a :func:`~moe_hw.problems.gather_problem` dict, ``buffer`` the
    ``grad_dispatch`` rows) through dispatch_backward_data behind its AXI wrapper, on the
    combine unit's cocotbext-axi bench (the same ports): ``(outputs, results, findings)``,
    ``grad_input`` against ``golden.dispatch_backward_data``
    (:func:`moe_hw.host.combine_gather.run_axi`, whose keywords it takes)."""
    return combine_gather.run_axi(problem, params, axi, unit=UNIT, **kwargs)
