"""Which FreeToken the shim can patch: decided by feature, reported with the version.

FreeToken 0.2.0 and 0.2.1 hold the capture-time upload (``engine/graph.py`` ``_upload_graph``);
0.1.x has none, so there is nothing to replace there.
"""

from __future__ import annotations

import inspect
import logging
import sys
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

TESTED = SpecifierSet(">=0.2.0,<0.3")
"""FreeToken releases this shim is tested against (0.2.0 and 0.2.1); others are gated by feature."""

GRAPH_MODULE = "freetoken.engine.graph"
ROW_STORE_MODULE = "freetoken.kernel.row_store"


@dataclass(frozen=True)
class Compat:
    """What the installed FreeToken offers the shim, and why it can or cannot be patched."""

    version: str
    path: str
    patchable: bool
    reason: str
    level: int  # the logging level the reason deserves
    tested: bool
    deferred: bool  # GraphRunner.replay is there, so first launches can be guarded
    deferred_reason: str


def freetoken_version() -> str:
    """The installed FreeToken's version, from its metadata or ``freetoken.__version__``."""
    try:
        return metadata.version("freetoken")
    except metadata.PackageNotFoundError:
        mod = sys.modules.get("freetoken")
        return str(getattr(mod, "__version__", "unknown"))


def _params(fn: object) -> list[str] | None:
    try:
        return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _is_tested(version: str) -> bool:
    try:
        return Version(version) in TESTED
    except InvalidVersion:
        return False


def check(graph: ModuleType, row_store: ModuleType | None) -> Compat:
    """Inspect ``freetoken.engine.graph`` (and ``row_store``, ``None`` if it failed to import)."""
    version = freetoken_version()
    path = str(getattr(sys.modules.get("freetoken"), "__file__", None) or graph.__file__)
    tested = _is_tested(version)

    def verdict(patchable: bool, reason: str, level: int, deferred: bool = False, why: str = "") -> Compat:
        return Compat(version, path, patchable, reason, level, tested, deferred, why or reason)

    if callable(getattr(graph, "_graph_upload_mode", None)):
        return verdict(False, f"freetoken {version} carries the graph-upload patch series (FREETOKEN_GRAPH_UPLOAD): "
                       "the shim stands down", logging.INFO)
    upload = getattr(graph, "_upload_graph", None)
    if not callable(upload):
        return verdict(False, f"freetoken {version} has no engine.graph._upload_graph: it never uploads "
                       "captured graphs, so there is nothing to replace", logging.INFO)
    if _params(upload) != ["graph", "stream"]:
        return verdict(False, f"freetoken {version} changed _upload_graph to {_params(upload)}, expected "
                       "(graph, stream); FreeToken left untouched", logging.WARNING)
    wait_reset = getattr(row_store, "wait_reset", None)
    if row_store is None or not callable(wait_reset) or _params(wait_reset) != ["stream", "flag"]:
        return verdict(False, f"freetoken {version} lacks kernel.row_store.wait_reset(stream, flag): the shim "
                       "cannot see which graphs hold a host-released WAIT; FreeToken left untouched",
                       logging.WARNING)
    runner = getattr(graph, "GraphRunner", None)
    replay = inspect.getattr_static(runner, "replay", None) if runner is not None else None
    capture = inspect.getattr_static(runner, "_capture_graphs", None) if runner is not None else None
    if capture is None:
        return verdict(False, f"freetoken {version} has no GraphRunner._capture_graphs; FreeToken left untouched",
                       logging.WARNING)
    reason = f"freetoken {version} holds the capture-time upload"
    if not tested:
        reason += f" (untested release: tested {TESTED})"
    level = logging.INFO if tested else logging.WARNING
    if replay is None or _params(replay) != ["self", "batch"]:
        return verdict(True, reason, level, False, "GraphRunner.replay(self, batch) not found")
    return verdict(True, reason, level, True, "GraphRunner.replay can be wrapped")
