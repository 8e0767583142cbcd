"""The rig's inter-kernel gaps, from CUPTI through ``torch.profiler`` (Kineto), in a child process.

CUPTI is never initialised in a timed process: it slows and spreads every replay there, and stays in
a process once it was on. The traces come from child processes that initialise it before they
capture (PyTorch #75504: kernels of graphs captured earlier go untraced).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from freetoken_graphfix import config
from freetoken_graphfix.tools import child

from .running import rotated
from .settings import RigSettings
from .timeline import graph_launches, kernel_records, pooled_gaps


def kernel_gaps(trace_file: str, launches: list[str],
                skip_first: set[str]) -> tuple[dict[str, dict[str, list[float]]], str]:
    """Per arm and ranked stream, the gaps (µs) between consecutive kernels of one replay, from
    Kineto's trace. ``launches`` names the arm of each graph launch, in order; each arm's first
    traced replay is dropped (the profiler loses events at session start). Returns the gaps ({} when
    the trace does not hold one group of kernels per launch) and a note on what it held."""
    kernels = kernel_records(trace_file)
    groups = graph_launches(kernels)
    note = f"{len(kernels)} kernel records, {len(groups)} graph launches for {len(launches)} replays"
    if len(groups) != len(launches):
        return {}, note + ": gaps not reported"
    gaps: dict[str, dict[str, list[float]]] = {}
    seen: set[str] = set()
    for arm, launch in zip(launches, groups, strict=True):
        if arm in skip_first and arm not in seen:
            seen.add(arm)
            continue
        for rank, values in pooled_gaps([launch]).items():
            gaps.setdefault(arm, {}).setdefault(rank, []).extend(values)
    return gaps, note


def gaps_from_child(settings: RigSettings) -> tuple[dict[str, Any], str]:
    """The rig's inter-kernel gaps, traced in a fresh process (``rig.measure.gaps_child``): CUPTI
    initialised before the capture, never in the timing process."""
    cmd = [sys.executable, "-m", "freetoken_graphfix_bench", "rig", "--gaps-child",
           "--kernels", str(settings.kernels), "--streams", str(settings.streams), "--instances", "1",
           "--profile-reps", str(settings.profile_reps), "--batch-sizes", *map(str, settings.batch_sizes),
           "--modes", *settings.modes, *(["--no-wait"] if settings.no_wait else []),
           *(["--h2d"] if settings.h2d else [])]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            got = child.run(cmd, log=os.path.join(tmp, "gaps.log"), timeout=600,
                            env={**os.environ, config.ENV_MODE: "off"})  # the child installs per arm
        except child.ChildError as exc:
            return {}, f"CUPTI child failed: {exc}"
    return got["gaps"], got["note"]


def profile_gaps(names: list[str], bs: int, launch: Any, stream: Any, reps: int) -> tuple[dict[str, Any], str]:
    """Launch each arm's graph ``reps`` times in rotation under Kineto and return the gaps per arm with the launch
    order, so every arm meets the same GPU state."""
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
