"""Helpers every benchmark shares: the environment tag, arm rotation, progress, option types, and
the per-model loop of the real-engine benches."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, TypeVar

from .settings import Outputs
from .target import Target

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
    """A progress bar on a terminal; nothing where stderr is a file or a pipe (a log, CI), which a
    bar would fill with carriage-return updates (tqdm's own convention)."""
    if not sys.stderr.isatty():
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False)


def positive(text: str) -> int:
    return _whole_at_least(text, 1)


def non_negative(text: str) -> int:
    return _whole_at_least(text, 0)


def seconds(text: str) -> float:
    """A duration in seconds: finite and above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: accepted values are seconds above 0")
    return value


def _whole_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"{text!r}: accepted values are whole numbers of {low} or more")
    return value


def write_json(path: str | None, record: Any) -> None:
    """``record`` as JSON, a figure that could not be computed (nan, inf) as ``null``: strict JSON."""
    if path:
        with open(path, "w") as fh:
            json.dump(finite(record), fh, indent=1, allow_nan=False)


def finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def check_writable(path: str | None, option: str) -> None:
    """Refuse, before a long run, an output file that could not be written at its end."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path)) if path else ""
    if not path or os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ValueError(f"{option} {path!r}: cannot be written; accepted values are a file path in an existing, "
                         "writable directory")
    if os.path.exists(path):
        try:
            with open(path, "a"):  # opened for appending, never written: the file is left as it is
                pass
        except OSError as exc:
            raise ValueError(f"{option} {path!r}: cannot be written ({exc.strerror}); accepted values are a file "
                             "path in an existing, writable directory") from None


@dataclass(frozen=True)
class Case:
    """One model a real-engine bench runs: the target and the synthetic model's size (``None`` for
    ``--model``)."""

    target: Target
    layers: int | None

    @property
    def label(self) -> str:
        nvfp4 = " nvfp4" if self.target.experts == "nvfp4" else ""
        return f"{self.layers} layers{nvfp4}" if self.target.synthetic else os.path.basename(
            os.path.normpath(self.target.model_dir or ""))

    @contextlib.contextmanager
    def model_dir(self, log_dir: str) -> Iterator[str]:
        """The model's directory: ``--model`` itself, or the synthetic model written under ``log_dir``
        for the run and removed after it."""
        if not self.target.synthetic:
            yield str(self.target.model_dir)
            return
        from .model import build_model_dir

        folder = tempfile.mkdtemp(prefix=f"graphfix-{self.layers}L-", dir=log_dir)
        try:
            build_model_dir(folder, int(self.layers or 0), experts=self.target.experts)
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def run_cases(cases: list[Case], settings: Any, logs: str | None, outputs: Outputs, name: str,
              record: Callable[[Case, Any, str], dict], render: Callable[[dict], str], failed: Callable[[dict], bool],
              markdown: Callable[[list[dict]], str] | None = None,
              plot: Callable[[list[dict], str], str] | None = None) -> int:
    """``bench --engine`` and ``--serve`` over ``cases`` (the CLI refused bad input before): one record
    per case, ``record(case, settings, log_dir)``, with its processes' logs kept under ``logs`` (default:
    a new temporary directory), the outputs, the tables; exit 1 when one failed."""
    log_dir = logs or tempfile.mkdtemp(prefix=f"graphfix-{name}-")
    os.makedirs(log_dir, exist_ok=True)
    records = [record(case, settings, log_dir) for case in cases]
    for rec in records:
        print(render(rec) + "\n")
    written = write_outputs(outputs, records, markdown, plot)
    print(f"{name} logs: {log_dir}")
    return ERR if not written or any(failed(rec) for rec in records) else OK


def write_outputs(outputs: Outputs, record: Any, markdown: Callable[[Any], str] | None = None,
                  plot: Callable[[Any, str], str] | None = None) -> bool:
    """``--json``, ``--markdown`` and ``--plot`` of a finished run, after its results were printed: a file
    that cannot be written after all is one line on stderr, and the others are still written."""
    ok = True
    jobs = [("--json", outputs.json, lambda path: write_json(path, record))]
    if markdown is not None:
        jobs.append(("--markdown", outputs.markdown, lambda path: write_text(path, markdown(record))))
    if plot is not None:
        jobs.append(("--plot", outputs.plot, lambda path: print(plot(record, path))))
    for option, path, job in jobs:
        if path:
            try:
                job(path)
            except OSError as exc:
                print(f"bench: {option} {path!r} could not be written: {exc.strerror or exc}", file=sys.stderr)
                ok = False
    return ok


def write_text(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
