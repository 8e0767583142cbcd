"""Reach every Python process of the environment: the env-gated ``.pth`` calls :func:`start`.

FreeToken captures its graphs in ``freetoken-TP{i}-scheduler`` processes started with
multiprocessing "spawn" (``server/launch.py``), fresh interpreters that an ``import`` in the parent
never reaches. The environment does reach them, and so does a ``.pth`` in site-packages
(coverage's ``a1_coverage.pth`` idiom): ``freetoken_graphfix_bootstrap.pth`` imports this module
only when ``FT_GRAPH_UPLOAD`` is set, and the hooks stay lazy until FreeToken is imported.
"""

from __future__ import annotations

import logging
import os
import site
import sys
import sysconfig
from pathlib import Path

from . import config

PTH_NAME = "freetoken_graphfix_bootstrap.pth"


def start() -> None:
    """Install the shim at interpreter start-up; never raises (one line on stderr instead)."""
    try:
        from . import hooks

        hooks.install()  # idempotent: importing the package already installed it
        log = logging.getLogger("freetoken_graphfix")
        if not log.handlers:  # the one INFO line per capture pass belongs in the engine's output
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[freetoken_graphfix pid=%(process)d] %(levelname)s %(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
            log.propagate = False  # printed once, here, even where the program configures the root logger
    except Exception as exc:
        print(f"freetoken_graphfix: bootstrap failed, FreeToken left as it is: {exc!r}", file=sys.stderr)


def site_dirs() -> list[str]:
    """The site directories this interpreter reads ``.pth`` files from."""
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    purelib = sysconfig.get_paths()["purelib"]
    return list(dict.fromkeys([purelib, *dirs]))


def installed_pth() -> Path | None:
    """The bootstrap ``.pth`` this interpreter will read at start-up, if any."""
    for directory in site_dirs():
        path = Path(directory) / PTH_NAME
        if path.is_file():
            return path
    return None


def would_activate(value: str | None) -> tuple[bool, str]:
    """Whether a new process started with ``FT_GRAPH_UPLOAD=value`` would install the shim, and why."""
    pth = installed_pth()
    if pth is None:
        return False, f"{PTH_NAME} not found in {site_dirs()}: reinstall freetoken-graphfix"
    if sys.flags.no_site:
        return False, "python -S: site (and every .pth) is disabled"
    if not value:
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
    bindir = Path(sysconfig.get_paths()["scripts"])
    found = sorted(str(p) for p in bindir.glob("python*") if p.is_file() and os.access(p, os.X_OK)
                   and not p.name.endswith("-config"))
    return found or [sys.executable]
