"""The benchmarks' statistics, apart from the words that judge them (``verdicts``) and their rendering.

The unit that varies is the thing measured apart, not the single timing: a separately captured graph
instance in the rig (copies of one graph, treated identically, replay up to ~1% apart on the H200,
and on some machines fall into clusters about 6% apart that each instance keeps for the whole run),
a process in ``bench engine``. So every ratio is computed from those units' medians, within each
cluster they fall into, and its band is a 95% interval over them (Student's t for that few).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

CLUSTER_GAP = 0.015
"""Instances whose medians sit this far apart (relative to the median of all) with nothing between
are in different clusters: several times the spread identically treated instances show within one."""


@dataclass(frozen=True)
class Summary:
    """The median of some values and two percentiles of them (more robust than the mean), with the count."""

    n: int
    median: float = math.nan
    low: float = math.nan
    high: float = math.nan
    percentiles: tuple[int, int] = (10, 90)


@dataclass(frozen=True)
class Ratio:
    """A ratio of means compared within groups (``grouped_ratio``), its relative standard error and
    degrees of freedom; ``half`` is its 95% interval's half-width."""

    ratio: float
    se: float
    dof: int

    @property
    def half(self) -> float:
        """The 95% interval's half-width (Student's t on the ratio's degrees of freedom)."""
        return half_width(self.se, self.dof)


NO_RATIO = Ratio(math.nan, math.nan, 0)


def summary(values: list[float], percentiles: tuple[int, int] = (10, 90)) -> Summary:
    """Median and two percentiles (p10/p90 by default), with the count."""
    if not values:
        return Summary(0, percentiles=percentiles)
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return Summary(len(values), statistics.median(values), q[percentiles[0] - 1], q[percentiles[1] - 1], percentiles)


def pooled(per_instance: list[list[float]]) -> list[float]:
    """Every replay time of every instance in one list: the table's median and percentiles."""
    return [t for times in per_instance for t in times]


def instance_medians(per_instance: list[list[float]]) -> list[float]:
    """One median per instance: the instance, not the replay, is the unit that varies."""
    return [statistics.median(times) for times in per_instance if times]


def clusters(medians: list[float], gap: float = CLUSTER_GAP) -> list[float]:
    """Upper bounds of the clusters the medians fall into (sorted; the last is ``inf``): the medians
    split wherever two neighbours are more than ``gap`` apart, relative to their median."""
    if not medians:
        return [math.inf]
    ordered, scale = sorted(medians), statistics.median(medians)
    bounds = [(a + b) / 2 for a, b in zip(ordered, ordered[1:], strict=False) if (b - a) / scale > gap]
    return [*bounds, math.inf]


def cluster_of(value: float, bounds: list[float]) -> int:
    """The index of the cluster ``value`` falls into, for ``bounds`` from ``clusters``."""
    return next(i for i, bound in enumerate(bounds) if value < bound)


def ratio(arm: list[float], base: list[float], bounds: list[float]) -> Ratio:
    """``mean(arm) / mean(base)`` over instance medians, within the clusters ``bounds`` draws
    (``grouped_ratio``)."""
    groups = [([a for a in arm if cluster_of(a, bounds) == k], [b for b in base if cluster_of(b, bounds) == k])
              for k in range(len(bounds))]
    return grouped_ratio(groups)


def grouped_ratio(groups: list[tuple[list[float], list[float]]]) -> Ratio:
    """``mean(arm) / mean(base)`` compared within each group (a cluster) holding both, its relative
    standard error and degrees of freedom.

    The groups' log-ratios are weighted by their inverse variance, from the relative spread of the
    values within their group, pooled over groups and both arms (identically treated units differ by
    that much). ``(nan, nan, 0)`` when no group holds two values of one and one of the other."""
    shared = [(a, b) for a, b in groups if a and b]
    deviations = [x / statistics.fmean(g) - 1 for pair in shared for g in pair for x in g]
    dof = len(deviations) - 2 * len(shared)
    if not shared or dof < 1:
        return NO_RATIO
    spread = math.sqrt(sum(d * d for d in deviations) / dof)
    if spread == 0:
        spread = 1e-12
    weights = [1 / (spread**2 * (1 / len(a) + 1 / len(b))) for a, b in shared]
    log_ratio = sum(w * math.log(statistics.fmean(a) / statistics.fmean(b))
                    for w, (a, b) in zip(weights, shared, strict=True)) / sum(weights)
    return Ratio(math.exp(log_ratio), 1 / math.sqrt(sum(weights)), dof)


def membership(medians: list[float], bounds: list[float]) -> list[int]:
    """How many of ``medians`` fall in each cluster."""
    counts = [0] * len(bounds)
    for m in medians:
        counts[cluster_of(m, bounds)] += 1
    return counts


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided p-value of Fisher's exact test on the 2x2 table ``[[a, b], [c, d]]``: do two arms
    fall into two clusters in different proportions? In log space (``lgamma``), each table's
    probability once: linear in the instances, however many a record lists."""
    n, row, col = a + b + c + d, a + b, a + c
    low, high = max(0, row + col - n), min(row, col)
    logs = [_log_comb(col, x) + _log_comb(n - col, row - x) - _log_comb(n, row) for x in range(low, high + 1)]
    observed = logs[a - low]
    return min(1.0, sum(math.exp(v) for v in logs if v <= observed + 1e-7 * max(1.0, abs(observed))))


def _log_comb(n: int, k: int) -> float:
    """``log(comb(n, k))``, without the big integer."""
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


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
