"""``bench rig``'s figures, derived from its record (``records.RigRecord``): per mode and bs, the replay
distribution, the ratio to ``skip`` (never uploaded) within the clusters the never-uploaded instances
fall into, the A/A floor among never-uploaded modes, and the positive control's known extra cost."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..records import GraphActions, RigArm, RigRecord
from ..stats import NO_RATIO, Ratio, clusters, half_width, instance_medians, membership, pooled, ratio, summary

CONTROL = "control"
"""The positive control's arm: never uploaded, plus a spin of known length in the graph."""


@dataclass(frozen=True)
class Row:
    """One mode at one bs."""

    arm: str
    bs: str
    actions: list[str]
    n: int  # replays pooled over instances
    median: float  # µs
    p10: float
    p90: float
    to_skip: Ratio  # the instances' mean over skip's, within clusters
    aa_floor: float | None  # how far the never-uploaded modes came apart (with its band)
    added: float  # the control's known extra cost (nan for any other arm)
    clusters: int
    cluster_counts: list[int]
    instance_spread: float  # max - min of the instances' medians over the pooled median
    first_launch_ms: float
    blocked: int
    instances: int
    hook_ms: float
    logits_equal_upload: bool

    @property
    def supported(self) -> bool:
        """Whether the run supports this row's ratio at all (instances to spare in a shared cluster)."""
        return not (math.isnan(self.to_skip.ratio) or math.isnan(self.to_skip.half))

    @property
    def judging_width(self) -> float:
        """The interval a row is judged on: the wider of its 95% band and the A/A floor."""
        return max(self.to_skip.half, self.aa_floor or 0.0)


def never_uploaded(arm: str, rec: RigArm, bs: str) -> bool:
    """Whether ``arm``'s graphs at ``bs`` replay as captured, never uploaded (skip, warm, deferred,
    auto, and every mode where nothing needs protection): the A/A set. The control is not one of them."""
    graph = rec.graphs.get(f"bs={bs}")
    return arm != CONTROL and graph is not None and bool(graph.action) and "upload" not in graph.action


def aa_floor(medians: dict[str, list[float]], reference: list[str], bounds: list[float]) -> float | None:
    """How far the never-uploaded modes came apart from ``skip`` (the widest, with its 95% band): no
    ratio to ``skip`` may claim to resolve less. ``None`` with no second never-uploaded mode."""
    floors = []
    for arm in reference:
        if arm != "skip":
            r = ratio(medians[arm], medians["skip"], bounds)
            if not math.isnan(r.ratio):
                floors.append(abs(r.ratio - 1) + half_width(r.se, r.dof))
    return max(floors) if floors else None


def control_added(record: RigRecord, skip: list[float] | None) -> float:
    """The control's known extra cost at one bs: its spin's own GPU time over skip's replay time."""
    if not skip or record.control is None:
        return math.nan
    return record.control.spin_us / statistics.fmean(skip)


def rows(record: RigRecord) -> list[Row]:
    """The table's figures per (mode, bs), derived from the raw record."""
    arms = record.arms
    out = []
    for bs in next(iter(arms.values())).replay_us:
        medians = {arm: instance_medians(rec.replay_us[bs]) for arm, rec in arms.items()}
        reference = [arm for arm, rec in arms.items() if never_uploaded(arm, rec, bs)]
        bounds = clusters([m for arm in (reference or medians) for m in medians[arm]])
        floor = aa_floor(medians, reference, bounds) if "skip" in reference else None
        for arm, rec in arms.items():
            s = summary(pooled(rec.replay_us[bs]))
            ms = medians[arm]
            graph = rec.graphs.get(f"bs={bs}", GraphActions(["?"], []))
            first = rec.first_launch[bs]
            out.append(Row(
                arm, bs, sorted(set(graph.action)), s.n, s.median, s.low, s.high,
                ratio(ms, medians["skip"], bounds) if "skip" in medians else NO_RATIO, floor,
                control_added(record, medians.get("skip")) if arm == CONTROL else math.nan, len(bounds),
                membership(ms, bounds), (max(ms) - min(ms)) / s.median if len(ms) > 1 else 0.0,
                statistics.median(first.launch_ms), sum(first.blocked), len(rec.replay_us[bs]),
                statistics.median(graph.hook_ms) if graph.hook_ms else math.nan, rec.logits_equal_upload))
    return out
