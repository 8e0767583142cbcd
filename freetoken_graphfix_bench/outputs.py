"""The files a benchmark writes (``--json``, ``--markdown``, ``--plot``, ``--logs``): refused before a run
when they could not be written at its end, and written after its results were printed."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from freetoken_graphfix import safe_files
from freetoken_graphfix.errors import UnsafePathError
from freetoken_graphfix.tools.exits import PREFIX

from . import record_files, records
from .reports import Report
from .settings import Outputs


def check_writable(path: str | None, option: str) -> str | None:
    """Why an output file could not be written at the end of a run, in one line; ``None`` when it can. Checked
    without opening it: a FIFO named as ``--json`` must not hang the check."""
    return None if path is None else safe_files.output_refused(path, option)


def logs_unusable(logs: str | None) -> str | None:
    """``--logs DIR`` that cannot hold the logs safely, refused before a run: made ``0700`` if missing, else this
    user's own and writable by no one else (a child reads back a spec written there)."""
    if logs is None:
        return None
    if not logs:
        return f"--logs '': an empty path; {safe_files.PRIVATE}"
    try:
        safe_files.private_dir(logs, "--logs")
    except UnsafePathError as exc:
        return str(exc)
    if not os.access(logs, os.W_OK | os.X_OK):
        return f"--logs {logs!r}: not writable; {safe_files.PRIVATE}"
    return None


def write_outputs(outputs: Outputs, record: records.Record, report: Report) -> bool:
    """``--json``, ``--markdown`` and ``--plot`` of a finished run or a re-judged record: a file that
    cannot be written after all is one line on stderr, and the others are still written."""
    jobs = [("--json", outputs.json, lambda path: record_files.write(path, record))]
    if report.markdown is not None:
        jobs.append(("--markdown", outputs.markdown, lambda path: _write_text(path, report.markdown(outputs.verbose))))
    ok = True
    if report.plot is not None:
        jobs.append(("--plot", outputs.plot, lambda path: _write_plot(path, report.plot)))
    elif outputs.plot:  # one rule for every record: nothing to draw is said, and the run fails
        print(f"{PREFIX}bench: {none_for('--plot', report.kind)}; nothing written", file=sys.stderr)
        ok = False
    for option, path, job in jobs:
        if path:
            try:
                job(path)
            except OSError as exc:
                print(f"{PREFIX}bench: {option} {path!r} could not be written: {exc.strerror or exc}",
                      file=sys.stderr)
                ok = False
    return ok


def none_for(option: str, kind: str) -> str:
    """Why ``option`` has nothing to write for a record of ``kind``, in words that hold for either option."""
    has = "rig records with CUPTI gaps and engine records do" if option == "--plot" else "rig and engine records do"
    what = "nothing to draw it from" if option == "--plot" else "no such report"
    return f"{option}: this {kind} record has {what} ({has})"


def _write_text(path: str, text: str) -> None:
    """Write a report as UTF-8 whatever the locale (the reports hold ``±`` and ``µ``), never through a link."""
    safe_files.write_text(path, text)


def _write_plot(path: str, plot: Callable[[str], str]) -> None:
    """The plot drawn into a fresh file beside ``path``, then moved onto it; its line says ``path``."""
    with safe_files.staged(path) as temporary:
        said = plot(temporary)
    print(said.replace(temporary, path))
