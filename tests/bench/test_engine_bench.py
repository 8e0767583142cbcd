"""``bench engine`` on CPU: the synthetic model against FreeToken 0.2.1's own loaders, the arms'
environments, and the verdicts and report drawn from engine results. The engine runs are in
test_engine_gpu."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from freetoken_graphfix import config
from freetoken_graphfix_bench import arms, model, stats
from freetoken_graphfix_bench import options as bench_options
from freetoken_graphfix_bench.engine import process_checks
from freetoken_graphfix_bench.engine import run as engine_run
from tests.helpers.engine_records import judged, process, result, shim


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
    from freetoken.engine.graph import _determine_cuda_graph_bs

    assert (sc.attention_backend, sc.moe_strategy, sc.ple_backend) == ("qsa_sparse", "fused", "disk")
    assert _determine_cuda_graph_bs(sc.cuda_graph_bs, sc.cuda_graph_max_bs, 1 << 40) == [1, 2]  # as the engine will
    src = resolve_row_source(folder)  # the disk PLE backend's view of the table
    assert (src.total_rows, src.scale) == (built["rows"] * len(built["shards"]), model.PLE_SCALE)


def test_nvfp4_model_dir_loads_through_freetokens_own_readers(tmp_path):
    """The reporter's layout: FreeToken 0.2.1 reads the dense part by its HF names as the model's state
    dict, and every routed expert through qwen4_exp's own ``nvfp4_expert_spec`` (ModelOpt)."""
    from freetoken.layers.quantization import QuantKind, get_quant_config, set_quant_config
    from freetoken.layers.quantization.configs.base import QuantConfig
    from freetoken.models.weight import load_weight
    from freetoken.moe.expert_pieces import iter_expert_pieces
    from freetoken.utils import cached_load_hf_config

    built = model.build_model_dir(str(tmp_path), layers=8, experts="nvfp4")
    mc = built["config"].model_config
    assert mc.expert_quant == "nvfp4"
    assert not (tmp_path / "freetoken-00000.ftw").exists()
    before = get_quant_config()
    set_quant_config(QuantConfig.from_hf(cached_load_hf_config(str(tmp_path))))  # as the engine does at start
    try:
        got = {k: (tuple(v.shape), v.dtype) for k, v in
               load_weight(str(tmp_path), torch.device("cpu"), include_moe_experts=False, include_vision=False)}
        pieces = list(iter_expert_pieces(str(tmp_path), mc, QuantKind.NVFP4))
    finally:
        set_quant_config(before)
    assert got == {k: (tuple(v.shape), v.dtype) for k, v in built["model"].state_dict().items()}
    assert sorted((layer, e0) for layer, e0, _, _ in pieces) == [(la, e) for la in range(8) for e in range(8)]
    h, i = mc.hidden_size, mc.moe_intermediate_size
    roles = {k: (tuple(v.shape), v.dtype) for k, v in pieces[0][3].items()}
    assert roles == {"gate": ((1, i, h // 2), torch.uint8), "up": ((1, i, h // 2), torch.uint8),
                     "down": ((1, h, i // 2), torch.uint8),
                     "gate_scale": ((1, i, h // 16), torch.float8_e4m3fn),
                     "up_scale": ((1, i, h // 16), torch.float8_e4m3fn),
                     "down_scale": ((1, h, i // 16), torch.float8_e4m3fn),
                     "gate_global": ((1, 1), torch.float32), "up_global": ((1, 1), torch.float32),
                     "down_global": ((1, 1), torch.float32)}


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
    assert config.ENV_MODE not in arms.arm_env("upstream")
    assert config.ENV_MODE not in arms.arm_env("no-upload")
    assert arms.arm_env("warm")[config.ENV_MODE] == "warm"


def test_child_never_imports_the_package():
    """The engine process must get the shim from the bootstrap alone, as a user's engine does: no file
    of the child imports anything of freetoken_graphfix, anywhere in it; its own modules come from its
    directory by their top-level names."""
    import ast

    files = sorted(engine_run.CHILD_DIR.glob("*.py"))
    siblings = {f.stem for f in files}
    assert engine_run.CHILD in files and {"child_copies", "child_loop", "child_seams"} <= siblings
    for path in files:
        tree = ast.parse(path.read_text())
        imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        imported += [("." * node.level) + (node.module or "") for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom)]
        assert imported and not [m for m in imported if m.startswith((".", "freetoken_graphfix"))], path.name
    assert "child_copies" in ast.dump(ast.parse(engine_run.CHILD.read_text()))  # the walk sees the siblings


def problems(arm: str, wait_case: bool = True, **over) -> list[str]:
    return process_checks.problems(arm, process(**over), wait_case)


def test_a_shim_arm_without_the_shim_is_a_problem():
    found = problems("auto")
    assert found and "did not reach the engine process" in found[0] and ".pth" in found[0]
    assert problems("auto", shim=shim("auto", "deferred")) == []
    assert "expected action warm" in problems("warm", shim=shim("warm", "upload"))[0]
    assert "leaked" in problems("upstream", shim=shim("auto", "deferred"))[0]
    assert "not in CUDA wait-sync" in problems("upstream", wait_sync=False)[0]
    assert "not in CUDA wait-sync" in problems("upstream", hip=True, fill_worker=True)[0]
    # the series' table has its fill worker on CUDA too (for first launches): still the WAIT case
    assert problems("patched", hip=False, fill_worker=True, freetoken_patched=True) == []
    assert "not in CUDA wait-sync" in problems("upstream", fill_worker=True)[0]  # an old record: no hip recorded
    patched = problems("upstream", freetoken_patched=True)
    assert patched and "the installed FreeToken carries the patch series" in patched[0]


def test_the_patched_arm_runs_the_patched_copy(monkeypatch):
    monkeypatch.setenv(config.ENV_MODE, "auto")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = arms.arm_env("patched", "/tmp/patched")
    assert config.ENV_MODE not in env and env["PYTHONPATH"] == os.pathsep.join(["/tmp/patched", "/elsewhere"])
    with pytest.raises(ValueError, match="needs the patched FreeToken"):
        arms.arm_env("patched")
    assert problems("patched", freetoken_patched=True) == []
    assert "did not run the patched FreeToken" in problems("patched")[0]


def record(expects_wait=True, traced=None, **arms):
    """A case of the 320-layer model, judged; each arm one result, or a list (its rounds)."""
    return judged(expects_wait, traced, "320 layers", **arms)


def test_verdicts():
    clean = record(upstream=result(), **{"no-upload": result(fires=[{"step": 2}], token_hash="bbbb")},
                   auto=result(shim=shim("auto", "deferred")))
    assert clean.failures() == []
    text = clean.text()
    assert "no-upload BLOCKED (watchdog fired)" in text and "safety: every protected arm" in text
    blocked = record(upstream=result(), auto=result(shim=shim("auto", "deferred"), fires=[{"step": 2}]))
    assert blocked.failures() == ["auto: the watchdog released 1 blocked launch(es)"]
    drifted = record(upstream=result(), warm=result(shim=shim("warm", "warm"), token_hash="cccc"))
    assert drifted.failures() == ["warm: tokens ['cccc'] differ from upstream's"]
    assert "FAILED" in drifted.text()
    series = dict(freetoken_patched=True, upload_ms=[])
    patched = record(upstream=result(), patched=result(**series),
                     **{"no-upload": result(fires=[{"step": 2}], token_hash="bbbb")})
    assert patched.failures() == []  # no-upload is the negative control: it may block
    assert "patched arm: patches/ applied" in patched.text()
    blocked = record(upstream=result(), patched=result(fires=[{"step": 2}], **series))
    assert blocked.failures() == ["patched: the watchdog released 1 blocked launch(es)"]


def test_the_report_says_which_self_released_waits_the_graphs_held():
    """MoE offload's CPU-MoE and locked-fetch WAITs, counted by the engine processes, are reported per
    kind beside the PLE table's; a record without them (no offload, or from before they were counted)
    says nothing of them."""
    held = dict(captured_waits=2, self_released_waits={"cpu_moe": 640, "locked_fetch": 0})
    rec = record(upstream=result(**held), auto=result(shim=shim("auto", "deferred"), **held))
    line = "every arm: PLE table 2, CPU-MoE executor 640, locked fetch 0"
    assert line in rec.text() and line in rec.markdown()
    apart = record(upstream=result(**held), auto=result(shim=shim("auto", "deferred"), captured_waits=2,
                                                        self_released_waits={"cpu_moe": 320, "locked_fetch": None}))
    assert "upstream: PLE table 2, CPU-MoE executor 640, locked fetch 0; auto: PLE table 2, CPU-MoE executor 320" \
        in apart.text()
    for plain in (record(upstream=result(), auto=result(shim=shim("auto", "deferred"))),
                  record(upstream=result(self_released_waits={"cpu_moe": 0, "locked_fetch": None}))):
        assert "WAITs captured" not in plain.text()


def test_gate_arm_runs_freetokens_launch_gating(monkeypatch):
    monkeypatch.setenv("FREETOKEN_PLE_SYNC", "gate")
    assert arms.arm_env("auto")["FREETOKEN_PLE_SYNC"] == "wait"  # a user's gate would hide the WAIT
    assert arms.arm_env("gate")["FREETOKEN_PLE_SYNC"] == "gate" and config.ENV_MODE not in arms.arm_env("gate")
    assert problems("gate", wait_sync=False, captured_waits=0) == []
    assert "did not decode on graphs without a WAIT" in problems("gate")[0]


def test_on_a_freetoken_that_uploads_nothing_upstream_is_a_control_and_gate_the_reference():
    """FreeToken 0.1.3 has no _upload_graph: its upstream may block, and tokens are gate's."""
    ft013 = dict(freetoken="0.1.3", freetoken_uploads=False, upload_ms=[])
    gate = result(wait_sync=False, captured_waits=0, **ft013)
    rec = record(upstream=result(fires=[{"step": 2}], token_hash="bbbb", **ft013), gate=gate,
                 auto=result(shim=shim("auto", "deferred"), **ft013))
    assert rec.failures() == []
    assert not rec.figures.arms["upstream"].protected and rec.figures.arms["auto"].reference == "gate"
    text = rec.text()
    assert "upstream BLOCKED (watchdog fired)" in text and "gate's tokens" in text
    two = record(upstream=[result(**ft013)] * 2, gate=[gate] * 2, auto=[result(shim=shim("auto", "deferred"),
                                                                                **ft013)] * 2)
    assert two.figures.base == "upstream"  # never uploaded here: the base of every ratio
    r = two.figures.arms["auto"].cross["replay"]["2"]
    assert (r.ratio, r.se) == pytest.approx((1.0, 0.0), abs=1e-9)
    drifted = record(upstream=result(**ft013), gate=gate, auto=result(shim=shim("auto", "deferred"),
                                                                      token_hash="cccc", **ft013))
    assert drifted.failures() == ["auto: tokens ['cccc'] differ from gate's"]
    alone = record(upstream=result(**ft013), auto=result(shim=shim("auto", "deferred"), **ft013))
    assert alone.failures() == []  # no reference ran: tokens not compared, which is no failure
    assert ("safety: every protected arm never blocked; tokens not compared: no gate arm (this FreeToken uploads no "
            "graph, so upstream is unprotected and gate's tokens are the reference: add --arms gate)") in alone.text()


def test_a_one_arm_run_compares_no_tokens_and_fails_nothing():
    """The nsys loop in docs/measuring.md runs one arm a process: on a FreeToken that uploads, a lone auto run never
    blocked, and says its tokens were not compared (there was no upstream to compare them with)."""
    alone = record(auto=result(shim=shim("auto", "deferred")))
    assert alone.failures() == []
    head = alone.text().splitlines()[0]
    assert head == "safety: every protected arm never blocked; tokens not compared: no upstream arm in this run (add " \
                   "--arms upstream)", head
    blocked = record(auto=result(shim=shim("auto", "deferred"), fires=[{"step": 2}]))
    assert blocked.failures() == ["auto: the watchdog released 1 blocked launch(es)"]  # blocking still fails


def test_a_case_with_no_process_is_no_pass():
    assert judged().failures() == ["no arm ran: nothing was measured"]
    assert judged(upstream=[]).failures() == ["upstream: no process ran: nothing was measured"]


def test_the_95_percent_multiplier_follows_the_rounds():
    assert math.isnan(stats.t975(1)) and stats.t975(2) == 12.706 and stats.t975(3) == 4.303
    assert stats.t975(11) == 2.228 and abs(stats.t975(21) - 2.086) < 0.01 and abs(stats.t975(61) - 2.000) < 0.01


def test_bad_engine_options_are_named(tmp_path, capsys):
    from freetoken_graphfix_bench import cli

    assert cli.main(["engine", "--layers", "48", "2", "--logs", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip().endswith("--layers: layers=2: need at least 4 (a QSA layer is every 4th, "
                                                    "the PLE layer is 1)")
    assert list(tmp_path.iterdir()) == []  # refused before anything ran
    out = subprocess.run([sys.executable, "-m", "freetoken_graphfix", "bench", "engine", "--rounds", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--rounds: '0': accepted values are whole numbers of 1 or more" in out.stderr


def test_engine_needs_a_gpu_here():
    out = subprocess.run([sys.executable, "-m", "freetoken_graphfix", "bench", "engine"], capture_output=True,
                         text=True)
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert out.returncode == 1 and "no CUDA device" in out.stderr


def test_an_engine_that_failed_shows_its_exception_not_freetokens_log(tmp_path, monkeypatch):
    """FreeToken logs to stdout, which goes into the arm's log after stderr: the error line must come
    from stderr's end (the traceback), not from FreeToken's last INFO lines."""
    child = tmp_path / "child.py"
    child.write_text("import sys\nprint('INFO Start capturing CUDA graphs')\n"
                     "raise RuntimeError('instantiate() needs keep_graph')\n")
    monkeypatch.setattr(engine_run, "CHILD", child)
    res = engine_run.run_arm("upstream", {}, 30.0, str(tmp_path), "x")
    assert res.error.startswith("engine process exited 1: ") and res.error.endswith(
        "RuntimeError: instantiate() needs keep_graph"), res.error
    assert "INFO Start capturing" in (tmp_path / "x.log").read_text()  # FreeToken's log is kept, after it
    failed = record(upstream={"error": res.error}, **{"no-upload": {"error": res.error}})
    assert not [f for f in failed.failures() if "gate" in f]  # no run, so nothing says 0.1.3


def test_the_gpu_tests_put_benchs_options_before_freetokens(tmp_path):
    from freetoken_graphfix_bench import cli
    from tests.helpers.bench_run import bench_command

    cmd = bench_command(["engine", "--model", "m", "--", "--dummy-weight"], tmp_path)
    ours, theirs = bench_options.split_freetoken_args(cmd[4:])
    assert theirs == ["--dummy-weight"]
    opts = cli.parser().parse_args(ours)
    assert (opts.logs, opts.json) == (str(tmp_path / "logs"), str(tmp_path / "record.json"))
