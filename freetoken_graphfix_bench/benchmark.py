"""What a benchmark is to ``bench``: a :class:`Benchmark` entry (its subcommand's parser, its run, and
where it saves one, its record and that record's report), and what every run shares: the refusal,
the finish (report printed, files written, exit code) and the check for a CUDA device.

Each benchmark's module or folder holds its entry; ``registry`` lists them.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from freetoken_graphfix.errors import GraphfixError
from freetoken_graphfix.tools.exits import ERROR, OK

if TYPE_CHECKING:
    from .cases import Case
    from .records import Record
    from .reports import Report

Subparsers = argparse._SubParsersAction
Run = Callable[[argparse.Namespace, list[str], str], int]  # (options, FreeToken's options after --, "bench NAME")


@dataclass(frozen=True)
class Benchmark:
    """One ``bench`` subcommand."""

    name: str
    add_parser: Callable[[Subparsers, str], argparse.ArgumentParser]  # (subparsers, prog): its parser, added
    run: Run
    record: type | None = None  # the record its --json saves (its ``kind`` is this name)
    report: Callable[[Any], Report] | None = None  # that record's report, for its run and for ``bench report``
    ft_args: bool = False  # FreeToken's own ``ft serve`` options go after ``--``
    hidden: bool = False  # a child process's entry, not listed


def own(prog: str, name: str, ft_args: bool = False) -> dict[str, Any]:
    """A benchmark's parser's name and its short usage (argparse's own lists every option, twenty lines
    above a one-line error)."""
    tail = " [-- FreeToken's ft serve options]" if ft_args else ""
    return {"prog": f"{prog} {name}", "usage": f"%(prog)s [options]{tail} (-h: all)", "command": f"bench {name}"}


def refused(say: str, why: str) -> GraphfixError:
    """The one shape every refusal of a benchmark takes: ``bench SUBCOMMAND: why``, exit 1."""
    return GraphfixError(f"{say}: {why}")


def cuda_missing() -> str | None:
    """Why nothing can be measured here, or ``None``: checked before FreeToken is imported."""
    import torch

    return None if torch.cuda.is_available() else ("no CUDA device; nothing to measure (bench startup, report, nsys "
                                                      "and write-model need none)")


def needs_cuda(say: str) -> None:
    """Refuse a benchmark that measures a GPU where there is none."""
    why = cuda_missing()
    if why:
        raise refused(say, why)


def model_cases(opts: argparse.Namespace, ft_args: list[str], say: str,
                also: Callable[[], str | None] = lambda: None) -> tuple[list[Case], str]:
    """``bench engine``'s or ``bench serve``'s cases from their model options, after every check (``also``: the
    benchmark's own), refused in one line; and the private folder their logs go to."""
    from . import cases

    asked = cases.Models(opts.model, tuple(opts.layers) if opts.layers else None, opts.experts, opts.context,
                         opts.decode_steps, opts.prompt_file)
    why = cases.early_checks(asked, ft_args) or cuda_missing()
    found: list[Case] = []
    if not why:
        found, why = cases.prepare(asked, ft_args)
    why = why or also()
    if why:
        raise refused(say, why)
    log_dir = opts.logs or tempfile.mkdtemp(prefix=f"graphfix-{opts.bench}-")
    os.makedirs(log_dir, mode=0o700, exist_ok=True)  # --logs: checked private (or made so) before anything ran
    return found, log_dir


def finish(opts: argparse.Namespace, record: Record, report: Report) -> int:
    """A finished run's (or a read record's) report printed, its files written; exit 1 where it failed."""
    from .outputs import write_outputs
    from .settings import Outputs

    print(report.text or "\n".join(report.failures))
    outputs = Outputs(opts.json, getattr(opts, "markdown", None), getattr(opts, "plot", None),
                      getattr(opts, "verbose", False))
    written = write_outputs(outputs, record, report)
    return ERROR if not written or report.failed else OK
