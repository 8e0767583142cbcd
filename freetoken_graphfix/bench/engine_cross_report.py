"""``bench --engine``'s report across processes: host modes, the A/A control (the noise floor no
cross-process figure may claim to beat), each arm's ratios to the never-uploaded arm within a shared
host mode, and the diagnostics from an idle GPU, which never decide on their own."""

from __future__ import annotations

import math
from typing import Any

from .engine_stats import CROSS
from .stats import half_width
from .verdicts import COSTS, FASTER, judged, pct, worst

NO_AA = "not judged: no A/A control in this run ({})"
IDLE_ONLY = "from idle only; in the decode loop: {}"


def band(triple: list[float] | None, is_base: bool = False) -> str:
    """A cross-process ratio with its 95% interval, or why the run cannot say."""
    if is_base:
        return "1 (base)"
    if not triple or math.isnan(triple[0]):
        return "n/a"
    half = half_width(triple[1], int(triple[2]))
    return f"{triple[0]:.4f}" + ("" if math.isnan(half) else f" ± {half:.4f}")


def mode_name(k: int | None) -> str:
    return "-" if k is None else chr(ord("A") + k)


def host_mode_lines(summary: dict[str, Any]) -> list[str]:
    """Which process was in which host mode, per phase (bs), with its host and GPU ms per step."""
    bounds = summary["host_modes"]
    several = {bs: b for bs, b in bounds.items() if len(b) > 1}
    cut = "; ".join(f"bs {bs}: " + " | ".join(f"{mode_name(i)} < {b:.3f} ms" for i, b in enumerate(bd[:-1]))
                    for bs, bd in several.items())
    lines = ["host modes (median host ms per decode step of each process and phase; processes compare across arms "
             "only within a mode): " + (f"several: {cut}" if several else "one per phase")]
    for arm, s in summary["arms"].items():
        for row in s["processes"]:
            parts = [f"bs {bs} host {host:.3f} / GPU {row['step'].get(bs, math.nan):.3f} ms "
                     f"{mode_name(row['mode'].get(bs))}" for bs, host in row["host_ms"].items()]
            lines.append(f"  {arm} round {row['round']}: " + ", ".join(parts))
    return lines


def aa_floor(summary: dict[str, Any], name: str, bs: str) -> float | None:
    """How far the A/A control's two identical arms came apart in ``name`` at ``bs``, with its band: no
    cross-process figure may claim to resolve less. ``None`` where the run has no such figure."""
    triple = summary["aa"]["figures"].get(name, {}).get(bs)
    if not triple or math.isnan(triple[0]):
        return None
    half = half_width(triple[1], int(triple[2]))
    return abs(triple[0] - 1) + (0.0 if math.isnan(half) else half)


def no_aa_reason(summary: dict[str, Any], wait_case: bool) -> str:
    if summary["aa"]["pair"]:
        a, b = summary["aa"]["pair"]
        return f"{a} and {b} share no host mode here, or ran one round"
    return "add --arms " + ("pre-697 skip, or auto deferred" if wait_case else "pre-697 auto")


def aa_lines(record: dict[str, Any]) -> list[str]:
    summary = record["summary"]
    pair = summary["aa"]["pair"]
    if not pair:
        return [f"A/A control: none ({no_aa_reason(summary, record['wait_case'])}: two arms that run the same "
                "never-uploaded graphs); no cross-process figure is judged"]
    a, b = pair
    parts = []
    for name, _, what in CROSS:
        got = [f"bs {bs} {pct(t[0], half_width(t[1], int(t[2])))}" for bs, t in summary["aa"]["figures"][name].items()]
        parts.append(f"{what}: {', '.join(got)}")
    return [f"A/A control ({b} over {a}: the same never-uploaded graphs, so any difference is the processes'): "
            + "; ".join(parts) + ": the run's noise floor for every cross-process figure"]


def cross_figure(record: dict[str, Any], name: str, bs: str, triple: list[float]) -> tuple[str, str]:
    """One cross-process ratio (``[ratio, SE, dof]``) as ``bs 2 +0.10% ± 0.20%`` and its verdict, held to
    the A/A floor of that figure and bs (none judged without one)."""
    half = half_width(triple[1], int(triple[2]))
    floor = aa_floor(record["summary"], name, bs)
    verdict = NO_AA.format(no_aa_reason(record["summary"], record["wait_case"])) if floor is None else \
        judged(triple[0], half, floor)
    return f"bs {bs} {pct(triple[0], half)}", verdict


def cross_verdicts(record: dict[str, Any]) -> tuple[list[str], dict[tuple[str, str, str], str]]:
    """Per compared arm, the decode loop's figures across processes (within host modes, against the
    A/A floor); and each verdict by (arm, figure, bs), for the diagnostics to be held against."""
    summary = record["summary"]
    lines: list[str] = []
    by: dict[tuple[str, str, str], str] = {}
    base = summary["base"]
    for arm in compared(summary):
        for name, _, what in CROSS[:2]:
            parts, verdicts = [], []
            for bs, t in summary["arms"][arm]["cross"].get(name, {}).items():
                part, v = cross_figure(record, name, bs, t)
                parts.append(part)
                verdicts.append(v)
                by[arm, name, bs] = v
            if parts:
                lines.append(f"{arm} vs never uploaded ({base}), across processes within host modes, {what}: "
                             f"{', '.join(parts)}: {worst(verdicts)}")
    return lines, by


def host_bound(summary: dict[str, Any]) -> list[str]:
    """Where the graph step takes much less GPU time than the decode step around it, the GPU waits for
    the host between graphs: there the step's GPU time and tok/s follow the host (the scheduler)."""
    out = []
    for arm, s in summary["arms"].items():
        for bs, q in s["step_gpu_ms"].items():
            graph = s["graph_ms"].get(bs, math.nan)
            if q.get("median") and graph < 0.9 * q["median"]:
                out.append(f"{arm} bs {bs}: the graph step takes {100 * graph / q['median']:.0f}% "
                           "of the decode step's GPU time (host-bound: the step's GPU time and tok/s follow the host)")
    return out


def cross_table(summary: dict[str, Any]) -> list[str]:
    base = summary["base"]
    lines = ["across processes, the arm's own graph steps (CUDA events around forward_batch, and around "
             "GraphRunner.replay for the graph step), ratios to " + (f"{base} within host modes ± the 95% interval"
                                                                     if base else "none: no never-uploaded arm")]
    lines.append(f"{'arm':14} {'bs':>3} {'step ms':>9} {'tok/s':>8} {'step / never':>17} {'graph ms':>9} "
                 f"{'graph / never':>17} {'idle / never':>17}")
    for arm, s in summary["arms"].items():
        for bs, q in s["step_gpu_ms"].items():
            cells = [band(s["cross"].get(name, {}).get(bs), arm == base) for name in ("step", "graph", "replay")]
            lines.append(f"{arm:14} {bs:>3} {q.get('median', math.nan):9.4f} {s['tok_s'].get(bs, math.nan):8.1f} "
                         f"{cells[0]:>17} {s['graph_ms'].get(bs, math.nan):9.4f} {cells[1]:>17} {cells[2]:>17}")
    return lines


def held_against(idle: str, in_loop: str | None) -> str:
    """A diagnostic's verdict never claims a cost or a speed-up the decode loop does not show."""
    if idle in (COSTS, FASTER) and in_loop is not None and in_loop != idle:
        return IDLE_ONLY.format(in_loop)
    return idle


def compared(summary: dict[str, Any]) -> list[str]:
    """The arms held against the never-uploaded base across processes: not the base, nor the A/A
    control's other arm (that pair is the noise floor, not a finding)."""
    base, pair = summary["base"], set(summary["aa"]["pair"] or ())
    return [a for a in ("upstream", "auto", "patched") if a in summary["arms"] and a != base and {a, base} != pair]


def diagnostic_lines(record: dict[str, Any], loop_by: dict[tuple[str, str, str], str]) -> list[str]:
    summary = record["summary"]
    lines = ["diagnostics, from an idle GPU after the workload (never a verdict on their own):"]
    base = summary["base"]
    for arm in compared(summary):
        parts, verdicts = [], []
        for bs, t in summary["arms"][arm]["cross"].get("replay", {}).items():
            part, v = cross_figure(record, "replay", bs, t)
            parts.append(part)
            verdicts.append(held_against(v, loop_by.get((arm, "graph", bs))))
        if parts:
            lines.append(f"  {arm} vs never uploaded ({base}), the graph replayed back to back, across processes: "
                         f"{', '.join(parts)}: {worst(verdicts)}")
    for arm, s in summary["arms"].items():
        own = s["own_idle"]
        if not own:
            continue
        lines.append(f"  {arm}'s own graph over its never-uploaded copies, replayed back to back: "
                     + idle_against_loop(own, s["own_in_loop"]))
    idle = summary["upload_idle"]
    if idle:
        _, _, processes, each = next(iter(idle.values()))
        lines.append(f"  the upload itself, replayed back to back ({each} uploaded and as many never-uploaded copies, "
                     f"{processes} processes): " + idle_against_loop(idle, summary["upload_in_loop"]))
    return lines


def idle_against_loop(idle: dict[str, list[float]], in_loop: dict[str, dict[str, Any]]) -> str:
    """In-process figures from idle per bs (``[ratio, SE, processes, ...]``) with their verdict, held
    against the same figure's graph launch in the decode loop."""
    loop_launch = {bs: judged(f["ratio"], f["half"]) for bs, f in in_loop.get("launch", {}).items()}
    parts, verdicts = [], []
    for bs, (ratio, se, n, *_) in idle.items():
        half = half_width(se, int(n) - 1)
        parts.append(f"bs {bs} {pct(ratio, half)}")
        verdicts.append(held_against(judged(ratio, half), loop_launch.get(bs)))
    return f"{', '.join(parts)}: {worst(verdicts)}"
