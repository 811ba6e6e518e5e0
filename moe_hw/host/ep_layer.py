"""The expert-parallel path (SPEC 1.8, "across devices"), a host-level composition over N
simulated ranks, checked bit for bit against ``golden.ep_dispatch``.

Every rank r runs the ``locations`` unit on its (k, i) pairs and then the ``dispatch`` unit
on its tokens, with the locations its own hardware produced (E global experts, capacity C).
The host then does the all-to-all, from what the hardware gave: rank r's per-expert totals
(``expert_counts``) say how many slots of each expert are filled, ``n(r, e) = min(count, C)``,
and rank q receives, rank-major (for r = 0..N-1, for each of its E_local = E / N local
experts), the first n(r, e) rows of expert e in rank r's dispatch buffer, with the count
matrix ``expert_token_num_per_rank`` [N, E_local] (int32), as Ascend ``MoeReRouting`` takes
them. Every rank q then runs the ``moe_re_routing`` unit on what it received.

Each unit run is a simulation of its own emitted Verilog through :func:`~moe_hw.host.unit.run`,
with that unit's scoreboard and, stall-free, its exact cycle formula; one model per unit
serves every rank (each unit is sized once, for the largest problem any rank can give it).
Then every output is compared bit for bit with ``golden.ep_dispatch``.

npz inputs: ``gates`` and ``indices`` [N, k, S], ``input`` [N, S, H] (float16 or bfloat16:
the re-routing unit moves 8- and 16-bit tokens); run-time ``num_experts`` (E, a multiple of
N), ``capacity`` (default ``golden.capacity_from_factor(1.25, S, E, k)``),
``expert_token_num_type`` (default 1), ``idx_type`` (default 0) and ``memory_latency`` (the
re-routing bench's memory model). Outputs: the keys of ``golden.ep_dispatch``, plus
``cycles`` (the path's, below) and ``phase_cycles`` [N, 3] (every rank's locations, dispatch
and re-routing run).

Cycles: the ranks run each phase side by side and the phases one after another, so the
path takes, per phase, its slowest rank's cycles, summed over the three phases; the
all-to-all itself is not simulated and not counted.
"""

import dataclasses

import numpy as np

from .. import golden
from ..formats import FORMATS
from ..golden.expert_parallel import check_ep_inputs, experts_per_rank
from ..problems import routed_problem
from ..params import check_choice, check_int
from . import dispatch, locations, moe_re_routing
from .checks import (HostError, compare_bits, compare_values, memory_latency, need,
                     runtime_int)
from .moe_layer import DEFAULT_CAPACITY_FACTOR
from .unit import Composition, Outcome, run

__all__ = ["COMPOSITION", "EpLayer", "PHASES"]

#: The units of one rank's path, in the order they run.
PHASES = ("locations", "dispatch", "moe_re_routing")
_UNITS = {"locations": locations.UNIT, "dispatch": dispatch.UNIT,
          "moe_re_routing": moe_re_routing.UNIT}
_TOKEN_FORMATS = ("fp16", "bf16")      # float formats both dispatch and re-routing take


def _maximum(params_class, name, value):
    """``value``, or the parameter's own upper limit if that is lower (a bound of what the
    problem can need, not what it needs: the unit's checks catch a problem that is over)."""
    field = {f.name: f for f in dataclasses.fields(params_class)}[name]
    upper = field.metadata.get("maximum")
    return max(1, value if upper is None else min(value, upper))


class EpLayer(Composition):
    name = "ep_layer"
    summary = ("the expert-parallel path over N simulated ranks: per rank locations -> "
               "dispatch in hardware, the all-to-all on the host (rank-major, as MoeReRouting "
               "receives it), per rank moe_re_routing in hardware (SPEC 1.8, 1.5)")
    golden = "golden.ep_dispatch"
    units = PHASES
    inputs = ("gates", "indices", "input")
    outputs = ("locations", "dispatch", "dropped", "expert_token_num_per_rank",
               "received_per_rank", "received_tokens", "permute_tokens", "permute_token_idx",
               "expert_token_num", "phase_cycles")
    runtime = ("num_experts", "capacity", "expert_token_num_type", "idx_type",
               "memory_latency")
    settings = ("lanes (dispatch and moe_re_routing)", "UNIT.PARAM (one unit's parameter)")
    random_problem = {"num_ranks": 4, "tokens": 64, "hidden": 256, "num_experts": 8,
                      "top_k": 2, "format": "bf16"}

    # ---- the problem -----------------------------------------------------------------------
    def problem(self, inputs, runtime):
        """The checked problem: the golden model's arguments and the sizes."""
        gates, indices, input = need(inputs, self.name, self.inputs)
        num_experts = runtime_int("num_experts", runtime, inputs)
        try:
            gates, indices, input, num_experts = check_ep_inputs(gates, indices, input,
                                                                 num_experts=num_experts)
        except (TypeError, ValueError) as error:
            raise HostError(str(error)) from None
        fmt = FORMATS[_format(input)]
        num_ranks, top_k, tokens = indices.shape
        if "capacity" in runtime or "capacity" in inputs:
            capacity = runtime_int("capacity", runtime, inputs)
        else:
            capacity = golden.capacity_from_factor(DEFAULT_CAPACITY_FACTOR, tokens,
                                                   max(num_experts, 1), max(top_k, 1))
        values = {}
        for name, default in (("expert_token_num_type", 1), ("idx_type", 0)):
            values[name] = runtime_int(name, runtime, inputs, default=default)
            if values[name] not in (0, 1):
                raise HostError(f"{name} must be 0 or 1, not {values[name]}")
        return {"gates": gates, "indices": indices, "input": input, "fmt": fmt,
                "num_ranks": num_ranks, "top_k": top_k, "tokens": tokens,
                "hidden": input.shape[2], "num_experts": num_experts,
                "experts_per_rank": experts_per_rank(num_experts, num_ranks),
                "capacity": capacity, **values,
                "memory_latency": memory_latency(runtime, inputs)}

    def split_settings(self, settings):
        """``(generation-time settings by unit, run-time values)``: ``lanes`` goes to dispatch
        and moe_re_routing, ``UNIT.PARAM`` to that unit (and wins over ``lanes``)."""
        per_unit = {name: {} for name in PHASES}
        runtime, specific = {}, []
        for name, value in (settings or {}).items():
            unit, dot, param = name.partition(".")
            if name in self.runtime:
                runtime[name] = value
            elif name == "lanes":
                per_unit["dispatch"]["lanes"] = per_unit["moe_re_routing"]["lanes"] = value
            elif dot and unit in per_unit and param:
                specific.append((unit, param, value))
            elif dot:
                raise HostError(f"{name}: {self.name} has no unit {unit!r}; its units are "
                                f"{', '.join(PHASES)}")
            else:
                raise HostError(f"{self.name} has no parameter or run-time value {name!r}; "
                                f"known: {', '.join(self.runtime)}, lanes, and UNIT.PARAM "
                                f"for a parameter of {', '.join(PHASES)}")
        for unit, param, value in specific:
            per_unit[unit][param] = value
        return per_unit, runtime

    def params_for(self, problem, settings):
        """Each unit's parameters, ``settings[unit]`` on top of maxima that hold any rank's
        problem of this shape: the locations and dispatch units k*S pairs, E experts, C slots;
        the re-routing unit at most min(N*E_local*C, N*k*S) tokens in N*E_local blocks."""
        pairs = problem["top_k"] * problem["tokens"]
        experts, capacity = problem["num_experts"], problem["capacity"]
        ranks, local = problem["num_ranks"], problem["experts_per_rank"]
        fmt = problem["fmt"].name
        rr = moe_re_routing.UNIT.params
        smallest = {
            "locations": dict(max_pairs=max(1, pairs), max_experts=max(1, experts),
                              max_capacity=max(1, capacity)),
            "dispatch": dict(format=fmt, max_pairs=max(1, pairs),
                             max_hidden=problem["hidden"], max_capacity=max(1, capacity),
                             max_experts=max(1, experts)),
            "moe_re_routing": dict(
                format=fmt, count_type="int32", scales=False,
                max_tokens=_maximum(rr, "max_tokens",
                                    min(ranks * local * capacity, ranks * pairs)),
                max_hidden=problem["hidden"], max_ranks=ranks,
                max_experts=_maximum(rr, "max_experts", local),
                max_blocks=_maximum(rr, "max_blocks", ranks * local)),
        }
        params = {}
        for unit, sizes in smallest.items():
            try:
                params[unit] = _UNITS[unit].sized(settings[unit], **sizes)
            except ValueError as error:      # HostError, ParameterError: name the unit
                raise type(error)(f"{self.name}'s {unit} unit: {error}") from None
        return params

    # ---- the run --------------------------------------------------------------------------
    def run(self, inputs, settings=None, *, params=None, sim="verilator", stall=0.0, seed=0,
            check=True, progress=None):
        """The composition on ``inputs``; ``params`` (a dict by unit name) replaces the sized
        parameters of the units it names. Returns an :class:`~moe_hw.host.unit.Outcome`
        whose ``results`` hold every unit run's own Outcome (``results["runs"][rank][unit]``)
        and ``phase_cycles``."""
        per_unit, runtime = self.split_settings(settings)
        prob = self.problem(inputs, runtime)
        params = {**self.params_for(prob, per_unit), **(params or {})}
        ranks, local = prob["num_ranks"], prob["experts_per_rank"]
        capacity, hidden = prob["capacity"], prob["hidden"]
        sizes = {"num_experts": prob["num_experts"], "capacity": capacity}
        runs = [{} for _ in range(ranks)]

        def unit_run(rank, unit, unit_inputs, unit_runtime):
            note = None if progress is None else \
                (lambda text: progress(f"rank {rank} {unit}: {text}"))
            runs[rank][unit] = run(_UNITS[unit], unit_inputs, unit_runtime,
                                   params=params[unit], sim=sim, stall=stall,
                                   seed=(seed * ranks + rank) * len(PHASES) + PHASES.index(unit),
                                   check=check, progress=note)
            return runs[rank][unit].outputs

        # Every rank: locations, then dispatch with the hardware's locations.
        buffers, counts = [], []
        for r in range(ranks):
            located = unit_run(r, "locations", {"indices": prob["indices"][r]}, sizes)
            dispatched = unit_run(r, "dispatch", {
                "gates": prob["gates"][r], "indices": prob["indices"][r],
                "locations": located["locations"], "input": prob["input"][r]}, sizes)
            counts.append(located["expert_counts"])
            buffers.append(dispatched["dispatch"])

        # The all-to-all, from the hardware's totals and buffers.
        sent = np.minimum(np.stack(counts).astype(np.int64), capacity)        # n(r, e)
        matrices = sent.reshape(ranks, ranks, local).transpose(1, 0, 2)        # [q, r, l]
        received = []
        for q in range(ranks):
            blocks = [buffers[r][e * capacity: e * capacity + sent[r, e]]
                      for r in range(ranks) for e in range(q * local, (q + 1) * local)]
            received.append(np.concatenate(blocks) if blocks else
                            np.zeros((0, hidden), prob["input"].dtype))

        # Every rank: re-routing of what it received.
        rerouted = [unit_run(q, "moe_re_routing", {
            "tokens": received[q], "expert_token_num_per_rank": matrices[q].astype(np.int32)},
            {name: prob[name] for name in ("expert_token_num_type", "idx_type",
                                           "memory_latency")}) for q in range(ranks)]

        phase_cycles = np.array([[runs[r][unit].cycles for unit in PHASES]
                                 for r in range(ranks)], dtype=np.int64)
        outputs = {
            "locations": np.stack([runs[r]["locations"].outputs["locations"]
                                   for r in range(ranks)]),
            "dispatch": np.stack(buffers),
            "dropped": np.array([runs[r]["dispatch"].outputs["dropped"] for r in range(ranks)],
                                dtype=np.int64),
            "expert_token_num_per_rank": np.ascontiguousarray(matrices),
            "received_per_rank": np.array([len(rows) for rows in received], np.int64),
            "received_tokens": np.concatenate(received),
            "permute_tokens": np.concatenate([out["permute_tokens"] for out in rerouted]),
            "permute_token_idx": np.concatenate([out["permute_token_idx"]
                                                 for out in rerouted]).astype(np.int32),
            "expert_token_num": np.stack([out["expert_token_num"] for out in rerouted])
            .astype(np.int64),
        }

        def path(values):
            """The path's cycles: per phase the slowest rank, summed over the phases."""
            return int(np.asarray(values, dtype=np.int64).max(axis=0).sum())

        cycles = path(phase_cycles)
        formulas = [[runs[r][unit].expected_cycles for unit in PHASES] for r in range(ranks)]
        expected = None if any(v is None for row in formulas for v in row) else path(formulas)
        outcome = Outcome(self.name, params, prob,
                          {**outputs, "cycles": np.int64(cycles), "phase_cycles": phase_cycles},
                          {"runs": runs, "phase_cycles": phase_cycles}, cycles,
                          path([[runs[r][unit].ideal_cycles for unit in PHASES]
                                for r in range(ranks)]),
                          expected, float(stall))
        outcome.report += self._report(prob, params, outcome, sent)
        if check:
            outcome.problems = [f"rank {r} {unit}: {finding}" for r in range(ranks)
                                for unit in PHASES for finding in runs[r][unit].problems]
            outcome.problems += self.score(prob, outputs)
            if outcome.problems:
                outcome.report.append(f"check: DIFFERS from {self.golden}: "
                                      + "; ".join(outcome.problems))
            else:
                outcome.report.append(
                    f"check: bit-exact against {self.golden}; every unit run bit-exact against "
                    "its own golden model with a clean scoreboard"
                    + ("" if stall else " and its exact stall-free cycle count"))
        return outcome

    def expected(self, prob):
        return golden.ep_dispatch(prob["gates"], prob["indices"], prob["input"],
                                  num_experts=prob["num_experts"], capacity=prob["capacity"],
                                  expert_token_num_type=prob["expert_token_num_type"],
                                  idx_type=prob["idx_type"])

    def score(self, prob, outputs):
        """Every output of the path against ``golden.ep_dispatch``: float arrays bit for
        bit, the others value for value."""
        want = self.expected(prob)
        findings = []
        for name, value in want.items():
            if name in ("dispatch", "received_tokens", "permute_tokens"):
                findings += compare_bits(name, outputs[name], value, prob["fmt"])
            else:
                findings += compare_values(name, outputs[name], value)
        return findings

    def _report(self, prob, params, outcome, sent):
        ranks, local = prob["num_ranks"], prob["experts_per_rank"]
        cycles = outcome.results["phase_cycles"]
        received = outcome.outputs["received_per_rank"]
        dropped = outcome.outputs["dropped"]
        lines = [f"ep_layer: N={ranks} ranks, E={prob['num_experts']} experts ({local} per "
                 f"rank), k={prob['top_k']}, S={prob['tokens']} tokens per rank, "
                 f"H={prob['hidden']}, C={prob['capacity']}, {prob['fmt'].name}; dispatch "
                 f"lanes={params['dispatch'].lanes}, moe_re_routing "
                 f"lanes={params['moe_re_routing'].lanes}"]
        header = ("rank", "locations", "dispatch", "moe_re_routing", "sent", "received",
                  "dropped")
        rows = [header] + [(str(r), *map(str, cycles[r]), str(int(sent[r].sum())),
                            str(int(received[r])), str(int(dropped[r])))
                           for r in range(ranks)]
        rows.append(("path", *map(str, cycles.max(axis=0)), "", "", ""))
        widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
        lines.append("cycles per phase (path: the slowest rank of each phase; the all-to-all "
                     "is not timed):")
        lines += [("  " + "  ".join(cell.rjust(width) for cell, width in zip(row, widths)))
                  .rstrip() for row in rows]
        line = (f"cycles: {outcome.cycles} (ideal {outcome.ideal_cycles}, efficiency "
                f"{outcome.efficiency:.4f}")
        if outcome.expected_cycles is not None and not outcome.stall:
            line += f"; the units' formulas give {outcome.expected_cycles}"
        lines.append(line + ")")
        return lines

    # ---- a problem when no input file is given ----------------------------------------------
    def random_inputs(self, settings, seed=0):
        """Seeded random routing at :attr:`random_problem` (``num_ranks``, ``tokens`` S per
        rank, ``hidden``, ``num_experts``, ``top_k``, ``format``; any of them from
        ``settings``): per rank k distinct experts per token, gates exact in the format,
        normal token rows (``moe_hw.problems.routed_problem``)."""
        settings = dict(settings or {})
        sizes = {}
        for name, default in self.random_problem.items():
            value = settings.pop(name, default) if name != "num_experts" else \
                settings.setdefault(name, default)
            if name == "format":
                sizes[name] = check_choice(name, value, _TOKEN_FORMATS)
            else:
                sizes[name] = check_int(name, value, minimum=1)
        ranks = [routed_problem(tokens=sizes["tokens"], hidden=sizes["hidden"],
                                experts=sizes["num_experts"], top_k=sizes["top_k"],
                                format=sizes["format"], capacity=0, seed=[seed, r])
                 for r in range(sizes["num_ranks"])]
        inputs = {name: np.stack([rank[name] for rank in ranks])
                  for name in ("gates", "indices", "input")}
        return inputs, settings


def _format(input):
    for name in _TOKEN_FORMATS:
        if input.dtype == FORMATS[name].dtype:
            return name
    raise HostError(f"input has dtype {input.dtype}, but the re-routing unit moves int8, "
                    f"float16 or bfloat16 tokens: ep_layer runs float16 or bfloat16")


COMPOSITION = EpLayer()
