"""Deferred mode: each marked graph's first launch has its PLE fill on a helper thread.

Against FreeToken 0.2.1's real GraphRunner.replay, DiskRowTable.forward_host_ctx / host_fill_batch /
_fill_decode / fill and PleStore, on the fake device (large graphs block their first un-uploaded
launch behind their WAIT, as measured on the H200).
"""

from __future__ import annotations

import logging

import pytest

import freetoken_graphfix

from . import harness


def step(runner, engine, fake, bs, seed):
    table, model = engine
    return harness.decode_step(runner, table, model, fake.ctx, fake, bs, seed)


def first_launches():
    return {g["name"]: g["first_launch"] for p in freetoken_graphfix.status()["passes"] for g in p["graphs"]}


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

    original_replay, original_fill = vars(GraphRunner)["replay"], vars(DiskRowTable)["host_fill_batch"]
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    assert vars(GraphRunner)["replay"] is not original_replay  # armed: two graphs await a first launch
    for seed, bs in enumerate([2, 2, 1, 1, 2]):
        s = step(runner, engine, fake, bs, seed)
        assert not s.fired and s.ok and s.flag_after == 0, (seed, bs, s)
    assert [g.launches for g in runner.graph_map.values()] == [3, 2]
    assert not any(g.uploaded for g in runner.graph_map.values())
    launched = first_launches()
    assert launched["bs=2"].startswith("fill on helper thread") and launched["bs=1"].startswith("fill on helper")
    # every graph has launched: the hooks are gone, FreeToken's exact functions are back
    assert vars(GraphRunner)["replay"] is original_replay
    assert vars(DiskRowTable)["host_fill_batch"] is original_fill
    assert freetoken_graphfix.status()["deferred"]["hooks_armed"] is False


def test_auto_uses_deferred(install, fake, engine):
    install("auto")
    runner = harness.make_runner(engine[1], fake.default)
    s = step(runner, engine, fake, 1, seed=3)
    assert not s.fired and s.ok
    assert first_launches()["bs=1"].startswith("fill on helper thread")
    assert first_launches()["bs=2"] == "pending"


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


def test_launch_that_raises_leaves_no_release(install, fake, engine):
    table, _ = engine
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    runner.graph_map[2].fail_launch = True
    with pytest.raises(RuntimeError, match="fake cudaGraphLaunch failure"):
        step(runner, engine, fake, 2, seed=6)
    assert int(table._flag[0]) == 0  # the helper's release was withdrawn
    assert first_launches()["bs=2"] == "launch raised; release withdrawn"


def test_rebuild_gets_its_own_first_launches(install, fake, engine):
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default)
    assert not step(runner, engine, fake, 2, seed=7).fired
    assert not step(runner, engine, fake, 1, seed=8).fired
    runner.destroy_cuda_graphs()
    rebuilt = harness.make_runner(engine[1], fake.default)  # Engine.rebuild_runtime_cache
    assert freetoken_graphfix.status()["deferred"]["pending_first_launches"] == 2
    for seed, bs in enumerate([1, 2, 2], start=9):
        s = step(rebuilt, engine, fake, bs, seed)
        assert not s.fired and s.ok
    passes = freetoken_graphfix.status()["passes"]
    assert [[g["first_launch"].startswith("fill on helper thread") for g in p["graphs"]] for p in passes] == [
        [True, True], [True, True]]


def test_model_bound_before_the_shim(fake, engine, clean_shim):
    """forward_host_ctx bound on the model before install (qwen4_exp/model.py 198) still gets the
    guard: forward_host_ctx looks host_fill_batch up on the class at every call."""
    table, model = engine
    bound = table.forward_host_ctx
    freetoken_graphfix.install("deferred", device=fake)
    runner = harness.make_runner(model, fake.default)
    table.forward_host_ctx = bound  # the model holds the pre-install bound method
    s = step(runner, engine, fake, 2, seed=12)
    assert not s.fired and s.ok


def test_shadowed_host_fill_falls_back_to_warm(install, fake, engine, caplog):
    table, _ = engine
    table.host_fill_batch = table.host_fill_batch  # an instance attribute the class patch cannot reach
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


def test_deferred_adds_no_hook_after_first_launches(install, fake, engine):
    """Zero steady-state overhead: no wrapper of the shim is left on the decode path."""
    from freetoken.engine.graph import GraphRunner
    from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

    path = [(GraphRunner, "replay"), (DiskRowTable, "host_fill_batch"), (DiskRowTable, "forward_host_ctx"),
            (DiskRowTable, "fill")]
    originals = [vars(cls)[name] for cls, name in path]
    install("deferred")
    runner = harness.make_runner(engine[1], fake.default, bs_list=(1,))
    assert vars(GraphRunner)["replay"] is not originals[0]  # armed while bs=1 awaits its first launch
    step(runner, engine, fake, 1, seed=14)
    assert [vars(cls)[name] for cls, name in path] == originals
