"""``bench engine``'s running: every arm in FreeToken's real offline engine, same model, #775's workload.

Each arm runs the real engine (``freetoken.llm.LLM``: Scheduler, Engine, GraphRunner) in a fresh
process (``child/main.py``), built from FreeToken's own ``ft serve`` options, on the synthetic
qwen4_exp of ``model`` or the user's ``--model``. Shim arms get ``FT_GRAPH_UPLOAD`` in that
process's environment and nothing else: the package's ``.pth`` bootstrap must bring the shim in,
as on a user's machine. The never-uploaded arms (``no-upload``: FreeToken's upload removed, and
``skip``) are the base of every ratio and, on a model whose graphs hold a host-released WAIT, the
negative control: on a large enough model their first launches block. ``gate`` is FreeToken's own
escape hatch (``FREETOKEN_PLE_SYNC=gate``: the fill before the launch, no WAIT in the graph): on
FreeToken 0.1.3, which uploads nothing, upstream is itself unprotected and gate's tokens are the
reference.

Per round every arm runs once, in rotated order. What each figure answers is ``figures``'s docstring.
The kernel timeline comes from more processes per arm (``--trace-runs``) that initialise CUPTI before
their capture and trace a short run of the same workload; no timed process is ever traced.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from freetoken_graphfix.tools import child

from ..arms import NO_UPLOAD, PATCHED, UPSTREAM, arm_env, patched_freetoken
from ..cases import Case
from ..record_files import RecordError, build
from ..records import EngineCase, EngineProcess, Environment, TracedRun, largest_first
from ..running import progress, rotated
from ..settings import EngineSettings
from ..timeline import decode_timeline
from ..verdicts import CONTROL_ADDED
from ..workload import build as build_prompts
from ..workload import load_tokenizer, read_text

CHILD_DIR = Path(__file__).with_name("child")
CHILD = CHILD_DIR / "main.py"  # run by path: its own directory, first on sys.path, holds its modules


def run_arm(arm: str, spec: dict[str, Any], hang_timeout: float, log_dir: str, label: str,
            patched: str | None = None) -> EngineProcess:
    """One engine process for ``arm``, killed ``hang_timeout`` s after its own faulthandler exit was due;
    its result, or the error and the tail of its log."""
    log_path = os.path.join(log_dir, f"{label}.log")
    try:  # killed a minute after the child's own faulthandler exit was due
        found = child.run([sys.executable, str(CHILD)], log=log_path, timeout=hang_timeout + 60,
                          env=arm_env(arm, patched), spec=dict(spec, no_upload=arm == NO_UPLOAD), tail=3)
    except child.ChildError as exc:
        return EngineProcess(arm, log_path, error=f"engine process {exc}")
    try:
        return build(EngineProcess, {**found, "arm": arm, "log": log_path}, f"the {arm} process's result")
    except RecordError as exc:
        return EngineProcess(arm, log_path, error=f"its result cannot be read: {exc}")


def engine_case(case: Case, settings: EngineSettings, log_dir: str) -> EngineCase:
    """Run every arm on ``case``'s model, ``settings.rounds`` times in rotated order, then ``settings.trace_runs``
    more per arm traced (never more than the rounds). An unrecorded warm-up run goes first: the first
    engine on a machine compiles FreeToken's triton and JIT kernels into their caches, and no arm
    should pay for that."""
    patched = patched_freetoken(settings.arms, log_dir)
    runs: dict[str, list[EngineProcess]] = {arm: [] for arm in settings.arms}
    traced: dict[str, list[TracedRun]] = {arm: [] for arm in settings.arms}
    name = case.label.replace(" ", "")
    with case.model_dir(log_dir) as model_dir:
        prompts = build_prompts(load_tokenizer(model_dir), settings.context, read_text(settings.prompt_file))
        spec = {"model_dir": model_dir, "ft_args": list(case.target.ft_args), "decode_steps": settings.decode_steps,
                "prompts": {p.name: p.ids for p in prompts.values()}, "pair": case.target.max_running >= 2,
                "replays": settings.replays, "copies": settings.copies,
                "control": CONTROL_ADDED if settings.copies else 0, "watchdog_s": settings.watchdog,
                "hang_timeout_s": settings.hang_timeout}
        if settings.warmup:  # the patched copy is another path: its JIT kernels may be compiled again
            for arm in (UPSTREAM, *([PATCHED] if patched else [])):
                warm = run_arm(arm, spec, settings.hang_timeout, log_dir, f"{name}-warmup-{arm}", patched)
                print(f"engine {case.label} warm-up run ({arm}): {one_line(warm)}", file=sys.stderr, flush=True)
        trace_runs = min(settings.trace_runs, settings.rounds) if settings.trace_steps else 0
        order = [(r, arm, False) for r in range(settings.rounds) for arm in rotated(settings.arms, r)]
        order += [(r, arm, True) for r in range(trace_runs) for arm in rotated(settings.arms, r)]
        for rnd, arm, is_traced in progress(order, len(order), f"engine arms ({case.label})"):
            label = f"{name}-{arm}-" + (f"traced{rnd}" if is_traced else f"r{rnd}")
            if is_traced:
                path = os.path.join(log_dir, f"{label}.trace.json")
                res = run_arm(arm, dict(spec, trace={"path": path, "steps": settings.trace_steps}),
                              settings.hang_timeout, log_dir, label, patched)
                traced[arm].append(timeline_of(res, path))
            else:
                res = run_arm(arm, spec, settings.hang_timeout, log_dir, label, patched)
                runs[arm].append(res)
            print(f"engine {case.label} {label}: {one_line(res)}", file=sys.stderr, flush=True)
    env = dataclasses.replace(Environment.here(), freetoken=None)  # the engine processes report their own
    return EngineCase(case.target.describe(), case.label, case.layers, list(case.target.ft_args), settings.context,
                      settings.decode_steps, settings.rounds, case.target.expects_wait, runs, traced, settings.copies,
                      env, settings.command)


def timeline_of(res: EngineProcess, path: str) -> TracedRun:
    """The traced run's kernel timeline and tokens (its trace file read, then removed: traces are large)."""
    if not res.ok:
        return TracedRun("traced run failed: " + str(res.error))
    try:
        return dataclasses.replace(decode_timeline(path, res.launch_bs), token_ids=res.token_ids or None)
    except (OSError, ValueError, KeyError) as exc:
        return TracedRun(f"trace unreadable: {exc!r}")
    finally:
        if os.path.exists(path):
            os.unlink(path)


def one_line(r: EngineProcess) -> str:
    """A finished process's progress line: enough to see a blocked or broken arm while the run goes on."""
    if not r.ok:
        return "ERROR " + str(r.error)
    if r.launch_bs:
        return f"traced {len(r.launch_bs)} graph launches"
    replay = {bs: round(statistics.median(v), 4) for bs, v in r.replay_gpu_ms.items() if v}
    first = " ".join(f"{r.first_launch_ms[bs]:.2f}" for bs in largest_first(r.first_launch_ms))
    return (f"fires {len(r.fires)}, first launch {first} ms, replay GPU median {replay} ms, "
            f"hash {r.token_hash}, build {r.build_s:.1f} s")
