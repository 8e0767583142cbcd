"""Per-graph decisions: what replaces FreeToken's capture-time upload for one graph.

The decision depends only on the mode and on what the graph holds, never on timing or rank:
under tensor parallelism every rank captures the same graphs, a warm replay runs the graph's
NCCL collectives, and ranks that decided differently would hang.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from .config import Mode
from .detect import Wait

NO_WAIT = "no host-released WAIT"  # a graph that needs nothing: the reason of every no-op


class Action(str, enum.Enum):
    """What the shim does in place of FreeToken's ``_upload_graph`` for one graph."""

    NOOP = "no-op"  # nothing: no WAIT is released after the launch
    UPLOAD = "upload"  # FreeToken's own cuGraphUpload + synchronize
    WARM = "warm"  # one threaded warm replay now
    DEFERRED = "deferred"  # nothing now; the first launch's fill runs on a helper thread
    EXPOSED = "exposed"  # nothing, although the first launch can deadlock (mode skip)


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def decide(mode: Mode, waits: Sequence[Wait], *, defer_unavailable: str | None = None) -> Decision:
    """Choose the protection for one graph from ``mode`` and the WAITs it holds.

    ``defer_unavailable`` is ``None`` when the deferred hooks can be installed, else why not.
    Pure and deterministic: the same graph gets the same decision on every rank.
    """
    if mode is Mode.UPLOAD:
        return Decision(Action.UPLOAD, "FT_GRAPH_UPLOAD=upload")
    exposed = [w for w in waits if w.after_launch]
    if not exposed:
        return Decision(Action.NOOP, NO_WAIT)
    kinds = ", ".join(sorted({w.kind for w in exposed}))
    if mode is Mode.SKIP:
        return Decision(Action.EXPOSED, f"{kinds}: first launch can deadlock")
    if mode is Mode.WARM:
        return Decision(Action.WARM, kinds)
    # auto and deferred: defer where the release can be moved before the launch, else warm
    if defer_unavailable is not None:
        return Decision(Action.WARM, f"{kinds}; deferred unavailable: {defer_unavailable}")
    undeferrable = sorted({w.kind for w in exposed if not w.deferrable})
    if undeferrable:
        return Decision(Action.WARM, f"{kinds}; cannot defer {', '.join(undeferrable)}")
    return Decision(Action.DEFERRED, kinds)
