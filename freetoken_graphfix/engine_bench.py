"""``bench --engine``: every mode in FreeToken's real offline engine, same model, same prompts.

A tiny qwen4_exp model is synthesised in FreeToken's FTW layout (seeded; nothing downloaded): the
geometry of FreeToken's own GPU toy, with the layer count as the knob, the PLE table on the disk
backend in CUDA wait-sync mode, so every decode graph starts with a WAIT released after its launch.
Each arm runs the real engine (``freetoken.llm.LLM``: Scheduler, Engine, GraphRunner, bs 1 and 2
graphs) in a fresh process (``_engine_child.py``). Shim arms get ``FT_GRAPH_UPLOAD`` in that
process's environment and nothing else: the package's ``.pth`` bootstrap must bring the shim in,
as on a user's machine. The never-uploaded arms (``pre-697``: FreeToken's upload removed, and
``skip``) are the negative control: on a large enough model their first launches block.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import config
from .bench import ERR, OK, environment, positive, progress, rotated, summary

CHILD = Path(__file__).with_name("_engine_child.py")
RESULT_TAG = "GRAPHFIX_ENGINE_RESULT "
SHIM_ACTION = {"auto": "deferred", "upload": "upload", "warm": "warm", "deferred": "deferred", "skip": "exposed"}
SHIM_ARMS = tuple(SHIM_ACTION)  # FT_GRAPH_UPLOAD=<arm>, and the action the shim must take on every graph
ARMS = ("upstream", "pre-697", *SHIM_ARMS)
PROTECTED = ("upstream", "auto", "upload", "warm", "deferred")  # must never block, same tokens as upstream
NEVER_UPLOADED = ("pre-697", "skip")  # the negative control
MIN_LAYERS = 4  # a QSA layer is every 4th, the PLE layer is 1

VOCAB, EOS = 512, 7  # EOS is also the PLE n-gram hash boundary
PLE_LAYER = 1  # zero-based; config.json counts from one
PLE_PREFIX = f"model.language_model.layers.{PLE_LAYER}.ple.ple_embedding.ngram_embedding."
PLE_SCALE = 0.25  # bf16-exact
ENGINE = dict(  # SchedulerConfig fields this benchmark sets; the rest keep FreeToken's defaults
    attention_backend="qsa_sparse",  # pure triton: no flashinfer or sgl-kernel
    moe_strategy="fused",  # resident bf16 experts, triton fused MoE
    ple_backend="disk",  # DiskRowTable; FREETOKEN_PLE_SYNC=wait puts the WAIT in the graph
    max_running_req=2, cuda_graph_bs=[1, 2], cuda_graph_max_bs=2,
    num_token_override=8192,  # 128 KV pages, not 0.9 of the GPU
    max_extend_tokens=1024, cache_type="radix",
)


# ---------------------------------------------------------------- the synthetic model

def text_config(layers: int) -> dict[str, Any]:
    """FreeToken's GPU toy (tests/models/qwen4_exp/common.py): GDN layers, every 4th QSA, PLE on layer 1."""
    return dict(
        model_type="qwen4_exp_text", num_hidden_layers=layers, hidden_size=128, vocab_size=VOCAB,
        head_dim=64, num_attention_heads=4, num_key_value_heads=1,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        max_position_embeddings=4096, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, output_gate_type="sigmoid",
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=64, indexer_budget=16, indexer_compress_ratio=4,
        hc_count=4, hc_lowrank=16,
        ple_layer_ids=[PLE_LAYER + 1], ple_embed_dim=64, ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=2,
        ngram_vocab_size_base=1000, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=4,
        eos_token_id=EOS, bos_token_id=EOS)


def prompts() -> list[list[int]]:
    """Three 40-token prompts: distinct first tokens (no shared radix prefix), an EOS inside the first."""
    import torch

    g = torch.Generator().manual_seed(5)
    out = [torch.randint(8, VOCAB, (40,), generator=g).tolist() for _ in range(3)]
    out[0][17] = EOS
    for i, p in enumerate(out):
        p[0] = 100 + i
    return out


def meta_model(folder: str) -> tuple[Any, Any]:
    """(SchedulerConfig after the engine's own ``_adjust_config``, the model on the meta device)."""
    import torch
    from freetoken.distributed import DistributedInfo, set_tp_info, try_get_tp_info
    from freetoken.engine.engine import _adjust_config
    from freetoken.layers import rotary
    from freetoken.mm.config import ENCODER_KINDS, MultimodalConfig
    from freetoken.models import create_model
    from freetoken.scheduler.config import SchedulerConfig
    from freetoken.utils.torch_utils import torch_dtype

    if try_get_tp_info() is None:
        set_tp_info(rank=0, size=1)
    sc = SchedulerConfig(model_path=folder, tp_info=DistributedInfo(0, 1), dtype=torch.bfloat16, offline_mode=True,
                         mm=MultimodalConfig(disabled_encoders=frozenset(ENCODER_KINDS)), **ENGINE)
    _adjust_config(sc)
    rotary.set_rope_device(torch.device("cpu"))  # get_rope refuses the meta device
    with torch.device("meta"), torch_dtype(torch.bfloat16):
        return sc, create_model(sc.model_config)


def random_weight(name: str, shape: tuple[int, ...], dtype: Any, g: Any) -> Any:
    """Finite, O(1)-activation random init by the parameter's role."""
    import torch

    if name.endswith("A_log"):
        return torch.empty(shape).uniform_(1, 16, generator=g).log().to(dtype)
    if name.endswith("dt_bias"):
        return (torch.randn(shape, generator=g) * 0.1).to(dtype)
    if name.endswith("linear_attn.norm.weight"):  # GatedRMSNorm: w * x
        return (1 + 0.02 * torch.randn(shape, generator=g)).to(dtype)
    if "norm" in name.rsplit(".", 2)[-2]:  # zero-centred (1 + w) norms
        return (0.02 * torch.randn(shape, generator=g)).to(dtype)
    if name.endswith("conv1d.weight"):
        return (0.3 * torch.randn(shape, generator=g)).to(dtype)
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, generator=g).to(dtype)
    if len(shape) == 2:  # Linear [out, in]
        return (torch.randn(shape, generator=g) / math.sqrt(shape[1])).to(dtype)
    return (0.02 * torch.randn(shape, generator=g)).to(dtype)


def check_layers(layers: int) -> None:
    if layers < MIN_LAYERS:
        raise ValueError(f"layers={layers}: need at least {MIN_LAYERS} (a QSA layer is every 4th, the PLE layer is 1)")


def build_model_dir(folder: str, layers: int, seed: int = 1234) -> dict[str, Any]:
    """Write config, tokenizer, FTW weights, bf16 expert banks and the PLE table into ``folder``.

    FTW, not a raw HF checkpoint: qwen4_exp reads bf16 routed experts only from FTW banks, and
    dummy weights would attach a ZeroTable (no WAIT) instead of the disk PLE table.
    """
    import torch
    from freetoken.checkpoint.ftw import FTWWriter
    from freetoken.models.qwen4_exp.ple import derive_ngram_hash_constants
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    check_layers(layers)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"architectures": ["Qwen4ExpForConditionalGeneration"], "model_type": "qwen4_exp",
                   "image_token_id": 248056, "tie_word_embeddings": False, "text_config": text_config(layers)}, fh)
    tok = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(VOCAB)}, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": f"<{EOS}>", "model_max_length": 4096}, fh)

    sc, model = meta_model(folder)
    mc, a4 = sc.model_config, sc.model_config.qwen4_args
    mult, sizes, offs = derive_ngram_hash_constants(
        vocab_size=VOCAB, ngram_size=a4.ngram_size, num_ngram_heads=a4.num_ngram_heads,
        ngram_vocab_size_base=a4.ngram_vocab_size_base, ple_layer_index=0)
    hash_buffers = {"layer_multipliers": mult, "ngram_heads_vocab_sizes": sizes, "ngram_heads_offsets": offs}
    g = torch.Generator().manual_seed(seed)
    writer = FTWWriter(folder)
    for name, t in model.state_dict().items():  # exactly the model's state dict
        if t.dtype == torch.int64:  # the PLE hash buffers ship in the checkpoint
            writer.add_tensor(name, torch.tensor(hash_buffers[name.rsplit(".", 1)[1]]), kind="weight")
        else:
            writer.add_tensor(name, random_weight(name, tuple(t.shape), t.dtype, g), kind="weight")
    n, h, i = mc.num_moe_layers * mc.num_experts, mc.hidden_size, mc.moe_intermediate_size
    writer.add_tensor("gate_up", (torch.randn(n, 2 * i, h, generator=g) / math.sqrt(h)).bfloat16(),
                      kind="experts_bank")
    writer.add_tensor("down", (torch.randn(n, h, i, generator=g) / math.sqrt(i)).bfloat16(), kind="experts_bank")
    rows = -(-(offs[-1] + sizes[-1]) // a4.split_ngram_parts)
    shards = [(torch.randn(rows, a4.ngram_head_dim, generator=g) * 2).to(torch.float8_e4m3fn)
              for _ in range(a4.split_ngram_parts)]
    ple = {PLE_PREFIX + f"shard_{k}.weight": s for k, s in enumerate(shards)}
    ple[PLE_PREFIX + "weight_scale"] = torch.tensor(PLE_SCALE, dtype=torch.bfloat16)
    save_file(ple, os.path.join(folder, "ple-table-00000.safetensors"), metadata={"format": "pt"})
    writer.finalize({"source_model_path": "synthetic (freetoken_graphfix bench --engine)", "fingerprint": None,
                     "quant_format": "bf16", "layer_quant_formats": None,
                     "expert_bank_num_layers": mc.num_moe_layers, "side_files": ["ple-table-00000.safetensors"]})
    return {"config": sc, "model": model, "rows": rows, "shards": shards}


# ---------------------------------------------------------------- one arm, in its own process

def arm_env(arm: str) -> dict[str, str]:
    """The engine process's environment: the user's, with ``FT_GRAPH_UPLOAD`` set only for shim arms."""
    env = {k: v for k, v in os.environ.items() if k != config.ENV_MODE}
    if arm in SHIM_ARMS:
        env[config.ENV_MODE] = arm
    return env


def run_arm(arm: str, model_dir: str, opts: argparse.Namespace, log_dir: str, label: str = "") -> dict[str, Any]:
    """One engine process for ``arm``; its result line, or the error and the tail of its log."""
    label = label or arm
    spec = {"model_dir": model_dir, "engine": ENGINE, "prompts": prompts(), "tokens": opts.tokens,
            "replays": opts.replays, "watchdog_s": opts.watchdog, "hang_timeout_s": opts.hang_timeout,
            "no_upload": arm == "pre-697"}
    spec_path = os.path.join(log_dir, f"{label}.spec.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    log_path = os.path.join(log_dir, f"{label}.log")
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run([sys.executable, str(CHILD), spec_path], stdout=subprocess.PIPE, stderr=log,
                                  text=True, env=arm_env(arm), timeout=opts.hang_timeout + 60)
            code, stdout, why = proc.returncode, proc.stdout, f"engine process exited {proc.returncode}"
        except subprocess.TimeoutExpired as exc:  # the child's own faulthandler exit did not fire
            code, stdout, why = None, "", f"engine process killed after {exc.timeout:.0f} s"
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if code != 0 or not lines:
        with open(log_path) as fh:
            tail = fh.read().strip().splitlines()[-5:]
        return {"arm": arm, "error": f"{why}: " + " | ".join(tail), "log": log_path}
    result = json.loads(lines[-1][len(RESULT_TAG):])
    result.update(arm=arm, log=log_path, problems=arm_problems(arm, result))
    return result


def arm_problems(arm: str, r: dict[str, Any]) -> list[str]:
    """What makes this arm's run no proof of anything, whatever its figures say."""
    out = []
    if not (r["wait_sync"] and not r["fill_worker"]):
        out.append(f"PLE table {r['table']} is not in CUDA wait-sync mode: no WAIT to protect")
    if "replay_error" in r:
        out.append(f"timing the graphs' replays failed: {r['replay_error']}")
    if r["captured_waits"] < len(r["graph_bs"]) or r["steps"]["graph"] == 0:
        out.append(f"decode did not run on graphs holding the WAIT ({r['captured_waits']} WAITs, steps {r['steps']})")
    shim = r["shim"]
    if arm in SHIM_ARMS and r.get("freetoken_patched"):
        out.append("this FreeToken carries the patch series, so the shim stands down; compare its own "
                   "FREETOKEN_GRAPH_UPLOAD modes with --arms upstream")
    elif arm in SHIM_ARMS:
        if shim is None or shim["mode"] != arm or not shim["patched"]:
            out.append(f"the shim did not reach the engine process in mode {arm} "
                       f"({'not loaded' if shim is None else shim['reason']}): is freetoken-graphfix installed in "
                       f"this interpreter's site-packages, so that its .pth bootstrap runs? see doctor")
        else:
            actions = [g["action"] for p in shim["passes"] for g in p["graphs"]]
            if set(actions) != {SHIM_ACTION[arm]}:
                out.append(f"expected action {SHIM_ACTION[arm]} for every graph, got {actions}")
    elif shim is not None:
        out.append(f"the shim was loaded in the {arm} arm ({config.ENV_MODE} leaked into its environment)")
    return out


# ---------------------------------------------------------------- the comparison

def engine_record(layers: int, opts: argparse.Namespace, log_dir: str) -> dict[str, Any]:
    """Build the model once, then run every arm on it, ``opts.rounds`` times in rotated order.

    An unrecorded warm-up run goes first: the first engine on a machine compiles FreeToken's triton
    and JIT kernels into their caches, and no arm should pay for that."""
    model_dir = tempfile.mkdtemp(prefix=f"graphfix-engine-{layers}L-", dir=log_dir)
    try:
        build_model_dir(model_dir, layers)
        if opts.warmup:
            warm = run_arm("upstream", model_dir, opts, log_dir, label="warmup")
            print(f"engine {layers}L warm-up run: {one_line(warm)}", file=sys.stderr, flush=True)
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in opts.arms}
        order = [arm for r in range(opts.rounds) for arm in rotated(opts.arms, r)]
        for arm in progress(order, len(order), f"engine arms ({layers} layers)"):
            runs[arm].append(run_arm(arm, model_dir, opts, log_dir))
            print(f"engine {layers}L {arm}: {one_line(runs[arm][-1])}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    env = environment()
    env.pop("freetoken", None)  # reported by the engine processes themselves
    return {"layers": layers, "tokens": opts.tokens, "rounds": opts.rounds, "env": env, "runs": runs,
            "summary": summarise(runs)}


def one_line(r: dict[str, Any]) -> str:
    if "error" in r:
        return "ERROR " + r["error"]
    replay = {bs: round(statistics.median(v), 4) for bs, v in r.get("replay_gpu_ms", {}).items() if v}
    problems = f"; PROBLEMS: {r['problems']}" if r["problems"] else ""
    return (f"fires {len(r['fires'])}, first launch {fmt_ms(r['first_launch_ms'])} ms, replay GPU median {replay} ms, "
            f"hash {r['token_hash']}, build {r['build_s']:.1f} s{problems}")


def fmt_ms(per_bs: dict[str, float]) -> str:
    return " ".join(f"{v:.2f}" for _, v in sorted(per_bs.items(), key=lambda kv: -int(kv[0])))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def pooled(runs: list[dict[str, Any]], key: str) -> dict[str, dict[str, float]]:
    """Per batch size (largest first), quartiles of ``key``'s samples from every round."""
    per_bs: dict[str, list[float]] = {}
    for r in runs:
        for bs, values in r.get(key, {}).items():
            per_bs.setdefault(bs, []).extend(values)
    return {bs: summary(v, (25, 75)) for bs, v in sorted(per_bs.items(), key=lambda kv: -int(kv[0]))}


def ratio(arm: dict[str, dict[str, float]], base: dict[str, dict[str, float]]) -> float:
    """Mean over batch sizes of the arm's median over the base's."""
    pairs = [arm[bs]["median"] / base[bs]["median"] for bs in arm if bs in base]
    return statistics.fmean(pairs) if pairs else math.nan


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per arm, pooled over rounds; GPU times compared with the never-uploaded arm."""
    out: dict[str, Any] = {}
    upstream = {r["token_hash"] for r in runs.get("upstream", []) if "error" not in r}
    for arm, rs in runs.items():
        good = [r for r in rs if "error" not in r]
        out[arm] = {
            "errors": [r["error"] for r in rs if "error" in r] + [p for r in good for p in r["problems"]],
            "fires": sum(len(r["fires"]) for r in good),
            "hashes": sorted({r["token_hash"] for r in good}),
            "same_tokens_as_upstream": bool(upstream) and {r["token_hash"] for r in good} == upstream,
            "first_launch_ms": {bs: max(r["first_launch_ms"][bs] for r in good) for bs in
                                (good[0]["first_launch_ms"] if good else {})},
            "upload_ms_per_graph": median([u for r in good for u in r["upload_ms"]]),
            "capture_ms": median([sum(r["capture_ms"]) for r in good]),
            "step_gpu_ms": pooled(good, "step_gpu_ms"),
            "step_host_ms": pooled(good, "step_host_ms"),
            "replay_gpu_ms": pooled(good, "replay_gpu_ms"),
        }
    base = next((out[a] for a in NEVER_UPLOADED if a in out), None)
    for rec in out.values():
        for key in ("step_gpu_ms", "replay_gpu_ms"):
            rec[key.replace("_ms", "_vs_never_uploaded")] = ratio(rec[key], base[key]) if base else math.nan
    return out


def failures(record: dict[str, Any]) -> list[str]:
    """The safety targets: every protected arm ran cleanly, never blocked, and matched upstream's tokens."""
    out = []
    for arm, s in record["summary"].items():
        out += [f"{arm}: {e}" for e in s["errors"]]
        if arm in PROTECTED and s["fires"]:
            out.append(f"{arm}: the watchdog released {s['fires']} blocked launch(es)")
        if arm in PROTECTED and arm != "upstream" and not s["same_tokens_as_upstream"]:
            out.append(f"{arm}: tokens {s['hashes']} differ from upstream's")
    return out


def render(record: dict[str, Any]) -> str:
    env, summary = record["env"], record["summary"]
    first = next((r for rs in record["runs"].values() for r in rs if "freetoken" in r), {})
    ft = first.get("freetoken", "?") + (f" PATCHED (FREETOKEN_GRAPH_UPLOAD={first.get('freetoken_graph_upload')})"
                                        if first.get("freetoken_patched") else "")
    lines = [f"{env['gpu']} | driver {env['driver']} | torch {env['torch']} | freetoken {ft} | {env['date']}",
             f"real engine, synthetic qwen4_exp, {record['layers']} layers, disk PLE wait-sync, graphs bs 2 and 1, "
             f"3 requests x {record['tokens']} tokens, {record['rounds']} round(s). Per bs (2, 1): decode step GPU ms "
             "(CUDA events around forward_batch, warm graph steps; host-bound) and graph replay GPU ms (the "
             "engine's graphs alone, after the run); ratios to the never-uploaded arm",
             f"{'arm':9} {'fires':>5} {'1st launch ms':>15} {'upload ms/graph':>15} {'capture ms':>10} "
             f"{'step median [IQR] bs 2 | bs 1':>40} {'/never':>7} {'replay median bs 2 | bs 1':>26} {'/never':>7} "
             f"{'tokens':>17}"]
    for arm, s in summary.items():
        step = " | ".join(f"{q['median']:.4f} [{q['p25']:.4f}-{q['p75']:.4f}]" for q in s["step_gpu_ms"].values())
        replay = " | ".join(f"{q['median']:.4f}" for q in s["replay_gpu_ms"].values())
        tokens = ",".join(s["hashes"]) + ("" if arm == "upstream" or s["same_tokens_as_upstream"] else " DIFF")
        lines.append(f"{arm:9} {s['fires']:>5} {fmt_ms(s['first_launch_ms']):>15} {s['upload_ms_per_graph']:>15.2f} "
                     f"{s['capture_ms']:>10.1f} {step:>40} {s['step_gpu_vs_never_uploaded']:>7.4f} {replay:>26} "
                     f"{s['replay_gpu_vs_never_uploaded']:>7.4f} {tokens:>17}")
        lines += [f"          ! {e}" for e in s["errors"]]
    controls = [a for a in NEVER_UPLOADED if a in summary]
    if controls:
        lines.append("negative control (never uploaded): " + ", ".join(
            f"{a} {'BLOCKED (watchdog fired)' if summary[a]['fires'] else 'never blocked at this size'}"
            for a in controls))
    bad = failures(record)
    lines.append("safety: " + ("every protected arm: no blocked launch, upstream's tokens" if not bad else
                               "FAILED: " + "; ".join(bad)))
    return "\n".join(lines)


def add_arguments(group: Any) -> None:
    """``bench``'s ``--engine`` options."""
    group.add_argument("--engine", action="store_true", help="run the real-engine comparison")
    group.add_argument("--layers", type=int, nargs="+", default=[48], help="model sizes (default 48)")
    group.add_argument("--tokens", type=positive, default=64, help="greedy tokens per request (default 64)")
    group.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    group.add_argument("--rounds", type=positive, default=1, help="runs of every arm, in rotated order (default 1)")
    group.add_argument("--replays", type=positive, default=200, help="timed replays per engine graph (default 200)")
    group.add_argument("--no-warmup", dest="warmup", action="store_false",
                       help="no unrecorded warm-up run (kernel compilation then lands on the first arm)")
    group.add_argument("--hang-timeout", type=float, default=300.0, help="seconds before an engine run is killed")
    group.add_argument("--logs", metavar="DIR", help="keep each engine process's log here")


def main(opts: argparse.Namespace) -> int:
    """Run the comparison for each ``--layers`` size; exit 1 when a safety target fails."""
    try:
        for layers in opts.layers:
            check_layers(layers)
    except ValueError as exc:  # refused before any size runs
        print(f"bench --engine: --layers: {exc}", file=sys.stderr)
        return ERR
    log_dir = opts.logs or tempfile.mkdtemp(prefix="graphfix-engine-")
    os.makedirs(log_dir, exist_ok=True)
    records = [engine_record(layers, opts, log_dir) for layers in opts.layers]
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(records, fh, indent=1)
    for record in records:
        print(render(record) + "\n")
    print(f"engine logs: {log_dir}")
    return ERR if any(failures(r) for r in records) else OK
