"""The words a ratio to never-uploaded graphs is judged in, shared by the rig and ``bench engine``, and
the positive control's check: a bench that reads "no cost" must show it could have seen one."""

from __future__ import annotations

import math

RESOLUTION = 0.005  # the 95% interval's half-width a ratio needs to resolve #775's 1-2%
COSTS, FASTER = "COSTS this GPU", "FASTER on this GPU"
NO_COST = "no cost beyond ±0.5% (95% interval within it)"
CANNOT = "no cost this run can resolve (its 95% interval reaches beyond ±0.5%)"
WITHIN_AA = "within the A/A control's noise (±{:.2f}%): identically treated arms came that far apart"
REPORTERS_CHECK = ("To check #775 on the GPU it was reported on (the same workload, Nsight Systems' kernel "
                   "timelines): freetoken-graphfix's docs/measuring.md, \"Checking #775 where it was reported\"")
CONTROL_ADDED = 0.02  # the positive control's extra GPU time, as a fraction of the step: #775's size


def pct(ratio: float, half: float) -> str:
    """``+0.02% ± 0.10%`` (the ratio with the interval it is judged on), or ``n/a``."""
    if math.isnan(ratio):
        return "n/a"
    return f"{100 * (ratio - 1):+.2f}%" + ("" if math.isnan(half) else f" ± {100 * half:.2f}%")


def judged(ratio: float, half: float, floor: float | None = None) -> str:
    """What a ratio to never-uploaded graphs means, on its 95% interval (``half``). An interval inside
    ±0.5% is no cost, even one that excludes 1: #775's regression is 1-2%, and a resolved +0.03% is not
    one. ``floor`` is how far the A/A control's identical arms came apart (with its band): no figure
    may claim to resolve less."""
    if math.isnan(ratio) or math.isnan(half):
        return CANNOT
    wide = max(half, floor or 0.0)
    if abs(ratio - 1) + wide <= RESOLUTION:
        return NO_COST
    if ratio - 1 > wide:
        return COSTS
    if 1 - ratio > wide:
        return FASTER
    return WITHIN_AA.format(100 * floor) if floor is not None and floor > half else CANNOT


def worst(verdicts: list[str]) -> str:
    """The line's verdict over its batch sizes: a cost or a speed-up anywhere first, then the weakest."""
    order = (COSTS, FASTER, CANNOT)
    return next((v for v in order if v in verdicts), next((v for v in verdicts if v != NO_COST), NO_COST))


def recovered(ratio: float, half: float, added: float, floor: float | None = None) -> bool:
    """Whether a positive control of known extra cost ``added`` was seen: named a cost, and read
    within the same interval (the wider of its band and the A/A floor) a real cost would be judged on."""
    if math.isnan(ratio) or math.isnan(half) or math.isnan(added):
        return False
    wide = max(half, floor or 0.0)
    return judged(ratio, half, floor) == COSTS and abs(ratio - 1 - added) <= wide
