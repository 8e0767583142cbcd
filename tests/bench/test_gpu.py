"""GPU integration (marker ``gpu``; skipped without CUDA, run on the GPU machine).

FreeToken 0.2.1's real ``GraphRunner._capture_graphs`` and ``replay``, a real ``DiskRowTable`` in
CUDA wait-sync mode over a synthetic safetensors PLE checkpoint, driven through the real
``forward_host_ctx`` protocol (``freetoken_graphfix_bench.rig.pieces``). Substituted: the model (PLE lookup, then
small kernels), the attention backend and the dummy request; nothing of FreeToken's graph,
row-store or PLE code. What each record must show is in ``gpu_checks``.
"""

from __future__ import annotations

import pytest
import torch

import freetoken_graphfix
from tests.helpers import gpu_checks
from tests.helpers.gpu_records import keep, keep_steps

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]  # a module fixture runs whole engines

STEPS = [(2, 11), (1, 12), (2, 13), (1, 14)]  # (bs, seed) in serving order, first launches first


@pytest.fixture(scope="module")
def rig():
    from freetoken_graphfix_bench.rig.pieces import Rig

    return Rig(kernels=10000, streams=1)


def run(rig, mode: str, watchdog_s: float = 3.0):
    freetoken_graphfix.uninstall()
    freetoken_graphfix.install(mode)
    runner = rig.capture((1, 2))
    results = [rig.step(runner, bs, seed, watchdog_s) for bs, seed in STEPS]
    graphs = freetoken_graphfix.status()["passes"][-1]["graphs"]
    freetoken_graphfix.uninstall()
    return results, graphs


def step_record(results, graphs, reference=None) -> dict:
    return {"actions": [g["action"] for g in graphs], "fired": [r.fired for r in results],
            "launch_ms": [r.launch_ms for r in results], "flag": None,
            "logits_equal_upload": None if reference is None else
            [bool(torch.equal(got.logits, want.logits)) for got, want in zip(results, reference, strict=True)]}


@pytest.fixture(scope="module")
def modes(rig):
    """Every protected mode against FreeToken's own upload (bit for bit), and skip, the negative control."""
    freetoken_graphfix.uninstall()
    reference, graphs = run(rig, "upload")
    out = {"upload": dict(step_record(reference, graphs, reference), flag=int(rig.table._flag[0]))}
    for mode in gpu_checks.PROTECTED_MODES:
        if mode != "upload":
            results, graphs = run(rig, mode)
            out[mode] = dict(step_record(results, graphs, reference), flag=int(rig.table._flag[0]))
    results, graphs = run(rig, "skip", watchdog_s=2.0)
    out["skip"] = step_record(results, graphs)
    return keep_steps("rig-modes", out)


@pytest.mark.parametrize("check", gpu_checks.for_record("rig-modes"))
def test_modes(modes, check):
    check(modes)


def test_deferred_at_64k_kernels(clean_shim):
    from freetoken_graphfix_bench.rig.pieces import Rig

    big = Rig(kernels=64000, streams=1)
    freetoken_graphfix.install("deferred")
    runner = big.capture((1,))
    first, second = big.step(runner, 1, 1, 4.0), big.step(runner, 1, 2, 4.0)
    graph = freetoken_graphfix.status()["passes"][-1]["graphs"][0]
    record = {"fired": [first.fired, second.fired], "launch_ms": [first.launch_ms, second.launch_ms],
              "first_launch": graph["first_launch"]}
    gpu_checks.deferred_at_64k_kernels(keep_steps("rig-64k", record))


def test_unknown_owner_warm_replayed(clean_shim):
    """A raw row_store.wait_reset (no known owner) in a 10,000-kernel graph: the host releases each
    real launch only after it returns (``gpu_checks.unknown_owner_warm_replayed``)."""
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
    record = {"action": freetoken_graphfix.status()["passes"][-1]["graphs"][0]["action"], "fired": [], "flags": []}
    for _ in range(2):
        fired = threading.Event()

        def release(fired=fired) -> None:
            fired.set()
            row_store.signal(flag)

        dog = threading.Timer(3.0, release)
        dog.start()
        with torch.cuda.stream(stream):
            graph.replay()
        row_store.signal(flag)  # the host releases only after the launch returned
        dog.cancel()
        stream.synchronize()
        record["fired"].append(fired.is_set())
        record["flags"].append(int(flag[0]))
    gpu_checks.unknown_owner_warm_replayed(keep_steps("rig-unknown-owner", record))


def rig_record(*argv: str):
    """``bench rig`` with ``argv``, measured in this process."""
    from freetoken_graphfix_bench import cli
    from freetoken_graphfix_bench.rig.measure import run_arms
    from freetoken_graphfix_bench.settings import RigSettings, from_options

    return run_arms(from_options(RigSettings, cli.parser().parse_args(["rig", *argv])), "bench rig " + " ".join(argv))


def test_bench_record_every_instance_measured_and_only_skip_blocked(clean_shim):
    record = rig_record("--kernels", "10000", "--streams", "1", "--instances", "2", "--reps", "10", "--profile-reps",
                        "0", "--watchdog", "2")
    gpu_checks.bench_record_every_instance_measured_and_only_skip_blocked(keep("rig-bench", record))


def test_the_rigs_positive_control_is_recovered(clean_shim):
    record = rig_record("--reps", "50", "--profile-reps", "0")
    gpu_checks.the_positive_control_is_recovered_so_the_rig_could_see_775s_cost(keep("rig-control", record))
