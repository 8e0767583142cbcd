"""doctor's GPU branch on CPU: CUDA reported available, each probe's process faked where the short
check starts it. Its lines and exit code are what a GPU user sees first; every other doctor test
passes --no-bench, so without this one a broken import there showed only on a GPU."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest
import torch

from freetoken_graphfix.tools import child, cli
from freetoken_graphfix_bench import cli as bench_cli
from freetoken_graphfix_bench.records import Probe

HEALTHY = {"auto": Probe("auto", 10000, 1, first_launch_ms=12.4, action="deferred", hook_ms=0.04),
           "skip": Probe("skip", 10000, 1, first_launch_ms=4008.0, blocked=True, action="skipped", hook_ms=0.01),
           "upload": Probe("upload", 10000, 1, first_launch_ms=0.3, action="uploaded", hook_ms=9.3)}


@pytest.fixture
def gpu_doctor(monkeypatch, clean_shim, capsys):
    """doctor with CUDA available, each probe answered by ``rows[mode]`` as the ``_probe`` process prints it."""
    started: list[list[str]] = []

    def run(rows: dict[str, Probe]) -> tuple[int, dict[str, str]]:
        def probe_process(cmd, **kwargs):
            started.append(cmd)
            opts, _ = bench_cli.checked(bench_cli.parser(), cmd[4:])  # the probe's own options, as it parses them
            row = rows[opts.mode]
            if row.error:
                kwargs["stderr"].write(f"Traceback...\nRuntimeError: {row.error}\n")
                kwargs["stderr"].flush()
                return subprocess.CompletedProcess(cmd, 1, "", None)
            return subprocess.CompletedProcess(cmd, 0, child.RESULT_TAG + json.dumps(dataclasses.asdict(row)) + "\n",
                                               None)

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(child.subprocess, "run", probe_process)
        code = cli.main(["doctor"])
        out = capsys.readouterr().out
        return code, dict(line.strip().split(": ", 1) for line in out.splitlines() if ": " in line)

    run.started = started
    return run


def test_a_healthy_gpu_exits_0_with_the_short_check_printed(gpu_doctor):
    code, lines = gpu_doctor(HEALTHY)
    assert code == 0
    assert lines["protected launch"] == ("auto (deferred): first launch 12.4 ms, not blocked, on a 10,000-kernel graph "
                                         "behind a PLE wait-sync WAIT")
    assert lines["unprotected control"] == ("skip: BLOCKED until the watchdog (4 s) on a 10,000-kernel graph behind a "
                                            "PLE wait-sync WAIT: this GPU deadlocks without protection")
    assert lines["capture cost"] == "auto 0.04 ms a graph, upload 9.30 ms a graph (FreeToken's own)"
    assert lines["replay verdict"].startswith("freetoken-graphfix bench rig")
    assert sorted(c[c.index("--mode") + 1] for c in gpu_doctor.started) == ["auto", "skip", "upload"]
    assert all(c[1:4] == ["-m", "freetoken_graphfix", "bench"] and c[4] == "_probe" for c in gpu_doctor.started)


def test_a_blocked_protected_launch_is_a_problem(gpu_doctor):
    code, lines = gpu_doctor({**HEALTHY, "auto": dataclasses.replace(HEALTHY["skip"], mode="auto", action="deferred")})
    assert code == 1
    assert lines["protected launch"].endswith("; the protection failed here: please report it")


def test_a_probe_that_fails_is_a_problem_with_its_last_line(gpu_doctor):
    code, lines = gpu_doctor({**HEALTHY, "auto": Probe("auto", 10000, 1, error="CUDA error: out of memory")})
    assert code == 1
    assert lines["protected launch"] == "ERROR: exited 1: RuntimeError: CUDA error: out of memory (see auto.log)"
    assert "capture cost" not in lines


def test_an_unprotected_launch_that_does_not_block_is_no_problem(gpu_doctor):
    code, lines = gpu_doctor({**HEALTHY, "skip": dataclasses.replace(HEALTHY["auto"], mode="skip", action="skipped")})
    assert code == 0
    assert lines["unprotected control"].endswith(": no block at this size (larger graphs can)")
