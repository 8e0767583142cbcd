"""The warm mode's logic on the fake device: threaded release, bounded time, every flag at 0."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

import freetoken_graphfix
from freetoken_graphfix import detect
from freetoken_graphfix.config import Mode
from freetoken_graphfix.errors import WarmReplayError
from freetoken_graphfix.warm import warm_replay
from tests.helpers import harness
from tests.helpers.fakecuda import FakeGraph, Node


def wait(flag):
    return detect.Wait(flag, None, "unknown (test)", detect.Release.AFTER_LAUNCH, False)


def graph_with(fake, *flags):
    return FakeGraph(fake, nodes=[Node("wait", ptr=f.data_ptr()) for f in flags])


def test_large_graph_first_launch_does_not_block(fake):
    flag = torch.zeros(1, dtype=torch.int64)
    g = graph_with(fake, flag)
    out = warm_replay(g, fake.default, [wait(flag)], fake, timeout_s=2.0)
    assert out.ok and out.finished and out.detail == ""
    assert int(flag[0]) == 0 and g.launches == 1 and not g.uploaded


def test_several_waits_on_one_flag_each_get_one_release(fake):
    flag, other = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    g = graph_with(fake, flag, other, flag)
    out = warm_replay(g, fake.default, [wait(flag), wait(other), wait(flag)], fake, timeout_s=2.0)
    assert out.ok, out.detail
    assert int(flag[0]) == 0 and int(other[0]) == 0


def test_wait_never_consumed_is_reported_once_the_graph_finished(fake):
    """A recorded WAIT that the graph never consumes: the flag is reset to 0 only once the graph has
    finished (nothing can be pending on it then), and the report names the flag."""
    flag = torch.zeros(1, dtype=torch.int64)
    g = FakeGraph(fake)  # holds no WAIT node: the release is never consumed
    out = warm_replay(g, fake.default, [wait(flag)], fake, timeout_s=2.0)
    assert not out.ok and out.finished
    assert out.detail == (f"WAIT #0 on flag {hex(flag.data_ptr())} (unknown (test)) was released but never "
                          "consumed by the finished graph; reset to 0")
    assert int(flag[0]) == 0  # no surplus release left for the next real step


def slow_graph(fake, flag, head_s):
    """GPU work of ``head_s`` seconds ahead of the WAIT: a shared or profiled GPU, a large head."""
    import time

    return FakeGraph(fake, large=False,  # its launch returns at once: the WAIT is still ahead on the GPU
                     nodes=[Node("kernel", fn=lambda: time.sleep(head_s)), Node("wait", ptr=flag.data_ptr())])


def test_slow_gpu_with_two_waits_on_one_flag(fake):
    """The helper keeps waiting for a late consume before it releases the next WAIT on the flag."""
    import time

    flag = torch.zeros(1, dtype=torch.int64)
    g = FakeGraph(fake, large=False, nodes=[Node("kernel", fn=lambda: time.sleep(0.3)),
                                            Node("wait", ptr=flag.data_ptr()),
                                            Node("kernel", fn=lambda: time.sleep(0.3)),
                                            Node("wait", ptr=flag.data_ptr())])
    out = warm_replay(g, fake.default, [wait(flag), wait(flag)], fake, timeout_s=3.0)
    assert out.ok and out.finished, out
    assert int(flag[0]) == 0


def test_slow_gpu_is_a_slow_success(fake):
    flag = torch.zeros(1, dtype=torch.int64)
    out = warm_replay(slow_graph(fake, flag, 0.5), fake.default, [wait(flag)], fake, timeout_s=3.0)
    assert out.ok and out.finished and out.seconds >= 0.5, out
    assert int(flag[0]) == 0


def test_graph_still_running_is_never_wedged(fake):
    """Past the time limit the graph still runs: its flag is left alone (resetting a released flag
    whose WAIT is still ahead would wedge the graph for ever) and it finishes on its own."""
    flag = torch.zeros(1, dtype=torch.int64)
    out = warm_replay(slow_graph(fake, flag, 0.6), fake.default, [wait(flag)], fake, timeout_s=0.2)
    assert not out.ok and not out.finished
    assert out.detail.startswith("the graph was still running 0.2 s after its warm launch")
    fake.default.gpu.join(3.0)
    assert not fake.default.gpu.is_alive(), "the graph is wedged behind its WAIT"
    assert int(flag[0]) == 0


def test_launch_that_raises_withdraws_the_release(fake):
    flag = torch.zeros(1, dtype=torch.int64)
    g = graph_with(fake, flag)
    g.fail_launch = True
    with pytest.raises(RuntimeError, match="fake cudaGraphLaunch failure"):
        warm_replay(g, fake.default, [wait(flag)], fake, timeout_s=0.5)
    assert int(flag[0]) == 0


def test_failed_warm_replay_falls_back_to_upload_with_error(install, fake, engine, caplog, monkeypatch):
    table, model = engine
    install("warm", warm_timeout_s=0.2)
    import freetoken.kernel._row_store as rs

    monkeypatch.setattr(rs, "memop_wait_reset", lambda *a: None)  # the WAIT never reaches the graph
    with caplog.at_level(logging.ERROR, "freetoken_graphfix"):
        runner = harness.make_runner(model, fake.default, bs_list=(1,))
    assert runner.graph_map[1].uploaded  # FreeToken's own upload took over
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith("warm replay of graph bs=1 failed: WAIT #0 on flag 0x")
    assert "was released but never consumed" in errors[0]
    assert "falling back to FreeToken's cuGraphUpload" in errors[0]
    assert int(table._flag[0]) == 0


def test_slow_warm_replay_in_the_capture_loop(install, fake, tmp_path, caplog):
    """FreeToken's capture loop on a slow GPU: the warm replay succeeds late, with no ERROR and no
    upload fallback."""
    table = harness.make_table(harness.write_rows(tmp_path))
    install("warm", warm_timeout_s=3.0)
    with caplog.at_level(logging.WARNING, "freetoken_graphfix"):
        runner = harness.make_runner(harness.PleModel(table, fake, fake.ctx, head_s=0.3), fake.default, (1,))
    assert not runner.graph_map[1].uploaded and runner.graph_map[1].launches == 1
    assert caplog.records == [] and int(table._flag[0]) == 0


def test_without_a_limit_given_a_warm_replay_has_the_readmes_ten_seconds(fake, tmp_path, monkeypatch):
    """Every user runs without a limit of their own: the warm replay in FreeToken's capture loop then
    waits the 10 s the README promises before calling a graph stuck (a busy GPU takes seconds)."""
    from freetoken_graphfix import warm

    limits = []
    real = warm.warm_replay

    def spy(*args, timeout_s, **kwargs):
        limits.append(timeout_s)
        return real(*args, timeout_s=timeout_s, **kwargs)

    monkeypatch.setattr(warm, "warm_replay", spy)  # capture imports it when a graph needs it
    table = harness.make_table(harness.write_rows(tmp_path))
    freetoken_graphfix.install("warm", device=fake)  # no warm_timeout_s, as from the .pth
    runner = harness.make_runner(harness.PleModel(table, fake, fake.ctx), fake.default, (1, 2))
    assert limits == [10.0, 10.0] and all(g.launches == 1 for g in runner.graph_map.values())


def test_warm_replay_still_running_raises_in_the_capture_loop(install, fake, tmp_path):
    """Still running past the limit: no upload can be queued behind it, so WarmReplayError, and the
    graph still completes (a rebuild's rollback then synchronizes instead of hanging)."""
    table = harness.make_table(harness.write_rows(tmp_path))
    fake.large = False  # the launch returns while the GPU is still on the head, ahead of the WAIT
    install("warm", warm_timeout_s=0.2)
    with pytest.raises(WarmReplayError, match="warm replay of graph bs=1 failed: the graph was still running"):
        harness.make_runner(harness.PleModel(table, fake, fake.ctx, head_s=0.6), fake.default, (1,))
    fake.default.gpu.join(3.0)
    assert not fake.default.gpu.is_alive() and int(table._flag[0]) == 0


def test_failed_warm_replay_raises_under_tensor_parallelism(install, fake, engine, monkeypatch):
    table, model = engine
    fake.world = 2
    install("warm", warm_timeout_s=0.2)
    import freetoken.kernel._row_store as rs

    monkeypatch.setattr(rs, "memop_wait_reset", lambda *a: None)
    with pytest.raises(WarmReplayError, match=r"warm replay of graph bs=1 failed: WAIT #0 on flag 0x.* never consumed"):
        harness.make_runner(model, fake.default, bs_list=(1,))
    assert freetoken_graphfix.status()["passes"][0]["graphs"][0]["action"] == "warm"
    assert int(table._flag[0]) == 0


def test_warm_protects_real_decode_steps(install, fake, engine):
    table, model = engine
    install("warm")
    runner = harness.make_runner(model, fake.default)
    for seed, bs in enumerate([2, 1, 2]):
        s = harness.decode_step(runner, table, model, fake.ctx, fake, bs, seed)
        assert not s.fired and s.ok and s.flag_after == 0


def test_mode_enum_has_no_timing_inputs():
    """decide() takes the mode and the graph's WAITs only (determinism under TP: see test_decide)."""
    import inspect

    from freetoken_graphfix.decide import decide

    assert list(inspect.signature(decide).parameters) == ["mode", "waits", "defer_unavailable"]
    assert Mode.WARM.value == "warm"


def test_the_release_helper_polls_a_late_wait_at_most_5_ms_apart(monkeypatch):
    """A GPU that consumes a WAIT late (a long head, a busy GPU) is polled with a back-off from 20 µs
    that stops growing at 5 ms: the next WAIT is released within 5 ms of the GPU reaching it, however
    late, so a slow warm replay stays a slow success, not one that idles for seconds."""
    from freetoken_graphfix import warm
    from freetoken_graphfix.detect import Wait

    flag = torch.zeros(1, dtype=torch.int64)
    reads, pauses = iter([1] * 40 + [0]), []
    monkeypatch.setattr(warm, "read_flag", lambda f: next(reads))
    monkeypatch.setattr(warm.time, "sleep", pauses.append)
    wait = Wait(flag=flag, owner=None, kind="PLE wait-sync", release=None, deferrable=True)
    warm._release_in_order([wait], threading.Event(), threading.Event())
    assert len(pauses) == 40 and pauses[0] == 20e-6 and max(pauses) == pauses[-1] == 5e-3
