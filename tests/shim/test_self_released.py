"""WAITs that release themselves, beside the PLE WAIT: what MoE offload puts in a qwen4_exp graph.

With ``--moe-strategy cpu`` or ``hybrid`` FreeToken's CPU-MoE executor enqueues, per CPU-decoded MoE
layer, a doorbell (memop writes, ``csrc/cpu_moe/gpu_sync_cuda.cpp`` 134-142, or the ``flag_publish``
kernel, ``moe/cpu_executor.py`` 583) and then ``cuStreamWaitValue64(done >= 1)`` (``gpu_wait``,
144-148, from ``decode_sync``, ``cpu_executor.py`` 611); its coordinator thread sets ``done`` as
soon as the GPU has rung the doorbell (``start_flag_coordinator``, 344). The locked-layer fetch
does the same with copy threads (``csrc/cpu_moe/locked_fetch.cpp`` 79-86). Both are enqueued from
C++, never through ``row_store.wait_reset``, so the shim never records them, and they need
nothing: each is released by work earlier in the same graph, during the launch, by a thread that
does not wait for ``cudaGraphLaunch`` to return. Here, on the fake device, a graph holds them
beside the real ``DiskRowTable``'s WAIT (first, as the fake blocks a first launch behind its first
WAIT), with a coordinator thread that releases them the same way.
"""

from __future__ import annotations

import importlib
import threading
import types

import pytest
import torch

import freetoken_graphfix
from tests.helpers import harness
from tests.helpers.engine_child import (
    seams as child,  # the bench engine child's seams, imported as the child imports them
)
from tests.helpers.fakecuda import Node


class Coordinator:
    """The CPU-MoE handshake of one layer: the graph rings ``ready``, a host thread that polls it
    sets ``done``, and the graph WAITs on ``done`` (WAIT(done >= 1); done := 0)."""

    def __init__(self, fake) -> None:
        self.fake, self.ready, self.done = fake, torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
        self.answered = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.wait(0.0002):
            if int(self.ready[0]):
                self.ready[0], self.done[0] = 0, 1
                self.answered += 1

    def decode_sync(self) -> None:
        """What the executor puts on the stream for one CPU-decoded layer (run now when eager)."""
        if self.fake.capturing_graph is None:
            self.ready[0] = 1
            while int(self.done[0]) < 1:
                pass
            self.done[0] = 0
            return
        self.fake.enqueue(lambda: self.ready.fill_(1))
        self.fake.capturing_graph.nodes.append(Node("wait", ptr=self.done.data_ptr()))


class OffloadModel(harness.PleModel):
    """The decode forward with ``layers`` CPU-decoded MoE layers after the PLE lookup (``ple``: whether
    the table's lookup is in the graph at all)."""

    def __init__(self, table, fake, ctx, coordinator: Coordinator, layers: int = 2, ple: bool = True) -> None:
        super().__init__(table, fake, ctx)
        self.coordinator, self.layers, self.ple = coordinator, layers, ple

    def forward(self) -> torch.Tensor:
        out = super().forward() if self.ple else torch.zeros(self.ctx.batch.padded_size, harness.VOCAB)
        for _ in range(self.layers):
            self.coordinator.decode_sync()
        return out


@pytest.fixture
def offload(fake, tmp_path):
    table = harness.make_table(harness.write_rows(tmp_path))
    coordinator = Coordinator(fake)
    yield table, coordinator, lambda **kw: OffloadModel(table, fake, fake.ctx, coordinator, **kw)
    coordinator.stop.set()


def decisions():
    return [(g["action"], [w["owner"] for w in g["waits"]]) for p in freetoken_graphfix.status()["passes"]
            for g in p["graphs"]]


def test_a_graph_with_the_ple_wait_and_self_released_waits_is_deferred_and_decodes(install, fake, offload):
    table, coordinator, model_of = offload
    install("auto")
    model = model_of()
    runner = harness.make_runner(model, fake.default)
    assert decisions() == [("deferred", ["PLE wait-sync"])] * 2  # the CPU-MoE WAITs are not the shim's
    for bs, seed in ((2, 1), (2, 2), (1, 3)):
        step = harness.decode_step(runner, table, model, fake.ctx, fake, bs, seed)
        assert not step.fired and step.ok and step.flag_after == 0, (bs, seed)
    assert int(coordinator.done[0]) == 0 and coordinator.answered >= 3 * 2  # two layers a step, and the warm-ups


@pytest.mark.parametrize("mode", ["auto", "warm"])
def test_self_released_waits_alone_never_make_a_graph_warm(install, fake, offload, mode):
    """A graph whose only WAITs release themselves (the PLE table in gate mode, no WAIT of its own):
    nothing to protect, whatever the mode; its launches never block."""
    table, coordinator, model_of = offload
    table._wait_sync = False
    install(mode)
    model = model_of(ple=False)
    runner = harness.make_runner(model, fake.default)
    assert decisions() == [("no-op", [])] * 2
    assert not any(g.launches for g in runner.graph_map.values())  # no warm replay ran
    batch, _ = harness.make_batch(2, seed=4)
    with fake.ctx.forward_batch(batch), fake.stream(runner.stream):
        runner.replay(batch)
    assert runner.stream.gpu.join(2.0) is None and not runner.stream.gpu.is_alive()


def test_a_warm_replay_lets_the_self_released_waits_release_themselves(install, fake, offload):
    """Under warm, the PLE graph is replayed at capture with its own WAIT pre-released; the CPU-MoE
    WAITs in it are released by the coordinator during that replay, as in a real step."""
    table, coordinator, model_of = offload
    install("warm", warm_timeout_s=2.0)
    model = model_of()
    runner = harness.make_runner(model, fake.default)
    assert decisions() == [("warm", ["PLE wait-sync"])] * 2
    assert all(g.launches == 1 for g in runner.graph_map.values()) and int(table._flag[0]) == 0
    step = harness.decode_step(runner, table, model, fake.ctx, fake, 2, seed=5)
    assert not step.fired and step.ok


class Extension:
    """The device-facing edge of FreeToken's compiled CPU-MoE extension: records what it would enqueue."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        return lambda *args: self.calls.append(name)


@pytest.fixture
def counted(monkeypatch):
    """The bench child's counters on FreeToken 0.2.1's own CpuMoeExecutor and LockedLayerFetch (put
    back afterwards), the CUDA stream and the gather kernel faked; ``capturing`` switches capture on."""
    for module, cls_name, method, _ in child.SELF_RELEASED.values():
        cls = getattr(importlib.import_module(module), cls_name)
        monkeypatch.setattr(cls, method, getattr(cls, method))  # undone after the test
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: types.SimpleNamespace(cuda_stream=7))
    monkeypatch.setattr("freetoken.kernel.fast_index_copy.fast_index_copy_multi_jit", lambda *a, **k: None)
    capturing = [False]
    return child.count_self_released_waits(lambda: capturing[0]), capturing


def executor(memops: bool):
    from freetoken.moe.cpu_executor import CpuMoeExecutor

    ex = object.__new__(CpuMoeExecutor)
    ex._flag_sync, ex._ext, ex._io = memops, Extension(), {"y": torch.ones(4, 8)}
    return ex


def locked_fetch(memops: bool):
    from freetoken.moe.locked_fetch import LockedLayerFetch

    lf = object.__new__(LockedLayerFetch)
    lf._ext, lf._wait_flag, lf.max_fetch, lf.staging_ptrs = Extension(), 0 if memops else 0x5000, 2, None
    cache = types.SimpleNamespace(_pending_fetch_cap=2, num_indices=torch.zeros(1), src_indices=torch.zeros(1),
                                  _copy_dst_ptrs_pool=[None], pool_of_layer={3: 0}, _copy_feat_bytes=[None],
                                  layer_layout={3: 0}, evict_slots=None, _copy_blocks_per_bank=1)
    return lf, cache


def test_the_bench_counts_each_self_released_wait_freetoken_captures(counted):
    """`bench engine` reports the CPU-MoE and locked-fetch WAITs in its graphs by counting the calls
    of FreeToken's own methods that enqueue them: one per call while capturing, on an instance using
    stream memops; an eager call, or a host-function sync, is none. The original method still runs."""
    counts, capturing = counted
    with_memops, host_func = executor(True), executor(False)
    lf, cache = locked_fetch(True)
    spinning, _ = locked_fetch(False)
    out = with_memops.decode_sync((2, torch.zeros(2, 8), False))  # eager: no WAIT captured
    assert torch.equal(out, torch.ones(2, 8)) and counts == {"cpu_moe": 0, "locked_fetch": 0}
    capturing[0] = True
    for _ in range(3):
        with_memops.decode_sync((2, torch.zeros(2, 8), False))
        host_func.decode_sync((2, torch.zeros(2, 8), False))
        lf.copy(cache, 3)
        spinning.copy(cache, 3)
    assert counts == {"cpu_moe": 3, "locked_fetch": 3}
    assert with_memops._ext.calls == ["flag_wait"] * 4 and host_func._ext.calls == ["sync_with_cuda_stream"] * 3
    assert lf._ext.calls == spinning._ext.calls == ["publish"] * 3


def test_a_kind_this_freetoken_lacks_is_reported_as_none():
    assert child.count_self_released_waits(lambda: True, {"x": ("freetoken.no_such_module", "C", "m", bool)}) == \
        {"x": None}
