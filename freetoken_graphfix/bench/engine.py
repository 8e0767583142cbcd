"""``bench --engine``: every mode in FreeToken's real offline engine, same model, same prompts.

Each arm runs the real engine (``freetoken.llm.LLM``: Scheduler, Engine, GraphRunner, bs 1 and 2
graphs) on the synthetic qwen4_exp of ``model`` in a fresh process (``_engine_child.py``). Shim arms
get ``FT_GRAPH_UPLOAD`` in that process's environment and nothing else: the package's ``.pth``
bootstrap must bring the shim in, as on a user's machine. The never-uploaded arms (``pre-697``:
FreeToken's upload removed, and ``skip``) are the negative control: on a large enough model their
first launches block. ``gate`` is FreeToken's own escape hatch (``FREETOKEN_PLE_SYNC=gate``: the
fill before the launch, no WAIT in the graph): on FreeToken 0.1.3, which uploads nothing, upstream
is itself unprotected and gate's tokens are the reference.
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

from .. import config, patching
from .common import environment, positive, progress, rotated, run_sizes
from .model import ENGINE, build_model_dir, prompts
from .stats import summary

CHILD = Path(__file__).with_name("_engine_child.py")
PROTECT_ENV = "FREETOKEN_GRAPH_PROTECT"  # the patch series' switch (patches/0003)
RESULT_TAG = "GRAPHFIX_ENGINE_RESULT "
SHIM_ACTION = {"auto": "deferred", "upload": "upload", "warm": "warm", "deferred": "deferred", "skip": "exposed"}
SHIM_ARMS = tuple(SHIM_ACTION)  # FT_GRAPH_UPLOAD=<arm>, and the action the shim must take on every graph
# FreeToken with patches/ applied (a patched copy first on PYTHONPATH), FREETOKEN_GRAPH_PROTECT=<mode>
PATCHED_ARMS = {"patched": "first-launch", "patched-upload": "upload", "patched-none": "none"}
GATE = "gate"  # FREETOKEN_PLE_SYNC=gate; every other arm runs wait-sync
ARMS = ("upstream", "pre-697", GATE, *SHIM_ARMS, *PATCHED_ARMS)
PROTECTED = ("auto", "upload", "warm", "deferred", "patched", "patched-upload", GATE)  # never block, same tokens
NEVER_UPLOADED = ("pre-697", "skip", "patched-none")  # unprotected and never uploaded: the negative control


def arm_env(arm: str, patched: str | None = None) -> dict[str, str]:
    """The engine (or server) process's environment: the user's, with ``FREETOKEN_PLE_SYNC`` set to
    wait-sync (gate for the gate arm: the WAIT must be in every other arm's graphs, whatever the user
    set), ``FT_GRAPH_UPLOAD`` only for shim arms, and for patched arms the patched FreeToken
    (``patched``) first on ``PYTHONPATH`` and its mode."""
    env = {k: v for k, v in os.environ.items() if k not in (config.ENV_MODE, PROTECT_ENV)}
    env["FREETOKEN_PLE_SYNC"] = "gate" if arm == GATE else "wait"
    if arm in SHIM_ARMS:
        env[config.ENV_MODE] = arm
    elif arm in PATCHED_ARMS:
        if patched is None:
            raise ValueError(f"arm {arm!r} needs the patched FreeToken (patching.patched_copy)")
        env[PROTECT_ENV] = PATCHED_ARMS[arm]
        env["PYTHONPATH"] = os.pathsep.join(p for p in (patched, os.environ.get("PYTHONPATH")) if p)
    return env


def patched_freetoken(arms: list[str], log_dir: str) -> str | None:
    """The folder to put first on ``PYTHONPATH`` for the patched arms (a patched copy of the
    installed FreeToken under ``log_dir``), ``None`` when no patched arm runs."""
    if not any(arm in PATCHED_ARMS for arm in arms):
        return None
    return str(patching.patched_copy(Path(log_dir) / "patched-freetoken"))


def run_arm(arm: str, model_dir: str, opts: argparse.Namespace, log_dir: str, label: str = "",
            patched: str | None = None) -> dict[str, Any]:
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
                                  text=True, env=arm_env(arm, patched), timeout=opts.hang_timeout + 60)
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
    if arm == GATE:
        if r["wait_sync"] or r["captured_waits"] or r["steps"]["graph"] == 0:
            out.append(f"the gate arm did not decode on graphs without a WAIT (wait-sync {r['wait_sync']}, "
                       f"{r['captured_waits']} WAITs, steps {r['steps']})")
    elif not (r["wait_sync"] and (not r["fill_worker"] or r.get("freetoken_patched"))):  # patched: first launches only
        out.append(f"PLE table {r['table']} is not in CUDA wait-sync mode: no WAIT to protect")
    elif r["captured_waits"] < len(r["graph_bs"]) or r["steps"]["graph"] == 0:
        out.append(f"decode did not run on graphs holding the WAIT ({r['captured_waits']} WAITs, steps {r['steps']})")
    if "replay_error" in r:
        out.append(f"timing the graphs' replays failed: {r['replay_error']}")
    shim = r["shim"]
    if arm in PATCHED_ARMS:
        if not r.get("freetoken_patched") or r.get("freetoken_graph_protect") != PATCHED_ARMS[arm]:
            out.append(f"the engine did not run the patched FreeToken in mode {PATCHED_ARMS[arm]} "
                       f"(patched: {r.get('freetoken_patched')}, {PROTECT_ENV}={r.get('freetoken_graph_protect')})")
    elif r.get("freetoken_patched"):
        out.append(f"the installed FreeToken carries the patch series, so the {arm} arm measures it, not 0.2.1: "
                   "revert it (patch revert --site) and compare the series through the patched arms")
    if arm in SHIM_ARMS:
        if shim is None or shim["mode"] != arm or not shim["patched"]:
            out.append(f"the shim did not reach the engine process in mode {arm} "
                       f"({'not loaded' if shim is None else shim['reason']}): is freetoken-graphfix installed in "
                       f"this interpreter's site-packages, so that its .pth bootstrap runs? see doctor")
        else:
            actions = [g["action"] for p in shim["passes"] for g in p["graphs"]]
            if set(actions) != {SHIM_ACTION[arm]}:
                out.append(f"expected action {SHIM_ACTION[arm]} for every graph, got {actions}")
    elif shim is not None and shim["installed"]:
        out.append(f"the shim was loaded in the {arm} arm ({config.ENV_MODE} leaked into its environment)")
    return out


def engine_record(layers: int, opts: argparse.Namespace, log_dir: str) -> dict[str, Any]:
    """Build the model once, then run every arm on it, ``opts.rounds`` times in rotated order.

    An unrecorded warm-up run goes first: the first engine on a machine compiles FreeToken's triton
    and JIT kernels into their caches, and no arm should pay for that."""
    model_dir = tempfile.mkdtemp(prefix=f"graphfix-engine-{layers}L-", dir=log_dir)
    patched = patched_freetoken(opts.arms, log_dir)
    try:
        build_model_dir(model_dir, layers)
        if opts.warmup:  # the patched copy is another path: its JIT kernels may be compiled again
            for arm in ("upstream", *(["patched"] if patched else [])):
                warm = run_arm(arm, model_dir, opts, log_dir, label=f"warmup-{arm}", patched=patched)
                print(f"engine {layers}L warm-up run ({arm}): {one_line(warm)}", file=sys.stderr, flush=True)
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in opts.arms}
        order = [arm for r in range(opts.rounds) for arm in rotated(opts.arms, r)]
        for arm in progress(order, len(order), f"engine arms ({layers} layers)"):
            runs[arm].append(run_arm(arm, model_dir, opts, log_dir, patched=patched))
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


def upstream_protects(runs: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether the FreeToken under test protects its graphs itself (0.2.x's ``_upload_graph``; 0.1.3
    has none, so there upstream is one more negative control and gate's tokens are the reference)."""
    return any(r.get("freetoken_uploads", True) for rs in runs.values() for r in rs if "error" not in r)


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per arm, pooled over rounds; GPU times compared with the never-uploaded arm."""
    out: dict[str, Any] = {}
    reference = "upstream" if upstream_protects(runs) else GATE
    expected = {r["token_hash"] for r in runs.get(reference, []) if "error" not in r}
    for arm, rs in runs.items():
        good = [r for r in rs if "error" not in r]
        out[arm] = {
            "protected": arm in PROTECTED or (arm == "upstream" and reference == "upstream"),
            "errors": [r["error"] for r in rs if "error" in r] + [p for r in good for p in r["problems"]],
            "fires": sum(len(r["fires"]) for r in good),
            "hashes": sorted({r["token_hash"] for r in good}),
            "reference": reference,
            "same_tokens_as_reference": bool(expected) and {r["token_hash"] for r in good} == expected,
            "first_launch_ms": {bs: max(r["first_launch_ms"][bs] for r in good) for bs in
                                (good[0]["first_launch_ms"] if good else {})},
            "upload_ms_per_graph": median([u for r in good for u in r["upload_ms"]]),
            "capture_ms": median([sum(r["capture_ms"]) for r in good]),
            "step_gpu_ms": pooled(good, "step_gpu_ms"),
            "step_host_ms": pooled(good, "step_host_ms"),
            "replay_gpu_ms": pooled(good, "replay_gpu_ms"),
        }
    base = next((out[a] for a in (*NEVER_UPLOADED, "upstream") if a in out and not out[a]["protected"]), None)
    for rec in out.values():
        for key in ("step_gpu_ms", "replay_gpu_ms"):
            rec[key.replace("_ms", "_vs_never_uploaded")] = ratio(rec[key], base[key]) if base else math.nan
    return out


def failures(record: dict[str, Any]) -> list[str]:
    """The safety targets: every protected arm ran cleanly, never blocked, and matched the reference's
    tokens (upstream's, or gate's on a FreeToken that does not upload)."""
    out = []
    for arm, s in record["summary"].items():
        out += [f"{arm}: {e}" for e in s["errors"]]
        if s["protected"] and s["fires"]:
            out.append(f"{arm}: the watchdog released {s['fires']} blocked launch(es)")
        if s["protected"] and arm != s["reference"] and not s["same_tokens_as_reference"]:
            if s["reference"] in record["summary"]:
                out.append(f"{arm}: tokens {s['hashes']} differ from {s['reference']}'s")
            else:
                out.append(f"{arm}: no {s['reference']} arm to compare tokens with (this FreeToken uploads no "
                           f"graph, so upstream is unprotected: add --arms {GATE})")
    return out


def render(record: dict[str, Any]) -> str:
    env, summary = record["env"], record["summary"]
    first = next((r for rs in record["runs"].values() for r in rs if "freetoken" in r), {})
    ft = first.get("freetoken", "?") + (f"; patched arms: patches/ applied, {PROTECT_ENV}=<mode>"
                                        if any(arm in PATCHED_ARMS for arm in summary) else "")
    lines = [f"{env['gpu']} | driver {env['driver']} | torch {env['torch']} | freetoken {ft} | {env['date']}",
             f"real engine, synthetic qwen4_exp, {record['layers']} layers, disk PLE wait-sync (gate arm: "
             "launch-gating), graphs bs 2 and 1, "
             f"3 requests x {record['tokens']} tokens, {record['rounds']} round(s). Per bs (2, 1): decode step GPU ms "
             "(CUDA events around forward_batch, warm graph steps; host-bound) and graph replay GPU ms (the "
             "engine's graphs alone, after the run); ratios to the never-uploaded arm",
             f"{'arm':14} {'fires':>5} {'1st launch ms':>15} {'upload ms/graph':>15} {'capture ms':>10} "
             f"{'step median [IQR] bs 2 | bs 1':>40} {'/never':>7} {'replay median bs 2 | bs 1':>26} {'/never':>7} "
             f"{'tokens':>17}"]
    for arm, s in summary.items():
        step = " | ".join(f"{q['median']:.4f} [{q['p25']:.4f}-{q['p75']:.4f}]" for q in s["step_gpu_ms"].values())
        replay = " | ".join(f"{q['median']:.4f}" for q in s["replay_gpu_ms"].values())
        tokens = ",".join(s["hashes"]) + ("" if arm == s["reference"] or s["same_tokens_as_reference"] else " DIFF")
        lines.append(f"{arm:14} {s['fires']:>5} {fmt_ms(s['first_launch_ms']):>15} {s['upload_ms_per_graph']:>15.2f} "
                     f"{s['capture_ms']:>10.1f} {step:>40} {s['step_gpu_vs_never_uploaded']:>7.4f} {replay:>26} "
                     f"{s['replay_gpu_vs_never_uploaded']:>7.4f} {tokens:>17}")
        lines += [f"{'':15}! {e}" for e in s["errors"]]
    controls = [a for a, s in summary.items() if not s["protected"]]
    if controls:
        lines.append("negative control (never uploaded): " + ", ".join(
            f"{a} {'BLOCKED (watchdog fired)' if summary[a]['fires'] else 'never blocked at this size'}"
            for a in controls))
    bad = failures(record)
    reference = next(iter(summary.values()), {}).get("reference", "upstream")
    lines.append("safety: " + (f"every protected arm: no blocked launch, {reference}'s tokens" if not bad else
                               "FAILED: " + "; ".join(bad)))
    return "\n".join(lines)


def add_arguments(group: Any) -> None:
    """``bench``'s ``--engine`` options."""
    group.add_argument("--engine", action="store_true", help="run the real-engine comparison")
    group.add_argument("--layers", type=int, nargs="+", default=[48], help="model sizes (default 48)")
    group.add_argument("--tokens", type=positive, default=64, help="greedy tokens per request (default 64)")
    group.add_argument("--arms", nargs="+", default=[a for a in ARMS if a not in PATCHED_ARMS], choices=ARMS,
                       help="arms (default: upstream, pre-697, gate and every shim mode; add patched, "
                            "patched-upload, patched-none for the patch series)")
    group.add_argument("--rounds", type=positive, default=1, help="runs of every arm, in rotated order (default 1)")
    group.add_argument("--replays", type=positive, default=200, help="timed replays per engine graph (default 200)")
    group.add_argument("--no-warmup", dest="warmup", action="store_false",
                       help="no unrecorded warm-up run (kernel compilation then lands on the first arm)")
    group.add_argument("--hang-timeout", type=float, default=300.0, help="seconds before an engine run is killed")
    group.add_argument("--logs", metavar="DIR", help="keep each engine process's log here")


def main(opts: argparse.Namespace) -> int:
    """Run the comparison for each ``--layers`` size; exit 1 when a safety target fails."""
    return run_sizes(opts, "engine", engine_record, render, lambda r: bool(failures(r)))
