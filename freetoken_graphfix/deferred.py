"""Deferred protection: no upload at capture; a marked graph's first launch gets its fill on a thread.

A never-uploaded graph is only dangerous on its first launch, when the driver's implicit upload can
block ``cudaGraphLaunch`` behind the graph's own WAIT while the PLE fill that releases it waits for
the launch to return. For that one launch the guard submits the step's fill to a helper thread
before the launch and joins it after, the ordering FreeToken 0.2.1 already uses on ROCm
(``ple_disk.py`` 299-302, 328-341). Later launches take FreeToken's normal path: once every marked
graph has launched, the hooks are removed and nothing of the shim is left on the decode path.

Hooks, installed only while a marked graph awaits its first launch:

- ``GraphRunner.replay`` (class attribute; ``engine.py`` binds the class by name) tells which graph
  is launching: ``graph_map[batch.padded_size]``.
- ``DiskRowTable.host_fill_batch`` returns the step's deferred fill on CUDA wait-sync. FreeToken's
  ``forward_host_ctx`` looks it up on the class at every call, so the patch also reaches tables
  (and models holding a bound ``forward_host_ctx``) built before it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .device import clear_flag

logger = logging.getLogger("freetoken_graphfix")


class StagedFill:
    """The fill ``host_fill_batch`` returned for one step; runs once, here or on the helper."""

    __slots__ = ("_fill", "ran", "error")

    def __init__(self, fill: Callable[[], None]) -> None:
        self._fill = fill
        self.ran = False
        self.error: BaseException | None = None

    def __call__(self) -> None:
        # forward_host_ctx calls this after the launch returns: FreeToken's normal path, unless the
        # guard already ran the fill around this step's first launch
        if not self.ran:
            self.ran = True
            self._fill()

    def run_on_helper(self, inference_mode: bool) -> None:
        import torch

        self.ran = True
        try:
            with torch.inference_mode(inference_mode):  # thread-local: mirror the engine thread
                self._fill()
        except BaseException as exc:  # FreeToken's fill has already released its flag (signal)
            self.error = exc


@dataclass
class _Mark:
    graph: weakref.ref  # weak: a rebuild's destroy_cuda_graphs frees the graph, and the mark goes stale
    tables: list[Any]  # the DiskRowTables whose fill releases its WAITs
    on_launched: Callable[[str], None]


class FirstLaunchGuard:
    """Runs the PLE fill of each marked graph's first launch on a helper thread around the launch.

    While armed, ``GraphRunner.replay`` and ``DiskRowTable.host_fill_batch`` are plain functions,
    not wrapt proxies: they sit on the decode path until the last marked graph has launched, and a
    plain function with an ``id()`` lookup costs about 0.12 µs a call where a wrapt wrapper with a
    weak-key lookup cost 1.1 µs (development machine).
    """

    def __init__(self, runner_cls: type, upload: Callable[[Any, Any], None]) -> None:
        self._runner_cls = runner_cls
        self._upload = upload  # FreeToken's original _upload_graph: the fallback for a bare launch
        self._marked: dict[int, _Mark] = {}  # by id(graph)
        self._staged: dict[int, StagedFill] = {}  # by id(table): this step's fill
        self._armed: list[tuple[type, str, Any, Any]] = []  # (class, name, original, ours)

    @property
    def armed(self) -> bool:
        return bool(self._armed)

    @property
    def pending(self) -> int:
        """Marked graphs still alive and not launched yet."""
        return sum(mark.graph() is not None for mark in self._marked.values())

    def mark(self, graph: Any, tables: list[Any], on_launched: Callable[[str], None]) -> None:
        """Guard ``graph``'s first launch; ``tables`` are the DiskRowTables whose fill releases it."""
        self._marked[id(graph)] = _Mark(weakref.ref(graph), tables, on_launched)
        for table in tables:
            self._arm(_defining_class(type(table), "host_fill_batch"), "host_fill_batch", self._host_fill_hook)
        self._arm(self._runner_cls, "replay", self._replay_hook)

    def disarm(self) -> None:
        """Remove the hooks, restoring the exact original class attributes."""
        while self._armed:
            restore(*self._armed.pop())

    def forget(self) -> None:
        """Drop every mark (the graphs are being destroyed) and remove the hooks."""
        self._marked.clear()
        self._staged.clear()
        self.disarm()

    def _arm(self, cls: type, name: str, make: Callable[[Any], Any]) -> None:
        if any(c is cls and n == name for c, n, _, _ in self._armed):
            return
        original = vars(cls)[name]
        ours = functools.wraps(original)(make(original))
        setattr(cls, name, ours)
        self._armed.append((cls, name, original, ours))

    def _host_fill_hook(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def host_fill_batch(table: Any, *args: Any, **kwargs: Any) -> Any:
            fill = original(table, *args, **kwargs)
            if fill is None:
                return None
            staged = self._staged[id(table)] = StagedFill(fill)
            return staged

        return host_fill_batch

    def _replay_hook(self, original: Callable[..., Any]) -> Callable[..., Any]:
        marked = self._marked

        def replay(runner: Any, batch: Any) -> Any:
            if id(runner.graph_map.get(batch.padded_size)) not in marked:
                return original(runner, batch)
            return self._first_launch(runner, batch, original)

        return replay

    def _first_launch(self, runner: Any, batch: Any, launch: Callable[..., Any]) -> Any:
        graph = runner.graph_map[batch.padded_size]
        mark = self._marked.pop(id(graph))
        try:
            if mark.graph() is not graph:  # a stale mark whose graph was freed and its id reused
                return launch(runner, batch)
            return self._guarded(graph, mark, runner, batch, launch)
        finally:
            if not self.pending:
                self._marked.clear()
                self.disarm()  # every marked graph has launched: nothing of the shim stays on the hot path

    def _guarded(self, graph: Any, mark: _Mark, runner: Any, batch: Any, launch: Callable[..., Any]) -> Any:
        fills = [self._staged.pop(id(table), None) for table in mark.tables]
        t0 = time.perf_counter()
        if any(fill is None or fill.ran for fill in fills):
            # launched outside forward_host_ctx: no fill will release the WAIT, so protect it the
            # way FreeToken does rather than risk the deadlock
            logger.error("first launch of a deferred graph (bs=%s) with no PLE fill staged for it; "
                         "uploading it first (FreeToken's protection)", batch.padded_size)
            self._upload(graph, runner.stream)
            mark.on_launched("uploaded at first launch: no fill staged")
            return launch(runner, batch)

        import torch

        inference = torch.is_inference_mode_enabled()
        helper = threading.Thread(target=lambda: [f.run_on_helper(inference) for f in fills],
                                  name="graphfix-first-fill", daemon=True)
        # The PLE store is engine-thread only and has no locks. Between start() and join() the
        # engine thread does nothing but cudaGraphLaunch, which touches no host-table state, and it
        # joins the helper before returning to forward_host_ctx: no other access can overlap.
        helper.start()
        try:
            out = launch(runner, batch)
        except BaseException:
            helper.join()
            # A launch that raised left no WAIT pending, but the fill already released its flag:
            # withdraw that release, so the next step's WAIT is not passed before its own fill.
            for table in mark.tables:
                clear_flag(table._flag)
            mark.on_launched("launch raised; release withdrawn")
            raise
        helper.join()
        errors = [f.error for f in fills if f.error is not None]
        mark.on_launched(f"fill on helper thread, {1e3 * (time.perf_counter() - t0):.2f} ms"
                         + (f"; fill raised {errors[0]!r}" if errors else ""))
        if errors:
            raise errors[0]  # the flag was released by FreeToken's own error path; output discarded
        return out


def restore(owner: Any, name: str, original: Any, ours: Any) -> None:
    """Put ``original`` back as ``owner.name``, unless someone re-patched it on top of ``ours``."""
    if vars(owner).get(name) is ours:
        setattr(owner, name, original)
    else:
        logger.warning("%s.%s was re-patched by someone else; left as it is",
                       getattr(owner, "__qualname__", getattr(owner, "__name__", owner)), name)


def _defining_class(cls: type, name: str) -> type:
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    raise AttributeError(f"{cls.__qualname__} has no {name}")
