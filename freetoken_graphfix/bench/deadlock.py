"""First launches: one graph per (kernels, streams, strategy) case, each in its own process."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from .common import last_stderr_line, progress


def probe(opts: argparse.Namespace) -> dict[str, Any]:
    """One case: capture one graph (head WAIT + kernels) with ``strategy``, then its first launch
    in FreeToken's serving order with a watchdog. Printed as one JSON line."""
    from .. import hooks
    from .rig import Rig

    rig = Rig(kernels=opts.kernels, streams=opts.streams, wait=True)
    hooks.uninstall()  # importing the package installed the environment's mode
    hooks.install(opts.strategy)
    t0 = time.perf_counter()
    runner = rig.capture((1,))
    capture_s = time.perf_counter() - t0
    first = rig.step(runner, 1, seed=1, watchdog_s=opts.watchdog)
    later = rig.step(runner, 1, seed=2, watchdog_s=opts.watchdog)
    return {"strategy": opts.strategy, "kernels": opts.kernels, "streams": opts.streams,
            "first_launch_ms": first.launch_ms, "blocked": first.fired, "second_blocked": later.fired,
            "capture_s": capture_s, "action": hooks.status()["passes"][-1]["graphs"][0]["action"]}


def deadlock_matrix(opts: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    """Every (kernels, streams, strategy) case in its own process, ``opts.jobs`` at a time. A blocked
    case shows as a launch the watchdog released, so concurrent cases cannot hide one; their
    first-launch times are less precise than in a sequential run."""
    from concurrent.futures import ThreadPoolExecutor

    def run_case(case: tuple[int, int, str]) -> dict[str, Any]:
        kernels, streams, arm = case
        cmd = [sys.executable, "-m", "freetoken_graphfix", "bench", "--probe", "--strategy", arm,
               "--kernels", str(kernels), "--streams", str(streams), "--watchdog", str(opts.watchdog)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "FT_GRAPH_UPLOAD": arm})
        try:
            row = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            row = {"strategy": arm, "kernels": kernels, "streams": streams, "error": last_stderr_line(proc)}
        print("probe", json.dumps(row), file=sys.stderr, flush=True)
        return row

    cases = [(k, s, arm) for k in opts.matrix_kernels for s in (1, 4) for arm in opts.strategies]
    with ThreadPoolExecutor(max_workers=opts.jobs) as pool:
        rows = list(progress(pool.map(run_case, cases), len(cases), "deadlock probes"))
    lines = [f"{'kernels':>8} {'streams':>7} " + " ".join(f"{a:>16}" for a in opts.strategies)]
    for kernels in opts.matrix_kernels:
        for streams in (1, 4):
            cells = []
            for arm in opts.strategies:
                r = next(r for r in rows if (r["kernels"], r["streams"], r["strategy"]) == (kernels, streams, arm))
                cells.append("error" if "error" in r else
                             f"blocked ({r['first_launch_ms']:.0f} ms)" if r["blocked"] else
                             f"ok {r['first_launch_ms']:.2f} ms")
            lines.append(f"{kernels:>8} {streams:>7} " + " ".join(f"{c:>16}" for c in cells))
    return rows, "\n".join(lines)
