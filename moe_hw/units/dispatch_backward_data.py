"""The dispatch backward-data unit (SPEC 1.1 backward, tutel / MLU-OPS)::

    grad_input[i, :] = gates[i] * grad_dispatch[indices[i]*C + locations[i], :]   valid pair
                     = +0.0                                                         otherwise

and for top-k ([k, S] routing) the per-k terms summed in k order, ``term_0 + term_1 + ...``
with no leading +0.0 (``golden.dispatch_backward_data``).

This is the datapath of :class:`~moe_hw.units.combine_gather.CombineGatherUnit` (gather rows
by (index, location), gate-multiply, sum over k in k order, tokens out in token order) with
the other summation start rule, ``"first"``: the sum starts from -0.0, the exact IEEE additive
identity, so it is ``term_0`` bit for bit (a -0.0 product stays -0.0) and then
``term_0 + term_1 + ...``. An invalid pair's term is +0.0, read from nowhere. Ports, streams,
schedule and the exact cycle count are those of the combine unit; the expert buffer behind the
read port holds ``grad_dispatch`` [E*C, H].
"""

from .combine_gather import CombineGatherParams, CombineGatherUnit

__all__ = ["DispatchBackwardDataParams", "DispatchBackwardDataUnit"]


class DispatchBackwardDataParams(CombineGatherParams):
    """Generation-time parameters of :class:`DispatchBackwardDataUnit` (those of the combine
    unit)."""


class DispatchBackwardDataUnit(CombineGatherUnit):
    """``grad_input`` of dispatch: gather, gate-multiply, ``term_0 + term_1 + ...``."""

    SUM_START = "first"
    PARAMS = DispatchBackwardDataParams
