"""The GPU tests' checks, on CPU, against the records of the last H200 run that passed.

A GPU test's assertions live in ``gpu_checks``; here each runs against its record in
``tests/records/`` after the record is judged again by the current code (``bench --from-json``'s
path), so a renamed attribute, a moved key or a record shape the code no longer reads turns CPU CI
red instead of waiting for the next GPU run. A missing record fails: it is refreshed by running the
GPU suite with ``GRAPHFIX_RECORDS=tests/records`` (see the README).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from freetoken_graphfix.bench import engine, rejudge, serve

from . import gpu_checks
from .gpu_records import RECORDS, load

GPU_MODULES = ["test_engine_gpu.py", "test_gpu.py", "test_serve_gpu.py", "test_013_gpu.py"]


def rejudged(name: str) -> dict:
    """Record ``name`` as the GPU test saw it, its verdict part (what ``judge`` writes) dropped and
    computed again by the current rules, and read back the way ``bench --from-json`` reads it."""
    measured = load(name)
    record, kind = measured["record"], measured["kind"]
    if kind == "engine":
        for key in ("summary", "wait_case"):
            del record[key]
        record.update(engine.judge(record["runs"], record["traced"], record["expects_wait"]))
    elif kind == "serve":
        for key in ("problems", "wait_case"):
            del record[key]
        record.update(serve.judge(record["runs"], record["expects_wait"]))
    else:
        assert kind in ("rig", "rig-steps"), kind
    if kind != "rig-steps":
        assert rejudge.judged([record] if kind != "rig" else record).kind == kind
    return measured


@pytest.mark.parametrize(("name", "check"), [
    pytest.param(name, fn, id=f"{name}-{fn.__name__}") for name, fns in gpu_checks.CHECKS.items() for fn in fns])
def test_the_gpu_check_holds_on_its_recorded_h200_record(name, check):
    check(rejudged(name))


def test_every_record_has_checks_and_every_check_a_record():
    kept, checked = {p.stem for p in RECORDS.glob("*.json")}, set(gpu_checks.CHECKS)
    assert kept == checked, (sorted(kept - checked), sorted(checked - kept))


def test_the_gpu_modules_keep_and_check_every_record():
    """Each record name is kept by a GPU test (``keep("name", ...)``) and checked there (``for_record``
    or a named check): a record no GPU run writes again would go stale unseen."""
    kept, checked = set(), set()
    for module in GPU_MODULES:
        tree = ast.parse(Path(__file__).with_name(module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if fn in ("keep", "engine_record"):
                    kept.add(node.args[0].value)
                elif fn == "for_record":
                    checked.add(node.args[0].value)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "gpu_checks":
                for name, fns in gpu_checks.CHECKS.items():
                    if any(fn.__name__ == node.attr for fn in fns):
                        checked.add(name)
    assert kept == set(gpu_checks.CHECKS), sorted(kept ^ set(gpu_checks.CHECKS))
    assert checked == set(gpu_checks.CHECKS), sorted(set(gpu_checks.CHECKS) - checked)
