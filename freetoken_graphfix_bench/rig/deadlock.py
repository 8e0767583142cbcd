"""``bench deadlock``: first launches, one graph per (kernels, streams, mode) case, each in its own
process (``doctor``'s short check runs three such cases through ``bench _probe``)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from freetoken_graphfix import config
from freetoken_graphfix.tools import child

from ..record_files import RecordError, build
from ..records import DeadlockRecord, Environment, Probe
from ..running import progress
from ..settings import DeadlockSettings, ProbeSettings

STREAMS = (1, 4)  # each size runs on one stream and on four (fork/join per layer)


def probe(settings: ProbeSettings) -> Probe:
    """One case: capture one graph (head WAIT + kernels) in ``mode``, then its first launch in
    FreeToken's serving order with a watchdog. The hidden ``_probe``'s answer (``child.answer``)."""
    from .pieces import Rig, install_mode, last_pass

    rig = Rig(kernels=settings.kernels, streams=settings.streams, wait=True)
    install_mode(settings.mode)
    t0 = time.perf_counter()
    runner = rig.capture((1,))
    capture_s = time.perf_counter() - t0
    first = rig.step(runner, 1, seed=1, watchdog_s=settings.watchdog)
    later = rig.step(runner, 1, seed=2, watchdog_s=settings.watchdog)
    graph = last_pass().graphs[0]
    return Probe(settings.mode, settings.kernels, settings.streams, first.launch_ms, first.fired, later.fired,
                 capture_s, graph.action, graph.hook_ms)


def run_case(kernels: int, streams: int, mode: str, watchdog: float, log: str) -> Probe:
    """One probe in a fresh process (its output in ``log``); its row, or the error."""
    cmd = [sys.executable, "-m", "freetoken_graphfix_bench", "_probe", "--mode", mode,
           "--kernels", str(kernels), "--streams", str(streams), "--watchdog", str(watchdog)]
    try:
        return build(Probe, child.run(cmd, log=log, timeout=600, env={**os.environ, config.ENV_MODE: mode}), "probe")
    except (child.ChildError, RecordError) as exc:
        return Probe(mode, kernels, streams, error=str(exc))


def deadlock_matrix(settings: DeadlockSettings) -> DeadlockRecord:
    """Every (kernels, streams, mode) case in its own process, ``settings.jobs`` at a time. A blocked
    case shows as a launch the watchdog released, so concurrent cases cannot hide one; their
    first-launch times are less precise than in a sequential run."""
    logs = tempfile.mkdtemp(prefix="graphfix-deadlock-")

    def case(spec: tuple[int, int, str]) -> Probe:
        row = run_case(*spec, settings.watchdog, os.path.join(logs, "{}-kernels-{}-streams-{}.log".format(*spec)))
        print("probe", json.dumps(dataclasses.asdict(row)), file=sys.stderr, flush=True)
        return row

    cases = [(k, s, mode) for k in settings.sizes for s in STREAMS for mode in settings.modes]
    with ThreadPoolExecutor(max_workers=settings.jobs) as pool:
        probes = list(progress(pool.map(case, cases), len(cases), "deadlock probes"))
    return DeadlockRecord(Environment.here(), settings, probes)


def render(record: DeadlockRecord) -> str:
    """The matrix: a row per graph size and streams, a column per mode."""
    modes = record.config.modes
    lines = [f"{'kernels':>8} {'streams':>7} " + " ".join(f"{m:>16}" for m in modes)]
    for kernels in record.config.sizes:
        for streams in STREAMS:
            cells = []
            for mode in modes:
                r = next(p for p in record.probes if (p.kernels, p.streams, p.mode) == (kernels, streams, mode))
                cells.append("error" if r.error else f"blocked ({r.first_launch_ms:.0f} ms)" if r.blocked else
                             f"ok {r.first_launch_ms:.2f} ms")
            lines.append(f"{kernels:>8} {streams:>7} " + " ".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def failures(record: DeadlockRecord) -> list[str]:
    """A protected mode whose probe failed or blocked (``skip``, unprotected, may block)."""
    return [f"{p.mode} at {p.kernels} kernels, {p.streams} streams: {p.error or 'blocked'}"
            for p in record.probes if p.mode != "skip" and (p.error or p.blocked)]
