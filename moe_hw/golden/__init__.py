"""NumPy golden models: the specification (SPEC.md section 1) in code.

Every hardware unit is checked bit for bit against one of these. Float arithmetic is done in
the data's own format (float32, float16 or ml_dtypes.bfloat16), one rounding per operation,
sums in the documented order starting from +0.0. The scan_layers layer (``affine_layer``)
also has an integer rule: exact product and sum, one saturation to the dtype's range.
"""

from .combine import combine_gather
from .dispatch import (dispatch_backward_data, dispatch_backward_gate, dispatch_dropped,
                       dispatch_forward)
from .expert_parallel import ep_dispatch
from .expand import (PhysicalExpand, contiguous_strides, expand, expand_backward,
                     expand_backward_hw, expand_strides, physical_expand, repeat)
from .layer import expert_stacks, moe_layer, top_k_routing
from .locations import capacity_from_factor, compute_locations, expert_counts
from .rerouting import moe_re_routing
from .scan import (affine_layer, prefix_sum, scan, scan_layers, scan_layers_backward,
                   stack_layer_params, token_sum)
from .sparse import expert_to_gates, sparse_combine, sparse_dispatch, sparse_dispatch_indices

__all__ = [
    "dispatch_forward", "dispatch_dropped", "dispatch_backward_data", "dispatch_backward_gate",
    "compute_locations", "expert_counts", "capacity_from_factor",
    "sparse_dispatch_indices", "sparse_dispatch", "sparse_combine", "expert_to_gates",
    "combine_gather",
    "moe_re_routing",
    "expand", "expand_backward", "expand_backward_hw", "repeat", "expand_strides", "physical_expand",
    "PhysicalExpand", "contiguous_strides",
    "scan", "scan_layers", "stack_layer_params", "prefix_sum", "affine_layer",
    "scan_layers_backward", "token_sum",
    "moe_layer", "top_k_routing", "expert_stacks",
    "ep_dispatch",
]
