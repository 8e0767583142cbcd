"""Every child process this package starts, run one way: a command and an optional JSON spec out, one
tagged JSON line back, and one error path.

A child answers with :func:`answer`: one line on stdout, ``RESULT_TAG`` then its JSON object, so that
a library printing to stdout (FreeToken logs there) is never read as the answer. :func:`run` returns
that object, or raises :class:`ChildError` in one line: the child exited non-zero, ran past its
timeout, or gave no answer, with the last line its stderr wrote. The child's stderr streams into its
own log (so a hung child's last words are there after the kill), then the rest of its stdout.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Mapping
from typing import Any

from ..errors import GraphfixError

RESULT_TAG = "FREETOKEN_GRAPHFIX_RESULT "


class ChildError(GraphfixError):
    """A child process that did not answer: why, in one line."""


def answer(data: Mapping[str, Any]) -> None:
    """The child's answer: one tagged JSON line on stdout (the last one counts)."""
    print(RESULT_TAG + json.dumps(data), flush=True)


def run(argv: list[str], *, log: str, timeout: float, env: Mapping[str, str] | None = None,
        spec: Mapping[str, Any] | None = None, tail: int = 1) -> dict[str, Any]:
    """Run ``argv`` (with ``spec`` written as JSON beside ``log``, its path the last argument) and return its
    answer; :class:`ChildError` naming why not, with the last ``tail`` lines of its stderr."""
    if spec is not None:
        spec_path = log.removesuffix(".log") + ".spec.json"
        with open(spec_path, "w", encoding="utf-8") as fh:
            json.dump(spec, fh)
        argv = [*argv, spec_path]
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(f"$ {shlex.join(argv)}\n")
        fh.flush()
        start = fh.tell()
        try:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=fh, text=True, env=env, timeout=timeout)
            code, stdout, why = proc.returncode, proc.stdout, f"exited {proc.returncode}"
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            code, why = None, f"killed after {timeout:g} s"
    with open(log, encoding="utf-8", errors="replace") as fh:
        fh.seek(start)
        last = [ln for ln in fh.read().splitlines() if ln.strip()][-tail:]
    lines = stdout.splitlines()
    with open(log, "a", encoding="utf-8") as fh:
        fh.writelines(ln + "\n" for ln in lines if not ln.startswith(RESULT_TAG))
    answers = [ln[len(RESULT_TAG):] for ln in lines if ln.startswith(RESULT_TAG)]
    if code == 0 and answers:
        try:
            data = json.loads(answers[-1])
        except json.JSONDecodeError as exc:
            raise ChildError(f"its answer is not JSON ({exc})") from None
        if isinstance(data, dict):
            return data
        raise ChildError(f"its answer is not a JSON object: {answers[-1][:60]}")
    if code == 0:
        why = "exited 0 without an answer"
    raise ChildError(f"{why}: {' | '.join(last) or 'no output'}")
