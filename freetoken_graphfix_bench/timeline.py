"""The kernel timeline of graph launches, from kernel records: CUPTI's through Kineto's chrome trace
(``cupti``), or Nsight Systems' CSV (``nsys``) turned into the same shape.

A profiler gives every kernel a graph launch runs the correlation id of that ``cudaGraphLaunch``, so
the kernel records of one launch are the records sharing a correlation id (an ordinary launch has
one kernel per id). A graph's parallel branches run on streams of their own, whose ids differ from
launch to launch: within a launch the streams are ranked (most kernels first, then first to start)
and figures are pooled per rank, so "s1" is the same branch in every launch. A kernel record is the
profiler's own (free-form: ``ts`` and ``dur`` in µs, ``args`` with its stream and correlation id).
"""

from __future__ import annotations

import bisect
import json
import statistics
from typing import Any

from .records import TracedBs, TracedRun, largest_first


def kernel_records(trace_file: str) -> list[dict[str, Any]]:
    """The kernel events of a Kineto chrome trace, in start order: the one input every timeline figure is drawn from."""
    with open(trace_file) as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("cat") == "kernel"]
    return sorted(events, key=lambda e: float(e["ts"]))


def graph_launches(kernels: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The kernels of each graph launch (a correlation id shared by several kernels), in launch order."""
    by_launch: dict[Any, list[dict[str, Any]]] = {}
    for e in kernels:
        by_launch.setdefault(e.get("args", {}).get("correlation"), []).append(e)
    groups = [ks for corr, ks in by_launch.items() if corr is not None and len(ks) > 1]
    return sorted(groups, key=lambda ks: float(ks[0]["ts"]))


def kernel_end(e: dict[str, Any]) -> float:
    """A kernel's end, in the trace's own unit."""
    return float(e["ts"]) + float(e.get("dur", 0))


def streams(launch: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The launch's kernels per stream, ranked: most kernels first, then the first to start."""
    per: dict[str, list[dict[str, Any]]] = {}
    for e in launch:
        per.setdefault(str(e.get("args", {}).get("stream", e.get("tid"))), []).append(e)
    return sorted(per.values(), key=lambda ks: (-len(ks), float(ks[0]["ts"])))


def stream_gaps(launch: list[dict[str, Any]]) -> list[list[float]]:
    """Per ranked stream, the gaps (µs) between consecutive kernels of one launch."""
    return [[float(b["ts"]) - kernel_end(a) for a, b in zip(ks, ks[1:], strict=False)] for ks in streams(launch)]


def busy_us(kernels: list[dict[str, Any]]) -> float:
    """Time (µs) at least one of ``kernels`` runs: the union of their intervals."""
    total, until = 0.0, float("-inf")
    for e in sorted(kernels, key=lambda e: float(e["ts"])):
        start, end = float(e["ts"]), kernel_end(e)
        if end > until:
            total += end - max(start, until)
            until = end
    return total


def pooled_gaps(launches: list[list[dict[str, Any]]]) -> dict[str, list[float]]:
    """Gaps per stream rank (``s1``, ``s2``, ...), pooled over ``launches``."""
    out: dict[str, list[float]] = {}
    for launch in launches:
        for rank, gaps in enumerate(stream_gaps(launch), 1):
            out.setdefault(f"s{rank}", []).extend(gaps)
    return out


SHOWN_STREAMS = 4  # a graph's branches run on a driver stream each (a fork per layer: 100 and more)


def first_streams(medians: dict[str, float]) -> str:
    """The median gap of the first ``SHOWN_STREAMS`` ranked streams and how many more there are:
    ``s1 0.51, s2 0.50, s3 0.49, s4 0.52 (+2 more)``; empty for none."""
    shown = ", ".join(f"{rank} {g:.2f}" for rank, g in list(medians.items())[:SHOWN_STREAMS])
    return shown + (f" (+{len(medians) - SHOWN_STREAMS} more)" if len(medians) > SHOWN_STREAMS else "")


def quantiles(values: list[float]) -> list[float]:
    """The 0th to 100th percentiles of ``values``: the distribution, small enough for a saved record."""
    q = statistics.quantiles(values, n=100, method="inclusive")
    return [round(v, 4) for v in (min(values), *q, max(values))]


def decode_timeline(trace_file: str, launch_bs: list[int]) -> TracedRun:
    """#775's kernel-timeline figures of a traced decode run, per batch size: kernels per decode step
    and the graph's share of them, GPU busy µs per step (union of kernel intervals), streams the graph
    uses, the median gap per stream and its percentiles (for ``--plot``). ``launch_bs`` is the bs of
    each graph launch the run made, in order (the engine's record); each bs's first launch is left
    out (first launches are their own figure). A step runs from its graph's first kernel to the next
    launch of the same bs; a launch followed by another bs's (a prefill between) or by none is left
    out of the per-step figures."""
    kernels = kernel_records(trace_file)
    launches = graph_launches(kernels)
    if len(launches) != len(launch_bs):
        return TracedRun(f"{len(launches)} graph launches in the trace for the {len(launch_bs)} the engine made: "
                         "not reported")
    starts = [float(ks[0]["ts"]) for ks in launches]
    times = [float(e["ts"]) for e in kernels]  # sorted: a step's kernels are one slice of them
    per_bs: dict[str, dict[str, list[Any]]] = {}
    seen: set[int] = set()
    for i, (bs, launch) in enumerate(zip(launch_bs, launches, strict=True)):
        if bs not in seen:
            seen.add(bs)
            continue
        rec = per_bs.setdefault(str(bs), {"launches": [], "steps": []})
        rec["launches"].append(launch)
        if i + 1 < len(launches) and launch_bs[i + 1] == bs:
            rec["steps"].append(kernels[bisect.bisect_left(times, starts[i]):bisect.bisect_left(times, starts[i + 1])])
    by_bs = {}
    for bs in largest_first(per_bs):
        rec = per_bs[bs]
        gaps = pooled_gaps(rec["launches"])
        steps = rec["steps"]
        by_bs[bs] = TracedBs(
            launches=len(rec["launches"]), graph_kernels=statistics.median(len(ks) for ks in rec["launches"]),
            step_kernels=statistics.median(len(ks) for ks in steps) if steps else None,
            busy_us=statistics.median(busy_us(ks) for ks in steps) if steps else None,
            streams=statistics.median(len(streams(ks)) for ks in rec["launches"]),
            gap_us={s: statistics.median(g) for s, g in gaps.items() if g},
            gap_quantiles={s: quantiles(g) for s, g in gaps.items() if len(g) > 1})
    return TracedRun(f"{len(kernels)} kernel records, {len(launches)} graph launches", by_bs)
