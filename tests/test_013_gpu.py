"""FreeToken 0.1.3 on the GPU (marker ``gpu``): unprotected, its first launches block at a size
where 0.2.x blocks; with the shim (auto), none does, and the logits are those of FreeToken's own
gate mode. Needs 0.1.3 importable in a folder named by ``GRAPHFIX_FREETOKEN_013`` (pip install
--target; 0.1.3 asks for torch 2.11 and flashlib 0.3.0): without it the test fails, it never skips."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run():
    site = os.environ.get("GRAPHFIX_FREETOKEN_013")
    assert site and (Path(site) / "freetoken" / "version.py").is_file(), (
        "set GRAPHFIX_FREETOKEN_013 to a folder holding FreeToken 0.1.3 (pip install --target DIR freetoken==0.1.3)")
    env = {k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([site, str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-m", "tests.run_013_gpu"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    print("\n" + json.dumps(record, indent=1))
    assert record["freetoken"] == "0.1.3"
    return record


def test_unprotected_first_launches_block(run):
    assert run["None"]["fired"] == [True, True, False, False], run["None"]


@pytest.mark.parametrize("mode, action", [("auto", "deferred"), ("warm", "warm"), ("upload", "upload")])
def test_protected_never_block_and_match_gate_mode(run, mode, action):
    r = run[mode]
    assert r["actions"] == [action, action]
    assert r["fired"] == [False] * 4, r
    assert all(r["logits_equal_gate"]), r
