"""The arms the real-engine benchmarks compare (``bench engine``, ``bench serve``): every fact about an
arm in one registry, and each one's process environment.

An arm is a build of FreeToken's decode path: FreeToken as shipped (``upstream``), without its upload
(``pre-697``), with its own escape hatch (``gate``), under the shim in one mode, or with the patch
series (``patched``). The rig's "modes" are the shim's modes alone (``SHIM_MODES``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from freetoken_graphfix import config, series


@dataclass(frozen=True)
class Arm:
    name: str
    about: str
    protected: bool  # its first launches never block behind the WAIT (upstream: on a FreeToken that uploads)
    uploaded_at_capture: bool  # FreeToken's cuGraphUpload runs on its decode graphs at capture
    shim_mode: str | None = None  # FT_GRAPH_UPLOAD for a shim arm
    wait_action: str | None = None  # the shim's action on a graph holding the WAIT, for a shim arm
    patched: bool = False  # FreeToken with patches/ applied (a patched copy first on PYTHONPATH)
    ple_sync: str = "wait"  # FREETOKEN_PLE_SYNC: every arm but gate runs wait-sync, so the WAIT is in its graphs
    in_serve: bool = True  # bench serve runs it (pre-697 and gate need the engine child's seams)

    @property
    def never_uploaded(self) -> bool:
        """Unprotected and never uploaded: the negative control, and the base of every ratio."""
        return not self.protected and not self.uploaded_at_capture


ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("upstream", "FreeToken as shipped (0.2.x uploads every graph at capture)", True, True),
    Arm("pre-697", "FreeToken with its upload removed: the negative control", False, False, in_serve=False),
    Arm("gate", "FREETOKEN_PLE_SYNC=gate: the fill before the launch, no WAIT in the graph", True, True,
        ple_sync="gate", in_serve=False),
    Arm("auto", "the shim, FT_GRAPH_UPLOAD=auto", True, False, "auto", "deferred"),
    Arm("upload", "the shim, FT_GRAPH_UPLOAD=upload (FreeToken's own upload)", True, True, "upload", "upload"),
    Arm("warm", "the shim, FT_GRAPH_UPLOAD=warm", True, False, "warm", "warm"),
    Arm("deferred", "the shim, FT_GRAPH_UPLOAD=deferred", True, False, "deferred", "deferred"),
    Arm("skip", "the shim, FT_GRAPH_UPLOAD=skip: never uploaded, unprotected", False, False, "skip", "exposed"),
    Arm("patched", "FreeToken 0.2.1 with patches/ applied", True, False, patched=True),
)}
GATE = "gate"
SHIM_MODES = tuple(a.shim_mode for a in ARMS.values() if a.shim_mode)  # the rig's modes
SERVE_ARMS = tuple(name for name, a in ARMS.items() if a.in_serve)
ENGINE_DEFAULT = ("upstream", "pre-697", "auto")
ENGINE_DEFAULT_WAIT = (*ENGINE_DEFAULT, "deferred")  # with the WAIT, auto and deferred are the A/A pair
SERVE_DEFAULT = ("upstream", "auto", "deferred", "warm", "upload", "skip")
AA_PAIRS = {  # two arms whose decode graphs are the same and never uploaded: without the WAIT, and with it
    False: [("pre-697", other) for other in ("auto", "skip", "deferred", "warm", "patched")] + [("auto", "deferred")],
    True: [("pre-697", "skip"), ("auto", "deferred")],
}


def never_uploaded() -> tuple[str, ...]:
    """The arms whose graphs no upload touches: the A/A set a never-uploaded figure is compared within."""
    return tuple(name for name, a in ARMS.items() if a.never_uploaded)


def default_engine_arms(expects_wait: bool) -> list[str]:
    """``--arms`` left out: upstream, pre-697 and auto, and where the graphs hold the WAIT deferred too
    (auto and deferred then run the same never-uploaded graphs: the A/A control)."""
    return list(ENGINE_DEFAULT_WAIT if expects_wait else ENGINE_DEFAULT)


def aa_pair(arms: list[str], wait_case: bool) -> tuple[str, str] | None:
    """The A/A control among ``arms``: two arms whose decode graphs are identical and never uploaded
    (without a host-released WAIT every shim arm is a no-op, like pre-697; with one, pre-697 and skip
    leave it exposed alike, auto and deferred defer it alike)."""
    return next((pair for pair in AA_PAIRS[wait_case] if pair[0] in arms and pair[1] in arms), None)


def expected_action(arm: str, wait_case: bool) -> str:
    """The action a shim arm's shim must take on every graph: its own on the WAIT's graphs (and
    ``upload`` everywhere), ``no-op`` on graphs without it."""
    a = ARMS[arm]
    return a.wait_action if wait_case or a.shim_mode == "upload" else "no-op"  # type: ignore[return-value]


def arm_env(arm: str, patched: str | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The engine (or server) process's environment: the user's (``base``), with ``FREETOKEN_PLE_SYNC``
    set as the arm runs it (the WAIT must be in every other arm's graphs, whatever the user set),
    ``FT_GRAPH_UPLOAD`` only for shim arms, and for the patched arm the patched FreeToken (``patched``)
    first on ``PYTHONPATH``."""
    a = ARMS[arm]
    env = {k: v for k, v in (os.environ if base is None else base).items() if k != config.ENV_MODE}
    env["FREETOKEN_PLE_SYNC"] = a.ple_sync
    if a.shim_mode:
        env[config.ENV_MODE] = a.shim_mode
    elif a.patched:
        if patched is None:
            raise ValueError(f"arm {arm!r} needs the patched FreeToken (series.patched_copy)")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (patched, env.get("PYTHONPATH")) if p)
    return env


def patched_freetoken(arms: list[str] | tuple[str, ...], log_dir: str) -> str | None:
    """The folder to put first on ``PYTHONPATH`` for the patched arms (a patched copy of the
    installed FreeToken under ``log_dir``), ``None`` when no patched arm runs."""
    if not any(ARMS[arm].patched for arm in arms):
        return None
    return str(series.patched_copy(Path(log_dir) / "patched-freetoken"))
