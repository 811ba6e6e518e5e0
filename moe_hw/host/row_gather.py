"""What the three row-gather declarations share (``sparse_gather``, ``combine_gather``,
``dispatch_backward_data``): each is a header stream in, a memory read port and a row-beat
stream out, run by one cocotb bench (``sim/bench_row_gather.py``) with a memory model, and
scored with two scoreboards, over every output beat and over every memory read.

The memory model's latency is the run-time value ``memory_latency``
(:func:`~moe_hw.host.checks.memory_latency`).
"""

import numpy as np

from ..blocks.row_reader import last_enable, row_beats
from ..flows.fastsim import FastBench, MemoryReader, Sink, Source, lane_beats
from .checks import compare_log, compare_values
from .unit import AXI_READ_PARAMS, Unit

__all__ = ["RowGather"]


class RowGather(Unit):
    """Base of the row-gather declarations: the bench's settings, the output rows from the
    beat log, and the beat and read scoreboards."""

    bench = "bench_row_gather"
    axi_params = AXI_READ_PARAMS

    def bench_settings(self, params, sizes, *, feed, memory_latency, rows, reads):
        """The bench's settings: the run-time size ports ``sizes`` (port -> value), whether
        anything is offered (``feed``), the memory latency, and the expected output ``rows``
        and read rows (for the bench's time limit)."""
        beats = row_beats(sizes["hidden"], params.lanes)
        return {"lanes": params.lanes, "width": params.fmt.width, "runtime": dict(sizes),
                "feed": bool(feed), "memory_latency": int(memory_latency),
                "expected_beats": int(rows) * beats, "expected_reads": int(reads) * beats}

    def fast(self, stimulus, settings):
        """sim/bench_row_gather.py on the fast path: the same streams and results."""
        headers = {key[len("header_"):]: value for key, value in stimulus.items()
                   if key.startswith("header_")}
        if not settings["feed"]:
            headers = {key: value[:0] for key, value in headers.items()}
        count = len(next(iter(headers.values()), ()))
        beats, reads = settings["expected_beats"], settings["expected_reads"]
        return FastBench(
            streams={"header": Source(headers, only_known=True),
                     "read_request": MemoryReader("read_response", stimulus["memory"],
                                                  settings["memory_latency"],
                                                  requests=2 * reads + 16),
                     "data": Sink(depth=2 * beats + 16)},
            sizes=settings["runtime"],
            results={"data": "data.data", "enable": "data.enable", "last": "data.last",
                     "request_addr": "read_request.addr",
                     "request_enable": "read_request.enable",
                     "out_of_bounds": "read_request.out_of_bounds",
                     "headers_taken": "header.sent", "dropped": "dropped", "error": "error",
                     "busy_after": "busy"},
            limit=40 * (beats + reads + count) + 2000, what=self.name)

    @staticmethod
    def output_bits(results, rows, hidden, lanes, fmt):
        """The output rows (bit patterns, [rows, hidden]) from the beat log; zeros when the
        log does not hold exactly ``rows`` rows (the scoreboard reports that)."""
        beats = row_beats(hidden, lanes)
        data = results["data"]
        if rows == 0 or hidden == 0 or len(data) != rows * beats:
            return np.zeros((rows, hidden), dtype=fmt.uint_dtype)
        return data.reshape(rows, beats * lanes)[:, :hidden].astype(fmt.uint_dtype)

    @staticmethod
    def beat_findings(results, want_bits, lanes, fmt=None):
        """The output-beat scoreboard: every beat in order, its enables, its ``last`` flag and
        its data on the enabled lanes against ``want_bits`` ([rows, H] bit patterns). ``fmt``:
        compare as floats of that format (any NaN equals any NaN); None: bit for bit."""
        rows, hidden = want_bits.shape
        beats = row_beats(hidden, lanes)
        enable = np.full(beats, (1 << lanes) - 1, dtype=np.int64)
        last = np.zeros(beats, dtype=np.int64)
        if beats:
            enable[-1] = last_enable(hidden, lanes)
            last[-1] = 1
        want = {"enable": np.tile(enable, rows), "last": np.tile(last, rows),
                "data": lane_beats(want_bits, lanes)}
        on = (results["enable"][:, None] >> np.arange(lanes)) & 1 == 1
        got = {"enable": results["enable"], "last": results["last"],
               "data": np.where(on, results["data"], 0)}
        return compare_log("output", got, want, fmt)

    @staticmethod
    def read_findings(results, rows, hidden, lanes):
        """The read scoreboard: the exact reads, in order, for the expert-buffer or input
        ``rows`` and beats of ``rows`` (a list of (row, beat)), none out of bounds."""
        full = (1 << lanes) - 1
        beats = row_beats(hidden, lanes)
        want = {"addr": np.array([row * hidden + beat * lanes for row, beat in rows], np.int64),
                "enable": np.array([last_enable(hidden, lanes) if beat == beats - 1 else full
                                    for _, beat in rows], np.int64)}
        findings = compare_log("read log", {"addr": results["request_addr"],
                                            "enable": results["request_enable"]}, want)
        if int(results["out_of_bounds"]):
            findings.append(f"{int(results['out_of_bounds'])} lanes read out of bounds")
        return findings

    @staticmethod
    def status_findings(results, *, dropped, error, headers):
        """The status outputs and the headers taken against their expected values."""
        # (Compared as one-element arrays: checks.compare_values misses a difference between
        # two scalars.)
        findings = []
        for what, got, want in (("dropped", results["dropped"], dropped),
                                ("error", results["error"], int(error)),
                                ("headers taken", results["headers_taken"], headers)):
            findings += compare_values(what, [int(got)], [int(want)])
        return findings
