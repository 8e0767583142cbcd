"""``bench engine/serve --model`` on CPU: the models ``bench write-model`` writes, checked against
FreeToken 0.2.1's own parser, tokenizer loader and model builder; what a model's config says about a
host-released WAIT; #775's copy workload; the one-line refusals of bad input."""

from __future__ import annotations

import json

import pytest

from freetoken_graphfix_bench import benchmark, cases, cli, model, target, workload
from freetoken_graphfix_bench.engine import process_checks
from freetoken_graphfix_bench.engine.report import DETAIL
from tests.helpers.engine_records import judged as judged_case
from tests.helpers.engine_records import process, shim

FAMILIES = (model.SYNTHETIC, *model.FAMILIES)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """One written model per family: the synthetic qwen4_exp (8 layers) and the config-only ones."""
    root = tmp_path_factory.mktemp("models")
    for family in FAMILIES:
        model.write_model(str(root / family), family, 8 if family == model.SYNTHETIC else 2)
    return root


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe"])
def test_config_only_models_build_in_freetoken(models, family):
    """FreeToken's own parser, config resolution and model registry take the config (on the meta
    device: its dummy weights need the GPU); the graph sizes are FreeToken's own for the options."""
    import torch
    from freetoken.distributed import set_tp_info, try_get_tp_info
    from freetoken.engine.engine import _adjust_config
    from freetoken.layers import rotary
    from freetoken.models import create_model
    from freetoken.utils.torch_utils import torch_dtype

    if try_get_tp_info() is None:
        set_tp_info(rank=0, size=1)
    args = target.parse_freetoken_args(str(models / family), model.ENGINE_FLAGS[family].split())
    _adjust_config(args)
    rotary.set_rope_device(torch.device("cpu"))
    with torch.device("meta"), torch_dtype(torch.bfloat16):
        built = create_model(args.model_config)
    assert args.use_dummy_weight and type(built).__name__ == model.FAMILIES[family]["architectures"][0]
    assert args.model_config.num_layers == 2


@pytest.mark.parametrize("family, flags, expects_wait", [
    ("qwen4_exp", [], True),  # the synthetic checkpoint: disk PLE table, real weights
    ("qwen4_exp", ["--dummy-weight"], False),  # dummy weights attach a zero table, no WAIT
    ("qwen4_exp", ["--ple-backend", "pinned"], False),  # the pinned table gathers without a WAIT
    ("llama", ["--dummy-weight"], False),
    ("qwen3_moe", ["--dummy-weight", "--max-running-requests", "1"], False),
])
def test_what_a_models_config_says_about_the_wait(models, family, flags, expects_wait):
    t = target.from_model(str(models / family), flags)
    assert (t.family, t.expects_wait, t.synthetic) == (family, expects_wait, False)
    assert t.max_positions == model.MAX_POSITIONS
    assert t.max_running == (1 if "1" in flags else 4)  # FreeToken's own default otherwise
    assert ("host-released WAIT (PLE wait-sync)" in t.describe()) == expects_wait


def test_a_multimodal_config_is_read_through_its_text_config():
    cfg = {"architectures": ["Qwen4ExpForConditionalGeneration"], "model_type": "qwen4_exp",
           "text_config": {"model_type": "qwen4_exp_text", "max_position_embeddings": 1024}}
    assert target.family(cfg) == ("qwen4_exp", "Qwen4ExpForConditionalGeneration", 1024)
    assert target.family({"text_config": {"model_type": "x"}}) == ("x", "unknown", None)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_copy_workload_in_the_models_own_tokens(models, family):
    """Every request exactly ``--context`` tokens of FreeToken's own tokenizer for the model, each
    starting at another place in the text (no shared prefix past the instruction)."""
    tok = workload.load_tokenizer(str(models / family))
    prompts = workload.build(tok, 1000, workload.read_text(None))
    assert [len(p.ids) for p in prompts.values()] == [1000] * 3
    head = len(tok.encode(workload.INSTRUCTION, add_special_tokens=False))
    assert len({tuple(p.ids[head:head + 8]) for p in prompts.values()}) == 3
    single = prompts[workload.SINGLE]
    assert "Apache License" in single.text and single.text.startswith(workload.INSTRUCTION)
    again = tok.encode(single.text, add_special_tokens=False)
    assert abs(len(again) - 1000) <= 4  # a server re-tokenises the text: seams of the repeats may merge


def test_a_context_too_short_for_the_instruction_is_named(models):
    tok = workload.load_tokenizer(str(models / "llama"))
    with pytest.raises(ValueError, match=r"--context 5: too short for the copy instruction; accepted values are \d+"):
        workload.build(tok, 5, "text")


def test_synthetic_kv_holds_two_requests_of_the_workload():
    args = target.synthetic_args(65536, 200)
    assert int(args[args.index("--num-tokens") + 1]) >= 2 * (65536 + 200)
    assert int(target.synthetic_args(16, 8)[args.index("--num-tokens") + 1]) == 8192


def write_error(argv, capsys) -> str:
    assert cli.main(argv) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("freetoken-graphfix: error: bench ")
    return line.removeprefix("freetoken-graphfix: error: bench ").removeprefix("write-model: ")


def test_write_model_is_all_or_nothing(tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert write_error(["write-model", str(tmp_path / "full"), "--family", "llama"], capsys) == (
        f"write-model {str(tmp_path / 'full')!r} already exists and is not an empty directory; accepted values "
        "are a new or empty directory")
    assert write_error(["write-model", str(tmp_path / "m"), "--layers", "2"], capsys).startswith(
        "layers=2: need at least 4")
    assert write_error(["write-model", str(tmp_path / "m"), "--family", "llama", "--experts", "nvfp4"],
                       capsys) == ("--experts nvfp4 is for the synthetic qwen4_exp (--family qwen4_exp); a config-only "
                                   "llama model has dummy weights")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # nothing left behind
    assert cli.main(["write-model", str(tmp_path / "m"), "--family", "llama", "--layers", "3"]) == 0
    written = json.loads((tmp_path / "m" / "config.json").read_text())
    assert written["num_hidden_layers"] == 3 and "--dummy-weight" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "m"]


@pytest.mark.parametrize("args, message", [
    (["--model", "/nonexistent"], "--model '/nonexistent' does not exist; accepted values are a model directory"),
    (["--model", "{file}"], "is not a directory; accepted values are a model directory"),
    (["--model", "{empty}"], "no config.json there; accepted values are a model directory"),
    (["--model", "{llama}", "--", "--dummy-weight", "--bogus"],
     "FreeToken option after --: unrecognized arguments: --bogus (FreeToken's own ft serve options)"),
    (["--model", "{llama}", "--", "--attention-backend", "nope"], "FreeToken option after --: argument"),
    (["--model", "{llama}", "--", "--port", "8000"], "FreeToken option after --: --port: the bench sets it itself"),
    (["--model", "{llama}", "--", "--model-p", "/x"],
     "FreeToken option after --: --model-p (FreeToken reads it as --model-path): the bench sets it itself"),
    (["--model", "{llama}", "--", "--hos=1.2.3.4"],
     "FreeToken option after --: --hos (FreeToken reads it as --host): the bench sets it itself"),
    (["--model", "", "--", "--dummy-weight"], "--model '' does not exist; accepted values are a model directory"),
    (["--", "--dummy-weight"], "FreeToken option after --: --dummy-weight: the synthetic model runs the disk PLE"),
    (["--", "--ple-back", "pinned"], "FreeToken option after --: --ple-back: the synthetic model runs the disk PLE"),
    (["--", "--moe-strategy", "bogus"],
     "FreeToken option after --: argument --moe-strategy: invalid choice: 'bogus' (choose from 'auto', 'fused'"),
    (["--", "--port", "8000"], "FreeToken option after --: --port: the bench sets it itself"),
    (["--model", "{llama}", "--layers", "48", "--", "--dummy-weight"], "--layers sizes the synthetic model"),
    (["--model", "{llama}", "--experts", "nvfp4", "--", "--dummy-weight"],
     "--experts lays out the synthetic model's experts; with --model it has no meaning"),
    (["--model", "{llama}", "--context", "131000", "--", "--dummy-weight"],
     "--context 131000 + --decode-steps 200 = 131200 tokens: the model holds at most 131072"),
    (["--prompt-file", "/nonexistent.txt"], "--prompt-file '/nonexistent.txt': cannot be read as UTF-8 text"),
    (["--model", "{llama}", "--context", "8", "--", "--dummy-weight"],
     "--context 8: too short for the copy instruction; accepted values are"),
    (["--context", "8"], "--context 8: too short for the copy instruction; accepted values are"),
    (["--model", "{notok}", "--", "--dummy-weight"], "FreeToken cannot load its tokenizer ("),
])
def test_bad_model_input_is_one_line_naming_it(models, tmp_path, capsys, monkeypatch, args, message):
    import tempfile

    monkeypatch.setattr(benchmark, "cuda_missing", lambda: None)  # FreeToken's parser runs only where a GPU is
    (tmp_path / "file").write_text("")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notok").mkdir()  # a config and no tokenizer
    (tmp_path / "notok" / "config.json").write_text((models / "llama" / "config.json").read_text())
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    args = [a.format(file=tmp_path / "file", empty=tmp_path / "empty", llama=models / "llama",
                     notok=tmp_path / "notok") for a in args]
    for bench in ("engine", "serve"):
        assert cli.main([bench, *args]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0] and err[0].startswith(
            f"freetoken-graphfix: error: bench {bench}: ")
    assert list((tmp_path / "tmp").iterdir()) == []  # nothing started, nothing left behind


@pytest.mark.parametrize("args, message", [
    (["engine", "--context", "0"], "argument --context: '0': accepted values are whole numbers of 1 or more"),
    (["engine", "--experts", "fp8"], "argument --experts: invalid choice: 'fp8' (choose from 'bf16', 'nvfp4')"),
    (["rig", "--model", "x"], "unrecognized arguments: --model x"),
    (["rig", "--model", ""], "unrecognized arguments: --model "),
    (["startup", "--json", "/nonexistent/dir/x.json"], "--json '/nonexistent/dir/x.json': cannot be written"),
    (["engine", "--watchdog", "nan"], "argument --watchdog: 'nan': accepted values are seconds above 0"),
    (["engine", "--hang-timeout", "-5"], "argument --hang-timeout: '-5': accepted values are seconds above 0"),
])
def test_bad_options_are_refused_before_anything_runs(capsys, args, message):
    code = cli.main(args)
    assert code == 2 and message in capsys.readouterr().err


def test_a_good_model_gets_as_far_as_the_gpu(models, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert cli.main(["engine", "--model", str(models / "llama"), "--", "--dummy-weight"]) == 1
    assert "no CUDA device" in capsys.readouterr().err


def no_wait_result(**over):
    """An engine result on a model without a PLE table (llama with dummy weights)."""
    r = {"freetoken": "0.2.1", "table": "NoneType", "wait_sync": False, "fill_worker": False, "graph_bs": [1, 2, 4],
         "captured_waits": 0, "steps": {"prefill": 3, "decode": 0, "graph": 300}, "fires": [],
         "first_launch_ms": {"2": 0.4, "1": 0.3}, "capture_ms": [500.0], "upload_ms": [1.0, 0.9, 0.9],
         "step_gpu_ms": {"2": [3.3, 3.31], "1": [3.0, 3.0]}, "replay_gpu_ms": {"2": [1.5], "1": [1.2]},
         "token_hash": "aaaa", "distinct_tokens": 90, "shim": None, "free_mib_after_capture": 9000.0,
         "first_launch_free_mib": {"2": [9000.0, 9000.0], "1": [9000.0, 9000.0]}}
    r.update(over)
    return r


def judged(traced=None, **arms):
    return judged_case(False, traced, "llama", **arms)


def test_without_a_wait_every_shim_arm_is_a_no_op_and_every_arm_must_match():
    """No graph holds a host-released WAIT: no-op is the success, nothing is a negative control,
    and a never-uploaded arm that changed the tokens is a failure like any other."""
    good = judged(upstream=[no_wait_result()] * 2, **{"no-upload": [no_wait_result(upload_ms=[])] * 2},
                  auto=[no_wait_result(shim=shim("auto", "no-op", 3))] * 2,
                  upload=[no_wait_result(shim=shim("upload", "upload", 3))] * 2)
    assert not good.figures.wait_case and good.failures() == []
    assert all(s.protected for s in good.figures.arms.values()) and good.figures.base == "no-upload"
    text = good.text()
    assert "no decode graph holds a WAIT the host releases after the launch" in text
    assert "negative control" not in text
    bad = judged(upstream=[no_wait_result()] * 2, **{"no-upload": [no_wait_result(token_hash="bbbb")] * 2},
                 auto=[no_wait_result(shim=shim("auto", "deferred", 3))] * 2)
    wrong = "auto: expected action no-op for every graph, got ['deferred', 'deferred', 'deferred']"
    assert sorted(bad.failures()) == [wrong, wrong, "no-upload: tokens ['bbbb'] differ from upstream's"]
    never = judged(upstream=[no_wait_result(steps={"prefill": 3, "decode": 200, "graph": 0})] * 2)
    assert "decode never ran on a CUDA graph" in never.failures()[0]


def test_a_model_expected_to_hold_the_wait_that_does_not_is_a_problem():
    r = process(**no_wait_result())
    assert process_checks.problems("upstream", r, False, expects_wait=True) == [
        "PLE table NoneType is not in CUDA wait-sync mode: no WAIT to protect"]
    assert process_checks.problems("upstream", r, False, expects_wait=False) == []


def test_the_markdown_report_has_775s_shape():
    gaps = {f"s{i}": 0.19 for i in range(1, 5)}
    timeline = {"note": "n", "by_bs": {"2": {"launches": 23, "graph_kernels": 1090, "step_kernels": 1102,
                                              "busy_us": 812.5, "streams": 4, "gap_us": gaps}}}
    rec = judged(traced={"upstream": [timeline]}, upstream=[no_wait_result()] * 2,
                 **{"no-upload": [no_wait_result(upload_ms=[])] * 2})
    text, verbose = rec.markdown(), rec.markdown(verbose=True)
    for piece in ("| GPU | GPU |", "| driver | 1 |", "| FreeToken | 0.2.1 |", "| model | a model |",
                  "`freetoken-graphfix bench engine ...`",
                  "| build | bs | GPU ms per decode step | tok/s | vs never uploaded, within host levels (95%) |",
                  "| upstream | 2 | 3.305 | 605.1 | 1.0000 ± 0.0000 |", "| no-upload | 2 | 3.305 | 605.1 | 1 (base) |",
                  "the upload in the decode loop, same graph, same process: not measured", DETAIL):
        assert piece in text, piece
    for piece in ("upstream       bs 2: 1 process(es), kernels 1102 (1090), busy 812.5 µs, 4 streams, gap s1 0.190 "
                  "s2 0.190 s3 0.190 s4 0.190", "free GPU memory after capture, upstream: 9000 MiB"):  # the detail
        assert piece in verbose and piece not in text, piece


def test_freetoken_options_follow_the_synthetic_models_own_and_replace_them(tmp_path):
    """``bench engine --layers 8 -- --moe-strategy offload``: the synthetic model with MoE offload in
    place of its resident experts, as FreeToken's own parser reads the options the engine gets."""
    asked = cases.Models(None, (8,), "bf16", 4096, 200, None)
    ft_args = ["--moe-strategy", "offload", "--moe-collect-stats"]
    assert cases.early_checks(asked, ft_args) is None
    (case,), why = cases.prepare(asked, ft_args)
    assert why is None and case.layers == 8 and case.target.synthetic and case.target.expects_wait
    model.write_synthetic_config(str(tmp_path), 8)
    args = target.parse_freetoken_args(str(tmp_path), list(case.target.ft_args))
    assert (args.moe_strategy, args.moe_collect_stats, args.ple_backend) == ("offload", True, "disk")
    assert case.target.experts == "bf16" and "FTW, bf16 experts" in case.target.describe()


def test_nvfp4_experts_reach_the_synthetic_case():
    asked, ft_args = cases.Models(None, (320,), "nvfp4", 4096, 200, None), ["--moe-strategy", "hybrid"]
    assert cases.early_checks(asked, ft_args) is None
    (case,), why = cases.prepare(asked, ft_args)
    assert why is None and (case.target.experts, case.label) == ("nvfp4", "320 layers nvfp4")
    assert "NVFP4 experts, ModelOpt safetensors" in case.target.describe()


def test_write_model_prints_its_one_line_and_nothing_of_freetokens(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "freetoken_graphfix", "bench", "write-model", str(tmp_path / "m"),
                          "--family", "qwen4_exp", "--layers", "4"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.splitlines() == [f"wrote a qwen4_exp model to {tmp_path / 'm'}; run it with: "
                                       f"freetoken-graphfix bench engine --model {tmp_path / 'm'} -- "
                                       f"{model.ENGINE_FLAGS['qwen4_exp']}"]
