"""The files a benchmark writes (``--json``, ``--markdown``, ``--plot``, ``--logs``): refused before a run
when they could not be written at its end, and written after its results were printed."""

from __future__ import annotations

import os
import sys

from . import record_files, records
from .reports import Report
from .settings import Outputs

WRITABLE = "accepted values are a file path in an existing, writable directory"


def check_writable(path: str | None, option: str) -> str | None:
    """Why an output file could not be written at the end of a run, in one line; ``None`` when it can."""
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path)) if path else ""
    if not path or os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        return f"{option} {path!r}: cannot be written; {WRITABLE}"
    if os.path.exists(path):
        try:
            with open(path, "a"):  # opened for appending, never written: the file is left as it is
                pass
        except OSError as exc:
            return f"{option} {path!r}: cannot be written ({exc.strerror}); {WRITABLE}"
    return None


def logs_unusable(logs: str | None) -> str | None:
    """``--logs DIR`` that cannot hold the logs: refused before a run, not a traceback after its start."""
    accepted = "accepted values are a directory (made if missing)"
    if logs is None:
        return None
    if not logs:
        return f"--logs '': an empty path; {accepted}"
    if os.path.exists(logs) and not os.path.isdir(logs):
        return f"--logs {logs!r} is not a directory; {accepted}"
    parent = os.path.dirname(os.path.abspath(logs))
    if not os.path.isdir(logs) and not (os.path.isdir(parent) and os.access(parent, os.W_OK)):
        return f"--logs {logs!r}: cannot be made here; {accepted}"
    if os.path.isdir(logs) and not os.access(logs, os.W_OK):
        return f"--logs {logs!r}: not writable; {accepted}"
    return None


def write_outputs(outputs: Outputs, record: records.Record, report: Report) -> bool:
    """``--json``, ``--markdown`` and ``--plot`` of a finished run or a re-judged record: a file that
    cannot be written after all is one line on stderr, and the others are still written."""
    jobs = [("--json", outputs.json, lambda path: record_files.write(path, record))]
    if report.markdown is not None:
        jobs.append(("--markdown", outputs.markdown, lambda path: _write_text(path, report.markdown(outputs.verbose))))
    if report.plot is not None:
        jobs.append(("--plot", outputs.plot, lambda path: print(report.plot(path))))
    ok = True
    for option, path, job in jobs:
        if path:
            try:
                job(path)
            except OSError as exc:
                print(f"bench: {option} {path!r} could not be written: {exc.strerror or exc}", file=sys.stderr)
                ok = False
    return ok


def _write_text(path: str, text: str) -> None:
    """Write a report as UTF-8 whatever the locale: the reports hold ``±`` and ``µ``."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
