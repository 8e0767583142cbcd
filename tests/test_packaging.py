"""The bootstrap .pth lands at the root of site-packages for regular and editable installs alike."""

from __future__ import annotations

import zipfile
from pathlib import Path

from freetoken_graphfix import bootstrap

ROOT = Path(__file__).resolve().parents[1]


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
    """Each module of the package and the modules of the package it imports (anywhere in it,
    functions included: an import inside a function still ties the two modules together)."""
    import ast

    package = ROOT / "freetoken_graphfix"
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in package.rglob("*.py")}
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
    assert graph["freetoken_graphfix.hooks"] >= {"freetoken_graphfix.bootstrap"}  # the walk sees imports

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for dep in graph[todo.pop()] - seen:
                seen.add(dep)
                todo.append(dep)
        return seen

    circles = sorted(m for m in graph if m in reach(m))
    assert circles == []
