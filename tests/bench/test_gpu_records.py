"""The GPU tests' checks, on CPU, against the records of the last H200 run that passed.

A GPU test's assertions live in ``gpu_checks``; here each runs against its record in
``tests/records/``, read as ``bench report`` reads it and judged by the current code, so a renamed
attribute, a moved key or a record shape the code no longer reads turns CPU CI red instead of waiting
for the next GPU run. A missing record fails: it is refreshed by running the GPU suite with
``GRAPHFIX_RECORDS=tests/records`` (see docs/developing.md).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import gpu_checks
from tests.helpers.gpu_records import RECORDS, load, load_steps

GPU_MODULES = ["test_engine_gpu.py", "test_gpu.py", "test_serve_gpu.py", "test_freetoken_013_gpu.py"]


def measured(name: str):
    return load(name) if (RECORDS / f"{name}.json").is_file() else load_steps(name)


@pytest.mark.parametrize(("name", "check"), [
    pytest.param(name, fn, id=f"{name}-{fn.__name__}") for name, fns in gpu_checks.CHECKS.items() for fn in fns])
def test_the_gpu_check_holds_on_its_recorded_h200_record(name, check):
    check(measured(name))


def test_every_record_has_checks_and_every_check_a_record():
    kept = {p.stem for p in RECORDS.glob("*.json")} | {p.stem for p in (RECORDS / "steps").glob("*.json")}
    checked = set(gpu_checks.CHECKS)
    assert kept == checked, (sorted(kept - checked), sorted(checked - kept))


@pytest.mark.parametrize("path", sorted(RECORDS.glob("*.json")), ids=lambda p: p.name)
def test_every_kept_bench_record_reads_back_through_bench_report(path):
    """As a user would read it: ``freetoken-graphfix bench report tests/records/NAME.json``."""
    out = subprocess.run([sys.executable, "-m", "freetoken_graphfix", "bench", "report", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() and "error" not in out.stderr


def test_the_gpu_modules_keep_and_check_every_record():
    """Each record name is kept by a GPU test (``keep("name", ...)``) and checked there (``for_record``
    or a named check): a record no GPU run writes again would go stale unseen."""
    kept, checked = set(), set()
    for module in GPU_MODULES:
        tree = ast.parse(next(Path(__file__).resolve().parents[1].rglob(module)).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if fn in ("keep", "keep_steps", "engine_record"):
                    kept.add(node.args[0].value)
                elif fn == "for_record":
                    checked.add(node.args[0].value)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "gpu_checks":
                for name, fns in gpu_checks.CHECKS.items():
                    if any(fn.__name__ == node.attr for fn in fns):
                        checked.add(name)
    assert kept == set(gpu_checks.CHECKS), sorted(kept ^ set(gpu_checks.CHECKS))
    assert checked == set(gpu_checks.CHECKS), sorted(set(gpu_checks.CHECKS) - checked)
