"""Seeded random problems, shared by the tests, the benchmarks and ``python -m moe_hw.run``
on a design point. Each returns a dict of the golden model's arguments."""

import numpy as np

from . import golden
from .formats import FORMATS

__all__ = ["exact_gates", "routed_problem"]


def exact_gates(rng, shape, format):
    """Gates in (0, 1), exactly representable in ``format``."""
    fmt = FORMATS[format]
    precision = fmt.mant_bits + 1
    return (rng.integers(1, 1 << precision, shape) / (1 << precision)).astype(fmt.dtype)


def routed_problem(*, tokens, hidden, experts, top_k=1, format="fp32", capacity=None,
                   capacity_factor=1.25, seed=0):
    """A top-k routing problem: ``gates`` and ``indices`` [k, S] (k distinct experts per
    token when k <= E), ``locations`` from the routing counters (so the pairs past an
    expert's capacity are the dropped ones), normal ``input`` [S, H], ``num_experts`` and
    ``capacity`` (from ``capacity_factor`` unless given)."""
    fmt = FORMATS[format]
    rng = np.random.default_rng(seed)
    if top_k <= experts:
        indices = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)], axis=1) \
            if tokens else np.zeros((top_k, 0), np.int64)
    else:
        indices = rng.integers(0, experts, (top_k, tokens))
    indices = indices.reshape(top_k, tokens).astype(np.int32)
    if capacity is None:
        capacity = golden.capacity_from_factor(capacity_factor, tokens, experts, k=top_k)
    return {"gates": exact_gates(rng, (top_k, tokens), format), "indices": indices,
            "locations": golden.compute_locations(indices, num_experts=experts),
            "input": rng.standard_normal((tokens, hidden)).astype(np.float32).astype(fmt.dtype),
            "num_experts": int(experts), "capacity": int(capacity)}
