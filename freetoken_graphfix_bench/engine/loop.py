"""The upload measured inside the decode loop of one engine process, free of process noise.

Each timed engine process (``engine/child/``) launches, step by step, its graph's own executable
and fresh copies of the same graph, as many uploaded as never uploaded, in the engine's own slot:
the same kernels on the same memory with the same inputs, the WAIT released by the step's own fill.
A cycle holds one launch of each executable, a few steps apart, laid out so that each kind sits
at the same mean position (``loop_schedule``), so whatever moves the process's speed (its host
level, the context growing a token a step) is shared by neighbouring launches and divides out: each
launch is taken relative to the mean of the cycle's length of launches around it. Each executable's
median over its launches is one sample, so a band counts both the steps' noise and how far
separately instantiated executables of one graph run apart.

What it cannot see: every launch here follows another executable, while the engine relaunches its
own graph after itself, and on the H200 a relaunch ran faster (1% on a 16-layer llama's graph,
11-13% on the 48-layer qwen4_exp's, where the WAIT ties the step to the host). An effect of the
upload that shows only on relaunch is left to the cross-process figures.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..records import EngineProcess, largest_first
from ..stats import t975

METRICS = (("step", "step_gpu_ms", "GPU time per decode step"),
           ("launch", "launch_gpu_ms", "GPU time of the graph launch"))


def executable_means(times: list[float], labels: list[str]) -> tuple[dict[str, float], int]:
    """Per executable, the median of its launches' log-times, each relative to the mean of the cycle's
    length of launches centred on it (with the schedule's fixed order that window holds every
    executable once, and a drift linear over it drops out exactly), and the number of whole cycles.
    A launch without a whole window around it (at either end) is left out; the median outvotes the
    few launches around a switch of host level."""
    width = len(set(labels))
    half = width // 2
    logs = [math.log(t) if t > 0 else math.nan for t in times]
    rel: dict[str, list[float]] = {}
    for k in range(half, len(logs) - half):
        window = logs[k - half:k + half + 1]
        if not any(math.isnan(v) for v in window):
            rel.setdefault(labels[k], []).append(logs[k] - statistics.fmean(window))
    return {label: statistics.median(v) for label, v in rel.items()}, len(labels) // width


@dataclass(frozen=True)
class Effect:
    """One process's in-loop figures at one bs, as log-ratios to its never-uploaded copies, with the
    squared deviations of the copies from their kind's mean and their degrees of freedom."""

    upload: float  # uploaded copies over never-uploaded ones
    own: float  # the engine's own graph over the never-uploaded copies
    ss: float
    df: int
    uploaded: int
    never: int
    cycles: int
    control: float | None = None  # the positive control over the never-uploaded copies
    controls: int = 0
    added: float = math.nan  # what the control's spin added to a never-uploaded launch


@dataclass(frozen=True)
class LoopFigure:
    """``upload``, ``own`` or ``control`` over processes: the ratio (geometric mean over processes), its
    relative standard error from the copies' spread pooled over every process, the standard error over
    processes, and the 95% half-width the verdict uses (``combine``)."""

    ratio: float
    se: float
    df: int
    se_processes: float
    half: float
    processes: int
    per_process: list[float]
    copies: int
    cycles: int
    added: float = math.nan  # the control's: what its spin added, averaged over processes


def process_effect(r: EngineProcess, key: str, bs: str) -> Effect | None:
    """One process's figures at ``bs``: uploaded copies over never-uploaded ones, its own graph over the
    never-uploaded copies and, where it ran one, the positive control over them (with the fraction its
    spin added to a never-uploaded launch). ``None`` where the process ran no copies in the loop (an
    older record, ``--copies 0``)."""
    labels, times = r.step_exec.get(bs), getattr(r, key).get(bs)
    if not labels or not times or len(labels) != len(times):
        return None
    means, cycles = executable_means(times, labels)
    up = [v for label, v in means.items() if label.startswith("uploaded")]
    never = [v for label, v in means.items() if label.startswith("never")]
    if not up or not never or "own" not in means:
        return None
    ss = sum((v - statistics.fmean(g)) ** 2 for g in (up, never) for v in g)
    base = statistics.fmean(never)
    control = [v for label, v in means.items() if label.startswith("control")]
    spin = r.control_spin
    if control and spin is not None:
        never_ms = statistics.median(t for label, t in zip(labels, times, strict=True) if label.startswith("never"))
        return Effect(statistics.fmean(up) - base, means["own"] - base, ss, len(up) + len(never) - 2, len(up),
                      len(never), cycles, statistics.fmean(control) - base, len(control), spin.spin_us / 1e3 / never_ms)
    return Effect(statistics.fmean(up) - base, means["own"] - base, ss, len(up) + len(never) - 2, len(up), len(never),
                  cycles)


def executables(e: Effect, which: str) -> int:
    """How many executables of ``which`` one process launched in its loop (the "own" graph is one)."""
    return e.uploaded if which == "upload" else e.controls if which == "control" else 1


def pooled_se(effects: list[Effect], which: str, df: int) -> float:
    """The log ratio's standard error from the copies' spread pooled over every process (NaN without a degree of
    freedom)."""
    if not df:
        return math.nan
    spread2 = sum(e.ss for e in effects) / df
    return math.sqrt(spread2 * sum(1 / executables(e, which) + 1 / e.never for e in effects)) / len(effects)


def combine(effects: list[Effect], which: str) -> LoopFigure | None:
    """``which`` (``upload``, ``own`` or ``control``) over processes: the ratio (geometric mean over processes), its
    relative standard error from the copies' spread pooled over every process (steps and placement),
    the standard error over processes, and the 95% half-width the verdict uses: the widest of the
    pooled interval, the interval over processes (from three on: from two, Student's t of 12.7 would
    swamp any figure) and the farthest any process's own figure lies from the mean, so the interval
    always covers each process. ``None`` without a process."""
    if which == "control":
        effects = [e for e in effects if e.control is not None]
    if not effects:
        return None
    n = len(effects)
    logs = [getattr(e, which) for e in effects]
    df = sum(e.df for e in effects)
    se = pooled_se(effects, which, df)
    se_processes = statistics.stdev(logs) / math.sqrt(n) if n > 1 else math.nan
    mean = statistics.fmean(logs)
    halves = [h for h in (t975(df + 1) * se, t975(n) * se_processes if n >= 3 else math.nan,
                          max(abs(x - mean) for x in logs)) if not math.isnan(h)]
    return LoopFigure(math.exp(mean), se, df, se_processes, max(halves) if halves else math.nan, n,
                      [math.exp(x) for x in logs], min(e.never for e in effects), sum(e.cycles for e in effects),
                      statistics.fmean(e.added for e in effects) if which == "control" else math.nan)


def sizes(runs: list[EngineProcess]) -> list[str]:
    """The batch sizes the runs stepped at, largest first."""
    return largest_first(bs for r in runs for bs in r.step_exec)


def in_loop(runs: list[EngineProcess], which: str) -> dict[str, dict[str, LoopFigure]]:
    """Per metric and bs, ``which`` over ``runs`` (``combine``); a bs no process measured is absent."""
    out: dict[str, dict[str, LoopFigure]] = {}
    for name, key, _ in METRICS:
        for bs in sizes(runs):
            effects = [e for e in (process_effect(r, key, bs) for r in runs) if e is not None]
            got = combine(effects, which)
            if got is not None:
                out.setdefault(name, {})[bs] = got
    return out
