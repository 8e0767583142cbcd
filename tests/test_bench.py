"""The benchmark's pure parts: CUPTI gap extraction, statistics, the armed-hook cost probe."""

from __future__ import annotations

import json

import pytest

from freetoken_graphfix.bench import cli, common, cupti, replay, report, stats


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
    assert cupti.stream_gaps(one) == [[1.0], []] and cupti.stream_gaps(two) == [[2.0], []]
    assert cupti.pooled_gaps([one, two]) == {"s1": [1.0, 2.0], "s2": []}


def test_busy_time_is_the_union_of_kernel_intervals():
    ks = [{"ts": 0.0, "dur": 2.0}, {"ts": 1.0, "dur": 2.0}, {"ts": 5.0, "dur": 1.0}, {"ts": 5.2, "dur": 0.3}]
    assert cupti.busy_us(ks) == pytest.approx(4.0)


def test_decode_timeline_per_bs(tmp_path):
    """Two bs-2 launches then three bs-1 launches; each bs's first is left out, a step runs to the next
    launch of its bs, and the last launch has none."""
    bs = [2, 2, 1, 1, 1]
    path = trace(tmp_path, bs, GRAPH, others=[(50.0, 1.0), (60.0, 1.0)])
    t = cupti.decode_timeline(path, bs)
    assert t["note"] == "30 kernel records, 5 graph launches"
    gaps = t["2"].pop("gap_quantiles")
    assert t["2"] == {"launches": 1, "graph_kernels": 4, "step_kernels": None, "busy_us": None, "streams": 2,
                      "gap_us": {"s1": {"median": 0.625, "n": 2}}}
    assert len(gaps["s1"]) == 101 and (gaps["s1"][0], gaps["s1"][50], gaps["s1"][100]) == (0.5, 0.625, 0.75)
    assert t["1"]["launches"] == 2 and t["1"]["step_kernels"] == 6 and t["1"]["busy_us"] == pytest.approx(5.0)
    lost = cupti.decode_timeline(path, bs + [1])
    assert list(lost) == ["note"] and "5 graph launches in the trace for the 6" in lost["note"]


def test_summary():
    s = stats.summary([float(v) for v in range(1, 12)])
    assert (s["n"], s["median"], s["p10"], s["p90"]) == (11, 6.0, 2.0, 10.0)
    assert stats.summary([]) == {"n": 0}


def test_armed_hook_cost_leaves_nothing_patched():
    cost = replay.armed_hook_cost(calls=2000)
    assert cost == pytest.approx(cost) and cost < 1000  # a number, in µs per call


def test_bench_without_cuda_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert cli.main([]) == common.ERR
    assert "no CUDA device" in capsys.readouterr().err


def record(skip_instances, auto_instances, upload_instances=None):
    """A raw record as ``run_arms`` writes it: one bs, replays per graph instance."""
    def arm(per_instance, action, blocked):
        n = len(per_instance)
        return {"capture_s": [0.1] * n, "graphs": {"bs=1": {"action": [action] * n, "hook_ms": [0.1] * n}},
                "first_launch": {"1": {"launch_ms": [2.0] * n, "blocked": [blocked] * n}},
                "replay_us": {"1": per_instance}, "logits_equal_upload": True,
                "gaps_us": {"s1": [0.3, 0.4], "s2": [0.5], "s3": []}}

    return {"env": {"gpu": "GPU", "driver": "1", "torch": "2", "freetoken": "0.2.1", "date": "today"},
            "config": {"kernels": 10, "streams": 2, "no_wait": False, "h2d": False, "batch_sizes": [1],
                       "instances": len(skip_instances), "reps": 3},
            "arms": {"skip": arm(skip_instances, "exposed", True), "auto": arm(auto_instances, "deferred", False),
                     **({"upload": arm(upload_instances, "upload", False)} if upload_instances else {})}}


def test_rows_pool_instances_and_report_their_spread():
    rec = record([[100.0, 100.0, 100.0], [102.0, 102.0, 102.0]], [[101.0] * 3, [101.0] * 3])
    skip, auto = stats.rows(rec)
    assert (skip["median"], skip["ratio_skip"], skip["blocked"], skip["instances"]) == (101.0, 1.0, 2, 2)
    assert skip["instance_spread"] == pytest.approx(2 / 101)
    assert (auto["ratio_skip"], auto["instance_spread"], auto["actions"]) == (1.0, 0.0, ["deferred"])
    text = report.render(rec)
    assert "2 graph instances per strategy" in text and "BLOCKED 2/2" in text
    assert "1.98%" in text and "0.35/0.50 " in text

    assert auto["ratio_se"] == pytest.approx(1 / 101)  # skip's instance medians 100 and 102: sd 1.41, se 1
    assert "verdict: needs the upload and skip strategies" in text


def test_past_four_streams_only_their_count_is_shown():
    gaps = {f"s{i}": [0.1 * i] for i in range(1, 8)}
    assert report.stream_gaps(gaps) == "0.10/0.20/0.30/0.40 +3"
    assert report.stream_gaps({"s2": [0.5], "s1": [0.4]}) == "0.40/0.50"


def test_verdict_weighs_the_upload_against_the_spread_of_instances():
    skip = [[100.0], [100.4], [99.6], [100.0]]
    slower = stats.rows(record(skip, skip, [[102.0], [102.4], [101.6], [102.0]]))
    # 4 + 4 instances, df 6: t = 2.447 times the standard error 0.23%; the A/A floor (auto = skip) is as wide
    assert "+2.00% ± 0.57%" in stats.verdict(slower) and "COSTS this GPU" in stats.verdict(slower)
    within = stats.rows(record(skip, skip, [[100.2], [100.6], [99.8], [100.2]]))
    assert stats.verdict(within).endswith(
        "no cost this run can resolve (its interval reaches beyond ±0.5%: run with more --instances)")
    single = stats.rows(record([[100.0]], [[100.0]], [[103.0]]))
    assert "cannot support the upload/skip ratio (needs --instances 2 or more" in stats.verdict(single)
    tight = [[100.0], [100.1], [99.9], [100.0]]
    none = stats.rows(record(tight, tight, [[100.05], [100.15], [99.95], [100.05]]))
    assert stats.verdict(none).endswith("no cost beyond ±0.5% on this GPU (95% interval within it)")
    faster = stats.rows(record(tight, tight, [[97.0], [97.1], [96.9], [97.0]]))
    assert "uploaded graphs replay FASTER on this GPU, by -3.00% (bs 1)" in stats.verdict(faster)


def clustered(fast: float, slow: float, n_fast: int, n_slow: int, cost: float = 1.0) -> list[list[float]]:
    """Instances in two modes about 6% apart, each instance keeping its mode (and a little noise)."""
    return ([[fast * cost * (1 + 0.001 * i)] * 3 for i in range(n_fast)]
            + [[slow * cost * (1 + 0.001 * i)] * 3 for i in range(n_slow)])


def test_two_modes_are_detected_and_compared_within():
    """The H200 run that split into ~550 and ~588 µs clusters: pooled, 2 SE was 3.5-4.4%; within
    the modes, a 1% cost is resolved, and the report says the instances were multi-modal."""
    skip = clustered(550, 588, 2, 2)
    upload = clustered(550, 588, 3, 1, cost=1.01)
    auto = clustered(550, 588, 1, 3)
    table = stats.rows(record(skip, auto, upload))
    up = next(r for r in table if r["arm"] == "upload")
    assert up["modes"] == 2 and up["mode_counts"] == [3, 1]
    assert up["ratio_skip"] == pytest.approx(1.01, abs=0.001) and 2 * up["ratio_se"] < 0.005
    assert "COSTS this GPU" in stats.verdict(table)
    notes = stats.mode_notes(table)
    assert notes == ["bs 1: the instances fall into 2 modes (fastest first; a property of each instance, not of "
                     "time): skip 2/2, auto 1/3, upload 3/1"]


def test_an_upload_alone_in_a_mode_of_its_own_is_a_cost():
    """Every uploaded instance ~7% above every never-uploaded one: the modes come from the never-uploaded
    arms (one mode here), so that is a cost measured there, not "no shared mode"."""
    skip, upload = clustered(550, 588, 4, 0), clustered(550, 588, 0, 4)
    table = stats.rows(record(skip, skip, upload))
    up = next(r for r in table if r["arm"] == "upload")
    assert stats.supported(up) and up["modes"] == 1 and up["ratio_skip"] == pytest.approx(588 / 550, abs=0.002)
    assert "COSTS this GPU replay time, up to +6.9" in stats.verdict(table)


def test_an_arm_in_a_mode_skip_never_reached_gets_no_ratio_but_a_note():
    """auto's instances (never uploaded) all in the slow mode, skip's all in the fast one: within a mode
    nothing compares, and the note says the arms fall into the modes unlike skip."""
    skip, auto = clustered(550, 588, 4, 0), clustered(550, 588, 0, 4)
    table = stats.rows(record(skip, auto, clustered(550, 588, 0, 4)))
    up = next(r for r in table if r["arm"] == "upload")
    assert not stats.supported(up) and "n/a" in report.render(record(skip, auto, clustered(550, 588, 0, 4)))
    assert stats.verdict(table).startswith("verdict: none: this run cannot support the upload/skip ratio")
    assert stats.mode_notes(table)[0].endswith("; auto, upload fall into them unlike skip (Fisher p < 0.05): that "
                                               "itself may be a cost")
    assert stats.fisher_exact(0, 4, 4, 0) == pytest.approx(2 / 70)


def test_fishers_exact_test_gives_the_tea_tastings_p_values():
    """Fisher's lady tasting tea, two-sided: 3 of 4 right p = 0.486, all 4 right p = 0.029."""
    assert stats.fisher_exact(3, 1, 1, 3) == pytest.approx(0.4857, abs=1e-4)
    assert stats.fisher_exact(4, 0, 0, 4) == pytest.approx(0.0286, abs=1e-4)


def test_only_an_arm_that_falls_into_the_modes_unlike_skip_at_p_below_005_is_named():
    skip = clustered(550, 588, 3, 1)
    table = stats.rows(record(skip, clustered(550, 588, 1, 3), clustered(550, 588, 3, 1)))
    assert stats.mode_notes(table)[0].endswith("upload 3/1")  # auto's 1/3 against skip's 3/1: p = 0.49
    table = stats.rows(record(clustered(550, 588, 4, 0), clustered(550, 588, 0, 4), clustered(550, 588, 4, 0)))
    assert "; auto fall into them unlike skip (Fisher p < 0.05)" in stats.mode_notes(table)[0]


def test_the_rig_control_adds_its_spin_over_skips_mean_replay():
    assert stats.control_added({"control": {"spin_us": 2.1}}, [100.0, 110.0]) == pytest.approx(0.02)


def test_markdown_report_in_775s_terms():
    rec = record([[100.0], [100.4], [99.6], [100.0]], [[100.0]] * 4, [[102.0], [102.4], [101.6], [102.0]])
    rec["command"] = "python -m freetoken_graphfix bench --instances 4"
    text = report.markdown(rec)
    assert "| GPU | GPU |" in text and "| FreeToken | 0.2.1 |" in text
    assert "| command | `python -m freetoken_graphfix bench --instances 4` |" in text
    assert "| upload | 1 | 0.1020 | 1.0200 ± 0.0056 |" in text and "| skip | 1 | 0.1000 | 1 (base) |" in text
    assert "**verdict: upload vs never uploaded (skip) replay: bs 1 +2.00% ± 0.56%" in text


def test_startup_bench_measures_armed_and_off():
    from freetoken_graphfix.bench import startup

    rec, text = startup.startup(3)
    assert set(rec["delta_ms"]) == {"unset", "armed (auto)", "off"} and rec["target_ms"] == 5.0
    assert text.startswith("python -c pass, 3 interleaved runs each, FreeToken never imported: bare venv ")
    assert "armed (auto) +" in text or "armed (auto) -" in text
    assert all(x != x for x in rec["delta_band_ms"]["off"])  # 3 runs are too few for an interval: nan


def test_median_band_covers_the_median():
    """Distribution-free: the order statistics around n/2; with n = 100 the 95% interval runs from
    the 41st to the 60th value."""
    values = [float(v) for v in range(100)]
    assert stats.median_band(values) == (49.5, 40.0, 59.0)
    assert all(v != v for v in stats.median_band([1.0, 2.0])[1:])  # too few: no interval


@pytest.mark.parametrize("option", ["--instances", "--reps", "--kernels", "--streams", "--profile-reps"])
def test_bench_refuses_bad_counts_naming_the_accepted_values(option, capsys):
    with pytest.raises(SystemExit):
        cli.parser().parse_args([option, "-1"])
    err = capsys.readouterr().err
    assert option in err and "accepted values are whole numbers of" in err


def test_profile_reps_may_be_zero():
    assert cli.parser().parse_args(["--profile-reps", "0"]).profile_reps == 0


def test_progress_stays_out_of_a_log(monkeypatch, capsys):
    """Redirected to a file (a shared log, CI), bench writes no progress bar: no carriage returns."""
    items = list(range(200))
    monkeypatch.setattr(common.sys.stderr, "isatty", lambda: False, raising=False)
    assert list(common.progress(items, len(items), "replays")) == items
    assert "\r" not in capsys.readouterr().err


@pytest.mark.parametrize("bands, word", [
    ([(1.0, 0.5, 2.0), (1.3, 0.9, 4.9)], "met (every interval within it)"),
    ([(1.3, 0.2, 6.1)], "cannot tell (an interval straddles it: run with more --startup-runs)"),  # the probe's
    ([(1.0, 0.5, 2.0), (6.5, 5.2, 8.0)], "NOT met (an interval lies wholly above it)"),
    ([(1.0, float("nan"), float("nan"))], "not judged: 5 runs are too few for a 95% interval (it needs 8 or more)"),
])
def test_the_startup_target_is_judged_on_the_whole_interval(bands, word):
    from freetoken_graphfix.bench import startup

    assert startup.TARGET_MS == 5 and startup.startup_verdict(bands, 5) == word
