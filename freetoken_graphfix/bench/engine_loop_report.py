"""``bench --engine``'s report, inside one process: the upload in the decode loop (uploaded copies
over never-uploaded ones), the positive control read back there and each arm's own graph over its
copies. Nothing that differs between processes moves these, so the report leads with them."""

from __future__ import annotations

from typing import Any

from .arms import GATE
from .loop import METRICS as LOOP_METRICS
from .verdicts import COSTS, FASTER, judged, pct, recovered, worst

NOT_JUDGED = "not judged: the positive control was not recovered"
LAUNCH_PATH = "the engine's own launch path against the copies' (never uploaded either): not the upload"
AS_CONTROL = "as {}'s own graph, never uploaded: the engine's own launch path, not the upload"
SHORT = {"step": "decode step", "launch": "graph launch"}
UPLOADED_AT_CAPTURE = ("upstream", "upload", GATE)  # FreeToken's _upload_graph (gate: upstream, fill before launch)


def loop_parts(figures: dict[str, dict[str, Any]], metric: str) -> tuple[list[str], list[str]]:
    parts, verdicts = [], []
    for bs, f in figures.get(metric, {}).items():
        spread = ""
        if f["processes"] > 1:
            lo, hi = min(f["per_process"]), max(f["per_process"])
            spread = f" (processes {100 * (lo - 1):+.2f}..{100 * (hi - 1):+.2f}%)"
        parts.append(f"bs {bs} {pct(f['ratio'], f['half'])}{spread}")
        verdicts.append(judged(f["ratio"], f["half"]))
    return parts, verdicts


def own_graph_verdicts(summary: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Per arm, its own graph over its never-uploaded copies in the decode loop: the figures and the
    verdict. The engine launches its own executable through torch's ``CUDAGraph.replay()`` and the
    copies through ``cuGraphLaunch`` from Python, so where the step is host-bound the two launch paths
    alone set them apart (1.4% on a 4-layer qwen3_moe on the H200, in every arm). An arm whose graphs
    were not uploaded at capture is the control for that: its own graph never yields a verdict, and an
    uploaded arm's cost or speed-up that a control shows too is the launch path's, not the upload's."""
    figures: dict[str, tuple[str, str]] = {}
    for arm, s in summary["arms"].items():
        parts, verdicts = [], []
        for metric, _, _ in LOOP_METRICS:
            p, v = loop_parts(s["own_in_loop"], metric)
            if p:
                parts.append(f"{SHORT[metric]} {', '.join(p)}")
                verdicts += v
        if parts:
            figures[arm] = ("; ".join(parts), worst(verdicts))
    controls = {arm: v for arm, (_, v) in figures.items() if arm not in UPLOADED_AT_CAPTURE}
    out = {}
    for arm, (parts, v) in figures.items():
        if v in (COSTS, FASTER):
            if arm not in UPLOADED_AT_CAPTURE:
                v = LAUNCH_PATH
            elif same := [c for c, cv in controls.items() if cv == v]:
                v = AS_CONTROL.format(same[0])
        out[arm] = parts, v
    return out


def control_reading(summary: dict[str, Any]) -> tuple[list[str], str, dict[tuple[str, str], bool] | None]:
    """The positive control in the decode loop (a spin of known GPU time after a never-uploaded copy's
    launch, in the same cycle): what it added and read, per metric; what that says about this run; and
    per (metric, bs) whether it was read back (``verdicts.recovered``), ``None`` where none ran
    (``--copies 0``, or a record from before)."""
    ctl = summary.get("control_in_loop") or {}
    if not ctl:
        return [], "not measured (--copies 0, or a record from before the bench ran one)", None
    seen, got = {}, []
    for metric, _, what in LOOP_METRICS:
        parts = []
        for bs, f in ctl.get(metric, {}).items():
            seen[metric, bs] = recovered(f["ratio"], f["half"], f["added"])
            parts.append(f"bs {bs} {100 * f['added']:+.2f}% added, read {pct(f['ratio'], f['half'])}"
                         + ("" if seen[metric, bs] else " (not recovered)"))
        if parts:
            got.append(f"{what} {', '.join(parts)}")
    if not any(seen.values()):
        return got, "NOT recovered, so the upload is not judged", seen
    up = summary["upload_in_loop"]  # a process with a control figure has an upload figure at that metric and bs
    widest = max(up[metric][bs]["half"] for (metric, bs), ok in seen.items() if ok)
    tail = "recovered" if all(seen.values()) else "recovered but where marked; the upload is judged only where it was"
    return got, f"{tail}; this run names any cost above +{100 * widest:.2f}%", seen


def control_lines(summary: dict[str, Any]) -> tuple[list[str], dict[tuple[str, str], bool] | None]:
    """The positive control's line of the detail, and ``control_reading``'s per-figure gate."""
    got, conclusion, seen = control_reading(summary)
    if seen is None:
        return [f"  positive control: {conclusion}"], None
    return [f"  positive control (a spin of known GPU time after two more never-uploaded copies, in the same "
            f"cycle): {'; '.join(got)}: {conclusion}"], seen


def judged_at(up: dict[str, dict[str, Any]], metric: str, seen: dict[tuple[str, str], bool] | None) -> list[bool]:
    """Per bs of ``metric``: whether its upload figure is judged (its control read back, or no control ran);
    a figure whose control was not read back is shown, not judged."""
    return [seen is None or bool(seen.get((metric, bs))) for bs in up.get(metric, {})]


def in_loop_lines(summary: dict[str, Any]) -> list[str]:
    """The headline: the upload inside one process's decode loop, each figure judged only where the
    positive control at that metric and bs was read back, then each arm's own graph there."""
    up = summary["upload_in_loop"]
    if not up:
        return ["the upload in the decode loop, same graph, same process: not measured (--copies 0, or a record "
                "from before the decode loop launched copies)"]
    first = next(iter(next(iter(up.values())).values()))
    lines = [f"the upload in the decode loop, same graph, same process ({first['copies']} uploaded and as many "
             f"never-uploaded copies of each engine graph, launched in turn with it step by step, {first['processes']} "
             "processes; ± the 95% interval over steps, copies and processes):"]
    controls, seen = control_lines(summary)
    for metric, _, what in LOOP_METRICS:
        parts, verdicts = loop_parts(up, metric)
        gate = judged_at(up, metric, seen)
        parts = [p + ("" if ok else " (not judged)") for p, ok in zip(parts, gate, strict=True)]
        verdicts = [v for v, ok in zip(verdicts, gate, strict=True) if ok]
        if parts:
            lines.append(f"  {what}: {', '.join(parts)}: {worst(verdicts) if verdicts else NOT_JUDGED}")
    lines += controls
    for arm, (parts, verdict) in own_graph_verdicts(summary).items():
        what = "uploaded at capture" if arm in UPLOADED_AT_CAPTURE else "not uploaded at capture: a control"
        lines.append(f"  {arm}'s own graph ({what}) over its never-uploaded copies: {parts}: {verdict}")
    return lines
