"""Inter-kernel gaps per stream from CUPTI kernel records, traced in a child process.

CUPTI is never initialised in the timed process: it slows and spreads every replay there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from .common import last_stderr_line, rotated


def kernel_gaps(trace_file: str, launches: list[str],
                skip_first: set[str]) -> tuple[dict[str, dict[str, list[float]]], str]:
    """Per arm and stream, the gaps (µs) between consecutive kernels of one replay, from Kineto's trace.

    Every launch replays the same graph body and was synchronised before the next, so the kernel
    records, in start order, fall into ``len(launches)`` equal chunks, one per launch, in
    ``launches`` order (an arm name per launch); the chunking is checked against the timeline.
    Each arm's first traced replay is dropped (the profiler loses events at session start).
    Returns the gaps ({} when the trace does not split that way) and a note on what it held.
    """
    with open(trace_file) as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("cat") == "kernel"]
    events.sort(key=lambda e: float(e["ts"]))
    per_launch, extra = divmod(len(events), max(1, len(launches)))
    note = f"{len(events)} kernel records for {len(launches)} launches"
    if extra or not per_launch:
        return {}, note + ": not an equal number per launch, gaps not reported"
    chunks = [events[i * per_launch:(i + 1) * per_launch] for i in range(len(launches))]
    for before, after in zip(chunks, chunks[1:], strict=False):
        if max(float(e["ts"]) + float(e.get("dur", 0)) for e in before) > float(after[0]["ts"]):
            return {}, note + ": launches overlap in the trace, gaps not reported"
    gaps: dict[str, dict[str, list[float]]] = {}
    seen: set[str] = set()
    for arm, chunk in zip(launches, chunks, strict=True):
        if arm in skip_first and arm not in seen:
            seen.add(arm)
            continue
        per_stream: dict[str, list[dict]] = {}
        for e in chunk:
            per_stream.setdefault(str(e.get("args", {}).get("stream", e.get("tid"))), []).append(e)
        for stream, ks in sorted(per_stream.items()):
            out = gaps.setdefault(arm, {}).setdefault(stream, [])
            out.extend(float(b["ts"]) - (float(a["ts"]) + float(a.get("dur", 0)))
                       for a, b in zip(ks, ks[1:], strict=False))
    return gaps, note + f", {per_launch} per launch"


def gaps_from_child(opts: argparse.Namespace) -> tuple[dict[str, Any], str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "gaps.json")
        cmd = [sys.executable, "-m", "freetoken_graphfix", "bench", "--gaps-child", out,
               "--kernels", str(opts.kernels), "--streams", str(opts.streams), "--instances", "1", "--profile-reps",
               str(opts.profile_reps), "--batch-sizes", *map(str, opts.batch_sizes), "--strategies",
               *opts.strategies, *(["--no-wait"] if opts.no_wait else []), *(["--h2d"] if opts.h2d else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "FT_GRAPH_UPLOAD": "off"})  # the child installs per arm
        if proc.returncode != 0 or not os.path.exists(out):
            return {}, "CUPTI child failed: " + last_stderr_line(proc)
        with open(out) as fh:
            got = json.load(fh)
        return got["gaps"], got["note"]


def profile_gaps(names: list[str], bs: int, launch: Any, stream: Any, reps: int) -> tuple[dict[str, Any], str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    order: list[str] = []
    with torch.cuda.stream(stream), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for rep in range(reps + 1):
            for arm in rotated(names, rep):
                launch(arm, bs)
                stream.synchronize()
                order.append(arm)
    torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        path = fh.name
    try:
        prof.export_chrome_trace(path)
        return kernel_gaps(path, order, set(names))
    finally:
        os.unlink(path)
