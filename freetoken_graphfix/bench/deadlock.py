"""First launches: one graph per (kernels, streams, strategy) case, each in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .common import last_stderr_line, progress
from .settings import DeadlockSettings, ProbeSettings


def probe(settings: ProbeSettings) -> dict[str, Any]:
    """One case: capture one graph (head WAIT + kernels) with ``strategy``, then its first launch
    in FreeToken's serving order with a watchdog. Printed as one JSON line."""
    from .. import hooks
    from .rig import Rig

    rig = Rig(kernels=settings.kernels, streams=settings.streams, wait=True)
    hooks.uninstall()  # importing the package armed the environment's mode
    hooks.install(settings.strategy)
    t0 = time.perf_counter()
    runner = rig.capture((1,))
    capture_s = time.perf_counter() - t0
    first = rig.step(runner, 1, seed=1, watchdog_s=settings.watchdog)
    later = rig.step(runner, 1, seed=2, watchdog_s=settings.watchdog)
    graph = hooks.status()["passes"][-1]["graphs"][0]
    return {"strategy": settings.strategy, "kernels": settings.kernels, "streams": settings.streams,
            "first_launch_ms": first.launch_ms, "blocked": first.fired, "second_blocked": later.fired,
            "capture_s": capture_s, "action": graph["action"], "hook_ms": graph["hook_ms"]}


def run_case(kernels: int, streams: int, arm: str, watchdog: float, log: Any = None) -> dict[str, Any]:
    """One probe in a fresh process (its stderr to ``log`` when given); its row, or the error."""
    cmd = [sys.executable, "-m", "freetoken_graphfix", "bench", "--probe", "--strategy", arm,
           "--kernels", str(kernels), "--streams", str(streams), "--watchdog", str(watchdog)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "FT_GRAPH_UPLOAD": arm})
    if log is not None:
        log.write(f"$ {' '.join(cmd)}\n{proc.stderr}\n")
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"strategy": arm, "kernels": kernels, "streams": streams, "error": last_stderr_line(proc)}


def deadlock_matrix(settings: DeadlockSettings) -> tuple[list[dict[str, Any]], str]:
    """Every (kernels, streams, strategy) case in its own process, ``settings.jobs`` at a time. A blocked
    case shows as a launch the watchdog released, so concurrent cases cannot hide one; their
    first-launch times are less precise than in a sequential run."""
    def case(spec: tuple[int, int, str]) -> dict[str, Any]:
        row = run_case(*spec, settings.watchdog)
        print("probe", json.dumps(row), file=sys.stderr, flush=True)
        return row

    cases = [(k, s, arm) for k in settings.matrix_kernels for s in (1, 4) for arm in settings.strategies]
    with ThreadPoolExecutor(max_workers=settings.jobs) as pool:
        rows = list(progress(pool.map(case, cases), len(cases), "deadlock probes"))
    lines = [f"{'kernels':>8} {'streams':>7} " + " ".join(f"{a:>16}" for a in settings.strategies)]
    for kernels in settings.matrix_kernels:
        for streams in (1, 4):
            cells = []
            for arm in settings.strategies:
                r = next(r for r in rows if (r["kernels"], r["streams"], r["strategy"]) == (kernels, streams, arm))
                cells.append("error" if "error" in r else
                             f"blocked ({r['first_launch_ms']:.0f} ms)" if r["blocked"] else
                             f"ok {r['first_launch_ms']:.2f} ms")
            lines.append(f"{kernels:>8} {streams:>7} " + " ".join(f"{c:>16}" for c in cells))
    return rows, "\n".join(lines)


@dataclass
class ShortCheck:
    lines: list[tuple[str, str]]  # (label, value) for doctor's report
    problems: int
    log: str  # where the probes' own output went


def short_check(kernels: int = 10000, watchdog: float = 4.0) -> ShortCheck:
    """What one short run can support, for ``doctor``: does a protected first launch block on this
    GPU, does an unprotected one (the control), and what does the hook cost at capture. Three
    probes at once, each a fresh process on a graph large enough to block on an H200."""
    with tempfile.NamedTemporaryFile("w", prefix="graphfix-doctor-", suffix=".log", delete=False) as log:
        with ThreadPoolExecutor(max_workers=3) as pool:
            auto, skip, upload = pool.map(lambda arm: run_case(kernels, 1, arm, watchdog, log),
                                          ("auto", "skip", "upload"))
    graph = f"{kernels:,}-kernel graph behind a PLE wait-sync WAIT"
    lines, problems = [], 0
    for label, row, protected in (("protected launch", auto, True), ("unprotected control", skip, False)):
        if "error" in row:
            lines.append((label, f"ERROR: {row['error']} (see the log)"))
            problems += 1
        elif row["blocked"]:
            problems += protected
            lines.append((label, f"{row['strategy']}: BLOCKED until the watchdog ({watchdog:g} s) on a {graph}"
                          + ("; the protection failed here: please report it" if protected else
                             ": this GPU deadlocks without protection")))
        else:
            lines.append((label, f"{row['strategy']} ({row['action']}): first launch {row['first_launch_ms']:.1f} ms, "
                          f"not blocked, on a {graph}"
                          + ("" if protected else ": no block at this size (larger graphs can)")))
    if not any("error" in r for r in (auto, upload)):
        lines.append(("capture cost", f"auto {auto['hook_ms']:.2f} ms a graph, upload {upload['hook_ms']:.2f} ms "
                      "a graph (FreeToken's own)"))
    return ShortCheck(lines, problems, log.name)
