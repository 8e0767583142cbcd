"""install() / uninstall(): take the place of FreeToken's capture-time upload, graph by graph.

Wrapped, all or nothing, when ``freetoken.engine.graph`` is imported (``bootstrap.when_imported``, so the import
order does not matter), each a module or class attribute FreeToken looks up at call time:

- ``engine.graph._upload_graph`` (0.2.x; called per graph, ``graph.py`` 222): the per-graph decision.
- ``kernel.row_store.wait_reset`` (0.2.x; imported inside ``lookup``, ``ple_disk.py`` 357,
  ``engram_table.py`` 170) or ``kernel._ple_store.memop_wait_reset`` (0.1.3, ``ple_disk.py``
  262-267): records each WAIT enqueued during a capture, and which graph was being captured.
- ``GraphRunner._capture_graphs``: delimits a capture pass (startup, rebuild, rollback), so the
  record of one pass never leaks into the next and ``status()`` shows every pass; on 0.1.3, which
  has no upload to take the place of, it is where each graph is decided, once the pass is done.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from types import ModuleType
from typing import Any

import wrapt

from . import bootstrap, config
from .compat import AFTER_CAPTURE, GRAPH_MODULE, UPLOAD_SEAM, Compat, check, freetoken_version
from .config import Mode
from .deferred import FirstLaunchGuard, restore
from .detect import WaitRecorder, capture_batch_size, wait_from_caller
from .device import CudaDevice, Device
from .errors import ConfigError, WarmReplayError
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
        self.device: Device = CudaDevice()
        self.warm_timeout_s = config.WARM_TIMEOUT_S
        self.compat: Compat | None = None
        self.config_error = ""  # FT_GRAPH_UPLOAD held a bad value when FreeToken was imported
        self.patches: list[tuple[Any, str, Any, Any]] = []  # (owner, attribute, original, our wrapper)
        self.recorder = WaitRecorder()
        self.passes: list[CapturePass] = []
        self.current: CapturePass | None = None
        # the pass's deferred graphs, marked once it has filled graph_map: (graph, stream, tables, record)
        self.to_mark: list[tuple[Any, Any, list[Any], GraphRecord]] = []
        self.guard: FirstLaunchGuard | None = None
        self.uninstalled: str = ""  # what uninstall() did with graphs still awaiting a first launch
        self.mode_changes: list[str] = []
        self.capture_target: Callable[[], int | None] | None = None  # 0.1.3 passes: the graph under capture


_state = _State()


def install(mode: str | Mode | None = None, *, device: Device | None = None,
            warm_timeout_s: float | None = None) -> None:
    """Install the shim, or switch the mode of the one already installed.

    ``mode`` overrides ``FT_GRAPH_UPLOAD`` (read here when ``mode`` is ``None``). The resolved mode
    is exported to ``FT_GRAPH_UPLOAD`` so child processes (spawned tensor-parallel ranks) decide the
    same way. On an installed shim a new mode applies to graphs captured from then on: graphs
    already captured keep their decision (``status()["mode_changes"]`` says so), and a switch to or
    from ``off`` uninstalls first. ``device`` and ``warm_timeout_s`` exist for tests and the
    benchmark; a switch keeps the ones installed unless given. Raises
    :class:`~freetoken_graphfix.errors.ConfigError` for a mode it does not accept, changing nothing.
    """
    source = "mode" if mode is not None else config.ENV_MODE
    resolved = config.parse_mode(mode if mode is not None else config.env_value(), source=source)
    if _state.installed:
        _switch(resolved, device or _state.device,
                _state.warm_timeout_s if warm_timeout_s is None else warm_timeout_s)
        return
    env_before = bootstrap.disarm()  # an install pending FreeToken's import: this one replaces it
    _state.env_before = env_before if env_before is not bootstrap.NOT_ARMED else os.environ.get(config.ENV_MODE)
    _state.uninstalled, _state.config_error = "", ""
    os.environ[config.ENV_MODE] = resolved.value
    _state.mode, _state.installed = resolved, True
    _state.device = device or CudaDevice()
    _state.warm_timeout_s = config.WARM_TIMEOUT_S if warm_timeout_s is None else warm_timeout_s
    if resolved is Mode.OFF:
        logger.info("%s=off: shim disabled; FreeToken keeps its own upload", config.ENV_MODE)
        return
    bootstrap.when_imported(GRAPH_MODULE, _on_graph_import)  # runs now if already imported


def install_armed() -> None:
    """The install ``bootstrap.arm()`` left pending, now that FreeToken's graph module is imported.

    Runs inside FreeToken's import, so a bad ``FT_GRAPH_UPLOAD`` is one ERROR line naming it (and
    FreeToken keeps its own upload) rather than an exception that would break that import."""
    try:
        install()
    except ConfigError as exc:
        bootstrap.disarm()  # resolved: reported once, here, and FreeToken stays as shipped
        _state.config_error = f"{exc}; FreeToken left untouched (its own upload)"
        logger.error("not patched: %s", _state.config_error)


def _switch(mode: Mode, device: Device, warm_timeout_s: float) -> None:
    _state.device, _state.warm_timeout_s = device, warm_timeout_s
    before = _state.mode
    if mode is before:
        logger.debug("freetoken_graphfix already installed in mode %s", mode.value)
        return
    captured = sum(len(p.graphs) for p in _state.passes)
    change = (f"{before.value} -> {mode.value}: graphs captured from now on; the {captured} captured before "
              "keep their decisions")
    if Mode.OFF in (before, mode):  # off patches nothing: patching or unpatching is a new install
        env_before = _state.env_before
        uninstall()
        install(mode, device=device, warm_timeout_s=warm_timeout_s)
        _state.env_before = env_before
    else:
        _state.mode = mode
        os.environ[config.ENV_MODE] = mode.value
    _state.mode_changes.append(change)
    logger.info("mode %s", change)


def uninstall() -> None:
    """Restore FreeToken's original functions exactly; safe to call again or before install().

    Graphs still awaiting a deferred first launch are uploaded first: nothing else would protect
    them once the guard is gone, and the upload is FreeToken's own protection. ``FT_GRAPH_UPLOAD``
    is put back as it was before the shim set it, also when only an install was pending."""
    pending = bootstrap.disarm()
    if not _state.installed:
        if pending is not bootstrap.NOT_ARMED:  # import exported auto for a user who set nothing
            _restore_env(pending)
        logger.debug("freetoken_graphfix not installed; nothing to uninstall")
        return
    if _state.guard is not None and _state.guard.pending:
        count = _state.guard.protect_pending("uploaded at uninstall() (FreeToken's protection)")
        _state.uninstalled = f"uploaded {count} graph(s) still awaiting their first launch"
        logger.info("uninstall: %s (FreeToken's own protection)", _state.uninstalled)
    _state.guard = None
    bootstrap.discard(GRAPH_MODULE, _on_graph_import)
    _unwrap_all()
    _state.recorder.clear()
    _state.current = None
    _state.compat = None
    _restore_env(_state.env_before)
    _state.installed, _state.mode = False, None


def _restore_env(value: str | None) -> None:
    if value is None:
        os.environ.pop(config.ENV_MODE, None)
    else:
        os.environ[config.ENV_MODE] = value


def user_env_value() -> str | None:
    """``FT_GRAPH_UPLOAD`` as the user set it, before the shim exported the resolved mode."""
    if _state.installed:
        return _state.env_before
    return bootstrap.user_env_value()


def status() -> dict[str, Any]:
    """A structured record: FreeToken found, whether patched and why not, the mode, every graph seen."""
    if bootstrap.env_before() is not bootstrap.NOT_ARMED and not _state.installed:
        install_armed()  # import armed it: complete the install, which then waits for FreeToken
    compat = _state.compat
    if _state.config_error:
        reason = _state.config_error
    elif not _state.installed:
        reason = "not installed"
    elif _state.mode is Mode.OFF:
        reason = f"disabled ({config.ENV_MODE}=off)"
    elif compat is None:
        reason = f"waiting for {GRAPH_MODULE} to be imported"
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
        "mode_changes": list(_state.mode_changes),
        "passes": [asdict(p) for p in _state.passes],
    }


# ---------------------------------------------------------------- patching

def _on_graph_import(graph: ModuleType) -> None:
    if not _state.installed or _state.mode is Mode.OFF or _state.patches:
        return
    try:
        compat = _state.compat = check(graph)
    except Exception as exc:  # runs inside FreeToken's import: never break it, leave it as shipped
        _state.compat = None
        _state.config_error = f"inspecting FreeToken failed ({exc!r}); FreeToken left untouched"
        logger.error("not patched: %s", _state.config_error)
        return
    if not compat.patchable:
        logger.log(compat.level, "not patched: %s", compat.reason)
        return
    try:
        if compat.flavor == UPLOAD_SEAM:
            _wrap(graph, "_upload_graph", _on_upload_graph)
        _wrap(importlib.import_module(compat.wait_module), compat.wait_function, _on_wait_enqueued)
        _wrap(graph.GraphRunner, "_capture_graphs", _on_capture_graphs)
    except Exception as exc:  # never leave a half-patched FreeToken
        _unwrap_all()
        _state.compat = replace(compat, patchable=False, reason=f"patching failed: {exc!r}",
                                level=logging.WARNING)
        logger.warning("not patched: %s", _state.compat.reason)
        return
    if compat.deferred:
        _state.guard = FirstLaunchGuard(_upload_function(), _state.device)
    elif _state.mode is Mode.DEFERRED:
        logger.warning("FT_GRAPH_UPLOAD=deferred but %s: graphs that need protection get warm",
                       compat.deferred_reason)
    logger.log(compat.level, "patched (mode %s): %s", _state.mode.value, compat.reason)


def _upload_function() -> Callable[[Any, Any], None]:
    """FreeToken's own ``_upload_graph`` where it has one (0.2.x), else the same driver call made by
    the shim (0.1.3 has none: ``upload`` mode there means FreeToken's missing ``cuGraphUpload``)."""
    for _, name, original, _ours in _state.patches:
        if name == "_upload_graph":
            return original
    return lambda graph, stream: _state.device.upload(graph, stream)


def _wrap(owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    original = vars(owner)[name]
    wrapt.wrap_function_wrapper(owner, name, wrapper)
    _state.patches.append((owner, name, original, vars(owner)[name]))


def _unwrap_all() -> None:
    while _state.patches:
        restore(*_state.patches.pop())


# ---------------------------------------------------------------- wrappers

def _on_wait_enqueued(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """``row_store.wait_reset(stream, flag)`` (0.2.x), ``_ple_store.memop_wait_reset(stream, ptr)`` (0.1.3)."""
    result = wrapped(*args, **kwargs)
    if _state.device.is_capturing():
        flag = args[1] if len(args) > 1 else kwargs.get("flag")
        target = _state.capture_target
        _state.recorder.add(wait_from_caller(flag), target() if target is not None else None)
    return result


def _on_capture_graphs(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    _state.recorder.clear()  # a capture outside any pass (a test, a tool) must not leak its WAITs in
    capture = _state.current = CapturePass(len(_state.passes), "GraphRunner._capture_graphs")
    _state.passes.append(capture)
    after_capture = _state.compat is not None and _state.compat.flavor == AFTER_CAPTURE
    try:
        if after_capture:  # 0.1.3: each WAIT must be tied to its graph, decided once the loop is done
            with _state.device.track_captures() as target:
                _state.capture_target = target
                try:
                    result = wrapped(*args, **kwargs)
                finally:
                    _state.capture_target = None
            _decide_after_capture(instance, capture)
        else:
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


def _decide_after_capture(runner: Any, capture: CapturePass) -> None:
    """0.1.3: no per-graph seam, so every graph of the pass is decided once the loop is done, in
    capture order, from the WAITs enqueued while it was captured."""
    graphs = sorted(getattr(runner, "graph_map", {}).items(), key=lambda kv: -kv[0])
    upload = _upload_function()
    replayed = False
    for bs, graph in graphs:
        waits = _state.recorder.take(graph)
        action = _protect(graph, runner.stream, waits, f"bs={bs}", capture,
                          lambda graph=graph: upload(graph, runner.stream))
        replayed |= action is Action.WARM
    if replayed:  # a warm replay ran the graph's MoE-offload copies: reset as the loop itself does
        reset = getattr(runner, "_reset_moe_offload_cache", None)
        if callable(reset):
            reset()


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
    """0.2.x: in place of FreeToken's ``_upload_graph(graph, stream)``, right after each capture."""
    graph, stream = _graph_and_stream(args, kwargs)
    capture = _state.current
    if capture is None:  # called outside a GraphRunner capture pass (a test or a bench)
        capture = CapturePass(len(_state.passes), "direct _upload_graph call", done=True)
        _state.passes.append(capture)
    bs = capture_batch_size()
    name = f"bs={bs}" if bs is not None else f"graph #{len(capture.graphs)}"
    _protect(graph, stream, _state.recorder.drain(), name, capture, lambda: wrapped(*args, **kwargs))


def _protect(graph: Any, stream: Any, waits: list, name: str, capture: CapturePass,
             upload: Callable[[], None]) -> Action:
    """Decide for one graph and act: nothing, ``upload()``, a warm replay, or a deferred mark."""
    t0 = time.perf_counter()
    decision = decide(_state.mode, waits, defer_unavailable=_defer_unavailable())
    record = GraphRecord(len(capture.graphs), name, [w.describe() for w in waits], decision.action.value,
                         decision.reason, 0.0)
    capture.graphs.append(record)
    try:
        if decision.action is Action.UPLOAD:
            upload()
        elif decision.action is Action.WARM:
            if _state.mode in (Mode.AUTO, Mode.DEFERRED):
                logger.warning("graph %s cannot be deferred (%s); protected by a warm replay instead",
                               name, decision.reason)
            _warm(graph, stream, waits, name, upload)
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
    return decision.action


def _defer_unavailable() -> str | None:
    """Why the graph being decided cannot get a deferred first launch, ``None`` when it can."""
    compat = _state.compat
    if compat is None:
        return "FreeToken not inspected"
    if not compat.deferred:
        return compat.deferred_reason
    if _state.current is None:
        return "captured outside GraphRunner._capture_graphs: no runner launches it"
    return None


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
