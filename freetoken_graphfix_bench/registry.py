"""Every subcommand of ``bench``, in the order ``bench -h`` lists them: the one table the command line,
the record kinds and their reports are read from, and ``bench report``, which reads any of them.

A new benchmark is its own module or folder, holding its ``Benchmark`` entry (parser, run, record,
report), and one line in ``BENCHMARKS`` here. Only the command line imports this module: what it
needs of the table below (the kinds a record may be) is passed down.
"""

from __future__ import annotations

import argparse

from . import record_files
from .benchmark import Benchmark, Subparsers, finish, own, refused
from .engine import ENGINE
from .options import outputs_options
from .outputs import none_for
from .records import Record
from .reports import Report
from .rig import DEADLOCK, PROBE, RIG
from .serve import SERVE
from .startup import STARTUP
from .tools import LAUNCH, NSYS, WRITE_MODEL


def kinds() -> dict[str, type]:
    """Every record kind, by name: the benchmarks that save one."""
    return {b.name: b.record for b in BENCHMARKS if b.record is not None}


def named(name: str) -> Benchmark:
    """The entry of ``bench NAME``."""
    return next(b for b in BENCHMARKS if b.name == name)


def read(path: str) -> Record:
    """The record in ``path``, of any kind in the table and any schema (``record_files.read``)."""
    return record_files.read(path, kinds())


def report_of(record: Record) -> Report:
    """A record's report: its benchmark's."""
    return named(record.kind).report(record)  # type: ignore[misc]


def add_report(sub: Subparsers, prog: str) -> argparse.ArgumentParser:
    """``bench report``'s arguments: the record, and what to write from it."""
    report = sub.add_parser("report", help="judge a saved record again by this version's rules and show it",
                            parents=[outputs_options(verbose=True)], **own(prog, "report"),
                            description="Read a record a bench --json wrote (any kind, any schema), judge it by "
                                        "this version's rules and show it as its run would; --json writes it again "
                                        "in the current schema. Exits 1 when the record fails its checks.")
    report.add_argument("record", metavar="RECORD", help="the record (a --json file)")
    return report


def run_report(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """A saved record judged again: refused first where an option asks for what its kind lacks."""
    try:
        record = read(opts.record)
        report = report_of(record)
    except record_files.RecordError as exc:
        raise refused(say, str(exc)) from None
    except record_files.DAMAGED as exc:
        raise refused(say, record_files.damaged(opts.record, exc, kinds())) from None
    if opts.verbose and not report.has_detail:
        raise refused(say, f"--verbose: a {report.kind} record has no detail beyond its report; it is for engine "
                          "records")
    for option in ("markdown", "plot"):
        if getattr(opts, option) is not None and getattr(report, option) is None:
            raise refused(say, none_for(f"--{option}", report.kind))
    try:
        return finish(opts, record, report)
    except record_files.DAMAGED as exc:  # --markdown and --plot are drawn only now
        raise refused(say, record_files.damaged(opts.record, exc, kinds())) from None


REPORT = Benchmark("report", add_report, run_report)
BENCHMARKS: tuple[Benchmark, ...] = (RIG, DEADLOCK, ENGINE, SERVE, STARTUP, REPORT, NSYS, LAUNCH, WRITE_MODEL, PROBE)
