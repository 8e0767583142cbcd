"""Statistics of the replay benchmark, apart from their rendering (``report``)."""

from __future__ import annotations

import math
import statistics
from typing import Any


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


def standard_error(a: list[float], b: list[float]) -> float:
    """Relative standard error of mean(a) / mean(b), instances as the samples; nan below two each."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    return (ma / mb) * ((statistics.variance(a) / len(a)) / ma**2 + (statistics.variance(b) / len(b)) / mb**2) ** 0.5


def rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's figures per (arm, bs), derived from the raw record: every instance's replays
    pooled, the ratio of pooled medians to ``skip``'s, the spread of the instances' medians
    (identically treated graphs differ by that much), and the ratio's standard error from the
    instances' medians, the unit that varies (``nan`` with fewer than two instances)."""
    arms = record["arms"]
    skip = {bs: (summary(pooled(times))["median"], instance_medians(times))
            for bs, times in arms["skip"]["replay_us"].items()} if "skip" in arms else {}
    out = []
    for arm, rec in arms.items():
        for bs, per_instance in rec["replay_us"].items():
            s = summary(pooled(per_instance))
            medians = instance_medians(per_instance)
            skip_median, skip_medians = skip.get(bs, (math.nan, []))
            graph = rec["graphs"].get(f"bs={bs}", {"action": ["?"], "hook_ms": []})
            first = rec["first_launch"][bs]
            out.append({
                "arm": arm, "bs": bs, "actions": sorted(set(graph["action"])), **s,
                "ratio_skip": s["median"] / skip_median, "ratio_se": standard_error(medians, skip_medians),
                "instance_spread": (max(medians) - min(medians)) / s["median"] if len(medians) > 1 else 0.0,
                "first_launch_ms": statistics.median(first["launch_ms"]), "blocked": sum(first["blocked"]),
                "instances": len(per_instance),
                "hook_ms": statistics.median(graph["hook_ms"]) if graph["hook_ms"] else math.nan,
                "logits_equal_upload": rec["logits_equal_upload"],
            })
    return out


def verdict(table: list[dict[str, Any]]) -> str:
    """One line that answers the user's question: does the upload cost this GPU anything?"""
    ups = [r for r in table if r["arm"] == "upload" and not math.isnan(r["ratio_skip"])]
    if not ups:
        return "verdict: needs the upload and skip strategies"
    if any(math.isnan(r["ratio_se"]) for r in ups):
        return "verdict: needs --instances 2 or more (the instances' spread is the yardstick)"
    parts = ", ".join(f"bs {r['bs']} {100 * (r['ratio_skip'] - 1):+.2f}% ± {200 * r['ratio_se']:.2f}%" for r in ups)
    costly = [r for r in ups if r["ratio_skip"] - 1 > 2 * r["ratio_se"]]
    return (f"verdict: upload vs never uploaded (skip) replay: {parts} (± 2 standard errors over instances): "
            + ("the upload COSTS this GPU replay time; auto avoids it where no graph needs protection"
               if costly else "no measurable cost on this GPU"))
