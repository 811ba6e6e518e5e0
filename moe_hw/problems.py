"""Seeded random problems, shared by the tests, the benchmarks and ``python -m moe_hw.run``
on a design point. Each returns a dict of the golden model's arguments."""

import numpy as np

from . import golden
from .formats import FORMATS, format_of_dtype
from .golden.testing import random_floats

__all__ = ["exact_gates", "routed_locations", "routed_problem", "topk_gates", "layer_gates", "softmax_gates", "gather_problem", "backward_gate_problem"]


def exact_gates(rng, shape, format):
    """Gates in (0, 1), exactly representable in ``format``."""
    fmt = FORMATS[format]
    precision = fmt.mant_bits + 1
    return (rng.integers(1, 1 << precision, shape) / (1 << precision)).astype(fmt.dtype)


def routed_locations(rng, indices, experts, location_range=None):
    """Locations for ``indices`` [k, S]: from the routing counters
    (``golden.compute_locations``, indices clipped into ``[0, experts)``), or, with
    ``location_range``, uniform in it (possibly out of range: hostile headers)."""
    if location_range is not None:
        return rng.integers(*location_range, np.shape(indices))
    return golden.compute_locations(np.clip(indices, 0, max(experts - 1, 0)),
                                    num_experts=max(experts, 1)).astype(np.int64)


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


def topk_gates(rng, tokens, experts, k, dtype=np.float32, *, specials=0.0,
                      allowed=None):
    """A gate matrix [S, E] with k routed experts per token (chosen among ``allowed``, default
    all) with gates in [0.05, 1); with ``specials``, gate values include NaN, +Inf,
    subnormals, the maximum and +0.0 (the last meaning "not routed after all")."""
    allowed = np.arange(experts) if allowed is None else np.asarray(allowed)
    gates = np.zeros((tokens, experts), dtype=dtype)
    for i in range(tokens):
        chosen = rng.permutation(allowed)[:k]
        if specials:
            gates[i, chosen] = np.abs(random_floats(rng, len(chosen), dtype, specials=specials))
        else:
            gates[i, chosen] = rng.uniform(0.05, 1.0, len(chosen)).astype(dtype)
    return gates


def layer_gates(rng, tokens, experts, k, dtype=np.float32, *, experts_used=None,
                       specials=0.0):
    """A top-k gate matrix [S, E]: k distinct experts per token (drawn from ``experts_used``,
    default all) with gates in (0, 1], the rest +0.0 or -0.0 (not routed). ``specials``: the
    fraction of routed gates replaced by NaN, +Inf or a subnormal."""
    used = np.arange(experts) if experts_used is None else np.asarray(experts_used)
    if k > len(used):
        raise ValueError(f"k ({k}) must not exceed the experts used ({len(used)})")
    gates = np.where(rng.random((tokens, experts)) < 0.5, 0.0, -0.0).astype(np.float32)
    gates = gates.astype(dtype)
    fmt = format_of_dtype(gates.dtype)
    for i in range(tokens):
        chosen = used[rng.permutation(len(used))[:k]]
        values = rng.uniform(0.05, 1.0, k).astype(np.float32).astype(dtype)
        for j, expert in enumerate(chosen):
            if rng.random() < specials:
                bits = rng.choice([fmt.quiet_nan, fmt.exp_max << fmt.mant_bits,
                                   int(rng.integers(1, 1 << fmt.mant_bits))])
                values[j] = np.array(bits, fmt.uint_dtype).view(fmt.dtype)
            gates[i, expert] = values[j]
    return gates


def softmax_gates(rng, tokens, experts, k, dtype=np.float32):
    """Softmax-top-k-like gates [S, E]: k distinct experts per row, gates in (0.05, 1)."""
    gates = np.zeros((tokens, experts), dtype)
    for i in range(tokens):
        chosen = rng.choice(experts, min(k, experts), replace=False)
        gates[i, chosen] = rng.uniform(0.05, 1.0, len(chosen)).astype(np.float32).astype(dtype)
    return gates


def gather_problem(seed, *, tokens, hidden, experts, capacity=None, k=1, dtype=np.float32,
                    specials=0.0, index_range=None, location_range=None, experts_used=None):
    """A seeded gather problem: ``gates``, ``indices``, ``locations`` [k, S], ``buffer``
    [E*C, H], ``num_experts`` and ``capacity``.

    Indices are k distinct experts per token drawn from ``experts_used`` (default: all), with
    locations from the routing counters (``golden.compute_locations``), unless
    ``index_range`` / ``location_range`` ask for uniform (possibly out-of-range) values.
    ``capacity`` defaults to ``golden.capacity_from_factor(1.0, S, E, k)``. Gates and the
    buffer are ``random_floats`` with ``specials`` NaN/Inf/subnormal/+-0.0.
    """
    rng = np.random.default_rng(seed)
    used = np.arange(experts) if experts_used is None else np.asarray(experts_used)
    if index_range is None:
        indices = used[_top_k_routing(rng, tokens, len(used), k)] if len(used) else \
            np.zeros((k, tokens), np.int64)
    else:
        indices = rng.integers(*index_range, (k, tokens))
    if capacity is None:
        capacity = golden.capacity_from_factor(1.0, tokens, max(experts, 1), k=k)
    locations = routed_locations(rng, indices, experts, location_range)
    gates = random_floats(rng, (k, tokens), dtype, specials=specials)
    buffer = random_floats(rng, (experts * capacity, hidden), dtype, specials=specials)
    return {"gates": gates, "indices": indices.astype(np.int64), "locations": locations,
            "buffer": buffer, "num_experts": int(experts), "capacity": int(capacity)}


def backward_gate_problem(*, tokens, hidden, experts, top_k=1, format="fp32", capacity=None,
                          seed=0):
    """A random top-k problem (``moe_hw.problems.routed_problem``'s routing and token rows)
    with a normal ``grad_dispatch`` [E*C, H]: ``(inputs, run-time values)``."""
    routed = routed_problem(tokens=tokens, hidden=hidden, experts=experts, top_k=top_k,
                            format=format, capacity=capacity, seed=seed)
    rng = np.random.default_rng([seed, 1])
    rows = routed["num_experts"] * routed["capacity"]
    grad = rng.standard_normal((rows, hidden)).astype(np.float32).astype(FORMATS[format].dtype)
    return ({"input": routed["input"], "indices": routed["indices"],
             "locations": routed["locations"], "grad_dispatch": grad},
            {"num_experts": routed["num_experts"], "capacity": routed["capacity"]})


def _top_k_routing(rng, tokens, experts, k):
    """[k, S] distinct experts per token (uniform), k-major."""
    if k > experts:
        raise ValueError(f"top_k ({k}) must not exceed experts ({experts})")
    return np.argsort(rng.random((tokens, experts)), axis=1)[:, :k].T.astype(np.int64)
