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

import threading

import pytest
import torch

import freetoken_graphfix

from . import harness
from .fakecuda import Node


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
