"""Interpreter start-up with and without the bootstrap ``.pth``. Needs no GPU."""

from __future__ import annotations

import argparse
import math
import os
import platform
import signal
import subprocess
import tempfile
import threading
import time

from .benchmark import Benchmark, Subparsers, finish, own
from .options import outputs_options, whole_at_least
from .records import StartupRecord
from .reports import Report
from .running import rotated
from .stats import median_band, summary

ARMS = {  # name: (venv holding the .pth, FT_GRAPH_UPLOAD)
    "bare": (False, None), "unset": (True, None), "armed (auto)": (True, "auto"), "off": (True, "off")}
TARGET_MS = 5.0
MIN_RUNS = 8  # the fewest paired runs a 95% interval of their median can be drawn from (stats.median_band)


def _stopped(signum: int, frame: object) -> None:
    """SIGTERM as ``SystemExit``: the ``finally`` that removes the temporary venvs runs."""
    raise SystemExit(128 + signum)


def startup(runs: int) -> StartupRecord:
    """``python -c pass`` in two fresh venvs, every arm interleaved: one bare, one holding this
    package as pip installs it (its ``.pth`` in site-packages, its modules compiled to bytecode),
    that one with ``FT_GRAPH_UPLOAD`` unset, armed and ``off``. FreeToken is never imported: the cost
    of the shim to the processes of an environment that never run FreeToken. Needs no GPU."""
    import shutil
    import venv

    from freetoken_graphfix import bootstrap

    pth = bootstrap.installed_pth()
    if pth is None:
        raise RuntimeError(f"{bootstrap.PTH_NAME} is not installed in this environment")
    package = os.path.dirname(os.path.abspath(bootstrap.__file__))
    root = tempfile.mkdtemp(prefix="graphfix-startup-")
    # a SIGTERM (a supervisor, timeout) ends the run through the finally below: no venvs left behind
    before = signal.signal(signal.SIGTERM, _stopped) if threading.current_thread() is threading.main_thread() else None
    try:
        pythons = {}
        for with_pth in (False, True):
            folder = os.path.join(root, "with" if with_pth else "without")
            venv.create(folder, with_pip=False, symlinks=True)
            py = os.path.join(folder, "bin", "python")
            if with_pth:  # what pip leaves: the package and the .pth in site-packages, bytecode compiled
                site_dir = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                          capture_output=True, text=True, check=True).stdout.strip()
                copy = os.path.join(site_dir, os.path.basename(package))
                shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
                shutil.copy(pth, os.path.join(site_dir, bootstrap.PTH_NAME))
                subprocess.run([py, "-m", "compileall", "-q", copy], check=True)
            pythons[with_pth] = py
        base = {k: v for k, v in os.environ.items() if k not in (bootstrap.ENV_MODE, "PYTHONPATH")}
        envs = {name: ({**base, bootstrap.ENV_MODE: value} if value else base, pythons[with_pth])
                for name, (with_pth, value) in ARMS.items()}
        times: dict[str, list[float]] = {name: [] for name in ARMS}
        for i in range(runs):
            for name in rotated(list(ARMS), i):
                env, py = envs[name]
                t0 = time.perf_counter()
                subprocess.run([py, "-c", "pass"], env=env, check=True)
                times[name].append(1e3 * (time.perf_counter() - t0))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if before is not None:
            signal.signal(signal.SIGTERM, before)
    # each pass ran every arm back to back: its difference to bare in the same pass cancels drift
    bands = {k: median_band([a - b for a, b in zip(times[k], times["bare"], strict=True)]) for k in ARMS
             if k != "bare"}
    return StartupRecord(runs, {k: summary(v) for k, v in times.items()}, {k: band[0] for k, band in bands.items()},
                         {k: list(band[1:]) for k, band in bands.items()}, TARGET_MS, platform.python_version())


def render(record: StartupRecord) -> str:
    """The report line of a start-up record (a run's, or one ``bench report`` reads back)."""
    runs, bare = record.runs, record.ms["bare"].median
    bands = {k: (mid, *record.delta_band_ms[k]) for k, mid in record.delta_ms.items()}
    verdict = startup_verdict(list(bands.values()), runs)
    return (f"python -c pass, {runs} interleaved runs each, FreeToken never imported: bare venv {bare:.2f} ms; "
            "with the .pth (median of the paired differences, 95% interval): "
            + ", ".join(f"{k} {mid:+.2f} ms " + (f"[{low:+.2f}, {high:+.2f}]" if not math.isnan(high) else "[n/a]")
                        for k, (mid, low, high) in bands.items())
            + f"; target within +{TARGET_MS:g} ms: {verdict}")


def startup_verdict(bands: list[tuple[float, float, float]], runs: int) -> str:
    """Met when every arm's interval lies within the target, NOT met when one lies wholly above it,
    and "cannot tell" when one straddles it (more --startup-runs narrow it)."""
    if any(math.isnan(high) for _, _, high in bands):
        return (f"not judged: {runs} run{'' if runs == 1 else 's'} {'is' if runs == 1 else 'are'} too few for a 95% "
                f"interval (it needs {MIN_RUNS} or more)")
    if any(low > TARGET_MS for _, low, _ in bands):
        return "NOT met (an interval lies wholly above it)"
    if all(high <= TARGET_MS for _, _, high in bands):
        return "met (every interval within it)"
    return "cannot tell (an interval straddles it: run with more --runs)"


def add_startup(sub: Subparsers, prog: str) -> argparse.ArgumentParser:
    """``bench startup``'s options: how many interpreter starts per arm."""
    startup = sub.add_parser("startup", help="interpreter start-up with and without the .pth (no GPU)",
                             parents=[outputs_options(markdown=False, plot=False)], **own(prog, "startup"),
                             description="python -c pass in a bare venv and in one holding this package's .pth, "
                                         "FT_GRAPH_UPLOAD unset, armed and off, paired run by run.")
    startup.add_argument("--runs", type=whole_at_least(MIN_RUNS), default=200,
                         help=f"interpreter starts per arm, {MIN_RUNS} or more (default 200)")
    return startup


def run_startup(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench startup``: needs no GPU, so nothing to check before it runs."""
    record = startup(opts.runs)
    return finish(opts, record, startup_report(record))


def startup_report(record: StartupRecord) -> Report:
    """The one line of a start-up record."""
    return Report("startup", render(record))


STARTUP = Benchmark("startup", add_startup, run_startup, StartupRecord, startup_report)
