"""The fast simulation path: a whole problem runs inside the simulator, with no Python per cycle.

The cocotb path (:mod:`moe_hw.flows.simulate`, ``sim/harness.py``) wakes Python on every clock
edge to drive each stream beat and memory access: about 24,000 cycles/s at one lane. Here the
host writes the problem's stream words and memory contents to files, and a testbench
generated around the unit's emitted Verilog runs the problem to ``done`` on its own:

* the stream sources, sinks and memory models are small Verilog modules written once
  (``sim/fast_actors.v``), each the cycle-for-cycle twin of a cocotb actor of
  ``sim/harness.py``, so that a stall-free run takes exactly the cocotb path's cycle count;
  their seeded random pauses come from one xorshift32 per port (seed and probability are
  plusargs);
* they load their words from binary files before the clock starts and dump their logs raw at
  the end, so the host reads the results back in bulk: with ``$fread`` and ``$fwrite "%u"``
  in Icarus, and in the Verilator model with one ``fread`` and a buffered ``fwrite`` per
  array (``sim/fast_io.h``, called with ``$c``: the same bytes, without Verilator's byte at a
  time ``$fread`` and per-call string building, most of a seed-scale run before);
* the scoreboard's checks the cocotb benches make per beat become counters and flags (beats
  offered and taken, beats after ``done``, lanes out of bounds, writes per element past the
  unit's limit, a response queue overflow, a cycle limit that reports a hang), and the unit's
  own ``unpack``/``score`` then judge the logs exactly as they judge the cocotb bench's.

Why files (``$fread``/``$fwrite``) and a generated Verilog testbench rather than DPI or a
C++ harness:
the same testbench runs under Verilator (a standalone executable: a few lines of C++ toggle
the clock and call ``eval()``, faster than Verilator's ``--timing`` scheduler) and under
Icarus Verilog (``iverilog -g2012``, no build time, the four-state check), and the
memories' depths are the only thing the run's size changes, rounded up to a power of two so
that one build serves many problems. A unit says which of its ports are which actor in one
short :class:`FastBench` (its ``Unit.fast``); everything else is derived from the port
manifest.

Simulators: ``fast`` (Verilator) and ``fast-icarus``.
"""

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .sim_build import (SimulationError, _one_compile, _setup_verilator, _sim_dir,
                        _verilator_opt, build_root)

__all__ = ["FAST_SIMULATORS", "FastBench", "FastCheckError", "Source", "Sink", "MemoryReader",
           "MemoryWriter", "harness_counters", "harness_line", "lane_beats", "simulate_fast",
           "testbench"]

FAST_SIMULATORS = ("fast", "fast-icarus")
SETTLE = 16                    # cycles after done in which nothing may move (as run_once)
PROGRESS_PERIOD = 1 << 16      # cycles between the testbench's progress lines


class FastCheckError(SimulationError):
    """A check of the harness failed after the run started (a hang, beats after done, words
    left untaken, a write past an element's limit, a log overflowing): the run is
    reproducible, so a waveform of it can be written by running it again with a trace."""


# ---- the description a unit gives --------------------------------------------------------
@dataclass
class Source:
    """A stream source (``StreamSource``): ``fields`` maps payload field names to arrays, one
    entry (or one row of lanes, for an array field) per word (``None``: the whole payload),
    or is a sequence of whole payload words (ints). ``all_taken``: the run fails
    unless the unit takes every word (the cocotb bench's ``assert source.done``).
    ``only_known``: fields the payload does not have are left out (one description for
    several units whose payloads differ)."""

    fields: dict
    all_taken: bool = False
    only_known: bool = False       # leave out the fields the payload does not have


@dataclass
class Sink:
    """A stream sink (``StreamSink``) logging up to ``depth`` beats (more is an error)."""

    depth: int


@dataclass
class MemoryReader:
    """A memory read port (``MemoryReader``) on the request stream it is keyed by:
    ``response`` names the response stream, ``memory`` holds the elements' bits (or names the
    :class:`MemoryWriter` stream whose memory it reads: one array, two ports), ``latency``
    the cycles from a request taken to its response. ``requests``: room in its request log.
    ``all_taken``: the run fails if a response is left untaken (``assert not reader.queue``)."""

    response: str
    memory: np.ndarray
    latency: int
    requests: int
    all_taken: bool = False


@dataclass
class MemoryWriter:
    """A memory write port (``MemoryWriter``): a sink of up to ``depth`` beats (fields
    ``addr``, ``data``, ``enable``) writing into a zeroed memory of ``size`` elements.
    ``max_writes``: the most writes the unit's semantics give one element (1: written once;
    a unit that accumulates or rewrites in place says how many; ``None``: no limit); a write
    past it fails the run, naming the element."""

    size: int
    depth: int
    max_writes: int | None = 1


@dataclass
class FastBench:
    """One run of a unit on the fast path.

    ``streams``: stream name -> actor (a reader is keyed by its request stream); every stream
    of the unit needs one. ``sizes``: the unit's other input ports (run-time sizes), by name.
    ``results``: the bench's results dict, name -> where it comes from:

    * ``"stream.field"``: a sink's or writer's log field (``"stream.payload"`` for a payload
      without fields; ``"stream.field:signed"`` sign-extended), or a reader's ``addr`` or
      ``enable`` log;
    * ``"stream.memory"``: a writer's memory image;
    * ``"stream.sent"``, ``.count``, ``.requests``, ``.out_of_bounds``: counters;
    * ``"port.log"``: a monitor's (cycle, value) log;
    * a status port's name: its value after the run;
    * a function of the lookup of these (``get -> value``), or a value as is.

    ``cycles`` is added. ``limit``: the cycle limit (a hang is reported past it).
    ``monitors``: status port -> room for its changes, logged as (cycle, value) from the
    start edge (the cocotb benches' PhaseMonitor). ``finish``: for a unit without start and
    done (a plain stream block), ``(sink, count)``: the run ends when that sink has taken
    ``count`` beats, cycles counted from the actors' first step (as ``run_until``).
    ``settle``: the cycles after the end in which nothing may move."""

    streams: dict
    sizes: dict
    results: dict
    limit: int
    what: str = field(default="the unit")
    monitors: dict = field(default_factory=dict)
    finish: tuple | None = None
    settle: int = SETTLE


def lane_beats(rows, lanes):
    """Rows of elements ``[n, H]`` as beats ``[n * ceil(H / lanes), lanes]``, each row's last
    beat zero-padded past H (how every unit streams a row)."""
    rows = np.asarray(rows, dtype=np.uint64)
    count, hidden = rows.shape
    beats = -(-hidden // lanes)
    padded = np.zeros((count, beats * lanes), dtype=np.uint64)
    padded[:, :hidden] = rows
    return padded.reshape(count * beats, lanes)


# ---- payload words <-> files -------------------------------------------------------------
def _fields(desc, port):
    """``{name: (offset, element width, count or None)}`` of a payload port's layout."""
    if "array" in desc:                    # a plain array of lanes
        element = desc["array"]["element"]
        if "fields" in element or "array" in element:
            raise ValueError(f"port {port}: a nested layout, which the fast path does not "
                             "pack")
        return {None: (0, element["width"], desc["array"]["count"])}
    if "fields" not in desc:
        return {None: (0, desc["width"], None)}
    fields = {}
    for name, f in desc["fields"].items():
        if "array" in f:
            element = f["array"]["element"]
            if "fields" in element or "array" in element:
                raise ValueError(f"port {port}: field {name} is a nested layout, which the "
                                 "fast path does not pack")
            fields[name] = (f["offset"], element["width"], f["array"]["count"])
        elif "fields" in f:
            raise ValueError(f"port {port}: field {name} is a nested layout, which the fast "
                             "path does not pack")
        else:
            fields[name] = (f["offset"], f["width"], None)
    return fields


def _columns(offset, width, count):
    """The (bit offset, width) of each element of a field (one for a scalar field)."""
    if width > 64:
        raise ValueError(f"a field element of {width} bits is wider than 64")
    return [(offset + e * width, width) for e in range(count or 1)]


def _whole_bytes(width):
    """The little-endian NumPy dtype of a field element of 8, 16, 32 or 64 bits, else None.
    Such a field (the lanes of every data beat) moves between values and words as one view
    of its bytes, shifted once by its offset's bit in the byte, not element by element."""
    return np.dtype(f"<u{width // 8}") if width in (8, 16, 32, 64) else None


def _put_bytes(words, offset, raw):
    """OR ``raw`` (``[n, k]`` uint8, little-endian) into ``[n, bytes]`` words at bit
    ``offset``."""
    first, shift = offset // 8, offset % 8
    if not shift:
        words[:, first:first + raw.shape[1]] |= raw
        return
    wide = raw.astype(np.uint16) << shift                # each byte and its carry-out
    words[:, first:first + raw.shape[1]] |= wide.astype(np.uint8)
    words[:, first + 1:first + 1 + raw.shape[1]] |= (wide >> 8).astype(np.uint8)


def _get_elements(words, offset, dtype, count):
    """``count`` elements of ``dtype`` (8, 16 or 32 bits) of ``[n, bytes]`` words from bit
    ``offset`` off a byte boundary, as uint64 ``[n, count]``: each is the 64 bits from its
    first byte on (a strided 64-bit view; the words padded with zero bytes where the last
    element's reach runs past them) shifted down and cut to its width."""
    first, shift = offset // 8, offset % 8
    size = dtype.itemsize
    reach = first + (count - 1) * size + 8
    if reach > words.shape[1]:
        words = np.pad(words, ((0, 0), (0, reach - words.shape[1])))
    words = np.ascontiguousarray(words)
    wide = np.ndarray((len(words), count), dtype="<u8", buffer=words, offset=first,
                      strides=(words.strides[0], size))
    return (wide >> np.uint64(shift)) & np.uint64((1 << (8 * size)) - 1)


def _get_bytes(words, offset, count):
    """``count`` bytes of ``[n, bytes]`` words from bit ``offset`` (``[n, count]`` uint8).
    Off a byte boundary, each byte is the low byte of the 16 bits from its first byte on
    shifted down (a strided 16-bit view: the field's bits end in the byte after the last, which
    is in the word)."""
    first, shift = offset // 8, offset % 8
    if not shift:
        return np.ascontiguousarray(words[:, first:first + count])
    if first + count >= words.shape[1]:
        raise ValueError(f"a field of {count} bytes at bit {offset} is past a word of "
                         f"{words.shape[1]} bytes")
    words = np.ascontiguousarray(words)
    pairs = np.ndarray((len(words), count), dtype="<u2", buffer=words, offset=first,
                       strides=(words.strides[0], 1))
    return np.ascontiguousarray(pairs >> shift, dtype=np.uint8)


def _byte_span(bit, width):
    """The first byte, the shift in it and the bytes a field of ``width`` bits at ``bit``
    touches (at most 9: a 64-bit field off a byte boundary)."""
    return bit // 8, bit % 8, (bit % 8 + width + 7) // 8


def _put_bits(words, bit, width, values):
    """OR ``values`` (uint64, cut to ``width`` bits) into bits ``bit``.. of ``[n, bytes]``
    little-endian words: a few shifts per byte, no bit matrix."""
    first, shift, span = _byte_span(bit, width)
    if width < 64:
        values = values & np.uint64((1 << width) - 1)
    low = values << np.uint64(shift)
    for i in range(min(span, 8)):
        words[:, first + i] |= ((low >> np.uint64(8 * i)) & np.uint64(0xff)).astype(np.uint8)
    if span == 9:
        words[:, first + 8] |= (values >> np.uint64(64 - shift)).astype(np.uint8)


def _get_bits(words, bit, width):
    """Bits ``bit``..``bit + width - 1`` of ``[n, bytes]`` little-endian words, as uint64."""
    first, shift, span = _byte_span(bit, width)
    value = np.zeros(len(words), dtype=np.uint64)
    for i in range(min(span, 8)):
        value |= words[:, first + i].astype(np.uint64) << np.uint64(8 * i)
    value >>= np.uint64(shift)
    if span == 9:
        value |= words[:, first + 8].astype(np.uint64) << np.uint64(64 - shift)
    if width < 64:
        value &= np.uint64((1 << width) - 1)
    return value


def pack_words(desc, values, port):
    """Payload words (bytes, least significant first: ``[n, bytes]`` uint8) from field
    values: ``values`` maps field names (``None`` for a plain payload) to arrays, or is a
    sequence of whole payload words (Python ints, packed by the host)."""
    nbytes = max(1, -(-desc["width"] // 8))
    if not isinstance(values, dict):
        mask = (1 << desc["width"]) - 1
        raw = b"".join((int(word) & mask).to_bytes(nbytes, "little") for word in values)
        return np.frombuffer(raw, dtype=np.uint8).reshape(len(values), nbytes)
    fields = _fields(desc, port)
    unknown = set(values) - set(fields)
    if unknown:
        raise ValueError(f"port {port} has no field {sorted(unknown)[0]!r}; its fields are "
                         f"{', '.join(str(name) for name in fields)}")
    arrays = {name: np.asarray(value) for name, value in values.items()}
    lengths = {len(array) for array in arrays.values()}
    if len(lengths) > 1:
        raise ValueError(f"port {port}: the fields have different lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    words = np.zeros((n, nbytes), dtype=np.uint8)
    for name, array in arrays.items():
        offset, width, count = fields[name]
        values = array.astype(np.int64).view(np.uint64) if array.dtype.kind == "i" \
            else array.astype(np.uint64)
        values = values.reshape(n, count or 1)
        columns = _columns(offset, width, count)
        dtype = _whole_bytes(width)
        if dtype is not None:
            _put_bytes(words, offset, np.ascontiguousarray(values, dtype=dtype)
                       .view(np.uint8).reshape(n, len(columns) * dtype.itemsize))
            continue
        for e, (bit, w) in enumerate(columns):
            _put_bits(words, bit, w, values[:, e])
    return words


def write_words(path, words):
    """``[n, bytes]`` little-endian words as ``$fread`` reads them: each word big-endian."""
    Path(path).write_bytes(np.ascontiguousarray(words[:, ::-1]).tobytes())


def read_words(path, count):
    """``count`` words the testbench wrote raw (``$fwrite "%u"``: each word in 32-bit pieces,
    least significant first, each little-endian) as ``[count, bytes]`` little-endian words,
    padded to whole 32-bit pieces (the padding bits are 0)."""
    if count == 0:
        return np.zeros((0, 4), dtype=np.uint8)
    raw = np.fromfile(path, dtype=np.uint8)
    if len(raw) % count or (len(raw) // count) % 4:
        raise ValueError(f"{path}: {len(raw)} bytes, not {count} words of whole 32-bit pieces")
    return raw.reshape(count, len(raw) // count)


def unpack_field(words, desc, name, port):
    """One field of payload words: int64 ``[n]`` for a scalar field, uint64 ``[n, count]``
    for an array field (both unsigned, as the cocotb benches unpack them)."""
    offset, width, count = _fields(desc, port)[name]
    columns = _columns(offset, width, count)
    dtype = _whole_bytes(width)
    if not len(words):
        out = np.zeros((0, count or 1), dtype=np.uint64)
    elif dtype is not None and offset % 8 and dtype.itemsize < 8:
        out = _get_elements(words, offset, dtype, len(columns))
    elif dtype is not None:
        out = _get_bytes(words, offset, len(columns) * dtype.itemsize).view(dtype)
    else:
        out = np.stack([_get_bits(words, bit, w) for bit, w in columns], axis=1)
    return out.astype(np.uint64, copy=False) if count is not None \
        else out[:, 0].astype(np.int64)


# ---- the testbench -----------------------------------------------------------------------
# The least room a memory, log or queue of the testbench gets: the small problems of the tests
# and of design checks then all run on one build of a design (a Verilator build takes 3 to
# 15 s; a run of a small problem takes milliseconds).
MIN_DEPTH = 1 << 12


def _depth(n):
    """Room for ``n`` words: the next power of two, at least ``MIN_DEPTH`` (so that one build
    serves many sizes)."""
    return max(MIN_DEPTH, 1 << max(0, int(n) - 1).bit_length())


def _width(desc):
    return desc["width"]


def _stream_names(ports):
    return sorted({name[:-len("__payload")] for name in ports if name.endswith("__payload")})


def _check_streams(ports, bench):
    streams = _stream_names(ports)
    covered = set()
    for name, actor in bench.streams.items():
        if name not in streams:
            raise ValueError(f"the fast description names stream {name!r}, which the unit "
                             f"does not have; its streams are {', '.join(streams)}")
        covered.add(name)
        if isinstance(actor, MemoryReader):
            covered.add(actor.response)
    missing = [name for name in streams if name not in covered]
    if missing:
        raise ValueError(f"the fast description has no actor for stream(s) "
                         f"{', '.join(missing)}")


def _field_param(ports, port, name):
    offset, width, count = _fields(ports[port], port)[name]
    return offset, width, count


def testbench(top, ports, bench, *, sim="fast"):
    """The Verilog testbench ``fast_tb`` around module ``top`` (its port manifest ``ports``)
    for ``bench`` in ``sim``; depends only on the design and the memories' rounded depths."""
    _check_streams(ports, bench)
    lines = [f"// The fast-path testbench of {top} (generated by moe_hw.flows.fastsim).",
             "module fast_tb(input clk);"]
    add = lines.append
    if sim == "fast":
        # The C++ model's bulk loads and dumps (the actors' $c calls) in the model's header,
        # by their absolute path: a compiler flag would come before Verilator's precompiled
        # header (unusable then) and change the runtime objects' cached compiles. (Verilator
        # only: Icarus does not know the directive, and an `ifdef around it confuses
        # Verilator's preprocessor.)
        lines += ["`systemc_header", f'#include "{_io_header()}"', "`verilog"]
    add("    reg rst, start, fast_actor_rst = 1'b1, fast_finished = 1'b0;")
    add("    reg [63:0] fast_edges = 64'd0, fast_cycles = 64'd0, fast_limit = 64'd0;")
    add("    reg [63:0] fast_settle = 64'd0, fast_moved_at_done = 64'd0;")
    add("    reg [63:0] fast_period = 64'd0, fast_report = 64'd0;")
    add("    reg [31:0] fast_seed = 32'd0;")
    add("    reg [15:0] fast_threshold = 16'd0;")
    add("    wire fast_step = !fast_actor_rst;")
    stream_ports = set()
    for name in _stream_names(ports):
        stream_ports |= {f"{name}__valid", f"{name}__ready", f"{name}__payload"}
    inputs, outputs = [], []
    for name, desc in ports.items():
        if name in ("clk", "rst", "start"):
            continue
        width = _width(desc)
        if name in stream_ports:
            add(f"    wire [{width - 1}:0] {name};")
        elif desc["direction"] == "input":
            if name not in bench.sizes:
                raise ValueError(f"the fast description gives no value for input port {name}")
            inputs.append(name)
            add(f"    reg [{width - 1}:0] {name};")
        else:
            outputs.append(name)
            add(f"    wire [{width - 1}:0] {name};")
    # The unit's inputs get their first values after every process waits (Icarus: the
    # emitted always @* blocks run on events only, as when cocotb drives them at time 0).
    add("    initial begin")
    add("`ifndef VERILATOR")
    add("        #1;")
    add("`endif")
    add("        rst = 1'b1;")
    add("        start = 1'b0;")
    add("        if (!$value$plusargs(\"limit=%d\", fast_limit)) fast_limit = 64'd1000;")
    add("        if (!$value$plusargs(\"seed=%d\", fast_seed)) fast_seed = 32'd0;")
    add("        if (!$value$plusargs(\"threshold=%d\", fast_threshold)) fast_threshold = 16'd0;")
    add(f"        if (!$value$plusargs(\"period=%d\", fast_period)) fast_period = 64'd{PROGRESS_PERIOD};")
    for name in inputs:
        add(f"        if (!$value$plusargs(\"size_{name}=%d\", {name})) {name} = 0;")
    add("    end")
    add("`ifdef FAST_TRACE")
    add("    reg [8*1024-1:0] fast_trace;")
    add("    initial if ($value$plusargs(\"trace=%s\", fast_trace)) begin")
    add("        $dumpfile(fast_trace);")
    add("        $dumpvars(0, fast_tb);")
    add("    end")
    add("`endif")
    connections = ", ".join(f".{name}({name})" for name in ["clk", "rst", *ports])
    add(f"    {top} unit({connections});")
    common = "clk, fast_actor_rst, fast_step, fast_seed, fast_threshold"
    moved = []
    for salt, (name, actor) in enumerate(bench.streams.items()):
        payload = ports[f"{name}__payload"]
        width = _width(payload)
        handshake = f"{name}__valid, {name}__ready, {name}__payload"
        if isinstance(actor, Source):
            mem_width = 8 * max(1, -(-width // 8))
            words = actor.fields.values() if isinstance(actor.fields, dict) \
                else [actor.fields]
            depth = _depth(len(next(iter(words), ())))
            add(f"    wire [63:0] {name}__sent;")
            add(f"    fast_source #(.NAME(\"{name}\"), .W({width}), .MEM_W({mem_width}), "
                f".DEPTH({depth}), .SALT({salt})) {name}__actor({common}, {handshake}, "
                f"{name}__sent);")
            moved.append(f"{name}__sent")
        elif isinstance(actor, Sink):
            add(f"    wire [63:0] {name}__count;")
            add(f"    fast_sink #(.NAME(\"{name}\"), .W({width}), .DEPTH({_depth(actor.depth)}), "
                f".SALT({salt})) {name}__actor({common}, {handshake}, {name}__count);")
            moved.append(f"{name}__count")
        elif isinstance(actor, MemoryWriter):
            fields = _fields(payload, f"{name}__payload")
            addr_off, addr_w, _ = fields["addr"]
            data_off, elem_w, lanes = fields["data"]
            en_off = fields["enable"][0]
            add(f"    wire [63:0] {name}__count;")
            add(f"    fast_memory_writer #(.NAME(\"{name}\"), .W({width}), "
                f".DEPTH({_depth(actor.depth)}), .SIZE({_depth(actor.size)}), "
                f".ELEM_W({elem_w}), .LANES({lanes or 1}), .ADDR_OFF({addr_off}), "
                f".ADDR_W({addr_w}), .DATA_OFF({data_off}), .EN_OFF({en_off}), "
                f".IMAGE({int(_wants_image(bench, name))}), .SALT({salt})) "
                f"{name}__actor({common}, {handshake}, {name}__count);")
            moved.append(f"{name}__count")
        elif isinstance(actor, MemoryReader):
            response = ports[f"{actor.response}__payload"]
            request_fields = _fields(payload, f"{name}__payload")
            addr_off, addr_w, _ = request_fields["addr"]
            has_en = "enable" in request_fields
            en_off = request_fields["enable"][0] if has_en else 0
            data_off, elem_w, lanes = _fields(response, f"{actor.response}__payload")["data"]
            add(f"    wire [63:0] {name}__requests;")
            shared = isinstance(actor.memory, str)
            add(f"    wire [{(lanes or 1) * elem_w - 1}:0] {name}__shared;")
            if shared:
                if not isinstance(bench.streams.get(actor.memory), MemoryWriter):
                    raise ValueError(f"reader {name} shares the memory of {actor.memory!r}, "
                                     "which is not a memory writer of the description")
                add(f"    wire [{addr_w - 1}:0] {name}__addr = "
                    f"{name}__payload[{addr_off + addr_w - 1}:{addr_off}];")
                lanes_read = ", ".join(f"{actor.memory}__actor.memory[{name}__addr + {lane}]"
                                       for lane in reversed(range(lanes or 1)))
                add(f"    assign {name}__shared = {{{lanes_read}}};")
            else:
                add(f"    assign {name}__shared = 0;")
            add(f"    fast_memory_reader #(.NAME(\"{name}\"), .REQ_W({width}), "
                f".RESP_W({_width(response)}), .SIZE({1 if shared else _depth(len(actor.memory))}), "
                f".SHARED({int(shared)}), "
                f".ELEM_W({elem_w}), .MEM_W({8 * max(1, -(-elem_w // 8))}), "
                f".LANES({lanes or 1}), .ADDR_OFF({addr_off}), .ADDR_W({addr_w}), "
                f".HAS_EN({int(has_en)}), .EN_OFF({en_off}), .DATA_OFF({data_off}), "
                f".LOG_DEPTH({_depth(actor.requests)}), .SALT({salt})) "
                f"{name}__actor({common}, {handshake}, {actor.response}__valid, "
                f"{actor.response}__ready, {actor.response}__payload, {name}__requests, "
                f"{name}__shared);")
            moved.append(f"{name}__requests")
        else:
            raise TypeError(f"stream {name}: not an actor: {actor!r}")
    for name, depth in bench.monitors.items():
        add(f"    fast_monitor #(.NAME(\"{name}\"), .W({_width(ports[name])}), "
            f".DEPTH({_depth(depth)})) {name}__monitor(clk, fast_actor_rst, fast_step, {name}, "
            "fast_edges - 2);")
    total = " + ".join(moved) or "64'd0"
    add(f"    wire [63:0] fast_moved = {total};")
    status = " ".join(f"status.{name}=%0d" for name in outputs)
    # The timeline of harness.reset and run_once: reset over edges 1 and 2; the actors step
    # from edge 2 on; start is high between edges 2 and 3 (cycle 0); done is looked at from
    # edge 4 (cycle 1) on, then ``settle`` more cycles in which nothing may move. Without
    # start and done (``finish``, as run_until): cycles count from edge 2, the actors' first
    # step, and the run ends at the edge whose step takes the sink's last beat.
    if bench.finish is None:
        done, before = "done", 2
    else:
        sink = bench.finish[0]
        add("    reg [63:0] fast_finish_count = 64'd0;")
        add("    initial if (!$value$plusargs(\"finish_count=%d\", fast_finish_count)) "
            "fast_finish_count = 64'd0;")
        add(f"    wire fast_done = {sink}__count + ({sink}__valid && {sink}__ready) "
            ">= fast_finish_count;")
        done, before = "fast_done", 1
    add("    always @(posedge clk) begin")
    add("        fast_edges <= fast_edges + 1;")
    add("        if (fast_edges == 0) fast_actor_rst <= 1'b0;")
    add("        if (fast_edges == 1) begin rst <= 1'b0; start <= 1'b1; end")
    add("        if (fast_edges == 2) start <= 1'b0;")
    add("        if (fast_period != 0 && fast_edges == fast_report) begin")
    add("            $display(\"FASTSIM progress=%0d\", fast_edges);")
    add("            $fflush;")
    add("            fast_report <= fast_edges + fast_period;")
    add("        end")
    add(f"        if (fast_edges >= {before + 1} && !fast_finished) begin")
    add(f"            if ({done}) begin")
    add("                fast_finished <= 1'b1;")
    add(f"                fast_cycles <= fast_edges - {before};")
    add(f"            end else if (fast_edges - {before} >= fast_limit) begin")
    add(f"                $display(\"FASTSIM hang=%0d\", fast_edges - {before});")
    add("                $finish;")
    add("            end")
    add("        end")
    add("        if (fast_finished) begin")
    add("            fast_settle <= fast_settle + 1;")
    add("            if (fast_settle == 0) fast_moved_at_done <= fast_moved;")
    add(f"            if (fast_settle == {bench.settle}) begin")
    add("                $display(\"FASTSIM cycles=%0d moved_after_done=%0d\", fast_cycles, "
        "fast_moved - fast_moved_at_done);")
    add("                $fflush;")
    if outputs:
        add(f"                $display(\"FASTSIM {status}\", {', '.join(outputs)});")
    add("                $finish;")
    add("            end")
    add("        end")
    add("    end")
    add("endmodule")
    add("")
    add("`ifndef VERILATOR")
    add("module fast_tb_icarus;")
    add("    reg clk = 1'b0;")
    add("    always #5 clk = ~clk;")
    add("    fast_tb tb(clk);")
    add("endmodule")
    add("`endif")
    return "\n".join(lines) + "\n"


# ---- building and running ----------------------------------------------------------------
_MAIN_CPP = """// The fast path's Verilator main: toggles the clock until $finish.
#include "Vfast_tb.h"
#include "verilated.h"

int main(int argc, char** argv) {
    VerilatedContext* context = new VerilatedContext;
    context->commandArgs(argc, argv);
#ifdef FAST_TRACE
    context->traceEverOn(true);
#endif
    Vfast_tb* top = new Vfast_tb{context};
    top->clk = 0;
    top->eval();
    while (!context->gotFinish()) {
        context->timeInc(5);
        top->clk = !top->clk;
        top->eval();
    }
    top->final();
    delete top;
    delete context;
    return 0;
}
"""


def _actors_path():
    return _sim_dir() / "fast_actors.v"


def _io_header():
    """sim/fast_io.h, the Verilator model's bulk loads and dumps (the actors call it with
    $c; the testbench includes it into the model's header)."""
    return _sim_dir() / "fast_io.h"


def _trace_kind(trace):
    """``None``, "fst" or "vcd", from the waveform file's name (FST unless it ends in .vcd)."""
    if trace is None:
        return None
    return "vcd" if str(trace).endswith(".vcd") else "fst"


def _build(sim, verilog_text, tb_text, top, trace, progress):
    """The executable (Verilator) or compiled ``.vvp`` (Icarus) of the testbench, built once
    per distinct text under the build root; returns the command that runs it. ``trace``:
    None, "fst" or "vcd", the waveform the build can write."""
    actors = _actors_path().read_text()
    header = _io_header()
    opt = _verilator_opt() if sim == "fast" else ""
    # The per-cycle code at -O2 (Verilator's own -Os runs slower; -O3 is no faster), and
    # Verilator's runtime (the $fread, $fwrite and start-up code, compiled once: objcache.py)
    # at -O2; the set-up code stays unoptimised (see flows/sim_build.py), unless one level is
    # asked for (then the model is one compile).
    make_args, make_env = _one_compile("../main")    # (make runs in obj/, main.cpp beside it)
    levels = ["-CFLAGS", opt, *[flag for arg in make_args for flag in ("-MAKEFLAGS", arg)]] \
        if opt else ["-MAKEFLAGS", "OPT_FAST=-O2 OPT_GLOBAL=-O2"]
    digest = hashlib.sha1("\0".join([verilog_text, tb_text, actors, header.read_text(),
                                     _MAIN_CPP, *levels, str(trace)]).encode()).hexdigest()[:16]
    build_dir = build_root() / f"{top}-{sim}-{digest}{opt}{f'-{trace}' if trace else ''}"
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    if sim == "fast":
        _setup_verilator()
        binary = build_dir / "obj" / "fast_tb"
        command = [str(binary)]
    else:
        binary = build_dir / "fast_tb.vvp"
        command = ["vvp", "-n", str(binary)] + ([f"-{trace}"] if trace else [])
    with open(build_dir.parent / f"{build_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (build_dir / "built.ok").exists():
            if progress and sim == "fast":
                progress(f"building the fast Verilator model of {top} in {build_dir} "
                         "(once per distinct design and memory size)")
            build_dir.mkdir(parents=True, exist_ok=True)
            sources = [build_dir / f"{top}.v", build_dir / "fast_actors.v",
                       build_dir / "fast_tb.v"]
            for path, text in zip(sources, (verilog_text, actors, tb_text)):
                path.write_text(text)
            define = ["-DFAST_TRACE"] if trace else []
            if sim == "fast":
                (build_dir / "main.cpp").write_text(_MAIN_CPP)
                # --x-initial fast: no random start values (every register of the unit and
                # the harness has its own; memories are zeroed or loaded): 20 % off the start.
                args = ["verilator", "--cc", "--exe", "--build", "-j", "2", "-O3",
                        "--x-assign", "fast", "--x-initial", "fast", "--noassert", "-Wno-fatal", "-Wno-lint",
                        "-Wno-style", "--top-module", "fast_tb", "-Mdir", "obj",
                        "-o", "fast_tb", *define,
                        *({"fst": ["--trace-fst"], "vcd": ["--trace"]}.get(trace, [])),
                        *levels, *(["-CFLAGS", "-DFAST_TRACE"] if trace else []),
                        *[str(path) for path in sources], "main.cpp"]
            else:
                args = ["iverilog", "-g2012", "-s", "fast_tb_icarus", "-o", str(binary),
                        *define, *[str(path) for path in sources]]
            done = subprocess.run(args, cwd=build_dir, capture_output=True, text=True,
                                  env={**os.environ, **make_env})
            (build_dir / "build.log").write_text(done.stdout + done.stderr)
            if done.returncode:
                raise SimulationError(f"building the fast testbench of {top} failed "
                                      f"({args[0]}):\n{(done.stdout + done.stderr)[-6000:]}")
            (build_dir / "built.ok").write_text("ok\n")
    return command, build_dir


class _Progress:
    """A progress bar on stderr (cycles done of the expected), shown once a run has taken
    more than ``after`` seconds; redrawn in place on a terminal, a line every 10 s otherwise."""

    def __init__(self, what, expected, after=2.0):
        self.what, self.expected, self.after = what, expected, after
        self.start = self.last = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.shown = False

    def update(self, cycles):
        now = time.perf_counter()
        if now - self.start < self.after or (not self.tty and now - self.last < 10):
            return
        self.last, self.shown = now, True
        rate = cycles / (now - self.start)
        if self.expected:
            done = min(1.0, cycles / self.expected)
            bar = "#" * int(30 * done) + "." * (30 - int(30 * done))
            text = (f"{self.what}: [{bar}] {cycles}/{self.expected} cycles "
                    f"({100 * done:.0f} %), {rate / 1e6:.2f} Mcycles/s")
        else:
            text = f"{self.what}: {cycles} cycles, {rate / 1e6:.2f} Mcycles/s"
        print(("\r" + text) if self.tty else text, end="" if self.tty else "\n",
              file=sys.stderr, flush=True)

    def close(self):
        if self.shown and self.tty:
            print(file=sys.stderr, flush=True)


def _run(command, args, cwd, what, expected, progress):
    """Run the simulator; returns its ``FASTSIM`` lines as ``key=value`` (a dict of text, with
    ``seconds``: the time from the clock's start to done, loading and dumping left out) and
    its whole output. Ctrl-C stops the simulator and re-raises."""
    bar = _Progress(what, expected) if progress else None
    values, output, timing = {}, [], {}
    process = subprocess.Popen(command + args, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
        for line in process.stdout:
            output.append(line)
            if not line.startswith("FASTSIM "):
                continue
            if line.startswith("FASTSIM error:"):
                values.setdefault("error", line[len("FASTSIM error:"):].strip())
                continue
            for key, value in re.findall(r"(\S+)=(\S+)", line):
                values[key] = value
            if "started" not in timing:       # the first progress line: edge 0, data loaded
                timing["started"] = time.perf_counter()
            if "cycles" in values and "finished" not in timing:
                timing["finished"] = time.perf_counter()
            if bar and "progress" in values:
                bar.update(int(values.pop("progress")))
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()      # (else its finaliser warns of an unclosed file)
        if bar:
            bar.close()
    if "started" in timing and "finished" in timing:
        values["seconds"] = timing["finished"] - timing["started"]
    return values, "".join(output)


def simulate_fast(verilog_text, ports, top, bench, *, sim="fast", stall=0.0, seed=0,
                  progress=None, expected_cycles=None, trace=None):
    """Run ``bench`` (a :class:`FastBench`) on the design ``verilog_text`` (module ``top``,
    port manifest ``ports``) in ``sim``; returns the results dict ``bench.results`` names,
    plus ``cycles`` and ``harness`` (:func:`harness_counters`). A failed check of the harness
    raises :class:`FastCheckError`. ``trace``: write a waveform there (VCD if its name ends in .vcd, else
    FST)."""
    if sim not in FAST_SIMULATORS:
        raise ValueError(f"Fast simulator must be one of {', '.join(FAST_SIMULATORS)}, "
                         f"not {sim!r}")
    if sim == "fast-icarus" and (shutil.which("iverilog") is None or
                                 shutil.which("vvp") is None):
        raise SimulationError("cannot simulate with fast-icarus: Icarus Verilog is not "
                              "installed (apt-get install iverilog)")
    tb_text = testbench(top, ports, bench, sim=sim)
    if sim == "fast" and _trace_kind(trace) == "fst":
        _setup_verilator()
        include = Path(os.environ["VERILATOR_ROOT"]) / "include"
        if not any(Path(folder, "lz4.h").is_file()
                   for folder in ("/usr/include", "/usr/local/include", include)):
            raise SimulationError(f"--trace {trace}: Verilator writes FST with lz4, whose header "
                                  "(lz4.h) is not installed (apt-get install liblz4-dev); ask "
                                  "for a .vcd file instead, or use --sim fast-icarus")
    command, build_dir = _build(sim, verilog_text, tb_text, top, _trace_kind(trace), progress)
    runs = build_dir / "runs"
    runs.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=runs) as run_dir:
        run_dir = Path(run_dir)
        args = [f"+limit={int(bench.limit)}", f"+seed={int(seed) & 0xffffffff}",
                *([f"+finish_count={int(bench.finish[1])}"] if bench.finish else []),
                f"+threshold={min(65535, round(float(stall) * 65536))}"]
        if trace is not None:
            args.append(f"+trace={Path(trace).resolve()}")
        for name, value in bench.sizes.items():
            args.append(f"+size_{name}={int(value) & ((1 << ports[name]['width']) - 1)}")
        for name, actor in bench.streams.items():
            if isinstance(actor, Source):
                payload = ports[f"{name}__payload"]
                fields = actor.fields
                if actor.only_known and isinstance(fields, dict):
                    known = _fields(payload, name)
                    fields = {key: value for key, value in fields.items() if key in known}
                words = pack_words(payload, fields, name)
                write_words(run_dir / f"{name}.bin", words)
                args += [f"+{name}={run_dir / f'{name}.bin'}", f"+{name}_count={len(words)}"]
            elif isinstance(actor, (Sink, MemoryWriter)):
                args.append(f"+{name}_out={run_dir / f'{name}.out'}")
                if isinstance(actor, MemoryWriter):
                    args += [f"+{name}_size={int(actor.size)}",
                             f"+{name}_max_writes={int(actor.max_writes or 0)}"]
                    if _wants_image(bench, name):
                        args.append(f"+{name}_memory={run_dir / f'{name}.memory'}")
            elif isinstance(actor.memory, str):          # a writer's memory
                args += [f"+{name}_size={int(bench.streams[actor.memory].size)}",
                         f"+{name}_latency={int(actor.latency)}",
                         f"+{name}_addr={run_dir / f'{name}.addr'}",
                         f"+{name}_enable={run_dir / f'{name}.enable'}"]
            else:
                memory = np.asarray(actor.memory).astype(np.uint64)
                words = np.ascontiguousarray(memory.astype("<u8")).view(np.uint8)
                elem_w = _fields(ports[f"{actor.response}__payload"], actor.response)["data"][1]
                write_words(run_dir / f"{name}.bin",
                            words.reshape(len(memory), 8)[:, :max(1, -(-elem_w // 8))])
                args += [f"+{name}={run_dir / f'{name}.bin'}", f"+{name}_size={len(memory)}",
                         f"+{name}_latency={int(actor.latency)}",
                         f"+{name}_addr={run_dir / f'{name}.addr'}",
                         f"+{name}_enable={run_dir / f'{name}.enable'}"]
        for name in bench.monitors:
            args += [f"+{name}_cycle={run_dir / f'{name}.cycle'}",
                     f"+{name}_value={run_dir / f'{name}.value'}"]
        if progress:
            progress(f"simulating {top} in {sim}")
        values, output = _run(command, args, run_dir, f"simulating {top}", expected_cycles,
                              progress)
        if "error" in values:
            raise SimulationError(f"{top} in {sim}: {values['error']}")
        if "hang" in values:
            raise FastCheckError(f"{bench.what} did not finish within {bench.limit} cycles "
                                 "(hang?)")
        if "cycles" not in values:
            raise SimulationError(f"{top} in {sim} stopped without finishing:\n"
                                  f"{output[-6000:]}")
        if int(values["moved_after_done"]):
            raise FastCheckError(f"{bench.what} moved after done: "
                                 f"{values['moved_after_done']} more beats in the "
                                 f"{bench.settle} cycles after it")
        if progress and "seconds" in values:
            cycles, seconds = int(values["cycles"]), values["seconds"]
            progress(f"simulated {cycles} cycles in {seconds:.3f} s from the clock's start to "
                     f"done ({cycles / max(seconds, 1e-9):.0f} cycles/s)")
        return _results(bench, ports, values, run_dir, top, sim)


def _wants_image(bench, name):
    """Whether writer ``name``'s elements are read: by a reader sharing its memory, or by the
    results (a function of the lookup may). Keeping and dumping a memory nobody reads costs
    time at large sizes (the write log has every write)."""
    return any(isinstance(actor, MemoryReader) and isinstance(actor.memory, str) and
               actor.memory == name for actor in bench.streams.values()) or \
        any(callable(spec) or spec == f"{name}.memory" for spec in bench.results.values())


def harness_counters(values):
    """The harness's counters and flags of a run (``FASTSIM actor.key=value`` lines) as
    ``{"actor.key": int}``: beats offered and taken, beats logged, requests, lanes out of
    bounds, writes per element, responses left, beats after done."""
    return {key: int(value) for key, value in values.items()
            if ("." in key and not key.startswith("status.") and value.isdigit())
            or key == "moved_after_done"}


def harness_line(counters):
    """One report line of :func:`harness_counters`: beats in (taken of offered), beats out,
    reads, lanes out of bounds, writes per element (most, and the limit), after done."""
    def total(key):
        return sum(value for name, value in counters.items() if name.endswith(f".{key}"))

    parts = [f"beats in {total('sent')} of {total('words')}",
             f"beats out {total('count')}", f"reads {total('requests')}",
             f"lanes out of bounds {total('out_of_bounds')}"]
    for name in sorted(key[:-len(".max_writes")] for key in counters
                       if key.endswith(".max_writes")):
        limit = counters[f"{name}.max_writes"]
        parts.append(f"{name}: {counters[f'{name}.written']} elements written, at most "
                     f"{counters[f'{name}.most_writes']} writes to one (limit "
                     f"{limit if limit else 'none'})")
    parts.append(f"beats after done {counters.get('moved_after_done', 0)}")
    return "harness: " + ", ".join(parts)


def _results(bench, ports, values, run_dir, top, sim):
    logs = {}
    for name, actor in bench.streams.items():
        if isinstance(actor, Source):
            sent, count = int(values[f"{name}.sent"]), int(values[f"{name}.words"])
            if actor.all_taken and sent != count:
                raise FastCheckError(f"{sent} of {count} {name} words taken")
        elif isinstance(actor, (Sink, MemoryWriter)):
            count, depth = int(values[f"{name}.count"]), int(values[f"{name}.depth"])
            if count > depth:
                raise FastCheckError(f"{bench.what} sent {count} {name} beats, more than the "
                                     f"{depth} its fast description allows")
            logs[name] = read_words(run_dir / f"{name}.out", count)
            if isinstance(actor, MemoryWriter) and int(values[f"{name}.rewrites"]):
                limit = int(values[f"{name}.max_writes"])
                raise FastCheckError(
                    f"{bench.what} wrote element {values[f'{name}.first_rewrite']} of the "
                    f"{name} memory more than {limit} time{'s' if limit > 1 else ''}, the most "
                    f"its semantics allow (first at simulation time "
                    f"{values[f'{name}.first_rewrite_time']}; {values[f'{name}.rewrites']} "
                    f"lane writes past the limit, {values[f'{name}.most_writes']} writes to "
                    "one element at most)")
        else:
            count, depth = int(values[f"{name}.requests"]), int(values[f"{name}.log_depth"])
            if count > depth:
                raise FastCheckError(f"{bench.what} made {count} {name} requests, more than "
                                     f"the {depth} its fast description allows")
            pending = int(values[f"{name}.pending"])
            if actor.all_taken and pending:
                raise FastCheckError(f"{pending} {actor.response} responses never taken")
            if int(values[f"{name}.queue_overflow"]):
                raise FastCheckError(f"{name}: more requests in flight than the memory "
                                     "model's queue holds")

    def lookup(spec):
        if callable(spec):
            return spec(lookup)
        if not isinstance(spec, str):
            return spec
        if "." not in spec:
            if f"status.{spec}" not in values:
                raise ValueError(f"the fast description's result {spec!r} is not a status "
                                 "port of the unit")
            return np.int64(int(values[f"status.{spec}"]))
        if spec.endswith(":signed"):
            value = lookup(spec[:-len(":signed")])
            name, key = spec[:-len(":signed")].split(".", 1)
            width = _fields(ports[f"{name}__payload"], name)[key][1]
            return np.where(value >> (width - 1) & 1, value - (1 << width), value)
        name, key = spec.split(".", 1)
        if name in bench.monitors and key == "log":
            count = int(values[f"{name}.changes"])
            if count > int(values[f"{name}.depth"]):
                raise FastCheckError(f"{name} changed {count} times, more than its fast "
                                     "description allows")
            return np.stack([unpack_field(read_words(run_dir / f"{name}.{column}", count),
                                          {"width": 64}, None, name)
                             for column in ("cycle", "value")], axis=1).reshape(count, 2)
        actor = bench.streams[name]
        if name in logs and (key in _fields(ports[f"{name}__payload"], name) or
                             key == "payload"):
            return unpack_field(logs[name], ports[f"{name}__payload"],
                                None if key == "payload" else key, name)
        if f"{name}.{key}" in values:
            return np.int64(int(values[f"{name}.{key}"]))
        if isinstance(actor, MemoryWriter) and key == "memory":
            elem_w = _fields(ports[f"{name}__payload"], name)["data"][1]
            words = read_words(run_dir / f"{name}.memory", int(actor.size))
            return unpack_field(words, {"width": elem_w}, None, name).view(np.uint64)
        if isinstance(actor, MemoryReader) and key in ("addr", "enable"):
            count = int(values[f"{name}.requests"])
            words = read_words(run_dir / f"{name}.{key}", count)
            return unpack_field(words, {"width": 8 * words.shape[1]}, None, name)
        raise ValueError(f"the fast description's result {spec!r} names nothing known")

    results = {key: lookup(spec) for key, spec in bench.results.items()}
    results["cycles"] = np.int64(int(values["cycles"]))
    results["harness"] = harness_counters(values)
    return results
