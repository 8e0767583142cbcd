"""``run --``: arguments, exit codes and the mode passed through; commands found as this environment's; warnings
for an interpreter that does not load the shim; signals forwarded to the command."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from tests.helpers.processes import CHILD, alive, child_env, run_cli, supervised


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

