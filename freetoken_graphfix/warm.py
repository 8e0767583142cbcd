"""The warm replay: one threaded replay of a graph at capture time, its WAITs released from a helper.

Used where a graph holds a host-released WAIT and its first launch cannot be deferred (``warm`` mode,
and ``auto``/``deferred`` for WAITs the shim cannot move before the launch): after it, the graph's
first real launch is not its first, so it cannot block behind its own WAIT.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .detect import Wait
from .device import Device, clear_flag, read_flag, signal_flag


@dataclass(frozen=True)
class WarmOutcome:
    ok: bool
    detail: str  # what went wrong, naming the flag; empty when ok
    seconds: float
    finished: bool = True  # False: the graph still runs, so no fallback can be enqueued behind it


def _release_in_order(waits: Sequence[Wait], finished: threading.Event, stop: threading.Event) -> None:
    """Release each WAIT in capture order, the next only once the GPU has consumed the last.

    Never gives up on a WAIT while the graph may still reach it: a slow GPU (a long head, a
    shared GPU, a profiler) consumes it late, and a WAIT left unreleased would wedge the graph.
    Stops once the graph has finished (what is left was never going to be consumed) or on ``stop``
    (the launch raised: nothing is pending)."""
    pause = 20e-6
    for wait in waits:
        signal_flag(wait.flag)  # a host store: safe while other threads use CUDA
        while read_flag(wait.flag) != 0:
            if finished.is_set() or stop.is_set():
                return
            time.sleep(pause)
            pause = min(2 * pause, 5e-3)


def warm_replay(graph: Any, stream: Any, waits: Sequence[Wait], device: Device,
                *, timeout_s: float) -> WarmOutcome:
    """Replay ``graph`` once on ``stream``, releasing each host-released WAIT from a helper thread.

    The helper starts before the launch, because the launch of a never-uploaded graph can block
    until its WAIT is released. It releases the WAITs in capture order, one at a time (signal,
    then wait for the GPU's reset to 0), so several WAITs on one flag each get exactly one release.
    A flag is touched again only once the graph has finished: a WAIT released but never consumed
    (the graph holds fewer than were recorded) is reset to 0, since a surplus 1 would pre-release
    the next real step's WAIT (stale rows, silently). A graph still running after ``timeout_s`` is
    reported as such, its flags untouched and the helper left releasing, so it can still finish.
    """
    t0 = time.perf_counter()
    finished, stop = threading.Event(), threading.Event()
    helper = threading.Thread(target=_release_in_order, args=(waits, finished, stop), name="graphfix-warm",
                              daemon=True)
    helper.start()
    try:
        device.replay(graph, stream)
    except BaseException:
        stop.set()  # a launch that raised leaves no WAIT pending: withdraw every release
        helper.join()
        for wait in waits:
            clear_flag(wait.flag)
        raise
    if not device.wait_idle(stream, timeout_s):
        return WarmOutcome(False, f"the graph was still running {timeout_s:g} s after its warm launch (a WAIT the "
                           "shim did not see, or a stalled GPU); its recorded WAITs stay released in order",
                           time.perf_counter() - t0, finished=False)
    finished.set()
    helper.join()
    problems = []
    for i, wait in enumerate(waits):
        if read_flag(wait.flag) != 0:
            clear_flag(wait.flag)  # the graph has finished: no WAIT can be pending on it any more
            problems.append(f"WAIT #{i} on flag {wait.describe()['flag']} ({wait.kind}) was released but never "
                            "consumed by the finished graph; reset to 0")
    return WarmOutcome(not problems, "; ".join(problems), time.perf_counter() - t0)
