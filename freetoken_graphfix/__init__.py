"""freetoken_graphfix: protect only the FreeToken CUDA graphs that need it, at no replay cost.

``import freetoken_graphfix`` arms the shim (mode from ``FT_GRAPH_UPLOAD``, default ``auto``): it
installs itself when FreeToken's graph module is imported, whichever comes first, and imports
nothing heavy before that.
"""

from . import bootstrap

TYPE_CHECKING = False  # typing is not imported at start-up; every name here is imported on use
if TYPE_CHECKING:
    from typing import Any

    from .config import Mode
    from .device import Device

__all__ = ["install", "uninstall", "status", "Mode", "GraphfixError", "ConfigError", "WarmReplayError",
           "PatchError"]
__version__ = "0.1.0"


def install(mode: "str | Mode | None" = None, *, device: "Device | None" = None,
            warm_timeout_s: "float | None" = None) -> None:
    """Install the shim now, or switch the mode of the one installed (see :func:`hooks.install`).

    Raises :class:`ConfigError` for a mode (or ``FT_GRAPH_UPLOAD`` value) it does not accept. Where
    a dependency is missing it logs why, changes nothing, and :func:`status` says so."""
    hooks, why = _hooks()
    if hooks is None:
        import logging

        bootstrap.disarm()  # said once, here: FreeToken's import will not try again
        logging.getLogger("freetoken_graphfix").error("freetoken_graphfix: not installed: %s", why)
        return
    hooks.install(mode, device=device, warm_timeout_s=warm_timeout_s)


def uninstall() -> None:
    """Restore FreeToken's original functions exactly; safe to call again or before install()."""
    hooks, _ = _hooks()
    if hooks is not None:
        hooks.uninstall()


def status() -> "dict[str, Any]":
    """What the shim found, did and decided, per capture pass (see README, "Modes")."""
    hooks, why = _hooks()
    if hooks is None:
        return {"installed": False, "mode": None, "patched": False, "reason": why,
                "freetoken": {"version": None, "path": None, "tested": None},
                "deferred": {"available": False, "reason": why, "pending_first_launches": 0, "at_uninstall": ""},
                "mode_changes": [], "passes": []}
    return hooks.status()


def _hooks() -> "tuple[Any, str]":
    """The shim's hooks module, or ``None`` and why it cannot be loaded (a dependency an offline
    ``--no-deps`` install left out): nothing is patched then."""
    try:
        from . import hooks
    except ImportError as exc:
        return None, f"cannot be loaded: {exc} (a dependency of freetoken-graphfix: pip install wrapt packaging)"
    return hooks, ""


def _install_armed(module: object) -> None:
    """FreeToken's graph module was imported: complete the install this package's import armed.

    This runs inside FreeToken's import: whatever the shim lacks (a dependency an offline
    ``--no-deps`` install left out), FreeToken must import as shipped, and the shim stands down."""
    hooks, why = _hooks()
    if hooks is None:
        import logging

        bootstrap.disarm()
        logging.getLogger("freetoken_graphfix").error("freetoken_graphfix: not installed: %s; FreeToken keeps its own "
                                                      "upload", why)
        return
    hooks.install_armed()


def __getattr__(name: str) -> "Any":
    # imported on use: the .pth imports this package in every process of the environment
    if name == "Mode":
        from .config import Mode

        return Mode
    if name in ("ConfigError", "GraphfixError", "PatchError", "WarmReplayError"):
        from . import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'freetoken_graphfix' has no attribute {name!r}")


bootstrap.arm(_install_armed)
