"""``bench --engine``: every mode in FreeToken's real offline engine, same model, #775's workload.

Each arm runs the real engine (``freetoken.llm.LLM``: Scheduler, Engine, GraphRunner) in a fresh
process (``_engine_child.py``), built from FreeToken's own ``ft serve`` options, on the synthetic
qwen4_exp of ``model`` or the user's ``--model``. Shim arms get ``FT_GRAPH_UPLOAD`` in that
process's environment and nothing else: the package's ``.pth`` bootstrap must bring the shim in,
as on a user's machine. The never-uploaded arms (``pre-697``: FreeToken's upload removed, and
``skip``) are the base of every ratio and, on a model whose graphs hold a host-released WAIT, the
negative control: on a large enough model their first launches block. ``gate`` is FreeToken's own
escape hatch (``FREETOKEN_PLE_SYNC=gate``: the fill before the launch, no WAIT in the graph): on
FreeToken 0.1.3, which uploads nothing, upstream is itself unprotected and gate's tokens are the
reference.

Per round every arm runs once, in rotated order; ratios are per round (paired) with two standard
errors over rounds. Separate processes of one build replay up to ~8% apart on the H200, so each
timed process also replays, after the workload, fresh executables of each of its engine graphs
(``--copies``: as many uploaded as never uploaded) in rotated order with the engine's own: their
ratio is the upload itself, and the engine graph over its never-uploaded copies compares arms with
the process's own speed divided out. The kernel timeline comes from one more process per arm that initialises CUPTI
before its capture and traces a short run of the same workload; no timed process is ever traced.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import config, patching
from .common import Case, environment, non_negative, positive, progress, rotated, seconds
from .cupti import decode_timeline
from .stats import geometric_mean, instance_medians, paired_ratio, summary
from .workload import build, load_tokenizer, read_text

CHILD = Path(__file__).with_name("_engine_child.py")
RESULT_TAG = "GRAPHFIX_ENGINE_RESULT "
SHIM_ACTION = {"auto": "deferred", "upload": "upload", "warm": "warm", "deferred": "deferred", "skip": "exposed"}
SHIM_ARMS = tuple(SHIM_ACTION)  # FT_GRAPH_UPLOAD=<arm>, and the action the shim must take on a WAIT graph
PATCHED_ARMS = ("patched",)  # FreeToken with patches/ applied: a patched copy first on PYTHONPATH
GATE = "gate"  # FREETOKEN_PLE_SYNC=gate; every other arm runs wait-sync
ARMS = ("upstream", "pre-697", GATE, *SHIM_ARMS, *PATCHED_ARMS)
DEFAULT_ARMS = ("upstream", "pre-697", "auto")
PROTECTED = ("auto", "upload", "warm", "deferred", "patched", GATE)  # never block, same tokens
NEVER_UPLOADED = ("pre-697", "skip")  # unprotected and never uploaded: the negative control
RESOLUTION = 0.005  # the 95% interval's half-width a ratio needs to resolve #775's 1-2%


def arm_env(arm: str, patched: str | None = None) -> dict[str, str]:
    """The engine (or server) process's environment: the user's, with ``FREETOKEN_PLE_SYNC`` set to
    wait-sync (gate for the gate arm: the WAIT must be in every other arm's graphs, whatever the user
    set), ``FT_GRAPH_UPLOAD`` only for shim arms, and for the patched arm the patched FreeToken
    (``patched``) first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k != config.ENV_MODE}
    env["FREETOKEN_PLE_SYNC"] = "gate" if arm == GATE else "wait"
    if arm in SHIM_ARMS:
        env[config.ENV_MODE] = arm
    elif arm in PATCHED_ARMS:
        if patched is None:
            raise ValueError(f"arm {arm!r} needs the patched FreeToken (patching.patched_copy)")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (patched, os.environ.get("PYTHONPATH")) if p)
    return env


def patched_freetoken(arms: list[str], log_dir: str) -> str | None:
    """The folder to put first on ``PYTHONPATH`` for the patched arms (a patched copy of the
    installed FreeToken under ``log_dir``), ``None`` when no patched arm runs."""
    if not any(arm in PATCHED_ARMS for arm in arms):
        return None
    return str(patching.patched_copy(Path(log_dir) / "patched-freetoken"))


def run_arm(arm: str, spec: dict[str, Any], opts: argparse.Namespace, log_dir: str, label: str,
            patched: str | None = None) -> dict[str, Any]:
    """One engine process for ``arm``; its result line, or the error and the tail of its log."""
    spec = dict(spec, no_upload=arm == "pre-697")
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
    table in CUDA wait-sync mode, its WAIT captured (FreeToken's fill worker means HIP, which releases
    before the launch)."""
    return bool(r["wait_sync"] and r["captured_waits"] and not r["fill_worker"])


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


def engine_record(case: Case, opts: argparse.Namespace, log_dir: str) -> dict[str, Any]:
    """Run every arm on ``case``'s model, ``opts.rounds`` times in rotated order, then once more per
    arm traced. An unrecorded warm-up run goes first: the first engine on a machine compiles
    FreeToken's triton and JIT kernels into their caches, and no arm should pay for that."""
    patched = patched_freetoken(opts.arms, log_dir)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in opts.arms}
    traced: dict[str, dict[str, Any]] = {}
    name = case.label.replace(" ", "")
    with case.model_dir(log_dir) as model_dir:
        prompts = build(load_tokenizer(model_dir), opts.context, read_text(opts.prompt_file))
        spec = {"model_dir": model_dir, "ft_args": list(case.target.ft_args), "decode_steps": opts.decode_steps,
                "prompts": {p.name: p.ids for p in prompts.values()}, "pair": case.target.max_running >= 2,
                "replays": opts.replays, "copies": opts.copies, "watchdog_s": opts.watchdog,
                "hang_timeout_s": opts.hang_timeout}
        if opts.warmup:  # the patched copy is another path: its JIT kernels may be compiled again
            for arm in ("upstream", *(["patched"] if patched else [])):
                warm = run_arm(arm, spec, opts, log_dir, f"{name}-warmup-{arm}", patched)
                print(f"engine {case.label} warm-up run ({arm}): {one_line(warm)}", file=sys.stderr, flush=True)
        order = [(r, arm) for r in range(opts.rounds) for arm in rotated(opts.arms, r)]
        order += [(None, arm) for arm in (opts.arms if opts.trace_steps else ())]
        for rnd, arm in progress(order, len(order), f"engine arms ({case.label})"):
            label = f"{name}-{arm}-" + (f"r{rnd}" if rnd is not None else "traced")
            if rnd is None:
                path = os.path.join(log_dir, f"{label}.trace.json")
                res = run_arm(arm, dict(spec, trace={"path": path, "steps": opts.trace_steps}), opts, log_dir,
                              label, patched)
                traced[arm] = timeline_of(res, path)
            else:
                res = run_arm(arm, spec, opts, log_dir, label, patched)
                runs[arm].append(res)
            print(f"engine {case.label} {label}: {one_line(res)}", file=sys.stderr, flush=True)
    env = environment()
    env.pop("freetoken", None)  # reported by the engine processes themselves
    return {"model": case.target.describe(), "label": case.label, "layers": case.layers,
            "ft_args": list(case.target.ft_args), "context": opts.context, "decode_steps": opts.decode_steps,
            "rounds": opts.rounds, "env": env, "expects_wait": case.target.expects_wait,
            "runs": runs, "traced": traced, "command": getattr(opts, "command", ""),
            **judge(runs, traced, case.target.expects_wait)}


def judge(runs: dict[str, list[dict[str, Any]]], traced: dict[str, dict[str, Any]],
          expects_wait: bool) -> dict[str, Any]:
    """The record's verdict part: which case the runs found (a host-released WAIT or none), every
    run's problems (written into it) and the per-arm summary."""
    wait_case = wait_case_of(runs)
    for arm, rs in runs.items():
        for r in rs:
            if "error" not in r:
                r["problems"] = arm_problems(arm, r, wait_case, expects_wait)
    return {"wait_case": wait_case, "summary": summarise(runs, traced, wait_case),
            "upload_copies": uploaded_copies(runs)}


def against_copies(r: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per bs of one process: its engine graph and its uploaded copies, each over the mean of the
    never-uploaded copies of that graph (their medians), all replayed in rotated order in that process."""
    out = {}
    for bs, copied in r.get("copies_gpu_ms", {}).items():
        never = statistics.fmean(instance_medians(copied["never"]))
        out[bs] = (statistics.median(r["replay_gpu_ms"][bs]) / never,
                   statistics.fmean(instance_medians(copied["uploaded"])) / never)
    return out


def uploaded_copies(runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[float]]:
    """Per bs, the upload's cost on this GPU and model, measured in every process of every arm alike
    (copies are made the same way whatever the arm): uploaded copies over never-uploaded ones,
    geometric mean over processes, its relative SE, the number of processes and of copies of each kind."""
    per_bs: dict[str, list[tuple[float, int]]] = {}  # (uploaded over never, copies of each kind) per process
    for r in (r for rs in runs.values() for r in rs if "error" not in r):
        for bs, (_, uploaded) in against_copies(r).items():
            per_bs.setdefault(bs, []).append((uploaded, len(r["copies_gpu_ms"][bs]["never"])))
    return {bs: [*geometric_mean([u for u, _ in per_bs[bs]]), len(per_bs[bs]), min(n for _, n in per_bs[bs])]
            for bs in sorted(per_bs, key=lambda bs: -int(bs))}


def own_rounds(runs: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Per bs (largest first), each round's engine graph over the never-uploaded copies of it in its
    own process: the process's own speed divides out (on the H200, a band of tenths of a percent where
    separate processes are up to 8% apart)."""
    per_round = [against_copies(r) for r in runs]
    sizes = sorted({bs for c in per_round for bs in c}, key=lambda bs: -int(bs))
    return {bs: [c[bs][0] if bs in c else None for c in per_round] for bs in sizes}


def timeline_of(res: dict[str, Any], path: str) -> dict[str, Any]:
    """The traced run's kernel timeline (its trace file read, then removed: traces are large)."""
    if "error" in res:
        return {"note": "traced run failed: " + res["error"]}
    try:
        return decode_timeline(path, res["launch_bs"])
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


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def by_bs(runs: list[dict[str, Any]], key: str) -> dict[str, list[float | None]]:
    """Per batch size (largest first), each round's median of ``key`` (``None`` where a round has none)."""
    sizes = sorted({bs for r in runs for bs, v in r.get(key, {}).items() if v}, key=lambda bs: -int(bs))
    return {bs: [statistics.median(r[key][bs]) if r.get(key, {}).get(bs) else None for r in runs] for bs in sizes}


def ratios(arm: dict[str, list[float | None]], base: dict[str, list[float | None]]) -> dict[str, list[float]]:
    """Per bs the paired ratio to the base arm over rounds and its relative standard error."""
    return {bs: list(paired_ratio(values, base[bs])) for bs, values in arm.items() if bs in base}


def upstream_protects(runs: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether the FreeToken under test protects its graphs itself (0.2.x's ``_upload_graph``; 0.1.3
    has none, so there upstream is one more negative control and gate's tokens are the reference)."""
    good = [r for rs in runs.values() for r in rs if "error" not in r]
    return not good or any(r.get("freetoken_uploads", True) for r in good)  # no run: nothing says otherwise


def summarise(runs: dict[str, list[dict[str, Any]]], traced: dict[str, dict[str, Any]],
              wait_case: bool) -> dict[str, Any]:
    """Per arm, over its rounds; GPU times compared with the never-uploaded arm round by round. On a
    model without a host-released WAIT nothing needs protection: every arm is held to upstream's
    tokens and to never blocking."""
    out: dict[str, Any] = {}
    reference = "upstream" if upstream_protects(runs) else GATE
    expected = {r["token_hash"] for r in runs.get(reference, []) if "error" not in r}
    for arm, rs in runs.items():
        good = [r for r in rs if "error" not in r]
        step = by_bs(good, "step_gpu_ms")
        out[arm] = {
            "protected": not wait_case or arm in PROTECTED or (arm == "upstream" and reference == "upstream"),
            "errors": [r["error"] for r in rs if "error" in r] + [p for r in good for p in r["problems"]],
            "fires": sum(len(r["fires"]) for r in good),
            "hashes": sorted({r["token_hash"] for r in good}),
            "distinct_tokens": min((r["distinct_tokens"] for r in good), default=None),
            "reference": reference,
            "same_tokens_as_reference": bool(expected) and {r["token_hash"] for r in good} == expected,
            "first_launch_ms": {bs: max(r["first_launch_ms"][bs] for r in good) for bs in
                                (good[0]["first_launch_ms"] if good else {})},
            "upload_ms_per_graph": median([u for r in good for u in r["upload_ms"]]),
            "capture_ms": median([sum(r["capture_ms"]) for r in good]),
            "free_mib_after_capture": median([r["free_mib_after_capture"] for r in good]),
            "first_launch_mib": {bs: median([r["first_launch_free_mib"][bs][0] - r["first_launch_free_mib"][bs][1]
                                             for r in good if len(r["first_launch_free_mib"].get(bs, [])) == 2])
                                 for bs in (good[0]["first_launch_free_mib"] if good else {})},
            "step_gpu_ms": {bs: summary([x for r in good for x in r["step_gpu_ms"].get(bs, [])], (25, 75))
                            for bs in step},
            "step_rounds": step,
            "graph_rounds": by_bs(good, "graph_gpu_ms"),
            "replay_rounds": by_bs(good, "replay_gpu_ms"),
            "copies_rounds": own_rounds(good),
            "timeline": traced.get(arm, {}),
        }
    base_arm = next((a for a in (*NEVER_UPLOADED, "upstream") if a in out and
                     (not out[a]["protected"] or a in NEVER_UPLOADED)), None)
    for rec in out.values():
        rec["tok_s"] = {bs: 1e3 * int(bs) / q["median"] for bs, q in rec["step_gpu_ms"].items() if q["n"]}
        rec["base"] = base_arm
        for key in ("step", "graph", "replay", "copies"):
            rec[f"{key}_vs_never_uploaded"] = ratios(rec[f"{key}_rounds"], out[base_arm][f"{key}_rounds"]) \
                if base_arm else {}
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


def add_arguments(group: Any) -> None:
    """``bench``'s ``--engine`` options (the model and workload options are shared with ``--serve``)."""
    group.add_argument("--engine", action="store_true", help="run the real-engine comparison")
    group.add_argument("--arms", nargs="+", choices=ARMS, metavar="ARM",
                       help=f"arms, of: {', '.join(ARMS)} (default: {' '.join(DEFAULT_ARMS)}; patched runs the "
                            "patch series)")
    group.add_argument("--rounds", type=positive, default=4,
                       help="runs of every arm, each in its own process, in rotated order: the samples of every "
                            "ratio's band (default 4)")
    group.add_argument("--replays", type=positive, default=50,
                       help="timed replays of each executable (the engine's graph, each copy) from an idle GPU, "
                            "after the workload (default 50)")
    group.add_argument("--copies", type=non_negative, default=4,
                       help="fresh executables of each engine graph per process, as many uploaded and never "
                            "uploaded, replayed in rotated order with the engine's own: the upload measured "
                            "inside one process (0: off; default 4)")
    group.add_argument("--trace-steps", type=non_negative, default=24,
                       help="decode steps per request of the traced run, a process per arm (0: no kernel "
                            "timeline; default 24)")
    group.add_argument("--no-warmup", dest="warmup", action="store_false",
                       help="no unrecorded warm-up run (kernel compilation then lands on the first arm)")
    group.add_argument("--hang-timeout", type=seconds, default=300.0,
                       help="seconds before an engine process is killed (default 300)")
