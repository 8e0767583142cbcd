"""Per-graph decisions inside FreeToken 0.2.1's real GraphRunner._capture_graphs, mode by mode."""

from __future__ import annotations

import logging

import pytest

import freetoken_graphfix
from freetoken_graphfix import shim
from tests.helpers import harness
from tests.helpers.fakecuda import FakeGraph


def capture(fake, model, bs_list=(1, 2)):
    stream = fake.default
    return harness.make_runner(model, stream, bs_list)


def graphs_of(status):
    return [(g["name"], g["action"], g["reason"]) for p in status["passes"] for g in p["graphs"]]


def test_auto_protects_only_the_ple_graphs(install, fake, engine):
    table, model = engine
    install("auto")
    runner = capture(fake, model)
    st = freetoken_graphfix.status()
    assert graphs_of(st) == [("bs=2", "deferred", "PLE wait-sync"), ("bs=1", "deferred", "PLE wait-sync")]
    assert st["passes"][0]["graphs"][0]["waits"][0]["owner"] == "PLE wait-sync"
    assert st["passes"][0]["graphs"][0]["waits"][0]["release"] == "after-launch"
    assert not any(g.uploaded for g in runner.graph_map.values())  # no upload, no sync
    assert st["deferred"]["pending_first_launches"] == 2


def test_graph_without_wait_gets_noop(install, fake, engine):
    table, model = engine
    table._wait_sync = False  # launch-gating: no WAIT in the graph (ple_disk.py 356)
    install("auto")
    runner = capture(fake, model)
    assert [a for _, a, _ in graphs_of(freetoken_graphfix.status())] == ["no-op", "no-op"]
    assert not any(g.uploaded or g.launches for g in runner.graph_map.values())


def test_upload_mode_calls_freetokens_own_upload(install, fake, engine):
    _, model = engine
    install("upload")
    runner = capture(fake, model)
    assert all(g.uploaded for g in runner.graph_map.values())
    assert [a for _, a, _ in graphs_of(freetoken_graphfix.status())] == ["upload", "upload"]


def test_skip_warns_naming_owner_and_graph(install, fake, engine, caplog):
    _, model = engine
    install("skip")
    with caplog.at_level(logging.WARNING, "freetoken_graphfix"):
        runner = capture(fake, model)
    assert not any(g.uploaded or g.launches for g in runner.graph_map.values())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "graph bs=2" in warnings[0] and "PLE wait-sync flag 0x" in warnings[0]
    assert "first launch can deadlock" in warnings[0]


def test_warm_mode_replays_once_and_leaves_flag_at_zero(install, fake, engine):
    table, model = engine
    install("warm")
    runner = capture(fake, model)
    assert [g.launches for g in runner.graph_map.values()] == [1, 1]  # one warm replay each
    assert not any(g.uploaded for g in runner.graph_map.values())
    assert int(table._flag[0]) == 0


def test_deferred_mode_marks_graphs(install, fake, engine):
    _, model = engine
    install("deferred")
    capture(fake, model)
    assert [a for _, a, _ in graphs_of(freetoken_graphfix.status())] == ["deferred", "deferred"]


def test_summary_line_per_capture_pass(install, fake, engine, caplog):
    _, model = engine
    install("auto")
    with caplog.at_level(logging.INFO, "freetoken_graphfix"):
        capture(fake, model)
    lines = [r.getMessage() for r in caplog.records if "capture pass" in r.getMessage()]
    assert lines == ["capture pass 0: 2 graphs: 2 deferred (PLE wait-sync)"]


def test_two_captures_each_get_their_own_record(install, fake, engine):
    table, model = engine
    install("warm")
    capture(fake, model)
    table._wait_sync = False
    capture(fake, model, bs_list=(1, 2, 4))  # a runtime rebuild: new runner, new graphs
    passes = freetoken_graphfix.status()["passes"]
    assert [len(p["graphs"]) for p in passes] == [2, 3]
    assert [g["action"] for g in passes[0]["graphs"]] == ["warm", "warm"]
    assert [g["action"] for g in passes[1]["graphs"]] == ["no-op"] * 3
    assert all(p["done"] for p in passes)


def test_each_pass_writes_the_status_where_a_tool_asked_for_it(install, fake, engine, monkeypatch, tmp_path):
    """``FT_GRAPHFIX_STATUS_DIR``: after every capture pass the process's status, read back as data by
    a process that never imported the shim (``bench serve`` reads a server's decisions this way)."""
    import os

    from freetoken_graphfix import status_record

    table, model = engine
    monkeypatch.setenv("FT_GRAPHFIX_STATUS_DIR", str(tmp_path / "status"))
    install("auto")
    capture(fake, model)
    (first,) = status_record.read_all(str(tmp_path / "status"))
    assert first.pid == os.getpid() and [len(p.graphs) for p in first.passes] == [2]
    table._wait_sync = False
    capture(fake, model)  # a rebuild: the file is replaced, now with both passes
    (second,) = status_record.read_all(str(tmp_path / "status"))
    assert [[g.action for g in p.graphs] for p in second.passes] == [["deferred"] * 2, ["no-op"] * 2]
    assert second.as_dict() == freetoken_graphfix.status()


def test_an_unwritable_status_folder_is_a_warning_never_the_engines_failure(install, fake, engine, monkeypatch,
                                                                            tmp_path, caplog):
    _, model = engine
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("FT_GRAPHFIX_STATUS_DIR", str(tmp_path / "file"))
    install("auto")
    with caplog.at_level(logging.WARNING, "freetoken_graphfix"):
        runner = capture(fake, model)
    assert len(runner.graph_map) == 2
    assert any("could not write the status to FT_GRAPHFIX_STATUS_DIR" in r.getMessage() for r in caplog.records)


def test_a_failed_capture_does_not_leak_its_waits(install, fake, engine, monkeypatch):
    table, model = engine
    install("auto")
    real_forward = model.forward

    def forward_that_fails():  # bs=1's capture raises after its lookup enqueued the WAIT
        out = real_forward()
        if fake.is_capturing() and fake.ctx.batch.padded_size == 1:
            raise RuntimeError("capture failed")
        return out

    monkeypatch.setattr(model, "forward", forward_that_fails)
    with pytest.raises(RuntimeError, match="capture failed"):
        capture(fake, model)
    monkeypatch.setattr(model, "forward", real_forward)
    table._wait_sync = False  # the next capture holds no WAIT: it must not inherit bs=1's
    capture(fake, model)
    last = freetoken_graphfix.status()["passes"][-1]
    assert [g["action"] for g in last["graphs"]] == ["no-op", "no-op"]


def test_wrappers_stacked_on_the_shim_change_nothing(install, fake, engine, monkeypatch):
    """Another tool's wrappers over wait_reset and _upload_graph (a profiler, a counter) sit between
    FreeToken's frames and the shim's hooks: the owner and the capture loop's bs are still found."""
    import freetoken.engine.graph as engine_graph
    from freetoken.kernel import row_store

    _, model = engine
    install("auto")
    calls = []
    wait_reset, upload = row_store.wait_reset, engine_graph._upload_graph

    def counting_wait_reset(stream, flag):
        calls.append("wait_reset")
        return wait_reset(stream, flag)

    def timing_upload(graph, stream):
        calls.append("upload")
        return upload(graph, stream)

    with monkeypatch.context() as mp:  # undone before the shim is uninstalled, in stacking order
        mp.setattr(row_store, "wait_reset", counting_wait_reset)
        mp.setattr(engine_graph, "_upload_graph", timing_upload)
        capture(fake, model)
    assert calls.count("upload") == 2 and calls.count("wait_reset") >= 2
    assert graphs_of(freetoken_graphfix.status()) == [("bs=2", "deferred", "PLE wait-sync"),
                                                       ("bs=1", "deferred", "PLE wait-sync")]


def test_unknown_owner_is_protected(install, fake):
    """A WAIT enqueued by something the shim does not know is treated as released after the launch."""
    import torch
    from freetoken.kernel import row_store

    install("auto")
    flag = torch.zeros(1, dtype=torch.int64)
    graph = FakeGraph(fake)
    with fake.capture(graph):
        row_store.wait_reset(fake.current, flag)
    from freetoken.engine.graph import _upload_graph

    _upload_graph(graph, fake.current)
    rec = freetoken_graphfix.status()["passes"][-1]["graphs"][0]
    assert rec["action"] == "warm"
    assert rec["waits"][0]["owner"].startswith("unknown (tests.shim.test_capture.test_unknown_owner_is_protected")
    assert graph.launches == 1 and int(flag[0]) == 0


def test_engram_waits_need_no_protection(install, fake):
    import torch
    from freetoken.models.deepseek_v41.engram_table import EngramDiskTable

    table = object.__new__(EngramDiskTable)  # only its identity matters to the classifier
    install("auto")
    flag = torch.zeros(1, dtype=torch.int64)
    graph = FakeGraph(fake)
    from freetoken.kernel import row_store

    def lookup(self):  # the shape of EngramDiskTable.lookup: a method whose self is the table
        row_store.wait_reset(fake.current, flag)

    with fake.capture(graph):
        lookup(table)
    from freetoken.engine.graph import _upload_graph

    _upload_graph(graph, fake.current)
    rec = freetoken_graphfix.status()["passes"][-1]["graphs"][0]
    assert (rec["action"], rec["waits"][0]["owner"], rec["waits"][0]["release"]) == (
        "no-op", "Engram wait-sync", "before-launch")


def test_ple_on_rocm_needs_no_protection(install, fake, engine):
    """PLE with a ``ple-fill`` worker (ROCm, FreeToken 0.2.1) submits its fill before the launch."""
    table, model = engine
    from concurrent.futures import ThreadPoolExecutor

    table._worker = ThreadPoolExecutor(1, "ple-fill")  # ple_disk.py 213-216: a worker exists only on HIP
    install("auto")
    capture(fake, model)
    st = freetoken_graphfix.status()
    assert [a for _, a, _ in graphs_of(st)] == ["no-op", "no-op"]
    assert st["passes"][0]["graphs"][0]["waits"][0] == {
        "owner": "PLE wait-sync (ple-fill worker)", "release": "before-launch",
        "flag": hex(table._flag.data_ptr())}


def test_a_stray_wait_does_not_leak_into_the_next_pass(install, fake, engine):
    """A WAIT recorded by a capture outside any capture pass (a tool, a test, a capture that never
    reached _upload_graph) is dropped when the next pass starts."""
    import torch
    from freetoken.kernel import row_store

    table, model = engine
    install("auto")
    with fake.capture(FakeGraph(fake)):
        row_store.wait_reset(fake.current, torch.zeros(1, dtype=torch.int64))
    table._wait_sync = False  # this pass's graphs hold no WAIT of their own
    capture(fake, model)
    assert [a for _, a, _ in graphs_of(freetoken_graphfix.status())] == ["no-op", "no-op"]


def test_only_after_launch_owners_are_guarded(install, fake, engine):
    """A graph holding a PLE WAIT and an Engram WAIT: only the PLE table, whose fill is released
    after the launch, gets the first-launch guard; Engram's own worker releases its WAIT."""
    import torch
    from freetoken.kernel import row_store
    from freetoken.models.deepseek_v41.engram_table import EngramDiskTable

    table, model = engine
    engram = object.__new__(EngramDiskTable)
    engram.flag = torch.zeros(1, dtype=torch.int64)

    def lookup(self):  # the shape of EngramDiskTable.lookup: a method whose self is the table
        if fake.is_capturing():
            row_store.wait_reset(fake.current, self.flag)

    real_forward = model.forward
    model.forward = lambda: (real_forward(), lookup(engram))[0]
    install("deferred")
    runner = capture(fake, model, bs_list=(1,))
    rec = freetoken_graphfix.status()["passes"][0]["graphs"][0]
    assert rec["action"] == "deferred" and [w["owner"] for w in rec["waits"]] == ["PLE wait-sync", "Engram wait-sync"]
    assert "host_fill_batch" in vars(table) and "host_fill_batch" not in vars(engram)
    row_store.signal(engram.flag)  # what Engram's worker does before the launch
    s = harness.decode_step(runner, table, model, fake.ctx, fake, 1, seed=1)
    assert not s.fired and s.ok and int(engram.flag[0]) == 0


def test_a_release_without_the_deferred_details_gets_warm(install, fake, engine, monkeypatch):
    """A release decided by feature that lacks a private detail of the deferred path: auto protects
    its PLE graphs with a warm replay, and the reason names what is missing."""
    table, model = engine
    install("auto")
    monkeypatch.setattr(shim.latest, "compat", shim.latest.compat._replace(
        deferred=False, deferred_reason="missing DiskRowTable.lookup waits"))
    runner = capture(fake, model)
    assert [(a, r) for _, a, r in graphs_of(freetoken_graphfix.status())] == [
        ("warm", "PLE wait-sync; deferred unavailable: missing DiskRowTable.lookup waits")] * 2
    assert [g.launches for g in runner.graph_map.values()] == [1, 1] and int(table._flag[0]) == 0


def test_a_graph_captured_outside_a_pass_gets_warm(install, fake, engine):
    """No GraphRunner captured it, so no runner launches it through the guard: warm, not deferred."""
    table, model = engine
    install("auto")
    from freetoken.engine.graph import _upload_graph  # after install: the module attribute is the wrapper
    graph = FakeGraph(fake)
    batch, _ = harness.make_batch(1, seed=1)
    with fake.ctx.forward_batch(batch), fake.capture(graph):
        model.forward()
    _upload_graph(graph, fake.current)
    rec = freetoken_graphfix.status()["passes"][-1]["graphs"][0]
    assert rec["action"] == "warm" and "captured outside GraphRunner._capture_graphs" in rec["reason"]
    assert graph.launches == 1 and int(table._flag[0]) == 0


def test_cuda_device_replays_on_the_capture_stream(fake):
    """A rebuild in overlap mode captures with the scheduler's stream current, not Engine.stream
    (freetoken-0.2.1.md 2.2): the warm replay launches on the graph's own stream."""
    from freetoken_graphfix.device import CudaDevice
    from tests.helpers.fakecuda import FakeStream

    engine_stream, scheduler_stream = FakeStream(fake), FakeStream(fake)
    graph = FakeGraph(fake, large=False)
    with fake.stream(scheduler_stream):
        CudaDevice().replay(graph, engine_stream)
    assert engine_stream.gpu is not None and scheduler_stream.gpu is None


def test_owner_found_through_pure_python_wrapt():
    """With wrapt's C extension off, its wrappers add Python frames between FreeToken and the shim:
    the caller frame still skips them (an unknown owner is named after the real caller)."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch, freetoken_graphfix, wrapt
        from freetoken.kernel import row_store
        import freetoken.engine.graph as graph
        from tests.helpers.fakecuda import FakeCuda, FakeGraph, wire
        import pytest
        assert wrapt.FunctionWrapper.__module__ == "wrapt.wrappers", "pure-Python wrapt expected"
        mp, dev = pytest.MonkeyPatch(), FakeCuda()
        wire(mp, dev)
        freetoken_graphfix.uninstall(); freetoken_graphfix.install("auto", device=dev)
        def enqueue_wait():
            row_store.wait_reset(dev.current, torch.zeros(1, dtype=torch.int64))
        g = FakeGraph(dev, large=False)
        with dev.capture(g):
            enqueue_wait()
        graph._upload_graph(g, dev.current)
        print(freetoken_graphfix.status()["passes"][-1]["graphs"][0]["waits"][0]["owner"])
    """)
    env = {**os.environ, "WRAPT_DISABLE_EXTENSIONS": "1"}
    env.pop("FT_GRAPH_UPLOAD", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "unknown (__main__.enqueue_wait)"


def test_the_wait_hook_keeps_nothing_of_the_graph_under_capture(install, fake, engine, monkeypatch):
    """0.2.x: the WAIT hook records the WAIT only. Reaching into _capture_graphs for the graph under
    capture (its frame's locals, from deep in the model's forward) broke FreeToken's real engine on
    the H200 ('CUDA error: invalid argument' after the capture pass): nothing of it is kept."""
    seen = []
    install("auto")
    real_add = shim.latest.recorder.add
    monkeypatch.setattr(shim.latest.recorder, "add", lambda wait, graph_id=None: (seen.append(graph_id),
                                                                                    real_add(wait, graph_id)))
    capture(fake, engine[1])
    assert seen == [None, None]


def test_cuda_device_tracks_captures_for_the_block_only():
    """0.1.3's per-graph WAITs: torch.cuda.CUDAGraph.capture_begin notes the graph's id while a pass
    runs, and is FreeToken's torch's own again afterwards."""
    import torch

    from freetoken_graphfix.device import CudaDevice

    original = vars(torch.cuda.CUDAGraph)["capture_begin"]
    stand_in = object()
    with CudaDevice().track_captures() as target:
        assert target() is None and vars(torch.cuda.CUDAGraph)["capture_begin"] is not original
        with pytest.raises(AttributeError):  # a stand-in, not a graph: the real one refuses, after the note
            torch.cuda.CUDAGraph.capture_begin(stand_in)
        assert target() == id(stand_in)
    assert vars(torch.cuda.CUDAGraph)["capture_begin"] is original
