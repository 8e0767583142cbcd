"""Which FreeToken the shim can patch, and how: decided by feature, reported with the version.

Two generations hold the PLE wait-sync WAIT that a never-uploaded graph can block its first
launch behind (paths below are FreeToken's, inside its ``freetoken`` package):

- 0.2.x uploads every graph at capture (``engine/graph.py`` ``_upload_graph``): the shim takes that
  call's place, graph by graph, and sees the WAITs through ``kernel/row_store.wait_reset``.
- 0.1.3 has no upload at all: the shim decides after ``GraphRunner._capture_graphs``, and sees the
  WAITs through ``kernel/_ple_store.memop_wait_reset`` (imported inside ``DiskRowTable.lookup``).

0.1.1 and 0.1.2 have no PLE table, hence no host-released WAIT: nothing to protect. "Tested" means
exactly the releases in :data:`TESTED`; any other is patched only if every feature the shim relies
on is found, private details of the deferred path included, and says so in a WARNING.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType

from packaging.version import InvalidVersion, Version

TESTED = ("0.1.3", "0.2.0", "0.2.1")
"""The FreeToken releases the shim's tests run against; every other one is decided by feature."""

GRAPH_MODULE = "freetoken.engine.graph"
ROW_STORE_MODULE = "freetoken.kernel.row_store"
PLE_STORE_MODULE = "freetoken.kernel._ple_store"
PLE_MODULE = "freetoken.models.qwen4_exp.ple_disk"

SERIES_MARKER = "self._unlaunched_bs"  # patches/ 0001: DiskRowTable.lookup records its captured sizes
UPLOAD_SEAM = "upload-seam"  # 0.2.x: decide in place of each _upload_graph call
AFTER_CAPTURE = "after-capture"  # 0.1.3: decide once _capture_graphs has captured every graph


@dataclass(frozen=True)
class Compat:
    """What the installed FreeToken offers the shim, and why it can or cannot be patched."""

    version: str
    path: str
    patchable: bool
    reason: str
    level: int  # the logging level the reason deserves
    tested: bool
    deferred: bool  # the deferred first-launch guard can work on this release
    deferred_reason: str
    flavor: str = UPLOAD_SEAM
    wait_module: str = ROW_STORE_MODULE  # where the WAIT-enqueueing function lives
    wait_function: str = "wait_reset"
    checked: tuple[str, ...] = field(default=())  # the features looked for (named in the WARNING)


def freetoken_version() -> str:
    """The FreeToken release in use: its package's own ``version.py`` (a tree on ``PYTHONPATH`` may
    shadow the installed one; importing it imports nothing else), else the installed metadata."""
    try:
        return str(importlib.import_module("freetoken.version").__version__)
    except (ImportError, AttributeError):
        pass
    try:
        return metadata.version("freetoken")
    except metadata.PackageNotFoundError:
        return "unknown"


def is_tested(version: str) -> bool:
    """Exactly one of :data:`TESTED` (``0.2.1.post1`` or a local build is another release)."""
    try:
        return Version(version) in {Version(v) for v in TESTED}
    except InvalidVersion:
        return False


def _ple_methods() -> dict[str, str] | None:
    """The source of ``DiskRowTable``'s methods, ``None`` without a disk PLE table (0.1.1, 0.1.2).

    From the live class once ``ple_disk`` is imported; else parsed from its file. Never imported
    here: this runs inside FreeToken's import of ``engine.graph``, and importing the qwen4_exp
    package from there (``find_spec`` does, for a submodule) would pull FreeToken's model and
    triton kernel modules in, out of FreeToken's own order, before the engine has its device."""
    names = ("forward_host_ctx", "host_fill_batch", "lookup")
    live = sys.modules.get(PLE_MODULE)
    if live is not None and hasattr(live, "DiskRowTable"):
        return {n: _source(inspect.getattr_static(live.DiskRowTable, n, None)) for n in names}
    package = getattr(sys.modules.get("freetoken"), "__file__", None)
    path = os.path.join(os.path.dirname(package), *PLE_MODULE.split(".")[1:]) + ".py" if package else ""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == "DiskRowTable":
            methods = {f.name: ast.get_source_segment(text, f) or "" for f in node.body
                       if isinstance(f, ast.FunctionDef)}
            return {n: methods.get(n, "") for n in names}
    return None


def _params(fn: object) -> list[str] | None:
    try:
        return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _source(fn: object) -> str:
    try:
        return inspect.getsource(fn)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""


def _deferred_details(runner: type, table: dict[str, str]) -> list[tuple[str, bool]]:
    """The private details the deferred guard relies on, each with whether it was found."""
    replay = _source(inspect.getattr_static(runner, "replay", None))
    host_ctx, host_fill, lookup = table["forward_host_ctx"], table["host_fill_batch"], table["lookup"]
    return [
        ("GraphRunner.replay launches graph_map[batch.padded_size].replay()",
         "self.graph_map[batch.padded_size]" in replay and ".replay()" in replay),
        ("DiskRowTable.forward_host_ctx calls self.host_fill_batch and runs its fill after the launch",
         "self.host_fill_batch(" in host_ctx and "deferred()" in host_ctx),
        ("DiskRowTable.host_fill_batch returns the deferred fill", "return _complete" in host_fill),
        ("DiskRowTable.lookup waits on self._flag", "self._flag" in lookup),
    ]


def check(graph: ModuleType) -> Compat:
    """Inspect ``freetoken.engine.graph`` and the modules it works with (imported here if present)."""
    version = freetoken_version()
    path = os.path.dirname(str(getattr(sys.modules.get("freetoken"), "__file__", None) or graph.__file__))
    tested = is_tested(version)

    def verdict(patchable: bool, reason: str, level: int, **kw: object) -> Compat:
        kw.setdefault("deferred_reason", reason)
        return Compat(version, path, patchable, reason, level, tested, **kw)

    table = _ple_methods()
    if table is not None and SERIES_MARKER in table["lookup"]:
        return verdict(False, f"freetoken {version} carries the patch series (no capture-time upload; PLE first "
                       "launches filled before the launch): the shim stands down", logging.INFO, deferred=False)
    if table is None:
        return verdict(False, f"freetoken {version}: no host-released WAIT in this release (no disk PLE table): "
                       "nothing to protect", logging.INFO, deferred=False)
    runner = getattr(graph, "GraphRunner", None)
    capture = inspect.getattr_static(runner, "_capture_graphs", None) if runner is not None else None
    if capture is None:
        return verdict(False, f"freetoken {version} has no GraphRunner._capture_graphs; FreeToken left untouched",
                       logging.WARNING, deferred=False)
    upload = getattr(graph, "_upload_graph", None)
    if upload is not None:
        flavor, wait_module, wait_function = UPLOAD_SEAM, ROW_STORE_MODULE, "wait_reset"
        wait_params: list[str] | None = ["stream", "flag"]
        if _params(upload) != ["graph", "stream"]:
            return verdict(False, f"freetoken {version} changed _upload_graph to {_params(upload)}, expected "
                           "(graph, stream); FreeToken left untouched", logging.WARNING, deferred=False)
    else:
        flavor, wait_module, wait_function, wait_params = AFTER_CAPTURE, PLE_STORE_MODULE, "memop_wait_reset", None
    try:
        waits = importlib.import_module(wait_module)
    except Exception as exc:  # a broken extension: the shim cannot see WAITs, so it must not patch
        return verdict(False, f"freetoken {version}: cannot import {wait_module} ({exc!r}): the shim cannot see "
                       "which graphs hold a host-released WAIT; FreeToken left untouched", logging.WARNING,
                       deferred=False)
    enqueue = getattr(waits, wait_function, None)
    if not callable(enqueue) or (wait_params is not None and _params(enqueue) != wait_params):
        return verdict(False, f"freetoken {version} lacks {wait_module}.{wait_function}"
                       f"{'(' + ', '.join(wait_params) + ')' if wait_params else ''}: the shim cannot see which graphs "
                       "hold a host-released WAIT; FreeToken left untouched", logging.WARNING, deferred=False)
    details = _deferred_details(runner, table)
    missing = [name for name, found in details if not found]
    checked = ("GraphRunner._capture_graphs", f"{wait_module}.{wait_function}",
               *([] if flavor == AFTER_CAPTURE else ["_upload_graph(graph, stream)"]), *(n for n, _ in details))
    what = "holds the capture-time upload" if flavor == UPLOAD_SEAM else "has no capture-time upload at all"
    reason = f"freetoken {version} {what}"
    if not tested:
        reason += (f" (untested release, decided by feature: found {', '.join(checked[:3])}; deferred path: "
                   + ("every private detail found" if not missing else f"missing {'; '.join(missing)}") + ")")
    return verdict(True, reason, logging.INFO if tested else logging.WARNING, deferred=not missing,
                   deferred_reason="its first launches can be guarded" if not missing else
                   f"missing {'; '.join(missing)}", flavor=flavor, wait_module=wait_module,
                   wait_function=wait_function, checked=checked)
