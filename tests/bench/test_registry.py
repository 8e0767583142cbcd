"""``registry`` is the one table ``bench`` is read from: a benchmark added there, with its entry in a
module of its own, is a subcommand, a record kind ``bench report`` reads back and judges by its own
report, and a name in every refusal's accepted values. Nothing else is edited here."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import ClassVar

import pytest

from freetoken_graphfix_bench import cli, registry
from freetoken_graphfix_bench.benchmark import Benchmark, Subparsers, finish, own
from freetoken_graphfix_bench.options import outputs_options
from freetoken_graphfix_bench.reports import Report


@dataclass
class EchoRecord:
    kind: ClassVar[str] = "echo"
    said: str
    times: int


def add_echo(sub: Subparsers, prog: str) -> argparse.ArgumentParser:
    echo = sub.add_parser("echo", help="say it again", parents=[outputs_options(markdown=False, plot=False)],
                          **own(prog, "echo"))
    echo.add_argument("said")
    echo.add_argument("--times", type=int, default=2)
    return echo


def run_echo(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    record = EchoRecord(opts.said, opts.times)
    return finish(opts, record, echo_report(record))


def echo_report(record: EchoRecord) -> Report:
    return Report("echo", " ".join([record.said] * record.times), [] if record.times > 0 else ["said nothing"])


@pytest.fixture
def with_echo(monkeypatch):
    monkeypatch.setattr(registry, "BENCHMARKS", (*registry.BENCHMARKS,
                                                 Benchmark("echo", add_echo, run_echo, EchoRecord, echo_report)))


def test_a_benchmark_added_to_the_table_runs_saves_and_is_read_back(with_echo, tmp_path, capsys):
    saved = tmp_path / "echo.json"
    assert cli.main(["echo", "hi", "--times", "3", "--json", str(saved)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "hi hi hi"
    assert json.loads(saved.read_text()) == {"kind": "echo", "schema": 3, "said": "hi", "times": 3}
    assert cli.main(["report", str(saved)]) == 0 and capsys.readouterr().out.splitlines()[0] == "hi hi hi"
    saved.write_text(json.dumps({"kind": "echo", "schema": 3, "said": "hi", "times": 0}))
    assert cli.main(["report", str(saved)]) == 1  # judged by its own report
    assert "echo" in cli.parser().format_help()


def test_every_refusal_names_the_kinds_the_table_holds(with_echo, tmp_path, capsys):
    bogus = tmp_path / "b.json"
    bogus.write_text(json.dumps({"kind": "nope", "schema": 3}))
    assert cli.main(["report", str(bogus)]) == 1
    assert capsys.readouterr().err.rstrip().endswith("(rig, deadlock, engine, serve, startup, echo)")
    assert cli.main(["bogus"]) == 2 and capsys.readouterr().err.rstrip().endswith("write-model, echo")


def test_each_record_kind_is_its_benchmarks_name():
    assert {name: cls.kind for name, cls in registry.kinds().items()} == {name: name for name in registry.kinds()}
    assert list(registry.kinds()) == ["rig", "deadlock", "engine", "serve", "startup"]


def test_a_benchmark_left_out_of_the_table_is_no_subcommand(monkeypatch, capsys):
    monkeypatch.setattr(registry, "BENCHMARKS", tuple(b for b in registry.BENCHMARKS if b.name != "nsys"))
    assert cli.main(["nsys", "x.csv"]) == 2 and "'nsys' is not a benchmark" in capsys.readouterr().err
