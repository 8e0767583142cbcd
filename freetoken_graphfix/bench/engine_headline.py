"""``bench --engine``'s answer first, in at most six lines: is every protected arm safe (never
blocked, the reference's tokens), what does the upload cost in the decode loop (its 95% band and
what the positive control says this run could have seen), and what to set. Every figure here is
one of the detail's below it, never a new one."""

from __future__ import annotations

from typing import Any

from .engine import failures
from .engine_loop_report import control_reading, judged_at
from .loop import METRICS as LOOP_METRICS
from .verdicts import COSTS, FASTER, NO_COST, judged, pct, worst

UNJUDGED = "not judged (the positive control was not read back)"


def safety(record: dict[str, Any], bad: list[str]) -> str:
    """The safety line, from ``engine.failures``'s ``bad``, with the negative control's state."""
    arms = record["summary"]["arms"]
    controls = [f"{a} {'blocked' if s['fires'] else 'never blocked'}" for a, s in arms.items() if not s["protected"]]
    tail = f" (negative control: {', '.join(controls)})" if controls else ""
    if bad:
        return f"safety: FAILED: {'; '.join(bad)}{tail}"
    return f"safety: every protected arm never blocked and gave {record['summary']['reference']}'s tokens{tail}"


def upload_cost(summary: dict[str, Any], seen: dict[tuple[str, str], bool] | None) -> tuple[str, str | None]:
    """The upload's cost in the decode loop per metric, each bs judged only where its control was read
    back (``seen``, from ``control_reading``); and the verdict over them (``None`` where nothing was
    judged)."""
    up = summary["upload_in_loop"]
    if not up:
        return "the upload in the decode loop: not measured (--copies 0, or an older record)", None
    parts, verdicts = [], []
    for metric, _, what in LOOP_METRICS:
        figures = []
        for (bs, f), judged_here in zip(up.get(metric, {}).items(), judged_at(up, metric, seen), strict=True):
            figures.append(f"bs {bs} {pct(f['ratio'], f['half'])}" + ("" if judged_here else " (not judged)"))
            if judged_here:
                verdicts.append(judged(f["ratio"], f["half"]))
        if figures:
            parts.append(f"{what} {', '.join(figures)}")
    verdict = worst(verdicts) if verdicts else None
    return f"the upload in the decode loop: {'; '.join(parts)}: {verdict or UNJUDGED}", verdict


def what_to_set(record: dict[str, Any], bad: list[str], verdict: str | None) -> str:
    if any(line.startswith("auto:") for line in bad):
        return ("what to set: not FT_GRAPH_UPLOAD=auto on this model: it failed the safety check above (please "
                "report it)")
    cost = {COSTS: "the upload costs this GPU what the line above says", FASTER: "the upload is faster here",
            NO_COST: "the upload costs nothing beyond ±0.5% here",
            None: "the upload's cost is not judged here"}.get(verdict, "this run cannot tell whether the upload costs "
                                                                       "anything (its band reaches beyond ±0.5%)")
    if record["wait_case"]:
        return (f"what to set: FT_GRAPH_UPLOAD=auto (or patches/, on 0.2.1) protects every first launch without the "
                f"upload; {cost}")
    return (f"what to set: nothing needs protection here; FT_GRAPH_UPLOAD=auto skips an upload that protects "
            f"nothing; {cost}")


def headline(record: dict[str, Any]) -> list[str]:
    """The answer, at most six lines: safety, the upload's in-loop cost, the control, what to set."""
    summary, bad = record["summary"], failures(record)
    _, conclusion, seen = control_reading(summary)
    cost, verdict = upload_cost(summary, seen)
    return [safety(record, bad), cost, f"positive control: {conclusion}", what_to_set(record, bad, verdict)]
