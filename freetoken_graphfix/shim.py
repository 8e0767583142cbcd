"""install() / uninstall() / status(): take the place of FreeToken's capture-time upload, graph by graph.

When ``freetoken.engine.graph`` is imported (in either order), ``_upload_graph`` and
``GraphRunner._capture_graphs`` are wrapped, all or nothing, and later the function that enqueues
the WAIT, once FreeToken imports it; any surprise stands the shim down whole, leaving FreeToken's own
upload (docs/architecture.md, "What the shim wraps"). Each install is a ``capture.Shim``, whose methods
are the wrappers; this module holds the lifecycle and reads the latest install for ``status()``.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import wrapt

from . import bootstrap, config
from .capture import Shim
from .compat import GRAPH_MODULE, UPLOAD_SEAM, check, freetoken_version
from .config import Mode
from .device import CudaDevice, Device
from .errors import ConfigError, UnsafePathError

if TYPE_CHECKING:  # status() and the deferred guard are imported when first needed, not at every arming
    from .status_record import Status

logger = logging.getLogger("freetoken_graphfix")

latest: Shim | None = None  # the latest install, live or uninstalled (its record stays readable); None before any
refused = ""  # the install the .pth armed refused FT_GRAPH_UPLOAD's value: why, until the next install


def live() -> Shim | None:
    """The installed shim, ``None`` when none is."""
    return latest if latest is not None and latest.installed else None


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
    global latest, refused
    source = "mode" if mode is not None else config.ENV_MODE
    given = config.env_value() if mode is None else mode.value if isinstance(mode, Mode) else mode
    resolved = config.parse_mode(given, source=source)
    current = live()
    if current is not None:
        _switch(current, resolved, device or current.device,
                current.warm_timeout_s if warm_timeout_s is None else warm_timeout_s)
        return
    env_before = bootstrap.disarm()  # an install pending FreeToken's import: this one replaces it
    if env_before is bootstrap.NOT_ARMED:
        env_before = os.environ.get(config.ENV_MODE)
    refused = ""
    os.environ[config.ENV_MODE] = resolved.value
    latest = Shim(resolved, f"{source}={given!r}", device or CudaDevice(),
                  config.WARM_TIMEOUT_S if warm_timeout_s is None else warm_timeout_s, env_before)
    if resolved is Mode.OFF:
        logger.info("%s=off: shim disabled; FreeToken keeps its own upload", config.ENV_MODE)
        return
    bootstrap.when_imported(GRAPH_MODULE, _on_graph_import)  # runs now if already imported


def install_armed() -> None:
    """The install ``bootstrap.arm()`` left pending, now that FreeToken's graph module is imported.

    Runs inside FreeToken's import, so a bad ``FT_GRAPH_UPLOAD`` is one ERROR line naming it (and
    FreeToken keeps its own upload) rather than an exception that would break that import."""
    global refused
    try:
        install()
    except ConfigError as exc:
        bootstrap.disarm()  # resolved: reported once, here, and FreeToken stays as shipped
        refused = f"{exc}; FreeToken left untouched (its own upload)"
        logger.error("not patched: %s", refused)


def _switch(current: Shim, mode: Mode, device: Device, warm_timeout_s: float) -> None:
    """``install()`` on an installed shim: switch the mode for graphs captured from now on; to or from ``off``,
    reinstall, the new install carrying on the record of this one."""
    current.device, current.warm_timeout_s = device, warm_timeout_s
    before = current.mode
    if mode is before:
        logger.debug("freetoken_graphfix already installed in mode %s", mode.value)
        return
    captured = sum(len(p.graphs) for p in current.passes)
    change = (f"{before.value} -> {mode.value}: graphs captured from now on; the {captured} captured before "
              "keep their decisions")
    if Mode.OFF in (before, mode):  # off patches nothing: patching or unpatching is a new install
        uninstall()
        install(mode, device=device, warm_timeout_s=warm_timeout_s)
        assert latest is not None
        latest.env_before = current.env_before
        latest.passes, latest.mode_changes = current.passes, current.mode_changes
        current = latest
    else:
        current.mode = mode
        os.environ[config.ENV_MODE] = mode.value
    current.mode_changes.append(change)
    logger.info("mode %s", change)


def uninstall() -> None:
    """Restore FreeToken's original functions exactly; safe to call again or before install().

    Graphs still awaiting a deferred first launch are uploaded first: nothing else would protect
    them once the guard is gone, and the upload is FreeToken's own protection. ``FT_GRAPH_UPLOAD``
    is put back as it was before the shim set it, also when only an install was pending."""
    pending = bootstrap.disarm()
    current = live()
    if current is None:
        if pending is not bootstrap.NOT_ARMED:  # import exported auto for a user who set nothing
            _restore_env(pending)
        logger.debug("freetoken_graphfix not installed; nothing to uninstall")
        return
    if current.guard is not None and current.guard.pending:
        count = current.guard.protect_pending("uploaded at uninstall() (FreeToken's protection)")
        current.uninstalled = f"uploaded {count} graph(s) still awaiting their first launch"
        logger.info("uninstall: %s (FreeToken's own protection)", current.uninstalled)
    current.guard = None
    bootstrap.discard(GRAPH_MODULE, _on_graph_import)
    if current.compat is not None:
        bootstrap.discard(current.compat.wait_module, _on_wait_module_import)
    _unwrap_all(current)
    current.recorder.clear()
    current.current = None
    current.compat = None
    _restore_env(current.env_before)
    current.installed = False


def _restore_env(value: str | None) -> None:
    """``FT_GRAPH_UPLOAD`` back as the user had it (``None``: unset)."""
    if value is None:
        os.environ.pop(config.ENV_MODE, None)
    else:
        os.environ[config.ENV_MODE] = value


def status() -> Status:
    """What the shim found, did and decided in this process. Where importing the package armed an
    install that has not run yet, the mode it would take is resolved here, quietly: a bad value is
    this status's reason, never a log line of its own."""
    from .status_record import DeferredGuard, FreeTokenFound, Status

    current = live()
    compat = current.compat if current else None
    guard = current.guard if current else None
    found = (FreeTokenFound(compat.version, compat.path, compat.tested) if compat else
             FreeTokenFound(freetoken_version() if _freetoken_installed() else None))
    deferred = DeferredGuard(bool(compat and compat.deferred), compat.deferred_reason if compat else None,
                             guard.pending if guard else 0, latest.uninstalled if latest else "")
    mode = current.mode.value if current else _armed_mode()
    return Status(installed=mode is not None, mode=mode, patched=bool(current and current.patches),
                  reason=_reason(current), freetoken=found, deferred=deferred,
                  mode_changes=list(latest.mode_changes) if latest else [],
                  passes=list(latest.passes) if latest else [])


def _armed_mode() -> str | None:
    """The mode an install that importing the package armed will take, ``None`` without one (or with a
    value it will refuse)."""
    if bootstrap.env_before() is bootstrap.NOT_ARMED:
        return None
    try:
        return config.parse_mode(bootstrap.env_before()).value  # type: ignore[arg-type]
    except ConfigError:
        return None


def _reason(current: Shim | None) -> str:
    """Why the shim is not patching, in one line for ``status()``: a bad value, off, waiting for FreeToken, or not
    installed."""
    if refused:
        return refused
    if current is None and bootstrap.env_before() is not bootstrap.NOT_ARMED:
        try:
            mode = config.parse_mode(bootstrap.env_before())  # type: ignore[arg-type]
        except ConfigError as exc:
            return f"{exc}; FreeToken will keep its own upload"
        return (f"disabled ({config.ENV_MODE}={bootstrap.env_before()!r})" if mode is Mode.OFF else
                f"waiting for {GRAPH_MODULE} to be imported")
    if current is None:
        return "not installed"
    if current.failure:
        return current.failure
    if current.mode is Mode.OFF:
        return f"disabled ({current.given})"
    return current.compat.reason if current.compat is not None else f"waiting for {GRAPH_MODULE} to be imported"


def _freetoken_installed() -> bool:
    """Whether FreeToken can be imported here, found without importing it."""
    return "freetoken" in sys.modules or importlib.util.find_spec("freetoken") is not None


# ---------------------------------------------------------------- patching FreeToken

def _on_graph_import(graph: ModuleType) -> None:
    """FreeToken's graph module was imported: check what this release offers and wrap its hooks, all or nothing; any
    failure leaves FreeToken as shipped."""
    current = live()
    if current is None or current.mode is Mode.OFF or current.patches:
        return
    try:
        compat = current.compat = check(graph)
    except Exception as exc:  # runs inside FreeToken's import: never break it, leave it as shipped
        current.compat = None
        current.failure = f"inspecting FreeToken failed ({exc!r}); FreeToken left untouched"
        logger.error("not patched: %s", current.failure)
        return
    if not compat.patchable:
        logger.log(logging.WARNING if compat.unexpected else logging.INFO, "not patched: %s", compat.reason)
        return
    try:
        if compat.flavor == UPLOAD_SEAM:
            _wrap(current, graph, "_upload_graph", current.on_upload_graph)
        _wrap(current, graph.GraphRunner, "_capture_graphs", functools.partial(_on_capture_graphs, current))
    except Exception as exc:  # never leave a half-patched FreeToken
        _stand_down(current, f"patching failed: {exc!r}")
        return
    if not compat.deferred and current.mode is Mode.DEFERRED:  # the guard itself is made at the first deferred graph
        logger.warning("FT_GRAPH_UPLOAD=deferred but %s: graphs that need protection get warm",
                       compat.deferred_reason)
    bootstrap.when_imported(compat.wait_module, _on_wait_module_import)  # now, if FreeToken imported it already
    if current.patches:
        logger.log(logging.WARNING if compat.unexpected else logging.INFO, "patched (mode %s): %s",
                   current.mode.value, compat.reason)


def _on_capture_graphs(current: Shim, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """One capture pass (``Shim.on_capture_graphs``), then, where asked, this process's status written
    for a tool that reads it as data (``FT_GRAPHFIX_STATUS_DIR``)."""
    from . import status_record

    try:
        return current.on_capture_graphs(wrapped, instance, args, kwargs)
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
    current = live()
    compat = current.compat if current else None
    if current is None or compat is None or not current.patches:
        return
    if not compat.wait_seam_fits(vars(module).get(compat.wait_function)):
        _stand_down(current, f"freetoken {compat.version} lacks {compat.wait_seam()}: the shim cannot see which "
                    "graphs hold a host-released WAIT; FreeToken left untouched")
        return
    try:
        _wrap(current, module, compat.wait_function, current.on_wait_enqueued)
    except Exception as exc:
        _stand_down(current, f"patching failed: {exc!r}")


def _stand_down(current: Shim, reason: str) -> None:
    """Undo every wrap made (FreeToken as shipped, its own upload included), and say why."""
    _unwrap_all(current)
    current.guard = None
    if current.compat is not None:
        current.compat = current.compat._replace(patchable=False, reason=reason, unexpected=True, deferred=False)
    logger.warning("not patched: %s", reason)


def _wrap(current: Shim, owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    """Wrap ``owner.name`` and remember what was there and what we put, so ``uninstall()`` can tell ours from a later
    patch."""
    original = vars(owner)[name]
    wrapt.wrap_function_wrapper(owner, name, wrapper)
    current.patches.append((owner, name, original, vars(owner)[name]))


def _unwrap_all(current: Shim) -> None:
    """Undo every wrap, last first."""
    while current.patches:
        restore(*current.patches.pop())


def restore(owner: Any, name: str, original: Any, ours: Any) -> None:
    """Put ``original`` back as ``owner.name``, unless someone re-patched it on top of ``ours``."""
    if vars(owner).get(name) is ours:
        setattr(owner, name, original)
    else:
        logger.warning("%s.%s was re-patched by someone else; left as it is",
                       getattr(owner, "__qualname__", getattr(owner, "__name__", owner)), name)
