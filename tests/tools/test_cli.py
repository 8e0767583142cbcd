"""The command line as a user meets it: its name as invoked, --version, plain-text help that lists
accepted values, a command's own usage on its own errors, doctor's report when FreeToken cannot be
imported or the variable is absurd."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest

from tests.helpers.processes import child_env, run_cli


def test_version():
    out = run_cli("--version")
    from freetoken_graphfix import __version__

    assert out.returncode == 0 and out.stdout == f"freetoken-graphfix {__version__}\n"


def test_the_program_is_named_as_invoked():
    script = os.path.join(sysconfig.get_paths()["scripts"], "freetoken-graphfix")
    assert os.path.exists(script), "the console script is installed with the package"
    as_script = subprocess.run([script, "--help"], env=child_env(None), capture_output=True, text=True, timeout=60)
    assert as_script.returncode == 0 and as_script.stdout.startswith("usage: freetoken-graphfix [-h]")
    assert run_cli("--help").stdout.startswith("usage: python -m freetoken_graphfix [-h]")
    bench = subprocess.run([script, "bench", "--help"], env=child_env(None), capture_output=True, text=True,
                           timeout=60)
    assert bench.stdout.startswith("usage: freetoken-graphfix bench <benchmark> [options]")
    engine = subprocess.run([script, "bench", "engine", "--help"], env=child_env(None), capture_output=True, text=True,
                            timeout=60)
    assert engine.stdout.startswith("usage: freetoken-graphfix bench engine [options]")


def test_a_bench_error_is_one_line_not_every_option():
    out = run_cli("bench", "engine", "--context", "0")
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "freetoken-graphfix: error: bench engine: argument --context: '0': accepted values are whole "
        "numbers of 1 or more"]


@pytest.mark.parametrize("args, own", [
    (["run", "--bogus", "x"], "run"), (["patch", "bogus", "--site"], "patch"), (["doctor", "--bogus"], "doctor"),
])
def test_a_commands_error_is_one_line_naming_the_command(args, own):
    out = run_cli(*args)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"freetoken-graphfix: error: {own}: ")


@pytest.mark.parametrize("args, values", [
    ([], ["doctor", "run", "patch", "bench"]),
    (["run"], ["auto, upload, skip, warm, deferred, off, 0, false", "-- COMMAND"]),
    (["patch"], ["check", "apply", "revert", "--repo", "--site"]),
    (["doctor"], ["--no-bench"]),
    (["bench"], ["rig", "deadlock", "engine", "serve", "startup", "report", "nsys", "write-model"]),
    (["bench", "engine"], ["upstream, no-upload, gate, auto, upload, warm, deferred, skip, patched"]),
    (["bench", "write-model"], ["qwen4_exp, llama, qwen3,"]),
])
def test_every_help_is_plain_text_with_its_values(args, values):
    out = run_cli(*args, "--help")
    assert out.returncode == 0 and out.stderr == ""
    assert "``" not in out.stdout and ":func:" not in out.stdout  # no reST markup
    text = " ".join(out.stdout.split())
    for value in values:
        assert value in text, value


@pytest.mark.parametrize("blocked", ["torch", "freetoken"])
def test_doctor_says_when_freetoken_cannot_be_imported(blocked):
    """FreeToken without torch, or no FreeToken at all: one line saying so, and a problem (exit 1),
    not a report that waits for a FreeToken that will never come."""
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            "from freetoken_graphfix.tools.cli import main\n"
            "sys.exit(main(['doctor', '--no-bench']))\n")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(None), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = dict(line.strip().split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert lines["freetoken"].startswith("PROBLEM: cannot be imported: ")
    assert lines["freetoken"].endswith("fix: pip install freetoken==0.2.1" if blocked == "freetoken" else
                                       "fix: see the error: FreeToken itself fails to import")
    assert "--site" not in out.stdout  # the series line speaks to doctor's reader, not to patch's options
    assert "Traceback" not in out.stdout + out.stderr


def test_doctor_cuts_an_absurd_value():
    value = "x" * 5000
    out = run_cli("doctor", "--no-bench", env=child_env(value))
    assert out.returncode == 1
    assert out.stdout.count("x" * 100) == 0 and "(5000 characters)" in out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) < 400


def test_mode_before_run_is_pointed_at_run(capsys):
    from freetoken_graphfix.tools import cli

    for argv in (["--mode", "auto", "run", "--", "true"], ["--mode=auto", "run", "--", "true"]):
        code = cli.main(argv)
        assert code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            "error: --mode is run's option: put it after run (run --mode MODE -- COMMAND)")


def test_the_patch_script_calls_itself_by_its_name_and_counts_in_english(tmp_path):
    from pathlib import Path

    from freetoken_graphfix.tools import series

    script = Path(__file__).resolve().parents[2] / "scripts" / "freetoken-patch"
    out = subprocess.run([sys.executable, str(script), "bogus"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.splitlines()[-1].startswith(
        "freetoken-graphfix: error: patch: argument ACTION")
    assert series._count([Path("a")]) == "1 patch" and series._count([Path("a"), Path("b")]) == "2 patches"


def test_doctor_says_a_bad_mode_once_and_where_each_part_is(tmp_path):
    env = child_env("bogus")
    out = run_cli("doctor", "--no-bench", env=env)
    assert out.returncode == 1
    assert out.stdout.count("is not a valid mode; accepted values") == 1, out.stdout
    assert out.stdout.count("FT_GRAPH_UPLOAD is not a valid mode (above)") == 2
    lines = dict(ln.strip().split(": ", 1) for ln in out.stdout.splitlines() if ": " in ln)
    import freetoken

    import freetoken_graphfix

    assert lines["freetoken-graphfix"].endswith(f" at {os.path.dirname(os.path.abspath(freetoken_graphfix.__file__))}")
    assert lines["freetoken"].startswith(f"0.2.1 at {os.path.dirname(freetoken.__file__)} (not inspected")
