"""``run -- CMD``: start a command with the shim enabled and supervise it like a shell would.

It is offered as the launcher for ``ft serve``, so it must behave as one: every signal a
supervisor sends (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) goes on to the child (to its
process group when it made one of its own), the wrapper waits and exits with the child's code, and
it never leaves the child running (orphaned, holding the GPU) nor kills it in the middle of its
shutdown unless a second stop signal asks for that. A command that cannot be executed exits as a
shell's would (127 not found, 126 found but not executable), with one line saying why; an executable
text file without a ``#!`` line runs under ``/bin/sh``, as a shell runs it.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..bootstrap import interpreters
from ..errors import GraphfixError
from .exits import NOT_EXECUTABLE, NOT_FOUND, WARNING

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


def python_of(path: str, env: dict[str, str]) -> str | None:
    """The Python interpreter ``path`` runs: itself when it is one (by its name or the name of what it
    links to), else the one its ``#!`` line names, ``/usr/bin/env python3`` looked up on the command's
    ``PATH`` (``ft`` is such a script); ``None`` for anything else."""
    def is_python(p: str) -> bool:
        return any(os.path.basename(q).startswith("python") for q in (p, os.path.realpath(p)))

    if is_python(path):
        return path
    words = _shebang(path)
    if words and os.path.basename(words[0]) == "env":
        names = [w for w in words[1:] if not w.startswith("-")]  # env -S python3 -u: the first name
        words = [shutil.which(names[0], path=env.get("PATH", os.defpath)) or names[0]] if names else []
    return words[0] if words and is_python(words[0]) else None


def foreign_python(path: str, env: dict[str, str]) -> str | None:
    """A warning when ``path`` is, or runs (``#!``), a Python interpreter that will not load the
    shim: one whose site does not see this package's ``.pth``. Another venv or a pyenv interpreter is
    often a link to the very same binary, so that is decided by asking it (one interpreter start,
    with the command's own environment), never by the binary."""
    python = python_of(path, env)
    if python is None:
        return None
    if os.path.abspath(python) in {os.path.abspath(p) for p in (sys.executable, *interpreters())}:
        return None  # this environment's own interpreters read its site-packages
    try:
        probe = subprocess.run([python, "-c", "import sys; print('freetoken_graphfix' in sys.modules)"], env=env,
                               capture_output=True, text=True, timeout=30)
        loads = probe.stdout.strip().splitlines()[-1:] == ["True"]
    except (OSError, subprocess.SubprocessError):
        loads = False
    if loads:
        return None
    what = path if python == path else f"{path} runs {python}, which"
    return (f"{WARNING}{what} does not load the shim (its site-packages have no "
            f"freetoken-graphfix .pth; this environment's interpreter is {sys.executable}): it runs without it")


def supervise(argv: Sequence[str], env: dict[str, str], *, exiting: bool = False) -> int:
    r"""Run ``argv`` to completion, forwarding signals; returns its exit code (128+N if killed by N).
    Raises :class:`CommandError` when the command cannot be executed.

    The signals are blocked in this process from the start and taken by a thread with
    ``sigwaitinfo``, which tells who sent each one: one the kernel sent (the terminal's Ctrl-C or
    Ctrl-\, a hangup) went to the terminal's whole foreground process group, so a child in ours has
    it already; one a process sent (``kill``, a supervisor) reached the wrapper alone. Signals that
    arrive before the child exists wait, pending, and reach it once it does. With ``exiting`` (the
    ``run`` command, which exits with the code next) they stay blocked after the child has exited: a
    late repeat of a signal the child already had (GNU ``timeout``'s second kill, descheduled between
    the two) must not end the wrapper instead of passing on the child's code.

    Where the wrapper is not a terminal's foreground job (CI, ``timeout``, systemd, supervisord), the
    child gets a process group of its own: a stop signal sent to the wrapper, to the wrapper's group
    (``kill -- -PGID``, ``tini -g``) or to both (GNU ``timeout``: the command, then its own group)
    reaches the wrapper alone and goes on once. At a terminal the child stays in the foreground group,
    so it can read the terminal and Ctrl-C reaches it from the terminal."""
    signals = set(FORWARDED)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    own_group = not foreground_at_a_terminal()
    try:
        child = _start(argv, env, before, own_group=own_group)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        raise
    sentinel = _sentinel(child.pid) if own_group else None
    relay = _Relay(child, argv[0], signals)
    try:
        code = child.wait()
    finally:
        relay.stop()
        if sentinel is not None:
            sentinel.kill()  # the child is done: nothing for it to clean up after
            sentinel.wait()
        while signal.sigtimedwait(signals, 0) is not None:
            pass  # for a child that has exited: unblocked, a Ctrl-C would end the wrapper, not its code
        if not exiting:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
    return 128 - code if code < 0 else code


SI_KERNEL = 0x80  # si_code of a signal the kernel sent, a terminal's among them (Linux asm-generic/siginfo.h)
SI_USER = 0  # si_code of one a process sent with kill()
REPEAT_S = 0.2  # the same stop signal from the same process this soon again: one request sent twice
PR_SET_PDEATHSIG = 1  # prctl option (Linux linux/prctl.h): a signal for the child when its parent dies


class _Relay:
    """The thread that passes every signal on to the child, and kills it on a second stop signal."""

    def __init__(self, child: subprocess.Popen, name: str, signals: set[int]) -> None:
        self.child, self.name, self.signals = child, name, signals
        self.received: list[int] = []  # stop requests so far
        self.last: tuple[int, int, float] | None = None  # the last stop signal: (signal, sender, when)
        self.done = False
        self.thread = threading.Thread(target=self._run, name="freetoken-graphfix-signals", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        """The signal thread: each signal waited for synchronously, so the handling runs outside any signal handler."""
        while True:
            info = signal.sigwaitinfo(self.signals)
            if self.done:
                return
            self.handle(info.si_signo, info.si_code, info.si_pid)

    def handle(self, signum: int, code: int, sender: int = 0, now: float | None = None) -> None:
        """One signal: a stop request passed on once (a repeat from the same sender within 0.2 s is the same request), a
        second one kills, the others passed on."""
        if signum in STOPPING:
            now = time.monotonic() if now is None else now
            repeated = (code == SI_USER and sender and self.last is not None and self.last[:2] == (signum, sender)
                        and now - self.last[2] < REPEAT_S)
            self.last = (signum, sender, now)
            if repeated:  # GNU timeout signals the command, then its own group: one request, delivered twice
                return
            self.received.append(signum)
            if len(self.received) > 1:  # a second stop signal: the user asks for it to stop now
                print(f"freetoken-graphfix: {signal.Signals(signum).name} again: killing {self.name} "
                      f"(pid {self.child.pid})", file=sys.stderr)
                _send(self.child, signal.SIGKILL)
                return
        if not self.reached_child(code):
            _send(self.child, signum, group=signum in STOPPING)

    def reached_child(self, code: int) -> bool:
        """Whether the child already has this signal: the kernel sent it to our whole process group
        (a terminal's Ctrl-C, which must not count twice: a second SIGINT makes servers skip their
        clean shutdown) and the child is in that group."""
        if code != SI_KERNEL:
            return False
        try:
            return os.getpgid(self.child.pid) == os.getpgrp()
        except ProcessLookupError:
            return True

    def stop(self) -> None:
        """End the signal thread: wake its ``sigwaitinfo`` and wait for it."""
        self.done = True
        signal.pthread_kill(self.thread.ident, signal.SIGUSR1)  # wakes sigwaitinfo, which then returns
        self.thread.join(timeout=5)


def foreground_at_a_terminal() -> bool:
    """Whether the wrapper's process group is its controlling terminal's foreground group."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False  # no controlling terminal
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _start(argv: Sequence[str], env: dict[str, str], mask: set[int], own_group: bool = False) -> subprocess.Popen:
    """The child, or the reason it could not be executed, as a shell says it. The child gets the
    signal mask the wrapper had, a process group of its own with ``own_group``, and (Linux) a SIGTERM
    if the wrapper dies without passing one on, SIGKILL included: it is never left running alone."""
    parent = os.getpid()
    prctl = _prctl()

    def in_child() -> None:
        if own_group:
            os.setpgid(0, 0)  # first: from here on a signal to the wrapper's group passes it by
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the wrapper died before the request took effect
                os.kill(os.getpid(), signal.SIGTERM)

    try:
        return subprocess.Popen(list(argv), env=env, preexec_fn=in_child)
    except OSError as exc:
        name = argv[0]
        if exc.errno == errno.ENOEXEC and _is_text(name):  # no #! line: a shell runs it as a shell script
            return _start([SHELL, *argv], env, mask, own_group)
        if exc.errno == errno.ENOEXEC:
            why = "cannot execute binary file: exec format error"
        elif exc.errno == errno.ENOENT:  # the file is there (resolve() saw it): its #! interpreter is not
            why = f"bad interpreter: {_interpreter(name)!r}: no such file"
        else:
            why = f"cannot execute: {exc.strerror or exc}"
        raise CommandError(f"run: {name!r}: {why}", NOT_EXECUTABLE) from None


SENTINEL_SIGNAL = signal.SIGRTMIN  # the sentinel's parent-death signal: nobody forwards or sends it
SENTINEL_GRACE_S = 0.5  # from the wrapper's death to the SIGKILL of the child's group
SENTINEL = """\
import os, signal, sys, time
signal.sigwait([int(sys.argv[2])])
time.sleep(float(sys.argv[3]))
try:
    os.killpg(int(sys.argv[1]), signal.SIGKILL)
except ProcessLookupError:
    pass
"""


def _sentinel(group: int) -> subprocess.Popen | None:
    """A small process in the child's process group that outlives the wrapper's: when the wrapper dies without
    passing a signal on (SIGKILL to its own group, which the child's group does not share), the child has its
    SIGTERM at once and, ``SENTINEL_GRACE_S`` later, its whole group the SIGKILL it would have had without the
    wrapper. The stop signals the wrapper forwards to the group stay blocked in it; it is killed when the child
    exits. ``None`` where it cannot start (the child already gone, no prctl)."""
    parent, prctl = os.getpid(), _prctl()
    if prctl is None:
        return None

    def in_sentinel() -> None:
        os.setpgid(0, group)
        signal.pthread_sigmask(signal.SIG_BLOCK, {*FORWARDED, SENTINEL_SIGNAL})  # it waits for this one alone
        prctl(PR_SET_PDEATHSIG, SENTINEL_SIGNAL)
        if os.getppid() != parent:  # the wrapper died before the request took effect
            os.kill(os.getpid(), SENTINEL_SIGNAL)

    try:
        return subprocess.Popen([sys.executable, "-S", "-c", SENTINEL, str(group), str(int(SENTINEL_SIGNAL)),
                                 str(SENTINEL_GRACE_S)], preexec_fn=in_sentinel, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None


SHELL = "/bin/sh"  # what runs an executable text file without a #! line, as bash and dash do


def _is_text(path: str) -> bool:
    """Whether a shell would run ``path`` as a script: its first line (of the first 80 bytes, bash's
    sample) holds no NUL byte."""
    try:
        with open(path, "rb") as fh:
            sample = fh.read(80)
    except OSError:
        return False
    return b"\0" not in sample.split(b"\n", 1)[0]


def _prctl() -> Any:
    """libc's ``prctl`` on Linux, loaded before the fork (nothing to load in the child), else ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _shebang(path: str) -> list[str]:
    """The words of a script's ``#!`` line (interpreter first); ``[]`` for anything else."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(256)
    except OSError:
        return []
    return first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []


def _interpreter(path: str) -> str:
    """The interpreter a script's ``#!`` line names."""
    return (_shebang(path) or ["?"])[0]


def _send(child: subprocess.Popen, signum: int, group: bool = True) -> None:
    """To the child's own process group when it made one (a server's workers) and ``group``, else to the child:
    a user signal (SIGUSR1/2) goes to the command alone, as a shell sends it, so a worker without a handler for it
    lives on."""
    try:
        pgid = os.getpgid(child.pid) if group else None
        if pgid == child.pid and pgid != os.getpgrp():
            os.killpg(pgid, signum)
        else:
            child.send_signal(signum)
    except ProcessLookupError:
        pass  # it has just exited: wait() returns its code
