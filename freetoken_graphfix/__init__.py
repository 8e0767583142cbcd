"""freetoken_graphfix: protect only the FreeToken CUDA graphs that need it, at no replay cost.

Importing the package changes nothing (OpenTelemetry's instrumentors, wrapt's patches): the shim is
turned on by :func:`install` in a script, or by the bootstrap ``.pth`` in every process started with
``FT_GRAPH_UPLOAD`` set, which arms :func:`_arm`'s install pending FreeToken's graph module. Either
imports nothing heavy until FreeToken's graph module is imported. So a tool (the benchmarks, doctor)
imports any module of the package without patching FreeToken in its own process.
"""

TYPE_CHECKING = False  # typing is not imported at start-up; every name here is imported on use
if TYPE_CHECKING:
    from typing import Any

    from .config import Mode
    from .device import Device

__all__ = ["install", "uninstall", "status", "Mode", "GraphfixError", "ConfigError", "WarmReplayError",
           "PatchError"]
__version__ = "0.2.0"


def install(mode: "str | Mode | None" = None, *, device: "Device | None" = None,
            warm_timeout_s: "float | None" = None) -> None:
    """Install the shim now, or switch the mode of the one installed (see :func:`shim.install`).

    Raises :class:`ConfigError` for a mode (or ``FT_GRAPH_UPLOAD`` value) it does not accept. Where
    a dependency is missing it logs why, changes nothing, and :func:`status` says so."""
    shim, why = _shim()
    if shim is None:
        import logging

        from . import bootstrap

        bootstrap.disarm()  # said once, here: FreeToken's import will not try again
        logging.getLogger("freetoken_graphfix").error("freetoken_graphfix: not installed: %s", why)
        return
    shim.install(mode, device=device, warm_timeout_s=warm_timeout_s)


def uninstall() -> None:
    """Restore FreeToken's original functions exactly; safe to call again or before install()."""
    shim, _ = _shim()
    if shim is not None:
        shim.uninstall()


def status() -> "dict[str, Any]":
    """What the shim found, did and decided, per capture pass (see the docs, "How the modes work")."""
    shim, why = _shim()
    if shim is None:
        from .status_record import unavailable

        return unavailable(why).as_dict()
    return shim.status().as_dict()


def _shim() -> "tuple[Any, str]":
    """The shim module, or ``None`` and why it cannot be loaded (a dependency an offline ``--no-deps``
    install left out): nothing is patched then."""
    try:
        from . import shim
    except ImportError as exc:
        return None, f"cannot be loaded: {exc} (a dependency of freetoken-graphfix: pip install wrapt)"
    return shim, ""


def _arm(own_log_handler: bool = False) -> None:
    """Install the shim once FreeToken's graph module is imported (now, if it already is), in the mode
    ``FT_GRAPH_UPLOAD`` holds then: what the ``.pth`` does at start-up (its lines to stderr), and doctor
    in its own process. A bad value is one ERROR line there, never an exception inside FreeToken's import."""
    from . import bootstrap

    bootstrap.arm(_install_armed, own_log_handler)


def _install_armed(module: object) -> None:
    """FreeToken's graph module was imported: complete the install :func:`_arm` armed.

    This runs inside FreeToken's import: whatever the shim lacks (a dependency an offline
    ``--no-deps`` install left out), FreeToken must import as shipped, and the shim stands down."""
    shim, why = _shim()
    if shim is None:
        import logging

        from . import bootstrap

        bootstrap.disarm()
        logging.getLogger("freetoken_graphfix").error("freetoken_graphfix: not installed: %s; FreeToken keeps its own "
                                                      "upload", why)
        return
    shim.install_armed()


def __getattr__(name: str) -> "Any":
    # imported on use: the .pth imports this package in every process of the environment
    if name == "Mode":
        from .config import Mode

        return Mode
    if name in ("ConfigError", "GraphfixError", "PatchError", "WarmReplayError"):
        from . import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'freetoken_graphfix' has no attribute {name!r}")
