"""GPU integration (marker ``gpu``; skipped without CUDA, run on the GPU machine).

FreeToken 0.2.1's real ``GraphRunner._capture_graphs`` and ``replay``, a real ``DiskRowTable`` in
CUDA wait-sync mode over a synthetic safetensors PLE checkpoint, driven through the real
``forward_host_ctx`` protocol (``freetoken_graphfix.bench.rig``). Substituted: the model (PLE lookup, then
small kernels), the attention backend and the dummy request; nothing of FreeToken's graph,
row-store or PLE code.
"""

from __future__ import annotations

import pytest
import torch

import freetoken_graphfix

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]  # a module fixture runs whole engines

STEPS = [(2, 11), (1, 12), (2, 13), (1, 14)]  # (bs, seed) in serving order, first launches first


@pytest.fixture(scope="module")
def rig():
    from freetoken_graphfix.bench.rig import Rig

    return Rig(kernels=10000, streams=1)


def run(rig, mode: str, watchdog_s: float = 3.0):
    freetoken_graphfix.uninstall()
    freetoken_graphfix.install(mode)
    runner = rig.capture((1, 2))
    results = [rig.step(runner, bs, seed, watchdog_s) for bs, seed in STEPS]
    graphs = freetoken_graphfix.status()["passes"][-1]["graphs"]
    freetoken_graphfix.uninstall()
    return results, graphs


@pytest.fixture(scope="module")
def reference(rig):
    results, graphs = run(rig, "upload")
    assert [g["action"] for g in graphs] == ["upload", "upload"]
    assert not any(r.fired for r in results), "FreeToken's own upload must not block"
    return [r.logits for r in results]


@pytest.mark.parametrize("mode, action", [("auto", "deferred"), ("deferred", "deferred"), ("warm", "warm"),
                                          ("upload", "upload")])
def test_protected_modes_never_block_and_match_upload(rig, reference, clean_shim, mode, action):
    results, graphs = run(rig, mode)
    assert [g["action"] for g in graphs] == [action, action]
    assert [r.fired for r in results] == [False] * len(STEPS), [r.launch_ms for r in results]
    for got, want in zip(results, reference, strict=True):
        assert torch.equal(got.logits, want)  # bit for bit
    assert int(rig.table._flag[0]) == 0


def test_skip_blocks_the_first_launch(rig, reference, clean_shim):
    """The negative control: never uploaded, the 10,000-kernel graph's first launch blocks."""
    results, graphs = run(rig, "skip", watchdog_s=2.0)
    assert [g["action"] for g in graphs] == ["exposed", "exposed"]
    assert results[0].fired and results[0].launch_ms > 1900
    assert not results[2].fired  # later launches of that graph never block


def test_deferred_at_64k_kernels(clean_shim):
    from freetoken_graphfix.bench.rig import Rig

    big = Rig(kernels=64000, streams=1)
    freetoken_graphfix.install("deferred")
    runner = big.capture((1,))
    first, second = big.step(runner, 1, 1, 4.0), big.step(runner, 1, 2, 4.0)
    assert not first.fired and not second.fired
    assert freetoken_graphfix.status()["passes"][-1]["graphs"][0]["first_launch"].startswith("fill on helper")


def test_unknown_owner_warm_replayed(clean_shim):
    """A raw row_store.wait_reset (no known owner) in a 10,000-kernel graph gets a warm replay; the
    host then releases each real launch only after it returns, and nothing blocks."""
    import threading

    import freetoken.engine.graph as engine_graph
    from freetoken.kernel import row_store

    freetoken_graphfix.install("auto")  # before looking _upload_graph up: a cached reference misses the wrap
    stream = torch.cuda.Stream()
    flag = torch.zeros(1, dtype=torch.int64).pin_memory()
    x = torch.zeros(1024, device="cuda")
    with torch.cuda.stream(stream):
        x.add_(1)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        row_store.wait_reset(stream, flag)
        for _ in range(10000):
            x.add_(1)
    engine_graph._upload_graph(graph, stream)
    assert freetoken_graphfix.status()["passes"][-1]["graphs"][0]["action"] == "warm"
    fired = threading.Event()

    def release() -> None:
        fired.set()
        row_store.signal(flag)

    for _ in range(2):
        dog = threading.Timer(3.0, release)
        dog.start()
        with torch.cuda.stream(stream):
            graph.replay()
        row_store.signal(flag)  # the host releases only after the launch returned
        dog.cancel()
        stream.synchronize()
        assert not fired.is_set(), "launch blocked until the watchdog released it"
        assert int(flag[0]) == 0


def test_bench_record_every_instance_measured_and_only_skip_blocked(clean_shim):
    """``bench``'s own measuring path on a graph large enough to block: every instance of every
    strategy captured through the shim, launched and timed; only ``skip`` blocks, and its
    bs 2 graph (captured first) blocks in every instance."""
    from freetoken_graphfix.bench import cli, replay, stats

    opts = cli.parser().parse_args(["--kernels", "10000", "--streams", "1", "--instances", "2", "--reps", "10",
                                      "--profile-reps", "0", "--watchdog", "2"])
    record = replay.run_arms(opts)
    rows = {(r["arm"], r["bs"]): r for r in stats.rows(record)}
    assert rows["skip", "2"]["blocked"] == 2 and rows["skip", "2"]["actions"] == ["exposed"]
    for (arm, bs), r in rows.items():
        assert r["n"] == 2 * 10 and r["instances"] == 2
        assert r["logits_equal_upload"], (arm, bs)
        if arm != "skip":
            assert r["blocked"] == 0, (arm, bs, r["first_launch_ms"])
    assert rows["auto", "2"]["actions"] == rows["auto", "1"]["actions"] == ["deferred"]
