"""``doctor``: what is installed, what the shim does with it here and in new processes, and a short check.

Prints ``name: value`` lines, as ``coverage debug sys`` does. Every line that finds a problem says
``PROBLEM:`` and how to fix it, and the report goes on past it (a missing dependency included), so
one run shows everything that is wrong. With a CUDA device it ends with a short first-launch check.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .. import __version__, bootstrap, config
from ..errors import ConfigError, shown
from . import child

MODE_HELP = {
    "auto": "no-op for graphs without a host-released WAIT; deferred (else warm) for the others",
    "upload": "FreeToken's own behaviour: cuGraphUpload + synchronize on every graph",
    "skip": "no upload anywhere; WARNING for graphs whose first launch can deadlock",
    "warm": "one threaded warm replay at capture for graphs that need protection; no-op otherwise",
    "deferred": "no upload; the first launch's PLE fill runs on a thread started before it",
    "off": "the shim patches nothing (also 0, false)",
}
TURN_ON = (f"export {config.ENV_MODE}=auto before starting FreeToken, or start it with "
           "freetoken-graphfix run -- <command>")
INSTALL_FREETOKEN = "pip install freetoken==0.2.1"
RIG_TIME = "about 75 s on an H200"  # bench rig's default run (docs/measurements.md, "Replay cost")

Line = Callable[[str, str], None]


class Report:
    """The lines printed so far, and the problems among them."""

    def __init__(self) -> None:
        self.problems = 0
        self.bad_mode = ""  # said once, on its own line: the lines after it refer to it

    def line(self, key: str, value: str) -> None:
        """One ``key: value`` line, the keys right-aligned so a reader's eye runs down the values."""
        print(f"{key:>24}: {self.said(value)}")

    def problem(self, key: str, what: str, fix: str) -> None:
        """A ``PROBLEM:`` line with its fix, counted: doctor exits 1 when there is one."""
        self.problems += 1
        self.line(key, f"PROBLEM: {what}; fix: {fix}")

    def said(self, text: str) -> str:
        """A line that would repeat the bad-mode error pointed back at it, so the error is said once."""
        return text.replace(self.bad_mode, f"{config.ENV_MODE} is not a valid mode (above)") if self.bad_mode else text


def run(short_check: bool) -> int:
    """Implementation of 'doctor'; exits 1 when it found a problem a user must fix."""
    report = Report()
    report.line("freetoken-graphfix", f"{__version__} at {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}")
    report.line("python", f"{sys.executable} ({sys.version.split()[0]})")
    user_value = bootstrap.user_env_value()
    _mode_line(report, user_value)
    shim_loads = _shim_line(report)
    imported = _freetoken_lines(report, shim_loads)
    from . import series

    report.line("patch series", series.describe_installed())
    _new_processes(report, user_value, series.applied_to_site())
    report.line("turn it off", f"{config.ENV_MODE}=off (or 0, false), or pip uninstall freetoken-graphfix")
    print("modes:")
    for name, text in MODE_HELP.items():
        print(f"{name:>24}: {text}")
    if short_check and imported:
        report.problems += _short_check(report.line)
    return 1 if report.problems else 0


def _mode_line(report: Report, user_value: str | None) -> None:
    """The ``FT_GRAPH_UPLOAD`` line: the value as the user set it and the mode it gives, or the problem with its fix."""
    try:
        mode = config.parse_mode(user_value)
    except ConfigError as exc:
        report.problem(config.ENV_MODE, str(exc), f"export {config.ENV_MODE}=auto (or unset it)")
        report.bad_mode = str(exc)  # the lines after this one refer to it
        return
    report.line(config.ENV_MODE, f"unset (mode {mode.value})" if user_value is None else
                f"{shown(user_value)} (mode {mode.value})")
    if mode is config.Mode.SKIP:
        report.problem("mode skip", config.SKIP_RISK,
                       f"export {config.ENV_MODE}=auto (skip is the benchmarks' unprotected control)")


def _shim_line(report: Report) -> bool:
    """Whether the shim itself can load (a ``--no-deps`` install may lack wrapt)."""
    from .. import _shim

    shim, why = _shim()
    if shim is None:
        report.problem("shim", why, "pip install wrapt")
    return shim is not None


def _freetoken_lines(report: Report, shim_loads: bool) -> bool:
    """FreeToken as imported here, and what the shim did with it in this process; whether it imported."""
    import freetoken_graphfix

    if shim_loads:
        freetoken_graphfix._arm()  # as the .pth does in a new process: installed when FreeToken's graph imports
    with _quiet_freetoken():  # FreeToken's own INFO lines and progress bars are not this report
        try:
            import freetoken.engine.graph  # noqa: F401  (fires the shim's post-import hook)
        except Exception as exc:
            failure: Exception | None = exc
        else:
            failure = None
        state = freetoken_graphfix.status()
    found = state["freetoken"]
    if failure is not None:
        missing = isinstance(failure, ModuleNotFoundError) and (failure.name or "").split(".")[0] == "freetoken"
        report.problem("freetoken", f"cannot be imported: {type(failure).__name__}: {failure}",
                       INSTALL_FREETOKEN if missing else "see the error: FreeToken itself fails to import")
        return False
    tested = ("a tested release" if found["tested"] else "not inspected: the shim did not install"
              if found["tested"] is None else "an untested release: decided by feature")
    where = found["path"] or os.path.dirname(sys.modules["freetoken"].__file__)
    report.line("freetoken", f"{found['version']} at {where} ({tested})")
    if shim_loads:
        report.line("shim in doctor", f"{'patched' if state['patched'] else 'not patched'}"
                    + (f", mode {state['mode']}" if state["mode"] else "") + f": {state['reason']} (doctor installs "
                    "the shim itself, so this holds for this process only)")
        if state["deferred"]["reason"]:
            report.line("deferred guard", f"{'available' if state['deferred']['available'] else 'unavailable'}: "
                        f"{state['deferred']['reason']}")
    return True


def _new_processes(report: Report, user_value: str | None, series_applied: bool) -> None:
    """What a process started from here gets: the ``.pth``, the variable, and how to turn it on (not needed where
    the patch series protects FreeToken itself)."""
    pth = bootstrap.installed_pth()
    if pth is None:
        report.problem("bootstrap .pth", "not installed: only processes that import freetoken_graphfix get the shim",
                       "pip install freetoken-graphfix into this environment")
    else:
        report.line("bootstrap .pth", str(pth))
    active, why = bootstrap.would_activate(user_value)
    hint = ("; not needed: the patch series protects the installed FreeToken itself" if series_applied else
            f"; to turn it on: {TURN_ON}")
    report.line("shim in new processes", f"{'installed' if active else 'NOT installed'}: {why}"
                + (hint if user_value is None and pth is not None else ""))
    report.line("interpreters", ", ".join(bootstrap.interpreters()))
    report.line("run looks in", f"{sysconfig.get_paths()['scripts']} first (this environment's commands, activated "
                                "or not), then PATH")


@contextlib.contextmanager
def _quiet_freetoken() -> Iterator[None]:
    """FreeToken logs through its own stdout handler, and the shim's lines would say again what the
    report says: hold both back while the report imports FreeToken (the report's own lines are
    printed after it)."""
    before = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(before)


def _short_check(line: Line) -> int:
    """What one short run can support: a protected first launch against the unprotected control,
    and the hook's cost at capture. The replay verdict needs ``bench`` (several instances)."""
    try:
        import torch
    except ImportError:
        line("short check", "skipped: torch is not importable")
        return 0
    if not torch.cuda.is_available():
        line("short check", "skipped: no CUDA device")
        return 0
    lines, problems, log = short_check()
    for key, value in lines:
        line(key, value)
    line("replay verdict", f"freetoken-graphfix bench rig ({RIG_TIME}; does the upload cost this GPU?)")
    line("short check logs", log)
    return problems


@dataclass(frozen=True)
class Probe:
    """One first-launch probe as ``bench _probe`` answers it (``child.answer``), or why none came."""

    mode: str
    first_launch_ms: float = 0.0
    blocked: bool = False
    action: str = ""
    hook_ms: float = 0.0
    error: str | None = None


def probe(kernels: int, mode: str, watchdog: float, log: str) -> Probe:
    """One graph of ``kernels`` behind a PLE wait-sync WAIT, captured and first launched in ``mode`` in a fresh
    process: the benchmarks' own probe, through the command line (the shim never imports the benchmarks)."""
    cmd = [sys.executable, "-m", "freetoken_graphfix", "bench", "_probe", "--mode", mode, "--kernels", str(kernels),
           "--streams", "1", "--watchdog", str(watchdog)]
    try:
        row = child.run(cmd, log=log, timeout=600, env={**os.environ, config.ENV_MODE: mode})
        return Probe(mode, float(row["first_launch_ms"]), bool(row["blocked"]), str(row["action"]),
                     float(row["hook_ms"]), row.get("error"))
    except child.ChildError as exc:
        return Probe(mode, error=str(exc))
    except (ValueError, KeyError, TypeError) as exc:
        return Probe(mode, error=f"its answer lacks a probe's fields ({exc!r})")


def short_check(kernels: int = 10000, watchdog: float = 4.0) -> tuple[list[tuple[str, str]], int, str]:
    """Does a protected first launch block on this GPU, does an unprotected one (the control), and what does the hook
    cost at capture: three probes at once, on a graph large enough to block on an H200. Its lines, problems, and the
    folder of their logs."""
    logs = tempfile.mkdtemp(prefix="graphfix-doctor-")
    with ThreadPoolExecutor(max_workers=3) as pool:
        auto, skip, upload = pool.map(lambda mode: probe(kernels, mode, watchdog, os.path.join(logs, f"{mode}.log")),
                                      ("auto", "skip", "upload"))
    graph = f"{kernels:,}-kernel graph behind a PLE wait-sync WAIT"
    lines, problems = [], 0
    for label, row, protected in (("protected launch", auto, True), ("unprotected control", skip, False)):
        if row.error:
            lines.append((label, f"ERROR: {row.error} (see {row.mode}.log)"))
            problems += 1
        elif row.blocked:
            problems += protected
            lines.append((label, f"{row.mode}: BLOCKED until the watchdog ({watchdog:g} s) on a {graph}"
                          + ("; the protection failed here: please report it" if protected else
                             ": this GPU deadlocks without protection")))
        else:
            lines.append((label, f"{row.mode} ({row.action}): first launch {row.first_launch_ms:.1f} ms, "
                          f"not blocked, on a {graph}"
                          + ("" if protected else ": no block at this size (larger graphs can)")))
    if not (auto.error or upload.error):
        lines.append(("capture cost", f"auto {auto.hook_ms:.2f} ms a graph, upload {upload.hook_ms:.2f} ms "
                      "a graph (FreeToken's own)"))
    return lines, problems, logs
