"""The rig's verdict held to known answers: records in ``bench rig --json``'s shape with the upload a
known amount slower or faster, the instances 0.1-0.5% apart, over many seeds. A verdict that hides an
effect (a cost taken for a cluster of its own, a speed-up called "none") or invents one at 0 turns red."""

from __future__ import annotations

import functools

import pytest

from freetoken_graphfix_bench.rig import figures, report
from tests.helpers.known_answers import rig_record

SEEDS = range(20)
APART = (0.001, 0.0025, 0.005)


def word(verdict: str) -> str:
    for w in ("COSTS", "FASTER", "no cost beyond", "verdict: none"):
        if w in verdict:
            return w
    return verdict


@pytest.mark.parametrize("apart", APART)
@pytest.mark.parametrize("cost", [-0.03, 0.01, 0.021, 0.03, 0.05, 0.10])
def test_the_verdict_names_the_direction_and_the_size_within_its_band(cost, apart):
    right = 0
    for seed in SEEDS:
        table = figures.rows(rig_record(cost, apart, seed))
        ups = [r for r in table if r.arm == "upload"]
        direction = word(report.verdict(table)) == ("COSTS" if cost > 0 else "FASTER")
        right += direction and all(abs(r.to_skip.ratio - 1 - cost) <= r.judging_width for r in ups)
    assert right >= 19, f"{right} of 20 seeds right at {cost:+.1%}, instances {apart:.2%} apart"


@pytest.mark.parametrize("apart", APART)
def test_no_upload_cost_is_never_called_a_cost_or_a_speed_up(apart):
    verdicts = [report.verdict(figures.rows(rig_record(0.0, apart, seed))) for seed in SEEDS]
    assert all(word(v) == "no cost beyond" for v in verdicts), [v for v in verdicts if "no cost beyond" not in v]


def test_a_cost_beyond_every_never_uploaded_instance_is_a_cost_not_a_cluster_of_its_own():
    """The split into clusters comes from the never-uploaded modes alone: a +10% upload lies outside all
    of them, in the one cluster they share, and is measured there."""
    table = figures.rows(rig_record(0.10, 0.0035, seed=1))
    up = next(r for r in table if r.arm == "upload")
    assert up.clusters == 1 and up.to_skip.ratio == pytest.approx(1.10, abs=0.002)
    assert "COSTS this GPU replay time, up to +10" in report.verdict(table)


def test_tight_instances_resolve_775s_cost():
    table = figures.rows(rig_record(0.021, 0.001, seed=3))
    assert "COSTS" in report.verdict(table) and "+2.1" in report.verdict(table)


def test_the_positive_control_recovered_gives_the_runs_sensitivity():
    text = report.render(rig_record(0.0, 0.0025, seed=2))
    line = next(ln for ln in text.splitlines() if ln.startswith("positive control"))
    assert "bs 1 +2.00% added, read +2.0" in line and ": recovered; this run names any cost above +0." in line


def test_a_control_not_recovered_leaves_no_verdict_and_says_why():
    """A run that reads the known +2% as +0.5% would have read #775's cost as small as well."""
    table = figures.rows(rig_record(0.05, 0.0025, seed=4, control_read=0.005))
    assert report.control_line(table).endswith("NOT recovered, so no verdict")
    assert report.verdict(table).startswith("verdict: none: the positive control was not recovered (bs ")
    overread = figures.rows(rig_record(0.0, 0.001, seed=4, control_read=0.04))
    assert report.verdict(overread).startswith("verdict: none: the positive control was not recovered")


def test_a_record_written_before_the_control_is_judged_and_says_it_lacks_one():
    record = rig_record(0.021, 0.0025, seed=5, arms=("upload", "skip", "warm", "deferred", "auto"))
    table = figures.rows(record)
    assert report.control_line(table).startswith("positive control: not measured (it needs the skip mode")
    assert "COSTS" in report.verdict(table)
    text = report.markdown(record)
    assert "positive control: not measured" in text and "Checking #775 where it was reported" in text


def test_the_aa_floor_widens_the_interval_when_identical_arms_came_apart():
    """Arms captured one after another may differ by where they were placed, not by what was done to
    them: the A/A arms' own distance bounds what a ratio may claim."""
    record = rig_record(0.004, 0.001, seed=6)
    for replays in record.arms["warm"].replay_us.values():
        for instance in replays:
            instance[:] = [t * 1.006 for t in instance]
    table = figures.rows(record)
    up = next(r for r in table if r.arm == "upload" and r.bs == "1")
    assert up.aa_floor > 0.006 > up.to_skip.half
    assert "COSTS" not in report.verdict(table)


# ---------------------------------------------------------------- bench engine, the upload in the decode loop

LOOP_COSTS = (-0.03, 0.0, 0.01, 0.021, 0.05, 0.10)


@functools.cache
def loop_figures(cost: float, apart: float) -> list:
    """Three processes a seed, four copies a kind, the executables a known spread apart (placement),
    the uploaded ones ``1 + cost`` slower: the loop's step figure per bs, over 20 seeds (40 figures)."""
    from freetoken_graphfix_bench.engine import loop
    from tests.helpers.engine_records import looped, process

    return [f for seed in SEEDS for f in loop.in_loop(
        [process(**looped(10 * seed + i, upload=1 + cost, placement=apart / 3.3)) for i in range(3)],
        "upload")["step"].values()]


@pytest.mark.parametrize("apart", APART)
@pytest.mark.parametrize("cost", LOOP_COSTS)
def test_the_decode_loop_names_a_known_upload_cost_and_never_invents_one(cost, apart):
    """The verdict's direction right in 39 of 40 figures or more, never a cost or a speed-up at 0."""
    from freetoken_graphfix_bench import verdicts

    want = (verdicts.COSTS,) if cost > 0 else (verdicts.FASTER,) if cost < 0 else (verdicts.NO_COST, verdicts.CANNOT)
    judged = [verdicts.judged(f.ratio, f.half) for f in loop_figures(cost, apart)]
    assert len(judged) == 40
    if cost == 0:
        assert not {verdicts.COSTS, verdicts.FASTER} & set(judged), judged
    assert sum(j in want for j in judged) >= 39, judged


def test_the_decode_loops_interval_holds_the_known_cost_as_often_as_it_says():
    """Pooled over every cost and spread (720 figures), the 95% interval holds the known cost in 94%
    or more (the loop has no A/A floor to widen it): a band too narrow would claim a resolution the
    loop does not have."""
    held = [abs(f.ratio - 1 - cost) <= f.half for cost in LOOP_COSTS for apart in APART
            for f in loop_figures(cost, apart)]
    assert len(held) == 720 and sum(held) >= 0.94 * len(held), sum(held)


# ---------------------------------------------------------------- bench engine, across processes

@pytest.mark.parametrize("apart", APART)
@pytest.mark.parametrize("cost", LOOP_COSTS)
def test_across_processes_a_known_cost_is_named_and_none_invented(cost, apart):
    """Four rounds: upstream's own graph ``1 + cost`` slower than no-upload's, the A/A pair (no-upload, auto)
    identical, every process's speed a known spread apart: upstream's decode-step verdict names the
    cost's direction in 19 of 20 seeds or more, and never a cost or a speed-up at 0."""
    import random

    from freetoken_graphfix_bench import verdicts
    from freetoken_graphfix_bench.engine import sections
    from tests.bench.test_engine_figures import rec
    from tests.helpers.engine_records import looped

    want = verdicts.COSTS if cost > 0 else verdicts.FASTER if cost < 0 else None
    named = []
    for seed in SEEDS:
        rng = random.Random(seed)

        def processes(factor: float, first: int, rng: random.Random = rng) -> list[dict]:
            return [looped(first + i, step=1.02 * factor * (1 + rng.gauss(0, apart / 3.3)), copies=0)
                    for i in range(4)]

        record = rec(upstream=processes(1 + cost, 0), **{"no-upload": processes(1.0, 10), "auto": processes(1.0, 20)})
        lines, _ = sections.cross_verdicts(record.figures)
        named.append(next(ln for ln in lines if ln.startswith("upstream") and "decode step" in ln).rsplit(": ", 1)[1])
    if want is None:
        assert not {verdicts.COSTS, verdicts.FASTER} & set(named), named
    else:
        assert sum(n == want for n in named) >= 19, named
