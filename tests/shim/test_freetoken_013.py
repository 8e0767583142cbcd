"""FreeToken 0.1.3: the same first-launch deadlock with no upload anywhere; the shim protects it.

Against the real 0.1.3 wheel from PyPI (its ``GraphRunner``, ``DiskRowTable`` over ``_ple_store`` and
``Engine.forward_batch``), in a child process that imports it first (``tests/run_freetoken_013.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OK = {"fired": False, "ok": True, "flag_after": 0}


@pytest.fixture(scope="module")
def run(freetoken_tree) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(freetoken_tree("0.1.3")), str(ROOT)])
    out = subprocess.run([sys.executable, "-m", "tests.children.run_freetoken_013"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert record["freetoken"] == "0.1.3" and not record["has_upload_graph"]
    return record


def last_pass(mode: dict) -> list[tuple[str, str]]:
    return [(name, action) for name, action, _ in mode["passes"][-1]]


def test_unprotected_first_launches_block(run):
    """The negative control: 0.1.3 as shipped, every graph's first launch blocks behind its WAIT."""
    steps = run["None"]["steps"]
    assert [s["fired"] for s in steps] == [True, False, True, True, False]  # bs 2, 2, 1, 3 -> 4, 1
    assert not steps[0]["ok"]  # the watchdog's release let the graph read stale rows


@pytest.mark.parametrize("mode", ["auto", "deferred"])
def test_deferred_first_launches_never_block(run, mode):
    r = run[mode]
    assert all(not g["uploaded"] and g["launches"] == 0 for g in r["at_capture"])  # no upload, nothing at capture
    assert [{k: s[k] for k in OK} for s in r["steps"]] == [OK] * 5
    first = [(name, launch.split(",")[0]) for name, _, launch in r["passes"][0 if mode == "auto" else -1]]
    assert first == [("bs=4", "fill on helper thread"), ("bs=2", "fill on helper thread"),
                     ("bs=1", "fill on helper thread")]
    assert r["left_on_freetoken"] == []  # every marked graph launched: nothing of the shim is left


def test_one_info_line_per_capture_pass(run):
    log = run["deferred"]["log"]
    assert log[0] == "INFO patched (mode deferred): freetoken 0.1.3 has no capture-time upload at all"
    assert [line for line in log if line.startswith(("WARNING", "ERROR"))] == []
    assert log[1].startswith("INFO capture pass ") and log[1].endswith(": 3 graphs: 3 deferred (PLE wait-sync)")


def test_rebuilds_are_protected_again(run):
    r = run["auto"]
    assert r["rebuild_pass"] == ["deferred"] * 3 and r["rebuild"] == [OK, OK]


def test_faults_leave_no_flag_at_one(run):
    r = run["auto"]
    assert r["fill_raises"] == {"raised": "OSError('disk read failed')", "flag_after": 0}
    assert r["after_fill_raised"] == OK
    assert r["launch_raises"] == {"raised": "RuntimeError('fake cudaGraphLaunch failure')", "flag_after": 0}
    assert r["launch_retry"] == OK  # the retry was still protected
    assert r["raises_before_launch"]["flag_after"] == 0 and r["retry_after_raise_before_launch"] == OK
    assert dict(r["last_pass"])["bs=2"].startswith("fill on helper thread")


def test_upload_means_the_upload_0_1_3_lacks(run):
    r = run["upload"]
    assert last_pass(r) == [("bs=4", "upload"), ("bs=2", "upload"), ("bs=1", "upload")]
    assert all(g["uploaded"] for g in r["at_capture"]) and [s["fired"] for s in r["steps"]] == [False] * 5


def test_warm_replays_each_graph_after_the_pass(run):
    r = run["warm"]
    assert last_pass(r) == [("bs=4", "warm"), ("bs=2", "warm"), ("bs=1", "warm")]
    assert [g["launches"] for g in r["at_capture"]] == [1, 1, 1] and not any(g["uploaded"] for g in r["at_capture"])
    assert [{k: s[k] for k in OK} for s in r["steps"]] == [OK] * 5


def test_warm_replays_leave_the_offload_cache_reset(run):
    """0.1.3 resets the MoE offload cache after each capture and at the loop's end; the warm replays run
    after the loop, so the shim resets it once more after them: serving starts from a clean cache."""
    warm, deferred = run["warm"]["cache_resets"], run["deferred"]["cache_resets"]
    assert warm[-1] == 3 and len(warm) == len(deferred) + 1  # the last reset after the three replays
    assert all(n == 0 for n in deferred)  # nothing launched at capture: no extra reset needed


def test_skip_warns_and_blocks(run):
    r = run["skip"]
    assert [s["fired"] for s in r["steps"]][0] is True
    assert sum("its first launch can deadlock" in line for line in r["log"]) == 3
