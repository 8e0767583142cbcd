"""``bench engine``'s answer, the four lines a report opens with: is every protected arm safe (never
blocked, the reference's tokens), what does the upload cost in the decode loop (its 95% band, judged
only where the positive control was read back), what could this run have seen, and what to set.
Every figure here is one of the sections' (``sections``), never a new one."""

from __future__ import annotations

from ..arms import GATE
from ..verdicts import COSTS, FASTER, NO_COST, judged, pct, recovered, worst
from .figures import EngineFigures
from .loop import METRICS, LoopFigure

UNJUDGED = "not judged (the positive control was not read back)"
Seen = dict[tuple[str, str], bool]  # (metric, bs) -> whether the positive control was read back there


def failures(figures: EngineFigures) -> list[str]:
    """The safety targets: every protected arm ran cleanly, never blocked, matched the reference's
    tokens (upstream's, or gate's on a FreeToken that does not upload) where the reference ran, and gave
    the same tokens with copies in its decode loop as its traced processes, which launch only the
    engine's own graphs. A run without the reference arm compares no tokens: ``tokens_compared`` says so."""
    out = [] if figures.arms else ["no arm ran: nothing was measured"]
    for arm, s in figures.arms.items():
        out += [f"{arm}: {e}" for e in s.errors]
        if not s.processes and not s.errors:
            out.append(f"{arm}: no process ran: nothing was measured")
        if not s.protected:
            continue
        if s.fires:
            out.append(f"{arm}: the watchdog released {s.fires} blocked launch(es)")
        if arm != s.reference and s.reference in figures.arms and not s.same_tokens_as_reference:
            out.append(f"{arm}: tokens {s.hashes} differ from {s.reference}'s")
        if s.copies_tokens == "DIFF":
            out.append(f"{arm}: the decode loop with copies gave other tokens than its traced run (own graphs only)")
    return out


def tokens_compared(figures: EngineFigures) -> str | None:
    """Why the protected arms' tokens were not compared (the reference arm did not run), ``None`` when
    they were."""
    if figures.reference in figures.arms:
        return None
    if figures.reference == GATE:
        return (f"tokens not compared: no {GATE} arm (this FreeToken uploads no graph, so upstream is unprotected "
                f"and {GATE}'s tokens are the reference: add --arms {GATE})")
    return "tokens not compared: no upstream arm in this run (add --arms upstream)"


def safety(figures: EngineFigures, bad: list[str]) -> str:
    """The safety line, from ``failures``'s ``bad``, with the negative control's state and, where
    the reference arm did not run, that tokens were not compared."""
    controls = [f"{a} {'blocked' if s.fires else 'never blocked'}" for a, s in figures.arms.items() if not s.protected]
    tail = f" (negative control: {', '.join(controls)})" if controls else ""
    if bad:
        return f"safety: FAILED: {'; '.join(bad)}{tail}"
    unseen = tokens_compared(figures)
    if unseen:
        return f"safety: every protected arm never blocked; {unseen}{tail}"
    return f"safety: every protected arm never blocked and gave {figures.reference}'s tokens{tail}"


def control_reading(figures: EngineFigures) -> tuple[list[str], str, Seen | None]:
    """The positive control in the decode loop (a spin of known GPU time after a never-uploaded copy's
    launch, in the same cycle): what it added and read, per metric; what that says about this run; and
    per (metric, bs) whether it was read back (``verdicts.recovered``), ``None`` where none ran
    (``--copies 0``, or a record from before)."""
    ctl = figures.control_in_loop
    if not ctl:
        return [], "not measured (--copies 0, or a record from before the bench ran one)", None
    seen: Seen = {}
    got = []
    for metric, _, what in METRICS:
        parts = []
        for bs, f in ctl.get(metric, {}).items():
            seen[metric, bs] = recovered(f.ratio, f.half, f.added)
            parts.append(f"bs {bs} {100 * f.added:+.2f}% added, read {pct(f.ratio, f.half)}"
                         + ("" if seen[metric, bs] else " (not recovered)"))
        if parts:
            got.append(f"{what} {', '.join(parts)}")
    if not any(seen.values()):
        return got, "NOT recovered, so the upload is not judged", seen
    up = figures.upload_in_loop  # a process with a control figure has an upload figure at that metric and bs
    widest = max(up[metric][bs].half for (metric, bs), ok in seen.items() if ok)
    tail = "recovered" if all(seen.values()) else "recovered but where marked; the upload is judged only where it was"
    return got, f"{tail}; this run names any cost above +{100 * widest:.2f}%", seen


def judged_at(up: dict[str, dict[str, LoopFigure]], metric: str, seen: Seen | None) -> list[bool]:
    """Per bs of ``metric``: whether its upload figure is judged (its control read back, or no control ran);
    a figure whose control was not read back is shown, not judged."""
    return [seen is None or bool(seen.get((metric, bs))) for bs in up.get(metric, {})]


def upload_cost(figures: EngineFigures, seen: Seen | None) -> tuple[str, str | None]:
    """The upload's cost in the decode loop per metric, each bs judged only where its control was read
    back; and the verdict over them (``None`` where nothing was judged)."""
    up = figures.upload_in_loop
    if not up:
        return "the upload in the decode loop: not measured (--copies 0, or an older record)", None
    parts, verdicts = [], []
    for metric, _, what in METRICS:
        shown = []
        for (bs, f), judged_here in zip(up.get(metric, {}).items(), judged_at(up, metric, seen), strict=True):
            shown.append(f"bs {bs} {pct(f.ratio, f.half)}" + ("" if judged_here else " (not judged)"))
            if judged_here:
                verdicts.append(judged(f.ratio, f.half))
        if shown:
            parts.append(f"{what} {', '.join(shown)}")
    verdict = worst(verdicts) if verdicts else None
    return f"the upload in the decode loop: {'; '.join(parts)}: {verdict or UNJUDGED}", verdict


def what_to_set(figures: EngineFigures, bad: list[str], verdict: str | None) -> str:
    """The answer's last line: the variable to set, read from the safety failures and the upload's verdict alone."""
    if any(line.startswith("auto:") for line in bad):
        return ("what to set: not FT_GRAPH_UPLOAD=auto on this model: it failed the safety check above (please "
                "report it)")
    cost = {COSTS: "the upload costs this GPU what the line above says", FASTER: "the upload is faster here",
            NO_COST: "the upload costs nothing beyond ±0.5% here",
            None: "the upload's cost is not judged here"}.get(verdict, "this run cannot tell whether the upload costs "
                                                                       "anything (its band reaches beyond ±0.5%)")
    if figures.wait_case:
        return (f"what to set: FT_GRAPH_UPLOAD=auto (or patches/, on 0.2.1) protects every first launch without the "
                f"upload; {cost}")
    return (f"what to set: nothing needs protection here; FT_GRAPH_UPLOAD=auto skips an upload that protects "
            f"nothing; {cost}")


def answer(figures: EngineFigures) -> list[str]:
    """The answer in four lines: safety, the upload's in-loop cost, the control, what to set."""
    bad = failures(figures)
    _, conclusion, seen = control_reading(figures)
    cost, verdict = upload_cost(figures, seen)
    return [safety(figures, bad), cost, f"positive control: {conclusion}", what_to_set(figures, bad, verdict)]
