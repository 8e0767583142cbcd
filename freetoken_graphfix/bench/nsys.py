"""``bench --from-nsys``: #775's table from Nsight Systems' own kernel trace, for a GPU where the
reporter profiles with ``nsys`` rather than this bench's CUPTI child.

Reads the CSV ``nsys stats --report cuda_gpu_trace --format csv`` writes from a run profiled with
``--cuda-graph-trace=node`` (every kernel of a graph launch its own row, all sharing the launch's
``CorrId``), turns each row into the kernel record ``cupti`` reads from Kineto, and reuses its
grouping: graph launches, streams ranked within each launch, gaps pooled per rank. "ms a step" is
the median time from one graph launch's first kernel to the next's, over launches of the decode
loop (an interval over three times the median, a prefill or a pause between, is left out).
"""

from __future__ import annotations

import csv
import statistics
from typing import Any

from .cupti import first_streams, graph_launches, pooled_gaps

COLUMNS = {"start": "Start (ns)", "duration": "Duration (ns)", "correlation": "CorrId", "stream": "Strm"}
ACCEPTED = ("accepted values are the CSV of `nsys stats --report cuda_gpu_trace --format csv` from a run profiled "
            "with --cuda-graph-trace=node")


def kernels(path: str) -> list[dict[str, Any]]:
    """The trace's kernel rows as Kineto-shaped records (µs); memory copies and sets are left out.
    ``ValueError`` in one line naming the file when it is not such a CSV."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(line for line in fh if line.strip()))
    except (OSError, UnicodeError, csv.Error) as exc:
        raise ValueError(f"--from-nsys {path!r} cannot be read ({exc}); {ACCEPTED}") from None
    missing = [c for c in COLUMNS.values() if not rows or c not in rows[0]]
    if missing:
        raise ValueError(f"--from-nsys {path!r} has no column {', '.join(map(repr, missing))}; {ACCEPTED}")
    out = []
    for row in rows:
        if (row.get("Name") or "").startswith("[CUDA "):  # [CUDA memcpy ...], [CUDA memset]: not kernels
            continue
        start, duration = float(row[COLUMNS["start"]]) / 1e3, float(row[COLUMNS["duration"]]) / 1e3
        out.append({"ts": start, "dur": duration,
                    "args": {"stream": row[COLUMNS["stream"]], "correlation": row[COLUMNS["correlation"]]}})
    return sorted(out, key=lambda e: e["ts"])


def figures(path: str) -> dict[str, Any]:
    """#775's figures of one profiled run: graph launches, ms a step, median gap per ranked stream."""
    launches = graph_launches(kernels(path))
    if len(launches) < 2:
        raise ValueError(f"--from-nsys {path!r}: {len(launches)} graph launch(es) in the trace; {ACCEPTED}")
    starts = [float(ks[0]["ts"]) for ks in launches]
    steps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    typical = statistics.median(steps)
    loop = [s for s in steps if s <= 3 * typical]
    seen: set[int] = set()  # each graph's first launch is its own figure: a graph is known by its kernel count
    later = [ks for ks in launches if len(ks) in seen or seen.add(len(ks))]
    gaps = pooled_gaps(later)
    return {"launches": len(launches), "ms_per_step": statistics.median(loop) / 1e3,
            "gap_us": {rank: statistics.median(g) for rank, g in gaps.items() if g}}


def table(paths: list[str]) -> str:
    """#775's table, one row per profiled run (named by its file), ready to paste into the issue."""
    lines = ["| build (trace) | graph launches | ms per decode step | median gap between kernels per stream, µs |",
             "|---|---|---|---|"]
    for path in paths:
        f = figures(path)
        lines.append(f"| {path} | {f['launches']} | {f['ms_per_step']:.3f} | {first_streams(f['gap_us'])} |")
    return "\n".join(lines)
