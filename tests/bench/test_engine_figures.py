"""``bench engine``'s figures and verdicts on CPU, from engine results shaped as the engine child
(``engine/child/``) prints them: the upload paired inside one process's decode loop, host levels, the
A/A control, the rules that keep a verdict to what the run supports, ``bench report`` and ``--plot``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from freetoken_graphfix_bench import arms, cli, stats, verdicts
from freetoken_graphfix_bench.engine import figures, loop, sections
from tests.helpers.engine_child import copies as child
from tests.helpers.engine_child import seams
from tests.helpers.engine_records import NOOP, judged, looped, process, result


def rec(expects_wait=False, traced=None, **arms_):
    return judged(expects_wait, traced, "llama", **arms_)


def test_the_schedule_balances_each_kind_and_never_repeats_an_executable():
    """Every cycle launches each executable once, none twice in a row (a relaunch of the executable just
    launched may be quicker, which would favour that copy); with an even number of copies the uploaded
    copies, the never-uploaded ones and the own graph sit at the same mean position in the cycle, so a
    drift over it lands on all alike."""
    labels = child.copy_labels(4)
    assert labels == ["uploaded:0", "never:0", "never:1", "uploaded:1", "own", "uploaded:2", "never:2", "never:3",
                      "uploaded:3"]
    for copies in (1, 2, 3, 4, 6):
        labels = child.copy_labels(copies)
        width = len(labels)
        execs = [child.loop_schedule(labels, k) for k in range(4 * width)]
        cycles = [execs[i:i + width] for i in range(0, len(execs), width)]
        assert all(sorted(c) == sorted(labels) for c in cycles)
        assert all(a != b for a, b in zip(execs, execs[1:], strict=False)), copies
        if copies % 2 == 0:
            middle = (width - 1) / 2
            for kind in ("uploaded", "never", "own"):
                at = [p for p, label in enumerate(labels) if label.startswith(kind)]
                assert sum(at) / len(at) == middle, (copies, kind)


def test_the_positive_controls_open_and_close_the_cycle_at_the_mean_position():
    labels = child.copy_labels(4, control=True)
    assert labels[0] == "control:0" and labels[-1] == "control:1" and labels[1:-1] == child.copy_labels(4)
    middle = (len(labels) - 1) / 2
    for kind in ("uploaded", "never", "own", "control"):
        at = [p for p, label in enumerate(labels) if label.startswith(kind)]
        assert sum(at) / len(at) == middle, kind
    execs = [child.loop_schedule(labels, k) for k in range(3 * len(labels))]
    assert all(a != b for a, b in zip(execs, execs[1:], strict=False))
    assert child.copy_labels(0, control=True) == ["own"]


def test_the_positive_control_is_read_back_in_the_loop_and_gives_the_runs_sensitivity():
    """A spin of 2% of the step after two never-uploaded copies: read back at its size in every metric
    and bs, so the run could have seen #775's cost; the upload (+1% here) is judged."""
    record = rec(upstream=[looped(i, upload=1.01, spin_ms=0.0204, drift=1e-4) for i in range(3)])
    ctl = record.figures.control_in_loop
    for metric in ("step", "launch"):
        for bs in ("2", "1"):
            f = ctl[metric][bs]
            assert abs(f.ratio - 1 - f.added) <= f.half and 0.015 < f.added < 0.025, (metric, bs, f)
    text = (record).text()
    line = next(ln for ln in text.splitlines() if ln.startswith("  positive control"))
    assert ": recovered; this run names any cost above +0." in line and "bs 2 +2.0" in line
    step = next(ln for ln in text.splitlines() if ln.startswith("  GPU time per decode step: bs 2 +"))
    assert step.endswith(verdicts.COSTS), step


def test_a_positive_control_not_read_back_leaves_the_upload_unjudged():
    record = rec(upstream=[looped(i, upload=1.05, spin_ms=0.0204, spin_read=0.3) for i in range(3)])
    text = (record).text()
    assert "NOT recovered, so the upload is not judged" in text
    assert text.splitlines()[1].endswith(": not judged (the positive control was not read back)")  # the headline
    assert sections.NOT_JUDGED in text and verdicts.COSTS not in text.split("positive control")[0]


def test_a_record_without_the_control_is_judged_and_says_it_has_none():
    text = rec(upstream=[looped(i, upload=1.02) for i in range(3)]).text()
    assert "positive control: not measured (--copies 0, or a record from before the bench ran one)" in text
    assert verdicts.COSTS in text.split("positive control")[0]


def test_pairing_recovers_the_upload_through_drift_and_a_host_level_switch():
    """The context grows (+0.02% a step, 4% over the run) and the process's host level jumps by 20% half
    way: the upload's +1% comes out of the decode loop within its band, a band of a few tenths."""
    runs = [looped(s, upload=1.01, own=1.01, drift=2e-4, switch=100) for s in range(3)]
    up = loop.in_loop([process(**r) for r in runs], "upload")
    for metric in ("step", "launch"):
        for bs in ("2", "1"):
            f = up[metric][bs]
            assert abs(f.ratio - 1.01) < f.half < 0.003, (metric, bs, f)
            assert f.processes == 3 and f.processes == 3 and f.copies == 4
            assert f.cycles == 3 * (199 // 9)
    own = loop.in_loop([process(**r) for r in runs], "own")["step"]["2"]
    assert abs(own.ratio - 1.01) < own.half < 0.003  # upstream's own graph, uploaded at capture


def test_the_band_counts_how_far_copies_of_one_graph_run_apart():
    """Executables of one graph sit apart by their placement (here 0.5%): the band must carry that, not
    only the steps' noise, or two copies a hair apart would read as a cost."""
    tight = loop.in_loop([process(**looped(1))], "upload")["step"]["2"]
    placed = loop.in_loop([process(**looped(1, placement=0.005))], "upload")["step"]["2"]
    assert tight.half < 0.002
    assert placed.half > 0.004 and abs(placed.ratio - 1) < placed.half


def test_each_launch_is_taken_against_the_launches_around_it_and_a_record_without_copies_is_left_out():
    times = [1.0, 2.0, 4.0, 1.0, 2.0, 4.0, 1.0]  # three executables; the ends have no whole window
    means, cycles = loop.executable_means(times, ["a", "b", "c"] * 2 + ["a"])
    third = math.log(8) / 3
    assert cycles == 2 and set(means) == {"a", "b", "c"}
    assert means == pytest.approx({"a": -third, "b": math.log(2) - third, "c": math.log(4) - third})
    assert loop.process_effect(process(), "step_gpu_ms", "2") is None  # an earlier release's record
    assert sections.in_loop_lines(rec(upstream=result(), **{"no-upload": result()}).figures)[0].endswith(
        "not measured (--copies 0, or a record from before the decode loop launched copies)")


def host_level_run():
    """The run of the new user's probe: every never-uploaded (no-upload) process at the slow host level,
    every auto process fast, upstream one of each; the same never-uploaded graphs in no-upload and auto."""
    slow, fast = dict(step=1.22, host=0.40), dict(step=1.02, host=0.22)
    return rec(upstream=[looped(1, **fast, idle=0.93), looped(2, **slow, idle=0.93)],
               **{"no-upload": [looped(3, **slow), looped(4, **slow)]},
               auto=[looped(5, **fast, shim=NOOP), looped(6, **fast, shim=NOOP)])


def test_processes_are_grouped_by_their_host_level_per_phase():
    record = host_level_run()
    s = record.figures
    assert len(s.host_levels["2"]) == 2  # two levels at bs 2
    levels = {arm: [row.level["2"] for row in a.processes] for arm, a in s.arms.items()}
    assert levels == {"upstream": [0, 1], "no-upload": [1, 1], "auto": [0, 0]}
    assert s.aa_pair == ("no-upload", "auto")
    assert math.isnan(s.aa["step"]["2"].ratio)  # the A/A pair shares no level: no figure
    up = s.arms["upstream"].cross["step"]["2"]  # upstream vs no-upload at the slow level only
    assert up.ratio == pytest.approx(1.0, abs=0.01) and up.dof == 1
    text = (record).text()
    assert "host levels (median host ms per decode step of each process and phase" in text and "several" in text
    assert re.search(r"upstream round 1: bs 2 host 0\.(39|40)\d / GPU 1\.22\d ms B", text), text


def test_the_new_users_ab_run_yields_no_verdict_its_own_aa_pair_contradicts():
    """Where no-upload and auto, the same never-uploaded graphs, came out 16% apart across processes,
    the report prints no FASTER and no COSTS for any cross-process figure; the headline is the upload in
    the decode loop, inside each process."""
    text = (host_level_run()).text()
    assert "FASTER" not in text and "COSTS" not in text, text
    assert "not judged: no A/A control in this run (no-upload and auto share no host level here" in text
    head = text.index("the upload in the decode loop, same graph, same process")
    assert head < text.index("kernel timeline") < text.index("A/A control") < text.index("diagnostics")
    assert "GPU time per decode step: bs 2 " in text[head:] and NO_COST_LINE in text[head:]


NO_COST_LINE = "no cost beyond ±0.5% (95% interval within it)"


def test_a_cross_process_figure_is_never_judged_finer_than_the_aa_control():
    """All processes at one host level; separate processes land up to ±2% apart (the A/A pair 2% apart):
    upstream 1.5% off is within that noise, 8% off is a finding."""
    def arms_with(upstream_factor):
        return rec(upstream=[looped(i, step=1.0 * upstream_factor * f) for i, f in enumerate((1.0, 1.004, 0.998))],
                   **{"no-upload": [looped(i, step=f) for i, f in enumerate((1.0, 1.004, 0.998))]},
                   auto=[looped(i, step=1.02 * f, shim=NOOP) for i, f in enumerate((1.0, 1.004, 0.998))])

    near = (arms_with(1.015)).text()
    assert ("upstream vs never uploaded (no-upload), across processes within host levels, GPU time per decode step"
            in near)
    assert "within the A/A control's noise (±" in near and "COSTS" not in near
    far = (arms_with(1.08)).text()
    assert "GPU time per decode step: bs 2 +8.00%" in far and "COSTS this GPU" in far


def test_an_idle_replay_figure_never_claims_what_the_decode_loop_does_not_show():
    """Upstream's graph replayed from idle is 7.5% faster (its whole process is), while in the decode
    loop it is not: the diagnostic says so instead of FASTER."""
    record = rec(upstream=[looped(i, idle=0.925) for i in range(3)], **{"no-upload": [looped(i) for i in range(3)]},
                 auto=[looped(i, step=1.0002, shim=NOOP) for i in range(3)])
    text = (record).text()
    line = next(ln for ln in text.splitlines() if "the graph replayed back to back, across processes" in ln)
    assert "-7.50%" in line and "from idle only; in the decode loop: " in line and "FASTER" not in line.split(
        "in the decode loop: ")[0]
    assert "FASTER" not in text.split("diagnostics")[0]


def test_the_copies_tokens_are_checked_against_the_traced_run():
    ids = [[5, 6, 7, 8], [9, 9, 9, 9], [1, 2, 3, 4]]
    traced = {arm: [{"note": "x", "by_bs": {"2": TIMELINE}, "token_ids": [t[:2] for t in ids]}]
              for arm in ("upstream", "auto")}
    ok = rec(traced=traced, upstream=looped(1, tokens=ids), auto=looped(2, tokens=ids, shim=NOOP))
    assert ok.figures.arms["auto"].copies_tokens == "same" and ok.failures() == []
    bad = rec(traced=traced, upstream=looped(1, tokens=ids), auto=looped(2, tokens=[[5, 7], *ids[1:]], shim=NOOP))
    assert "auto: the decode loop with copies gave other tokens than its traced run (own graphs only)" in \
        bad.failures()
    assert rec(upstream=looped(1, tokens=ids)).figures.arms["upstream"].copies_tokens is None


TIMELINE = {"launches": 40, "graph_kernels": 196, "step_kernels": 207, "busy_us": 1030.0, "streams": 1,
            "gap_us": {"s1": 0.448}, "gap_quantiles": {"s1": [0.1 * i for i in range(101)]}}


def test_the_kernel_timeline_comes_from_every_traced_process_with_its_spread():
    from freetoken_graphfix_bench.records import TracedBs, TracedRun

    other = dict(TIMELINE, busy_us=1050.0, gap_us={"s1": 0.452})
    t = figures.timeline([TracedRun(by_bs={"2": TracedBs(**TIMELINE)}), TracedRun(by_bs={"2": TracedBs(**other)}),
                          TracedRun("traced run failed: x")])
    assert t.processes == 2 and t.note == "traced run failed: x"
    assert t.by_bs["2"].busy_us == (1040.0, 1030.0, 1050.0)
    assert t.by_bs["2"].gap_us["s1"] == pytest.approx((0.45, 0.448, 0.452))
    record = rec(traced={"upstream": [{"by_bs": {"2": TIMELINE}}, {"by_bs": {"2": other}}]}, upstream=looped(1))
    assert "upstream       bs 2: 2 process(es), kernels 207 (196), busy 1040.0 [1030.0-1050.0] µs" in \
        (record).text()


def current_release_record() -> list[dict]:
    """A record as an earlier release's ``--json`` wrote it (the first schema: a list of cases, no copies in
    the decode loop, one traced timeline per arm in its old shape, its own summary), with the figures of
    the new user's probe: no-upload's two processes at the slow host level, the others fast; its report
    called auto 16.6% FASTER."""
    def old(step, host, idle=1.0, **over):
        r = looped(7, step=step, host=host, idle=idle, **over)
        for key in ("step_exec", "launch_gpu_ms", "token_ids"):
            r.pop(key, None)
        return r

    runs = {"upstream": [old(1.02, 0.22, 0.93), old(1.02, 0.24, 0.93)], "no-upload": [old(1.22, 0.40), old(1.22, 0.41)],
            "auto": [old(1.02, 0.23, shim=NOOP), old(1.02, 0.22, shim=NOOP)]}
    timeline = {"note": "n", "2": {**{k: v for k, v in TIMELINE.items() if k != "gap_quantiles"},
                                   "gap_us": {"s1": {"median": 0.448, "n": 7800}}}}
    return [{"model": "m (llama)", "label": "llama", "layers": None, "ft_args": ["--dummy-weight"], "context": 2048,
             "decode_steps": 128, "rounds": 2, "env": {"gpu": "NVIDIA H200", "driver": "580", "torch": "2.11",
                                                       "date": "2026-12-01", "cuda": "13.0", "python": "3.12"},
             "expects_wait": False, "runs": runs, "traced": {arm: timeline for arm in runs},
             "command": "python -m freetoken_graphfix bench --engine ...", "wait_case": False,
             "summary": {"auto": {"step_vs_never_uploaded": {"2": [0.8342, 0.0005]}}}, "upload_copies": {}}]


def test_bench_report_judges_a_saved_record_again_by_the_current_rules(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(current_release_record()))
    md, again = tmp_path / "r.md", tmp_path / "again.json"
    assert cli.main(["report", str(path), "--markdown", str(md), "--json", str(again)]) == 0
    out = capsys.readouterr().out
    assert "FASTER" not in out and "COSTS" not in out, out
    assert "the upload in the decode loop, same graph, same process: not measured" in out
    assert re.search(r"no-upload round 0: bs 2 host 0\.(39|40)\d / GPU 1\.2", out)  # host levels, from raw steps
    assert "### freetoken-graphfix bench engine: llama" in md.read_text() and "FASTER" not in md.read_text()
    saved = json.loads(again.read_text())  # the current schema, strict JSON: a figure not computed is null
    assert (saved["kind"], saved["schema"]) == ("engine", 3) and "summary" not in saved["cases"][0]
    assert saved["cases"][0]["runs"]["no-upload"][0]["max_launch_ms"] is None
    assert cli.main(["report", str(again)]) == 0 and capsys.readouterr().out == out  # read back: the same report
    assert "no-upload round 0" not in md.read_text()  # the detail: --verbose
    assert cli.main(["report", str(path), "--markdown", str(md), "--verbose"]) == 0
    assert "- no-upload round 0: bs 2 host 0." in md.read_text()


def test_verbose_is_refused_first_for_a_record_with_no_detail(tmp_path, capsys):
    rig = Path(__file__).resolve().parents[1] / "records" / "rig-bench.json"
    assert cli.main(["report", str(rig), "--markdown", str(tmp_path / "r.md"), "--verbose"]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # refused before anything is printed
    assert err.count("\n") == 1 and "--verbose: a rig record has no detail beyond its report" in err
    assert not (tmp_path / "r.md").exists()


@pytest.mark.parametrize("text, why", [
    ("{", "cannot be read as JSON"),
    ('{"a": 1}', "not a bench record (its shape matches no kind)"),
    ('{"arms": {}, "config": {}}', "rig: missing 'env'"),  # a rig record missing its parts
    ('{"kind": "engine", "schema": 2, "cases": [{"model": "m"}]}', "engine.cases[0]: missing 'label'"),
    ('{"kind": "x", "schema": 2}', "a record of kind 'x'"),
    ('{"kind": "rig", "schema": 9}', "schema 9, written by a newer freetoken-graphfix"),
])
def test_bench_report_refuses_what_is_no_record_in_one_line(tmp_path, capsys, text, why):
    path = tmp_path / "x.json"
    path.write_text(text)
    assert cli.main(["report", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert why in err and "accepted values are a record a bench --json wrote" in err, err


def test_a_rig_record_without_its_environment_is_refused_naming_it(tmp_path, capsys):
    record = json.loads((Path(__file__).resolve().parents[1] / "records" / "rig-bench.json").read_text())
    del record["env"]
    path = tmp_path / "x.json"
    path.write_text(json.dumps(record))
    assert cli.main(["report", str(path)]) == 1
    assert "rig: missing 'env'" in capsys.readouterr().err


def test_bench_report_says_a_missing_record_does_not_exist(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "none.json")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_plot_draws_the_gap_distributions_and_the_steps(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the test extra installs matplotlib")
    record = rec(traced={"upstream": [{"by_bs": {"2": TIMELINE}}], "no-upload": [{"by_bs": {"2": TIMELINE}}]},
                 upstream=[looped(1), looped(2, step=1.22, host=0.4)], **{"no-upload": [looped(3), looped(4)]})
    from freetoken_graphfix_bench.engine.plot import plot

    png = tmp_path / "p.png"
    assert plot(record.case, record.figures, str(png)) == f"wrote {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = tmp_path / "old.json"  # an earlier record has no gap percentiles: drawn without them
    saved.write_text(json.dumps(current_release_record()))
    assert cli.main(["report", str(saved), "--plot", str(tmp_path / "old.png")]) == 0
    assert f"wrote {tmp_path / 'old.png'}" in capsys.readouterr().out


def test_default_arms_hold_an_aa_pair_in_either_case():
    assert arms.default_engine_arms(False) == ["upstream", "no-upload", "auto"]
    assert arms.default_engine_arms(True) == ["upstream", "no-upload", "auto", "deferred"]
    assert arms.aa_pair(arms.default_engine_arms(True), True) == ("auto", "deferred")
    assert arms.aa_pair(arms.default_engine_arms(False), False) == ("no-upload", "auto")
    assert arms.aa_pair(["upstream", "no-upload", "auto"], True) is None  # auto defers, no-upload exposes


def test_an_in_process_interval_covers_every_processs_own_figure():
    """Two processes whose own figures disagree (-0.8% and +0.05%, each tight inside): the pooled band
    alone would call the upload faster; the interval must reach both processes, and it cannot."""
    runs = [looped(1, upload=0.992, noise=0.0005), looped(2, upload=1.0005, noise=0.0005)]
    f = loop.in_loop([process(**r) for r in runs], "upload")["launch"]["2"]
    assert f.half >= max(abs(math.log(p / f.ratio)) for p in f.per_process) - 1e-12
    assert verdicts.judged(f.ratio, f.half) == verdicts.CANNOT


def test_arms_are_compared_across_processes_by_their_own_graphs_steps():
    """The copies' steps are the same in every arm; only the steps that launched the arm's own graph
    say how its graph decodes against the never-uploaded arm's."""
    record = rec(upstream=[looped(i, own=1.03) for i in range(3)], **{"no-upload": [looped(i + 3) for i in range(3)]})
    assert record.figures.arms["upstream"].cross["step"]["2"].ratio == pytest.approx(1.03, abs=0.003)


def test_the_aa_pair_is_the_floor_not_a_finding():
    runs = {"upstream": [looped(i) for i in range(2)], "no-upload": [looped(i) for i in range(2)],
            "auto": [looped(i + 2, shim=NOOP) for i in range(2)]}
    text = (rec(**runs)).text()
    assert "A/A control (auto over no-upload" in text and "auto vs never uploaded (no-upload)" not in text
    assert "upstream vs never uploaded (no-upload), across processes" in text


def test_a_verdict_is_judged_on_the_95_percent_interval_and_the_half_percent_band():
    judged = verdicts.judged
    assert judged(1.0003, 0.0002) == verdicts.NO_COST  # resolved, but no regression
    assert judged(1.003, 0.003) == verdicts.CANNOT  # reaches +0.6%: more than the band allows
    assert judged(1.006, 0.001) == verdicts.COSTS and judged(0.99, 0.002) == verdicts.FASTER
    assert judged(1.0, math.nan) == verdicts.CANNOT
    assert judged(1.015, 0.002, floor=0.03).startswith("within the A/A control's noise (±3.00%)")
    assert judged(1.08, 0.002, floor=0.03) == verdicts.COSTS
    assert stats.half_width(0.001, 2) == pytest.approx(0.004303)  # Student's t, 3 samples


def test_a_host_bound_decode_step_is_named():
    """A graph taking much less GPU time than the step around it waits for the host: the step's GPU time
    and tok/s are the host's, and the report says so; a graph that fills the step is not flagged."""
    def slow_graph(r):
        return dict(r, graph_gpu_ms={bs: [0.7 * t for t in v] for bs, v in r["step_gpu_ms"].items()})

    record = rec(upstream=[slow_graph(looped(1))], **{"no-upload": [looped(2)]})
    assert sections.host_bound(record.figures) == [
        f"upstream bs {bs}: the graph step takes 70% of the decode step's GPU time (host-bound: the step's GPU time "
        "and tok/s follow the host)" for bs in ("2", "1")]


class FakeDriver:
    """The CUDA driver calls make_copies makes, noted: each instantiate a new handle."""

    def __init__(self):
        self.uploaded, self.launched, self.destroyed, self.next = [], [], [], 100

    def instantiate(self, graph):
        self.next += 1
        return self.next

    def upload(self, handle, stream):
        self.uploaded.append(handle)

    def launch(self, handle, stream):
        self.launched.append(handle)

    def destroy(self, handle):
        self.destroyed.append(handle)


def test_the_copies_made_are_the_schedules_copies_and_the_engines_graph_is_not_one():
    """Every label the loop schedules but "own" gets a fresh executable, uploaded exactly where its
    label says so and launched once; "own" stays the engine's own graph (no copy stands for it)."""
    from types import SimpleNamespace

    stream = SimpleNamespace(cuda_stream=7, synchronize=lambda: None)
    graph = SimpleNamespace(raw_cuda_graph=lambda: 1)
    runner = SimpleNamespace(stream=stream, graph_map={2: graph, 1: graph}, resets=[])
    runner._reset_moe_offload_cache = lambda: runner.resets.append(1)
    driver = FakeDriver()
    made = child.make_copies(runner, 4, None, None, driver, control=True)
    want = [label for label in child.copy_labels(4, control=True) if label != "own"]
    assert {bs: sorted(labels) for bs, labels in made.items()} == {2: sorted(want), 1: sorted(want)}
    uploaded = {h for labels in made.values() for label, h in labels.items() if label.startswith("uploaded")}
    assert set(driver.uploaded) == uploaded and len(uploaded) == 8  # the controls are never uploaded
    assert sorted(driver.launched) == sorted(h for labels in made.values() for h in labels.values())
    assert runner.resets == [1]


def test_a_copy_whose_first_launch_leaves_the_flag_released_stops_the_copies():
    """Each copy's first launch gets one release of the PLE flag, which its WAIT consumes: a launch that
    leaves it at 1 would pre-release the engine's next WAIT (stale rows), so make_copies refuses."""
    from types import SimpleNamespace

    import torch

    flag = torch.zeros(1, dtype=torch.int64)
    stream = SimpleNamespace(cuda_stream=7, synchronize=lambda: None)
    runner = SimpleNamespace(stream=stream, graph_map={2: SimpleNamespace(raw_cuda_graph=lambda: 1)})

    def release(f):
        f[0] = 1

    consuming = FakeDriver()
    consuming.launch = lambda handle, s: flag.zero_()  # the WAIT consumes the release
    assert len(child.make_copies(runner, 2, flag, release, consuming)[2]) == 4
    leaving = FakeDriver()
    with pytest.raises(RuntimeError, match="the copy's first launch left the PLE flag at 1"):
        child.make_copies(runner, 2, flag, release, leaving)
    assert leaving.destroyed == [101]  # the executable it made is not left behind


def own_line(text: str, arm: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith(f"  {arm}'s own graph (") and "over its" in ln)


def test_the_engines_own_graph_is_judged_against_a_never_uploaded_arms_own_graph():
    """The engine's own executable goes through torch's replay, the copies through cuGraphLaunch: on a
    host-bound step the own graph came out 1.4% quicker in every arm on the H200, uploaded or not. A
    never-uploaded arm's own graph is then the control: it yields no verdict, and an uploaded arm's
    speed-up the control shows too is not the upload's. Without it in the control, the speed-up stands."""
    path = rec(upstream=[looped(i, own=0.985) for i in range(3)],
               **{"no-upload": [looped(i, own=0.986) for i in range(3)]})
    text = (path).text()
    assert "as no-upload's own graph, never uploaded" in own_line(text, "upstream")
    assert "not the upload" in own_line(text, "no-upload")
    assert "FASTER" not in text.split("kernel timeline")[0]
    real = rec(upstream=[looped(i, own=0.985) for i in range(3)], **{"no-upload": [looped(i) for i in range(3)]}).text()
    assert own_line(real, "upstream").endswith(verdicts.FASTER)
    assert own_line(real, "no-upload").endswith(verdicts.NO_COST)


def test_the_copies_release_the_ple_flag_only_where_the_graphs_wait_on_it(tmp_path):
    """0.1.3's gate mode keeps a flag its graphs never WAIT on: a release there leaves it at 1 (the
    copies' check then refused the gate arm's copies on the H200). Wait-sync mode: the table's own flag."""
    from tests.helpers import harness

    table = harness.make_table(harness.write_rows(tmp_path))
    assert seams.wait_flag(table) is table._flag
    table._wait_sync = False  # FREETOKEN_PLE_SYNC=gate
    assert seams.wait_flag(table) is None and seams.wait_flag(None) is None


def test_the_decode_loop_launches_every_copy_made_for_each_size():
    """The steps after a size's first launch run, in two cycles, the engine's own graph and each copy
    ``make_copies`` made for that size (the handle for the label, never the own graph instead), each
    twice; a size without copies runs its own graph only."""
    from types import SimpleNamespace

    stream = SimpleNamespace(cuda_stream=7, synchronize=lambda: None)
    graph = SimpleNamespace(raw_cuda_graph=lambda: 1)
    made = child.make_copies(SimpleNamespace(stream=stream, graph_map={2: graph, 1: graph}), 2, None, None,
                             FakeDriver())
    schedule = child.LoopSchedule(made)
    for bs in (2, 1):
        steps = [schedule.next(bs) for _ in range(2 * 5)]  # 2 copies of each kind and the own graph
        assert sorted(label for label, _ in steps) == sorted(2 * ["own", "uploaded:0", "uploaded:1", "never:0",
                                                                  "never:1"]), bs
        assert all(handle == (None if label == "own" else made[bs][label]) for label, handle in steps), steps
    assert child.LoopSchedule({}).next(4) == ("own", None)
    controlled = child.LoopSchedule(child.make_copies(SimpleNamespace(stream=stream, graph_map={2: graph}), 2, None,
                                                      None, FakeDriver(), control=True))
    assert [controlled.next(2)[0] for _ in range(7)] == child.copy_labels(2, control=True)


def test_the_markdown_opens_with_775s_table_per_build():
    """#775's figures, ready to paste: GPU ms a decode step and the median gap per stream, per build and
    bs, right under the headline and the environment, above every detail."""
    record = rec(upstream=[looped(i) for i in range(2)], **{"no-upload": [looped(i + 2) for i in range(2)]})
    gaps = {f"s{i}": (0.51, 0.5, 0.52) for i in range(1, 7)}
    one = (1.0, 1.0, 1.0)
    record.figures.arms["upstream"].timeline = figures.Timeline(
        1, "", {"2": figures.TimelineFigure(one, one, one, one, one, gaps, {})})
    text = record.markdown()
    table = "| build | bs | GPU ms per decode step | median gap between kernels per stream, µs (traced) |"
    assert text.index("- the upload in the decode loop: ") < text.index(table) < text.index(
        "**the upload in the decode loop, same graph")
    step = record.figures.arms["upstream"].step_gpu_ms["2"].median
    assert f"| upstream | 2 | {step:.3f} | s1 0.51, s2 0.51, s3 0.51, s4 0.51 (+2 more) |" in text
    assert "| no-upload | 1 |" in text and text.count("not traced |") == 3
    assert text.rstrip().endswith('docs/measuring.md, "Checking #775 where it was reported"._')


def test_a_timed_launch_releases_the_wait_just_before_and_times_between_its_events():
    """The one launch both the idle diagnostic and the control's calibration time: the flag at 1 (one
    release) when the executable is launched, the events around the launch alone."""
    import torch

    calls = []

    class Event:
        def __init__(self, name):
            self.name = name

        def record(self, stream):
            calls.append(("record", self.name))

        def synchronize(self):
            calls.append(("sync", self.name))

        def elapsed_time(self, other):
            return 2.5

    flag = torch.full((1,), 7)

    class Driver(FakeDriver):
        def launch(self, handle, stream):
            calls.append(("launch", handle, int(flag[0])))

    ms = child.timed_launch(Driver(), 101, type("S", (), {"cuda_stream": 9})(), flag, lambda f: f.add_(1),
                            (Event("start"), Event("end")))
    assert ms == 2.5
    assert calls == [("record", "start"), ("launch", 101, 1), ("record", "end"), ("sync", "end")]


def test_the_readmes_example_report_is_what_the_code_prints_for_its_record():
    """docs/measuring.md shows the answer and the markdown's head for the llama on #775's workload: they are
    rendered here again, by the current code, from the record that run kept."""
    from freetoken_graphfix_bench import registry
    from freetoken_graphfix_bench.registry import report_of
    from tests.helpers.gpu_records import RECORDS

    readme = (Path(__file__).resolve().parents[2] / "docs" / "measuring.md").read_text()
    report = report_of(registry.read(str(RECORDS / "engine-llama.json")))
    text = re.search(r"and a test renders this block from it\):\n\n```text\n(.*?)\n```", readme, re.S).group(1)
    md = re.search(r"first lines of its `--markdown` \((\d+) in all\):\n\n```markdown\n(.*?)\n```", readme, re.S)
    assert text.splitlines() == report.text.splitlines()[:4]
    markdown = report.markdown(False).splitlines()
    assert md.group(2).splitlines() == markdown[:len(md.group(2).splitlines())]
    assert int(md.group(1)) == len(markdown) <= 60
    assert markdown[2].startswith("- **safety: ") and markdown[3].startswith("- the upload in the decode loop: ")
