"""``python -m freetoken_graphfix bench <benchmark> ...`` run as a user runs it, for the GPU tests: its
record (``--json``, read back as ``bench report`` reads it) and its exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from freetoken_graphfix_bench import records, registry

ROOT = Path(__file__).resolve().parents[2]


def bench_command(args: list[str], folder: Path) -> list[str]:
    """``bench`` with ``args``, its logs and record in ``folder``: those options go before a ``--``, since
    everything after it is FreeToken's."""
    cut = args.index("--") if "--" in args else len(args)
    return [sys.executable, "-m", "freetoken_graphfix", "bench", *args[:cut], "--logs", str(folder / "logs"),
            "--json", str(folder / "record.json"), *args[cut:]]


def bench_record(args: list[str], folder: Path, env: dict[str, str] | None = None) -> tuple[records.Record, int]:
    """Run ``bench`` with ``args`` (logs and the record kept in ``folder``); its stdout is printed."""
    record = folder / "record.json"
    out = subprocess.run(bench_command(args, folder), cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    print("\n" + out.stdout)
    assert record.is_file(), out.stderr[-4000:]
    return registry.read(str(record)), out.returncode
