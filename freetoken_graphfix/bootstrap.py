"""Reach every Python process of the environment: the env-gated ``.pth`` calls :func:`start`.

FreeToken captures its graphs in ``freetoken-TP{i}-scheduler`` processes started with
multiprocessing "spawn" (``server/launch.py``), fresh interpreters that an ``import`` in the parent
never reaches. The environment does reach them, and so does a ``.pth`` in site-packages
(coverage's ``a1_coverage.pth`` idiom): ``freetoken_graphfix_bootstrap.pth`` imports this module
only when ``FT_GRAPH_UPLOAD`` is set, and the hooks stay lazy until FreeToken is imported.
"""

from __future__ import annotations

import os
import sys

from . import importhook

TYPE_CHECKING = False  # typing is not imported at start-up
if TYPE_CHECKING:
    from pathlib import Path

ENV_MODE = "FT_GRAPH_UPLOAD"  # config.ENV_MODE, spelled here so that start-up imports no enum (tested)
PTH_NAME = "freetoken_graphfix_bootstrap.pth"
GRAPH_MODULE = "freetoken.engine.graph"


NOT_ARMED = object()  # what disarm() returns when nothing was armed


class _Armed:
    armed = False
    env_before = None  # FT_GRAPH_UPLOAD as the user set it, before arm() exported a mode
    own_log_handler = False


def arm(*, own_log_handler: bool = False) -> None:
    """Install the shim once ``freetoken.engine.graph`` is imported (now, if it already is).

    Costs nothing until then: wrapt, logging and the shim's own modules are imported only when
    FreeToken is. ``FT_GRAPH_UPLOAD`` unset (or empty) is exported as ``auto`` right away, so child
    processes (spawned tensor-parallel ranks) decide the same way. Safe to call again.
    """
    _Armed.own_log_handler |= own_log_handler
    if _Armed.armed:
        return
    _Armed.armed = True
    value = os.environ.get(ENV_MODE)
    _Armed.env_before = value
    if not (value or "").strip():
        os.environ[ENV_MODE] = "auto"
    importhook.when_imported(GRAPH_MODULE, _on_freetoken)


def armed_env_before() -> object:
    """``FT_GRAPH_UPLOAD`` as found by a pending :func:`arm`, or ``NOT_ARMED``."""
    return _Armed.env_before if _Armed.armed else NOT_ARMED


def disarm() -> object:
    """Cancel a pending install (``install()``/``uninstall()`` take over); returns what
    :func:`armed_env_before` returned."""
    found = armed_env_before()
    importhook.discard(GRAPH_MODULE, _on_freetoken)
    _Armed.armed = False
    return found


def _on_freetoken(module: object) -> None:
    from . import hooks

    if _Armed.own_log_handler:
        _add_log_handler()
    hooks.install_armed()


def start() -> None:
    """The ``.pth``'s entry point: arm the shim in this process; never raises (one line on stderr)."""
    try:
        arm(own_log_handler=True)
    except Exception as exc:
        print(f"freetoken_graphfix: bootstrap failed, FreeToken left as it is: {exc!r}", file=sys.stderr)


def _add_log_handler() -> None:
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
    if not (value or "").strip():
        return False, f"{config.ENV_MODE} is unset (the .pth only acts when it is set)"
    try:
        mode = config.parse_mode(value)
    except Exception as exc:
        return False, str(exc)
    if mode is config.Mode.OFF:
        return False, f"{config.ENV_MODE}={value!r}: shim disabled, FreeToken keeps its own upload"
    return True, f"{config.ENV_MODE}={value!r} -> mode {mode.value}"


def interpreters() -> list[str]:
    """The ``python`` executables of this environment (they all read the same site-packages)."""
    import sysconfig
    from pathlib import Path

    bindir = Path(sysconfig.get_paths()["scripts"])
    found = sorted(str(p) for p in bindir.glob("python*") if p.is_file() and os.access(p, os.X_OK)
                   and not p.name.endswith("-config"))
    return found or [sys.executable]
