"""``bench --engine`` on CPU: the synthetic model against FreeToken 0.2.1's own loaders, the arms'
environments, and the verdicts drawn from engine results. The engine runs are in test_engine_gpu."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch

from freetoken_graphfix import config
from freetoken_graphfix.bench import engine, model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("engine-model")
    return str(folder), model.build_model_dir(str(folder), layers=8)


def test_model_dir_loads_through_freetokens_own_readers(model_dir):
    from freetoken.models.qwen4_exp.ple_disk import resolve_row_source
    from freetoken.models.weight import load_weight

    folder, built = model_dir
    want = {k: (tuple(v.shape), v.dtype) for k, v in built["model"].state_dict().items()}
    got = {k: (tuple(v.shape), v.dtype) for k, v in
           load_weight(folder, torch.device("cpu"), include_moe_experts=False, include_vision=False)}
    assert got == want  # FTW names, shapes and dtypes are exactly the model's state dict
    sc = built["config"]
    assert {g.name: g.layer_ids for g in sc.model_config.attention_groups}["full"] == (3, 7)
    assert (sc.attention_backend, sc.moe_strategy, sc.cuda_graph_bs) == ("qsa_sparse", "fused", [1, 2])
    src = resolve_row_source(folder)  # the disk PLE backend's view of the table
    assert (src.total_rows, src.scale) == (built["rows"] * len(built["shards"]), model.PLE_SCALE)


def test_model_dir_is_seeded(model_dir, tmp_path):
    folder, _ = model_dir
    model.build_model_dir(str(tmp_path), layers=8)
    for name in ("freetoken-00000.ftw", "ple-table-00000.safetensors"):
        with open(os.path.join(folder, name), "rb") as a, open(tmp_path / name, "rb") as b:
            assert a.read() == b.read(), name


def test_too_few_layers_is_refused(tmp_path):
    with pytest.raises(ValueError, match="layers=3: need at least 4"):
        model.build_model_dir(str(tmp_path), layers=3)


def test_only_shim_arms_get_the_variable(monkeypatch):
    monkeypatch.setenv(config.ENV_MODE, "auto")  # what import exported in the bench's own process
    assert config.ENV_MODE not in engine.arm_env("upstream")
    assert config.ENV_MODE not in engine.arm_env("pre-697")
    assert engine.arm_env("warm")[config.ENV_MODE] == "warm"


def test_child_never_imports_the_package():
    """The engine process must get the shim from the bootstrap alone, as a user's engine does: the
    child script imports nothing of freetoken_graphfix, anywhere in it."""
    import ast

    tree = ast.parse(engine.CHILD.read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [("." * node.level) + (node.module or "") for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)]
    assert imported and not [m for m in imported if m.startswith((".", "freetoken_graphfix"))]


def result(**over):
    """An engine child's result line, as _engine_child.py prints it."""
    r = {"freetoken": "0.2.1", "table": "DiskRowTable", "wait_sync": True, "fill_worker": False, "graph_bs": [1, 2],
         "captured_waits": 2, "steps": {"prefill": 2, "decode": 0, "graph": 90}, "fires": [],
         "first_launch_ms": {"2": 0.4, "1": 0.3}, "capture_ms": [900.0], "upload_ms": [1.0, 0.9],
         "step_gpu_ms": {"2": [3.3, 3.31, 3.29], "1": [3.0, 3.0]}, "replay_gpu_ms": {"2": [1.5, 1.5], "1": [1.2]},
         "token_hash": "aaaa", "shim": None}
    r.update(over)
    return r


def shim(mode, action):
    return {"installed": True, "mode": mode, "patched": True, "reason": "ok",
            "passes": [{"graphs": [{"action": action}, {"action": action}]}]}


def test_a_shim_arm_without_the_shim_is_a_problem():
    problems = engine.arm_problems("auto", result())
    assert problems and "did not reach the engine process" in problems[0] and ".pth" in problems[0]
    assert engine.arm_problems("auto", result(shim=shim("auto", "deferred"))) == []
    assert "expected action warm" in engine.arm_problems("warm", result(shim=shim("warm", "upload")))[0]
    assert "leaked" in engine.arm_problems("upstream", result(shim=shim("auto", "deferred")))[0]
    assert "not in CUDA wait-sync" in engine.arm_problems("upstream", result(wait_sync=False))[0]
    patched = engine.arm_problems("upstream", result(freetoken_patched=True))
    assert patched and "the installed FreeToken carries the patch series" in patched[0]


def test_patched_arms_run_the_patched_copy(monkeypatch):
    monkeypatch.setenv(config.ENV_MODE, "auto")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = engine.arm_env("patched", "/tmp/patched")
    assert config.ENV_MODE not in env and env["FREETOKEN_GRAPH_PROTECT"] == "first-launch"
    assert env["PYTHONPATH"] == os.pathsep.join(["/tmp/patched", "/elsewhere"])
    assert engine.arm_env("patched-none", "/p")["FREETOKEN_GRAPH_PROTECT"] == "none"
    with pytest.raises(ValueError, match="needs the patched FreeToken"):
        engine.arm_env("patched-upload")
    good = result(freetoken_patched=True, freetoken_graph_protect="first-launch", fill_worker=True)
    assert engine.arm_problems("patched", good) == []  # its worker runs first launches only
    assert "did not run the patched FreeToken in mode upload" in engine.arm_problems("patched-upload", good)[0]
    assert "did not run the patched FreeToken" in engine.arm_problems("patched", result())[0]


def record(**arms):
    runs = {arm: [dict(r, problems=engine.arm_problems(arm, r))] for arm, r in arms.items()}
    env = {"gpu": "GPU", "driver": "1", "torch": "2", "date": "today"}
    return {"layers": 320, "tokens": 32, "rounds": 1, "env": env, "runs": runs,
            "summary": engine.summarise(runs)}


def test_verdicts():
    clean = record(upstream=result(), **{"pre-697": result(fires=[{"step": 2}], token_hash="bbbb")},
                   auto=result(shim=shim("auto", "deferred")))
    assert engine.failures(clean) == []
    text = engine.render(clean)
    assert "pre-697 BLOCKED (watchdog fired)" in text and "safety: every protected arm" in text
    blocked = record(upstream=result(), auto=result(shim=shim("auto", "deferred"), fires=[{"step": 2}]))
    assert engine.failures(blocked) == ["auto: the watchdog released 1 blocked launch(es)"]
    drifted = record(upstream=result(), warm=result(shim=shim("warm", "warm"), token_hash="cccc"))
    assert engine.failures(drifted) == ["warm: tokens ['cccc'] differ from upstream's"]
    assert "FAILED" in engine.render(drifted)
    series = dict(freetoken_patched=True, fill_worker=True, upload_ms=[])
    patched = record(upstream=result(), **{
        "patched": result(freetoken_graph_protect="first-launch", **series),
        "patched-none": result(freetoken_graph_protect="none", fires=[{"step": 2}], token_hash="bbbb", **series)})
    assert engine.failures(patched) == []  # patched-none is a negative control: it may block
    assert "patched arms: patches/ applied, FREETOKEN_GRAPH_PROTECT=<mode>" in engine.render(patched)
    blocked = record(upstream=result(), patched=result(freetoken_graph_protect="first-launch", fires=[{"step": 2}],
                                                       **series))
    assert engine.failures(blocked) == ["patched: the watchdog released 1 blocked launch(es)"]


def test_gate_arm_runs_freetokens_launch_gating(monkeypatch):
    monkeypatch.setenv("FREETOKEN_PLE_SYNC", "gate")
    assert engine.arm_env("auto")["FREETOKEN_PLE_SYNC"] == "wait"  # a user's gate would hide the WAIT
    assert engine.arm_env("gate")["FREETOKEN_PLE_SYNC"] == "gate" and config.ENV_MODE not in engine.arm_env("gate")
    gate = result(wait_sync=False, captured_waits=0)
    assert engine.arm_problems("gate", gate) == []
    assert "did not decode on graphs without a WAIT" in engine.arm_problems("gate", result())[0]


def test_on_a_freetoken_that_uploads_nothing_upstream_is_a_control_and_gate_the_reference():
    """FreeToken 0.1.3 has no _upload_graph: its upstream may block, and tokens are gate's."""
    ft013 = dict(freetoken="0.1.3", freetoken_uploads=False, upload_ms=[])
    gate = result(wait_sync=False, captured_waits=0, **ft013)
    rec = record(upstream=result(fires=[{"step": 2}], token_hash="bbbb", **ft013), gate=gate,
                 auto=result(shim=shim("auto", "deferred"), **ft013))
    assert engine.failures(rec) == []
    assert not rec["summary"]["upstream"]["protected"] and rec["summary"]["auto"]["reference"] == "gate"
    assert "upstream BLOCKED (watchdog fired)" in engine.render(rec) and "gate's tokens" in engine.render(rec)
    assert rec["summary"]["auto"]["replay_gpu_vs_never_uploaded"] == 1.0  # against upstream, never uploaded
    drifted = record(upstream=result(**ft013), gate=gate, auto=result(shim=shim("auto", "deferred"),
                                                                      token_hash="cccc", **ft013))
    assert engine.failures(drifted) == ["auto: tokens ['cccc'] differ from gate's"]
    alone = record(upstream=result(**ft013), auto=result(shim=shim("auto", "deferred"), **ft013))
    assert "no gate arm to compare tokens with" in engine.failures(alone)[0] and "--arms gate" in engine.failures(
        alone)[0]


def test_gpu_time_is_compared_with_the_never_uploaded_arm():
    slow = copy.deepcopy(result(shim=shim("auto", "deferred")))
    slow["replay_gpu_ms"] = {"2": [1.65, 1.65], "1": [1.2]}  # bs 2 10% slower, bs 1 the same
    rec = record(upstream=result(), skip=result(shim=shim("skip", "exposed")), auto=slow)
    assert rec["summary"]["auto"]["replay_gpu_vs_never_uploaded"] == pytest.approx(1.05)
    assert rec["summary"]["auto"]["step_gpu_vs_never_uploaded"] == 1.0
    assert rec["summary"]["skip"]["replay_gpu_vs_never_uploaded"] == 1.0
    assert list(rec["summary"]["auto"]["step_gpu_ms"]) == ["2", "1"]  # largest bs first


def test_bad_engine_options_are_named(tmp_path):
    import argparse

    opts = argparse.Namespace(layers=[48, 2], logs=str(tmp_path))
    assert engine.main(opts) == 1
    assert list(tmp_path.iterdir()) == []  # refused before anything ran
    out = subprocess.run([sys.executable, "-m", "freetoken_graphfix", "bench", "--engine", "--rounds", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--rounds: '0': accepted values are whole numbers of 1 or more" in out.stderr


def test_engine_needs_a_gpu_here():
    out = subprocess.run([sys.executable, "-m", "freetoken_graphfix", "bench", "--engine"], capture_output=True,
                         text=True)
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert out.returncode == 1 and "no CUDA device" in out.stderr
