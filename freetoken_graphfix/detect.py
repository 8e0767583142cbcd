"""Which captured graphs hold a stream WAIT that the host releases only after the launch returns.

Every such WAIT comes from a ``lookup`` called inside a capture: ``row_store.wait_reset`` in
FreeToken 0.2.x (``ple_disk.py``, ``engram_table.py``), ``_ple_store.memop_wait_reset`` in 0.1.3
(0.1.3's ``ple_disk.py`` 262-267). The caller's ``self`` tells who releases it:

- PLE ``DiskRowTable`` on CUDA (``_worker is None``): the deferred fill runs on the engine thread
  *after* ``cudaGraphLaunch`` returns (0.2.1's ``ple_disk.py`` 342-345). A large never-uploaded graph can
  block its own launch behind that WAIT: the deadlock the upload was added for.
- PLE on ROCm (a ``ple-fill`` worker) and Engram (``engram-fill``): the fill is submitted to a
  worker *before* the launch, so the WAIT is released even while the launch blocks.
- Anything else: unknown, so it is treated as released after the launch (protected).
Never seen here, and needing nothing: the WAITs MoE offload enqueues from C++ (docs/architecture.md,
"What the shim wraps").
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

from .compat import PLE_MODULE

ENGRAM_MODULE = "freetoken.models.deepseek_v41.engram_table"
PLE_KIND = "PLE wait-sync"  # the WAIT the upload was added for: how decisions and reports name it


class Release(str, enum.Enum):
    """When the host releases a WAIT relative to the graph's launch."""

    AFTER_LAUNCH = "after-launch"  # needs protection when the graph was never uploaded
    BEFORE_LAUNCH = "before-launch"  # a worker started before the launch releases it


@dataclass
class Wait:
    """One ``wait_reset`` recorded while a stream was capturing."""

    flag: Any  # the 1-element int64 host tensor the WAIT polls
    owner: Any  # the object whose method enqueued it (``None`` when unknown)
    kind: str  # "PLE wait-sync", "Engram wait-sync", or "unknown (<caller>)"
    release: Release
    deferrable: bool  # its release can be moved before the launch (PLE DiskRowTable fill)

    @property
    def after_launch(self) -> bool:
        """Whether the host releases this WAIT only after the launch returns: the one kind that needs protecting."""
        return self.release is Release.AFTER_LAUNCH

    def describe(self) -> dict[str, str]:
        """The WAIT as ``status()`` reports it: its owner, when it is released, its flag's address."""
        ptr = self.flag.data_ptr() if hasattr(self.flag, "data_ptr") else id(self.flag)
        return {"owner": self.kind, "release": self.release.value, "flag": hex(ptr)}


def _class_from(module: str, name: str) -> type | None:
    """A class from a module already loaded, or ``None``: never import, since a WAIT's owner is loaded whenever it owns
    one."""
    mod = sys.modules.get(module)  # never import: the owner's module is loaded if it owns a WAIT
    return getattr(mod, name, None) if mod is not None else None


def known_owner(owner: Any) -> tuple[str, Release, bool] | None:
    """``(kind, release, deferrable)`` when ``owner`` is a table the shim knows, else ``None``."""
    ple = _class_from(PLE_MODULE, "DiskRowTable")
    if ple is not None and isinstance(owner, ple):
        if getattr(owner, "_worker", None) is None:
            # forward_host_ctx calls self.host_fill_batch at every dispatch: the deferred guard
            # stands in for it there, unless something else already shadows it on the instance.
            shadow = vars(owner).get("host_fill_batch")
            deferrable = shadow is None or getattr(shadow, "graphfix_stager", False)
            return PLE_KIND, Release.AFTER_LAUNCH, deferrable
        return f"{PLE_KIND} (ple-fill worker)", Release.BEFORE_LAUNCH, False
    engram = _class_from(ENGRAM_MODULE, "EngramDiskTable")
    if engram is not None and isinstance(owner, engram):
        return "Engram wait-sync", Release.BEFORE_LAUNCH, False
    return None


_OWN_FRAMES = ("freetoken_graphfix.capture", "freetoken_graphfix.shim", "freetoken_graphfix.detect")
_SEARCH_DEPTH = 8  # frames looked through for the owner: enough for a few interposed wrappers


def caller_frame() -> FrameType:
    """The innermost frame outside wrapt and the shim's hooks: whoever called the wrapped function."""
    frame = sys._getframe(1)
    while frame.f_back is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith("wrapt") or name in _OWN_FRAMES):
            break
        frame = frame.f_back
    return frame


def outer_frames(depth: int = _SEARCH_DEPTH) -> list[FrameType]:
    """The caller's frame and up to ``depth - 1`` frames outside it, innermost first.

    Looked through, not just the caller's, because another tool (a profiler, a tracer, a
    user's counter) may wrap ``wait_reset`` or ``_upload_graph`` on top of the shim.
    """
    frames: list[FrameType] = []
    frame: FrameType | None = caller_frame()
    while frame is not None and len(frames) < depth:
        frames.append(frame)
        frame = frame.f_back
    return frames


class RawFlag:
    """A flag known only by its address (0.1.3 passes ``data_ptr()``), when no owner's ``_flag``
    tensor has it: enough for the protections, which read and write flags by address."""

    def __init__(self, ptr: int) -> None:
        self._ptr = ptr

    def data_ptr(self) -> int:
        """The flag's address, as a tensor would give it."""
        return self._ptr


def wait_from_caller(flag: Any) -> Wait:
    """Build the :class:`Wait` record for a WAIT-enqueueing call seen by the hook (``flag``: the
    tensor, or its address)."""
    frames = outer_frames()
    for frame in frames:  # the nearest known owner, even with wrappers in between
        owner = frame.f_locals.get("self")
        known = known_owner(owner)
        if known is not None:
            return Wait(_flag_of(owner, flag), owner, *known)
    caller = f"{frames[0].f_globals.get('__name__', '?')}.{frames[0].f_code.co_name}"
    return Wait(_flag_of(None, flag), frames[0].f_locals.get("self"), f"unknown ({caller})", Release.AFTER_LAUNCH,
                False)


def _flag_of(owner: Any, flag: Any) -> Any:
    """The flag tensor for a WAIT call given an address: the owner's own flag where it matches, else the bare
    address."""
    if not isinstance(flag, int):
        return flag
    own = getattr(owner, "_flag", None)
    return own if own is not None and own.data_ptr() == flag else RawFlag(flag)


def capture_batch_size() -> int | None:
    """The ``bs`` of FreeToken's capture loop (0.2.1's ``graph.py`` 200), when ``_capture_graphs`` is calling.

    Only from the ``_upload_graph`` hook, right under ``_capture_graphs``: reading that frame's
    locals from inside a capture (from the WAIT hook, deep in the model's forward) left FreeToken's
    real engine with an asynchronous "CUDA error: invalid argument" on the H200."""
    for frame in outer_frames():
        if frame.f_code.co_name == "_capture_graphs" and isinstance(frame.f_locals.get("bs"), int):
            return frame.f_locals["bs"]
    return None


class WaitRecorder:
    """The WAITs recorded during captures, with the ``id()`` of the graph each was captured into
    (0.1.3 only; no reference to a graph under capture is held).

    0.2.x drains them after each capture (``_upload_graph``); 0.1.3 takes each graph's once the pass
    is done (every graph is alive then, so ids are unambiguous). Cleared at the start and end of
    every capture pass, so a capture that raised never leaks its WAITs into the next one (runtime
    rebuilds capture again in the same process).
    """

    def __init__(self) -> None:
        self._waits: list[tuple[Wait, int | None]] = []

    def add(self, wait: Wait, graph_id: int | None = None) -> None:
        """Record a WAIT captured, with the graph it was captured into (``None`` where the capture is not known)."""
        self._waits.append((wait, graph_id))

    def drain(self) -> list[Wait]:
        """Every WAIT recorded since the last drain, and none left: on 0.2.x the WAITs of the graph just
        captured, since ``_upload_graph`` runs right after each capture."""
        waits, self._waits = self._waits, []
        return [w for w, _ in waits]

    def take(self, graph: Any) -> list[Wait]:
        """The WAITs captured into ``graph``, in capture order."""
        mine = [w for w, g in self._waits if g == id(graph)]
        self._waits = [(w, g) for w, g in self._waits if g != id(graph)]
        return mine

    def clear(self) -> None:
        """Forget every WAIT recorded: a pass starts clean, and one that raised leaves none behind."""
        self._waits = []
