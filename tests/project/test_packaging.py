"""The bootstrap .pth lands at the root of site-packages for regular and editable installs alike."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from freetoken_graphfix import bootstrap

ROOT = Path(__file__).resolve().parents[2]


def test_wheels_carry_the_pth_at_their_root(tmp_path):
    from hatchling.builders.wheel import WheelBuilder

    built = list(WheelBuilder(str(ROOT)).build(directory=str(tmp_path), versions=["standard", "editable"]))
    assert len(built) == 2
    source = (ROOT / "freetoken_graphfix" / "_bootstrap.pth").read_text()
    for wheel in built:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            assert bootstrap.PTH_NAME in names, (wheel, names)  # the root, not *.data/
            assert zf.read(bootstrap.PTH_NAME).decode() == source


def import_graph() -> dict[str, set[str]]:
    """Each module of both packages and the modules of them it imports (anywhere in it,
    functions included: an import inside a function still ties the two modules together)."""
    import ast

    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for package in ("freetoken_graphfix", "freetoken_graphfix_bench")
               for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join(here.split(".")[:len(here.split(".")) - node.level + 1] + ([node.module] if node.module
                                                                                          else []))
                deps |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("freetoken_graphfix"):
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("freetoken_graphfix")}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def test_no_import_circle():
    """A module that imports one that imports it back splits one job over two files: none does."""
    graph = import_graph()
    assert graph["freetoken_graphfix.shim"] >= {"freetoken_graphfix.bootstrap"}  # the walk sees imports

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for dep in graph[todo.pop()] - seen:
                seen.add(dep)
                todo.append(dep)
        return seen

    circles = sorted(m for m in graph if m in reach(m))
    assert circles == []


def resolved(*requirements: str) -> dict[str, str]:
    """What pip would install, from scratch, for ``requirements``: name -> version (``--dry-run``)."""
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--report", str(report), *requirements], check=True, capture_output=True, timeout=600)
        return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}


@pytest.mark.timeout(900)  # two full pip resolves against the index: 78 s of 120 in a quiet run, more under load
def test_installing_beside_freetoken_moves_nothing_freetoken_resolves():
    """pip resolves FreeToken 0.2.1 alone, then with this package: every package of the first
    resolve keeps its version (a pinned dependency of ours, such as the cuda-python meta-package's
    cuda-bindings~=13.4.4, would downgrade what torch brought), and ours adds only itself and wrapt."""
    alone = resolved("freetoken==0.2.1")
    beside = resolved("freetoken==0.2.1", str(ROOT))
    assert {name: (version, beside.get(name)) for name, version in alone.items() if beside.get(name) != version} == {}
    assert set(beside) - set(alone) <= {"freetoken-graphfix", "wrapt"}, sorted(set(beside) - set(alone))


def test_every_dependency_is_imported_and_pins_nothing():
    """No unused dependency (each is imported by the package), and none pinned to a version range
    that could move what FreeToken's own requirements chose (lower bounds for APIs used only)."""
    import re

    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=~!; ]", d, maxsplit=1)[0]: d for d in deps}
    imports = {"torch": "torch", "cuda-bindings": "cuda.bindings", "wrapt": "wrapt"}
    assert set(names) == set(imports), names
    source = "\n".join(p.read_text() for p in (ROOT / "freetoken_graphfix").rglob("*.py"))
    for name, module in imports.items():
        assert re.search(rf"^\s*(from|import) {re.escape(module)}\b", source, re.M), name
        assert not re.search(r"(==|~=|<)", names[name]), names[name]
