"""Everything that runs at interpreter start-up: the env-gated ``.pth`` entry, the one install
pending FreeToken's import, and the post-import hook it waits with.

FreeToken captures its graphs in ``freetoken-TP{i}-scheduler`` processes started with
multiprocessing "spawn" (``server/launch.py``), fresh interpreters that an ``import`` in the parent
never reaches. The environment does reach them, and so does a ``.pth`` in site-packages
(coverage's ``a1_coverage.pth`` idiom): ``freetoken_graphfix_bootstrap.pth`` imports the package
only when ``FT_GRAPH_UPLOAD`` is set, and the package's ``_arm`` arms the install here. Most processes of the
environment (pip, tokenizer workers, scripts) never import FreeToken, so this module imports nothing
but ``os`` and ``sys`` and is the only one the package loads at start-up: the install side
(``shim``) is imported by the callback the package passes to :func:`arm`, once FreeToken's graph
module is imported. wrapt's own post-import hook would import ``asyncio`` and
``importlib.metadata`` (about 30 ms): :func:`when_imported` does the same job with ``sys`` alone.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported at start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from types import ModuleType
    from typing import Any

ENV_MODE = "FT_GRAPH_UPLOAD"  # config.ENV_MODE, spelled here so that start-up imports no enum (tested)
PTH_NAME = "freetoken_graphfix_bootstrap.pth"
GRAPH_MODULE = "freetoken.engine.graph"
NOT_ARMED = object()  # what env_before() and disarm() return when no install is pending


# ---------------------------------------------------------------- the install pending FreeToken

class _Pending:
    hook: Callable[[ModuleType], None] | None = None  # the install, run once FreeToken's graph module is
    env_before: str | None = None  # FT_GRAPH_UPLOAD as the user set it, before arm() exported a mode
    own_log_handler = False


def arm(hook: Callable[[ModuleType], None], own_log_handler: bool = False) -> None:
    """Run ``hook`` once ``freetoken.engine.graph`` is imported (now, if it already is), unless an
    install is already pending. ``FT_GRAPH_UPLOAD`` unset or empty is exported as ``auto`` right
    away, so processes started before FreeToken's import (spawned ranks) decide the same way. With
    ``own_log_handler`` (the ``.pth``) the shim's lines go to this process's stderr: a server's
    scheduler has no logging set up for them."""
    if _Pending.hook is not None:
        return
    _Pending.own_log_handler = own_log_handler
    value = os.environ.get(ENV_MODE)
    _Pending.hook, _Pending.env_before = hook, value
    if not (value or "").strip():
        os.environ[ENV_MODE] = "auto"
    when_imported(GRAPH_MODULE, _install)


def env_before() -> object:
    """``FT_GRAPH_UPLOAD`` as the pending :func:`arm` found it, or ``NOT_ARMED``."""
    return _Pending.env_before if _Pending.hook is not None else NOT_ARMED


def user_env_value() -> str | None:
    """``FT_GRAPH_UPLOAD`` as the user set it: before :func:`arm` exported a mode, when one is pending."""
    pending = env_before()
    return os.environ.get(ENV_MODE) if pending is NOT_ARMED else pending  # type: ignore[return-value]


def disarm() -> object:
    """Cancel the pending install (an install or uninstall takes over); returns what
    :func:`env_before` returned. The variable is left as it is: the caller decides."""
    found = env_before()
    discard(GRAPH_MODULE, _install)
    _Pending.hook = None
    return found


def _install(module: ModuleType) -> None:
    """FreeToken's graph module was imported: run the armed hook, with the shim's own log handler where the ``.pth``
    asked for one."""
    hook = _Pending.hook
    if hook is None:
        return
    if _Pending.own_log_handler:
        _add_log_handler()
    hook(module)


def _add_log_handler() -> None:
    """The shim's lines to stderr, tagged with the pid, where nothing else handles them: a spawned scheduler has no
    logging set up, and its capture lines must still show."""
    import logging

    log = logging.getLogger("freetoken_graphfix")
    if not log.handlers:  # the one INFO line per capture pass belongs in the engine's output
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[freetoken_graphfix pid=%(process)d] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False  # printed once, here, even where the program configures the root logger


def site_dirs() -> list[str]:
    """The site directories this interpreter reads ``.pth`` files from."""
    import site
    import sysconfig

    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    purelib = sysconfig.get_paths()["purelib"]
    return list(dict.fromkeys([purelib, *dirs]))


def installed_pth() -> Path | None:
    """The bootstrap ``.pth`` this interpreter will read at start-up, if any."""
    from pathlib import Path

    for directory in site_dirs():
        path = Path(directory) / PTH_NAME
        if path.is_file():
            return path
    return None


def would_activate(value: str | None) -> tuple[bool, str]:
    """Whether a new process started with ``FT_GRAPH_UPLOAD=value`` would install the shim, and why."""
    from . import config

    pth = installed_pth()
    if pth is None:
        return False, f"{PTH_NAME} not found in {site_dirs()}: reinstall freetoken-graphfix"
    if sys.flags.no_site:
        return False, "python -S: site (and every .pth) is disabled"
    if value is None:  # the .pth's own test: set to anything but an off value arms it (empty means auto)
        return False, f"{config.ENV_MODE} is unset (the .pth only acts when it is set)"
    if value.strip().lower() in config.OFF_VALUES:  # the .pth then imports nothing at all
        return False, f"{config.ENV_MODE}={value!r}: shim disabled, FreeToken keeps its own upload"
    try:
        mode = config.parse_mode(value)
    except Exception as exc:
        return False, str(exc)
    return True, f"{config.ENV_MODE}={value!r} -> mode {mode.value}"


def interpreters() -> list[str]:
    """The ``python`` executables of this environment (they all read the same site-packages)."""
    import sysconfig
    from pathlib import Path

    bindir = Path(sysconfig.get_paths()["scripts"])
    found = sorted(str(p) for p in bindir.glob("python*") if p.is_file() and os.access(p, os.X_OK)
                   and not p.name.endswith("-config"))
    return found or [sys.executable]


# ---------------------------------------------------------------- the post-import hook

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}


def when_imported(name: str, hook: Callable[[ModuleType], None]) -> None:
    """Call ``hook(module)`` once ``name`` is imported: now if it already is, else right after its
    import runs. Each hook runs once."""
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
        return
    _hooks.setdefault(name, []).append(hook)
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def discard(name: str, hook: Callable[[ModuleType], None]) -> None:
    """Forget ``hook`` if it has not run yet."""
    hooks = _hooks.get(name, [])
    if hook in hooks:
        hooks.remove(hook)
    if not hooks:
        _hooks.pop(name, None)
    _leave_when_idle()


def _fire(module: ModuleType) -> None:
    """Run and forget the hooks waiting for ``module``: each fires once, the first time the module is executed."""
    for hook in _hooks.pop(module.__name__, []):
        hook(module)
    _leave_when_idle()


def _leave_when_idle() -> None:
    """Take the finder out of ``sys.meta_path`` once no hook waits: every later import of the process
    would pass through it for nothing."""
    if not _hooks:
        sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _Finder)]


class _Finder:
    """Finds nothing itself: for a watched name it asks the other finders and wraps their loader."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        """A watched module's spec from the other finders, its loader wrapped so the hooks fire right after it executes;
        ``None`` for every other name."""
        if name not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader:
    """The real loader, plus the hooks after ``exec_module``; everything else is the real one's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        """The real loader's module: the wrapper changes nothing but what happens after execution."""
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        """Execute the module with its real loader, then fire its hooks: the module is complete when they run."""
        module.__loader__ = self._loader  # inspect, linecache and pickle see the real loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _fire(module)
