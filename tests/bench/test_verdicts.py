"""The lines a maintainer acts on: each verdict rule of ``bench engine`` and ``bench report`` held to a
known answer, so that a one-line slip in one (a band dropped, a floor ignored, an order changed, a
key misread) turns a test red."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from freetoken_graphfix_bench import cli, spin
from freetoken_graphfix_bench.engine import headline, loop, sections
from freetoken_graphfix_bench.engine.sections import AS_CONTROL, LAUNCH_PATH
from freetoken_graphfix_bench.stats import Ratio, half_width, t975
from freetoken_graphfix_bench.verdicts import CANNOT, COSTS, FASTER, NO_COST, WITHIN_AA, judged, recovered, worst
from tests.bench.test_engine_figures import own_line, rec
from tests.helpers.engine_records import NOOP, figure, looped, process, shim

RECORDS = Path(__file__).resolve().parents[1] / "records"


@pytest.mark.parametrize("ratio, half, floor, want", [
    (1.001, 0.001, None, NO_COST),
    (1.01, 0.002, None, COSTS),
    (0.99, 0.002, None, FASTER),
    (1.001, 0.001, 0.01, WITHIN_AA.format(1.0)),  # resolved within ±0.5%, but the A/A arms lay 1% apart
    (1.01, 0.002, 0.02, WITHIN_AA.format(2.0)),   # a cost the A/A control's own spread covers
    (0.99, 0.002, 0.02, WITHIN_AA.format(2.0)),   # a speed-up the same covers
    (1.0, 0.01, None, CANNOT),
    (math.nan, 0.001, None, CANNOT),
])
def test_a_figure_is_judged_on_the_wider_of_its_band_and_the_aa_floor(ratio, half, floor, want):
    assert judged(ratio, half, floor) == want


def test_the_aa_floor_is_how_far_the_identical_arms_came_apart_plus_its_band():
    figures = rec(upstream=[looped(0)]).figures
    figures.aa = {"step": {"2": Ratio(1.004, 0.001, 4)}, "graph": {"2": Ratio(math.nan, math.nan, 0)}}
    assert figures.aa_floor("step", "2") == pytest.approx(0.004 + t975(5) * 0.001)
    assert figures.aa_floor("graph", "2") is None and figures.aa_floor("replay", "2") is None


def test_a_cost_at_any_batch_size_outranks_a_size_that_cannot_tell():
    assert worst([CANNOT, COSTS]) == COSTS and worst([NO_COST, CANNOT, FASTER]) == FASTER
    assert worst([NO_COST, CANNOT]) == CANNOT and worst([NO_COST, NO_COST]) == NO_COST


def test_gate_is_uploaded_at_capture_so_its_own_graph_is_judged_not_taken_for_the_launch_path():
    """Gate runs FreeToken's own ``_upload_graph``: its own graph's 2% over never-uploaded copies is the
    upload's (COSTS), as upstream's is; no-upload's same 2% is the launch path's."""
    text = rec(gate=[looped(i, own=1.02) for i in range(3)],
               **{"no-upload": [looped(i + 3, own=1.0) for i in range(3)]}).text()
    assert own_line(text, "gate").endswith(COSTS), own_line(text, "gate")
    both = rec(gate=[looped(i, own=1.02) for i in range(3)],
               **{"no-upload": [looped(i + 3, own=1.02) for i in range(3)]}).text()
    assert own_line(both, "no-upload").endswith(LAUNCH_PATH)
    assert own_line(both, "gate").endswith(AS_CONTROL.format("no-upload"))


def test_a_first_launch_that_blocked_in_one_process_is_the_arms_first_launch():
    blocked = looped(0, first_launch_ms={"2": 4012.0, "1": 0.3})
    figures = rec(**{"no-upload": [looped(1), blocked]}).figures
    assert figures.arms["no-upload"].first_launch_ms == {"2": 4012.0, "1": 0.3}


def test_the_aa_figure_is_the_second_arm_over_the_first_as_printed():
    """In the no-WAIT case the A/A pair is (no-upload, auto); the report prints "auto over no-upload"."""
    record = rec(**{"no-upload": [looped(i) for i in range(3)], "auto": [looped(i + 3, step=1.02 * 1.01)
                                                                       for i in range(3)]})
    assert record.figures.aa_pair == ("no-upload", "auto")
    assert record.figures.aa["step"]["2"].ratio == pytest.approx(1.01, abs=0.002)
    assert "A/A control (auto over no-upload" in (record).text()


def test_processes_a_tenth_apart_in_host_time_share_one_host_level():
    """Host levels are a process's 20-100% jumps (a host-bound step), not the 1.5% the rig's replays
    split at: two arms whose processes ran 10% apart on the host are still compared."""
    record = rec(upstream=[looped(i, host=0.22) for i in range(2)],
                 **{"no-upload": [looped(i + 2, host=0.245) for i in range(2)]})
    assert record.figures.host_levels["2"] == [math.inf]
    assert not math.isnan(record.figures.arms["upstream"].cross["step"]["2"].ratio)


def effect(upload: float, ss: float = 0.0, uploaded: int = 2, never: int = 2, own: float = 0.0) -> loop.Effect:
    return loop.Effect(upload, own, ss, uploaded + never - 2, uploaded, never, 10)


def test_a_process_with_two_copies_of_each_kind_has_two_degrees_of_freedom():
    got = loop.process_effect(process(**looped(0, copies=2)), "step_gpu_ms", "2")
    assert (got.uploaded, got.never, got.df) == (2, 2, 2)


def test_the_pooled_band_weighs_each_kind_by_its_executables():
    """One process, two copies of each kind, copies 0.01 apart (ss 2e-4 on 2 degrees of freedom): the
    upload is a mean of 2 over a mean of 2 (SE 0.01), the own graph one executable over a mean of 2."""
    got = loop.combine([effect(0.01, ss=2e-4)], "upload")
    assert got.se == pytest.approx(0.01) and got.half == pytest.approx(t975(3) * 0.01)
    own = loop.combine([effect(0.01, ss=2e-4)], "own")
    assert own.se == pytest.approx(math.sqrt(1e-4 * 1.5))


def test_kinds_of_unequal_size_are_weighed_as_a_two_sample_interval():
    """A short run can leave an executable without a whole window, so one kind has fewer copies read:
    2 uploaded over 4 never-uploaded, pooled SD 0.01 on 4 degrees of freedom, is the textbook two-sample
    interval, SE 0.01 * sqrt(1/2 + 1/4) and t(0.975, 4) = 2.776."""
    got = loop.combine([effect(0.01, ss=4e-4, uploaded=2, never=4)], "upload")
    assert got.se == pytest.approx(0.01 * math.sqrt(1 / 2 + 1 / 4))
    assert got.half == pytest.approx(2.776 * got.se, rel=1e-3)


def test_the_band_covers_how_far_processes_lie_apart():
    """Three processes at 0, +1%, +2% with no spread inside any: the band is Student's t over the
    processes; five with one far off: it reaches that one."""
    three = loop.combine([effect(x) for x in (0.0, 0.01, 0.02)], "upload")
    assert three.half == pytest.approx(t975(3) * 0.01 / math.sqrt(3))
    five = loop.combine([effect(x) for x in (0.0, 0.0, 0.0, 0.0, 0.05)], "upload")
    assert five.half == pytest.approx(0.04)


def saved(tmp_path, judged_case):
    """A case written as ``bench engine --json`` writes its record, and read back as ``bench report`` reads it."""
    from freetoken_graphfix_bench import record_files, records, registry
    from freetoken_graphfix_bench.registry import report_of

    path = tmp_path / "record.json"
    record_files.write(str(path), records.EngineRecord([judged_case.case]))
    return report_of(registry.read(str(path)))


def test_bench_report_fails_a_record_whose_protected_arm_blocked(tmp_path):
    ok = rec(upstream=[looped(0)], auto=[looped(1, shim=NOOP)])
    assert not saved(tmp_path, ok).failed
    blocked = rec(upstream=[looped(0)], auto=[looped(1, shim=NOOP, fires=[{"step": 3, "bs": 2, "flag_after": 1}])])
    assert saved(tmp_path, blocked).failed


def test_bench_report_judges_against_the_wait_the_config_expected(tmp_path):
    """A record of a model whose config expects the PLE WAIT, where no run held one (the table not in
    wait-sync mode): re-judged, it fails, as the run itself did."""
    record = rec(expects_wait=True, upstream=[looped(0)], **{"no-upload": [looped(1)]})
    assert not record.figures.wait_case and saved(tmp_path, record).failed
    assert "not in CUDA wait-sync mode" in saved(tmp_path, record).text


def test_a_ratio_from_two_samples_has_a_band_of_student_t_on_one_degree_of_freedom():
    assert half_width(0.001, 1) == pytest.approx(12.706 * 0.001, rel=1e-3)
    assert math.isnan(half_width(0.001, 0)) and math.isnan(half_width(math.nan, 3))


def test_the_markdown_opens_the_in_loop_figures_with_the_upload_in_bold():
    record = rec(upstream=[looped(i) for i in range(2)], **{"no-upload": [looped(i + 2) for i in range(2)]})
    lines = record.markdown().splitlines()
    first = next(i for i, line in enumerate(lines) if "the upload in the decode loop, same graph" in line)
    assert lines[first].startswith("**") and lines[first + 1].startswith("- "), lines[first:first + 2]


def test_the_host_levels_line_says_one_level_or_where_the_levels_split():
    one = rec(upstream=[looped(i) for i in range(2)], **{"no-upload": [looped(i + 2) for i in range(2)]})
    assert sections.host_level_lines(one.figures)[0].endswith("one per phase")
    two = rec(upstream=[looped(0), looped(1, host=0.44)], **{"no-upload": [looped(2), looped(3, host=0.44)]})
    assert "several: bs 2: A < " in sections.host_level_lines(two.figures)[0]


def test_an_arm_without_traced_runs_says_so_in_the_timeline():
    record = rec(upstream=[looped(0)], **{"no-upload": [looped(1)]})
    text = (record).text()
    assert all(any(line.startswith(f"{arm:14} not traced") for line in text.splitlines())
               for arm in ("upstream", "no-upload")), text


def wait_run(seed: int, **over) -> dict:
    """A process of a model whose decode graphs hold the PLE WAIT (wait-sync table, WAITs captured)."""
    return looped(seed, wait_sync=True, captured_waits=2, table="DiskRowTable", **over)


def test_upstream_that_blocked_where_it_uploads_fails_the_run():
    """0.2.x protects its graphs by the upload: where its first launch still blocked (a GPU where the
    upload does not protect), that is a safety failure, not one more negative control."""
    fire = [{"step": 3, "bs": 2, "flag_after": 1}]
    record = rec(expects_wait=True, upstream=[wait_run(0, fires=fire)], **{"no-upload": [wait_run(1, fires=fire)]})
    assert record.figures.arms["upstream"].reference == "upstream"
    assert record.failures() == ["upstream: the watchdog released 1 blocked launch(es)"]
    control_only = rec(expects_wait=True, upstream=[wait_run(0)], **{"no-upload": [wait_run(1, fires=fire)]})
    assert control_only.failures() == []  # the negative control blocking is what it is for


def test_bench_report_fails_a_serve_record_whose_protected_arm_hung(tmp_path, capsys):
    """The H200's own ``bench serve`` record passes as saved; with auto's requests hung it fails, as the
    run would have."""
    assert cli.main(["report", str(RECORDS / "serve.json")]) == 0
    saved_record = json.loads((RECORDS / "serve.json").read_text())
    for request in saved_record["cases"][0]["runs"]["auto"]["requests"]:
        request["hung"] = True
    hung = tmp_path / "hung.json"
    hung.write_text(json.dumps(saved_record))
    assert cli.main(["report", str(hung)]) == 1
    assert "auto" in capsys.readouterr().out


def test_a_serve_record_with_no_server_is_no_pass(tmp_path, capsys):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"kind": "serve", "schema": 2, "cases": []}))
    assert cli.main(["report", str(path)]) == 1
    saved_record = json.loads((RECORDS / "serve.json").read_text())
    saved_record["cases"][0]["runs"] = {}
    path.write_text(json.dumps(saved_record))
    assert cli.main(["report", str(path)]) == 1
    assert "no server ran: nothing was measured" in capsys.readouterr().out


def test_a_control_read_too_loosely_to_name_a_cost_is_not_recovered():
    """+1.9% read of +2% added, but ± 3%: that interval holds 0, so this run could not have told a 2%
    cost from none."""
    assert recovered(1.019, 0.003, 0.02) and not recovered(1.019, 0.03, 0.02)


def test_the_runs_sensitivity_is_its_widest_judged_interval():
    """The upload's intervals are ± 0.10% at bs 2 and ± 0.40% at bs 1, both controls read back: the run
    can name a cost above +0.40%, not above +0.10%."""
    ctl = figure(1.02, 0.002, added=0.02)
    figures = rec(upstream=[looped(0)]).figures
    figures.control_in_loop = {"step": {"2": ctl, "1": ctl}}
    figures.upload_in_loop = {"step": {"2": figure(1.0, 0.001), "1": figure(1.0, 0.004)}}
    conclusion = headline.control_reading(figures)[1]
    assert conclusion.endswith("this run names any cost above +0.40%"), conclusion


def test_the_controls_added_time_is_a_fraction_of_a_never_uploaded_launch():
    """The spin adds 0.0204 ms to launches of 1.02 ms (2%); the engine's own graph runs 10% slower here,
    which must not enter the fraction."""
    record = rec(upstream=[looped(i, own=1.1, spin_ms=0.0204) for i in range(3)])
    assert record.figures.control_in_loop["step"]["2"].added == pytest.approx(0.02, rel=0.01)


def test_an_arm_is_on_the_reference_tokens_only_when_every_process_is():
    odd = looped(1, token_hash="bbbb")
    record = rec(upstream=[looped(0)], auto=[looped(2, shim=NOOP), odd])
    assert not record.figures.arms["auto"].same_tokens_as_reference
    assert "auto: tokens ['aaaa', 'bbbb'] differ from upstream's" in record.failures()


def test_the_spin_is_calibrated_on_back_to_back_spins_and_reports_its_median(monkeypatch):
    """A GPU whose spins take 1 µs per 1000 clocks plus 5 µs of launch gap before the first (so one
    spin alone reads long): the calibrated spin is the target's length, and its reported length the
    median of its five measurements."""
    measured = iter([103.0, 99.0, 101.0, 100.0, 102.0])

    def spin_us(cycles, stream, spins=50):
        if cycles == spin.PROBE_CYCLES:
            return cycles / 1000 + 5.0 / spins
        assert 99_000 <= cycles <= 101_000, cycles  # 100 µs at 1 µs per 1000 clocks
        return next(measured)

    monkeypatch.setattr(spin, "spin_us", spin_us)
    got = spin.calibrate(100.0, stream=None)
    assert got["spin_us"] == 101.0 and got["spin_us_range"] == [99.0, 103.0]


def test_the_report_answers_first_with_the_details_own_figures():
    """The first lines, terminal and markdown alike: safety, the upload's in-loop cost with its band (the
    detail's own figure), what the positive control says the run could see, and what to set."""
    record = rec(upstream=[looped(i, upload=1.01, spin_ms=0.0204, drift=1e-4) for i in range(3)],
                 **{"no-upload": [looped(i + 3, upload=1.01, spin_ms=0.0204) for i in range(3)]})
    text = (record).text()
    head = text.splitlines()[:8]
    assert head[0] == "safety: every protected arm never blocked and gave upstream's tokens"
    line = next(ln for ln in text.splitlines() if ln.startswith("  GPU time per decode step: bs 2 +"))
    figure = line.split(": ", 1)[1].split(" (processes", 1)[0]
    assert head[1].startswith("the upload in the decode loop: GPU time per decode step " + figure)
    assert head[1].endswith(COSTS) and head[2].startswith("positive control: recovered; this run names any cost")
    assert head[3] == ("what to set: nothing needs protection here; FT_GRAPH_UPLOAD=auto skips an upload that "
                       "protects nothing; the upload costs this GPU what the line above says") and head[4] == ""
    wide = rec(upstream=[looped(i, noise=0.05) for i in range(3)])
    assert (wide).text().splitlines()[3].endswith("this run cannot tell whether the upload costs anything "
                                                               "(its band reaches beyond ±0.5%)")
    md = record.markdown().splitlines()[:14]
    assert md[2] == f"- **{head[0]}**" and md[3] == f"- {head[1]}"


def test_a_protected_arm_that_blocked_leads_the_report():
    fire = [{"step": 3, "bs": 2, "flag_after": 1}]
    record = rec(expects_wait=True, upstream=[wait_run(0)], auto=[wait_run(1, shim=shim("auto", "deferred"),
                                                                           fires=fire)])
    head = (record).text().splitlines()
    assert head[0].startswith("safety: FAILED: auto: the watchdog released 1 blocked launch(es)"), head[0]
    assert head[3].startswith("what to set: not FT_GRAPH_UPLOAD=auto on this model")


def test_the_headline_takes_the_worst_size_and_says_no_cost_where_there_is_none():
    figures = rec(upstream=[looped(0)]).figures
    figures.control_in_loop = {}
    figures.upload_in_loop = {"step": {"2": figure(1.0, 0.001), "1": figure(1.02, 0.002)}}
    # a cost at bs 1 is the line's verdict, whatever bs 2 says
    assert headline.upload_cost(figures, headline.control_reading(figures)[2])[1] == COSTS
    clean = rec(upstream=[looped(i) for i in range(3)]).text().splitlines()
    assert clean[1].endswith(NO_COST) and clean[3].endswith("the upload costs nothing beyond ±0.5% here")
