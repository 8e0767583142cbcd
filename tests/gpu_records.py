"""The GPU tests' records: kept by the GPU run, read back on CPU by ``test_gpu_records``.

A GPU run with ``GRAPHFIX_RECORDS=DIR`` writes each record it measured to ``DIR/<name>.json``;
copied into ``tests/records/`` they are what CPU CI checks. Written trimmed: floats to five
significant figures (every check and verdict reads far coarser), and machine paths cut to their
last part, so a record says nothing of the machine it ran on but its GPU, driver and versions.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

RECORDS = Path(__file__).with_name("records")
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


def keep(name: str, kind: str, record: Any, code: int | None = None) -> dict[str, Any]:
    """``record`` as the checks read it; written to ``$GRAPHFIX_RECORDS/<name>.json`` when that is set."""
    measured = {"kind": kind, "record": record, "code": code}
    folder = os.environ.get(ENV)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        text = json.dumps(trimmed(measured), separators=(",", ":"))
        (Path(folder) / f"{name}.json").write_text(text + "\n")
    return measured


def load(name: str) -> dict[str, Any]:
    with open(RECORDS / f"{name}.json", encoding="utf-8") as fh:
        return json.load(fh)
