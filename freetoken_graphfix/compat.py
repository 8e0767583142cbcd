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
import functools
import importlib
import inspect
import os
import sys
from importlib import metadata
from types import ModuleType
from typing import NamedTuple

TESTED = ("0.1.2", "0.1.3", "0.2.0", "0.2.1")
"""The FreeToken releases the shim's tests run against; every other one is decided by feature."""

GRAPH_MODULE = "freetoken.engine.graph"
ROW_STORE_MODULE = "freetoken.kernel.row_store"
PLE_STORE_MODULE = "freetoken.kernel._ple_store"
PLE_MODULE = "freetoken.models.qwen4_exp.ple_disk"
PLE_METHODS = ("forward_host_ctx", "host_fill_batch", "lookup")  # DiskRowTable's, read for the deferred guard

SERIES_MARKER = "self._unlaunched_bs"  # patches/ 0001: DiskRowTable.lookup records its captured sizes
UPLOAD_SEAM = "upload-seam"  # 0.2.x: decide in place of each _upload_graph call
AFTER_CAPTURE = "after-capture"  # 0.1.3: decide once _capture_graphs has captured every graph


class Compat(NamedTuple):
    """What the installed FreeToken offers the shim, and why it can or cannot be patched. A typed tuple, not a frozen
    dataclass: its class is built in every process that arms the shim, and a dataclass of 14 fields costs 0.9 ms."""

    version: str | None
    path: str
    patchable: bool
    reason: str
    unexpected: bool  # not the FreeToken the shim was built for (untested, or a seam changed): worth a WARNING
    tested: bool
    deferred: bool  # the deferred first-launch guard can work on this release
    deferred_reason: str
    flavor: str = UPLOAD_SEAM
    wait_module: str = ROW_STORE_MODULE  # where the WAIT-enqueueing function lives, wrapped once it is imported
    wait_function: str = "wait_reset"
    wait_params: tuple[str, ...] | None = ("stream", "flag")  # None: a compiled function, its parameters unseen
    checked: tuple[str, ...] = ()  # the features looked for (named in the WARNING)

    def wait_seam_fits(self, function: object) -> bool:
        """Whether the WAIT-enqueueing function, as imported, is the one the shim records WAITs from."""
        return callable(function) and (self.wait_params is None or tuple(_params(function) or ()) == self.wait_params)

    def wait_seam(self) -> str:
        """``freetoken.kernel.row_store.wait_reset(stream, flag)``: how messages name it."""
        params = f"({', '.join(self.wait_params)})" if self.wait_params else ""
        return f"{self.wait_module}.{self.wait_function}{params}"


def freetoken_version() -> str | None:
    """The FreeToken release in use: its package's own ``version.py`` (a tree on ``PYTHONPATH`` may
    shadow the installed one; importing it imports nothing else), else the installed metadata;
    ``None`` where FreeToken is not installed."""
    try:
        return str(importlib.import_module("freetoken.version").__version__)
    except (ImportError, AttributeError):
        pass
    try:
        return metadata.version("freetoken")
    except metadata.PackageNotFoundError:
        return None


def is_tested(version: str | None) -> bool:
    """Exactly one of :data:`TESTED` (``0.2.1.post1`` or a local build is another release)."""
    release = _release(version)
    return release is not None and release in {_release(v) for v in TESTED}


def _release(version: str | None) -> tuple[int, ...] | None:
    """A release-only version as PEP 440 compares it (``v0.2.1.0`` is ``0.2.1``); ``None`` for anything more (a pre-,
    post- or dev release, a local build) or unreadable. Spelled here: ``packaging`` costs 2 ms at every install."""
    parts = (version or "").strip().lower().removeprefix("v").split(".")
    if not all(p.isascii() and p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def _package_path(module: str) -> str:
    """Where FreeToken's ``module`` lives (its ``.py`` file, without the suffix for an extension),
    from the imported ``freetoken`` package's folder: nothing here imports a module to find it."""
    package = getattr(sys.modules.get("freetoken"), "__file__", None)
    return os.path.join(os.path.dirname(package), *module.split(".")[1:]) if package else ""


def _parsed(module: str) -> ast.Module | None:
    """FreeToken's ``module``, parsed from its source (``None`` without one); never imported."""
    path = _package_path(module) + ".py"
    try:
        found = os.stat(path)
    except OSError:
        return None
    return _parse(path, found.st_mtime_ns, found.st_size)


@functools.lru_cache(maxsize=8)
def _parse(path: str, mtime_ns: int, size: int) -> ast.Module:
    """One file parsed once a process (the check reads ple_disk and row_store at every install), again only once it
    changed (its time and size are the key)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    tree = ast.parse(text)
    tree.source = text  # type: ignore[attr-defined]  (for the methods' source)
    return tree


def _ple_methods() -> dict[str, str] | None:
    """The source of ``DiskRowTable``'s methods, ``None`` without a disk PLE table (0.1.1, 0.1.2).

    From the live class once ``ple_disk`` is imported; else read from its file. Never imported
    here: this runs inside FreeToken's import of ``engine.graph``, and importing the qwen4_exp
    package from there (``find_spec`` does, for a submodule) would pull FreeToken's model and
    triton kernel modules in, out of FreeToken's own order, before the engine has its device."""
    live = sys.modules.get(PLE_MODULE)
    if live is not None and hasattr(live, "DiskRowTable"):
        return {n: _source(inspect.getattr_static(live.DiskRowTable, n, None)) for n in PLE_METHODS}
    path = _package_path(PLE_MODULE) + ".py"
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None
    return methods_cut(text, "DiskRowTable", PLE_METHODS) or methods_parsed(text, "DiskRowTable", PLE_METHODS)


def methods_parsed(text: str, cls: str, names: tuple[str, ...]) -> dict[str, str] | None:
    """Each method of class ``cls`` in ``text`` (empty where it has none), by parsing the whole file; ``None`` without
    the class."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            methods = {f.name: "".join(lines[f.lineno - 1:f.end_lineno]) for f in node.body
                       if isinstance(f, ast.FunctionDef)}
            return {n: methods.get(n, "") for n in names}
    return None


def methods_cut(text: str, cls: str, names: tuple[str, ...]) -> dict[str, str] | None:
    """:func:`methods_parsed`'s answer cut from the text without parsing the file (4 ms of every install on a 383-line
    ``ple_disk.py``): a method runs from its ``def`` to the next line at the class body's own indent, less trailing
    blank and comment lines. Each cut must parse as that one method, else ``None`` (the caller parses the file)."""
    lines = text.splitlines(keepends=True)
    span = _class_span(lines, cls)
    if span is None:
        return None
    start, end = span
    defs = [i for i in range(start + 1, end) if lines[i].lstrip().startswith("def ")]
    if not defs:
        return None
    indent = lines[defs[0]][:len(lines[defs[0]]) - len(lines[defs[0]].lstrip())]
    found: dict[str, str] = {}
    for i in defs:
        name = lines[i].lstrip()[4:].split("(")[0].strip()
        if name in names and lines[i].startswith(indent + "def "):
            cut = "".join(lines[i:_method_end(lines, i, end, indent)])
            if not _one_function(cut, indent, name):
                return None
            found[name] = cut
    return {n: found.get(n, "") for n in names}


def _starts_statement(line: str) -> bool:
    """Whether ``line`` (its indent removed) opens a statement a method cannot continue: a name or a decorator."""
    return line[:1].isidentifier() or line[:1] == "@"


def _class_span(lines: list[str], cls: str) -> tuple[int, int] | None:
    """The line of ``class cls`` and the first line after its body (the next statement at column 0)."""
    head = f"class {cls}"
    start = next((i for i, line in enumerate(lines) if line.startswith(head) and line[len(head):][:1] in ("(", ":")),
                 None)
    if start is None:
        return None
    return start, next((i for i in range(start + 1, len(lines)) if _starts_statement(lines[i])), len(lines))


def _method_end(lines: list[str], first: int, end: int, indent: str) -> int:
    """The line after the method whose ``def`` is ``first``: before the next statement at the body's indent, less
    trailing blank and comment lines (where the parsed function ends too)."""
    stop = next((j for j in range(first + 1, end) if lines[j].startswith(indent) and
                 _starts_statement(lines[j][len(indent):])), end)
    while stop > first + 1 and lines[stop - 1].strip()[:1] in ("", "#"):
        stop -= 1
    return stop


def _one_function(cut: str, indent: str, name: str) -> bool:
    """Whether ``cut`` (indented by ``indent``) parses as exactly one function named ``name``."""
    try:
        tree = ast.parse("".join(line.removeprefix(indent) for line in cut.splitlines(keepends=True)))
    except SyntaxError:
        return False
    return len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef) and tree.body[0].name == name


def defined_params(module: str, function: str) -> list[str] | None:
    """The parameters of ``module.function`` as its source defines them, ``None`` where the source
    holds no such function (or there is no source): read, never imported."""
    tree = _parsed(module)
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == function:
            a = node.args
            return [p.arg for p in (*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
                                    *([a.kwarg] if a.kwarg else []))]
    return None


def has_extension(module: str) -> bool:
    """Whether FreeToken ships the compiled extension ``module`` (0.1.3's ``_ple_store``), by its file."""
    folder, name = os.path.split(_package_path(module))
    return os.path.isdir(folder) and any(f.startswith(name + ".") and f.endswith((".so", ".pyd"))
                                         for f in os.listdir(folder))


def _params(fn: object) -> list[str] | None:
    """A function's parameter names, or ``None`` where it has no readable signature: the shim checks a hook's signature
    before wrapping it."""
    try:
        return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _source(fn: object) -> str:
    """A function's source, or empty where none is readable (a compiled or stripped install): a detail not found is a
    detail missing."""
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
    """Inspect ``freetoken.engine.graph`` and, by their sources, the modules it works with: nothing of
    FreeToken is imported here (this runs inside FreeToken's own import of ``engine.graph``). The WAIT
    function is checked again, as imported, when the shim wraps it (``wait_seam_fits``)."""
    version = freetoken_version()
    path = os.path.dirname(str(getattr(sys.modules.get("freetoken"), "__file__", None) or graph.__file__))
    tested = is_tested(version)

    def verdict(patchable: bool, reason: str, unexpected: bool, **kw: object) -> Compat:
        kw.setdefault("deferred_reason", reason)
        return Compat(version, path, patchable, reason, unexpected, tested, **kw)

    def refused(reason: str) -> Compat:
        return verdict(False, f"freetoken {version} {reason}; FreeToken left untouched", True, deferred=False)

    table = _ple_methods()
    if table is not None and SERIES_MARKER in table["lookup"]:
        return verdict(False, f"freetoken {version} carries the patch series (no capture-time upload; PLE first "
                       "launches filled before the launch): the shim stands down", False, deferred=False)
    if table is None:
        return verdict(False, f"freetoken {version}: no host-released WAIT in this release (no disk PLE table): "
                       "nothing to protect", False, deferred=False)
    runner = getattr(graph, "GraphRunner", None)
    if runner is None or inspect.getattr_static(runner, "_capture_graphs", None) is None:
        return refused("has no GraphRunner._capture_graphs")
    upload = getattr(graph, "_upload_graph", None)
    if upload is not None:
        seam = Compat(version, path, True, "", False, tested, True, "")
        if _params(upload) != ["graph", "stream"]:
            return refused(f"changed _upload_graph to {_params(upload)}, expected (graph, stream)")
        if tuple(defined_params(ROW_STORE_MODULE, "wait_reset") or ()) != seam.wait_params:
            return refused(f"lacks {seam.wait_seam()}: the shim cannot see which graphs hold a host-released WAIT")
        flavor, wait_module, wait_function, wait_params = UPLOAD_SEAM, ROW_STORE_MODULE, "wait_reset", seam.wait_params
    else:
        if not has_extension(PLE_STORE_MODULE):
            return refused(f"lacks {PLE_STORE_MODULE}: the shim cannot see which graphs hold a host-released WAIT")
        flavor, wait_module, wait_function, wait_params = AFTER_CAPTURE, PLE_STORE_MODULE, "memop_wait_reset", None
    details = _deferred_details(runner, table)
    missing = [name for name, found in details if not found]
    checked = ("GraphRunner._capture_graphs", f"{wait_module}.{wait_function}",
               *([] if flavor == AFTER_CAPTURE else ["_upload_graph(graph, stream)"]), *(n for n, _ in details))
    what = "holds the capture-time upload" if flavor == UPLOAD_SEAM else "has no capture-time upload at all"
    reason = f"freetoken {version} {what}"
    if not tested:
        reason += (f" (untested release, decided by feature: found {', '.join(checked[:3])}; deferred path: "
                   + ("every private detail found" if not missing else f"missing {'; '.join(missing)}") + ")")
    return verdict(True, reason, not tested, deferred=not missing,
                   deferred_reason="its first launches can be guarded" if not missing else
                   f"missing {'; '.join(missing)}", flavor=flavor, wait_module=wait_module,
                   wait_function=wait_function, wait_params=wait_params, checked=checked)
