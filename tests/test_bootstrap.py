"""The env-gated .pth reaches spawned and subprocess children; ``run --`` passes everything through.

These start real child interpreters of the test venv, so they need the package installed there
(``pip install .[test]``): a missing .pth fails them, it does not skip them.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

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
    ("off", [True, "function"]),
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
    ("auto", "True FunctionWrapper"), (None, "False function"), ("0", "True function"),
    ("FALSE", "True function"), (" Deferred ", "True FunctionWrapper"),
])
def test_subprocess_child(value, expected):
    out = subprocess.run([sys.executable, "-c", CHILD], env=child_env(value), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_bad_value_prints_one_line_and_the_child_runs():
    out = subprocess.run([sys.executable, "-c", "print('alive')"], env=child_env("bogus"), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "alive\n"
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("freetoken_graphfix: bootstrap not loaded: ConfigError(")
    assert "FT_GRAPH_UPLOAD='bogus'" in lines[0]


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


def test_run_signal_exit_code():
    out = run_cli("run", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert out.returncode == 128 + 15


def test_run_errors_are_one_line():
    bad = run_cli("run", "--mode", "fast", "--", "true")
    assert bad.returncode == 1
    assert bad.stderr.strip() == ("freetoken_graphfix: error: --mode='fast' is not a valid mode; accepted values: "
                                  "auto, upload, skip, warm, deferred, off, 0, false")
    missing = run_cli("run", "--", "no-such-command-xyz")
    assert missing.returncode == 1
    assert missing.stderr.strip() == "freetoken_graphfix: error: run: command not found: 'no-such-command-xyz'"
    empty = run_cli("run")
    assert empty.returncode == 1 and "no command given" in empty.stderr


def test_doctor_tells_the_truth():
    out = run_cli("doctor", "--no-bench", env=child_env(None))
    assert out.returncode == 0, out.stderr
    lines = dict(line.strip().split(": ", 1) for line in out.stdout.splitlines())
    assert lines["FT_GRAPH_UPLOAD"] == "unset (mode auto)"
    assert lines["freetoken"].startswith("0.2.1 at ") and lines["freetoken"].endswith("(tested: True)")
    assert lines["patched"].startswith("yes: freetoken 0.2.1 holds the capture-time upload")
    assert lines["deferred"].startswith("available")
    assert lines["bootstrap .pth"].endswith(bootstrap.PTH_NAME)
    assert lines["new processes"].startswith("shim NOT installed: FT_GRAPH_UPLOAD is unset")
    assert sys.executable in lines["interpreters"] or os.path.realpath(sys.executable) in lines["interpreters"]
    assert lines["patch series"].startswith("not applied (3 patches in ")
    off = run_cli("doctor", "--no-bench", env=child_env("off"))
    lines = dict(line.strip().split(": ", 1) for line in off.stdout.splitlines())
    assert lines["patched"] == "no: disabled (FT_GRAPH_UPLOAD=off)"
    assert lines["new processes"] == (
        "shim NOT installed: FT_GRAPH_UPLOAD='off': shim disabled, FreeToken keeps its own upload")


def test_bootstrap_logs_each_line_once():
    """The shim's lines reach the engine's stderr once, whether or not the program configures logging."""
    code = "import logging; logging.basicConfig(level=logging.INFO); import freetoken.engine.graph"
    out = subprocess.run([sys.executable, "-c", code], env=child_env("auto"), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if "patched (mode auto)" in line]
    assert len(lines) == 1, out.stderr  # in whichever format: once, not once per handler
    assert lines[0].startswith("[freetoken_graphfix pid=")
