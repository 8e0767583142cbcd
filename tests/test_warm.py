"""The warm strategy's logic on the fake device: threaded release, bounded time, every flag at 0."""

from __future__ import annotations

import logging

import pytest
import torch

import freetoken_graphfix
from freetoken_graphfix import detect
from freetoken_graphfix.config import Mode
from freetoken_graphfix.errors import WarmReplayError
from freetoken_graphfix.strategies import warm_replay

from . import harness
from .fakecuda import FakeGraph, Node


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


def test_wait_never_consumed_is_released_and_reported(fake):
    """A recorded WAIT that the graph never consumes: bounded, flag reset to 0, the flag named."""
    flag = torch.zeros(1, dtype=torch.int64)
    g = FakeGraph(fake)  # holds no WAIT node: the release is never consumed
    out = warm_replay(g, fake.default, [wait(flag)], fake, timeout_s=0.2)
    assert not out.ok and out.finished
    assert f"flag {hex(flag.data_ptr())}" in out.detail and "not consumed within 0.2 s" in out.detail
    assert int(flag[0]) == 0  # no surplus release left for the next real step


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
    assert "falling back to FreeToken's cuGraphUpload" in errors[0]
    assert int(table._flag[0]) == 0


def test_failed_warm_replay_raises_under_tensor_parallelism(install, fake, engine, monkeypatch):
    table, model = engine
    fake.world = 2
    install("warm", warm_timeout_s=0.2)
    import freetoken.kernel._row_store as rs

    monkeypatch.setattr(rs, "memop_wait_reset", lambda *a: None)
    with pytest.raises(WarmReplayError, match=r"warm replay of graph bs=1 failed: WAIT #0 on flag 0x"):
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

    from freetoken_graphfix.strategies import decide

    assert list(inspect.signature(decide).parameters) == ["mode", "waits", "defer_unavailable"]
    assert Mode.WARM.value == "warm"
