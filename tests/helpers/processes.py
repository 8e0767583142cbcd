"""Child interpreters of the test venv, as the command-line tests start them: an environment with the variable set
or unset, the console entry run as a process, and a trapper that notes every signal it gets."""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = ("import sys, freetoken.engine.graph as g; "
         "print('freetoken_graphfix' in sys.modules, type(vars(g)['_upload_graph']).__name__)")


def child_env(value: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}
    if value is not None:
        env["FT_GRAPH_UPLOAD"] = value
    return env


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "freetoken_graphfix", *args], env=env or child_env(None),
                          capture_output=True, text=True, timeout=120)


TRAPPER = """
import os, signal, sys, time
log = sys.argv[sys.argv.index("--log") + 1] if "--log" in sys.argv else None
def note(*words):  # one line to stdout, and appended to the --log file in one write
    line = " ".join(map(str, words)) + "\\n"
    sys.stdout.write(line)
    sys.stdout.flush()
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, line.encode())
        os.close(fd)
grandchild = None
if "--group" in sys.argv:  # a server that makes its own process group, with a worker in it
    os.setpgrp()
    r, w = os.pipe()
    grandchild = os.fork()
    if grandchild == 0:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda s, f: os._exit(77))
        os.write(w, b"1")  # its handlers are in place: the trapper may say it is ready
        time.sleep(60)
        os._exit(1)
    os.read(r, 1)
got = []
def handler(signum, frame):
    got.append(signum)
    note("got", signum)
    if signum in (signal.SIGUSR1, signal.SIGUSR2):  # a user's signal: noted, the child carries on
        return
    if "--stubborn" not in sys.argv:
        if grandchild:
            os.waitpid(grandchild, 0)
        sys.exit(40 + signum)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, handler)
if "--deaf" in sys.argv:  # a command that ignores SIGTERM
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
note("ready", os.getpid())  # only now: every process of the job handles its signals
if "--worker" in sys.argv:  # a worker in the command's group with no handler of its own
    r, w = os.pipe()
    worker = os.fork()
    if worker == 0:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(s, signal.SIG_DFL)
        os.write(w, b"1")  # its handlers are the default ones: the trapper may say it is there
        time.sleep(60)
        os._exit(0)
    os.read(r, 1)
    note("worker", worker)
while True:
    time.sleep(0.05)
"""


def supervised(tmp_path, *flags):
    """The wrapper running the trapper, once the trapper (and any worker of its) handles signals."""
    script = tmp_path / "trapper.py"
    script.write_text(TRAPPER)
    proc = subprocess.Popen([sys.executable, "-m", "freetoken_graphfix", "run", "--", sys.executable, str(script),
                             *flags], env=child_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    assert line[0] == "ready", line
    return proc, int(line[1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

