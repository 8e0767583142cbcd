"""The arms a real-engine bench runs (``--engine`` and ``--serve``) and each one's process environment."""

from __future__ import annotations

import os
from pathlib import Path

from .. import config, patching

SHIM_ACTION = {"auto": "deferred", "upload": "upload", "warm": "warm", "deferred": "deferred", "skip": "exposed"}
SHIM_ARMS = tuple(SHIM_ACTION)  # FT_GRAPH_UPLOAD=<arm>, and the action the shim must take on a WAIT graph
PATCHED_ARMS = ("patched",)  # FreeToken with patches/ applied: a patched copy first on PYTHONPATH
GATE = "gate"  # FREETOKEN_PLE_SYNC=gate; every other arm runs wait-sync
ARMS = ("upstream", "pre-697", GATE, *SHIM_ARMS, *PATCHED_ARMS)
DEFAULT_ARMS = ("upstream", "pre-697", "auto")
WAIT_DEFAULT_ARMS = (*DEFAULT_ARMS, "deferred")  # where the WAIT is held, auto and deferred are the A/A pair
PROTECTED = ("auto", "upload", "warm", "deferred", "patched", GATE)  # never block, same tokens
NEVER_UPLOADED = ("pre-697", "skip")  # unprotected and never uploaded: the negative control


def arm_env(arm: str, patched: str | None = None) -> dict[str, str]:
    """The engine (or server) process's environment: the user's, with ``FREETOKEN_PLE_SYNC`` set to
    wait-sync (gate for the gate arm: the WAIT must be in every other arm's graphs, whatever the user
    set), ``FT_GRAPH_UPLOAD`` only for shim arms, and for the patched arm the patched FreeToken
    (``patched``) first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k != config.ENV_MODE}
    env["FREETOKEN_PLE_SYNC"] = "gate" if arm == GATE else "wait"
    if arm in SHIM_ARMS:
        env[config.ENV_MODE] = arm
    elif arm in PATCHED_ARMS:
        if patched is None:
            raise ValueError(f"arm {arm!r} needs the patched FreeToken (patching.patched_copy)")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (patched, os.environ.get("PYTHONPATH")) if p)
    return env


def patched_freetoken(arms: list[str], log_dir: str) -> str | None:
    """The folder to put first on ``PYTHONPATH`` for the patched arms (a patched copy of the
    installed FreeToken under ``log_dir``), ``None`` when no patched arm runs."""
    if not any(arm in PATCHED_ARMS for arm in arms):
        return None
    return str(patching.patched_copy(Path(log_dir) / "patched-freetoken"))
