"""``bench --engine``: every mode in FreeToken's real offline engine, same model, #775's workload.

Each arm runs the real engine (``freetoken.llm.LLM``: Scheduler, Engine, GraphRunner) in a fresh
process (``engine_child/main.py``), built from FreeToken's own ``ft serve`` options, on the synthetic
qwen4_exp of ``model`` or the user's ``--model``. Shim arms get ``FT_GRAPH_UPLOAD`` in that
process's environment and nothing else: the package's ``.pth`` bootstrap must bring the shim in,
as on a user's machine. The never-uploaded arms (``pre-697``: FreeToken's upload removed, and
``skip``) are the base of every ratio and, on a model whose graphs hold a host-released WAIT, the
negative control: on a large enough model their first launches block. ``gate`` is FreeToken's own
escape hatch (``FREETOKEN_PLE_SYNC=gate``: the fill before the launch, no WAIT in the graph): on
FreeToken 0.1.3, which uploads nothing, upstream is itself unprotected and gate's tokens are the
reference.

Per round every arm runs once, in rotated order. What each figure answers is ``engine_stats``'s
docstring: the upload measured inside each process's decode loop (``--copies``) first, then the arms
compared across processes within a shared host mode and against the A/A control, then diagnostics
from an idle GPU. The kernel timeline comes from more processes per arm (``--trace-runs``) that
initialise CUPTI before their capture and trace a short run of the same workload; no timed process
is ever traced.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import config
from .arms import (
    ARMS,
    DEFAULT_ARMS,
    GATE,
    PATCHED_ARMS,
    SHIM_ACTION,
    SHIM_ARMS,
    WAIT_DEFAULT_ARMS,
    arm_env,
    patched_freetoken,
)
from .common import Case, environment, non_negative, positive, progress, rotated, seconds
from .cupti import decode_timeline
from .engine_stats import summarise
from .settings import EngineSettings
from .verdicts import CONTROL_ADDED
from .workload import build, load_tokenizer, read_text

CHILD_DIR = Path(__file__).with_name("engine_child")
CHILD = CHILD_DIR / "main.py"  # run by path: its own directory, first on sys.path, holds its modules
RESULT_TAG = "GRAPHFIX_ENGINE_RESULT "


def run_arm(arm: str, spec: dict[str, Any], hang_timeout: float, log_dir: str, label: str,
            patched: str | None = None) -> dict[str, Any]:
    """One engine process for ``arm``, killed ``hang_timeout`` s after its own faulthandler exit was due;
    its result line, or the error and the tail of its log."""
    spec = dict(spec, no_upload=arm == "pre-697")
    spec_path = os.path.join(log_dir, f"{label}.spec.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    log_path = os.path.join(log_dir, f"{label}.log")
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run([sys.executable, str(CHILD), spec_path], stdout=subprocess.PIPE, stderr=log,
                                  text=True, env=arm_env(arm, patched), timeout=hang_timeout + 60)
            code, stdout, why = proc.returncode, proc.stdout, f"engine process exited {proc.returncode}"
        except subprocess.TimeoutExpired as exc:  # the child's own faulthandler exit did not fire
            code, stdout, why = None, "", f"engine process killed after {exc.timeout:.0f} s"
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_TAG)]
    with open(log_path, errors="replace") as fh:
        tail = fh.read().strip().splitlines()[-3:]  # stderr's: where a traceback ends
    with open(log_path, "a") as log:  # FreeToken logs to stdout: keep it with the process's stderr
        log.writelines(ln + "\n" for ln in stdout.splitlines() if not ln.startswith(RESULT_TAG))
    if code != 0 or not lines:
        return {"arm": arm, "error": f"{why}: " + " | ".join(tail), "log": log_path}
    result = json.loads(lines[-1][len(RESULT_TAG):])
    result.update(arm=arm, log=log_path)
    return result


def holds_wait(r: dict[str, Any]) -> bool:
    """Whether this run's decode graphs held a WAIT the host releases after the launch: the disk PLE
    table in CUDA wait-sync mode, its WAIT captured (on HIP the fill worker releases it before the
    launch). The table's fill worker alone does not say HIP: the patch series creates it on CUDA too;
    records from before ``hip`` was recorded ran FreeToken's worker on HIP only."""
    return bool(r["wait_sync"] and r["captured_waits"] and not r.get("hip", r["fill_worker"]))


def arm_problems(arm: str, r: dict[str, Any], wait_case: bool, expects_wait: bool = True) -> list[str]:
    """What makes this arm's run no proof of anything, whatever its figures say. ``wait_case``: the
    model's graphs hold a host-released WAIT (as found by the runs); ``expects_wait``: its config says
    they should."""
    out = []
    if arm == GATE:
        if r["wait_sync"] or r["captured_waits"] or r["steps"]["graph"] == 0:
            out.append(f"the gate arm did not decode on graphs without a WAIT (wait-sync {r['wait_sync']}, "
                       f"{r['captured_waits']} WAITs, steps {r['steps']})")
    elif expects_wait and not holds_wait(r):
        out.append(f"PLE table {r['table']} is not in CUDA wait-sync mode: no WAIT to protect")
    elif wait_case and (r["captured_waits"] < len(r["graph_bs"]) or r["steps"]["graph"] == 0):
        out.append(f"decode did not run on graphs holding the WAIT ({r['captured_waits']} WAITs, steps {r['steps']})")
    elif r["steps"]["graph"] == 0:
        out.append(f"decode never ran on a CUDA graph (steps {r['steps']}): nothing was measured")
    if "replay_error" in r:
        out.append(f"timing the graphs' replays failed: {r['replay_error']}")
    if "copies_error" in r:
        out.append(r["copies_error"] + " (run with --copies 0)")
    shim = r["shim"]
    if arm in PATCHED_ARMS:
        if not r.get("freetoken_patched"):
            out.append(f"the engine did not run the patched FreeToken (it ran {r.get('freetoken_file')})")
    elif r.get("freetoken_patched"):
        out.append(f"the installed FreeToken carries the patch series, so the {arm} arm measures it, not 0.2.1: "
                   "revert it (patch revert --site) and compare the series through the patched arms")
    if arm in SHIM_ARMS:
        if shim is None or shim["mode"] != arm or not shim["patched"]:
            out.append(f"the shim did not reach the engine process in mode {arm} "
                       f"({'not loaded' if shim is None else shim['reason']}): is freetoken-graphfix installed in "
                       f"this interpreter's site-packages, so that its .pth bootstrap runs? see doctor")
        else:
            want = SHIM_ACTION[arm] if wait_case or arm == "upload" else "no-op"
            actions = [g["action"] for p in shim["passes"] for g in p["graphs"]]
            if set(actions) != {want}:
                out.append(f"expected action {want} for every graph, got {actions}")
    elif shim is not None and shim["installed"]:
        out.append(f"the shim was loaded in the {arm} arm ({config.ENV_MODE} leaked into its environment)")
    return out


def wait_case_of(runs: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether the model's graphs held a host-released WAIT in any run (gate's never do)."""
    return any(holds_wait(r) for arm, rs in runs.items() if arm != GATE for r in rs if "error" not in r)


def engine_record(case: Case, settings: EngineSettings, log_dir: str) -> dict[str, Any]:
    """Run every arm on ``case``'s model, ``settings.rounds`` times in rotated order, then ``settings.trace_runs``
    more per arm traced (never more than the rounds). An unrecorded warm-up run goes first: the first
    engine on a machine compiles FreeToken's triton and JIT kernels into their caches, and no arm
    should pay for that."""
    patched = patched_freetoken(settings.arms, log_dir)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in settings.arms}
    traced: dict[str, list[dict[str, Any]]] = {arm: [] for arm in settings.arms}
    name = case.label.replace(" ", "")
    with case.model_dir(log_dir) as model_dir:
        prompts = build(load_tokenizer(model_dir), settings.context, read_text(settings.prompt_file))
        spec = {"model_dir": model_dir, "ft_args": list(case.target.ft_args), "decode_steps": settings.decode_steps,
                "prompts": {p.name: p.ids for p in prompts.values()}, "pair": case.target.max_running >= 2,
                "replays": settings.replays, "copies": settings.copies,
                "control": CONTROL_ADDED if settings.copies else 0, "watchdog_s": settings.watchdog,
                "hang_timeout_s": settings.hang_timeout}
        if settings.warmup:  # the patched copy is another path: its JIT kernels may be compiled again
            for arm in ("upstream", *(["patched"] if patched else [])):
                warm = run_arm(arm, spec, settings.hang_timeout, log_dir, f"{name}-warmup-{arm}", patched)
                print(f"engine {case.label} warm-up run ({arm}): {one_line(warm)}", file=sys.stderr, flush=True)
        trace_runs = min(settings.trace_runs, settings.rounds) if settings.trace_steps else 0
        order = [(r, arm, False) for r in range(settings.rounds) for arm in rotated(settings.arms, r)]
        order += [(r, arm, True) for r in range(trace_runs) for arm in rotated(settings.arms, r)]
        for rnd, arm, is_traced in progress(order, len(order), f"engine arms ({case.label})"):
            label = f"{name}-{arm}-" + (f"traced{rnd}" if is_traced else f"r{rnd}")
            if is_traced:
                path = os.path.join(log_dir, f"{label}.trace.json")
                spec_traced = dict(spec, trace={"path": path, "steps": settings.trace_steps})
                res = run_arm(arm, spec_traced, settings.hang_timeout, log_dir, label, patched)
                traced[arm].append(timeline_of(res, path))
            else:
                res = run_arm(arm, spec, settings.hang_timeout, log_dir, label, patched)
                runs[arm].append(res)
            print(f"engine {case.label} {label}: {one_line(res)}", file=sys.stderr, flush=True)
    env = environment()
    env.pop("freetoken", None)  # reported by the engine processes themselves
    return {"model": case.target.describe(), "label": case.label, "layers": case.layers,
            "ft_args": list(case.target.ft_args), "context": settings.context, "decode_steps": settings.decode_steps,
            "rounds": settings.rounds, "copies": settings.copies, "env": env, "expects_wait": case.target.expects_wait,
            "runs": runs, "traced": traced, "command": settings.command,
            **judge(runs, traced, case.target.expects_wait)}


def judge(runs: dict[str, list[dict[str, Any]]], traced: dict[str, Any], expects_wait: bool) -> dict[str, Any]:
    """The record's verdict part, by the current rules, from its raw runs alone (so a saved record can
    be judged again): which case the runs found (a host-released WAIT or none), every run's problems
    (written into it) and the figures. ``traced`` holds each arm's traced timelines; a record of an
    earlier release holds one per arm, not a list."""
    traced = {arm: t if isinstance(t, list) else [t] for arm, t in traced.items()}
    wait_case = wait_case_of(runs)
    for arm, rs in runs.items():
        for r in rs:
            if "error" not in r:
                r["problems"] = arm_problems(arm, r, wait_case, expects_wait)
    return {"wait_case": wait_case, "summary": summarise(runs, traced, wait_case)}


def timeline_of(res: dict[str, Any], path: str) -> dict[str, Any]:
    """The traced run's kernel timeline and tokens (its trace file read, then removed: traces are large)."""
    if "error" in res:
        return {"note": "traced run failed: " + res["error"]}
    try:
        return {**decode_timeline(path, res["launch_bs"]), "token_ids": res.get("token_ids")}
    except (OSError, ValueError, KeyError) as exc:
        return {"note": f"trace unreadable: {exc!r}"}
    finally:
        if os.path.exists(path):
            os.unlink(path)


def one_line(r: dict[str, Any]) -> str:
    if "error" in r:
        return "ERROR " + r["error"]
    if "launch_bs" in r:
        return f"traced {len(r.get('launch_bs', []))} graph launches"
    replay = {bs: round(statistics.median(v), 4) for bs, v in r.get("replay_gpu_ms", {}).items() if v}
    return (f"fires {len(r['fires'])}, first launch {fmt_ms(r['first_launch_ms'])} ms, replay GPU median {replay} ms, "
            f"hash {r['token_hash']}, build {r['build_s']:.1f} s")


def fmt_ms(per_bs: dict[str, float]) -> str:
    return " ".join(f"{v:.2f}" for _, v in sorted(per_bs.items(), key=lambda kv: -int(kv[0])))


def failures(record: dict[str, Any]) -> list[str]:
    """The safety targets: every protected arm ran cleanly, never blocked, matched the reference's
    tokens (upstream's, or gate's on a FreeToken that does not upload), and gave the same tokens with
    copies in its decode loop as its traced processes, which launch only the engine's own graphs."""
    out = []
    arms = record["summary"]["arms"]
    for arm, s in arms.items():
        out += [f"{arm}: {e}" for e in s["errors"]]
        if s["protected"] and s["fires"]:
            out.append(f"{arm}: the watchdog released {s['fires']} blocked launch(es)")
        if s["protected"] and arm != s["reference"] and not s["same_tokens_as_reference"]:
            if s["reference"] in arms:
                out.append(f"{arm}: tokens {s['hashes']} differ from {s['reference']}'s")
            else:
                out.append(f"{arm}: no {s['reference']} arm to compare tokens with (this FreeToken uploads no "
                           f"graph, so upstream is unprotected: add --arms {GATE})")
        if s["protected"] and s["copies_tokens"] == "DIFF":
            out.append(f"{arm}: the decode loop with copies gave other tokens than its traced run (own graphs only)")
    return out


def default_arms(expects_wait: bool) -> list[str]:
    """``--arms`` left out: upstream, pre-697 and auto, and where the graphs hold the WAIT deferred too
    (auto and deferred then run the same never-uploaded graphs: the A/A control)."""
    return list(WAIT_DEFAULT_ARMS if expects_wait else DEFAULT_ARMS)


def add_arguments(group: Any) -> None:
    """``bench``'s ``--engine`` options (the model and workload options are shared with ``--serve``)."""
    group.add_argument("--engine", action="store_true", help="run the real-engine comparison")
    group.add_argument("--arms", nargs="+", choices=ARMS, metavar="ARM",
                       help=f"arms, of: {', '.join(ARMS)} (default: {' '.join(DEFAULT_ARMS)}, and deferred where the "
                            "graphs hold the WAIT; patched runs the patch series)")
    group.add_argument("--rounds", type=positive, default=4,
                       help="runs of every arm, each in its own process, in rotated order: the samples of every "
                            "cross-process ratio (default 4)")
    group.add_argument("--copies", type=non_negative, default=4,
                       help="fresh executables of each engine graph per process, as many uploaded and never "
                            "uploaded, launched in turn with the engine's own in its decode loop: the "
                            "upload measured inside one process (0: off; default 4)")
    group.add_argument("--replays", type=positive, default=50,
                       help="timed replays of each executable (the engine's graph, each copy) from an idle GPU, "
                            "after the workload: a diagnostic (default 50)")
    group.add_argument("--trace-steps", type=non_negative, default=24,
                       help="decode steps per request of each traced run (0: no kernel timeline; default 24)")
    group.add_argument("--trace-runs", type=positive, default=2,
                       help="traced processes per arm, at most --rounds (default 2)")
    group.add_argument("--no-warmup", dest="warmup", action="store_false",
                       help="no unrecorded warm-up run (kernel compilation then lands on the first arm)")
    group.add_argument("--hang-timeout", type=seconds, default=300.0,
                       help="seconds before an engine process is killed (default 300)")
