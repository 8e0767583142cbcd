"""Deferred protection: no upload at capture; a marked graph's first launch gets its fill on a thread.

A never-uploaded graph is only dangerous on its first launch, when the driver's implicit upload can
block ``cudaGraphLaunch`` behind the graph's own WAIT while the PLE fill that releases it waits for
the launch to return. For that one launch the guard submits the step's fill to a helper thread
before the launch and joins it after, the ordering FreeToken 0.2.1 already uses on ROCm
(``ple_disk.py`` 299-302, 328-341 in 0.2.1). Later launches take FreeToken's normal path, untouched.
Its state lives on FreeToken's own objects (docs/architecture.md, "The deferred guard").
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .device import Device, clear_flag

logger = logging.getLogger("freetoken_graphfix")


class StagedFill:
    """The fill ``host_fill_batch`` returned for one step; runs once, here or on the helper."""

    __slots__ = ("_fill", "bs", "ran", "error")

    def __init__(self, fill: Callable[[], None], bs: int) -> None:
        self._fill = fill
        self.bs = bs  # the padded batch size of the step it was staged for
        self.ran = False
        self.error: BaseException | None = None

    def __call__(self) -> None:
        # forward_host_ctx calls this after the launch returns: FreeToken's normal path, unless the
        # guard already ran the fill around this step's first launch
        if not self.ran:
            self.ran = True
            self._fill()

    def run_on_helper(self, inference_mode: bool) -> None:
        """The fill, on the helper thread in the engine thread's inference mode; its error kept for the engine thread to
        raise after the launch."""
        import torch

        self.ran = True
        try:
            with torch.inference_mode(inference_mode):  # thread-local: mirror the engine thread
                self._fill()
        except BaseException as exc:  # FreeToken's fill has already released its flag (signal)
            self.error = exc


class FillStager:
    """One ``DiskRowTable``'s ``host_fill_batch`` while graphs reading the table await a first launch."""

    graphfix_stager = True  # how ``detect`` tells the shim's own stand-in from another tool's shadow

    def __init__(self, table: Any) -> None:
        self._table = table
        self._original = inspect.getattr_static(type(table), "host_fill_batch")
        self._graphs: dict[weakref.ref, int] = {}  # the waiting graphs reading this table -> their bs
        self.pending_bs: frozenset[int] = frozenset()  # what __call__ checks, once per dispatch
        self.staged: StagedFill | None = None

    @staticmethod
    def of(table: Any) -> FillStager:
        """The table's stager, installed now if it has none."""
        current = vars(table).get("host_fill_batch")
        if isinstance(current, FillStager):
            return current
        stager = FillStager(table)
        table.host_fill_batch = stager
        return stager

    def __call__(self, batch: Any, use_graph: bool) -> Any:
        fill = self._original(self._table, batch, use_graph)
        if fill is None or not use_graph or batch.padded_size not in self.pending_bs:
            self.staged = None
            if not self._graphs:
                self.remove()  # every graph reading this table has launched (or died)
            return fill
        self.staged = StagedFill(fill, batch.padded_size)
        return self.staged

    def take(self) -> StagedFill | None:
        """The fill staged for the launch under way, handed over once: the next dispatch stages its own."""
        staged, self.staged = self.staged, None
        return staged

    def add(self, graph: Any, bs: int) -> None:
        """Stage fills for ``graph``'s size until its first launch; held weakly, so a graph freed first (a rebuild)
        stops it."""
        self._graphs[weakref.ref(graph, self._died)] = bs
        self.pending_bs = frozenset(self._graphs.values())

    def forget(self, graph: Any) -> None:
        """``graph`` launched: stop staging for it, and leave the table as shipped once no graph waits."""
        self._died(weakref.ref(graph))
        if not self._graphs:
            self.remove()

    def _died(self, ref: weakref.ref) -> None:  # a graph freed before its first launch (a rebuild)
        """A waiting graph was freed before its first launch (a rebuild, a dropped engine): its size no longer needs
        staging."""
        self._graphs.pop(ref, None)
        self.pending_bs = frozenset(self._graphs.values())

    def remove(self) -> None:
        """Take the stager off the table, unless something else shadowed ``host_fill_batch`` after it."""
        if vars(self._table).get("host_fill_batch") is self:
            del self._table.host_fill_batch


class FirstLaunch:
    """A marked graph's ``replay`` until its first launch returns: the fill runs on a helper thread."""

    def __init__(self, guard: FirstLaunchGuard, graph: Any, bs: int, stream: Any, tables: list[Any],
                 on_launched: Callable[[str], None]) -> None:
        self._guard, self._graph, self.bs, self.stream = guard, graph, bs, stream
        self._stagers = [FillStager.of(table) for table in tables]
        self._tables = tables
        self._on_launched = on_launched
        for stager in self._stagers:
            stager.add(graph, bs)

    def __call__(self) -> None:
        graph = self._graph
        fills = [stager.take() for stager in self._stagers]
        if any(fill is None or fill.ran or fill.bs != self.bs for fill in fills):
            # launched outside forward_host_ctx (or with another step's fill): nothing will release
            # the WAIT, so protect it the way FreeToken does rather than risk the deadlock
            logger.error("first launch of a deferred graph (bs=%s) with no PLE fill staged for it; "
                         "uploading it first (FreeToken's protection)", self.bs)
            self._guard.upload(graph, self.stream)
            self.consume("uploaded at first launch: no fill staged")
            return type(graph).replay(graph)

        import torch

        inference = torch.is_inference_mode_enabled()
        on_device = self._guard.device.helper_context()

        def run_fills() -> None:
            with on_device():  # the engine thread's CUDA device: no context on another GPU
                for fill in fills:
                    fill.run_on_helper(inference)

        helper = threading.Thread(target=run_fills, name="graphfix-first-fill", daemon=True)
        t0 = time.perf_counter()
        # The PLE store is engine-thread only and has no locks. Between start() and join() the
        # engine thread does nothing but cudaGraphLaunch, which touches no host-table state, and it
        # joins the helper before returning to forward_host_ctx: no other access can overlap.
        helper.start()
        try:
            type(graph).replay(graph)
        except BaseException:
            helper.join()
            # The launch failed, so no WAIT is pending, but the fill already released its flag:
            # withdraw that release (the next step's WAIT must not pass before its own fill) and
            # keep the mark, so the retry is still protected.
            for table in self._tables:
                clear_flag(table._flag)
            self._on_launched("launch raised; release withdrawn, still pending")
            raise
        helper.join()
        errors = [f.error for f in fills if f.error is not None]
        self.consume(f"fill on helper thread, {1e3 * (time.perf_counter() - t0):.2f} ms"
                     + (f"; fill raised {errors[0]!r}" if errors else ""))
        if errors:
            raise errors[0]  # the flag was released by FreeToken's own error path; output discarded

    def consume(self, how: str) -> None:
        """The graph is protected from here on: FreeToken's own ``replay`` is back on it."""
        if vars(self._graph).get("replay") is self:
            del self._graph.replay
        for stager in self._stagers:
            stager.forget(self._graph)
        self._guard.forget(self._graph)
        self._on_launched(how)


class FirstLaunchGuard:
    """Marks graphs for a guarded first launch, and finds the ones still waiting for it.

    Holds the pending graphs weakly, by object: a graph freed by a rebuild simply leaves, and
    nothing here keeps a dropped engine, its graphs or its tables alive.
    """

    def __init__(self, upload: Callable[[Any, Any], None], device: Device) -> None:
        self.upload = upload  # FreeToken's original _upload_graph: the fallback for a bare launch
        self.device = device
        self._pending: weakref.WeakSet[Any] = weakref.WeakSet()

    @property
    def pending(self) -> int:
        """Marked graphs still alive and not launched yet."""
        return len(self._pending)

    def mark(self, graph: Any, bs: int, stream: Any, tables: list[Any], on_launched: Callable[[str], None]) -> None:
        """Guard ``graph``'s first launch; ``tables`` are the DiskRowTables whose fill releases it."""
        graph.replay = FirstLaunch(self, graph, bs, stream, tables, on_launched)
        self._pending.add(graph)

    def forget(self, graph: Any) -> None:
        """Unmark a graph whose first launch has happened."""
        self._pending.discard(graph)

    def protect_pending(self, how: str) -> int:
        """Upload every graph still awaiting its first launch (FreeToken's own protection) and unmark
        it; returns how many. Raises whatever the upload raises, leaving the rest marked."""
        graphs = list(self._pending)
        for graph in graphs:
            first = vars(graph).get("replay")
            if isinstance(first, FirstLaunch):
                self.upload(graph, first.stream)
                first.consume(how)
            else:  # someone replaced our replay on the graph: nothing of ours left to remove
                self.forget(graph)
        return len(graphs)
