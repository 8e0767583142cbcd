"""What the GPU tests assert, as functions of what they measured, so that CPU CI runs them too.

Each GPU test measures on the GPU, keeps what it measured (``gpu_records.keep``: a bench record, read
back as ``bench report`` reads it; ``keep_steps``: the test's own steps), and calls the checks
``CHECKS`` lists for it. ``test_gpu_records`` runs the very same checks on CPU against what the last
passing H200 run wrote (``tests/records/``), every figure and verdict derived again by the current
rules: a renamed attribute, a moved key or a record the current code cannot read turns CI red, not
only the next GPU run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import pytest

from freetoken_graphfix_bench import arms as bench_arms
from freetoken_graphfix_bench import records, verdicts
from freetoken_graphfix_bench.engine import headline
from freetoken_graphfix_bench.engine.figures import EngineFigures, figures_of
from freetoken_graphfix_bench.registry import report_of
from freetoken_graphfix_bench.rig import figures as rig_figures
from freetoken_graphfix_bench.rig import report as rig_report

Measured = Any  # a bench record (records.Record), or a GPU test's own steps (a dict)
CHECKS: dict[str, list[Callable[[Measured], None]]] = {}


def check(*names: str) -> Callable[[Callable[[Measured], None]], Callable[[Measured], None]]:
    """Register a check for the records ``names``."""

    def add(fn: Callable[[Measured], None]) -> Callable[[Measured], None]:
        for name in names:
            CHECKS.setdefault(name, []).append(fn)
        return fn

    return add


def for_record(name: str) -> list[Any]:
    """The checks of record ``name`` as pytest parameters, named after each check."""
    return [pytest.param(fn, id=fn.__name__) for fn in CHECKS[name]]


def engine(m: records.EngineRecord) -> tuple[records.EngineCase, EngineFigures]:
    """The record's one case and its figures, by the current rules."""
    (case,) = m.cases
    return case, figures_of(case)


# ---------------------------------------------------------------- FreeToken's real engine (bench engine)

ENGINE_WAIT = ("engine-small", "engine-large", "engine-hybrid-locked")
ENGINE_COPIES = ("engine-small", "engine-llama")


@check(*ENGINE_WAIT)
def protected_arms_never_block_and_keep_upstreams_tokens(m: Measured) -> None:
    _, figures = engine(m)
    assert headline.failures(figures) == []
    protected = [arm for arm, s in figures.arms.items() if s.protected]
    assert "upstream" in protected and "auto" in protected, protected
    for arm in protected:
        assert figures.arms[arm].fires == 0 and figures.arms[arm].same_tokens_as_reference, arm


@check("engine-large", "engine-hybrid-locked")
def never_uploaded_graphs_block(m: Measured) -> None:
    """The negative control: without any protection the 320-layer decode graphs' first launches
    block behind their own WAIT until the watchdog releases it (FreeToken's #697 deadlock)."""
    arms = engine(m)[1].arms
    ran = [arm for arm in bench_arms.never_uploaded() if arm in arms]
    assert ran, f"no never-uploaded arm ran ({sorted(arms)}): this record holds no negative control"
    for arm in ran:
        s = arms[arm]
        assert not s.protected and s.errors == [], (arm, s.errors)
        assert s.fires >= 1, f"{arm}: no launch blocked; this test could not have failed"
        assert max(s.first_launch_ms.values()) > 3900, (arm, s.first_launch_ms)


@check("engine-large", "engine-hybrid-locked")
def the_shim_defers_the_ple_wait_alone(m: Measured) -> None:
    """#775's configuration (NVFP4 experts, MoE offload or hybrid): auto defers every graph's first
    launch for the PLE WAIT and for nothing else; under hybrid with locked layers both kinds of
    self-released WAIT (CPU-MoE executor, locked fetch) were in the graphs it deferred."""
    case, figures = engine(m)
    actions = [a for r in case.runs["auto"] for a in r.shim_actions()]
    assert actions and set(actions) == {"deferred"}, actions
    if "hybrid" in case.ft_args:
        for arm, s in figures.arms.items():
            assert s.waits["cpu_moe"][0] > 0 and s.waits["locked_fetch"][0] > 0, (arm, s.waits)


@check("engine-small")
def small_model_never_blocks_and_auto_costs_nothing(m: Measured) -> None:
    """48 layers never block even without protection; auto's graph replays stay close to the
    never-uploaded arm's. The 2% bound catches a protection left on the decode path (FreeToken's
    fill-worker path costs 19% per step at this size); the 0.3% target is ``bench engine``'s."""
    arms = engine(m)[1].arms
    for arm in bench_arms.never_uploaded():
        assert arms[arm].fires == 0 and arms[arm].same_tokens_as_reference, arm
    assert arms["auto"].processes[0].figures["replay"]["2"] == pytest.approx(
        arms["no-upload"].processes[0].figures["replay"]["2"], rel=0.02)


@check(*ENGINE_COPIES)
def copies_of_the_engine_graphs_replay_in_every_process(m: Measured) -> None:
    """Every timed process made fresh executables of each engine graph, uploaded and never
    uploaded, and replayed them with the WAIT released per launch: none blocked, none failed, and
    each replays within a few percent of the engine's own graph (the same kernels)."""
    case, figures = engine(m)
    for arm, rs in case.runs.items():
        for r in rs:
            assert r.copies_error is None and r.replay_error is None, (arm, r.copies_error)
            for bs, copied in r.copies_gpu_ms.items():
                own = statistics.median(r.replay_gpu_ms[bs])
                for kind in ("uploaded", "never"):
                    assert len(copied[kind]) == case.copies, (arm, bs, kind)
                    assert all(len(t) == 50 for t in copied[kind]), (arm, bs, kind)
                    for times in copied[kind]:
                        assert statistics.median(times) == pytest.approx(own, rel=0.05), (arm, bs, kind)
    assert set(figures.upload_idle) == {str(bs) for bs in case.runs["upstream"][0].graph_bs}


@check(*ENGINE_COPIES)
def the_decode_loop_launches_every_copy_and_keeps_the_tokens(m: Measured) -> None:
    """In every timed process, the graph steps after each size's first launch went through the
    engine's own executable and every copy, in the schedule's cycle, never one twice in a row; the
    upload in the decode loop has a figure per bs from every process; and where a traced process
    ran (its own graphs only), the copies' loop gave its tokens."""
    case, figures = engine(m)
    labels_want = {"own", *(f"{kind}:{i}" for kind in ("uploaded", "never") for i in range(case.copies))}
    for arm, rs in case.runs.items():
        for r in rs:
            controls = {"control:0", "control:1"} if r.control_spin else set()
            for bs, labels in r.step_exec.items():
                assert set(labels) == labels_want | controls, (arm, bs)
                assert all(a != b for a, b in zip(labels, labels[1:], strict=False)), (arm, bs)
                assert len(r.launch_gpu_ms[bs]) == len(labels) == len(r.step_gpu_ms[bs])
    up = figures.upload_in_loop
    assert set(up["launch"]) >= {"2", "1"} and all(f.processes >= 2 for f in up["launch"].values())
    if any(case.traced.values()):
        assert {s.copies_tokens for s in figures.arms.values()} == {"same"}


@check("engine-small")
def the_positive_control_is_read_back_in_the_decode_loop(m: Measured) -> None:
    """Every timed process ran the positive control (a spin of about 2% of the graph after two more
    never-uploaded copies, in the cycle); in each metric and bs the loop read it within its interval
    of what it added, and resolved it (a cost, at its size) in at least one: the loop could have seen
    a cost of #775's size there. Where the interval is wider than the control (the 48-layer model's
    bs 1 on the H200, ±1.2% from two copies a kind) the report leaves the upload unjudged."""
    case, judged = engine(m)
    for arm, rs in case.runs.items():
        for r in rs:
            assert r.control_spin is not None and r.control_spin.spin_cycles > 0 and r.control_spin.spin_us > 0, arm
    ctl = judged.control_in_loop
    assert set(ctl) == {"step", "launch"}, ctl
    figures = [(metric, bs, f) for metric, by_bs in ctl.items() for bs, f in by_bs.items()]
    assert {bs for _, bs, _ in figures} >= {"2", "1"}
    for metric, bs, f in figures:
        assert 0.005 < f.added < 0.03, (metric, bs, f.added)
        assert abs(f.ratio - 1 - f.added) <= f.half, (metric, bs, f)
    assert any(verdicts.recovered(f.ratio, f.half, f.added) for _, _, f in figures), figures


@check("engine-llama")
def at_775s_context_the_control_is_recovered_in_every_figure(m: Measured) -> None:
    """#775's 65,536-token context makes the llama's decode step GPU-bound (at 512 tokens the host set
    its pace and hid a GPU-side spin): the positive control is read back within its interval and
    resolved in every metric and bs, so every upload figure is judged."""
    case, judged = engine(m)
    assert case.context == 65536 and case.decode_steps == 200, (case.context, case.decode_steps)
    figures = [(metric, bs, f) for metric, by_bs in judged.control_in_loop.items() for bs, f in by_bs.items()]
    assert {(metric, bs) for metric, bs, _ in figures} == {(k, b) for k in ("step", "launch") for b in ("2", "1")}
    for metric, bs, f in figures:
        assert abs(f.ratio - 1 - f.added) <= f.half, (metric, bs, f)
        assert verdicts.recovered(f.ratio, f.half, f.added), (metric, bs, f)


@check("engine-llama")
def a_model_without_the_wait_gets_no_op_everywhere_and_upstreams_tokens(m: Measured) -> None:
    case, figures = engine(m)
    assert not figures.wait_case and headline.failures(figures) == [] and not report_of(m).failed
    for arm, s in figures.arms.items():
        assert s.protected and s.same_tokens_as_reference and s.fires == 0, arm
    assert {a for r in case.runs["auto"] for a in r.shim_actions()} == {"no-op"}


@check("engine-llama")
def the_kernel_timeline_comes_from_the_real_engine(m: Measured) -> None:
    """The traced runs' graph launches are found in Kineto's trace (one correlation id per launch),
    with every stream of the decode graph and a gap per stream, from two traced processes per arm."""
    for arm, s in engine(m)[1].arms.items():
        t = s.timeline
        assert {"2", "1"} <= set(t.by_bs) and t.processes == 2, (arm, t)
        for bs in ("2", "1"):  # each figure: (median, min, max) over the traced processes
            f = t.by_bs[bs]
            assert f.launches[1] >= 6 and f.graph_kernels[0] > 10 and f.gap_us, (arm, f)
            assert 0 < f.busy_us[1] and f.step_kernels[0] >= f.graph_kernels[0], (arm, f)
            assert all(len(q) == 101 for q in f.gap_quantiles.values()), (arm, f)
        assert s.free_mib_after_capture > 0 and set(s.first_launch_mib) >= {"1", "2"}


# ---------------------------------------------------------------- a real ft serve (bench serve)

def served(m: records.ServeRecord):
    from freetoken_graphfix_bench.serve.report import judge as serve_judge

    (case,) = m.cases
    return case, serve_judge(case)


@check("serve")
def skip_hangs_and_is_stopped_cleanly(m: Measured) -> None:
    case, verdict = served(m)
    skip = case.runs["skip"]
    assert verdict.wait_case, "the servers' graphs held no host-released WAIT: no negative control"
    assert skip.hung >= 1, "skip answered: at this size it could not have failed"
    assert skip.outlived == [] and skip.stragglers == [], skip
    assert verdict.problems["skip"] == []


@check("serve")
def protected_arms_serve_through_a_rebuild(m: Measured) -> None:
    case, verdict = served(m)
    for arm in ("upstream", "auto"):
        run = case.runs[arm]
        assert verdict.problems[arm] == [], (arm, verdict.problems[arm])
        assert run.hung == 0 and run.rebuild["status"] == "ok", arm
        assert run.cache_status["num_pages"] == run.rebuild["num_pages"], arm


@check("serve")
def auto_decides_both_capture_passes_in_one_process(m: Measured) -> None:
    """The scheduler process of auto's server captured at start-up and again at the rebuild, and its
    shim deferred every graph of both passes."""
    passes = served(m)[0].runs["auto"].passes()
    assert [p.index for _, p in passes] == [0, 1] and len({pid for pid, _ in passes}) == 1, passes
    assert {g.action for _, p in passes for g in p.graphs} == {"deferred"}, passes
    assert not report_of(m).failed  # bench's own verdict agrees


# -------------------------------------------- the rig: FreeToken's real GraphRunner and DiskRowTable

PROTECTED_MODES = {"auto": "deferred", "deferred": "deferred", "warm": "warm", "upload": "upload"}


@check("rig-modes")
def protected_modes_never_block_and_match_upload(m: Measured) -> None:
    """10,000 kernels behind the PLE WAIT, four steps in serving order per mode: FreeToken's own
    upload is the reference; every protected mode takes its action, never blocks, gives its logits
    bit for bit and leaves the flag at 0."""
    modes = m
    assert [g for g in modes["upload"]["actions"]] == ["upload", "upload"]
    assert not any(modes["upload"]["fired"]), "FreeToken's own upload must not block"
    for mode, action in PROTECTED_MODES.items():
        r = modes[mode]
        assert r["actions"] == [action, action], (mode, r["actions"])
        assert r["fired"] == [False] * 4, (mode, r["launch_ms"])
        assert r["logits_equal_upload"] == [True] * 4 and r["flag"] == 0, mode


@check("rig-modes")
def skip_blocks_the_first_launch(m: Measured) -> None:
    """The negative control: never uploaded, the 10,000-kernel graph's first launch blocks."""
    r = m["skip"]
    assert r["actions"] == ["exposed", "exposed"]
    assert r["fired"][0] and r["launch_ms"][0] > 1900, r
    assert not r["fired"][2]  # later launches of that graph never block


@check("rig-64k")
def deferred_at_64k_kernels(m: Measured) -> None:
    r = m
    assert r["fired"] == [False, False], r
    assert r["first_launch"].startswith("fill on helper"), r


@check("rig-unknown-owner")
def unknown_owner_warm_replayed(m: Measured) -> None:
    """A raw row_store.wait_reset (no known owner) in a 10,000-kernel graph gets a warm replay; the
    host then releases each real launch only after it returns, and nothing blocks."""
    r = m
    assert r["action"] == "warm"
    assert r["fired"] == [False, False], "launch blocked until the watchdog released it"
    assert r["flags"] == [0, 0]


@check("rig-bench")
def bench_record_every_instance_measured_and_only_skip_blocked(m: Measured) -> None:
    """``bench rig``'s own measuring path on a graph large enough to block: every instance of every
    mode captured through the shim, launched and timed; only ``skip`` (and the positive control,
    skip's graphs plus a spin) blocks, and its bs 2 graph (captured first) blocks in every instance."""
    rows = {(r.arm, r.bs): r for r in rig_figures.rows(m)}
    instances, reps = m.config.instances, m.config.reps
    assert rows["skip", "2"].blocked == instances and rows["skip", "2"].actions == ["exposed"]
    for (arm, bs), r in rows.items():
        assert r.n == instances * reps and r.instances == instances
        assert r.logits_equal_upload, (arm, bs)
        if arm not in ("skip", rig_figures.CONTROL):
            assert r.blocked == 0, (arm, bs, r.first_launch_ms)
    assert rows["auto", "2"].actions == rows["auto", "1"].actions == ["deferred"]


@check("rig-control")
def the_positive_control_is_recovered_so_the_rig_could_see_775s_cost(m: Measured) -> None:
    """The default rig (1090 kernels over 4 streams behind the PLE WAIT, every mode): a spin of
    about 2% of the step in never-uploaded graphs is read back within its interval at every bs, and
    the verdict is one (not "none")."""
    table = rig_figures.rows(m)
    controls = [r for r in table if r.arm == rig_figures.CONTROL]
    assert len(controls) == len(m.config.batch_sizes), rig_report.control_line(table)
    assert all(0.015 < r.added < 0.025 for r in controls), [r.added for r in controls]
    assert all(rig_report.control_recovered(r) for r in controls), rig_report.control_line(table)
    assert not rig_report.verdict(table).startswith("verdict: none"), rig_report.verdict(table)


# ---------------------------------------------------------------- FreeToken 0.1.3

@check("013-rig")
def unprotected_013_first_launches_block(m: Measured) -> None:
    assert m["freetoken"] == "0.1.3"
    assert m["None"]["fired"] == [True, True, False, False], m["None"]


@check("013-rig")
def protected_013_never_block_and_match_gate_mode(m: Measured) -> None:
    for mode, action in (("auto", "deferred"), ("warm", "warm"), ("upload", "upload")):
        r = m[mode]
        assert r["actions"] == [action, action], (mode, r)
        assert r["fired"] == [False] * 4, (mode, r)
        assert all(r["logits_equal_gate"]), (mode, r)


@check("013-engine")
def real_013_engine_unprotected_first_launches_block(m: Measured) -> None:
    case, figures = engine(m)
    assert {r.freetoken for rs in case.runs.values() for r in rs if r.ok} == {"0.1.3"}
    upstream = figures.arms["upstream"]
    assert not upstream.protected and upstream.errors == [], upstream
    assert upstream.fires >= 1 and max(upstream.first_launch_ms.values()) > 3900, upstream


@check("013-engine")
def real_013_engine_auto_never_blocks_and_matches_gate_mode(m: Measured) -> None:
    auto = engine(m)[1].arms["auto"]
    assert auto.errors == [] and auto.fires == 0, auto
    assert auto.reference == "gate" and auto.same_tokens_as_reference, auto
    assert not report_of(m).failed  # bench's own verdict agrees
