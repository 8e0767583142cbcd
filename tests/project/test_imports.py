"""Every import of the distribution's own modules resolves, the lazy ones inside functions included.

A lazy ``from .x import y`` fails only when its branch runs: doctor's short check runs only where
CUDA is available, so a module moved under it broke doctor on every GPU machine while every CPU
test passed. This walks each file's syntax tree (both packages), resolves every relative import (and
every absolute one of either package) to its module, imports it and looks each name up there.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("freetoken_graphfix", "freetoken_graphfix_bench")
CHILD = ROOT / "freetoken_graphfix_bench" / "engine" / "child"  # run by path: its imports are its siblings'


def module_name(path: Path) -> str:
    """``freetoken_graphfix_bench.rig.deadlock`` for ``freetoken_graphfix_bench/rig/deadlock.py``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(path: Path) -> str:
    """The package a relative import in ``path`` counts its dots from."""
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def own_imports(path: Path, package: str) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, names) for each import of the package's own modules in ``path``, its
    relative imports counted from ``package``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[:len(base) - (node.level - 1)]
            target = ".".join([*base, node.module] if node.module else base)
            found.append((node.lineno, target, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] in PACKAGES]
    return found


def unresolved(path: Path, package: str) -> list[str]:
    """Each import of ``path`` that names a module or a name that is not there."""
    bad = []
    for line, target, names in own_imports(path, package):
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            bad.append(f"{path.name}:{line}: no module {target} ({exc})")
            continue
        for name in names:
            if name != "*" and not hasattr(module, name) and importlib.util.find_spec(f"{target}.{name}") is None:
                bad.append(f"{path.name}:{line}: {target} has no {name}")
    return bad


FILES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if CHILD not in p.parents)


def test_the_walk_sees_the_lazy_imports_it_exists_for():
    """The imports the rig's measurement makes inside a function, of its own package and of the shim's, are among
    those checked."""
    measure = own_imports(ROOT / "freetoken_graphfix_bench" / "rig" / "measure.py", "freetoken_graphfix_bench.rig")
    found = [(target, names) for _, target, names in measure]
    assert ("freetoken_graphfix_bench.rig.pieces", ["Rig", "install_mode", "last_pass"]) in found
    assert ("freetoken_graphfix.deferred", ["FirstLaunchGuard"]) in found


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_every_own_import_resolves(path):
    assert unresolved(path, package_of(path)) == []


def test_a_moved_module_is_caught(tmp_path):
    """The check itself: a lazy import naming a module that is not there (as doctor's did once) is red."""
    stale = (ROOT / "freetoken_graphfix_bench" / "rig" / "measure.py").read_text(encoding="utf-8")
    assert "    from .pieces import Rig" in stale
    moved = tmp_path / "measure.py"
    moved.write_text(stale.replace("    from .pieces import Rig", "    from .piece import Rig"), encoding="utf-8")
    assert [line for line in unresolved(moved, "freetoken_graphfix_bench.rig") if "no module" in line]
