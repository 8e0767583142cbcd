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
