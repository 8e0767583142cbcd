"""The GPU tests' records: kept by the GPU run, read back on CPU by ``test_gpu_records``.

A GPU run with ``GRAPHFIX_RECORDS=DIR`` writes what it measured: a bench record (``keep``) to
``DIR/<name>.json``, exactly as ``bench --json`` writes it, which ``bench report`` reads; a GPU test's own
steps (``keep_steps``) to ``DIR/steps/<name>.json``. Copied into ``tests/records/`` they are what CPU CI
checks. Written trimmed: floats to five significant figures (every check and verdict reads far
coarser), and machine paths cut to their last part, so a record says nothing of the machine it ran on
but its GPU, driver and versions.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from freetoken_graphfix_bench import record_files, records, registry

RECORDS = Path(__file__).resolve().parents[1] / "records"
ENV = "GRAPHFIX_RECORDS"
PATH = re.compile(r"(?<![\w.])/(?:[^\s/'\"|:,;()]+/)+")  # an absolute path's folders


def trimmed(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.5g}")
    if isinstance(value, str):
        return PATH.sub("…/", value)
    if isinstance(value, dict):
        return {k: trimmed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [trimmed(v) for v in value]
    return value


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trimmed(data), separators=(",", ":")) + "\n")


def keep(name: str, record: records.Record) -> records.Record:
    """A bench record, as the checks read it (trimmed, written and read back where ``GRAPHFIX_RECORDS``
    is set, so the GPU run checks exactly what CPU CI will)."""
    folder = os.environ.get(ENV)
    if not folder:
        return record
    _write(Path(folder) / f"{name}.json", record_files.to_data(record))
    return record_files.read(str(Path(folder) / f"{name}.json"))


def keep_steps(name: str, steps: dict[str, Any]) -> dict[str, Any]:
    """A GPU test's own steps (no bench record): written to ``steps/`` where ``GRAPHFIX_RECORDS`` is set."""
    folder = os.environ.get(ENV)
    if folder:
        _write(Path(folder) / "steps" / f"{name}.json", steps)
    return steps


def load(name: str) -> records.Record:
    return registry.read(str(RECORDS / f"{name}.json"))


def load_steps(name: str) -> dict[str, Any]:
    return json.loads((RECORDS / "steps" / f"{name}.json").read_text(encoding="utf-8"))
