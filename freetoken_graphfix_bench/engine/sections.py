"""``bench engine``'s detail, below the answer: the upload inside one process's decode loop with its
positive control and each arm's own graph there; the kernel timeline of the traced processes; the
arms across processes (host levels, the A/A control, each arm against the never-uploaded one); and the
diagnostics from an idle GPU, which never decide on their own. Each figure is ``figures``'s."""

from __future__ import annotations

import math

from ..arms import ARMS, AUTO, DEFERRED, NO_UPLOAD, PATCHED, SKIP, UPSTREAM
from ..stats import Ratio
from ..verdicts import COSTS, FASTER, judged, pct, worst
from .figures import CROSS, ArmFigures, EngineFigures, IdleFigure
from .headline import control_reading, judged_at
from .loop import METRICS, LoopFigure

NOT_JUDGED = "not judged: the positive control was not recovered"
LAUNCH_PATH = "the engine's own launch path against the copies' (never uploaded either): not the upload"
AS_CONTROL = "as {}'s own graph, never uploaded: the engine's own launch path, not the upload"
SHORT = {"step": "decode step", "launch": "graph launch"}
NO_AA = "not judged: no A/A control in this run ({})"
IDLE_ONLY = "from idle only; in the decode loop: {}"


# ---------------------------------------------------------------- inside one process's decode loop

def uploaded_at_capture(arm: str) -> bool:
    """Whether FreeToken's own upload ran on the arm's graphs at capture (the arms registry's word)."""
    return arm in ARMS and ARMS[arm].uploaded_at_capture


def loop_parts(figures: dict[str, dict[str, LoopFigure]], metric: str) -> tuple[list[str], list[str]]:
    """Per bs, the in-loop ratio with its band (and the processes' own spread where there are several), and each one's
    verdict."""
    parts, verdicts = [], []
    for bs, f in figures.get(metric, {}).items():
        spread = ""
        if f.processes > 1:
            lo, hi = min(f.per_process), max(f.per_process)
            spread = f" (processes {100 * (lo - 1):+.2f}..{100 * (hi - 1):+.2f}%)"
        parts.append(f"bs {bs} {pct(f.ratio, f.half)}{spread}")
        verdicts.append(judged(f.ratio, f.half))
    return parts, verdicts


def own_graph_verdicts(figures: EngineFigures) -> dict[str, tuple[str, str]]:
    """Per arm, its own graph over its never-uploaded copies in the decode loop: the figures and the
    verdict. The engine launches its own executable through torch's ``CUDAGraph.replay()`` and the
    copies through ``cuGraphLaunch`` from Python, so where the step is host-bound the two launch paths
    alone set them apart (1.4% on a 4-layer qwen3_moe on the H200, in every arm). An arm whose graphs
    were not uploaded at capture is the control for that: its own graph never yields a verdict, and an
    uploaded arm's cost or speed-up that a control shows too is the launch path's, not the upload's."""
    found: dict[str, tuple[str, str]] = {}
    for arm, s in figures.arms.items():
        parts, verdicts = [], []
        for metric, _, _ in METRICS:
            p, v = loop_parts(s.own_in_loop, metric)
            if p:
                parts.append(f"{SHORT[metric]} {', '.join(p)}")
                verdicts += v
        if parts:
            found[arm] = ("; ".join(parts), worst(verdicts))
    controls = {arm: v for arm, (_, v) in found.items() if not uploaded_at_capture(arm)}
    out = {}
    for arm, (parts, v) in found.items():
        if v in (COSTS, FASTER):
            if not uploaded_at_capture(arm):
                v = LAUNCH_PATH
            elif same := [c for c, cv in controls.items() if cv == v]:
                v = AS_CONTROL.format(same[0])
        out[arm] = parts, v
    return out


def in_loop_lines(figures: EngineFigures) -> list[str]:
    """The upload inside one process's decode loop, each figure judged only where the positive control at
    that metric and bs was read back, then the control, then each arm's own graph there."""
    up = figures.upload_in_loop
    if not up:
        return ["the upload in the decode loop, same graph, same process: not measured (--copies 0, or a record "
                "from before the decode loop launched copies)"]
    first = next(iter(next(iter(up.values())).values()))
    lines = [f"the upload in the decode loop, same graph, same process ({first.copies} uploaded and as many "
             f"never-uploaded copies of each engine graph, launched in turn with it step by step, {first.processes} "
             "processes; ± the 95% interval over steps, copies and processes):"]
    got, conclusion, seen = control_reading(figures)
    for metric, _, what in METRICS:
        parts, verdicts = loop_parts(up, metric)
        gate = judged_at(up, metric, seen)
        parts = [p + ("" if ok else " (not judged)") for p, ok in zip(parts, gate, strict=True)]
        verdicts = [v for v, ok in zip(verdicts, gate, strict=True) if ok]
        if parts:
            lines.append(f"  {what}: {', '.join(parts)}: {worst(verdicts) if verdicts else NOT_JUDGED}")
    lines.append(f"  positive control: {conclusion}" if seen is None else
                 f"  positive control (a spin of known GPU time after two more never-uploaded copies, in the same "
                 f"cycle): {'; '.join(got)}: {conclusion}")
    for arm, (parts, verdict) in own_graph_verdicts(figures).items():
        what = "uploaded at capture" if uploaded_at_capture(arm) else "not uploaded at capture: a control"
        lines.append(f"  {arm}'s own graph ({what}) over its never-uploaded copies: {parts}: {verdict}")
    return lines


# ---------------------------------------------------------------- the kernel timeline

def rng(triple: tuple[float, float, float] | None, fmt: str) -> str:
    """``median [low-high]`` over the traced processes, or the median alone where they agree: a range a reader can see
    at once."""
    if not triple:
        return "-"
    med, lo, hi = triple
    return format(med, fmt) + ("" if lo == hi else f" [{format(lo, fmt)}-{format(hi, fmt)}]")


def timeline_lines(figures: EngineFigures) -> list[str]:
    """Per arm and bs, from its traced processes (median [range] over them): kernels per decode step
    (the graph's), GPU busy µs per step, streams, and the median gap per stream of the graph."""
    lines = ["kernel timeline (traced runs, Kineto/CUPTI; median [range] over an arm's traced processes): per "
             "decode step, kernels (the graph's) and GPU busy µs (union of kernel intervals); median gap µs between "
             "consecutive kernels on each stream of the graph (s1: most kernels)"]
    for arm, s in figures.arms.items():
        t = s.timeline
        if not t.by_bs:
            lines.append(f"{arm:14} {t.note or 'not traced'}")
        for bs, f in t.by_bs.items():
            gaps = " ".join(f"{name} {rng(g, '.3f')}" for name, g in f.gap_us.items())
            lines.append(f"{arm:14} bs {bs}: {t.processes} process(es), kernels {rng(f.step_kernels, '.0f')} "
                         f"({rng(f.graph_kernels, '.0f')}), busy {rng(f.busy_us, '.1f')} µs, "
                         f"{rng(f.streams, '.0f')} streams, gap {gaps}")
    return lines


# ---------------------------------------------------------------- across processes

def band(r: Ratio | None, is_base: bool = False) -> str:
    """A cross-process ratio with its 95% interval, or why the run cannot say."""
    if is_base:
        return "1 (base)"
    if r is None or math.isnan(r.ratio):
        return "n/a"
    return f"{r.ratio:.4f}" + ("" if math.isnan(r.half) else f" ± {r.half:.4f}")


def level_name(k: int | None) -> str:
    """A host level's letter (A the fastest), or ``-`` for a process with none."""
    return "-" if k is None else chr(ord("A") + k)


def host_level_lines(figures: EngineFigures) -> list[str]:
    """Which process was at which host level, per phase (bs), with its host and GPU ms per step."""
    several = {bs: b for bs, b in figures.host_levels.items() if len(b) > 1}
    cut = "; ".join(f"bs {bs}: " + " | ".join(f"{level_name(i)} < {b:.3f} ms" for i, b in enumerate(bd[:-1]))
                    for bs, bd in several.items())
    lines = ["host levels (median host ms per decode step of each process and phase; processes compare across arms "
             "only within a level): " + (f"several: {cut}" if several else "one per phase")]
    for arm, s in figures.arms.items():
        for row in s.processes:
            parts = [f"bs {bs} host {host:.3f} / GPU {row.figures['step'].get(bs, math.nan):.3f} ms "
                     f"{level_name(row.level.get(bs))}" for bs, host in row.host_ms.items()]
            lines.append(f"  {arm} round {row.round}: " + ", ".join(parts))
    return lines


def no_aa_reason(figures: EngineFigures) -> str:
    """Why no cross-process figure is judged, with the arms that would give the run an A/A control."""
    if figures.aa_pair:
        a, b = figures.aa_pair
        return f"{a} and {b} share no host level here, or ran one round"
    return "add --arms " + (f"{NO_UPLOAD} {SKIP}, or {AUTO} {DEFERRED}" if figures.wait_case else f"{NO_UPLOAD} {AUTO}")


def aa_lines(figures: EngineFigures) -> list[str]:
    """The A/A control's own ratios: the noise floor under which no cross-process figure may claim anything."""
    if not figures.aa_pair:
        return [f"A/A control: none ({no_aa_reason(figures)}: two arms that run the same never-uploaded graphs); no "
                "cross-process figure is judged"]
    a, b = figures.aa_pair
    parts = []
    for name, _, what in CROSS:
        got = [f"bs {bs} {pct(r.ratio, r.half)}" for bs, r in figures.aa.get(name, {}).items()]
        parts.append(f"{what}: {', '.join(got)}")
    return [f"A/A control ({b} over {a}: the same never-uploaded graphs, so any difference is the processes'): "
            + "; ".join(parts) + ": the run's noise floor for every cross-process figure"]


def cross_figure(figures: EngineFigures, name: str, bs: str, r: Ratio) -> tuple[str, str]:
    """One cross-process ratio as ``bs 2 +0.10% ± 0.20%`` and its verdict, held to the A/A floor of that
    figure and bs (none judged without one)."""
    floor = figures.aa_floor(name, bs)
    verdict = NO_AA.format(no_aa_reason(figures)) if floor is None else judged(r.ratio, r.half, floor)
    return f"bs {bs} {pct(r.ratio, r.half)}", verdict


def compared(figures: EngineFigures) -> list[str]:
    """The arms held against the never-uploaded base across processes: not the base, nor the A/A
    control's other arm (that pair is the noise floor, not a finding)."""
    base, pair = figures.base, set(figures.aa_pair or ())
    return [a for a in (UPSTREAM, AUTO, PATCHED) if a in figures.arms and a != base and {a, base} != pair]


def cross_verdicts(figures: EngineFigures) -> tuple[list[str], dict[tuple[str, str, str], str]]:
    """Per compared arm, the decode loop's figures across processes (within host levels, against the
    A/A floor); and each verdict by (arm, figure, bs), for the diagnostics to be held against."""
    lines: list[str] = []
    by: dict[tuple[str, str, str], str] = {}
    for arm in compared(figures):
        for name, _, what in CROSS[:2]:
            parts, verdicts = [], []
            for bs, r in figures.arms[arm].cross.get(name, {}).items():
                part, v = cross_figure(figures, name, bs, r)
                parts.append(part)
                verdicts.append(v)
                by[arm, name, bs] = v
            if parts:
                lines.append(f"{arm} vs never uploaded ({figures.base}), across processes within host levels, "
                             f"{what}: {', '.join(parts)}: {worst(verdicts)}")
    return lines, by


def host_bound(figures: EngineFigures) -> list[str]:
    """Where the graph step takes much less GPU time than the decode step around it, the GPU waits for
    the host between graphs: there the step's GPU time and tok/s follow the host (the scheduler)."""
    out = []
    for arm, s in figures.arms.items():
        for bs, q in s.step_gpu_ms.items():
            graph = s.graph_ms.get(bs, math.nan)
            if q.n and graph < 0.9 * q.median:
                out.append(f"{arm} bs {bs}: the graph step takes {100 * graph / q.median:.0f}% "
                           "of the decode step's GPU time (host-bound: the step's GPU time and tok/s follow the host)")
    return out


def cross_table(figures: EngineFigures) -> list[str]:
    """The arms across processes: each arm's own step, tok/s and graph step, and their ratios to the never-uploaded arm
    within host levels."""
    base = figures.base
    lines = ["across processes, the arm's own graph steps (CUDA events around forward_batch, and around "
             "GraphRunner.replay for the graph step), ratios to " + (f"{base} within host levels ± the 95% interval"
                                                                     if base else "none: no never-uploaded arm")]
    lines.append(f"{'arm':14} {'bs':>3} {'step ms':>9} {'tok/s':>8} {'step / never':>17} {'graph ms':>9} "
                 f"{'graph / never':>17} {'idle / never':>17}")
    for arm, s in figures.arms.items():
        for bs, q in s.step_gpu_ms.items():
            cells = cross_cells(s, arm == base, bs)
            lines.append(f"{arm:14} {bs:>3} {q.median:9.4f} {s.tok_s.get(bs, math.nan):8.1f} "
                         f"{cells[0]:>17} {s.graph_ms.get(bs, math.nan):9.4f} {cells[1]:>17} {cells[2]:>17}")
    return lines


def cross_cells(s: ArmFigures, is_base: bool, bs: str) -> list[str]:
    """One arm's three cross-process ratio cells at ``bs`` (step, graph, replay from idle); the base arm's say so."""
    return [band(s.cross.get(name, {}).get(bs), is_base) for name in ("step", "graph", "replay")]


# ---------------------------------------------------------------- from an idle GPU

def held_against(idle: str, in_loop: str | None) -> str:
    """A diagnostic's verdict never claims a cost or a speed-up the decode loop does not show."""
    if idle in (COSTS, FASTER) and in_loop is not None and in_loop != idle:
        return IDLE_ONLY.format(in_loop)
    return idle


def idle_against_loop(idle: dict[str, IdleFigure], in_loop: dict[str, dict[str, LoopFigure]]) -> str:
    """In-process figures from idle per bs with their verdict, held against the same figure's graph launch
    in the decode loop."""
    loop_launch = {bs: judged(f.ratio, f.half) for bs, f in in_loop.get("launch", {}).items()}
    parts, verdicts = [], []
    for bs, f in idle.items():
        half = Ratio(f.ratio, f.se, f.processes - 1).half
        parts.append(f"bs {bs} {pct(f.ratio, half)}")
        verdicts.append(held_against(judged(f.ratio, half), loop_launch.get(bs)))
    return f"{', '.join(parts)}: {worst(verdicts)}"


def diagnostic_lines(figures: EngineFigures, loop_by: dict[tuple[str, str, str], str]) -> list[str]:
    """The figures from an idle GPU, each verdict held against the decode loop's so a diagnostic never names a cost the
    loop does not show."""
    lines = ["diagnostics, from an idle GPU after the workload (never a verdict on their own):"]
    for arm in compared(figures):
        parts, verdicts = [], []
        for bs, r in figures.arms[arm].cross.get("replay", {}).items():
            part, v = cross_figure(figures, "replay", bs, r)
            parts.append(part)
            verdicts.append(held_against(v, loop_by.get((arm, "graph", bs))))
        if parts:
            lines.append(f"  {arm} vs never uploaded ({figures.base}), the graph replayed back to back, across "
                         f"processes: {', '.join(parts)}: {worst(verdicts)}")
    for arm, s in figures.arms.items():
        if s.own_idle:
            lines.append(f"  {arm}'s own graph over its never-uploaded copies, replayed back to back: "
                         + idle_against_loop(s.own_idle, s.own_in_loop))
    idle = figures.upload_idle
    if idle:
        first = next(iter(idle.values()))
        lines.append(f"  the upload itself, replayed back to back ({first.copies} uploaded and as many never-uploaded "
                     f"copies, {first.processes} processes): " + idle_against_loop(idle, figures.upload_in_loop))
    return lines
