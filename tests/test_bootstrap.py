"""The env-gated .pth reaches spawned and subprocess children; ``run --`` passes everything through.

These start real child interpreters of the test venv, so they need the package installed there
(``pip install .[test]``): a missing .pth fails them, it does not skip them.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from freetoken_graphfix import bootstrap

from . import spawn_target

CHILD = ("import sys, freetoken.engine.graph as g; "
         "print('freetoken_graphfix' in sys.modules, type(vars(g)['_upload_graph']).__name__)")


def child_env(value: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}
    if value is not None:
        env["FT_GRAPH_UPLOAD"] = value
    return env


def test_pth_is_installed_in_site_packages():
    pth = bootstrap.installed_pth()
    assert pth is not None, f"{bootstrap.PTH_NAME} missing from {bootstrap.site_dirs()}"
    text = pth.read_text()
    assert text.count("\n") == 1 and text.startswith("import os, sys;")
    assert "torch" not in text and "freetoken." not in text  # nothing heavy at start-up


@pytest.mark.parametrize("value, expected", [
    ("auto", [True, "FunctionWrapper"]),
    ("warm", [True, "FunctionWrapper"]),
    (None, [False, "function"]),
    ("off", [False, "function"]),  # off: the .pth imports nothing
])
def test_spawned_child(value, expected, monkeypatch):
    monkeypatch.delenv("FT_GRAPH_UPLOAD", raising=False)
    if value is not None:
        monkeypatch.setenv("FT_GRAPH_UPLOAD", value)
    ctx = multiprocessing.get_context("spawn")  # what FreeToken's launch_server uses
    queue = ctx.Queue()
    proc = ctx.Process(target=spawn_target.report, args=(queue,))
    proc.start()
    result = queue.get(timeout=120)
    proc.join(60)
    assert proc.exitcode == 0
    assert list(result) == expected


@pytest.mark.parametrize("value, expected", [
    ("auto", "True FunctionWrapper"), (None, "False function"), ("0", "False function"),
    ("FALSE", "False function"), (" Deferred ", "True FunctionWrapper"), ("", "True FunctionWrapper"),
])
def test_subprocess_child(value, expected):
    out = subprocess.run([sys.executable, "-c", CHILD], env=child_env(value), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_bad_value_is_one_line_where_freetoken_runs():
    """A bad FT_GRAPH_UPLOAD costs a process that never imports FreeToken nothing (pip, scripts);
    where FreeToken is imported it is one ERROR line naming it, and FreeToken keeps its own upload."""
    out = subprocess.run([sys.executable, "-c", "print('alive')"], env=child_env("bogus"), capture_output=True,
                         text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "alive\n", "")
    out = subprocess.run([sys.executable, "-c", CHILD], env=child_env("bogus"), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["True", "function"]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].endswith("ERROR not patched: FT_GRAPH_UPLOAD='bogus' is not a valid mode; accepted values: "
                             "auto, upload, skip, warm, deferred, off, 0, false; FreeToken left untouched "
                             "(its own upload)")


@pytest.mark.parametrize("value", ["auto", "bogus"])
def test_armed_start_up_imports_nothing_heavy(value):
    """With the variable set and FreeToken never imported, start-up imports the package and its
    bootstrap module and nothing else: no wrapt, logging, enum or typing (measured: bench startup)."""
    code = ("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('freetoken_graphfix', 'wrapt', 'logging', 'enum', 'typing', 'torch', 'freetoken')))")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(value), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.strip() == str(["freetoken_graphfix", "freetoken_graphfix.bootstrap"])


def test_bootstrap_spells_the_variable_as_config_does():
    from freetoken_graphfix import config

    assert bootstrap.ENV_MODE == config.ENV_MODE
    pth = (Path(__file__).resolve().parents[1] / "freetoken_graphfix" / "_bootstrap.pth").read_text()
    off = ", ".join(f'"{value}"' for value in config.OFF_VALUES)
    assert f'os.environ.get("{config.ENV_MODE}", "off").strip().lower() not in ({off})' in pth


@pytest.mark.parametrize("value", ["off", " OFF ", "0", "false"])
def test_off_imports_nothing_and_leaves_no_finder(value):
    """Off: FreeToken imports as shipped and nothing of the package is loaded, no import hook left behind."""
    code = ("import sys, freetoken.engine.graph as g\n"
            "print(g._upload_graph.__module__, sorted(m for m in sys.modules if m.startswith('freetoken_graphfix')),"
            " [type(f).__name__ for f in sys.meta_path if type(f).__name__ == '_Finder'])")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(value), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.split() == ["freetoken.engine.graph", "[]", "[]"]


@pytest.mark.parametrize("value", ["auto", "bogus"])
def test_the_import_hook_leaves_once_freetoken_is_imported(value):
    """Armed (or armed with a bad value, which says so in one line): once FreeToken's graph module is imported the
    finder has nothing left to wait for, and later imports no longer pass through it."""
    code = ("import sys, freetoken.engine.graph, freetoken.kernel.row_store\n"  # the two modules the shim waits for
            "print([type(f).__name__ for f in sys.meta_path if type(f).__name__ == '_Finder'])")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(value), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_an_empty_variable_arms_auto_as_the_readme_says():
    """Empty means auto: the .pth arms the shim, doctor says so, and the graph module is patched."""
    code = "import freetoken.engine.graph, freetoken_graphfix as f; print(f.status()['patched'], f.status()['mode'])"
    out = subprocess.run([sys.executable, "-c", code], env=child_env(""), capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "auto"], out.stderr
    doctor = run_cli("doctor", "--no-bench", env=child_env(""))
    lines = dict(line.strip().split(": ", 1) for line in doctor.stdout.splitlines() if ": " in line)
    assert lines["FT_GRAPH_UPLOAD"] == "'' (mode auto)"
    assert lines["shim in new processes"] == "installed: FT_GRAPH_UPLOAD='' -> mode auto"


def test_a_package_that_fails_in_its_arming_prints_one_line(tmp_path):
    """A shadowing or half-removed package with no working _arm(): one line, no traceback, in every process of the
    environment (the whole .pth body is in its one guarded call)."""
    broken = tmp_path / "freetoken_graphfix"
    broken.mkdir()
    (broken / "__init__.py").write_text("")  # _arm() is gone
    env = child_env("auto")
    env["PYTHONPATH"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", "print('alive')"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "alive\n"
    assert out.stderr.strip().splitlines() == [
        "freetoken_graphfix: bootstrap not loaded: AttributeError(\"module 'freetoken_graphfix' has no "
        "attribute '_arm'\")"]


def test_import_error_prints_one_line_and_the_child_runs(tmp_path):
    broken = tmp_path / "freetoken_graphfix"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('simulated broken install')\n")
    env = child_env("auto")
    env["PYTHONPATH"] = str(tmp_path)  # shadows the installed package at start-up
    out = subprocess.run([sys.executable, "-c", "print('alive')"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout == "alive\n"
    assert out.stderr.strip().splitlines() == [
        "freetoken_graphfix: bootstrap not loaded: ImportError('simulated broken install')"]


def test_unset_variable_imports_nothing():
    out = subprocess.run([sys.executable, "-c", "import sys; print('freetoken_graphfix' in sys.modules)"],
                         env=child_env(None), capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False" and out.stderr == ""


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "freetoken_graphfix", *args], env=env or child_env(None),
                          capture_output=True, text=True, timeout=120)


def test_run_passes_arguments_and_exit_code():
    out = run_cli("run", "--", sys.executable, "-c", "import sys; print(sys.argv[1:]); sys.exit(7)", "a", "b c",
                  "--mode")
    assert out.returncode == 7, out.stderr
    assert out.stdout.strip() == "['a', 'b c', '--mode']"


def test_run_enables_the_shim_in_the_child():
    out = run_cli("run", "--mode", "warm", "--", sys.executable, "-c",
                  CHILD + "; import os; print(os.environ['FT_GRAPH_UPLOAD'])")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "FunctionWrapper", "warm"]


def test_run_keeps_the_users_mode():
    out = run_cli("run", "--", sys.executable, "-c", "import os; print(os.environ['FT_GRAPH_UPLOAD'])",
                  env=child_env("skip"))
    assert out.stdout.strip() == "skip"


def test_run_mode_overrides_a_bad_variable():
    out = run_cli("run", "--mode", "upload", "--", sys.executable, "-c",
                  "import os; print(os.environ['FT_GRAPH_UPLOAD'])", env=child_env("bogus"))
    assert out.returncode == 0 and out.stdout.strip() == "upload" and out.stderr == ""
    bad = run_cli("run", "--", "true", env=child_env("bogus"))
    assert bad.returncode == 1 and bad.stderr.strip() == (
        "freetoken-graphfix: error: FT_GRAPH_UPLOAD='bogus' is not a valid mode; accepted values: auto, upload, "
        "skip, warm, deferred, off, 0, false (or pass --mode)")


def test_run_signal_exit_code():
    out = run_cli("run", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert out.returncode == 128 + 15


def test_run_errors_are_one_line_with_shell_exit_codes(tmp_path):
    bad = run_cli("run", "--mode", "fast", "--", "true")
    assert bad.returncode == 1
    assert bad.stderr.strip() == ("freetoken-graphfix: error: --mode='fast' is not a valid mode; accepted values: "
                                  "auto, upload, skip, warm, deferred, off, 0, false")
    missing = run_cli("run", "--", "no-such-command-xyz")
    assert missing.returncode == 127
    assert missing.stderr.strip() == "freetoken-graphfix: error: run: command not found: 'no-such-command-xyz'"
    folder = run_cli("run", "--", str(tmp_path))
    assert folder.returncode == 126 and folder.stderr.strip().endswith("is a directory, not a command")
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    plain = run_cli("run", "--", str(script))
    assert plain.returncode == 126 and plain.stderr.strip().endswith("is not executable (no execute permission)")
    empty = run_cli("run")
    assert empty.returncode == 2 and "no command given" in empty.stderr  # a usage error
    for out in (bad, missing, folder, plain, empty):
        assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1


def test_run_finds_commands_beside_its_interpreter_first():
    """From a venv that is not activated: `run -- python ...` and `run -- freetoken-graphfix ...` are
    this environment's, found beside the running interpreter, not whatever PATH holds."""
    env = child_env(None)
    env["PATH"] = "/usr/bin:/bin"  # the venv's bin/ is not on it
    out = run_cli("run", "--", "python", "-c", "import sys; print(sys.prefix)", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == sys.prefix and out.stderr == ""
    assert run_cli("run", "--", "freetoken-graphfix", "--help", env=env).returncode == 0


def test_run_prefers_its_environments_command_to_one_earlier_on_path(tmp_path):
    """An unactivated venv's `ft` or `freetoken-graphfix` wins over another one first on PATH: that
    one belongs to another environment, without the shim."""
    decoy = tmp_path / "freetoken-graphfix"
    decoy.write_text("#!/bin/sh\necho decoy\n")
    decoy.chmod(0o755)
    env = child_env(None)
    env["PATH"] = os.pathsep.join([str(tmp_path), "/usr/bin", "/bin"])
    out = run_cli("run", "--", "freetoken-graphfix", "--version", env=env)
    assert out.returncode == 0 and out.stdout.startswith("freetoken-graphfix ") and "decoy" not in out.stdout


def test_run_warns_about_another_interpreter(tmp_path):
    other = tmp_path / "python3"
    other.write_text("#!/bin/sh\nexit 0\n")
    other.chmod(0o755)
    out = run_cli("run", "--", str(other))
    assert out.returncode == 0
    assert out.stderr.strip() == (f"freetoken-graphfix: warning: {other} does not load the shim (its site-packages "
                                  f"have no freetoken-graphfix .pth; this environment's interpreter is "
                                  f"{sys.executable}): it runs without it")


def test_run_warns_about_another_venvs_python_though_it_is_the_same_binary(tmp_path):
    """Another venv's python links to the very base interpreter ours does: only its site-packages
    differ, and those decide whether the shim loads there."""
    import venv

    venv.create(tmp_path / "other", with_pip=False, symlinks=True)
    other = tmp_path / "other" / "bin" / "python"  # a link to the base interpreter, as ours may be
    probe = "import sys; print('freetoken_graphfix' in sys.modules)"
    out = run_cli("run", "--", str(other), "-c", probe)
    assert out.stdout.strip() == "False" and f"warning: {other} does not load the shim" in out.stderr
    ours = run_cli("run", "--", sys.executable, "-c", probe)
    assert ours.stdout.strip() == "True" and ours.stderr == ""


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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_run_forwards_signals_and_exits_with_the_childs_code(tmp_path, signum):
    proc, child = supervised(tmp_path)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert out.strip() == f"got {int(signum)}" and proc.returncode == 40 + signum
    assert "Traceback" not in err and not alive(child)


def test_run_forwards_to_the_childs_own_process_group(tmp_path):
    proc, child = supervised(tmp_path, "--group")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 40 + signal.SIGTERM and not alive(child)


def test_run_kills_only_on_a_second_signal(tmp_path):
    """A child that takes its time to stop is waited for, never killed mid-shutdown; a second signal
    asks for the kill."""
    proc, child = supervised(tmp_path, "--stubborn")
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline().strip() == f"got {int(signal.SIGTERM)}"  # the first one reached it
    time.sleep(0.5)  # a window in which nothing may happen (load only makes it longer)
    assert proc.poll() is None and alive(child)  # still shutting down: the wrapper waits
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL and not alive(child)
    assert "SIGTERM again: killing" in err


def test_doctor_tells_the_truth():
    out = run_cli("doctor", "--no-bench", env=child_env(None))
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # FreeToken's and the shim's own lines stay out of the report
    lines = dict(line.strip().split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert lines["FT_GRAPH_UPLOAD"] == "unset (mode auto)"
    assert lines["freetoken"].startswith("0.2.1 at ") and lines["freetoken"].endswith("(a tested release)")
    assert lines["shim in doctor"].startswith("patched, mode auto: freetoken 0.2.1 holds the capture-time upload")
    assert lines["shim in doctor"].endswith("(doctor installs the shim itself, so this holds for this process only)")
    assert lines["deferred guard"].startswith("available")
    assert lines["bootstrap .pth"].endswith(bootstrap.PTH_NAME)
    assert lines["shim in new processes"] == (
        "NOT installed: FT_GRAPH_UPLOAD is unset (the .pth only acts when it is set); to turn it on: export "
        "FT_GRAPH_UPLOAD=auto before starting FreeToken, or start it with freetoken-graphfix run -- <command>")
    assert sys.executable in lines["interpreters"] or os.path.realpath(sys.executable) in lines["interpreters"]
    assert lines["patch series"].startswith("not applied (2 patches for FreeToken 0.2.1 in ")
    assert "None" not in out.stdout
    labels = [line.split(":", 1)[0].strip() for line in out.stdout.splitlines() if ": " in line]
    assert len(labels) == len(set(labels))  # each label once


@pytest.mark.parametrize("value", ["off", "0", "False"])
def test_doctor_quotes_an_off_value_as_the_user_gave_it(value):
    off = run_cli("doctor", "--no-bench", env=child_env(value))
    lines = dict(line.strip().split(": ", 1) for line in off.stdout.splitlines() if ": " in line)
    assert lines["shim in doctor"].startswith(f"not patched, mode off: disabled (FT_GRAPH_UPLOAD={value!r})")
    assert lines["shim in new processes"] == (
        f"NOT installed: FT_GRAPH_UPLOAD={value!r}: shim disabled, FreeToken keeps its own upload")


def test_doctor_reports_a_bad_variable_as_the_problem():
    out = run_cli("doctor", "--no-bench", env=child_env("bogus"))
    assert out.returncode == 1 and out.stderr == "" and "Traceback" not in out.stdout
    lines = dict(line.strip().split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert lines["FT_GRAPH_UPLOAD"] == ("PROBLEM: FT_GRAPH_UPLOAD='bogus' is not a valid mode; accepted values: "
                                        "auto, upload, skip, warm, deferred, off, 0, false; fix: export "
                                        "FT_GRAPH_UPLOAD=auto (or unset it)")
    assert lines["shim in doctor"].startswith("not patched: FT_GRAPH_UPLOAD is not a valid mode (above)")


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["patch", "--help"]])
def test_help_works_whatever_the_variable(args):
    out = run_cli(*args, env=child_env("bogus"))
    assert out.returncode == 0 and out.stderr == "" and "usage:" in out.stdout


def test_bootstrap_logs_each_line_once():
    """The shim's lines reach the engine's stderr once, whether or not the program configures logging."""
    code = "import logging; logging.basicConfig(level=logging.INFO); import freetoken.engine.graph"
    out = subprocess.run([sys.executable, "-c", code], env=child_env("auto"), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if "patched (mode auto)" in line]
    assert len(lines) == 1, out.stderr  # in whichever format: once, not once per handler
    assert lines[0].startswith("[freetoken_graphfix pid=")


@pytest.mark.parametrize("user_value, calls", [
    (None, "g.uninstall()"), ("warm", "g.uninstall()"),
    (None, "g.install(); g.uninstall()"), ("warm", "g.install(); g.uninstall()"),
])
def test_uninstall_puts_the_variable_back_as_it_found_it(user_value, calls):
    """Before FreeToken was imported (the install only pending) or after an install: the variable
    that import exported for child processes goes, and a value the user set stays."""
    code = f"import os, freetoken_graphfix as g; {calls}; print(os.environ.get('FT_GRAPH_UPLOAD'))"
    out = subprocess.run([sys.executable, "-c", code], env=child_env(user_value), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(user_value)


SPAWNED = """
import multiprocessing as mp, sys

def child(queue):
    import freetoken.engine.graph  # a scheduler process: it imports FreeToken, not freetoken_graphfix
    shim = sys.modules.get("freetoken_graphfix")
    queue.put(None if shim is None else shim.status()["patched"])

if __name__ == "__main__":
    import freetoken_graphfix
    freetoken_graphfix.install()  # the parent: installed, FreeToken's graph module not imported yet
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    print(queue.get(timeout=120))
    proc.join()
"""


def test_processes_started_after_the_import_get_the_shim_too(tmp_path):
    """A program that installs the shim and then spawns its scheduler processes before its own import of FreeToken:
    install() exported FT_GRAPH_UPLOAD=auto, so the .pth arms the shim there."""
    script = tmp_path / "launcher.py"
    script.write_text(SPAWNED)
    out = subprocess.run([sys.executable, str(script)], env=child_env(None), capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_run_warns_about_a_script_whose_interpreter_is_another_venvs(tmp_path):
    """``ft`` is a script: its ``#!`` python, named outright, through ``/usr/bin/env`` or a link, is
    the one that must load the shim."""
    import venv

    venv.create(tmp_path / "other", with_pip=False, symlinks=True)
    other = tmp_path / "other" / "bin" / "python"
    probe = "import sys; print('freetoken_graphfix' in sys.modules)"
    direct = tmp_path / "ft"
    direct.write_text(f"#!{other}\n{probe}\n")
    via_env = tmp_path / "ft-env"
    via_env.write_text(f"#!/usr/bin/env python3\n{probe}\n")
    linked = tmp_path / "py"
    linked.symlink_to(other)
    ours = tmp_path / "ft-ours"
    ours.write_text(f"#!{sys.executable}\n{probe}\n")
    for script in (direct, via_env, ours):
        script.chmod(0o755)
    env = child_env(None)
    env["PATH"] = os.pathsep.join([str(tmp_path / "other" / "bin"), env.get("PATH", "")])
    for script, runs in ((direct, other), (via_env, tmp_path / "other" / "bin" / "python3")):
        out = run_cli("run", "--", str(script), env=env)
        assert out.stdout.strip() == "False", out.stderr
        assert f"warning: {script} runs {runs}, which does not load the shim" in out.stderr, out.stderr
    out = run_cli("run", "--", str(linked), "-c", probe, env=env)
    assert f"warning: {linked} does not load the shim" in out.stderr
    out = run_cli("run", "--", str(ours), env=child_env(None))
    assert out.stdout.strip() == "True" and out.stderr == ""
