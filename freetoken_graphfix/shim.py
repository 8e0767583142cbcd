"""install() / uninstall() / status(): take the place of FreeToken's capture-time upload, graph by graph.

Wrapped, all or nothing, when ``freetoken.engine.graph`` is imported (``bootstrap.when_imported``, so the
import order does not matter), each a module or class attribute FreeToken looks up at call time:

- ``engine.graph._upload_graph`` (0.2.x; called per graph, ``graph.py`` 222): the per-graph decision.
- ``GraphRunner._capture_graphs``: delimits a capture pass (startup, rebuild, rollback), so the record
  of one pass never leaks into the next and ``status()`` shows every pass; on 0.1.3, which has no
  upload to take the place of, it is where each graph is decided, once the pass is done.

and, once FreeToken itself imports it (never from here: ``freetoken.kernel`` pulls in triton and the
row store's extension), the function that enqueues the WAIT, which records each WAIT captured:
``kernel.row_store.wait_reset`` (0.2.x; imported inside ``lookup``, ``ple_disk.py`` 357,
``engram_table.py`` 170) or ``kernel._ple_store.memop_wait_reset`` (0.1.3, ``ple_disk.py`` 262-267).
No graph can hold such a WAIT before that module is imported; should the function found then not be
the one the shim expects, the shim stands down whole and FreeToken keeps its own upload.

What runs inside FreeToken's calls, and the state it fills, is ``capture``; this module holds the
lifecycle.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import wrapt

from . import bootstrap, config
from .capture import state
from .compat import GRAPH_MODULE, UPLOAD_SEAM, check, freetoken_version
from .config import Mode
from .device import CudaDevice, Device
from .errors import ConfigError, UnsafePathError

if TYPE_CHECKING:  # status() and the deferred guard are imported when first needed, not at every arming
    from .status_record import Status

logger = logging.getLogger("freetoken_graphfix")




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
    given = config.env_value() if mode is None else mode.value if isinstance(mode, Mode) else mode
    resolved = config.parse_mode(given, source=source)
    if state.installed:
        _switch(resolved, device or state.device, state.warm_timeout_s if warm_timeout_s is None else warm_timeout_s)
        return
    env_before = bootstrap.disarm()  # an install pending FreeToken's import: this one replaces it
    state.env_before = env_before if env_before is not bootstrap.NOT_ARMED else os.environ.get(config.ENV_MODE)
    state.uninstalled, state.config_error = "", ""
    os.environ[config.ENV_MODE] = resolved.value
    state.mode, state.installed = resolved, True
    state.given = f"{source}={given!r}"
    state.device = device or CudaDevice()
    state.warm_timeout_s = config.WARM_TIMEOUT_S if warm_timeout_s is None else warm_timeout_s
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
        state.config_error = f"{exc}; FreeToken left untouched (its own upload)"
        logger.error("not patched: %s", state.config_error)


def _switch(mode: Mode, device: Device, warm_timeout_s: float) -> None:
    """``install()`` on an installed shim: switch the mode for graphs captured from now on; to or from ``off``,
    reinstall."""
    state.device, state.warm_timeout_s = device, warm_timeout_s
    before = state.mode
    if mode is before:
        logger.debug("freetoken_graphfix already installed in mode %s", mode.value)
        return
    captured = sum(len(p.graphs) for p in state.passes)
    change = (f"{before.value} -> {mode.value}: graphs captured from now on; the {captured} captured before "
              "keep their decisions")
    if Mode.OFF in (before, mode):  # off patches nothing: patching or unpatching is a new install
        env_before = state.env_before
        uninstall()
        install(mode, device=device, warm_timeout_s=warm_timeout_s)
        state.env_before = env_before
    else:
        state.mode = mode
        os.environ[config.ENV_MODE] = mode.value
    state.mode_changes.append(change)
    logger.info("mode %s", change)


def uninstall() -> None:
    """Restore FreeToken's original functions exactly; safe to call again or before install().

    Graphs still awaiting a deferred first launch are uploaded first: nothing else would protect
    them once the guard is gone, and the upload is FreeToken's own protection. ``FT_GRAPH_UPLOAD``
    is put back as it was before the shim set it, also when only an install was pending."""
    pending = bootstrap.disarm()
    if not state.installed:
        if pending is not bootstrap.NOT_ARMED:  # import exported auto for a user who set nothing
            _restore_env(pending)
        logger.debug("freetoken_graphfix not installed; nothing to uninstall")
        return
    if state.guard is not None and state.guard.pending:
        count = state.guard.protect_pending("uploaded at uninstall() (FreeToken's protection)")
        state.uninstalled = f"uploaded {count} graph(s) still awaiting their first launch"
        logger.info("uninstall: %s (FreeToken's own protection)", state.uninstalled)
    state.guard = None
    bootstrap.discard(GRAPH_MODULE, _on_graph_import)
    if state.compat is not None:
        bootstrap.discard(state.compat.wait_module, _on_wait_module_import)
    _unwrap_all()
    state.recorder.clear()
    state.current = None
    state.compat = None
    _restore_env(state.env_before)
    state.installed, state.mode = False, None


def _restore_env(value: str | None) -> None:
    """``FT_GRAPH_UPLOAD`` back as the user had it (``None``: unset)."""
    if value is None:
        os.environ.pop(config.ENV_MODE, None)
    else:
        os.environ[config.ENV_MODE] = value


def user_env_value() -> str | None:
    """``FT_GRAPH_UPLOAD`` as the user set it, before the shim exported the resolved mode."""
    if state.installed:
        return state.env_before
    return bootstrap.user_env_value()


def status() -> Status:
    """What the shim found, did and decided in this process. Where importing the package armed an
    install that has not run yet, the mode it would take is resolved here, quietly: a bad value is
    this status's reason, never a log line of its own."""
    from .status_record import DeferredGuard, FreeTokenFound, Status

    reason = _reason()
    compat, guard = state.compat, state.guard
    found = (FreeTokenFound(compat.version, compat.path, compat.tested) if compat else
             FreeTokenFound(freetoken_version() if _freetoken_installed() else None))
    deferred = DeferredGuard(bool(compat and compat.deferred), compat.deferred_reason if compat else None,
                             guard.pending if guard else 0, state.uninstalled)
    mode = state.mode.value if state.mode else _armed_mode()
    return Status(installed=state.installed or mode is not None, mode=mode, patched=bool(state.patches),
                  reason=reason, freetoken=found, deferred=deferred, mode_changes=list(state.mode_changes),
                  passes=list(state.passes))


def _armed_mode() -> str | None:
    """The mode an install that importing the package armed will take, ``None`` without one (or with a
    value it will refuse)."""
    if bootstrap.env_before() is bootstrap.NOT_ARMED:
        return None
    try:
        return config.parse_mode(bootstrap.env_before()).value  # type: ignore[arg-type]
    except ConfigError:
        return None


def _reason() -> str:
    """Why the shim is not patching, in one line for ``status()``: a bad value, off, waiting for FreeToken, or not
    installed."""
    if state.config_error:
        return state.config_error
    if not state.installed and bootstrap.env_before() is not bootstrap.NOT_ARMED:
        try:
            mode = config.parse_mode(bootstrap.env_before())  # type: ignore[arg-type]
        except ConfigError as exc:
            return f"{exc}; FreeToken will keep its own upload"
        return (f"disabled ({config.ENV_MODE}={bootstrap.env_before()!r})" if mode is Mode.OFF else
                f"waiting for {GRAPH_MODULE} to be imported")
    if not state.installed:
        return "not installed"
    if state.mode is Mode.OFF:
        return f"disabled ({state.given})"
    return state.compat.reason if state.compat is not None else f"waiting for {GRAPH_MODULE} to be imported"


def _freetoken_installed() -> bool:
    """Whether FreeToken can be imported here, found without importing it."""
    return "freetoken" in sys.modules or importlib.util.find_spec("freetoken") is not None


# ---------------------------------------------------------------- patching FreeToken

def _on_graph_import(graph: ModuleType) -> None:
    """FreeToken's graph module was imported: check what this release offers and wrap its hooks, all or nothing; any
    failure leaves FreeToken as shipped."""
    from . import capture

    if not state.installed or state.mode is Mode.OFF or state.patches:
        return
    try:
        compat = state.compat = check(graph)
    except Exception as exc:  # runs inside FreeToken's import: never break it, leave it as shipped
        state.compat = None
        state.config_error = f"inspecting FreeToken failed ({exc!r}); FreeToken left untouched"
        logger.error("not patched: %s", state.config_error)
        return
    if not compat.patchable:
        logger.log(logging.WARNING if compat.unexpected else logging.INFO, "not patched: %s", compat.reason)
        return
    try:
        if compat.flavor == UPLOAD_SEAM:
            _wrap(graph, "_upload_graph", capture.on_upload_graph)
        _wrap(graph.GraphRunner, "_capture_graphs", _on_capture_graphs)
    except Exception as exc:  # never leave a half-patched FreeToken
        _stand_down(f"patching failed: {exc!r}")
        return
    if not compat.deferred and state.mode is Mode.DEFERRED:  # the guard itself is made at the first deferred graph
        logger.warning("FT_GRAPH_UPLOAD=deferred but %s: graphs that need protection get warm",
                       compat.deferred_reason)
    bootstrap.when_imported(compat.wait_module, _on_wait_module_import)  # now, if FreeToken imported it already
    if state.patches:
        logger.log(logging.WARNING if compat.unexpected else logging.INFO, "patched (mode %s): %s",
                   state.mode.value, compat.reason)


def _on_capture_graphs(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """One capture pass (``capture.on_capture_graphs``), then, where asked, this process's status written
    for a tool that reads it as data (``FT_GRAPHFIX_STATUS_DIR``)."""
    from . import capture, status_record

    try:
        return capture.on_capture_graphs(wrapped, instance, args, kwargs)
    finally:
        directory = os.environ.get(config.ENV_STATUS_DIR)
        if directory:
            try:
                status_record.write(status(), directory)
            except (OSError, UnsafePathError) as exc:  # a tool's request: never the engine's failure
                logger.warning("could not write the status to %s=%r: %s", config.ENV_STATUS_DIR, directory, exc)


def _on_wait_module_import(module: ModuleType) -> None:
    """FreeToken imported the module whose function enqueues the WAIT: record every WAIT from now on, or,
    where that function is not the one the shim expects, stand down whole (no graph could hold its
    WAIT before this import, so nothing the shim decided so far needed it)."""
    from . import capture

    compat = state.compat
    if compat is None or not state.patches:
        return
    if not compat.wait_seam_fits(vars(module).get(compat.wait_function)):
        _stand_down(f"freetoken {compat.version} lacks {compat.wait_seam()}: the shim cannot see which graphs hold "
                    "a host-released WAIT; FreeToken left untouched")
        return
    try:
        _wrap(module, compat.wait_function, capture.on_wait_enqueued)
    except Exception as exc:
        _stand_down(f"patching failed: {exc!r}")


def _stand_down(reason: str) -> None:
    """Undo every wrap made (FreeToken as shipped, its own upload included), and say why."""
    _unwrap_all()
    state.guard = None
    if state.compat is not None:
        state.compat = state.compat._replace(patchable=False, reason=reason, unexpected=True, deferred=False)
    logger.warning("not patched: %s", reason)


def _wrap(owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    """Wrap ``owner.name`` and remember what was there and what we put, so ``uninstall()`` can tell ours from a later
    patch."""
    original = vars(owner)[name]
    wrapt.wrap_function_wrapper(owner, name, wrapper)
    state.patches.append((owner, name, original, vars(owner)[name]))


def _unwrap_all() -> None:
    """Undo every wrap, last first."""
    while state.patches:
        restore(*state.patches.pop())


def restore(owner: Any, name: str, original: Any, ours: Any) -> None:
    """Put ``original`` back as ``owner.name``, unless someone re-patched it on top of ``ours``."""
    if vars(owner).get(name) is ours:
        setattr(owner, name, original)
    else:
        logger.warning("%s.%s was re-patched by someone else; left as it is",
                       getattr(owner, "__qualname__", getattr(owner, "__name__", owner)), name)
