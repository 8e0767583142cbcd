"""The arms the real-engine benchmarks compare (``bench engine``, ``bench serve``): every fact about an
arm in one registry, and each one's process environment.

An arm is a build of FreeToken's decode path: FreeToken as shipped (``upstream``), without its upload
(``no-upload``), with its own escape hatch (``gate``), under the shim in one mode, or with the patch
series (``patched``). The rig's "modes" are the shim's modes alone (``SHIM_MODES``). Records written
before the arms were named for what they run call ``no-upload`` ``pre-697`` (``record_files`` renames it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from freetoken_graphfix import config
from freetoken_graphfix.config import Mode
from freetoken_graphfix.decide import Action
from freetoken_graphfix.tools import series


@dataclass(frozen=True)
class Arm:
    name: str
    about: str
    protected: bool  # its first launches never block behind the WAIT (upstream: on a FreeToken that uploads)
    uploaded_at_capture: bool  # FreeToken's cuGraphUpload runs on its decode graphs at capture
    shim_mode: Mode | None = None  # FT_GRAPH_UPLOAD for a shim arm
    wait_action: Action | None = None  # the shim's action on a graph holding the WAIT, for a shim arm
    patched: bool = False  # FreeToken with patches/ applied (a patched copy first on PYTHONPATH)
    ple_sync: str = "wait"  # FREETOKEN_PLE_SYNC: every arm but gate runs wait-sync, so the WAIT is in its graphs
    in_serve: bool = True  # bench serve runs it (no-upload and gate need the engine child's seams)

    @property
    def never_uploaded(self) -> bool:
        """Unprotected and never uploaded: the negative control, and the base of every ratio."""
        return not self.protected and not self.uploaded_at_capture


UPSTREAM, NO_UPLOAD, GATE, PATCHED = "upstream", "no-upload", "gate", "patched"


def _shim_arm(mode: Mode, about: str, protected: bool, wait_action: Action) -> Arm:
    """The arm that runs FreeToken under the shim in ``mode``: named for the mode."""
    return Arm(mode.value, f"the shim, FT_GRAPH_UPLOAD={mode.value}{about}", protected,
               mode is Mode.UPLOAD, mode, wait_action)


ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm(UPSTREAM, "FreeToken as shipped (0.2.x uploads every graph at capture)", True, True),
    Arm(NO_UPLOAD, "FreeToken with its upload removed: the negative control", False, False, in_serve=False),
    Arm(GATE, "FREETOKEN_PLE_SYNC=gate: the fill before the launch, no WAIT in the graph", True, True,
        ple_sync="gate", in_serve=False),
    _shim_arm(Mode.AUTO, "", True, Action.DEFERRED),
    _shim_arm(Mode.UPLOAD, " (FreeToken's own upload)", True, Action.UPLOAD),
    _shim_arm(Mode.WARM, "", True, Action.WARM),
    _shim_arm(Mode.DEFERRED, "", True, Action.DEFERRED),
    _shim_arm(Mode.SKIP, ": never uploaded, unprotected", False, Action.EXPOSED),
    Arm(PATCHED, "FreeToken 0.2.1 with patches/ applied", True, False, patched=True),
)}
RENAMED = {"pre-697": NO_UPLOAD}  # an arm's name in records written before it was named for what it runs
SHIM_MODES = tuple(a.shim_mode.value for a in ARMS.values() if a.shim_mode)  # the rig's modes
SERVE_ARMS = tuple(name for name, a in ARMS.items() if a.in_serve)
AUTO, DEFERRED, SKIP = Mode.AUTO.value, Mode.DEFERRED.value, Mode.SKIP.value
ENGINE_DEFAULT = (UPSTREAM, NO_UPLOAD, AUTO)
ENGINE_DEFAULT_WAIT = (*ENGINE_DEFAULT, DEFERRED)  # with the WAIT, auto and deferred are the A/A pair
SERVE_DEFAULT = (UPSTREAM, AUTO, DEFERRED, Mode.WARM.value, Mode.UPLOAD.value, SKIP)
AA_PAIRS = {  # two arms whose decode graphs are the same and never uploaded: without the WAIT, and with it
    False: [(NO_UPLOAD, other) for other in (AUTO, SKIP, DEFERRED, Mode.WARM.value, PATCHED)] + [(AUTO, DEFERRED)],
    True: [(NO_UPLOAD, SKIP), (AUTO, DEFERRED)],
}


def never_uploaded() -> tuple[str, ...]:
    """The arms whose graphs no upload touches: the A/A set a never-uploaded figure is compared within."""
    return tuple(name for name, a in ARMS.items() if a.never_uploaded)


def default_engine_arms(expects_wait: bool) -> list[str]:
    """``--arms`` left out: upstream, no-upload and auto, and where the graphs hold the WAIT deferred too
    (auto and deferred then run the same never-uploaded graphs: the A/A control)."""
    return list(ENGINE_DEFAULT_WAIT if expects_wait else ENGINE_DEFAULT)


def aa_pair(arms: list[str], wait_case: bool) -> tuple[str, str] | None:
    """The A/A control among ``arms``: two arms whose decode graphs are identical and never uploaded
    (without a host-released WAIT every shim arm is a no-op, like no-upload; with one, no-upload and skip
    leave it exposed alike, auto and deferred defer it alike)."""
    return next((pair for pair in AA_PAIRS[wait_case] if pair[0] in arms and pair[1] in arms), None)


def expected_action(arm: str, wait_case: bool) -> Action:
    """The action a shim arm's shim must take on every graph: its own on the WAIT's graphs (and
    ``upload`` everywhere), ``no-op`` on graphs without it."""
    a = ARMS[arm]
    return a.wait_action if wait_case or a.shim_mode is Mode.UPLOAD else Action.NOOP  # type: ignore[return-value]


def arm_env(arm: str, patched: str | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The engine (or server) process's environment: the user's (``base``), with ``FREETOKEN_PLE_SYNC``
    set as the arm runs it (the WAIT must be in every other arm's graphs, whatever the user set),
    ``FT_GRAPH_UPLOAD`` only for shim arms, and for the patched arm the patched FreeToken (``patched``)
    first on ``PYTHONPATH``."""
    a = ARMS[arm]
    env = {k: v for k, v in (os.environ if base is None else base).items() if k != config.ENV_MODE}
    env["FREETOKEN_PLE_SYNC"] = a.ple_sync
    if a.shim_mode:
        env[config.ENV_MODE] = a.shim_mode.value
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
