"""Helpers every benchmark shares: the environment tag, arm rotation, progress, option types, the
per-size loop of the real-engine benches."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from datetime import date
from typing import Any, TypeVar

OK, ERR = 0, 1
T = TypeVar("T")


def environment() -> dict[str, str]:
    import torch

    from ..compat import freetoken_version

    driver = "unknown"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    return {"gpu": torch.cuda.get_device_name(), "driver": driver, "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "freetoken": freetoken_version(), "python": platform.python_version(),
            "date": date.today().isoformat()}


def rotated(names: Sequence[T], rep: int) -> list[T]:
    """Arm order for pass ``rep``: each arm takes every position in turn, so none is always first."""
    k = rep % len(names)
    return [*names[k:], *names[:k]]


def last_stderr_line(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr.strip().splitlines() or ["no output"])[-1]


def progress(iterable: Iterable, total: int, desc: str) -> Iterable:
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False, disable=total < 50)


def positive(text: str) -> int:
    return _whole_at_least(text, 1)


def non_negative(text: str) -> int:
    return _whole_at_least(text, 0)


def _whole_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"{text!r}: accepted values are whole numbers of {low} or more")
    return value


def write_json(path: str | None, record: Any) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(record, fh, indent=1)


def run_sizes(opts: argparse.Namespace, name: str, record: Callable[[int, argparse.Namespace, str], dict],
              render: Callable[[dict], str], failed: Callable[[dict], bool]) -> int:
    """``bench --engine`` and ``--serve``: refuse a bad ``--layers`` before any size runs, then one
    record per size with its processes' logs kept, ``--json``, the tables; exit 1 when one failed."""
    from .model import check_layers

    try:
        for layers in opts.layers:
            check_layers(layers)
    except ValueError as exc:
        print(f"bench --{name}: --layers: {exc}", file=sys.stderr)
        return ERR
    log_dir = opts.logs or tempfile.mkdtemp(prefix=f"graphfix-{name}-")
    os.makedirs(log_dir, exist_ok=True)
    records = [record(layers, opts, log_dir) for layers in opts.layers]
    write_json(opts.json, records)
    for rec in records:
        print(render(rec) + "\n")
    print(f"{name} logs: {log_dir}")
    return ERR if any(failed(rec) for rec in records) else OK
