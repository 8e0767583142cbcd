"""Statistics of the replay benchmark, apart from their rendering (``report``).

The unit that varies is the graph instance, not the replay: separately captured copies of one graph,
treated identically, replay up to ~1% apart on the H200, and on some machines they fall into
distinct modes about 6% apart that each instance keeps for the whole run (a property of the
instance's placement, not of time). So every ratio is computed from the instances' medians, within
each mode the instances fall into, and its band is two standard errors over instances; a ratio the
run cannot support (one instance, no shared mode) is not printed.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

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


def ratio(arm: list[float], base: list[float], bounds: list[float]) -> tuple[float, float]:
    """``mean(arm) / mean(base)`` over instance medians, within the modes ``bounds`` draws, and its
    relative standard error (``grouped_ratio``)."""
    groups = [([a for a in arm if mode_of(a, bounds) == k], [b for b in base if mode_of(b, bounds) == k])
              for k in range(len(bounds))]
    return grouped_ratio(groups)[:2]


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


def rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's figures per (arm, bs), derived from the raw record: every instance's replays
    pooled for the distribution, the modes all instances of that bs fall into, the ratio to
    ``skip`` (never uploaded) within modes with its standard error, and each arm's mode counts."""
    arms = record["arms"]
    out = []
    for bs in next(iter(arms.values()))["replay_us"]:
        medians = {arm: instance_medians(rec["replay_us"][bs]) for arm, rec in arms.items()}
        bounds = modes([m for ms in medians.values() for m in ms])
        for arm, rec in arms.items():
            per_instance = rec["replay_us"][bs]
            s = summary(pooled(per_instance))
            ratio_skip, se = ratio(medians[arm], medians["skip"], bounds) if "skip" in medians else (math.nan,) * 2
            graph = rec["graphs"].get(f"bs={bs}", {"action": ["?"], "hook_ms": []})
            first = rec["first_launch"][bs]
            ms = medians[arm]
            out.append({
                "arm": arm, "bs": bs, "actions": sorted(set(graph["action"])), **s,
                "ratio_skip": ratio_skip, "ratio_se": se, "modes": len(bounds),
                "mode_counts": membership(ms, bounds),
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
    return not (math.isnan(row["ratio_skip"]) or math.isnan(row["ratio_se"]))


def verdict(table: list[dict[str, Any]]) -> str:
    """One line that answers the user's question: does the upload cost this GPU anything?"""
    ups = [r for r in table if r["arm"] == "upload"]
    if not ups or not any(r["arm"] == "skip" for r in table):
        return "verdict: needs the upload and skip strategies"
    if not all(supported(r) for r in ups):
        return ("verdict: none: this run cannot support the upload/skip ratio (needs --instances 2 or more, "
                "and instances of both in one mode)")
    parts = ", ".join(f"bs {r['bs']} {100 * (r['ratio_skip'] - 1):+.2f}% ± {200 * r['ratio_se']:.2f}%" for r in ups)
    costly = [r for r in ups if r["ratio_skip"] - 1 > 2 * r["ratio_se"]]
    wide = [r for r in ups if 2 * r["ratio_se"] > 0.005]
    worst = max(costly, key=lambda r: r["ratio_skip"]) if costly else None
    tail = (f"the upload COSTS this GPU replay time, up to {100 * (worst['ratio_skip'] - 1):+.2f}% (bs {worst['bs']}); "
            "auto avoids it where no graph needs protection" if worst else
            "no cost this run can resolve (its band is wider than 0.5%: run with more --instances)" if wide else
            "no measurable cost on this GPU")
    return f"verdict: upload vs never uploaded (skip) replay: {parts} (± 2 standard errors over instances): {tail}"


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
