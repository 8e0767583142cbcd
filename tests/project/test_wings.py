"""The two wings: the shim never imports the benchmarks, and importing any module of either patches nothing.

A tool that imported the shim's package used to arm it, so a benchmark measuring FreeToken as shipped had
to undo that by hand. Now only ``install()`` and the ``.pth`` turn the shim on: these tests import every
module in a fresh interpreter (``FT_GRAPH_UPLOAD`` unset, so the ``.pth`` stays out) and compare
FreeToken's functions with the ones it defined.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from tests.project.test_imports import FILES, ROOT, module_name, own_imports, package_of

SHIM, BENCH = "freetoken_graphfix", "freetoken_graphfix_bench"
# what the benchmarks may import of the shim's package: its public API (docs/architecture.md lists the same)
PUBLIC = {SHIM, *(f"{SHIM}.{m}" for m in ("config", "status_record", "safe_files", "errors", "device", "deferred",
                                           "decide", "detect", "compat", "bootstrap", "tools", "tools.series",
                                           "tools.exits", "tools.child"))}

IMPORT_ALL = """
import importlib, json, os, sys, types
import freetoken.engine.graph as graph
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
import freetoken_graphfix.bootstrap as bootstrap
found = {"_upload_graph": graph._upload_graph, "_capture_graphs": graph.GraphRunner.__dict__["_capture_graphs"]}
print(json.dumps({"as_defined": [k for k, f in found.items() if type(f) is types.FunctionType
                                 and f.__module__ == graph.__name__ and not hasattr(f, "__wrapped__")],
                  "pending": bootstrap.env_before() is not bootstrap.NOT_ARMED,
                  "finder": any(type(f).__name__ == "_Finder" for f in sys.meta_path),
                  "env": os.environ.get("FT_GRAPH_UPLOAD")}))
"""


def imports_of(package: str) -> list[tuple[str, str]]:
    """(file, imported module) for every import in ``package``'s files, relative ones resolved."""
    return [(str(path.relative_to(ROOT)), target) for path in FILES if path.relative_to(ROOT).parts[0] == package
            for _, target, _ in own_imports(path, package_of(path))]


def test_the_shim_never_imports_the_benchmarks():
    assert [(f, t) for f, t in imports_of(SHIM) if t.split(".")[0] == BENCH] == []


def test_the_shim_never_names_the_benchmarks_package_in_code():
    """No ``importlib.import_module('freetoken_graphfix_bench...')`` either: the command line reaches it through
    its entry point, doctor through ``bench _probe``'s process."""
    named = [(str(p.relative_to(ROOT)), node.value) for p in FILES if p.relative_to(ROOT).parts[0] == SHIM
             for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and BENCH in node.value]
    assert named == []


def test_the_benchmarks_use_the_shims_public_modules_only():
    assert sorted({t for _, t in imports_of(BENCH) if t.split(".")[0] == SHIM} - PUBLIC) == []


def test_the_walk_sees_the_benchmarks_imports_of_the_shim():
    """The check above can fail: the walk finds the rig's use of the shim's API."""
    assert (f"{BENCH}/rig/pieces.py", SHIM) in imports_of(BENCH)
    assert (f"{BENCH}/rig/measure.py", f"{SHIM}.deferred") in imports_of(BENCH)


def import_everything(modules: list[str], env_mode: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}
    if env_mode is not None:
        env["FT_GRAPH_UPLOAD"] = env_mode
    proc = subprocess.run([sys.executable, "-c", IMPORT_ALL, json.dumps(modules)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


ALL_MODULES = [module_name(p) for p in FILES]


def test_importing_every_module_of_both_wings_leaves_freetoken_unwrapped():
    found = import_everything(ALL_MODULES)
    assert found == {"as_defined": ["_upload_graph", "_capture_graphs"], "pending": False, "finder": False,
                     "env": None}


def test_the_check_sees_a_wrap_when_the_shim_is_turned_on():
    """The positive control: with ``FT_GRAPH_UPLOAD=auto`` the ``.pth`` arms the shim at start-up, and the same
    child reports the wrap."""
    found = import_everything(ALL_MODULES, env_mode="auto")
    assert found["as_defined"] == [] and found["env"] == "auto"
