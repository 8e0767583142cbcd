"""Per-graph decisions, and the warm replay that protects a graph at capture time.

The decision depends only on the mode and on what the graph holds, never on timing or rank:
under tensor parallelism every rank captures the same graphs, a warm replay runs the graph's
NCCL collectives, and ranks that decided differently would hang.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .config import Mode
from .detect import Wait
from .device import Device, clear_flag, read_flag, signal_flag


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
        return Decision(Action.NOOP, "no host-released WAIT")
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


@dataclass(frozen=True)
class WarmOutcome:
    ok: bool
    detail: str  # what went wrong, naming the flag; empty when ok
    seconds: float
    finished: bool = True  # False: the graph still runs, so no fallback can be enqueued behind it


def _until_zero(flag: Any, deadline: float, stop: threading.Event) -> bool:
    while read_flag(flag) != 0:
        if time.monotonic() > deadline or stop.is_set():
            return False
        time.sleep(20e-6)
    return True


def warm_replay(graph: Any, stream: Any, waits: Sequence[Wait], device: Device,
                *, timeout_s: float) -> WarmOutcome:
    """Replay ``graph`` once on ``stream``, releasing each host-released WAIT from a helper thread.

    The helper starts before the launch, because the launch of a never-uploaded graph can block
    until its WAIT is released. It releases the WAITs in capture order, one at a time (signal,
    then wait for the GPU's reset to 0), so several WAITs on one flag each get exactly one release.
    A WAIT not consumed within ``timeout_s`` is still released, so none is left pending; every
    flag ends at 0 (a surplus 1 would pre-release the next real step's WAIT: stale rows, silently).
    """
    t0 = time.perf_counter()
    problems: list[str] = []
    stop = threading.Event()

    def release() -> None:
        for i, wait in enumerate(waits):
            signal_flag(wait.flag)  # a host store: safe while other threads use CUDA
            if not _until_zero(wait.flag, time.monotonic() + timeout_s, stop) and not stop.is_set():
                problems.append(f"WAIT #{i} on flag {wait.describe()['flag']} ({wait.kind}) "
                                f"not consumed within {timeout_s:g} s")

    helper = threading.Thread(target=release, name="graphfix-warm", daemon=True)
    helper.start()
    try:
        device.replay(graph, stream)
    except BaseException:
        stop.set()  # a launch that raised leaves no WAIT pending: withdraw every release
        helper.join()
        for wait in waits:
            clear_flag(wait.flag)
        raise
    helper.join(timeout_s * (len(waits) + 1))
    if helper.is_alive():
        stop.set()
        helper.join()
        problems.append("the releasing thread did not finish in time")
    finished = device.wait_idle(stream, timeout_s * (len(waits) + 1))
    if not finished:
        problems.append(f"the graph did not finish within {timeout_s * (len(waits) + 1):g} s")
    for wait in waits:
        if read_flag(wait.flag) != 0:
            clear_flag(wait.flag)
            problems.append(f"flag {wait.describe()['flag']} ({wait.kind}) was left released; reset to 0")
    return WarmOutcome(not problems, "; ".join(dict.fromkeys(problems)), time.perf_counter() - t0, finished)
