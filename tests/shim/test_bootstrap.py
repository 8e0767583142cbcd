"""The env-gated .pth reaches spawned and subprocess children; ``run --`` passes everything through.

These start real child interpreters of the test venv, so they need the package installed there
(``pip install .[test]``): a missing .pth fails them, it does not skip them.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

from freetoken_graphfix import bootstrap
from tests.children import spawn_target
from tests.helpers.processes import CHILD, child_env, run_cli


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
    pth = (Path(__file__).resolve().parents[2] / "freetoken_graphfix" / "_bootstrap.pth").read_text()
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

