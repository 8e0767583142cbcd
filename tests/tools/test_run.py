"""``run``: exec failures as a shell reports them, every signal a supervisor sends, Ctrl-C at a
terminal, and Ctrl-C before the wrapper handles signals."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers.processes import alive, child_env, run_cli, supervised


@pytest.mark.parametrize("first_line, why", [
    ("\0\x7fnot a program\n", "cannot execute binary file: exec format error"),
    ("#!/nonexistent/interp\necho hi\n", "bad interpreter: '/nonexistent/interp': no such file"),
])
def test_a_command_that_cannot_be_executed_exits_126_in_one_line(tmp_path, first_line, why):
    script = tmp_path / "tool"
    script.write_bytes(first_line.encode())
    script.chmod(0o755)
    out = run_cli("run", "--", str(script))
    assert out.returncode == 126 and out.stdout == ""
    assert out.stderr == f"freetoken-graphfix: error: run: {str(script)!r}: {why}\n"


def test_an_executable_text_file_without_a_shebang_runs_under_sh_as_a_shell_runs_it(tmp_path):
    """bash and dash run an executable text file with no #! line as a shell script: so does run."""
    script = tmp_path / "tool"
    script.write_text('echo "hi $1"\nexit 3\n')
    script.chmod(0o755)
    shell = subprocess.run(["sh", "-c", f"{script} there"], capture_output=True, text=True, timeout=60)
    out = run_cli("run", "--", str(script), "there")
    assert (out.returncode, out.stdout) == (shell.returncode, shell.stdout) == (3, "hi there\n")


def test_an_empty_mode_is_an_error_not_auto():
    out = run_cli("run", "--mode", "", "--", "true")
    assert out.returncode == 1
    assert out.stderr == ("freetoken-graphfix: error: --mode='' is not a valid mode; accepted values: auto, upload, "
                          "skip, warm, deferred, off, 0, false\n")


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2])
def test_user_signals_are_passed_on_and_the_child_carries_on(tmp_path, signum):
    proc, child = supervised(tmp_path)
    for _ in range(2):  # never counted as a second stop signal
        proc.send_signal(signum)
        assert proc.stdout.readline().strip() == f"got {int(signum)}"
    assert proc.poll() is None and alive(child)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 40 + signal.SIGTERM and "Traceback" not in err


def test_sigquit_stops_the_child_not_only_the_wrapper(tmp_path):
    proc, child = supervised(tmp_path)
    try:
        proc.send_signal(signal.SIGQUIT)
        out, err = proc.communicate(timeout=30)
        assert out.strip() == f"got {int(signal.SIGQUIT)}" and proc.returncode == 40 + signal.SIGQUIT
        assert not alive(child)
    finally:
        if alive(child):  # a wrapper that died alone left it running: never leave it behind
            os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("module", ["freetoken_graphfix.tools.cli", "freetoken_graphfix.tools.launcher"])
def test_ctrl_c_while_the_wrapper_imports_prints_no_traceback(module):
    """Ctrl-C while python -m freetoken_graphfix is still importing its modules (before any handler
    of its own exists): exit 130 as a shell reports an interrupt, one quiet exit, no traceback. The
    interrupt is raised at that import by an audit hook, so the moment is exact, not a race."""
    code = ("import runpy, sys\n"
            "def hook(event, args):\n"
            f"    if event == 'import' and args[0] == {module!r}:\n"
            "        raise KeyboardInterrupt\n"
            "sys.addaudithook(hook)\n"
            "sys.argv = ['freetoken_graphfix', 'run', '--', 'true']\n"
            "runpy.run_module('freetoken_graphfix', run_name='__main__', alter_sys=True)\n")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(None), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 130 and out.stderr == "" and out.stdout == "", out.stderr


def test_ctrl_c_once_running_goes_to_the_child():
    child = ("import signal, time; signal.signal(signal.SIGINT, signal.SIG_DFL); print('ready', flush=True); "
             "time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-m", "freetoken_graphfix", "run", "--", sys.executable, "-c", child],
                            env=child_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"  # the child runs, SIGINT at its default action
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err == "", err  # the child killed by SIGINT: 128 + 2


def events(log, until: tuple[str, ...], deadline: float) -> list[str]:
    """The job's lines in ``log`` once there is one starting with each of ``until`` (or at ``deadline``)."""
    while True:
        lines = log.read_text().splitlines() if log.exists() else []
        if all(any(line.startswith(u) for line in lines) for u in until) or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


def under_a_terminal(tmp_path, flags: list[str], act, stdin: str = "None") -> tuple[list[str], int, str]:
    """The wrapper as a terminal's foreground job, started by a driver that plays the shell (ignoring
    the terminal's Ctrl-C itself, not for its job), with the trapper as its command. ``act(fd,
    wrapper_pid)`` does something to it once the trapper says (in a file) that every process of the
    job handles its signals. Returns the job's lines from that file (never from the terminal, where
    they could be lost), the driver's exit code (the wrapper's) and the terminal's output; a job that
    does not end in 30 s is killed and fails."""
    import pty
    import termios

    log = tmp_path / "events"
    script = tmp_path / "driver.py"
    script.write_text(f"""
import os, signal, subprocess, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # like a shell: the terminal's Ctrl-C is not for it,
proc = subprocess.Popen([sys.executable, "-m", "freetoken_graphfix", "run", "--", sys.executable,
                         {str(tmp_path / 'trapper.py')!r}, "--log", {str(log)!r}, *{flags!r}], env=os.environ,
                        stdin={stdin}, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # but its job's
with open({str(log)!r}, "a") as fh:
    fh.write(f"wrapper {{proc.pid}}\\n")
sys.exit(proc.wait())
""")
    from tests.helpers.processes import TRAPPER

    (tmp_path / "trapper.py").write_text(TRAPPER)
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own with the pty as its controlling terminal
        attrs = termios.tcgetattr(0)
        attrs[3] |= termios.NOFLSH  # Ctrl-C must not discard what the job wrote before it
        termios.tcsetattr(0, termios.TCSANOW, attrs)
        os.execve(sys.executable, [sys.executable, str(script)], child_env(None))
    output, status = b"", None

    def drain(timeout: float) -> None:
        nonlocal output
        with contextlib.suppress(OSError):  # the terminal closed: everything in it exited
            while select.select([fd], [], [], timeout)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    return
                output += chunk
                timeout = 0

    try:
        lines = events(log, ("wrapper", "ready"), time.monotonic() + 60)
        assert {line.split()[0] for line in lines} == {"wrapper", "ready"}, (lines, output)
        wrapper = next(int(line.split()[1]) for line in lines if line.startswith("wrapper"))
        act(fd, wrapper)
        deadline = time.monotonic() + 30
        while status is None and time.monotonic() < deadline:
            drain(0.1)
            done, st = os.waitpid(pid, os.WNOHANG)
            status = st if done else None
    finally:
        if status is None:  # the job never ended: end the session and the child's group, then fail
            lines = log.read_text().split() if log.exists() else []
            child = lines[lines.index("ready") + 1] if "ready" in lines else None
            for group in (pid, int(child) if child else None):
                if group is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(group, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        drain(0)
        os.close(fd)
    return log.read_text().splitlines(), os.waitstatus_to_exitcode(status), output.decode(errors="replace")


def ctrl_c(fd: int, wrapper: int) -> None:
    os.write(fd, b"\x03")  # as typed


@pytest.mark.parametrize("flags, stdin", [
    (["--group"], "None"),  # a server in its own group: the terminal's Ctrl-C reaches it only through the wrapper
    ([], "None"),  # in the wrapper's group: the terminal delivered it already
    ([], "subprocess.DEVNULL"),  # the same, the wrapper's stdin no terminal (run ... < /dev/null)
])
def test_a_ctrl_c_at_a_terminal_reaches_the_child_exactly_once(tmp_path, flags, stdin):
    """At a terminal Ctrl-C goes to the foreground process group: the wrapper and a child in that
    group get it from the terminal (the wrapper must not send it twice, whatever its stdin), but a
    child that made its own group gets it only from the wrapper. Run here under a real pseudo-terminal."""
    lines, code, tty = under_a_terminal(tmp_path, flags, ctrl_c, stdin)
    assert lines.count(f"got {int(signal.SIGINT)}") == 1, (lines, tty)  # once: not also a second, killing, one
    assert code == 40 + signal.SIGINT, (lines, tty)


def test_a_supervisors_sigint_reaches_the_child_while_the_wrapper_is_the_foreground_job(tmp_path):
    """``kill -INT <wrapper>`` from another shell reaches the wrapper alone: it must go on to the
    child, though the wrapper is the terminal's foreground job."""
    lines, code, tty = under_a_terminal(tmp_path, [], lambda fd, wrapper: os.kill(wrapper, signal.SIGINT))
    assert lines.count(f"got {int(signal.SIGINT)}") == 1 and code == 40 + signal.SIGINT, (lines, tty)


def test_a_child_never_outlives_a_killed_wrapper(tmp_path):
    """A wrapper killed by SIGKILL cannot pass anything on: Linux sends its child SIGTERM then."""
    proc, child = supervised(tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child)
        assert proc.stdout.read().strip() == f"got {int(signal.SIGTERM)}"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_signal_before_the_child_exists_reaches_it(tmp_path):
    """A SIGTERM that lands while the wrapper is still starting the child waits for it and is passed
    on: the wrapper never dies of it alone, leaving the child behind."""
    from tests.helpers.processes import TRAPPER

    (tmp_path / "trapper.py").write_text(TRAPPER)
    code = ("import os, signal, sys\nfrom freetoken_graphfix.tools import launcher as run\nreal = run._start\n"
            "def early(argv, env, mask, **kw):\n    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    return real(argv, env, mask, **kw)\n"
            "run._start = early\n"
            f"sys.exit(run.supervise([sys.executable, {str(tmp_path / 'trapper.py')!r}], dict(os.environ)))")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(None), capture_output=True, text=True, timeout=60)
    assert out.returncode in (40 + signal.SIGTERM, 128 + signal.SIGTERM), (out.returncode, out.stderr)


def test_a_signal_left_pending_when_the_child_exits_does_not_replace_its_code(tmp_path):
    """A terminal's Ctrl-C reaches the wrapper and its child together; when the child exits before the
    relay thread takes the wrapper's copy, that copy is still pending as the wrapper restores its
    signal mask, and must not end the wrapper with KeyboardInterrupt instead of the child's code. Made
    exact here: the relay thread starts waiting only once the child has exited."""
    code = ("import os, signal, sys, threading\nfrom freetoken_graphfix.tools import launcher as run\n"
            "exited = threading.Event()\nrun_, stop = run._Relay._run, run._Relay.stop\n"
            "run._Relay._run = lambda self: (exited.wait(), run_(self))\n"
            "run._Relay.stop = lambda self: (exited.set(), stop(self))\n"
            "child = 'import os, signal, sys; os.kill(os.getppid(), signal.SIGINT); sys.exit(42)'\n"
            "sys.exit(run.supervise([sys.executable, '-c', child], dict(os.environ)))")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(None), capture_output=True, text=True, timeout=60)
    assert out.returncode == 42 and out.stderr == "", (out.returncode, out.stderr)


def test_the_relay_thread_ends_with_the_child():
    """Once the child has exited, the relay thread takes the wake-up signal and ends: left waiting, the
    wrapper would wait for it (5 s) before it exits."""
    code = ("import os, sys, threading\nfrom freetoken_graphfix.tools import launcher as run\n"
            "assert run.supervise(['true'], dict(os.environ)) == 0\n"
            "print([t.name for t in threading.enumerate() if t.name == 'freetoken-graphfix-signals'])")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(None), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)


def test_a_child_that_joined_another_group_gets_the_signal_alone(tmp_path):
    """The wrapper signals the child's group only when the child leads a group of its own (a server and
    its workers); a child that joined some other process's group gets the signal alone, never that
    group's other members."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=os.setpgrp)
    try:
        child = ("import os, signal, sys, time; os.setpgid(0, int(sys.argv[1])); "
                 "signal.signal(signal.SIGTERM, lambda s, f: sys.exit(55)); print('ready', flush=True); time.sleep(60)")
        proc = subprocess.Popen([sys.executable, "-m", "freetoken_graphfix", "run", "--", sys.executable, "-c", child,
                                 str(bystander.pid)], env=child_env(None), stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 55
        assert bystander.poll() is None, "the wrapper signalled the whole group the child had joined"
    finally:
        bystander.kill()
        bystander.wait()


def wrapped(tmp_path, *prefix, flags=(), **popen):
    """``PREFIX... python -m freetoken_graphfix run -- trapper FLAGS``, once the trapper handles its signals."""
    from tests.helpers.processes import TRAPPER

    (tmp_path / "trapper.py").write_text(TRAPPER)
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "freetoken_graphfix", "run", "--", sys.executable,
                             str(tmp_path / "trapper.py"), *flags], env=child_env(None), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)
    line = proc.stdout.readline().split()
    assert line and line[0] == "ready", (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(line[1])


@pytest.mark.parametrize("attempt", range(5))
def test_under_gnu_timeout_the_child_gets_one_sigterm_and_shuts_down_cleanly(tmp_path, attempt):
    """GNU timeout signals its command, then its own process group: the wrapper gets the one request
    twice (or merged into one) and passes it on once; the child, in a group of its own, gets it once
    and is never killed for a "second" one. Driven by a SIGTERM to timeout, which relays it exactly as
    at expiry, once the trapper is ready (no race with a timer)."""
    proc, child = wrapped(tmp_path, "timeout", "--preserve-status", "600")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert out.split("\n").count(f"got {int(signal.SIGTERM)}") == 1, (out, err)
    assert proc.returncode == 40 + signal.SIGTERM and "again: killing" not in err, (proc.returncode, err)
    assert not alive(child)


@pytest.mark.parametrize("attempt", range(5))
def test_a_kill_of_the_wrappers_group_reaches_the_child_once(tmp_path, attempt):
    """``kill -TERM -- -PGID`` (supervisord's stopasgroup, tini -g, a CI runner): one delivery, as
    without the wrapper."""
    proc, child = wrapped(tmp_path, start_new_session=True)  # the wrapper leads a group: killpg is safe here
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert out.split("\n").count(f"got {int(signal.SIGTERM)}") == 1, (out, err)
    assert proc.returncode == 40 + signal.SIGTERM and "again: killing" not in err
    assert os.getpgid(os.getpid()) != proc.pid  # the test runner was never in that group


def test_a_deliberate_second_stop_after_a_group_kill_still_kills(tmp_path):
    proc, child = wrapped(tmp_path, flags=("--stubborn",), start_new_session=True)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.stdout.readline().strip() == f"got {int(signal.SIGTERM)}"
    time.sleep(0.5)  # past the window in which a repeat is one request delivered twice
    assert proc.poll() is None and alive(child)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL and "SIGTERM again: killing" in err and not alive(child)


def test_one_stop_signal_sent_twice_at_once_by_one_process_is_one_request():
    """The relay's rule itself, on its clock: the same signal from the same sender within REPEAT_S is a
    repeat; after it, or from another sender, it is a second request (which kills)."""
    from freetoken_graphfix.tools import launcher as run

    sent = []

    class Relay(run._Relay):
        def __init__(self) -> None:  # no thread, no child: the rule alone
            self.received, self.last, self.name = [], None, "x"
            self.child = type("C", (), {"pid": 1})()

        def reached_child(self, code: int) -> bool:
            return False

    run_send = run._send
    try:
        run._send = lambda child, signum, **how: sent.append(signum)
        relay = Relay()
        relay.handle(signal.SIGTERM, run.SI_USER, 100, now=10.0)
        relay.handle(signal.SIGTERM, run.SI_USER, 100, now=10.0 + run.REPEAT_S / 2)  # timeout's second
        assert sent == [signal.SIGTERM] and relay.received == [signal.SIGTERM]
        relay.handle(signal.SIGTERM, run.SI_USER, 200, now=10.0 + run.REPEAT_S / 2)  # another sender
        assert sent == [signal.SIGTERM, signal.SIGKILL]
        again = Relay()
        again.handle(signal.SIGTERM, run.SI_USER, 100, now=10.0)
        again.handle(signal.SIGTERM, run.SI_USER, 100, now=10.0 + 2 * run.REPEAT_S)  # later: deliberate
        assert sent[-1] == signal.SIGKILL and len(again.received) == 2
    finally:
        run._send = run_send


def test_a_late_repeat_after_the_child_exited_does_not_replace_its_code():
    """GNU timeout can be descheduled between its two kills: the repeat lands once the child has exited
    and its code is on its way out. ``run`` supervises with ``exiting``: the signal stays blocked and
    the wrapper exits with the child's code. (Without it, that SIGTERM would end the wrapper.)"""
    code = ("import os, signal, sys, time\nfrom freetoken_graphfix.tools import launcher as run\n"
            "status = run.supervise([sys.executable, '-c', 'import sys; sys.exit(42)'], dict(os.environ), "
            "exiting=True)\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(0.2)\nsys.exit(status)")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(None), capture_output=True, text=True, timeout=60)
    assert out.returncode == 42 and out.stderr == "", (out.returncode, out.stderr)
    restored = code.replace("exiting=True", "exiting=False")
    out = subprocess.run([sys.executable, "-c", restored], env=child_env(None), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == -signal.SIGTERM  # a library caller gets its own signal mask back


def sentinel_of(wrapper: int, child: int, timeout: float = 30) -> int:
    """The pid of the wrapper's sentinel once it is in place (started, in the child's group, its parent-death
    signal set before it ran Python): the handshake before the wrapper's group is killed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == child:
                continue
            with contextlib.suppress(OSError):
                stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
                if int(stat[1]) == wrapper and int(stat[2]) == child and b"-S" in cmdline[1:3]:
                    return int(entry)
        time.sleep(0.02)
    raise AssertionError("the wrapper started no sentinel")


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie only init has yet to reap."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("attempt", range(3))
def test_a_sigkill_of_the_wrappers_group_leaves_no_command_behind(tmp_path, attempt):
    """supervisord's killasgroup, ``timeout -k`` from a terminal: run leads its own group (setsid) and that group is
    SIGKILLed. A command that ignores SIGTERM is gone within a second, as it would be without run."""
    proc, child = wrapped(tmp_path, flags=("--deaf",), start_new_session=True)
    try:
        sentinel_of(proc.pid, child)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 1.0
        while not gone(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gone(child)
    finally:
        if not gone(child):
            os.kill(child, signal.SIGKILL)


def test_the_sentinel_leaves_with_the_command(tmp_path):
    """A command that exits normally takes the sentinel with it: nothing of the wrapper is left in its group."""
    proc, child = wrapped(tmp_path, start_new_session=True)
    sentinel = sentinel_of(proc.pid, child)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 40 + signal.SIGTERM and gone(sentinel)


def test_a_user_signal_goes_to_the_command_alone_not_its_workers(tmp_path):
    """SIGUSR1 to run reaches the command, as a shell sends it; a worker of the command (same group) with no handler
    for it lives on."""
    proc, child = wrapped(tmp_path, flags=("--worker",), start_new_session=True)
    worker = int(proc.stdout.readline().split()[1])
    proc.send_signal(signal.SIGUSR1)
    assert proc.stdout.readline().strip() == f"got {int(signal.SIGUSR1)}"
    deadline = time.monotonic() + 0.5  # a worker the signal reached dies within microseconds of it: watch a while
    while not gone(worker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not gone(worker) and os.getpgid(worker) == child
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
