"""The GPU acceptance script's own checks, on CPU: each reads what its step printed and fails the step
for the reason a user would care about. The steps themselves need a GPU (``scripts/gpu_acceptance.py``)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_acceptance", ROOT / "scripts" / "gpu_acceptance.py")
acceptance = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = acceptance  # its dataclasses look their module up there
spec.loader.exec_module(acceptance)

DOCTOR = """\
        protected launch: auto (deferred): first launch 12.4 ms, not blocked, on a 10,000-kernel graph
     unprotected control: skip: BLOCKED until the watchdog (4 s) on a 10,000-kernel graph
"""


def test_doctor_passes_only_with_the_protected_launch_free_and_the_control_blocked():
    assert acceptance.doctor_lines(DOCTOR).startswith("protected: auto (deferred): first launch 12.4 ms, not blocked")
    for broken in (DOCTOR.replace("not blocked", "BLOCKED until the watchdog"), DOCTOR.replace("BLOCKED", "ok"),
                   "         short check: skipped: no CUDA device\n"):
        with pytest.raises(acceptance.StepFailed):
            acceptance.doctor_lines(broken)


def status_line(actions: list[str], tokens: list[list[int]]) -> str:
    graphs = [{"action": a} for a in actions]
    return json.dumps({"tokens": tokens, "status": {"reason": "r", "passes": [{"graphs": graphs}]}})


def test_the_run_script_passes_only_with_every_graph_deferred_and_tokens():
    assert acceptance.every_graph_deferred("log line\n" + status_line(["deferred"] * 2, [[1], [2, 3]])) == \
        "2 graphs deferred, 3 tokens generated"
    for actions, tokens in ((["deferred", "no-op"], [[1]]), ([], [[1]]), (["deferred"], [[1], []])):
        with pytest.raises(acceptance.StepFailed):
            acceptance.every_graph_deferred(status_line(actions, tokens))


def test_a_report_must_print_the_runs_own_figures():
    run = "model: x\nstep +0.10% +- 0.20%\nengine logs: /tmp/y\n"
    assert acceptance.same_report(run, "model: x\nstep +0.10% +- 0.20%\n") == "2 lines, the same as the run's"
    for other in ("model: x\nstep +0.11% +- 0.20%\n", ""):
        with pytest.raises(acceptance.StepFailed):
            acceptance.same_report(run, other)


def test_the_hook_adds_one_line_after_the_servers_own_options_or_refuses():
    source = 'import os\nproc = Popen(\n    [\n        "--num-pages", str(BOOT_PAGES),\n    ],\n)\n'
    hooked = acceptance.with_hook(source)
    assert hooked.splitlines()[4] == "        " + acceptance.HOOK_LINE.strip()
    assert "FREETOKEN_REBUILD_SERVER_ARGS" in acceptance.HOOK_LINE and acceptance.HOOK_LINE.count("\n") == 1
    assert len(hooked.splitlines()) == len(source.splitlines()) + 1
    with pytest.raises(acceptance.StepFailed):
        acceptance.with_hook(source.replace("BOOT_PAGES", "PAGES"))


def test_the_package_must_come_from_the_site_not_the_checkout():
    here = {"package": str(ROOT / "freetoken_graphfix" / "__init__.py"), "pth": "x.pth", "version": "0",
            "freetoken": "0"}
    with pytest.raises(acceptance.StepFailed, match="from the checkout"):
        acceptance.installed_here(here)
    with pytest.raises(acceptance.StepFailed, match=".pth"):
        acceptance.installed_here({**here, "package": "/site-packages/freetoken_graphfix/__init__.py", "pth": ""})


def test_a_step_that_outruns_the_budget_fails_and_the_rest_say_so(tmp_path):
    run = acceptance.Run(tmp_path, tmp_path, deadline=0.0)
    run.step("late", lambda: "never")
    assert run.results[0].passed is False and run.results[0].detail == "not run: the budget was spent"
    assert acceptance.table(run.results).endswith("0 passed, 1 failed")


def test_pytest_counts_reads_the_closing_line():
    assert acceptance.pytest_counts("....\n31 passed, 12 skipped in 5.1s\n") == "31 passed, 12 skipped"
    proc = subprocess.CompletedProcess([], 1, "", "boom\n")
    with pytest.raises(acceptance.StepFailed, match="exited 1: boom"):
        acceptance.ran(proc, "x")


@pytest.mark.parametrize("part", ["user", "series", "all"])
def test_a_split_run_takes_its_own_half_of_the_steps(tmp_path, part, capsys):
    args = ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--freetoken-wheel", "w.whl",
            "--freetoken-tests", "t", "--rebuild-test", "g.py", "--budget", "0", "--part", part]
    assert acceptance.main(args) == 1  # nothing ran: the budget was spent
    steps = [r["step"] for r in json.loads((tmp_path / "out" / "acceptance.json").read_text())["results"]]
    user = steps[0] == "installed" and "bench launch" in steps
    series = steps[-1] == "rebuild gate, llama, dummy weights" and any("qwen4_exp tests" in s for s in steps)
    assert (user, series) == {"user": (True, False), "series": (False, True), "all": (True, True)}[part]
