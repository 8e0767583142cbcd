"""The engine child's seams and timed decode loop on CPU: FreeToken 0.2.1's real GraphRunner, Engine
and DiskRowTable on the fake device, with the child's own objects installed on them as the engine
process installs them (``bench/engine/child/main.py``)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from freetoken_graphfix_bench.engine import run as bench_engine
from tests.helpers import harness
from tests.helpers.engine_child import copies, loop, seams


class TimedEvent:
    """A CUDA event on the fake device: recorded, and 1 ms from any other."""

    def __init__(self, *args, **kwargs) -> None:
        self.recorded = False

    def record(self, stream=None) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other) -> float:
        assert self.recorded and other.recorded, "an event read before it was recorded"
        return 1.0


class GraphDriver:
    """``cuGraphLaunch`` of a copy's handle on the fake device: every copy here is the engine's own
    graph (the same kernels, memory and WAIT), launched on the current stream."""

    def __init__(self, graph, log: list) -> None:
        self.graph, self.log = graph, log

    def launch(self, handle: int, stream: int) -> None:
        self.log.append(("launch", handle))
        self.graph.replay()


@pytest.fixture
def child_engine(fake, engine, monkeypatch):
    """``make(skip_upload)``: FreeToken's runner captured under the child's upload seam, its real
    Engine, the PLE table and model; CUDA events and free memory as the device would give them."""
    import freetoken.engine.graph as graph_mod
    from freetoken.kernel import row_store

    monkeypatch.setattr(torch.cuda, "Event", TimedEvent)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (1 << 30, 1 << 31))
    monkeypatch.setattr(graph_mod, "_upload_graph", graph_mod._upload_graph)  # undone after the test
    monkeypatch.setattr(row_store, "wait_reset", row_store.wait_reset)
    table, model = engine

    def make(skip_upload: bool):
        upload = seams.UploadSeam(graph_mod, skip=skip_upload)
        waits = seams.WaitCounter(torch.cuda.is_current_stream_capturing)
        runner = harness.make_runner(model, fake.default)
        eng = harness.engine_for(runner, table, model, fake.ctx)
        return SimpleNamespace(upload=upload, waits=waits, runner=runner, eng=eng, table=table, model=model,
                               runner_cls=graph_mod.GraphRunner)

    return make


def step(fake, built, bs: int, seed: int) -> bool:
    """One decode step through FreeToken's own ``Engine.forward_batch``; whether the rows the graph
    read are the ones FreeToken's fill staged for this step."""
    batch, runs = harness.make_batch(bs, seed)
    with fake.stream(built.runner.stream):
        built.eng.forward_batch(batch, None)
        built.runner.stream.synchronize()
    want = harness.expect(built.table, runs)
    return bool(torch.equal(built.model.seen[bs][: want.numel()], want))


def test_a_launch_the_watchdog_released_is_recorded_and_its_surplus_release_dropped(fake, child_engine):
    """no-upload's upload seam leaves the graphs never uploaded, so the first launch blocks behind its
    WAIT until the watchdog releases it; FreeToken's fill then releases once more. The loop records
    the fire and puts the flag back at 0: left at 1, the next step's WAIT would pass before its own
    fill and read stale rows."""
    built = child_engine(skip_upload=True)
    assert len(built.upload.ms) == 2 and not any(g.uploaded for g in built.runner.graph_map.values())
    assert built.waits.captured == 2  # one WAIT per graph, counted while capturing only
    flag = built.table._flag
    dog = seams.LaunchWatchdog(flag, 0.3, built.waits.release)
    decode = loop.DecodeLoop(built.eng, built.runner, built.runner_cls, copies.LoopSchedule({}), None, dog, flag,
                             None)
    decode.install()
    step(fake, built, 2, seed=1)
    assert decode.fires == [{"step": 0, "bs": 2, "flag_after": 1}] and int(flag[0]) == 0
    assert step(fake, built, 2, seed=2) and int(flag[0]) == 0  # the next step reads its own rows
    assert decode.fires == [{"step": 0, "bs": 2, "flag_after": 1}]
    figures = decode.figures()
    assert figures["steps"] == {"prefill": 0, "decode": 0, "graph": 2}
    assert figures["step_exec"] == {"2": ["own"]} and list(figures["first_launch_ms"]) == ["2"]
    assert figures["first_launch_ms"]["2"] >= 300  # the blocked launch, as long as the watchdog took
    assert figures["first_launch_free_mib"] == {"2": [1024.0, 1024.0]}


def test_the_loop_launches_the_cycle_and_spins_after_the_control_copies_alone(fake, child_engine, monkeypatch):
    """After a size's first launch (the engine's own, uploaded by FreeToken), each step launches the
    executable the cycle names in the engine's own slot; the positive control's spin follows each
    control copy's launch and no other, and every step reads its own rows."""
    built = child_engine(skip_upload=False)
    assert all(g.uploaded for g in built.runner.graph_map.values())
    log: list = []
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("spin", cycles)))
    made = {2: {"control:0": 10, "uploaded:0": 11, "never:0": 12, "control:1": 13}}
    schedule = copies.LoopSchedule(made)
    labels = copies.copy_labels(1, control=True)
    own = built.runner.graph_map[2]
    decode = loop.DecodeLoop(built.eng, built.runner, built.runner_cls, schedule, GraphDriver(own, log),
                             seams.LaunchWatchdog(built.table._flag, 60, built.waits.release), built.table._flag, 5)
    decode.install()
    assert all(step(fake, built, 2, seed) for seed in range(1 + len(labels)))
    assert log == [("launch", 10), ("spin", 5), ("launch", 11), ("launch", 12), ("launch", 13), ("spin", 5)]
    assert decode.figures()["step_exec"] == {"2": labels} and not decode.fires
    assert built.runner.graph_map[2] is own  # the stand-in is gone after every step


def test_copies_that_fail_leave_none_behind_and_the_flag_at_zero():
    """A copy that cannot be made stops them all: the ones made are destroyed, no control, a note that
    says why, and the flag its launch had released put back at 0 for the engine's own first WAIT."""
    flag = torch.zeros(1, dtype=torch.int64)
    destroyed: list[int] = []

    class FailingDriver:
        handles = iter(range(100, 200))

        def instantiate(self, graph):
            return next(self.handles)

        def upload(self, handle, stream):
            pass

        def launch(self, handle, stream):
            if handle == 102:
                raise RuntimeError("cuGraphLaunch returned CUDA error 700")
            flag.zero_()  # the WAIT consumes the release

        def destroy(self, handle):
            destroyed.append(handle)

    capture = seams.CaptureSeam(SimpleNamespace(_capture_graphs=None), FailingDriver(), lambda f: f.fill_(1), 2,
                                0.02, trace=False)
    stream = SimpleNamespace(cuda_stream=7, synchronize=lambda: None)
    runner = SimpleNamespace(stream=stream, graph_map={2: SimpleNamespace(raw_cuda_graph=lambda: 1)})
    capture.make_copies(runner, flag)
    assert capture.copies == {} and capture.control == {} and sorted(destroyed) == [100, 101, 102]
    assert capture.notes == ["no copies of the graphs: RuntimeError('cuGraphLaunch returned CUDA error 700')"]
    assert int(flag[0]) == 0


def test_the_child_imports_its_own_modules_when_run_by_path(tmp_path):
    """Run as the bench runs it (``python engine/child/main.py SPEC``), the child finds its sibling
    modules in its own directory and gets as far as the CUDA driver, which this machine may lack."""
    spec = tmp_path / "spec.json"
    spec.write_text('{"hang_timeout_s": 60}')
    out = subprocess.run([sys.executable, str(bench_engine.CHILD), str(spec)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert "ModuleNotFoundError" not in out.stderr and "ImportError" not in out.stderr, out.stderr
    if not torch.cuda.is_available():
        assert "libcuda" in out.stderr or "KeyError" in out.stderr, out.stderr


def test_the_wait_counter_counts_the_waits_enqueued_while_capturing_alone(monkeypatch):
    """``wait_reset`` enqueues the WAIT on the device (stood in for here); the counter passes every call
    on and counts those made inside a capture, and releases with FreeToken's own ``signal``."""
    from freetoken.kernel import row_store

    calls: list = []
    monkeypatch.setattr(row_store, "wait_reset", lambda *args: calls.append(args))
    capturing = [False]
    waits = seams.WaitCounter(lambda: capturing[0])
    row_store.wait_reset(7, 1)
    capturing[0] = True
    row_store.wait_reset(7, 2)
    assert waits.captured == 1 and calls == [(7, 1), (7, 2)] and waits.release is row_store.signal


def test_the_child_loads_the_spin_module_by_path_from_where_the_package_lies():
    """The engine child imports nothing of the package: the positive control's spin comes from
    ``bench/spin.py`` by path, which must be found from the child's own folder (bench/engine/child/)."""
    from freetoken_graphfix_bench import spin

    module = copies.spin_module()
    assert module.__file__ == spin.__file__ and module.__name__ == "graphfix_spin"
