"""Deferred mode: each marked graph's first launch has its PLE fill on a helper thread.

Against FreeToken 0.2.1's real GraphRunner.replay / pad_batch / destroy_cuda_graphs,
DiskRowTable.forward_host_ctx / host_fill_batch / _fill_decode / fill and PleStore, on the fake
device (large graphs block their first un-uploaded launch behind their WAIT, as measured on the H200).
"""

from __future__ import annotations

import gc
import logging
import threading
import weakref

import pytest
import torch

import freetoken_graphfix
from freetoken_graphfix import shim
from tests.helpers import harness


def step(runner, engine, fake, bs, seed, **kwargs):
    table, model = engine
    return harness.decode_step(runner, table, model, fake.ctx, fake, bs, seed, **kwargs)


def first_launches():
    return {g["name"]: g["first_launch"] for p in freetoken_graphfix.status()["passes"] for g in p["graphs"]}


def pending():
    return freetoken_graphfix.status()["deferred"]["pending_first_launches"]


def marked(graph) -> bool:
    return "replay" in vars(graph)


def test_unprotected_first_launch_blocks(install, fake, engine):
    """The negative control: with the upload skipped, the first launch waits for the watchdog."""
    install("skip")
    runner = harness.make_runner(engine[1], fake.default)
    first = step(runner, engine, fake, 2, seed=1)
    assert first.fired and first.launch_s >= 0.9
    assert not first.ok  # the watchdog's release let the graph read stale rows


def test_first_launch_released_by_helper_then_normal_path(install, fake, engine):
    from freetoken.engine.graph import GraphRunner
    from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

    table = engine[0]
    classes = (vars(GraphRunner)["replay"], vars(DiskRowTable)["host_fill_batch"])
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    # the marks sit on FreeToken's own objects; its classes are never touched
    assert all(marked(g) for g in runner.graph_map.values()) and "host_fill_batch" in vars(table)
    assert pending() == 2
    for seed, bs in enumerate([2, 2, 1, 1, 2]):
        s = step(runner, engine, fake, bs, seed)
        assert not s.fired and s.ok and s.flag_after == 0, (seed, bs, s)
        assert (vars(GraphRunner)["replay"], vars(DiskRowTable)["host_fill_batch"]) == classes
    assert [g.launches for g in runner.graph_map.values()] == [3, 2]
    assert not any(g.uploaded for g in runner.graph_map.values())
    launched = first_launches()
    assert launched["bs=2"].startswith("fill on helper thread") and launched["bs=1"].startswith("fill on helper")
    # every graph has launched: nothing of the shim is left on them or on the table
    assert not any(marked(g) for g in runner.graph_map.values()) and "host_fill_batch" not in vars(table)
    assert pending() == 0


def test_a_launched_graph_is_untouched_while_another_waits(install, fake, engine):
    """A graph that is never launched (bs 2 here, bs 256 on a single-user H200 server) leaves every
    launched graph with FreeToken's own replay: only the table's stager stays, one call a step."""
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    for seed in range(3):
        assert step(runner, engine, fake, 1, seed).ok
    assert not marked(runner.graph_map[1]) and marked(runner.graph_map[2])
    assert "host_fill_batch" in vars(engine[0]) and pending() == 1


def test_auto_uses_deferred(install, fake, engine):
    install("auto")
    runner = harness.make_runner(engine[1], fake.default)
    s = step(runner, engine, fake, 1, seed=3)
    assert not s.fired and s.ok
    assert first_launches()["bs=1"].startswith("fill on helper thread")
    assert first_launches()["bs=2"] == "pending"


def test_padded_batch_protects_the_graph_it_runs_on(install, fake, engine):
    """FreeToken pads 3 requests to the bs-4 graph (pad_batch): that graph's first launch is the
    guarded one, and its fill stages the 3 real requests' rows exactly."""
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default, bs_list=(1, 2, 4))
    s = step(runner, engine, fake, 3, seed=4, pad=True)
    assert s.padded_size == 4 and not s.fired and s.ok and s.flag_after == 0
    assert first_launches()["bs=4"].startswith("fill on helper thread")
    assert [first_launches()[f"bs={bs}"] for bs in (2, 1)] == ["pending", "pending"]


def test_fill_that_raises(install, fake, engine, monkeypatch):
    """The helper's fill raises: the flag is released (no WAIT left pending) and the error surfaces
    on the engine thread after the launch returns; the next step works."""
    from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

    table, _ = engine
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    real_fill = DiskRowTable.fill

    def broken(self, runs, *, graph):
        raise OSError("disk read failed")

    monkeypatch.setattr(DiskRowTable, "fill", broken)
    with pytest.raises(OSError, match="disk read failed"):
        step(runner, engine, fake, 2, seed=4)
    runner.stream.synchronize()  # the graph ran to completion: its WAIT was released
    assert int(table._flag[0]) == 0
    assert "fill raised OSError" in first_launches()["bs=2"]
    monkeypatch.setattr(DiskRowTable, "fill", real_fill)
    s = step(runner, engine, fake, 2, seed=5)
    assert not s.fired and s.ok and s.flag_after == 0


def test_launch_that_raises_keeps_the_mark_and_leaves_no_release(install, fake, engine):
    """cudaGraphLaunch itself raises: the helper's release is withdrawn (nothing is pending), and
    the graph's retry, its real first launch, is protected again."""
    table, _ = engine
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    runner.graph_map[2].fail_launch = True
    with pytest.raises(RuntimeError, match="fake cudaGraphLaunch failure"):
        step(runner, engine, fake, 2, seed=6)
    assert int(table._flag[0]) == 0
    assert first_launches()["bs=2"] == "launch raised; release withdrawn, still pending"
    assert marked(runner.graph_map[2]) and pending() == 2
    runner.graph_map[2].fail_launch = False
    retry = step(runner, engine, fake, 2, seed=7)
    assert not retry.fired and retry.ok and retry.flag_after == 0
    assert first_launches()["bs=2"].startswith("fill on helper thread")


def raised_before_launch(install, fake, engine, bs, seed):
    """A deferred runner whose first dispatch at ``bs`` raises in GraphRunner.replay before g.replay()."""
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    runner.attn_backend.fail_next_replay = True
    with pytest.raises(RuntimeError, match="prepare_for_replay failed before the launch"):
        step(runner, engine, fake, bs, seed)
    return runner


def test_launch_that_raises_before_cuda_graph_launch(install, fake, engine):
    """GraphRunner.replay raises before g.replay() (prepare_for_replay here, copy_from alike): the
    graph was never launched, so its mark stays, no release was made, and the retry is protected."""
    table, _ = engine
    runner = raised_before_launch(install, fake, engine, bs=1, seed=8)
    assert int(table._flag[0]) == 0 and runner.graph_map[1].launches == 0
    assert marked(runner.graph_map[1]) and first_launches()["bs=1"] == "pending"
    retry = step(runner, engine, fake, 1, seed=9)
    assert not retry.fired and retry.ok and retry.flag_after == 0


def test_rebuild_gets_its_own_first_launches(install, fake, engine):
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    assert not step(runner, engine, fake, 2, seed=7).fired
    assert not step(runner, engine, fake, 1, seed=8).fired
    runner.destroy_cuda_graphs()
    rebuilt = harness.make_runner(engine[1], fake.default)  # Engine.rebuild_runtime_cache
    assert pending() == 2
    for seed, bs in enumerate([1, 2, 2], start=9):
        s = step(rebuilt, engine, fake, bs, seed)
        assert not s.fired and s.ok
    passes = freetoken_graphfix.status()["passes"]
    assert [[g["first_launch"].startswith("fill on helper thread") for g in p["graphs"]] for p in passes] == [
        [True, True], [True, True]]


def test_rebuild_while_graphs_are_pending(install, fake, engine):
    """A rebuild destroys graphs that never launched: they stop counting, and the new pass's graphs
    are guarded from the start (the table's stager is kept for them)."""
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    assert step(runner, engine, fake, 2, seed=1).ok  # bs 1 never launches before the rebuild
    runner.destroy_cuda_graphs()  # drops the graphs and runs gc.collect()
    assert pending() == 0
    rebuilt = harness.make_runner(engine[1], fake.default)
    assert pending() == 2 and "host_fill_batch" in vars(engine[0])
    for seed, bs in enumerate([1, 2], start=2):
        s = step(rebuilt, engine, fake, bs, seed)
        assert not s.fired and s.ok and s.flag_after == 0
    assert pending() == 0 and "host_fill_batch" not in vars(engine[0])


def test_an_earlier_runner_stays_protected_after_a_new_capture(install, fake, engine):
    """Capturing again while an earlier runner's graphs await their first launch leaves them guarded."""
    install("deferred")
    first = harness.make_runner(engine[1], fake.default)
    second = harness.make_runner(engine[1], fake.default)
    assert pending() == 4
    for runner in (first, second):
        for seed, bs in enumerate([2, 1]):
            s = step(runner, engine, fake, bs, seed)
            assert not s.fired and s.ok and s.flag_after == 0
    assert pending() == 0
    assert all(g["first_launch"].startswith("fill on helper thread")
               for p in freetoken_graphfix.status()["passes"] for g in p["graphs"])


def test_model_bound_before_the_shim(fake, engine, clean_shim):
    """forward_host_ctx bound on the model before install (qwen4_exp/model.py 198) still gets the
    guard: forward_host_ctx calls self.host_fill_batch at every dispatch."""
    table, model = engine
    bound = table.forward_host_ctx
    freetoken_graphfix.install("deferred", device=fake)
    runner = harness.make_runner(model, fake.default)
    table.forward_host_ctx = bound  # the model holds the pre-install bound method
    s = step(runner, engine, fake, 2, seed=12)
    assert not s.fired and s.ok


def test_shadowed_host_fill_falls_back_to_warm(install, fake, engine, caplog):
    table, _ = engine
    table.host_fill_batch = table.host_fill_batch  # an instance attribute the guard would replace
    install("deferred")
    with caplog.at_level(logging.WARNING, "freetoken_graphfix"):
        runner = harness.make_runner(engine[1], fake.default)
    assert ("graph bs=2 cannot be deferred (PLE wait-sync; cannot defer PLE wait-sync); "
            "protected by a warm replay instead") in caplog.text
    recs = freetoken_graphfix.status()["passes"][0]["graphs"]
    assert [r["action"] for r in recs] == ["warm", "warm"]
    assert "cannot defer PLE wait-sync" in recs[0]["reason"]
    assert not step(runner, engine, fake, 2, seed=13).fired


def test_bare_launch_of_a_deferred_graph_is_uploaded(install, fake, engine, caplog):
    """A marked graph launched outside forward_host_ctx has no fill to move: upload it first."""
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    batch, _ = harness.make_batch(1, seed=15)
    with fake.stream(runner.stream), fake.ctx.forward_batch(batch):
        runner.replay(batch)  # the real GraphRunner.replay, no forward_host_ctx around it
    assert runner.graph_map[1].uploaded and runner.graph_map[1].launches == 1
    assert first_launches()["bs=1"] == "uploaded at first launch: no fill staged"
    assert "no PLE fill staged" in caplog.text
    fake.halt.set()  # nothing will release the WAIT of that bare launch


def test_a_fill_that_already_ran_is_not_staged_again(install, fake, engine):
    """Another runner's graph of the same bs stages a fill that FreeToken's normal path then runs; a
    bare launch of the pending graph must not take that spent fill for its own release."""
    install("deferred")
    pending_runner = harness.make_runner(engine[1], fake.default, bs_list=(1,))
    other = harness.make_runner(engine[1], fake.default, bs_list=(1,))
    assert step(other, engine, fake, 1, seed=1).ok  # other's first launch
    assert step(other, engine, fake, 1, seed=2).ok  # staged (bs 1 is pending elsewhere), run after the launch
    batch, _ = harness.make_batch(1, seed=3)
    with fake.stream(pending_runner.stream), fake.ctx.forward_batch(batch):
        pending_runner.replay(batch)
    assert pending_runner.graph_map[1].uploaded
    assert freetoken_graphfix.status()["passes"][0]["graphs"][0]["first_launch"] == (
        "uploaded at first launch: no fill staged")
    fake.halt.set()


@pytest.mark.parametrize("inference", [True, False])
def test_helper_runs_on_the_engine_threads_device_and_inference_mode(install, fake, engine, monkeypatch,
                                                                      inference):
    """The helper mirrors the engine thread's CUDA device (no context on another GPU with --gpu 1)
    and its inference mode (thread-local; FreeToken's own worker fill runs under inference_mode)."""
    from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

    seen = []
    real_fill = DiskRowTable.fill

    def recording_fill(self, runs, *, graph):
        seen.append((threading.current_thread().name, torch.is_inference_mode_enabled()))
        return real_fill(self, runs, graph=graph)

    monkeypatch.setattr(DiskRowTable, "fill", recording_fill)
    fake.device_index = 1  # the engine runs on GPU 1
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    with torch.inference_mode(inference):
        s = step(runner, engine, fake, 2, seed=3)
    assert s.ok and not s.fired
    assert seen == [("graphfix-first-fill", inference)]
    assert fake.helper_devices == [1]


def test_uninstall_with_pending_first_launches_uploads_them(install, fake, engine):
    """uninstall() restores FreeToken, whose protection is the upload: graphs still awaiting their
    first launch get it, so their first launch cannot deadlock, and status() says so."""
    table, model = engine
    install("deferred")
    runner = harness.make_runner(model, fake.default)
    assert step(runner, engine, fake, 2, seed=1).ok
    freetoken_graphfix.uninstall()
    st = freetoken_graphfix.status()
    assert st["deferred"]["at_uninstall"] == "uploaded 1 graph(s) still awaiting their first launch"
    assert runner.graph_map[1].uploaded and not runner.graph_map[2].uploaded
    assert shim.latest.passes[0].graphs[1].first_launch == "uploaded at uninstall() (FreeToken's protection)"
    assert not marked(runner.graph_map[1]) and "host_fill_batch" not in vars(table)
    s = step(runner, engine, fake, 1, seed=2)  # FreeToken's own path now, on an uploaded graph
    assert not s.fired and s.ok and s.flag_after == 0


def test_uninstall_with_nothing_pending_uploads_nothing(install, fake, engine):
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    for seed, bs in enumerate([2, 1]):
        assert step(runner, engine, fake, bs, seed).ok
    freetoken_graphfix.uninstall()
    assert freetoken_graphfix.status()["deferred"]["at_uninstall"] == ""
    assert not any(g.uploaded for g in runner.graph_map.values())


def test_a_dropped_engine_is_not_kept_alive(install, fake, tmp_path):
    """Nothing of the guard keeps a dropped (or rebuilt) engine's runner, graphs or PLE table alive
    while their graphs await a first launch: no leak per rebuild."""
    install("deferred")
    table = harness.make_table(harness.write_rows(tmp_path))
    runner = harness.make_runner(harness.PleModel(table, fake, fake.ctx), fake.default)
    refs = [weakref.ref(table), weakref.ref(runner), weakref.ref(runner.graph_map[1])]
    assert pending() == 2
    del table, runner
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    assert pending() == 0


def test_deferred_adds_no_hook_after_first_launches(install, fake, engine):
    """Zero steady-state overhead: no wrapper of the shim is left on the decode path."""
    from freetoken.engine.graph import GraphRunner
    from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

    path = [(GraphRunner, "replay"), (DiskRowTable, "host_fill_batch"), (DiskRowTable, "forward_host_ctx"),
            (DiskRowTable, "fill")]
    originals = [vars(cls)[name] for cls, name in path]
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default, bs_list=(1,))
    assert marked(runner.graph_map[1])  # armed while bs=1 awaits its first launch
    step(runner, engine, fake, 1, seed=14)
    assert [vars(cls)[name] for cls, name in path] == originals
    assert vars(runner.graph_map[1]).keys() & {"replay"} == set() and "host_fill_batch" not in vars(engine[0])


def test_a_stale_fill_of_another_size_is_never_used_for_a_first_launch(install, fake, engine, caplog):
    """A dispatch at bs 2 that raised before its launch leaves its staged fill unrun; a bare launch of
    the bs 1 graph must not take that fill (bs 2's rows) to release its WAIT: it is uploaded
    instead, and the stale fill never runs."""
    table, _ = engine
    runner = raised_before_launch(install, fake, engine, bs=2, seed=21)
    stale = vars(table)["host_fill_batch"].staged
    assert stale is not None and stale.bs == 2 and not stale.ran
    batch, _ = harness.make_batch(1, seed=22)
    with fake.stream(runner.stream), fake.ctx.forward_batch(batch):
        runner.replay(batch)  # no forward_host_ctx: nothing staged for bs 1
    assert runner.graph_map[1].uploaded and not stale.ran
    assert first_launches()["bs=1"] == "uploaded at first launch: no fill staged"
    fake.halt.set()  # nothing will release that bare launch's WAIT


def test_a_table_whose_waiting_graphs_all_died_is_left_as_shipped(install, fake, engine):
    """Every graph reading the table dies before its first launch (destroy_cuda_graphs, no recapture):
    the table's next dispatch finds no graph waiting and takes FreeToken's own host_fill_batch
    back, so no stand-in stays on the decode path for the engine's life."""
    table, _ = engine
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    assert "host_fill_batch" in vars(table) and pending() == 2
    runner.destroy_cuda_graphs()
    assert pending() == 0
    batch, _ = harness.make_batch(2, seed=23)
    table.host_fill_batch(batch, False)  # an eager dispatch: the stager sees no graph waiting
    assert "host_fill_batch" not in vars(table)


def test_a_capture_pass_that_raised_says_its_graphs_never_launched(install, fake, engine, monkeypatch):
    """A capture loop that raises after its graphs were decided (deferred) built no runner: those
    graphs can never launch, and status() must say so, not show them pending for ever."""
    from freetoken.engine.graph import GraphRunner

    install("deferred")
    real = GraphRunner._reset_moe_offload_cache

    def fails_at_the_end(self):
        if len(getattr(self, "graph_map", {})) == 2:  # both graphs captured and decided
            raise RuntimeError("capture failed after the last graph")
        return real(self)

    monkeypatch.setattr(GraphRunner, "_reset_moe_offload_cache", fails_at_the_end)
    with pytest.raises(RuntimeError, match="capture failed"):
        harness.make_runner(engine[1], fake.default)
    graphs = freetoken_graphfix.status()["passes"][-1]["graphs"]
    assert [g["action"] for g in graphs] == ["deferred", "deferred"]
    assert [g["first_launch"] for g in graphs] == ["the capture pass raised: never launched"] * 2
    assert pending() == 0


def test_a_staged_fill_goes_to_one_first_launch_only(tmp_path):
    """The fill staged for a step is the release of that step's WAIT alone: a first launch that took it
    and then raised (so FreeToken never ran it) must not leave it for a later bare launch, which
    would release its own WAIT with another step's rows."""
    from freetoken_graphfix.deferred import FillStager, StagedFill

    stager = FillStager.of(harness.make_table(harness.write_rows(tmp_path)))
    stager.staged = fill = StagedFill(lambda: None, 1)
    assert stager.take() is fill and stager.take() is None
