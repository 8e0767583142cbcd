"""One install of the shim, as an object: what ``install()`` was given, and what it found, wrapped,
recorded and decided since; its methods are what runs inside FreeToken's calls at capture time (record
each WAIT captured, delimit each capture pass, and decide and act for each graph: nothing, FreeToken's
upload, a warm replay, or a deferred first launch). ``shim`` makes one per install and reads it for
``status()``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .compat import AFTER_CAPTURE, Compat
from .config import Mode
from .device import Device

if TYPE_CHECKING:  # what runs only at capture is imported there: arming is paid by every FreeToken process
    from .decide import Action
    from .deferred import FirstLaunchGuard
    from .detect import Wait, WaitRecorder
    from .status_record import CapturePass, GraphRecord

logger = logging.getLogger("freetoken_graphfix")


class Shim:
    """One install: live until ``uninstall()`` detaches it, readable after (``status()`` still shows what it did)."""

    def __init__(self, mode: Mode, given: str, device: Device, warm_timeout_s: float, env_before: str | None) -> None:
        self.installed = True
        self.mode = mode
        self.given = given  # the mode as the user gave it (``FT_GRAPH_UPLOAD='0'``, ``mode='off'``), for messages
        self.device = device
        self.warm_timeout_s = warm_timeout_s
        self.env_before = env_before  # ``FT_GRAPH_UPLOAD`` before the shim exported its mode
        self.compat: Compat | None = None
        self.failure = ""  # inspecting FreeToken raised: why it was left untouched
        self.patches: list[tuple[Any, str, Any, Any]] = []  # (owner, attribute, original, our wrapper)
        self._recorder: WaitRecorder | None = None
        self.passes: list[CapturePass] = []
        self.current: CapturePass | None = None
        # the pass's deferred graphs, marked once it has filled graph_map: (graph, stream, tables, record)
        self.to_mark: list[tuple[Any, Any, list[Any], GraphRecord]] = []
        self.guard: FirstLaunchGuard | None = None
        self.uninstalled = ""  # what uninstall() did with graphs still awaiting a first launch
        self.mode_changes: list[str] = []
        self.capture_target: Callable[[], int | None] | None = None  # 0.1.3 passes: the graph under capture

    @property
    def recorder(self) -> WaitRecorder:
        """The WAITs captured since the last graph, built at the first capture (``detect`` is capture-time code)."""
        if self._recorder is None:
            from .detect import WaitRecorder

            self._recorder = WaitRecorder()
        return self._recorder

    def upload_function(self) -> Callable[[Any, Any], None]:
        """FreeToken's own ``_upload_graph`` where it has one (0.2.x), else the same driver call made by
        the shim (0.1.3 has none: ``upload`` mode there means FreeToken's missing ``cuGraphUpload``)."""
        for _, name, original, _ours in self.patches:
            if name == "_upload_graph":
                return original
        return lambda graph, stream: self.device.upload(graph, stream)

    def on_wait_enqueued(self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        """``row_store.wait_reset(stream, flag)`` (0.2.x), ``_ple_store.memop_wait_reset(stream, ptr)`` (0.1.3)."""
        result = wrapped(*args, **kwargs)
        if self.device.is_capturing():
            from .detect import wait_from_caller

            flag = args[1] if len(args) > 1 else kwargs.get("flag")
            target = self.capture_target
            self.recorder.add(wait_from_caller(flag), target() if target is not None else None)
        return result

    def on_capture_graphs(self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        """``GraphRunner._capture_graphs``: one capture pass, recorded; on 0.1.3 each graph is decided here,
        once the pass is done."""
        from .status_record import CapturePass

        self.recorder.clear()  # a capture outside any pass (a test, a tool) must not leak its WAITs in
        capture = self.current = CapturePass(len(self.passes), "GraphRunner._capture_graphs")
        self.passes.append(capture)
        after_capture = self.compat is not None and self.compat.flavor == AFTER_CAPTURE
        try:
            if after_capture:  # 0.1.3: each WAIT must be tied to its graph, decided once the loop is done
                with self.device.track_captures() as target:
                    self.capture_target = target
                    try:
                        result = wrapped(*args, **kwargs)
                    finally:
                        self.capture_target = None
                if self.patches:  # unless the shim stood down during the pass
                    self._decide_after_capture(instance, capture)
            else:
                result = wrapped(*args, **kwargs)
        except BaseException:
            for *_, record in self.to_mark:
                record.first_launch = "the capture pass raised: never launched"
            raise
        else:
            self._mark_deferred(instance)
            return result
        finally:
            self.recorder.clear()
            self.to_mark.clear()  # a pass that raised built no runner: nothing of it can launch
            self.current = None
            capture.done = True
            logger.info("%s", capture.summary())

    def _decide_after_capture(self, runner: Any, capture: CapturePass) -> None:
        """0.1.3: no per-graph seam, so every graph of the pass is decided once the loop is done, in
        capture order, from the WAITs enqueued while it was captured."""
        from .decide import Action

        graphs = sorted(getattr(runner, "graph_map", {}).items(), key=lambda kv: -kv[0])
        upload = self.upload_function()
        replayed = False
        for bs, graph in graphs:
            waits = self.recorder.take(graph)
            action = self._protect(graph, runner.stream, waits, f"bs={bs}", capture,
                                   lambda graph=graph: upload(graph, runner.stream))
            replayed |= action is Action.WARM
        if replayed:  # a warm replay ran the graph's MoE-offload copies: reset as the loop itself does
            reset = getattr(runner, "_reset_moe_offload_cache", None)
            if callable(reset):
                reset()

    def _mark_deferred(self, runner: Any) -> None:
        """Guard the first launch of the pass's deferred graphs, now that ``graph_map`` names their bs."""
        by_graph = {id(g): bs for bs, g in getattr(runner, "graph_map", {}).items()}
        if self.to_mark and self.guard is None:  # made here, not at arming: most processes never need one
            from .deferred import FirstLaunchGuard

            self.guard = FirstLaunchGuard(self.upload_function(), self.device)
        for graph, stream, tables, record in self.to_mark:
            bs = by_graph.get(id(graph))
            if bs is None:  # not kept by the runner: it can never be launched through it
                record.first_launch = "not in the runner's graph_map: never launched"
                continue
            self.guard.mark(graph, bs, stream, tables, lambda how, record=record: setattr(record, "first_launch", how))

    def on_upload_graph(self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> None:
        """0.2.x: in place of FreeToken's ``_upload_graph(graph, stream)``, right after each capture."""
        from .status_record import CapturePass

        graph, stream = _graph_and_stream(args, kwargs)
        capture = self.current
        if capture is None:  # called outside a GraphRunner capture pass (a test or a bench)
            capture = CapturePass(len(self.passes), "direct _upload_graph call", done=True)
            self.passes.append(capture)
        from .detect import capture_batch_size

        bs = capture_batch_size()
        name = f"bs={bs}" if bs is not None else f"graph #{len(capture.graphs)}"
        self._protect(graph, stream, self.recorder.drain(), name, capture, lambda: wrapped(*args, **kwargs))

    def _protect(self, graph: Any, stream: Any, waits: list[Wait], name: str, capture: CapturePass,
                 upload: Callable[[], None]) -> Action:
        """Decide for one graph and act: nothing, ``upload()``, a warm replay, or a deferred mark."""
        from .decide import Action, decide
        from .status_record import GraphRecord

        t0 = time.perf_counter()
        decision = decide(self.mode, waits, defer_unavailable=self._defer_unavailable())
        record = GraphRecord(len(capture.graphs), name, [w.describe() for w in waits], decision.action.value,
                             decision.reason, 0.0)
        capture.graphs.append(record)
        try:
            if decision.action is Action.UPLOAD:
                upload()
            elif decision.action is Action.WARM:
                if self.mode in (Mode.AUTO, Mode.DEFERRED):
                    logger.warning("graph %s cannot be deferred (%s); protected by a warm replay instead",
                                   name, decision.reason)
                self._warm(graph, stream, waits, name, upload)
            elif decision.action is Action.DEFERRED:
                record.first_launch = "pending"
                tables = list({id(w.owner): w.owner for w in waits if w.after_launch}.values())
                self.to_mark.append((graph, stream, tables, record))
            elif decision.action is Action.EXPOSED:
                flags = ", ".join(f"{w.kind} flag {w.describe()['flag']}" for w in waits if w.after_launch)
                logger.warning("graph %s holds a WAIT released only after its launch returns (%s); "
                               "FT_GRAPH_UPLOAD=skip: its first launch can deadlock", name, flags)
        finally:
            record.hook_ms = 1e3 * (time.perf_counter() - t0)
        return decision.action

    def _defer_unavailable(self) -> str | None:
        """Why the graph being decided cannot get a deferred first launch, ``None`` when it can."""
        compat = self.compat
        if compat is None:
            return "FreeToken not inspected"
        if not compat.deferred:
            return compat.deferred_reason
        if self.current is None:
            return "captured outside GraphRunner._capture_graphs: no runner launches it"
        return None

    def _warm(self, graph: Any, stream: Any, waits: list[Wait], name: str, upload: Callable[[], None]) -> None:
        """The warm replay of one graph; where it failed, FreeToken's upload instead, or an error where
        falling back would leave the graph running or a rank on another path than its peers."""
        from .errors import WarmReplayError
        from .warm import warm_replay

        outcome = warm_replay(graph, stream, waits, self.device, timeout_s=self.warm_timeout_s)
        if outcome.ok:
            return
        message = f"warm replay of graph {name} failed: {outcome.detail}"
        if not outcome.finished or self.device.world_size() > 1:
            # A graph still running cannot have an upload queued behind it (its sync would wait on
            # it); and under tensor parallelism the peers warm-replayed (and ran its collectives): a
            # silent fallback here would put this rank on a different path from theirs.
            raise WarmReplayError(message)
        logger.error("%s; falling back to FreeToken's cuGraphUpload", message)
        upload()


def _graph_and_stream(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """``_upload_graph``'s graph and stream, however FreeToken passed them (by position or by name)."""
    values = list(args) + [kwargs[k] for k in ("graph", "stream") if k in kwargs]
    return values[0], values[1]
