"""``run -- CMD``: start a command with the shim enabled and supervise it like a shell would.

It is offered as the launcher for ``ft serve``, so it must behave as one: every signal a
supervisor sends (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) goes on to the child (to its
process group when it made one of its own), the wrapper waits and exits with the child's code, and
it never leaves the child running (orphaned, holding the GPU) nor kills it in the middle of its
shutdown unless a second stop signal asks for that. A command that cannot be executed exits as a
shell's would (127 not found, 126 found but not executable), with one line saying why.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Sequence

from .bootstrap import interpreters
from .errors import GraphfixError

NOT_FOUND, NOT_EXECUTABLE = 127, 126  # what shells exit with
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # a second one kills
FORWARDED = (*STOPPING, signal.SIGUSR1, signal.SIGUSR2)  # the user's signals: passed on every time


class CommandError(GraphfixError):
    """The command cannot be started; ``code`` is what a shell would exit with."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def resolve(name: str) -> str:
    """The executable ``name`` runs: a path as given, else the running interpreter's scripts
    directory first (``ft`` beside the venv's python, activated or not), then ``PATH``."""
    if os.sep in name:
        path = name
    else:
        scripts = sysconfig.get_paths()["scripts"]
        path = shutil.which(name, path=os.pathsep.join([scripts, os.environ.get("PATH", os.defpath)])) or ""
        if not path:
            raise CommandError(f"run: command not found: {name!r}", NOT_FOUND)
    if not os.path.exists(path):
        raise CommandError(f"run: command not found: {name!r}", NOT_FOUND)
    if os.path.isdir(path):
        raise CommandError(f"run: {name!r} is a directory, not a command", NOT_EXECUTABLE)
    if not os.access(path, os.X_OK):
        raise CommandError(f"run: {name!r} is not executable (no execute permission)", NOT_EXECUTABLE)
    return path


def foreign_python(path: str) -> str | None:
    """A warning when ``path`` is a Python interpreter other than this environment's: the shim
    reaches only interpreters that have freetoken-graphfix (and its ``.pth``) installed."""
    if not os.path.basename(path).startswith("python"):
        return None
    ours = {os.path.realpath(p) for p in (sys.executable, *interpreters())}
    if os.path.realpath(path) in ours:
        return None
    return (f"freetoken_graphfix: warning: {path} is not this environment's interpreter ({sys.executable}); "
            "unless freetoken-graphfix is installed there too, it runs without the shim")


def supervise(argv: Sequence[str], env: dict[str, str]) -> int:
    """Run ``argv`` to completion, forwarding signals; returns its exit code (128+N if killed by N).
    Raises :class:`CommandError` when the command cannot be executed."""
    received: list[int] = []  # stop signals so far
    early: list[int] = []  # signals that arrived before the child existed: it gets them once it does
    child: subprocess.Popen | None = None

    def forward(signum: int, frame: object) -> None:
        if child is None:
            early.append(signum)
            return
        if signum in STOPPING:
            received.append(signum)
            if len(received) > 1:  # a second stop signal: the user asks for it to stop now
                print(f"freetoken_graphfix: {signal.Signals(signum).name} again: killing {argv[0]} "
                      f"(pid {child.pid})", file=sys.stderr)
                _send(child, signal.SIGKILL)
                return
        if not _came_from_terminal(signum, child):
            _send(child, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        child = _start(argv, env)
        for signum in early:
            forward(signum, None)
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def _start(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen:
    """The child, or the reason it could not be executed, as a shell says it."""
    try:
        return subprocess.Popen(list(argv), env=env)
    except OSError as exc:
        name = argv[0]
        if exc.errno == errno.ENOEXEC:
            why = "cannot execute: exec format error (not a program, and no #! line)"
        elif exc.errno == errno.ENOENT:  # the file is there (resolve() saw it): its #! interpreter is not
            why = f"bad interpreter: {_interpreter(name)!r}: no such file"
        else:
            why = f"cannot execute: {exc.strerror or exc}"
        raise CommandError(f"run: {name!r}: {why}", NOT_EXECUTABLE) from None


def _interpreter(path: str) -> str:
    """The interpreter a script's ``#!`` line names."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(256)
    except OSError:
        return "?"
    return first[2:].split()[0].decode(errors="replace") if first.startswith(b"#!") and first[2:].split() else "?"


def _send(child: subprocess.Popen, signum: int) -> None:
    """To the child's own process group when it made one (a server's workers), else to the child."""
    try:
        group = os.getpgid(child.pid)
        if group == child.pid and group != os.getpgrp():
            os.killpg(group, signum)
        else:
            child.send_signal(signum)
    except ProcessLookupError:
        pass  # it has just exited: wait() returns its code


def _came_from_terminal(signum: int, child: subprocess.Popen) -> bool:
    """Ctrl-C at a terminal reaches the whole foreground process group, the child included: sending
    it again would count as a second interrupt (which makes servers skip their clean shutdown)."""
    if signum != signal.SIGINT:
        return False
    try:
        foreground = os.tcgetpgrp(sys.stdin.fileno())
        return foreground == os.getpgrp() == os.getpgid(child.pid)
    except (OSError, ValueError, ProcessLookupError):
        return False
