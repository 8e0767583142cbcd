"""Options of another benchmark are refused in one line before anything runs (or CUDA is looked for),
never dropped: the probe's own command lines, each with the line it must print."""

from __future__ import annotations

import pytest

from freetoken_graphfix.bench import cli, modes


@pytest.mark.parametrize("argv, line", [
    (["--serve", "--arms", "upstream", "auto"], "--arms is read by --engine, not by --serve"),
    (["--engine", "--serve"], "--engine and --serve select different benchmarks: give one"),
    (["--startup", "--engine"], "--startup and --engine select different benchmarks: give one"),
    (["--deadlock", "--engine"], "--engine and --deadlock select different benchmarks: give one"),
    (["--write-model", "D", "--engine"], "--write-model and --engine select different benchmarks: give one"),
    (["--from-json", "F", "--serve"], "--from-json and --serve select different benchmarks: give one"),
    (["--engine", "--no-wait"], "--no-wait is read by the rig, not by --engine"),
    (["--engine", "--strategies", "skip"], "--strategies is read by the rig, --deadlock, not by --engine"),
    (["--startup", "--kernels", "5"], "--kernels is read by the rig, --deadlock, not by --startup"),
    (["--serve-arms", "auto"], "--serve-arms is read by --serve, not by the rig"),
    (["--startup-runs", "10"], "--startup-runs is read by --startup, not by the rig"),
    (["--engine", "--no-warmup", "--serve"], "--engine and --serve select different benchmarks: give one"),
    (["--serve", "--no-warmup"], "--no-warmup is read by --engine, not by --serve"),
    (["--verbose"], "--verbose is read by --engine, --from-json, not by the rig"),
    (["--write-model", "D", "--rounds", "2"], "--rounds is read by --engine, not by --write-model"),
])
def test_an_option_the_chosen_benchmark_would_ignore_is_refused(argv, line, capsys, monkeypatch):
    def nothing_may_run(*args, **kwargs):
        raise AssertionError("ran before refusing")

    monkeypatch.setattr(cli, "run", nothing_may_run)
    monkeypatch.setattr(cli, "cuda_missing", nothing_may_run)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.splitlines()[-1].endswith(f"error: {line}"), err


def test_an_option_at_its_default_value_is_no_choice(capsys):
    """The defaults are every benchmark's; only what the user set is checked."""
    ap = cli.parser()
    opts = ap.parse_args(["--engine", "--kernels", "1090", "--rounds", "2"])
    assert modes.misplaced(opts, ap) is None


def test_every_option_is_owned_by_some_benchmark():
    """A new option must say which benchmarks read it, or it would never be checked."""
    ap = cli.parser()
    internal = {"help", "probe", "gaps_child", "strategy"}
    selectors = set(modes.SELECTORS)
    dests = {a.dest for a in ap._actions if a.option_strings} - internal - selectors
    assert dests == set(modes.READ_BY), (sorted(dests - set(modes.READ_BY)), sorted(set(modes.READ_BY) - dests))


def test_plot_without_matplotlib_is_refused_before_anything_runs(monkeypatch, capsys, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    monkeypatch.setattr(cli, "run", lambda *a, **k: pytest.fail("ran before refusing"))
    for argv in (["--plot", str(tmp_path / "g.png")], ["--engine", "--plot", str(tmp_path / "g.png")]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(
            "error: --plot needs matplotlib, which is not installed here (pip install 'freetoken-graphfix[plot]')")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, line", [
    (["--engine", "--logs", ""], "--logs '': an empty path; accepted values are a directory (made if missing)"),
    (["--engine", "--logs", "{file}"], "is not a directory; accepted values are a directory (made if missing)"),
    (["--engine", "--logs", "/proc/x/y"], "cannot be made here; accepted values are a directory (made if missing)"),
    (["--write-model", "{dir}", "--layers", "2", "3"],
     "--layers 2 3: --write-model writes one model; accepted values are one size"),
])
def test_bad_paths_and_sizes_are_one_line_before_anything_runs(argv, line, tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(cli, "cuda_missing", lambda: pytest.fail("got as far as the GPU"))
    argv = [a.format(file=tmp_path / "file", dir=tmp_path / "model") for a in argv]
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    last = capsys.readouterr().err.splitlines()[-1]
    assert exc.value.code == 2 and "bench: error: " in last and last.endswith(line), last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written


def test_an_empty_prompt_file_is_refused_not_the_default_text():
    from freetoken_graphfix.bench import workload

    with pytest.raises(ValueError, match="--prompt-file '': an empty path"):
        workload.read_text("")
    assert workload.read_text(None) == workload.COPY_TEXT.read_text(encoding="utf-8")


def test_a_startup_record_is_read_back_and_a_rig_record_without_its_command_renders(tmp_path, capsys):
    import json

    from freetoken_graphfix.bench import rejudge, report

    from .known_answers import rig_record

    record = {"runs": 200, "ms": {"bare": {"n": 200, "median": 11.2}}, "delta_ms": {"armed": 1.3},
              "delta_band_ms": {"armed": [0.2, 6.1]}, "target_ms": 5.0, "python": "3.12"}
    (tmp_path / "s.json").write_text(json.dumps(record))
    saved = rejudge.load(str(tmp_path / "s.json"))
    assert saved.kind == "startup" and saved.render().endswith("target within +5 ms: cannot tell (an interval "
                                                               "straddles it: run with more --startup-runs)")
    rig = rig_record(0.0, 0.002, seed=1)
    del rig["command"]
    assert "| command | `not recorded` |" in report.markdown(rig)


def test_the_rigs_refusal_has_the_same_prefix_as_every_other(capsys, monkeypatch):
    monkeypatch.setattr(cli, "cuda_missing", lambda: "no CUDA device; nothing to measure")
    assert cli.main([]) == 1
    assert capsys.readouterr().err == "python -m freetoken_graphfix bench: error: no CUDA device; nothing to measure\n"


def test_each_mode_reads_typed_settings_built_from_the_parsers_own_options():
    """Every field of every mode's settings is an option of the parser (so the CLI boundary builds each
    from the parsed options, with the parser's defaults), and no module below the CLI imports argparse:
    the option types (common) and the CLI's own checks (cli, modes) alone."""
    import ast
    import dataclasses
    from pathlib import Path

    from freetoken_graphfix.bench import settings

    opts = cli.parser().parse_args([])
    opts.command = "bench"
    for cls in (settings.Outputs, settings.RigSettings, settings.DeadlockSettings, settings.ProbeSettings,
                settings.EngineSettings, settings.ServeSettings):
        built = settings.from_options(cls, opts, **({"arms": ("upstream",)} if "arms" in
                                                    {f.name for f in dataclasses.fields(cls)} else {}))
        assert all(not isinstance(getattr(built, f.name), list) for f in dataclasses.fields(cls)), built
    assert settings.from_options(settings.RigSettings, opts).batch_sizes == (1, 2)
    bench = Path(cli.__file__).parent
    importers = set()
    for path in bench.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
                importers.add(path.name)
    assert importers == {"cli.py", "modes.py", "common.py", "settings.py"}
