"""FreeToken 0.1.3 on the GPU (marker ``gpu``): unprotected, its first launches block at a size
where 0.2.x blocks; with the shim (auto), none does, and the output is that of FreeToken's own
gate mode. Twice: 0.1.3's real GraphRunner and DiskRowTable on the rig (logits), and 0.1.3's real
offline engine through ``bench engine`` (tokens). Needs 0.1.3 importable in a folder named by
``GRAPHFIX_FREETOKEN_013`` (pip install --target; 0.1.3 asks for torch 2.11, flashlib 0.3.0 and
transformers < 5.17): without it the tests fail, they never skip. The engine arms need this package
installed (its ``.pth`` brings the shim into each engine process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import gpu_checks
from tests.helpers.bench_run import bench_record
from tests.helpers.gpu_records import keep, keep_steps

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]  # a module fixture runs whole engines
ROOT = Path(__file__).resolve().parents[2]


def env_013() -> dict[str, str]:
    site = os.environ.get("GRAPHFIX_FREETOKEN_013")
    assert site and (Path(site) / "freetoken" / "version.py").is_file(), (
        "set GRAPHFIX_FREETOKEN_013 to a folder holding FreeToken 0.1.3 (pip install --target DIR freetoken==0.1.3)")
    env = {k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([site, str(ROOT), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def rig():
    out = subprocess.run([sys.executable, "-m", "tests.children.run_freetoken_013_gpu"], cwd=ROOT, env=env_013(),
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    print("\n" + json.dumps(record, indent=1))
    return keep_steps("013-rig", record)


@pytest.mark.parametrize("check", gpu_checks.for_record("013-rig"))
def test_rig(rig, check):
    check(rig)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """``bench engine`` on 0.1.3 at 320 layers (where 0.2.x's never-uploaded graphs block): upstream
    (0.1.3 uploads nothing), gate (FreeToken's escape hatch, the token reference) and auto."""
    record, code = bench_record(["engine", "--layers", "320", "--decode-steps", "32", "--context", "256",
                                 "--rounds", "1", "--trace-steps", "0", "--replays", "20", "--hang-timeout", "150",
                                 "--arms", "upstream", "gate", "auto"], tmp_path_factory.mktemp("engine-013"),
                                env=env_013())
    assert code == 0
    return keep("013-engine", record)


@pytest.mark.parametrize("check", gpu_checks.for_record("013-engine"))
def test_engine(engine, check):
    check(engine)
