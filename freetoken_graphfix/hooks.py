"""install() / uninstall(): wrap FreeToken's capture-time upload and see what each graph holds.

Wrapped, all or nothing, when ``freetoken.engine.graph`` is imported (wrapt post-import hook, so the
import order does not matter):

- ``freetoken.engine.graph._upload_graph``: looked up as a global at call time (``graph.py`` 222),
  so the module attribute is the seam. It gets the per-graph decision.
- ``freetoken.kernel.row_store.wait_reset``: imported inside ``lookup`` on every call
  (``ple_disk.py`` 357, ``engram_table.py`` 170); records each WAIT enqueued during a capture.
- ``GraphRunner._capture_graphs``: delimits a capture pass (startup, rebuild, rollback), so the
  record of one pass never leaks into the next and ``status()`` shows every pass.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from types import ModuleType
from typing import Any

import wrapt

from . import config
from .compat import GRAPH_MODULE, ROW_STORE_MODULE, Compat, check, freetoken_version
from .config import Mode
from .deferred import FirstLaunchGuard, restore
from .detect import WaitRecorder, capture_batch_size, wait_from_caller
from .device import CudaDevice, Device
from .errors import WarmReplayError
from .strategies import Action, decide, warm_replay

logger = logging.getLogger("freetoken_graphfix")


@dataclass
class GraphRecord:
    """One captured graph as the shim saw it."""

    index: int  # capture order within the pass
    name: str  # "bs=8" when the capture loop's batch size is visible, else "graph #i"
    waits: list[dict[str, str]]
    action: str
    reason: str
    hook_ms: float  # time spent in the _upload_graph hook (a warm replay included)
    first_launch: str = ""  # deferred graphs: "pending", then how the first launch went


@dataclass
class CapturePass:
    index: int
    source: str  # "GraphRunner._capture_graphs" or "direct _upload_graph call"
    graphs: list[GraphRecord] = field(default_factory=list)
    done: bool = False

    def summary(self) -> str:
        counts = Counter((g.action, g.reason) for g in self.graphs)
        parts = ", ".join(f"{n} {action} ({reason})" for (action, reason), n in counts.items())
        return f"capture pass {self.index}: {len(self.graphs)} graphs: {parts or 'none captured'}"


class _State:
    def __init__(self) -> None:
        self.installed = False
        self.mode: Mode | None = None
        self.env_before: str | None = None
        self.hook_registered = False
        self.device: Device = CudaDevice()
        self.warm_timeout_s = config.WARM_TIMEOUT_S
        self.compat: Compat | None = None
        self.patches: list[tuple[Any, str, Any, Any]] = []  # (owner, attribute, original, our wrapper)
        self.recorder = WaitRecorder()
        self.passes: list[CapturePass] = []
        self.current: CapturePass | None = None
        # the pass's deferred graphs, marked once it has filled graph_map: (graph, stream, tables, record)
        self.to_mark: list[tuple[Any, Any, list[Any], GraphRecord]] = []
        self.guard: FirstLaunchGuard | None = None
        self.uninstalled: str = ""  # what uninstall() did with graphs still awaiting a first launch


_state = _State()


def install(mode: str | Mode | None = None, *, device: Device | None = None,
            warm_timeout_s: float | None = None) -> None:
    """Install the shim; safe to call again (a second call logs and returns).

    ``mode`` overrides ``FT_GRAPH_UPLOAD``, which is read once, here. The resolved mode is
    exported to ``FT_GRAPH_UPLOAD`` so child processes (spawned tensor-parallel ranks) decide the
    same way. ``device`` and ``warm_timeout_s`` exist for tests and the benchmark.
    Raises :class:`~freetoken_graphfix.errors.ConfigError` for a mode it does not accept.
    """
    if _state.installed:
        logger.debug("freetoken_graphfix already installed (mode %s)", _state.mode)
        return
    _state.uninstalled = ""
    resolved = config.parse_mode(mode, source="mode") if mode is not None else config.mode_from_env()
    _state.env_before = os.environ.get(config.ENV_MODE)
    os.environ[config.ENV_MODE] = resolved.value
    _state.mode, _state.installed = resolved, True
    _state.device = device or CudaDevice()
    _state.warm_timeout_s = config.WARM_TIMEOUT_S if warm_timeout_s is None else warm_timeout_s
    if resolved is Mode.OFF:
        logger.info("%s=off: shim disabled; FreeToken keeps its own upload", config.ENV_MODE)
        return
    if not _state.hook_registered:
        _state.hook_registered = True
        wrapt.register_post_import_hook(_on_graph_import, GRAPH_MODULE)  # runs now if already imported
    elif GRAPH_MODULE in sys.modules:
        _on_graph_import(sys.modules[GRAPH_MODULE])


def uninstall() -> None:
    """Restore FreeToken's original functions exactly; safe to call again or before install()."""
    if not _state.installed:
        logger.debug("freetoken_graphfix not installed; nothing to uninstall")
        return
    if _state.guard is not None and _state.guard.pending:
        # Nothing was uploaded for these graphs and no guard will be left to fill their first
        # launch: give them FreeToken's own protection, which is what uninstall() restores.
        count = _state.guard.protect_pending("uploaded at uninstall() (FreeToken's protection)")
        _state.uninstalled = f"uploaded {count} graph(s) still awaiting their first launch"
        logger.info("uninstall: %s (FreeToken's own protection)", _state.uninstalled)
    _state.guard = None
    _unwrap_all()
    _state.recorder.clear()
    _state.current = None
    if _state.env_before is None:
        os.environ.pop(config.ENV_MODE, None)
    else:
        os.environ[config.ENV_MODE] = _state.env_before
    _state.installed, _state.mode = False, None


def user_env_value() -> str | None:
    """``FT_GRAPH_UPLOAD`` as the user set it, before install() exported the resolved mode."""
    return _state.env_before if _state.installed else os.environ.get(config.ENV_MODE)


def status() -> dict[str, Any]:
    """A structured record: FreeToken found, whether patched and why not, the mode, every graph seen."""
    compat = _state.compat
    if compat is None:
        reason = ("not installed" if not _state.installed else
                  "disabled (FT_GRAPH_UPLOAD=off)" if _state.mode is Mode.OFF else
                  f"waiting for {GRAPH_MODULE} to be imported")
    else:
        reason = compat.reason
    guard = _state.guard
    return {
        "installed": _state.installed,
        "mode": _state.mode.value if _state.mode else None,
        "patched": bool(_state.patches),
        "reason": reason,
        "freetoken": {"version": compat.version if compat else freetoken_version(),
                      "path": compat.path if compat else None,
                      "tested": compat.tested if compat else None},
        "deferred": {"available": bool(compat and compat.deferred),
                     "reason": compat.deferred_reason if compat else None,
                     "pending_first_launches": guard.pending if guard else 0,
                     "at_uninstall": _state.uninstalled},
        "passes": [asdict(p) for p in _state.passes],
    }


# ---------------------------------------------------------------- patching

def _on_graph_import(graph: ModuleType) -> None:
    if not _state.installed or _state.mode is Mode.OFF or _state.patches:
        return
    try:
        import freetoken.kernel.row_store as row_store
    except Exception as exc:  # a broken extension: the shim cannot see WAITs, so it must not patch
        logger.warning("cannot import %s: %r", ROW_STORE_MODULE, exc)
        row_store = None
    compat = _state.compat = check(graph, row_store)
    if not compat.patchable:
        logger.log(compat.level, "not patched: %s", compat.reason)
        return
    try:
        _wrap(graph, "_upload_graph", _on_upload_graph)
        _wrap(row_store, "wait_reset", _on_wait_reset)
        _wrap(graph.GraphRunner, "_capture_graphs", _on_capture_graphs)
    except Exception as exc:  # never leave a half-patched FreeToken
        _unwrap_all()
        _state.compat = replace(compat, patchable=False, reason=f"patching failed: {exc!r}",
                                level=logging.WARNING)
        logger.warning("not patched: %s", _state.compat.reason)
        return
    if compat.deferred:
        _state.guard = FirstLaunchGuard(_state.patches[0][2], _state.device)
    elif _state.mode is Mode.DEFERRED:
        logger.warning("FT_GRAPH_UPLOAD=deferred but %s: graphs that need protection get warm",
                       compat.deferred_reason)
    logger.log(compat.level, "patched (mode %s): %s", _state.mode.value, compat.reason)


def _wrap(owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    original = vars(owner)[name]
    wrapt.wrap_function_wrapper(owner, name, wrapper)
    _state.patches.append((owner, name, original, vars(owner)[name]))


def _unwrap_all() -> None:
    while _state.patches:
        restore(*_state.patches.pop())


# ---------------------------------------------------------------- wrappers

def _on_wait_reset(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    if _state.device.is_capturing():
        flag = args[1] if len(args) > 1 else kwargs["flag"]
        _state.recorder.add(wait_from_caller(flag))
    return result


def _on_capture_graphs(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    _state.recorder.clear()  # a capture outside any pass (a test, a tool) must not leak its WAITs in
    capture = _state.current = CapturePass(len(_state.passes), "GraphRunner._capture_graphs")
    _state.passes.append(capture)
    try:
        result = wrapped(*args, **kwargs)
    except BaseException:
        for *_, record in _state.to_mark:
            record.first_launch = "the capture pass raised: never launched"
        raise
    else:
        _mark_deferred(instance)
        return result
    finally:
        _state.recorder.clear()
        _state.to_mark.clear()  # a pass that raised built no runner: nothing of it can launch
        _state.current = None
        capture.done = True
        logger.info("%s", capture.summary())


def _mark_deferred(runner: Any) -> None:
    """Guard the first launch of the pass's deferred graphs, now that ``graph_map`` names their bs."""
    by_graph = {id(g): bs for bs, g in getattr(runner, "graph_map", {}).items()}
    for graph, stream, tables, record in _state.to_mark:
        bs = by_graph.get(id(graph))
        if bs is None:  # not kept by the runner: it can never be launched through it
            record.first_launch = "not in the runner's graph_map: never launched"
            continue
        _state.guard.mark(graph, bs, stream, tables, lambda how, record=record: setattr(record, "first_launch", how))


def _on_upload_graph(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> None:
    t0 = time.perf_counter()
    graph, stream = _graph_and_stream(args, kwargs)
    capture = _state.current
    if capture is None:  # called outside a GraphRunner capture pass (a test or a bench)
        capture = CapturePass(len(_state.passes), "direct _upload_graph call", done=True)
        _state.passes.append(capture)
    index = len(capture.graphs)
    bs = capture_batch_size()
    name = f"bs={bs}" if bs is not None else f"graph #{index}"
    waits = _state.recorder.drain()
    compat = _state.compat
    defer_unavailable = (
        (compat.deferred_reason if compat else "FreeToken not inspected") if not (compat and compat.deferred)
        else None if _state.current is not None
        else "captured outside GraphRunner._capture_graphs: no runner launches it")
    decision = decide(_state.mode, waits, defer_unavailable=defer_unavailable)
    record = GraphRecord(index, name, [w.describe() for w in waits], decision.action.value,
                         decision.reason, 0.0)
    capture.graphs.append(record)
    try:
        if decision.action is Action.UPLOAD:
            wrapped(*args, **kwargs)
        elif decision.action is Action.WARM:
            if _state.mode in (Mode.AUTO, Mode.DEFERRED):
                logger.warning("graph %s cannot be deferred (%s); protected by a warm replay instead",
                               name, decision.reason)
            _warm(graph, stream, waits, name, lambda: wrapped(*args, **kwargs))
        elif decision.action is Action.DEFERRED:
            record.first_launch = "pending"
            tables = list({id(w.owner): w.owner for w in waits if w.after_launch}.values())
            _state.to_mark.append((graph, stream, tables, record))
        elif decision.action is Action.EXPOSED:
            flags = ", ".join(f"{w.kind} flag {w.describe()['flag']}" for w in waits if w.after_launch)
            logger.warning("graph %s holds a WAIT released only after its launch returns (%s); "
                           "FT_GRAPH_UPLOAD=skip: its first launch can deadlock", name, flags)
    finally:
        record.hook_ms = 1e3 * (time.perf_counter() - t0)


def _warm(graph: Any, stream: Any, waits: list, name: str, upload: Callable[[], None]) -> None:
    outcome = warm_replay(graph, stream, waits, _state.device, timeout_s=_state.warm_timeout_s)
    if outcome.ok:
        return
    message = f"warm replay of graph {name} failed: {outcome.detail}"
    if not outcome.finished or _state.device.world_size() > 1:
        # A graph still running cannot have an upload queued behind it (its sync would wait on
        # it); and under tensor parallelism the peers warm-replayed (and ran its collectives): a
        # silent fallback here would put this rank on a different path from theirs.
        raise WarmReplayError(message)
    logger.error("%s; falling back to FreeToken's cuGraphUpload", message)
    upload()


def _graph_and_stream(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    values = list(args) + [kwargs[k] for k in ("graph", "stream") if k in kwargs]
    return values[0], values[1]
