"""The benchmark's pure parts: kernel timelines and CUPTI gaps, statistics, the rig's figures and
report, the armed-hook cost probe, start-up's verdict."""

from __future__ import annotations

import json

import pytest

from freetoken_graphfix.tools.exits import UsageError
from freetoken_graphfix_bench import cli, cupti, record_files, records, registry, running, stats, timeline
from freetoken_graphfix_bench.rig import figures, measure, report


def trace(tmp_path, launches, kernels, others=()):
    """Kineto's chrome trace of ``launches`` graph launches 100 µs apart: each runs ``kernels``
    (stream, start offset µs, duration µs) under its own correlation id, as CUPTI reports a graph
    launch; ``others`` (offset, duration) are ordinary kernels after each launch, one id each."""
    events, corr = [{"cat": "cpu_op", "ts": 0.0}], 0
    for i, _ in enumerate(launches):
        corr += 1
        events += [{"cat": "kernel", "ts": 100.0 * i + off, "dur": dur, "args": {"stream": s, "correlation": corr}}
                   for s, off, dur in kernels]
        for off, dur in others:
            corr += 1
            events.append({"cat": "kernel", "ts": 100.0 * i + off, "dur": dur,
                           "args": {"stream": 3, "correlation": corr}})
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


# a graph of 4 kernels: stream 7 (ranked s1, most kernels) with gaps 0.5 and 0.75 µs, stream 9 one kernel
GRAPH = [(7, 0.0, 1.0), (7, 1.5, 1.0), (9, 0.2, 2.0), (7, 3.25, 0.5)]


def test_kernel_gaps_per_ranked_stream_dropping_each_arms_first_replay(tmp_path):
    launches = ["a", "b", "a", "b"]
    gaps, note = cupti.kernel_gaps(trace(tmp_path, launches, GRAPH, others=[(50.0, 1.0)]), launches, {"a", "b"})
    assert note == "20 kernel records, 4 graph launches for 4 replays"
    assert gaps == {"a": {"s1": [0.5, 0.75], "s2": []}, "b": {"s1": [0.5, 0.75], "s2": []}}


def test_kernel_gaps_refuses_a_trace_that_lost_launches(tmp_path):
    launches = ["a", "b", "a"]
    gaps, note = cupti.kernel_gaps(trace(tmp_path, launches, GRAPH), launches + ["b"], set())
    assert gaps == {} and note == "12 kernel records, 3 graph launches for 4 replays: gaps not reported"


def test_streams_are_ranked_alike_whatever_their_ids():
    """CUPTI gives a graph's branches new stream ids in every launch: rank 1 is the busiest stream."""
    one = [{"ts": t, "dur": 1.0, "args": {"stream": s}} for s, t in ((40, 0.0), (41, 0.5), (40, 2.0))]
    two = [{"ts": t, "dur": 1.0, "args": {"stream": s}} for s, t in ((7, 0.0), (3, 0.5), (7, 3.0))]
    assert timeline.stream_gaps(one) == [[1.0], []] and timeline.stream_gaps(two) == [[2.0], []]
    assert timeline.pooled_gaps([one, two]) == {"s1": [1.0, 2.0], "s2": []}


def test_busy_time_is_the_union_of_kernel_intervals():
    ks = [{"ts": 0.0, "dur": 2.0}, {"ts": 1.0, "dur": 2.0}, {"ts": 5.0, "dur": 1.0}, {"ts": 5.2, "dur": 0.3}]
    assert timeline.busy_us(ks) == pytest.approx(4.0)


def test_decode_timeline_per_bs(tmp_path):
    """Two bs-2 launches then three bs-1 launches; each bs's first is left out, a step runs to the next
    launch of its bs, and the last launch has none."""
    bs = [2, 2, 1, 1, 1]
    path = trace(tmp_path, bs, GRAPH, others=[(50.0, 1.0), (60.0, 1.0)])
    t = timeline.decode_timeline(path, bs)
    assert t.note == "30 kernel records, 5 graph launches"
    two = t.by_bs["2"]
    gaps = two.gap_quantiles
    assert (two.launches, two.graph_kernels, two.step_kernels, two.busy_us, two.streams, two.gap_us) == (
        1, 4, None, None, 2, {"s1": 0.625})
    assert len(gaps["s1"]) == 101 and (gaps["s1"][0], gaps["s1"][50], gaps["s1"][100]) == (0.5, 0.625, 0.75)
    one = t.by_bs["1"]
    assert one.launches == 2 and one.step_kernels == 6 and one.busy_us == pytest.approx(5.0)
    lost = timeline.decode_timeline(path, bs + [1])
    assert lost.by_bs == {} and "5 graph launches in the trace for the 6" in lost.note


def test_summary():
    s = stats.summary([float(v) for v in range(1, 12)])
    assert (s.n, s.median, s.low, s.high, s.percentiles) == (11, 6.0, 2.0, 10.0, (10, 90))
    assert stats.summary([]).n == 0


def test_armed_hook_cost_leaves_nothing_patched():
    cost = measure.armed_hook_cost(calls=2000)
    assert cost == pytest.approx(cost) and cost < 1000  # a number, in µs per call


def test_bench_without_cuda_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert cli.main(["rig"]) == 1
    assert "no CUDA device" in capsys.readouterr().err


def record(skip_instances, auto_instances, upload_instances=None):
    """A raw record as ``run_arms`` writes it: one bs, replays per graph instance."""
    def arm(per_instance, action, blocked):
        n = len(per_instance)
        return {"capture_s": [0.1] * n, "graphs": {"bs=1": {"action": [action] * n, "hook_ms": [0.1] * n}},
                "first_launch": {"1": {"launch_ms": [2.0] * n, "blocked": [blocked] * n}},
                "replay_us": {"1": per_instance}, "logits_equal_upload": True,
                "gaps_us": {"s1": [0.3, 0.4], "s2": [0.5], "s3": []}}

    return record_files.from_data({
        "kind": "rig", "schema": records.SCHEMA,
        "env": {"gpu": "GPU", "driver": "1", "torch": "2", "freetoken": "0.2.1", "date": "today"},
        "config": {"kernels": 10, "streams": 2, "no_wait": False, "h2d": False, "batch_sizes": [1],
                   "instances": len(skip_instances), "reps": 3, "profile_reps": 0, "watchdog": 4.0,
                   "modes": ["skip", "auto", "upload"]},
        "arms": {"skip": arm(skip_instances, "exposed", True), "auto": arm(auto_instances, "deferred", False),
                 **({"upload": arm(upload_instances, "upload", False)} if upload_instances else {})}},
        registry.kinds())


def test_rows_pool_instances_and_report_their_spread():
    rec = record([[100.0, 100.0, 100.0], [102.0, 102.0, 102.0]], [[101.0] * 3, [101.0] * 3])
    skip, auto = figures.rows(rec)
    assert (skip.median, skip.to_skip.ratio, skip.blocked, skip.instances) == (101.0, 1.0, 2, 2)
    assert skip.instance_spread == pytest.approx(2 / 101)
    assert (auto.to_skip.ratio, auto.instance_spread, auto.actions) == (1.0, 0.0, ["deferred"])
    text = report.render(rec)
    assert "2 graph instances per mode" in text and "BLOCKED 2/2" in text
    assert "1.98%" in text and "0.35/0.50 " in text

    assert auto.to_skip.se == pytest.approx(1 / 101)  # skip's instance medians 100 and 102: sd 1.41, se 1
    assert "verdict: needs the upload and skip modes" in text


def test_past_four_streams_only_their_count_is_shown():
    gaps = {f"s{i}": [0.1 * i] for i in range(1, 8)}
    assert report.stream_gaps(gaps) == "0.10/0.20/0.30/0.40 +3"
    assert report.stream_gaps({"s2": [0.5], "s1": [0.4]}) == "0.40/0.50"


def test_verdict_weighs_the_upload_against_the_spread_of_instances():
    skip = [[100.0], [100.4], [99.6], [100.0]]
    slower = figures.rows(record(skip, skip, [[102.0], [102.4], [101.6], [102.0]]))
    # 4 + 4 instances, df 6: t = 2.447 times the standard error 0.23%; the A/A floor (auto = skip) is as wide
    assert "+2.00% ± 0.57%" in report.verdict(slower) and "COSTS this GPU" in report.verdict(slower)
    within = figures.rows(record(skip, skip, [[100.2], [100.6], [99.8], [100.2]]))
    assert report.verdict(within).endswith(
        "no cost this run can resolve (its interval reaches beyond ±0.5%: run with more --instances)")
    single = figures.rows(record([[100.0]], [[100.0]], [[103.0]]))
    assert "cannot support the upload/skip ratio (needs --instances 2 or more" in report.verdict(single)
    tight = [[100.0], [100.1], [99.9], [100.0]]
    none = figures.rows(record(tight, tight, [[100.05], [100.15], [99.95], [100.05]]))
    assert report.verdict(none).endswith("no cost beyond ±0.5% on this GPU (95% interval within it)")
    faster = figures.rows(record(tight, tight, [[97.0], [97.1], [96.9], [97.0]]))
    assert "uploaded graphs replay FASTER on this GPU, by -3.00% (bs 1)" in report.verdict(faster)


def clustered(fast: float, slow: float, n_fast: int, n_slow: int, cost: float = 1.0) -> list[list[float]]:
    """Instances in two clusters about 6% apart, each instance keeping its cluster (and a little noise)."""
    return ([[fast * cost * (1 + 0.001 * i)] * 3 for i in range(n_fast)]
            + [[slow * cost * (1 + 0.001 * i)] * 3 for i in range(n_slow)])


def test_two_clusters_are_detected_and_compared_within():
    """The H200 run that split into ~550 and ~588 µs clusters: pooled, 2 SE was 3.5-4.4%; within
    the clusters, a 1% cost is resolved, and the report says the instances fell into two."""
    skip = clustered(550, 588, 2, 2)
    upload = clustered(550, 588, 3, 1, cost=1.01)
    auto = clustered(550, 588, 1, 3)
    table = figures.rows(record(skip, auto, upload))
    up = next(r for r in table if r.arm == "upload")
    assert up.clusters == 2 and up.cluster_counts == [3, 1]
    assert up.to_skip.ratio == pytest.approx(1.01, abs=0.001) and 2 * up.to_skip.se < 0.005
    assert "COSTS this GPU" in report.verdict(table)
    notes = report.cluster_notes(table)
    assert notes == ["bs 1: the instances fall into 2 clusters (fastest first; a property of each instance, not of "
                     "time): skip 2/2, auto 1/3, upload 3/1"]


def test_an_upload_alone_in_a_cluster_of_its_own_is_a_cost():
    """Every uploaded instance ~7% above every never-uploaded one: the clusters come from the
    never-uploaded modes (one cluster here), so that is a cost measured there, not "no shared cluster"."""
    skip, upload = clustered(550, 588, 4, 0), clustered(550, 588, 0, 4)
    table = figures.rows(record(skip, skip, upload))
    up = next(r for r in table if r.arm == "upload")
    assert up.supported and up.clusters == 1 and up.to_skip.ratio == pytest.approx(588 / 550, abs=0.002)
    assert "COSTS this GPU replay time, up to +6.9" in report.verdict(table)


def test_a_mode_in_a_cluster_skip_never_reached_gets_no_ratio_but_a_note():
    """auto's instances (never uploaded) all in the slow cluster, skip's all in the fast one: within a
    cluster nothing compares, and the note says the modes fall into the clusters unlike skip."""
    skip, auto = clustered(550, 588, 4, 0), clustered(550, 588, 0, 4)
    table = figures.rows(record(skip, auto, clustered(550, 588, 0, 4)))
    up = next(r for r in table if r.arm == "upload")
    assert not up.supported and "n/a" in report.render(record(skip, auto, clustered(550, 588, 0, 4)))
    assert report.verdict(table).startswith("verdict: none: this run cannot support the upload/skip ratio")
    assert report.cluster_notes(table)[0].endswith("; auto, upload fall into them unlike skip (Fisher p < 0.05): that "
                                               "itself may be a cost")
    assert stats.fisher_exact(0, 4, 4, 0) == pytest.approx(2 / 70)


def test_fishers_exact_test_gives_the_tea_tastings_p_values():
    """Fisher's lady tasting tea, two-sided: 3 of 4 right p = 0.486, all 4 right p = 0.029."""
    assert stats.fisher_exact(3, 1, 1, 3) == pytest.approx(0.4857, abs=1e-4)
    assert stats.fisher_exact(4, 0, 0, 4) == pytest.approx(0.0286, abs=1e-4)


def exact_fisher(a: int, b: int, c: int, d: int) -> float:
    """The textbook sum with exact integers (small tables only): the reference for the log-space one."""
    from fractions import Fraction
    from math import comb

    n, row, col = a + b + c + d, a + b, a + c
    p = [Fraction(comb(col, x) * comb(n - col, row - x), comb(n, row))
         for x in range(max(0, row + col - n), min(row, col) + 1)]
    observed = p[a - max(0, row + col - n)]
    return float(sum(q for q in p if q <= observed))


@pytest.mark.parametrize("table", [(3, 1, 1, 3), (0, 4, 4, 0), (7, 2, 3, 9), (12, 0, 5, 5), (1, 30, 20, 4),
                                   (40, 41, 39, 40), (0, 0, 3, 5), (25, 25, 25, 25)])
def test_fishers_exact_test_in_log_space_is_the_exact_sum(table):
    assert stats.fisher_exact(*table) == pytest.approx(exact_fisher(*table), rel=1e-9)


def test_fishers_exact_test_on_a_huge_table_computes_each_term_once(monkeypatch):
    """A record listing a million instances is judged at once: no big integer (the exact sum took 138 s for a
    435 KB record, about n^3), and each table's probability computed once."""
    import math

    lgamma = math.lgamma
    calls = []
    monkeypatch.setattr(stats.math, "comb", lambda *a: pytest.fail("a big-integer binomial"))
    monkeypatch.setattr(stats.math, "lgamma", lambda x: calls.append(x) or lgamma(x))
    assert stats.fisher_exact(300_000, 200_000, 200_000, 300_000) < 1e-300
    assert len(calls) == 9 * (500_000 + 1)  # three log-binomials of three lgammas, for each of the 500,001 tables
    assert stats.fisher_exact(250_000, 250_000, 250_000, 250_000) == pytest.approx(1.0)


def test_only_a_mode_that_falls_into_the_clusters_unlike_skip_at_p_below_005_is_named():
    skip = clustered(550, 588, 3, 1)
    table = figures.rows(record(skip, clustered(550, 588, 1, 3), clustered(550, 588, 3, 1)))
    assert report.cluster_notes(table)[0].endswith("upload 3/1")  # auto's 1/3 against skip's 3/1: p = 0.49
    table = figures.rows(record(clustered(550, 588, 4, 0), clustered(550, 588, 0, 4), clustered(550, 588, 4, 0)))
    assert "; auto fall into them unlike skip (Fisher p < 0.05)" in report.cluster_notes(table)[0]


def test_the_rig_control_adds_its_spin_over_skips_mean_replay():
    rec = record([[100.0]], [[100.0]])
    rec.control = records.Spin(1, 2.1)
    assert figures.control_added(rec, [100.0, 110.0]) == pytest.approx(0.02)


def test_markdown_report_in_775s_terms():
    rec = record([[100.0], [100.4], [99.6], [100.0]], [[100.0]] * 4, [[102.0], [102.4], [101.6], [102.0]])
    rec.command = "freetoken-graphfix bench rig --instances 4"
    text = report.markdown(rec)
    assert "| GPU | GPU |" in text and "| FreeToken | 0.2.1 |" in text
    assert "| command | `freetoken-graphfix bench rig --instances 4` |" in text
    assert "| upload | 1 | 0.1020 | 1.0200 ± 0.0056 |" in text and "| skip | 1 | 0.1000 | 1 (base) |" in text
    assert "**verdict: upload vs never uploaded (skip) replay: bs 1 +2.00% ± 0.56%" in text


def test_startup_bench_measures_armed_and_off():
    from freetoken_graphfix_bench import startup

    rec = startup.startup(3)
    text = startup.render(rec)
    assert set(rec.delta_ms) == {"unset", "armed (auto)", "off"} and rec.target_ms == 5.0
    assert text.startswith("python -c pass, 3 interleaved runs each, FreeToken never imported: bare venv ")
    assert "armed (auto) +" in text or "armed (auto) -" in text
    assert all(x != x for x in rec.delta_band_ms["off"])  # 3 runs are too few for an interval: nan
    assert "not judged: 3 runs are too few" in text


def test_median_band_covers_the_median():
    """Distribution-free: the order statistics around n/2; with n = 100 the 95% interval runs from
    the 41st to the 60th value."""
    values = [float(v) for v in range(100)]
    assert stats.median_band(values) == (49.5, 40.0, 59.0)
    assert all(v != v for v in stats.median_band([1.0, 2.0])[1:])  # too few: no interval


@pytest.mark.parametrize("option", ["--instances", "--reps", "--kernels", "--streams", "--profile-reps"])
def test_bench_refuses_bad_counts_naming_the_accepted_values(option, capsys):
    with pytest.raises(UsageError) as exc:
        cli.parser().parse_args(["rig", option, "-1"])
    assert option in str(exc.value) and "accepted values are whole numbers of" in str(exc.value)


def test_profile_reps_may_be_zero():
    assert cli.parser().parse_args(["rig", "--profile-reps", "0"]).profile_reps == 0


def test_progress_stays_out_of_a_log(monkeypatch, capsys):
    """Redirected to a file (a shared log, CI), bench writes no progress bar: no carriage returns."""
    items = list(range(200))
    monkeypatch.setattr(running.sys.stderr, "isatty", lambda: False, raising=False)
    assert list(running.progress(items, len(items), "replays")) == items
    assert "\r" not in capsys.readouterr().err


@pytest.mark.parametrize("bands, word", [
    ([(1.0, 0.5, 2.0), (1.3, 0.9, 4.9)], "met (every interval within it)"),
    ([(1.3, 0.2, 6.1)], "cannot tell (an interval straddles it: run with more --runs)"),  # the probe's
    ([(1.0, 0.5, 2.0), (6.5, 5.2, 8.0)], "NOT met (an interval lies wholly above it)"),
    ([(1.0, float("nan"), float("nan"))], "not judged: 5 runs are too few for a 95% interval (it needs 8 or more)"),
])
def test_the_startup_target_is_judged_on_the_whole_interval(bands, word):
    from freetoken_graphfix_bench import startup

    assert startup.TARGET_MS == 5 and startup.startup_verdict(bands, 5) == word
    assert startup.startup_verdict([(1.0, float("nan"), float("nan"))], 1).startswith("not judged: 1 run is too few")
