"""``bench`` as subcommands: each benchmark owns its options, so argparse refuses, in one line before
anything runs (or CUDA is looked for), an option the chosen benchmark would not read; bad paths and
sizes likewise; each benchmark's settings are built from its own parser."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from freetoken_graphfix_bench import benchmark, cli, registry

BENCHMARKS = ["rig", "deadlock", "engine", "serve", "startup", "report", "nsys", "launch", "write-model"]


def test_bench_help_lists_its_subcommands(capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's help: printed, then exit 0
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "{" + ",".join(BENCHMARKS) + "}" in out
    for name in BENCHMARKS:
        assert f"\n    {name} " in out, name
    assert "_probe" not in out  # the first-launch matrix's child is no benchmark of the user's


PRIVATE = "accepted values: a directory this user owns that no one else can write (made 0700 when missing)"
NEW_OR_REGULAR = "accepted values: a new path or a regular file, in an existing writable directory"


@pytest.mark.parametrize("argv, line", [
    (["serve", "--rounds", "2"], "unrecognized arguments: --rounds 2"),
    (["engine", "--no-wait"], "unrecognized arguments: --no-wait"),
    (["engine", "--modes", "skip"], "unrecognized arguments: --modes skip"),
    (["startup", "--kernels", "5"], "unrecognized arguments: --kernels 5"),
    (["rig", "--arms", "auto"], "unrecognized arguments: --arms auto"),
    (["rig", "--runs", "10"], "unrecognized arguments: --runs 10"),
    (["serve", "--no-warmup"], "unrecognized arguments: --no-warmup"),
    (["rig", "--verbose"], "unrecognized arguments: --verbose"),
    (["write-model", "D", "--rounds", "2"], "unrecognized arguments: --rounds 2"),
    (["serve", "--markdown", "r.md"], "unrecognized arguments: --markdown r.md"),
    (["deadlock", "--plot", "p.png"], "unrecognized arguments: --plot p.png"),
    (["startup", "--plot", "p.png"], "unrecognized arguments: --plot p.png"),
    (["startup", "--", "--anything"], "FreeToken options after -- are for engine and serve, not startup: --anything"),
    (["rig", "--", "--dummy-weight"], "FreeToken options after -- are for engine and serve, not rig: --dummy-weight"),
    (["startup", "--runs", "7"], "argument --runs: '7': accepted values are whole numbers of 8 or more"),
    (["engine", "--rounds", "0"], "argument --rounds: '0': accepted values are whole numbers of 1 or more"),
    (["bogus"], "'bogus' is not a benchmark; accepted values: rig, deadlock, engine, serve, startup, report, nsys, "
                "launch, write-model"),
    (["launch", "--json", "l.json"], "unrecognized arguments: --json l.json"),
    (["launch", "--kernels", "0"], "argument --kernels: '0': accepted values are whole numbers of 1 or more"),
])
def test_an_option_the_chosen_benchmark_would_not_read_is_refused(argv, line, capsys, monkeypatch):
    def nothing_may_run(*args, **kwargs):
        raise AssertionError("ran before refusing")

    monkeypatch.setattr(registry, "BENCHMARKS", tuple(replace(b, run=nothing_may_run) for b in registry.BENCHMARKS))
    monkeypatch.setattr(benchmark, "cuda_missing", nothing_may_run)
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and line in err.splitlines()[-1], err
    assert len(err.strip().splitlines()) == 1  # one line: the command's own -h says its usage


def test_a_bench_error_is_one_line_with_the_one_prefix(capsys):
    code = cli.main(["engine", "--context", "0"], prog="python -m freetoken_graphfix bench")
    assert code == 2 and capsys.readouterr().err.splitlines() == [
        "freetoken-graphfix: error: bench engine: argument --context: '0': accepted values are whole "
        "numbers of 1 or more"]


def test_plot_without_matplotlib_is_refused_before_anything_runs(monkeypatch, capsys, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    monkeypatch.setattr(registry, "BENCHMARKS", tuple(replace(b, run=lambda *a: pytest.fail("ran before refusing"))
                                                      for b in registry.BENCHMARKS))
    for argv in (["rig", "--plot", str(tmp_path / "g.png")], ["engine", "--plot", str(tmp_path / "g.png")]):
        code = cli.main(argv)
        assert code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(
            f"error: bench {argv[0]}: --plot needs matplotlib, which is not installed here "
            "(pip install 'freetoken-graphfix[plot]')")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, line", [
    (["engine", "--logs", ""], "--logs '': an empty path; " + PRIVATE),
    (["engine", "--logs", "{file}"], "not a directory; " + PRIVATE),
    (["engine", "--logs", "/proc/x/y"], "cannot be made (No such file or directory); " + PRIVATE),
    (["engine", "--logs", "{shared}"], "writable by others (mode 1777); " + PRIVATE),
    (["engine", "--logs", "{link}"], "a symbolic link; " + PRIVATE),
    (["rig", "--json", "{link}"], "a symbolic link; " + NEW_OR_REGULAR),
    (["rig", "--json", "{dangling}"], "a symbolic link; " + NEW_OR_REGULAR),
    (["rig", "--markdown", "{fifo}"], "not a regular file; " + NEW_OR_REGULAR),
    (["write-model", "{dir}", "--layers", "2", "3"], "unrecognized arguments: 3"),
    (["write-model", "", "--family", "llama"], "write-model '': accepted values are a new or empty directory"),
])
def test_bad_paths_and_sizes_are_one_line_before_anything_runs(argv, line, tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    (tmp_path / "shared").mkdir(mode=0o1777)
    os.chmod(tmp_path / "shared", 0o1777)  # /tmp's mode: anyone may plant a name there
    (tmp_path / "link").symlink_to(tmp_path / "file")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.setattr(benchmark, "cuda_missing", lambda: pytest.fail("got as far as the GPU"))
    monkeypatch.chdir(tmp_path)
    argv = [a.format(file=tmp_path / "file", dir=tmp_path / "model", shared=tmp_path / "shared",
                     link=tmp_path / "link", dangling=tmp_path / "dangling", fifo=tmp_path / "fifo") for a in argv]
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    last = capsys.readouterr().err.splitlines()[-1]
    assert code == 2 and "bench " in last and ": error: " in last and last.endswith(line), last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "fifo", "file", "link", "shared"]  # nothing new


def test_an_empty_prompt_file_is_refused_not_the_default_text():
    from freetoken_graphfix_bench import workload

    with pytest.raises(ValueError, match="--prompt-file '': an empty path"):
        workload.read_text("")
    assert workload.read_text(None) == workload.COPY_TEXT.read_text(encoding="utf-8")


def test_a_startup_record_is_read_back_and_a_rig_record_without_its_command_renders(tmp_path, capsys):
    import json

    from freetoken_graphfix_bench.rig import report
    from tests.helpers.known_answers import rig_record

    record = {"runs": 200, "ms": {"bare": {"n": 200, "median": 11.2, "p10": 10.0, "p90": 13.0}},
              "delta_ms": {"armed": 1.3}, "delta_band_ms": {"armed": [0.2, 6.1]}, "target_ms": 5.0, "python": "3.12"}
    (tmp_path / "s.json").write_text(json.dumps(record))  # a start-up record of the first schema
    assert cli.main(["report", str(tmp_path / "s.json")]) == 0
    assert capsys.readouterr().out.strip().endswith("target within +5 ms: cannot tell (an interval straddles it: run "
                                                    "with more --runs)")
    assert registry.read(str(tmp_path / "s.json")).ms["bare"].low == 10.0
    rig = rig_record(0.0, 0.002, seed=1)
    rig.command = ""
    assert "| command | `not recorded` |" in report.markdown(rig)


@pytest.mark.parametrize("name", ["rig", "launch"])
def test_a_gpu_benchmarks_refusal_has_the_same_prefix_as_every_other(capsys, monkeypatch, name):
    monkeypatch.setattr(benchmark, "cuda_missing", lambda: "no CUDA device; nothing to measure")
    assert cli.main([name]) == 1
    assert capsys.readouterr().err == (f"freetoken-graphfix: error: bench {name}: no CUDA device; nothing to "
                                       "measure\n")


def test_launch_renders_each_tracer_with_its_figure():
    from freetoken_graphfix_bench.launch import LaunchTimes, render
    from freetoken_graphfix_bench.stats import summary

    text = render(LaunchTimes(1700, summary([24.0, 25.0, 26.0]), summary([1100.0, 1200.0, 1300.0])))
    assert text.splitlines()[0] == "host time of one cuGraphLaunch, a 1700-kernel graph, 3 launches each:"
    assert "  this process untraced: 25.0 µs [p10 24.2, p90 25.8] (under nsys profile: Nsight Systems' tracing)" in text
    assert "  under CUPTI (torch.profiler, as bench engine's traced runs): 1200.0 µs" in text


def test_each_benchmark_reads_typed_settings_built_from_its_own_options():
    """Every field of every benchmark's settings is an option of its own subcommand (so the CLI boundary
    builds each from the parsed options, with the parser's defaults), and no module below the CLI
    imports argparse: the CLI, its option groups, the settings' builder, and each benchmark's entry
    (its parser and run, as ``registry`` lists them) alone."""
    import ast
    import dataclasses
    from pathlib import Path

    from freetoken_graphfix_bench import settings

    def parsed(*argv: str):
        opts = cli.parser().parse_args(list(argv))
        opts.command = "bench"
        return opts

    for cls, argv in ((settings.RigSettings, ["rig"]), (settings.DeadlockSettings, ["deadlock"]),
                      (settings.ProbeSettings, ["_probe", "--kernels", "8", "--streams", "1", "--mode", "auto"]),
                      (settings.EngineSettings, ["engine"]), (settings.ServeSettings, ["serve"])):
        given = {"arms": ("upstream",)} if "arms" in {f.name for f in dataclasses.fields(cls)} else {}
        built = settings.from_options(cls, parsed(*argv), **given)
        assert all(not isinstance(getattr(built, f.name), list) for f in dataclasses.fields(cls)), built
    assert settings.from_options(settings.RigSettings, parsed("rig")).batch_sizes == (1, 2)
    bench = Path(cli.__file__).parent
    importers = set()
    for path in bench.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
                importers.add(path.relative_to(bench).as_posix())
    entries = {Path(sys.modules[b.run.__module__].__file__).relative_to(bench).as_posix() for b in registry.BENCHMARKS}
    assert entries == {"rig/__init__.py", "engine/__init__.py", "serve/__init__.py", "startup.py", "tools.py",
                       "registry.py"}
    assert importers == {"cli.py", "options.py", "settings.py", "benchmark.py", *entries}


def test_logs_is_made_if_missing_before_the_benchmark_writes_into_it(tmp_path, monkeypatch):
    """``--logs DIR`` whose parent exists: the folder is made before the first process logs there."""
    from freetoken_graphfix_bench import cases, records
    from freetoken_graphfix_bench import engine as engine_bench
    from freetoken_graphfix_bench.engine import run as engine_run

    seen = []
    monkeypatch.setattr(benchmark, "cuda_missing", lambda: None)
    monkeypatch.setattr(cases, "early_checks", lambda asked, ft_args: None, raising=False)
    monkeypatch.setattr(cases, "prepare", lambda asked, ft_args: ([object()], None))
    monkeypatch.setattr(engine_run, "engine_case", lambda case, settings, log_dir: seen.append(os.path.isdir(log_dir))
                        or records.EngineCase.__new__(records.EngineCase))
    monkeypatch.setattr(engine_bench, "engine_report", lambda record: None)
    monkeypatch.setattr(engine_bench, "finish", lambda *args: 0)
    logs = tmp_path / "new"
    assert cli.main(["engine", "--arms", "upstream", "--logs", str(logs)]) == 0
    assert seen == [True]


RECORDS = Path(__file__).resolve().parents[1] / "records"


def test_plot_follows_one_rule_nothing_to_draw_is_refused_and_nothing_written(tmp_path, capsys):
    """A rig record without CUPTI gaps, a serve record: --plot is one line and exit 1, no file; a rig record with
    gaps draws. A rig run that would record no gaps (--profile-reps 0) is refused before it runs."""
    import json

    rig = json.loads((RECORDS / "rig-bench.json").read_text())  # the shipped GPU record ran without CUPTI gaps
    assert not any(arm["gaps_us"] for arm in rig["arms"].values())
    for i, arm in enumerate(rig["arms"].values()):
        arm["gaps_us"] = {"s1": [0.3 + 0.01 * i, 0.4, 0.5]}
    (tmp_path / "gaps.json").write_text(json.dumps(rig))
    for record in (RECORDS / "rig-bench.json", RECORDS / "serve.json"):
        assert cli.main(["report", str(record), "--plot", str(tmp_path / "p.png")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--plot: this " in err and "has nothing to draw it from" in err, err
        assert not (tmp_path / "p.png").exists()
    assert cli.main(["report", str(tmp_path / "gaps.json"), "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    code = cli.main(["rig", "--profile-reps", "0", "--plot", str(tmp_path / "q.png")])
    assert code == 2 and capsys.readouterr().err.strip().endswith(
        "--plot draws the CUPTI gaps, which --profile-reps 0 turns off")


def test_write_model_makes_its_parent_folders(tmp_path, capsys):
    """``bench write-model /tmp/models/q4`` on a fresh machine: the folders above it are made."""
    assert cli.main(["write-model", str(tmp_path / "models" / "llama"), "--family", "llama"]) == 0
    assert (tmp_path / "models" / "llama" / "config.json").is_file()


def test_markdown_for_a_record_without_one_says_which_records_have_it(tmp_path, capsys):
    """--markdown on a serve record: one line naming the records that have one, not the plot's reason."""
    assert cli.main(["report", str(RECORDS / "serve.json"), "--markdown", str(tmp_path / "r.md")]) == 1
    err = capsys.readouterr().err
    assert err.strip().endswith("--markdown: this serve record has no such report (rig and engine records do)"), err
    assert not (tmp_path / "r.md").exists()
