"""Statistics of the replay benchmark, apart from their rendering (``report``).

The unit that varies is the graph instance, not the replay: separately captured copies of one graph,
treated identically, replay up to ~1% apart on the H200, and on some machines they fall into
distinct modes about 6% apart that each instance keeps for the whole run (a property of the
instance's placement, not of time). So every ratio is computed from the instances' medians, within
each mode the instances fall into, and its band is a 95% interval over instances. The modes are
found among the never-uploaded arms alone (an A/A set: the treatment cannot move them), never from
the uploaded arm's outcome, which would turn a real cost into a "mode" of its own.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from .verdicts import CANNOT, COSTS, FASTER, NO_COST, judged, pct, recovered, worst

MODE_GAP = 0.015
"""Instances whose medians sit this far apart (relative to the median of all) with nothing between
are in different modes: several times the spread identically treated instances show within one."""


def summary(values: list[float], percentiles: tuple[int, int] = (10, 90)) -> dict[str, float]:
    """Median and two percentiles (p10/p90 by default; more robust than the mean), with the count."""
    if not values:
        return {"n": 0}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"n": len(values), "median": statistics.median(values), **{f"p{p}": q[p - 1] for p in percentiles}}


def pooled(per_instance: list[list[float]]) -> list[float]:
    return [t for times in per_instance for t in times]


def instance_medians(per_instance: list[list[float]]) -> list[float]:
    return [statistics.median(times) for times in per_instance if times]


def modes(medians: list[float], gap: float = MODE_GAP) -> list[float]:
    """Upper bounds of the modes the instance medians fall into (sorted; the last is ``inf``): the
    medians split wherever two neighbours are more than ``gap`` apart, relative to their median."""
    if not medians:
        return [math.inf]
    ordered, scale = sorted(medians), statistics.median(medians)
    bounds = [(a + b) / 2 for a, b in zip(ordered, ordered[1:], strict=False) if (b - a) / scale > gap]
    return [*bounds, math.inf]


def mode_of(value: float, bounds: list[float]) -> int:
    return next(i for i, bound in enumerate(bounds) if value < bound)


def ratio(arm: list[float], base: list[float], bounds: list[float]) -> tuple[float, float, int]:
    """``mean(arm) / mean(base)`` over instance medians, within the modes ``bounds`` draws, its
    relative standard error and degrees of freedom (``grouped_ratio``)."""
    groups = [([a for a in arm if mode_of(a, bounds) == k], [b for b in base if mode_of(b, bounds) == k])
              for k in range(len(bounds))]
    return grouped_ratio(groups)


def grouped_ratio(groups: list[tuple[list[float], list[float]]]) -> tuple[float, float, int]:
    """``mean(arm) / mean(base)`` compared within each group (a mode) holding both, its relative
    standard error and degrees of freedom.

    The groups' log-ratios are weighted by their inverse variance, from the relative spread of the
    values within their group, pooled over groups and both arms (identically treated units differ by
    that much). ``(nan, nan, 0)`` when no group holds two values of one and one of the other."""
    shared = [(a, b) for a, b in groups if a and b]
    deviations = [x / statistics.fmean(g) - 1 for pair in shared for g in pair for x in g]
    dof = len(deviations) - 2 * len(shared)
    if not shared or dof < 1:
        return math.nan, math.nan, 0
    spread = math.sqrt(sum(d * d for d in deviations) / dof)
    if spread == 0:
        spread = 1e-12
    weights = [1 / (spread**2 * (1 / len(a) + 1 / len(b))) for a, b in shared]
    log_ratio = sum(w * math.log(statistics.fmean(a) / statistics.fmean(b))
                    for w, (a, b) in zip(weights, shared, strict=True)) / sum(weights)
    return math.exp(log_ratio), 1 / math.sqrt(sum(weights)), dof


def membership(medians: list[float], bounds: list[float]) -> list[int]:
    """How many of ``medians`` fall in each mode."""
    counts = [0] * len(bounds)
    for m in medians:
        counts[mode_of(m, bounds)] += 1
    return counts


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided p-value of Fisher's exact test on the 2x2 table ``[[a, b], [c, d]]``: do two arms
    fall into two modes in different proportions?"""
    n, row, col = a + b + c + d, a + b, a + c

    def p(x: int) -> float:
        return math.comb(col, x) * math.comb(n - col, row - x) / math.comb(n, row)

    observed = p(a)
    return min(1.0, sum(p(x) for x in range(max(0, row + col - n), min(row, col) + 1)
                        if p(x) <= observed * (1 + 1e-9)))


CONTROL = "control"
"""The positive control's arm: never uploaded, plus a spin of known length in the graph."""


def never_uploaded(arm: str, rec: dict[str, Any], bs: str) -> bool:
    """Whether ``arm``'s graphs at ``bs`` replay as captured, never uploaded (skip, warm, deferred,
    auto, and every arm where nothing needs protection): the A/A set. The control is not one of them."""
    actions = rec["graphs"].get(f"bs={bs}", {}).get("action", [])
    return arm != CONTROL and bool(actions) and "upload" not in actions


def aa_floor(medians: dict[str, list[float]], reference: list[str], bounds: list[float]) -> float | None:
    """How far the never-uploaded arms came apart from ``skip`` (the widest, with its 95% band): no
    ratio to ``skip`` may claim to resolve less. ``None`` with no second never-uploaded arm."""
    floors = []
    for arm in reference:
        if arm != "skip":
            r, se, dof = ratio(medians[arm], medians["skip"], bounds)
            if not math.isnan(r):
                floors.append(abs(r - 1) + half_width(se, dof))
    return max(floors) if floors else None


def control_added(record: dict[str, Any], skip: list[float] | None) -> float:
    """The control's known extra cost at one bs: its spin's own GPU time over skip's replay time."""
    if not skip:
        return math.nan
    return record["control"]["spin_us"] / statistics.fmean(skip)


def rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's figures per (arm, bs), derived from the raw record: every instance's replays
    pooled for the distribution, the modes the never-uploaded instances of that bs fall into, the
    ratio to ``skip`` (never uploaded) within modes with its 95% half-width, the A/A floor and each
    arm's mode counts."""
    arms = record["arms"]
    out = []
    for bs in next(iter(arms.values()))["replay_us"]:
        medians = {arm: instance_medians(rec["replay_us"][bs]) for arm, rec in arms.items()}
        reference = [arm for arm, rec in arms.items() if never_uploaded(arm, rec, bs)]
        bounds = modes([m for arm in (reference or medians) for m in medians[arm]])
        floor = aa_floor(medians, reference, bounds) if "skip" in reference else None
        for arm, rec in arms.items():
            per_instance = rec["replay_us"][bs]
            s = summary(pooled(per_instance))
            ratio_skip, se, dof = ratio(medians[arm], medians["skip"], bounds) if "skip" in medians else (
                math.nan, math.nan, 0)
            graph = rec["graphs"].get(f"bs={bs}", {"action": ["?"], "hook_ms": []})
            first = rec["first_launch"][bs]
            ms = medians[arm]
            out.append({
                "arm": arm, "bs": bs, "actions": sorted(set(graph["action"])), **s,
                "ratio_skip": ratio_skip, "ratio_se": se, "half": half_width(se, dof), "aa_floor": floor,
                "added": control_added(record, medians.get("skip")) if arm == CONTROL else math.nan,
                "modes": len(bounds), "mode_counts": membership(ms, bounds),
                "instance_spread": (max(ms) - min(ms)) / s["median"] if len(ms) > 1 else 0.0,
                "first_launch_ms": statistics.median(first["launch_ms"]), "blocked": sum(first["blocked"]),
                "instances": len(per_instance),
                "hook_ms": statistics.median(graph["hook_ms"]) if graph["hook_ms"] else math.nan,
                "logits_equal_upload": rec["logits_equal_upload"],
            })
    return out


def mode_notes(table: list[dict[str, Any]]) -> list[str]:
    """One line per bs whose instances fall into several modes: the counts per arm, and whether an
    arm falls into them in other proportions than ``skip`` does (which a within-mode ratio hides)."""
    notes = []
    for bs in dict.fromkeys(r["bs"] for r in table):
        at = [r for r in table if r["bs"] == bs]
        if at[0]["modes"] < 2:
            continue
        counts = ", ".join(f"{r['arm']} {'/'.join(map(str, r['mode_counts']))}" for r in at)
        line = (f"bs {bs}: the instances fall into {at[0]['modes']} modes (fastest first; a property of each "
                f"instance, not of time): {counts}")
        skip = next((r for r in at if r["arm"] == "skip"), None)
        if skip is not None and at[0]["modes"] == 2:
            odd = [r["arm"] for r in at
                   if r is not skip and fisher_exact(*r["mode_counts"], *skip["mode_counts"]) < 0.05]
            if odd:
                line += (f"; {', '.join(odd)} fall into them unlike skip (Fisher p < 0.05): that itself may be "
                         "a cost")
        notes.append(line)
    return notes


def supported(row: dict[str, Any]) -> bool:
    """Whether the run supports this row's ratio at all (instances to spare in a shared mode)."""
    return not (math.isnan(row["ratio_skip"]) or math.isnan(row["half"]))


def judging_width(row: dict[str, Any]) -> float:
    """The interval a row is judged on: the wider of its 95% band and the A/A floor."""
    return max(row["half"], row["aa_floor"] or 0.0)


def row_pct(row: dict[str, Any]) -> str:
    """``+2.00% ± 0.12%``: the row's ratio to ``skip`` with the interval it is judged on, or ``n/a``."""
    return pct(row["ratio_skip"], judging_width(row)) if supported(row) else "n/a"


def control_recovered(row: dict[str, Any]) -> bool:
    return recovered(row["ratio_skip"], row["half"], row["added"], row["aa_floor"])


def control_line(table: list[dict[str, Any]]) -> str:
    """What the positive control recovered and, from the upload's interval, the smallest cost this run
    names; or that the record has no control (written before the bench ran one)."""
    controls = [r for r in table if r["arm"] == CONTROL]
    if not controls:
        return "positive control: not measured (it needs the skip strategy; a record written before it has none)"
    read = ", ".join(f"bs {r['bs']} {100 * r['added']:+.2f}% added, read {row_pct(r)}" for r in controls)
    head = "positive control (a spin of known GPU time in a never-uploaded graph): "
    if not all(control_recovered(r) for r in controls):
        return f"{head}{read}: NOT recovered, so no verdict"
    ups = [r for r in table if r["arm"] == "upload" and supported(r)]
    seen = f"; this run names any cost above +{100 * max(map(judging_width, ups)):.2f}%" if ups else ""
    return f"{head}{read}: recovered{seen}"


TAILS = {COSTS: "the upload COSTS this GPU replay time, up to {:+.2f}% (bs {}); auto avoids it where no graph "
                "needs protection",
         FASTER: "uploaded graphs replay FASTER on this GPU, by {:+.2f}% (bs {})",
         NO_COST: "no cost beyond ±0.5% on this GPU (95% interval within it)",
         CANNOT: "no cost this run can resolve (its interval reaches beyond ±0.5%: run with more --instances)"}


def verdict(table: list[dict[str, Any]]) -> str:
    """One line that answers the user's question: does the upload cost this GPU anything? Judged as
    ``--engine`` judges (``verdicts.judged``), and only where the positive control was recovered."""
    ups = [r for r in table if r["arm"] == "upload"]
    if not ups or not any(r["arm"] == "skip" for r in table):
        return "verdict: needs the upload and skip strategies"
    if not all(supported(r) for r in ups):
        return ("verdict: none: this run cannot support the upload/skip ratio (needs --instances 2 or more, "
                "and instances of both in one mode)")
    missed = [r for r in table if r["arm"] == CONTROL and not control_recovered(r)]
    if missed:
        return (f"verdict: none: the positive control was not recovered (bs {missed[0]['bs']}: "
                f"{100 * missed[0]['added']:+.2f}% added, read {row_pct(missed[0])}), so this run could not have "
                "seen a cost of #775's size")
    words = {r["bs"]: judged(r["ratio_skip"], r["half"], r["aa_floor"]) for r in ups}
    word = worst(list(words.values()))
    parts = ", ".join(f"bs {r['bs']} {row_pct(r)}" for r in ups)
    if word in (COSTS, FASTER):
        hit = max((r for r in ups if words[r["bs"]] == word), key=lambda r: abs(r["ratio_skip"] - 1))
        tail = TAILS[word].format(100 * (hit["ratio_skip"] - 1), hit["bs"])
    else:
        tail = TAILS.get(word, TAILS[CANNOT])  # within the A/A floor: the run cannot resolve it either
    return f"verdict: upload vs never uploaded (skip) replay: {parts} (95% intervals over instances): {tail}"


def geometric_mean(ratios: list[float]) -> tuple[float, float]:
    """The geometric mean of ``ratios`` (one per process) and its relative standard error over them;
    ``(nan, nan)`` with fewer than two."""
    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return math.nan, math.nan
    return math.exp(statistics.fmean(logs)), statistics.stdev(logs) / math.sqrt(len(logs))


T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)  # Student's t, 97.5%, df 1..10


def t975(samples: int) -> float:
    """The two-sided 95% multiplier of a standard error from ``samples`` values (``samples - 1``
    degrees of freedom; nan below 2): 4.3 at three rounds, not 2. Past the table, 1.96 + 2.4/df is
    within 0.01 of the exact value."""
    if samples < 2:
        return math.nan
    df = samples - 1
    return T975[df - 1] if df <= len(T975) else 1.96 + 2.4 / df


def half_width(se: float, df: int) -> float:
    """The 95% interval's half-width of a log-ratio with standard error ``se`` on ``df`` degrees of
    freedom (Student's t: 4.3 SE at df 2, not 2); nan without a band."""
    return t975(df + 1) * se if df >= 1 and not math.isnan(se) else math.nan


def median_band(values: list[float]) -> tuple[float, float, float]:
    """The median of ``values`` and a 95% interval for it that assumes no distribution: the order
    statistics ``n/2 -+ 0.98 sqrt(n)`` (the binomial's normal approximation). ``(median, nan, nan)``
    with fewer than 8 values, too few for one."""
    ordered = sorted(values)
    n = len(ordered)
    if n < 8:
        return (statistics.median(ordered) if ordered else math.nan), math.nan, math.nan
    half = 0.98 * math.sqrt(n)
    low, high = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    return statistics.median(ordered), ordered[low], ordered[high]
