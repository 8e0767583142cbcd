"""Every saved record re-renders with the same figures: its report, failures and verbose markdown, byte for byte.

The expected texts in ``records/reports/`` were written by the code before the benchmarks' figures were split
into one function each, so a refactor that moves a figure's rule (or the order two rules run in) turns this red. A
deliberate change of a rule rewrites them, and the diff shows every figure it moved:
``python -c 'import tests.bench.test_rerender as t; t.rewrite()'``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from freetoken_graphfix.status_record import Status
from freetoken_graphfix_bench import registry
from freetoken_graphfix_bench.registry import report_of

RECORDS = Path(__file__).resolve().parents[1] / "records"
EXPECTED = RECORDS / "reports"
SAVED = sorted(RECORDS.glob("*.json"))


def rendered(path: Path) -> str:
    """What a reader of ``bench report PATH --verbose --markdown`` is shown, in one text."""
    report = report_of(registry.read(str(path)))
    markdown = report.markdown(True) if report.markdown else ""
    return f"{report.text}\n--- failures\n" + "\n".join(report.failures) + f"\n--- markdown --verbose\n{markdown}\n"


def rewrite() -> None:
    """Write the expected texts from this version's rules (after a deliberate change of a rule)."""
    for path in SAVED:
        (EXPECTED / f"{path.stem}.txt").write_text(rendered(path), encoding="utf-8")


def test_every_saved_record_has_its_expected_text():
    assert [p.stem for p in SAVED] == sorted(p.stem for p in EXPECTED.glob("*.txt"))


@pytest.mark.parametrize("path", SAVED, ids=[p.stem for p in SAVED])
def test_a_saved_record_renders_as_it_did(path):
    assert rendered(path) == (EXPECTED / f"{path.stem}.txt").read_text(encoding="utf-8")


def test_a_second_schema_record_reads_in_the_current_shape():
    """Schema 2 named the never-uploaded arm ``pre-697``, kept an engine process's status without its
    pid, and a server's capture passes as actions and reasons: read back, the arm is ``no-upload``, the
    status is 0's, and each server process is one typed status holding its passes."""
    engine = registry.read(str(RECORDS / "engine-small.json"))
    assert json.loads((RECORDS / "engine-small.json").read_text())["schema"] == 2
    case = engine.cases[0]
    assert "no-upload" in case.runs and "pre-697" not in case.runs
    assert {r.arm for r in case.runs["no-upload"]} == {"no-upload"}
    shims = [r.shim for rs in case.runs.values() for r in rs if r.shim is not None]
    assert shims and all(isinstance(s, Status) and s.pid == 0 for s in shims)
    serve = registry.read(str(RECORDS / "serve.json")).cases[0].runs["auto"]
    assert [(type(s), s.pid, [p.index for p in s.passes]) for s in serve.shims] == [(Status, 1263, [0, 1])]
    assert {g.action for _, p in serve.passes() for g in p.graphs} == {"deferred"}
