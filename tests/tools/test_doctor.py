"""``doctor`` as a user runs it, without the GPU check: every line true of this environment, a bad or off value
quoted as given, help whatever the variable holds."""

from __future__ import annotations

import os
import sys

import pytest

from freetoken_graphfix import bootstrap
from tests.helpers.processes import child_env, run_cli


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

