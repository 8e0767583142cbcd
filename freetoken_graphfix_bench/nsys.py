"""``bench nsys``: what Nsight Systems' kernel trace can say about each build's decode graphs, and what
it cannot.

Reads ``nsys stats --report cuda_gpu_trace --format csv`` of a run profiled with
``--cuda-graph-trace=node`` (every kernel of a graph launch its own row, all sharing the launch's
``CorrId``): its ``--output`` file or its stdout as printed (the "Processing [...]" and NOTICE lines
before the header are skipped), with or without the ``GreenCtx`` column. Each row becomes the kernel
record ``timeline`` reads; a graph is known by its kernels per launch.

Under node-level tracing ``cuGraphLaunch`` takes milliseconds on the host instead of tens of µs
(docs/measurements.md, "Nsight Systems and the profilers' own launch time"). A wait-sync graph's PLE
WAIT is released by the host only after the launch returns, so under the profiler the GPU sits at
that WAIT for the profiler's own launch time: the step is the profiler's, and differs by run, not by
build. So per graph this reports that stall on its own (the longest gap at one fixed place in every
launch: where the WAIT sits) and every other figure with it left out: kernel busy time, the span,
the median gap between kernels per stream. Those are comparable across builds; the stall and the time
from launch to launch are not, and the cost of the upload is read unprofiled (``bench engine``).
"""

from __future__ import annotations

import csv
import gzip
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from .timeline import busy_us, first_streams, graph_launches, kernel_end, stream_gaps, streams
from .verdicts import pct

COLUMNS = {"start": "Start (ns)", "duration": "Duration (ns)", "correlation": "CorrId", "stream": "Strm",
           "name": "Name"}
ACCEPTED = ("accepted values are the CSV of `nsys stats --report cuda_gpu_trace --format csv` (its --output file "
            "or its stdout) from a run profiled with --cuda-graph-trace=node")
STALL_US = 10.0  # a fixed-place gap this long is a stall (a WAIT the host had not released), not scheduling
LARGE_STALL_US = 100.0  # a stall this long a launch holds the profiler's own launch time: said in one line


class TraceError(ValueError):
    """A file that is not such a trace; its message is one line naming the file and, where it can, the row."""


@dataclass(frozen=True)
class Stall:
    """The longest gap at one fixed place of a graph's launches: after its ``after``-th kernel (from 1)
    on its busiest stream; where a wait-sync graph's PLE WAIT sits."""

    after: int
    median_us: float
    low_us: float
    high_us: float


@dataclass(frozen=True)
class GraphFigures:
    """One graph of one trace, over its launches after the first (the first launch is its own figure)."""

    kernels: int  # per launch: how the graph is known
    launches: int  # every launch, the first included
    busy_us: float  # union of its kernels' intervals, median over launches
    span_us: float  # first kernel's start to last kernel's end, the stall left out, median over launches
    stall: Stall | None
    gap_us: dict[str, float]  # ranked stream -> median gap between consecutive kernels, the stall left out


@dataclass(frozen=True)
class Trace:
    path: str
    graphs: list[GraphFigures]  # in order of first launch


def read(path: str) -> Trace:
    """One profiled run's figures per graph; :class:`TraceError` naming ``path`` (and the row) when it is
    not such a trace."""
    launches = graph_launches(kernels(path))
    if not launches:
        raise TraceError(f"{path!r}: no graph launch in the trace (a kernel sharing its CorrId with others); "
                         f"{ACCEPTED}")
    by_graph: dict[int, list[list[dict[str, Any]]]] = {}
    for launch in launches:
        by_graph.setdefault(len(launch), []).append(launch)
    return Trace(path, [graph_figures(n, ls) for n, ls in by_graph.items()])


def kernels(path: str) -> list[dict[str, Any]]:
    """The trace's kernel rows as kernel records (µs); memory copies and sets are left out. The file is read
    as a stream, line by line (gunzipped on the fly where its name ends in ``.gz``): a 100 MB trace is never
    held whole."""
    try:
        with _opened(path) as fh:
            return sorted(_rows(path, fh), key=lambda e: e["ts"])
    except (OSError, UnicodeError, EOFError) as exc:
        raise TraceError(f"{path!r} cannot be read ({getattr(exc, 'strerror', None) or exc}); {ACCEPTED}") from None


def _opened(path: str) -> TextIO:
    """``path`` as text, gunzipped on the fly for a ``.gz``."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _rows(path: str, fh: TextIO) -> Iterator[dict[str, Any]]:
    """Kernel records from the table that starts at the header row (nsys's preamble lines skipped) and ends at
    the first blank row (its stdout may go on with another report)."""
    number, line = 0, ""
    for number, line in enumerate(fh, 1):  # noqa: B007  (the header's row number is said in errors)
        if line.lstrip('"').startswith("Start (ns)"):
            break
    else:
        raise TraceError(f"{path!r}: no header row (\"Start (ns)\",...) in it; {ACCEPTED}")
    header = next(csv.reader([line]))
    missing = [c for c in COLUMNS.values() if c not in header]
    if missing:
        raise TraceError(f"{path!r} row {number}: no column {', '.join(map(repr, missing))}; {ACCEPTED}")
    at = {key: header.index(name) for key, name in COLUMNS.items()}
    reader = csv.reader(fh)
    found = False
    try:
        for row in reader:
            if not row:
                break
            for kernel in _kernel(path, number + reader.line_num, row, header, at):
                found = True
                yield kernel
    except csv.Error as exc:
        raise TraceError(f"{path!r} row {number + reader.line_num}: {exc} (nothing in a trace is that long); "
                         f"{ACCEPTED}") from None
    if not found:
        raise TraceError(f"{path!r}: a header and no kernel row; {ACCEPTED}")


def _kernel(path: str, number: int, row: list[str], header: list[str], at: dict[str, int]) -> list[dict[str, Any]]:
    """The row's kernel record, none for a copy or a set; :class:`TraceError` naming the row when it is odd."""
    if row == header:
        raise TraceError(f"{path!r} row {number}: a second header (two traces in one file?); {ACCEPTED}")
    if len(row) != len(header):
        raise TraceError(f"{path!r} row {number}: {len(row)} fields for the header's {len(header)}; {ACCEPTED}")
    if row[at["name"]].startswith("[CUDA "):  # [CUDA memcpy ...], [CUDA memset]: not kernels
        return []
    try:
        start, duration = float(row[at["start"]]) / 1e3, float(row[at["duration"]]) / 1e3
        if not (math.isfinite(start) and math.isfinite(duration) and start >= 0 and duration >= 0):
            raise ValueError
    except ValueError:
        raise TraceError(f"{path!r} row {number}: {row[at['start']]!r} / {row[at['duration']]!r} is no start and "
                         f"duration in ns (finite, not negative); {ACCEPTED}") from None
    args = {"stream": row[at["stream"]], "correlation": row[at["correlation"]]}
    return [{"ts": start, "dur": duration, "args": args}]


def stall_of(launches: list[list[dict[str, Any]]]) -> Stall | None:
    """The longest median gap at one place on the busiest stream, over ``launches``, where it is a stall."""
    gaps = [stream_gaps(launch)[0] for launch in launches]
    width = min(len(g) for g in gaps)
    if width == 0:
        return None
    medians = [statistics.median(g[k] for g in gaps) for k in range(width)]
    at = max(range(width), key=medians.__getitem__)
    if medians[at] < STALL_US:
        return None
    values = [g[at] for g in gaps]
    return Stall(at + 1, medians[at], min(values), max(values))


def without_stall(launch: list[dict[str, Any]], stall: Stall | None) -> tuple[dict[str, list[float]], float]:
    """One launch's gaps per ranked stream and its span, the stall's interval left out of both: the stall
    gap itself is dropped, and a gap on another stream loses the time it overlaps the stall."""
    ranked = streams(launch)
    window = (0.0, 0.0)
    if stall is not None and len(ranked[0]) > stall.after:
        window = (kernel_end(ranked[0][stall.after - 1]), float(ranked[0][stall.after]["ts"]))
    gaps: dict[str, list[float]] = {}
    for rank, ks in enumerate(ranked, 1):
        for k, (a, b) in enumerate(zip(ks, ks[1:], strict=False)):
            if rank == 1 and stall is not None and k == stall.after - 1:
                continue
            lo, hi = kernel_end(a), float(b["ts"])
            gaps.setdefault(f"s{rank}", []).append(hi - lo - max(0.0, min(hi, window[1]) - max(lo, window[0])))
    span = max(kernel_end(e) for e in launch) - min(float(e["ts"]) for e in launch) - (window[1] - window[0])
    return gaps, span


def graph_figures(kernel_count: int, launches: list[list[dict[str, Any]]]) -> GraphFigures:
    """One graph's figures over its later launches (the first is its own figure: it may upload), the stall left out of
    the gaps and the span."""
    later = launches[1:] or launches  # a graph launched once: its only launch, the first
    stall = stall_of(later)
    pooled: dict[str, list[float]] = {}
    spans = []
    for launch in later:
        gaps, span = without_stall(launch, stall)
        spans.append(span)
        for rank, values in gaps.items():
            pooled.setdefault(rank, []).extend(values)
    return GraphFigures(kernel_count, len(launches), statistics.median(busy_us(ks) for ks in later),
                        statistics.median(spans), stall,
                        {rank: statistics.median(v) for rank, v in sorted(pooled.items(), key=lambda kv: int(kv[0][1:]))
                         if v})


def graph_name(order: int, count: int, kernels_per_launch: int) -> str:
    """``graph 1 (1768 kernels a launch; bs 2 under bench engine's workload)``: two graphs launched in
    that order are the pair's bs 2, then the single request's bs 1."""
    bs = f"; bs {2 - order} under bench engine's workload" if count == 2 else ""
    return f"graph {order + 1} ({kernels_per_launch} kernels a launch{bs})"


def report(traces: list[Trace]) -> str:
    """Per graph, a row per trace; then the builds compared on what the profiler leaves comparable, and
    each trace whose stall holds the profiler's launch time said so in one line."""
    sizes = list(dict.fromkeys(g.kernels for t in traces for g in t.graphs))
    lines = []
    for order, size in enumerate(sizes):
        lines += [f"{graph_name(order, len(sizes), size)}:", "",
                  "| trace | launches | busy µs a launch | span µs without the stall | stall (where, ms) | "
                  "median gap between kernels per stream, µs, without the stall |", "|---|---|---|---|---|---|"]
        rows = [(t, next((g for g in t.graphs if g.kernels == size), None)) for t in traces]
        for t, g in rows:
            if g is None:
                lines.append(f"| {t.path} | 0 | - | - | - | - |")
                continue
            stall = f"after kernel {g.stall.after}, {g.stall.median_us / 1e3:.3f}" if g.stall else "none"
            lines.append(f"| {t.path} | {g.launches} | {g.busy_us:.1f} | {g.span_us:.1f} | {stall} | "
                         f"{first_streams(g.gap_us)} |")
        lines += ["", *compared(rows), ""]
    lines += [f"{t.path}: {line}" for t in traces for line in profiler_lines(t)]
    lines.append("The decode step and the upload's cost come from an unprofiled run (bench engine, with its positive "
                 "control); Nsight Systems' figures above are its kernels, their gaps and their span, the stall apart.")
    return "\n".join(lines)


def compared(rows: list[tuple[Trace, GraphFigures | None]]) -> list[str]:
    """Each trace against the first on what the profiler leaves comparable: busy time, the span without
    the stall, the busiest stream's median gap. One profiled run each: no interval, no verdict."""
    (first, base), out = rows[0], []
    if base is None:
        return out
    for t, g in rows[1:]:
        if g is None:
            continue
        s1 = (g.gap_us.get("s1"), base.gap_us.get("s1"))
        gap = f"{s1[0]:.2f} vs {s1[1]:.2f} µs" if None not in s1 else "n/a"
        busy, span = (pct(a / b if b else math.nan, math.nan) for a, b in ((g.busy_us, base.busy_us),
                                                                            (g.span_us, base.span_us)))
        out.append(f"- {t.path} vs {first.path} (comparable under the profiler): busy {busy}, "
                   f"span without the stall {span}, s1 gap {gap}")
    return out


def profiler_lines(trace: Trace) -> list[str]:
    """One line per graph whose stall is long enough to hold the profiler's own launch time."""
    return [f"the {g.kernels}-kernel graph stalls {g.stall.median_us / 1e3:.2f} ms a launch after kernel "
            f"{g.stall.after}: the profiler's own launch time (the host releases a wait-sync graph's PLE WAIT only "
            "after cuGraphLaunch returns, and node-level tracing makes that take milliseconds), not a cost of this "
            "build" for g in trace.graphs if g.stall is not None and g.stall.median_us >= LARGE_STALL_US]
