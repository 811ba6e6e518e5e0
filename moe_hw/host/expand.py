"""The expand unit's declaration, host adapter and planner (SPEC 1.6, OneFlow ``expand``):
a user's input and expand sizes in, the expanded tensor out, scored bit for bit against
``golden.expand`` with a scoreboard over every output beat.

npz inputs: ``input`` (any shape; float32, float16, bfloat16 or int8: moved as bits, never
changed) and ``expand_size`` (an integer array, one entry per output dim: a size, or -1 to
keep a dim). Output: ``output``, the expanded tensor.

The planner (:func:`plan`) turns the input shape and the expand sizes into the address
generator's run-time plan: the output shape and ``out_stride`` (``golden.expand_strides``'s
rules and errors), the size-1 dims dropped and the contiguous runs merged, then the lanes'
odometer steps and start values (:mod:`moe_hw.units.expand` explains them).
:func:`odometer_addresses` runs the plan the way the hardware does, in Python.

The split across P parallel units (generation parameter ``parts``, run-time value
``split_dim`` from ``--set`` or a scalar in the npz; OneFlow SBP ``split(d)``, SPEC 1.6):
:func:`split` cuts the input along input dim ``split_dim`` into ``parts`` contiguous slices
with ``golden.physical_expand`` (the balanced split: the first ``size % parts`` parts one
element longer, so an uneven split is allowed, and a part may be empty when the dim is
shorter than ``parts``) and gives each part its physical input, expand size and
``out_stride``; each part runs on its own expand core, and the host concatenates the parts'
outputs along the output dim of ``split_dim``, the logical output. Without ``split_dim``, a
split unit splits the outermost input dim that expand keeps and whose size is above 1 (the
tokens of a gate broadcast, the row of a row broadcast). A broadcast ``split_dim`` is an
error naming the dim and its expand size.
"""

import functools
import math
from typing import NamedTuple

import ml_dtypes
import numpy as np

from .. import golden
from ..blocks.row_reader import last_enable
from ..flows.fastsim import FastBench, MemoryReader, Sink, Source
from ..golden.expand import _addresses as golden_addresses, _plan as expand_plan, merged_dims
from ..params import check_choice
from ..units.expand import ELEMENT_FORMATS, PARTS, ExpandParams, ExpandUnit
from .checks import (MEMORY_LATENCY, HostError, compare_log, compare_values, memory_latency,
                     need, runtime_int)
from .unit import AXI_READ_PARAMS, Unit

__all__ = ["UNIT", "Expand", "Plan", "Split", "plan", "split", "odometer_addresses",
           "ELEMENT_DTYPES", "format_of_elements", "element_array", "fast_bench"]

#: Element dtypes by format name.
ELEMENT_DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16),
                  "bf16": np.dtype(ml_dtypes.bfloat16), "int8": np.dtype(np.int8)}
_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def element_array(input):
    """``input`` as an array; a 2-byte void array is bfloat16 as an npz file stores it."""
    input = np.asarray(input)
    if input.dtype.kind == "V" and input.dtype.itemsize == 2:
        input = input.view(ml_dtypes.bfloat16)
    return input


def format_of_elements(array):
    for name, dtype in ELEMENT_DTYPES.items():
        if array.dtype == dtype:
            return name
    raise HostError(f"input must have dtype float32, float16, bfloat16 or int8, not "
                    f"{array.dtype}")


def size_list(name, sizes):
    """``sizes`` (an npz array or a sequence) as a list of ints, or an error naming it."""
    sizes = np.asarray(sizes)
    if sizes.ndim != 1 or (sizes.size and sizes.dtype.kind not in "iu"):
        raise HostError(f"{name} must be a one-dimensional integer array, not {sizes.dtype} "
                        f"of shape {sizes.shape}")
    return [int(v) for v in sizes.reshape(-1)]


def check_rank(name, sizes, max_rank):
    """A size list with more dims than the unit's ``max_rank`` is an error naming the first
    dim past it."""
    if len(sizes) > max_rank:
        raise HostError(f"{name}[{max_rank}] = {sizes[max_rank]} is past the unit's max_rank "
                        f"of {max_rank} ({name} has {len(sizes)} dims)")


class Plan:
    """The address generator's run-time plan for one expand (see :func:`plan`)."""

    def __init__(self, output_shape, out_stride, dims, digits, lanes, *, paired=True,
                 starts=(0,)):
        self.output_shape = output_shape      # the expand's output shape
        self.out_stride = out_stride          # golden.expand_strides
        self.dims = dims                      # the hardware's (s_d, t_d), max_rank of them
        self.digits = digits                  # k_d: the step in the output's mixed radix
        self.lanes = lanes
        self.paired = paired                  # the step is a pair of beats (expand's lanes)
        self.output_elements = math.prod(output_shape)
        self.dy = [[k + cin - wrap * s for cin in (0, 1) for wrap in (0, 1)]
                   for (s, _), k in zip(dims, digits)]
        self.da = [[step * t for step in steps] for steps, (_, t) in zip(self.dy, dims)]
        # Each odometer's start (lane 0's; expand_backward's two at elements 0 and one item
        # on): its digits y_d = x_d + k_d - s_d, address shares and the carries of its first
        # step. A start past the output (a run of one item) wraps, as the lanes do.
        self.y0, self.a0, self.c0 = [], [], []
        for start in starts:
            x = self.digits_of(start % self.output_elements if self.output_elements else 0)
            self.y0.append([xd + k - s for xd, k, (s, _) in zip(x, digits, dims)])
            self.a0.append([xd * t for xd, (_, t) in zip(x, dims)])
            self.c0.append(carries(self.y0[-1]))
        # Every lane's constants (lane l of an even beat reads the pair's element plus l, of
        # an odd beat plus lanes + l, modulo the output): u_d = k_d - k^e_d and the start
        # offset A_e = sum_d k^e_d t_d, e = l (even) or lanes + l (odd).
        self.u, self.offset = [], []
        for element in [*range(lanes), *range(lanes, 2 * lanes)]:
            k_e = self.digits_of(element % self.output_elements if self.output_elements else 0)
            self.u.append([k - ke for k, ke in zip(digits, k_e)])
            self.offset.append(sum(ke * t for ke, (_, t) in zip(k_e, dims)))
        # w_d = t_{d-1} - s_d t_d: what a carry out of dim d adds to an address.
        self.w = [(dims[d - 1][1] if d else 0) - s * t for d, (s, t) in enumerate(dims)]

    def digits_of(self, element):
        """The mixed-radix digits of a flat output element over :attr:`dims`."""
        x = []
        for s, _ in reversed(self.dims):
            x.append(element % s)
            element //= s
        return x[::-1]

    @property
    def rank(self):
        """Dims the generator needs: the merged dims that are not size 1."""
        return sum(s != 1 for s, _ in self.dims)

    def beats(self, params):
        """The ``plan`` stream's beats (:meth:`ExpandParams.plan_layout`, ``digit`` then
        ``addr``, first field least significant, entries in index order): each dim's steps,
        then each lane's start values."""
        entries = max(params.max_rank, 4)

        def word(digits, addrs, carry=()):
            fields = ([(v, params.digit_width) for v in digits]
                      + [(0, params.digit_width)] * (entries - len(digits))
                      + [(v, params.addr_width) for v in addrs]
                      + [(0, params.addr_width)] * (entries - len(addrs))
                      + [(c, 1) for c in carry])
            value, offset = 0, 0
            for field, width in fields:
                value |= (field & ((1 << width) - 1)) << offset
                offset += width
            return value

        # The odometers' starts (lane 0's; expand_backward's two), then the even constants of
        # lanes 1 .. lanes-1 and the odd constants of every lane (none for expand_backward).
        constants = range(1, 2 * self.lanes) if self.paired else ()
        return ([word(dy, da) for dy, da in zip(self.dy, self.da)]
                + [word(y, a, c) for y, a, c in zip(self.y0, self.a0, self.c0)]
                + [word(self.u[e], [self.offset[e]]) for e in constants])


def plan(input_shape, expand_size, params):
    """The plan of ``expand(input of input_shape, expand_size)`` on a unit of ``params``.

    Raises HostError naming the offending dim and its value: ``golden.expand_strides``'s
    rules (-1 on a new dim, a non-1 dim changed, a size below -1) and the unit's ``max_rank``.
    """
    check_rank("expand_size", list(expand_size), params.max_rank)
    try:
        output_shape, out_stride = expand_plan(input_shape, expand_size)
    except (TypeError, ValueError) as error:
        raise HostError(str(error)) from None
    return plan_of(output_shape, out_stride, params)


def plan_of(output_shape, out_stride, params, *, step=None, odometers=None):
    """The plan from an output shape and its ``out_stride`` (already checked). By default
    the expand unit's: an odometer that advances a pair of beats (2 * ``params.lanes``
    elements) per step, its start (element 0) and every lane's even and odd constants. With
    ``odometers`` (expand_backward's 2): that many odometers that take items in turn, an
    item ``step`` elements, so each advances ``odometers * step`` elements per step; their
    starts are elements 0, ``step``, ..."""
    paired = odometers is None
    starts = (0,) if paired else tuple(i * step for i in range(odometers))
    step = 2 * params.lanes if paired else odometers * step
    merged = merged_dims(output_shape, out_stride)
    if len(merged) > params.max_rank:
        raise HostError(f"the expand needs {len(merged)} address dims ({merged}), above the "
                        f"unit's max_rank of {params.max_rank}")
    dims = [(1, 0)] * (params.max_rank - len(merged)) + merged
    digits, inner = [], 1
    for s, _ in reversed(dims):
        digits.append((step // inner) % s)
        inner *= s
    return Plan(list(output_shape), list(out_stride), dims, digits[::-1],
                params.lanes if paired else odometers, paired=paired, starts=starts)


def carries(y):
    """The carries ``[c_0, .., c_{R-1}]`` of an odometer's step from ``y`` (each dim's
    ``y_d = x_d + k_d - s_d``): ``c_d = (y_d >= 0) | ((y_d + 1 >= 0) & c_{d+1}``, c_R = 0."""
    out = [0] * (len(y) + 1)
    for d in reversed(range(len(y))):
        out[d] = int(y[d] >= 0 or (y[d] + 1 >= 0 and out[d + 1]))
    return out[:-1]


def odometer_addresses(the_plan, beats):
    """The read address of every lane of ``beats`` output beats, formed exactly as the
    hardware forms them (:func:`moe_hw.units.expand.lane_addresses`): lane 0's odometer
    stepped a pair of beats at a time, and each lane's offset from it by the carries of its
    even or odd digit constants ([beats, lanes]; modulo nothing, as the true values)."""
    rank, lanes = len(the_plan.dims), the_plan.lanes
    out = np.zeros((beats, lanes), np.int64)
    y = list(the_plan.y0[0])
    a = list(the_plan.a0[0])
    for beat in range(beats):
        base = sum(a)
        for lane in range(lanes):
            e = (beat % 2) * lanes + lane
            u = the_plan.u[e]
            carry, offset = 0, the_plan.offset[e]
            for d in reversed(range(rank)):
                carry = int(y[d] >= u[d] or (y[d] >= u[d] - 1 and carry))
                offset += carry * the_plan.w[d]
            out[beat, lane] = base + offset
        if beat % 2:
            carry = carries(y) + [0]
            for d in range(rank):
                step = 2 * carry[d + 1] + carry[d]
                y[d] += the_plan.dy[d][step]
                a[d] += the_plan.da[d][step]
    return out


def lane_addresses(the_plan, beats):
    """What :func:`odometer_addresses` gives, from the golden addresses: lane l of beat b
    reads the address of output element ``(b * lanes + l) mod output_elements`` (the lanes past
    the end of the last beat wrap to the start)."""
    return _lane_addresses(the_plan.output_shape, the_plan.out_stride, the_plan.lanes, beats)


def _lane_addresses(output_shape, out_stride, lanes, beats):
    if math.prod(output_shape) == 0 or beats == 0:
        return np.zeros((beats, lanes), np.int64)
    flat = golden_addresses(list(output_shape), list(out_stride))
    return flat[np.arange(beats * lanes) % flat.size].reshape(beats, lanes)


def external_reads(the_plan, beats, input_elements):
    """The external path's reads for ``beats`` output beats, in the order the hardware issues
    them (:mod:`moe_hw.units.expand`): each beat's lanes cut into groups at every lane whose
    address is neither the one before it nor that plus one; one read per group at its first
    lane's address, its lane enables the group's extent (its last address minus its first),
    none past ``input_elements``. Returns ``(addr, enable)`` arrays, one entry per read."""
    key = (tuple(the_plan.output_shape), tuple(the_plan.out_stride), the_plan.lanes,
           int(beats), int(input_elements))
    # The stimulus, the cycle formula and the read scoreboard of one run each ask for the same
    # reads: computed once (about a second at 2**19 elements), returned read-only.
    return _external_reads(*key)


@functools.lru_cache(maxsize=8)
def _external_reads(output_shape, out_stride, lanes, beats, input_elements):
    if beats == 0:
        return _read_only(np.zeros(0, np.int64)), _read_only(np.zeros(0, np.int64))
    addresses = _lane_addresses(output_shape, out_stride, lanes, beats)
    starts = np.ones(addresses.shape, bool)
    step = np.diff(addresses, axis=1)
    starts[:, 1:] = (step != 0) & (step != 1)
    flat, starts = addresses.reshape(-1), starts.reshape(-1)
    first = np.flatnonzero(starts)
    last = np.append(first[1:], flat.size) - 1
    base = flat[first]
    extent = flat[last] - base
    lane = np.arange(lanes)
    on = (lane[None, :] <= extent[:, None]) & (lane[None, :] < (input_elements - base)[:, None])
    enable = (on.astype(np.int64) << lane).sum(axis=1)
    return _read_only(base.astype(np.int64)), _read_only(enable.astype(np.int64))


def _read_only(array):
    array.flags.writeable = False
    return array


class Split(NamedTuple):
    """A problem cut over the parts of a split unit (:func:`split`)."""
    split_dim: int | None      # the input dim cut (None: one part, not split)
    out_dim: int | None        # the output dim the parts' outputs concatenate along
    parts: list                # one expand problem per part, its physical slice


def split(problem, parts):
    """The expand ``problem`` cut over ``parts`` units (see the module docstring): a
    :class:`Split` whose part problems hold each part's physical input, ``expand_size`` and
    ``out_stride`` (``golden.physical_expand``). One part and no ``split_dim``: the problem
    itself. Errors name the parameter or the dim and its value."""
    check_choice("parts", parts, PARTS)
    split_dim = problem["split_dim"]
    input = problem["input"]
    if split_dim is None and parts == 1:
        return Split(None, None, [problem])
    if split_dim is None:
        kept = [d for d, n in enumerate(input.shape) if n > 1]    # a dim above 1 is kept
        if not kept:
            raise HostError(f"parts = {parts} needs a dim to split: give split_dim (input "
                            f"{list(input.shape)} has no kept dim of size above 1)")
        split_dim = kept[0]
    try:
        physical = golden.physical_expand(input.shape, problem["expand_size"], split_dim,
                                          parts)
    except (TypeError, ValueError) as error:
        raise HostError(str(error)) from None
    out_dim = split_dim + len(problem["output_shape"]) - input.ndim
    pieces, first = [], 0
    for index, part in enumerate(physical):
        length = part.input_shape[split_dim]
        piece = input[(slice(None),) * split_dim + (slice(first, first + length),)]
        first += length
        pieces.append({**Expand.expand_problem(piece, part.expand_size, part.expand_size,
                                               part.out_stride, sizes=problem["sizes"]),
                       "part": index})
    return Split(split_dim, out_dim, pieces)


def part_results(results, index, parts):
    """Part ``index``'s bench results under the names of a one-part run."""
    if parts == 1:
        return results
    return {key: results[f"{key}{index}"]
            for key in ("data", "enable", "last", "input_taken", "plan_taken", "request_addr",
                        "request_enable", "out_of_bounds") if f"{key}{index}" in results}


class Expand(Unit):
    name = "expand"
    summary = ("OneFlow expand: an N-D stride address generator (counters and adders) over an "
               "on-chip buffer copied per lane, one output beat per cycle for every stride "
               "pattern (SPEC 1.6)")
    golden = "golden.expand"
    params = ExpandParams
    axi_params = AXI_READ_PARAMS
    inputs = ("input", "expand_size")
    outputs = ("output",)
    runtime = ("split_dim", "memory_latency")
    ideal = "one beat per cycle: ceil(output elements / lanes) (of the largest part)"

    @property
    def bench(self):
        return "bench_expand"

    def build(self, params):
        return ExpandUnit(params)

    # ---- adapter ---------------------------------------------------------------------
    def problem(self, inputs, runtime):
        input, expand_size = need(inputs, self.name, self.inputs)
        input = element_array(input)
        format_of_elements(input)
        expand_size = size_list("expand_size", expand_size)
        try:
            output_shape, out_stride = expand_plan(input.shape, expand_size)
        except (TypeError, ValueError) as error:
            raise HostError(str(error)) from None
        problem = self.expand_problem(input, expand_size, output_shape, out_stride,
                                      sizes=("expand_size", expand_size))
        return {**problem, "split_dim": split_dim_of(inputs, runtime),
                "memory_latency": memory_latency(runtime, inputs)}

    @staticmethod
    def expand_problem(input, expand_size, output_shape, out_stride, *, sizes):
        """The problem dict of an expand (``sizes``: the user's size argument, for errors),
        not split."""
        return {"input": input, "expand_size": list(expand_size),
                "output_shape": list(output_shape), "out_stride": list(out_stride),
                "input_elements": int(input.size),
                "output_elements": int(math.prod(output_shape)), "sizes": sizes,
                "split_dim": None}

    def params_for(self, problem, settings):
        settings = {"format": format_of_elements(problem["input"]), **settings}
        parts = split(problem, settings.get("parts", 1)).parts
        params = self.sized(settings,
                            max_input=max(1, *(part["input_elements"] for part in parts)),
                            max_output=max(1, *(part["output_elements"] for part in parts)))
        self.part_plans(problem, params)
        return params

    def plan(self, problem, params):
        """The plan of ``problem`` (one part) on ``params``; errors name the user's dim and
        value."""
        if ELEMENT_FORMATS[format_of_elements(problem["input"])] != params.element_width:
            raise HostError(f"input has dtype {problem['input'].dtype}, but the unit's format "
                            f"is {params.format}")
        name, sizes = problem["sizes"]
        check_rank(name, sizes, params.max_rank)
        whose = f"part {problem['part']}'s " if "part" in problem else ""
        for what, value, maximum in (
                ("input elements", problem["input_elements"], "max_input"),
                ("output elements", problem["output_elements"], "max_output")):
            if value > getattr(params, maximum):
                raise HostError(f"{whose}{what} ({value}) exceed the unit's {maximum} of "
                                f"{getattr(params, maximum)}")
        return plan_of(problem["output_shape"], problem["out_stride"], params)

    def part_plans(self, problem, params):
        """``[(part problem, its plan)]``, one per part of ``params`` (:func:`split`)."""
        return [(part, self.plan(part, params))
                for part in split(problem, params.parts).parts]

    def fast(self, stimulus, settings):
        return fast_bench(self, stimulus, settings)

    def pack(self, problem, params, *, stall, seed):
        plans = self.part_plans(problem, params)
        if params.parts == 1:
            return stimulus(plans[0][0], params, plans[0][1])
        return split_stimulus(plans, params, problem.get("memory_latency", MEMORY_LATENCY))

    def unpack(self, problem, params, results):
        cut = split(problem, params.parts)
        pieces = [self.part_output(part, params, part_results(results, index, params.parts))
                  for index, part in enumerate(cut.parts)]
        output = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=cut.out_dim)
        return {"output": output.reshape(self.output_shape(problem))}

    @staticmethod
    def part_output(part, params, results):
        """A part's output elements from its beats, in its (physical) output shape."""
        n = part["output_elements"]
        data = results["data"].reshape(-1)
        bits = np.zeros(n, _UINT[params.element_width])
        if data.size >= n:
            bits[:] = data[:n]
        return bits.view(part["input"].dtype).reshape(part["output_shape"])

    @staticmethod
    def output_shape(problem):
        return problem["output_shape"]

    def want(self, problem):
        return golden.expand(problem["input"], problem["expand_size"])

    def score(self, problem, params, outputs, results):
        """The logical output bit for bit, then every part's beats against its slice of the
        golden output (the scoreboard), its plan and input beats taken, and the status."""
        width = params.element_width
        want = self.want(problem)
        findings = compare_values("output bits", outputs["output"].view(_UINT[width]),
                                  np.array(want, copy=True).view(_UINT[width]))
        cut = split(problem, params.parts)
        slices = [np.asarray(want).reshape(problem["output_shape"])]
        if len(cut.parts) > 1:
            ends = np.cumsum([part["output_shape"][cut.out_dim] for part in cut.parts])[:-1]
            slices = np.split(slices[0], ends, axis=cut.out_dim)
        for index, (part, part_want) in enumerate(zip(cut.parts, slices)):
            got = part_results(results, index, params.parts)
            part_findings = compare_log("output beats", beat_log(got, params),
                                        expected_beats(part, params, part_want))
            plan_beats = params.plan_beats if part["output_elements"] else 0
            for what, value, want_value in (
                    ("plan beats taken", got["plan_taken"], plan_beats),
                    ("input beats taken", got["input_taken"], input_beats(part, params))):
                part_findings += compare_values(what, [int(value)], [int(want_value)])
            if params.memory == "external":
                part_findings += read_findings(got, expected_reads(part, params,
                                                                   self.plan(part, params)))
            whose = f"part {index}: " if params.parts > 1 else ""
            findings += [whose + finding for finding in part_findings]
        for what, got, want_value in (("error", results["error"], 0),
                                      ("busy after done", results["busy_after"], 0)):
            findings += compare_values(what, [int(got)], [int(want_value)])
        return findings

    def ideal_cycles(self, problem, params):
        """One beat per cycle on every part at once: the largest part's output beats."""
        return max(-(-part["output_elements"] // params.lanes)
                   for part in split(problem, params.parts).parts)

    def cycles(self, problem, params):
        parts = split(problem, params.parts).parts
        if params.memory == "external":
            latency = problem.get("memory_latency", MEMORY_LATENCY)
            return params.split_cycles([
                (part["input_elements"], part["output_elements"],
                 len(expected_reads(part, params, self.plan(part, params))[0]), latency)
                for part in parts])
        return params.split_cycles([(part["input_elements"], part["output_elements"])
                                    for part in parts])

    def describe(self, problem, params):
        line = (f"{self.name}: input {list(problem['input'].shape)} -> output "
                f"{self.output_shape(problem)} (out_stride {problem['out_stride']}), "
                f"{params.format}, lanes={params.lanes}, max_rank={params.max_rank}, "
                f"max_input={params.max_input}")
        if params.memory == "external":
            line += (f", external memory (latency {problem.get('memory_latency', MEMORY_LATENCY)}"
                     f", max_outstanding {params.max_outstanding})")
        if params.parts > 1 or problem["split_dim"] is not None:
            cut = split(problem, params.parts)
            line += (f", parts={params.parts} (split_dim {cut.split_dim}: part inputs "
                     f"{[list(part['input'].shape) for part in cut.parts]})")
        return line

    def point_inputs(self, problem, seed=0):
        """Random elements of the table's ``input_shape`` and ``format`` (default fp32), and
        its sizes (``expand_size``; repeat: ``repeat_size``); ``split_dim`` is run-time."""
        size_name = self.inputs[1]
        needed = ("input_shape", size_name)
        sizes, runtime = self.point_table(problem, (*needed, "format"), needed)
        fmt = check_choice("format", sizes.get("format", "fp32"), list(ELEMENT_DTYPES))
        input = random_elements(np.random.default_rng(seed), tuple(sizes["input_shape"]), fmt)
        return {"input": input, size_name: np.array(sizes[size_name], np.int64)}, runtime

    def bench_problems(self, shape, seed=0):
        rng = np.random.default_rng(seed)
        fmt = shape.format if shape.format in ELEMENT_DTYPES else "fp32"
        gate = random_elements(rng, (shape.tokens, 1), fmt)
        row = random_elements(rng, (1, shape.hidden), fmt)
        size = np.array([shape.tokens, shape.hidden], np.int64)
        rank5 = random_elements(rng, RANK5_INPUT, fmt)
        rank5_size = np.array(rank5_size_of(shape), np.int64)
        onchip = {"lanes": shape.lanes}
        external = {"lanes": shape.lanes, "memory": "external"}
        cases = {"gate": {"input": gate, "expand_size": size},
                 "row": {"input": row, "expand_size": size},
                 "rank5": {"input": rank5, "expand_size": rank5_size}}
        return {**{name: (inputs, onchip) for name, inputs in cases.items()},
                **{f"{name}_external": (inputs, external) for name, inputs in cases.items()}}


#: The benches' rank-5 expand (two dims broadcast), its input shape and expand size
#: (:func:`rank5_size_of`).
RANK5_INPUT = (4, 1, 8, 1, 16)


def rank5_size_of(shape):
    """The rank-5 expand's size scaled with a bench shape's S and H: [4, 1, 8, 1, 16] ->
    [4, 24, 8, 20, 16] at S = 1024, H = 512."""
    return [4, max(2, shape.tokens * 3 // 128), 8, max(2, shape.hidden * 5 // 128), 16]


def split_dim_of(inputs, runtime):
    """The optional run-time ``split_dim``, from ``--set`` or a scalar in the npz (None: not
    given)."""
    if "split_dim" in runtime or "split_dim" in inputs:
        return runtime_int("split_dim", runtime, inputs)
    return None


def read_findings(results, reads):
    """The external path's read scoreboard: every read, in order, its address and lane
    enables against ``reads`` (:func:`expected_reads`), and no lane out of bounds."""
    addr, enable = reads
    findings = compare_log("read log", {"addr": np.asarray(results["request_addr"], np.int64),
                                        "enable": np.asarray(results["request_enable"],
                                                             np.int64)},
                           {"addr": addr, "enable": enable})
    if int(results["out_of_bounds"]):
        findings.append(f"{int(results['out_of_bounds'])} lanes read out of bounds")
    return findings


def input_beats(problem, params):
    """Input beats the unit takes: none for an empty output, or on the external path."""
    if problem["output_elements"] == 0 or params.memory == "external":
        return 0
    return -(-problem["input_elements"] // params.lanes)


def stimulus(problem, params, the_plan):
    """The bench's ``(stimulus, settings)``: the input's beats (lanes elements each, the last
    padded with zeros), or with ``memory`` = external the input's elements in the memory
    model (``memory``), the run-time sizes and the plan's beats (none for an empty run)."""
    lanes, width = params.lanes, params.element_width
    runtime = {"input_elements": problem["input_elements"],
               "output_elements": problem["output_elements"]}
    settings = {"lanes": lanes, "width": width,
                "runtime": {k: int(v) for k, v in runtime.items()},
                "plan": the_plan.beats(params) if problem["output_elements"] else [],
                "expected_beats": int(-(-problem["output_elements"] // lanes))}
    flat = np.ascontiguousarray(problem["input"]).reshape(-1).view(_UINT[width])
    if params.memory == "external":
        reads = expected_reads(problem, params, the_plan)
        return ({"memory": flat.astype(np.uint64)},
                {**settings, "external": True,
                 "memory_latency": int(problem.get("memory_latency", MEMORY_LATENCY)),
                 "expected_reads": len(reads[0])})
    beats = input_beats(problem, params)
    bits = np.zeros(beats * lanes, np.uint64)
    if beats:
        bits[:flat.size] = flat
    return {"input": bits.reshape(beats, lanes)}, settings


def expected_reads(problem, params, the_plan):
    """The external path's reads of a problem (one part): :func:`external_reads` over its
    output beats (none for an empty output)."""
    beats = -(-problem["output_elements"] // params.lanes)
    return external_reads(the_plan, beats, problem["input_elements"])


def split_stimulus(plans, params, memory_latency=MEMORY_LATENCY):
    """The bench's ``(stimulus, settings)`` for a split unit: each part's input beats
    (``input<p>``) or memory (``memory<p>``), run-time sizes (``part<p>_...``), plan beats and
    expected beats (and reads), from ``plans`` (:meth:`Expand.part_plans`)."""
    arrays, runtime, parts = {}, {}, []
    for index, (part, the_plan) in enumerate(plans):
        prefix = params.prefix(index)
        stim, settings = stimulus({**part, "memory_latency": memory_latency}, params, the_plan)
        key = "memory" if params.memory == "external" else "input"
        arrays[f"{key}{index}"] = stim[key]
        runtime.update({prefix + name: value for name, value in settings["runtime"].items()})
        parts.append({"prefix": prefix, key: f"{key}{index}", "plan": settings["plan"],
                      "expected_beats": settings["expected_beats"],
                      "expected_reads": settings.get("expected_reads", 0)})
    extra = ({"external": True, "memory_latency": int(memory_latency)}
             if params.memory == "external" else {})
    return arrays, {"lanes": params.lanes, "width": params.element_width, "runtime": runtime,
                    "parts": parts, **extra}


def bench_parts(settings):
    """The parts the bench drives: a split run's ``settings["parts"]``, or the one part of a
    run that is not split (its input or memory, plan and expected beats and reads)."""
    if "parts" in settings:
        return settings["parts"]
    key = "memory" if settings.get("external") else "input"
    return [{"prefix": "", key: key, "plan": settings["plan"],
             "expected_beats": settings["expected_beats"],
             "expected_reads": settings.get("expected_reads", 0)}]


def fast_bench(unit, stimulus, settings):
    """sim/bench_expand.py on the fast path (``expand``, ``repeat``, ``expand_backward``):
    the same streams and results, for one unit or the parts of a split one, with an input
    stream or a memory read port."""
    source, sink = settings.get("streams", ("input_data", "output"))
    split_run = "parts" in settings
    streams, results, work = {}, {"error": "error", "busy_after": "busy"}, 0
    for index, part in enumerate(bench_parts(settings)):
        prefix, key = part["prefix"], str(index) if split_run else ""
        beats, plan = part["expected_beats"], part["plan"]
        streams.update({f"{prefix}plan": Source(plan),
                        f"{prefix}{sink}": Sink(depth=2 * beats + 16)})
        results.update({f"data{key}": f"{prefix}{sink}.data",
                        f"enable{key}": f"{prefix}{sink}.enable",
                        f"last{key}": f"{prefix}{sink}.last",
                        f"plan_taken{key}": f"{prefix}plan.sent"})
        if settings.get("external"):
            reads = part["expected_reads"]
            streams[f"{prefix}read_request"] = MemoryReader(
                f"{prefix}read_response", stimulus[part["memory"]],
                settings["memory_latency"], requests=2 * reads + 16, all_taken=True)
            results.update({f"request_addr{key}": f"{prefix}read_request.addr",
                            f"request_enable{key}": f"{prefix}read_request.enable",
                            f"out_of_bounds{key}": f"{prefix}read_request.out_of_bounds",
                            f"input_taken{key}": 0})
            work += beats + reads + len(plan) + settings["memory_latency"]
        else:
            streams[f"{prefix}{source}"] = Source({"data": stimulus[part["input"]]})
            results[f"input_taken{key}"] = f"{prefix}{source}.sent"
            work += beats + len(stimulus[part["input"]]) + len(plan)
    return FastBench(streams=streams, sizes=settings["runtime"], results=results,
                     limit=40 * work + 2000, what=unit.name)


def beat_log(results, params):
    """The output beats as logged: data on the enabled lanes only (the others carry any
    element), enables and last flags."""
    lanes = params.lanes
    enable = results["enable"].astype(np.int64)
    on = ((enable[:, None] >> np.arange(lanes)) & 1).astype(bool)
    data = np.where(on, results["data"].reshape(len(enable), lanes), 0)
    return {"data": data, "enable": enable, "last": results["last"].astype(np.int64)}


def expected_beats(problem, params, want):
    """The expected beat log of ``want`` (the golden output)."""
    lanes, width = params.lanes, params.element_width
    n = problem["output_elements"]
    beats = -(-n // lanes)
    data = np.zeros(beats * lanes, np.uint64)
    data[:n] = np.ascontiguousarray(want).reshape(-1).view(_UINT[width])
    enable = np.full(beats, (1 << lanes) - 1, np.int64)
    last = np.zeros(beats, np.int64)
    if beats:
        enable[-1] = last_enable(n, lanes)
        last[-1] = 1
    return {"data": data.reshape(beats, lanes), "enable": enable, "last": last}


def random_elements(rng, shape, fmt):
    """Random elements of format ``fmt``: int8 uniform; floats with NaN / Inf / -0.0 /
    subnormals among them."""
    if fmt == "int8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    from ..golden.testing import random_floats
    size = int(np.prod(shape))
    return random_floats(rng, size, ELEMENT_DTYPES[fmt], specials=0.2).reshape(shape)


UNIT = Expand()
