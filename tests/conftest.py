"""Shared fixtures: a clean shim per test, and the fake CUDA device wired under the real FreeToken."""

from __future__ import annotations

import os

os.environ.pop("FT_GRAPH_UPLOAD", None)  # the tests choose modes explicitly

import pytest  # noqa: E402
import torch  # noqa: E402

import freetoken_graphfix  # noqa: E402
from freetoken_graphfix import hooks  # noqa: E402

from . import harness  # noqa: E402
from .fakecuda import FakeCuda  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def clean_shim():
    """No shim installed, no history; uninstalled again afterwards."""
    freetoken_graphfix.uninstall()
    hooks._state.passes.clear()
    hooks._state.compat = None
    yield
    freetoken_graphfix.uninstall()
    hooks._state.passes.clear()
    hooks._state.compat = None
    os.environ.pop("FT_GRAPH_UPLOAD", None)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, clean_shim):
    """The fake device under FreeToken 0.2.1's real graph runner, row store and PLE table."""
    import freetoken.engine.graph as graph
    from freetoken.distributed.info import DistributedInfo
    from freetoken.kernel import _row_store

    dev = FakeCuda()
    monkeypatch.setattr(_row_store, "memop_wait_reset", dev.memop_wait_reset)
    monkeypatch.setattr(graph, "_cu_graph_upload", lambda: dev.cu_graph_upload)
    monkeypatch.setattr(graph, "get_free_memory", lambda device: 1 << 40)
    monkeypatch.setattr(graph, "get_tp_info", lambda: DistributedInfo(0, dev.world))
    ctx = harness.Ctx()
    monkeypatch.setattr(graph, "get_global_ctx", lambda: ctx)
    dev.ctx = ctx
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_current_stream_capturing", dev.is_capturing)
    monkeypatch.setattr(cuda, "current_stream", lambda *a, **k: dev.current)
    monkeypatch.setattr(cuda, "stream", dev.stream)
    monkeypatch.setattr(cuda, "CUDAGraph", dev.new_graph)
    monkeypatch.setattr(cuda, "graph", lambda g, pool=None, stream=None: dev.capture(g, stream))
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(cuda, name, lambda *a, **k: None)
    yield dev
    dev.halt.set()


@pytest.fixture
def install(fake):
    """install(mode) on the fake device, with a short warm-replay timeout."""

    def _install(mode: str, **kwargs):
        freetoken_graphfix.install(mode, device=fake, warm_timeout_s=kwargs.pop("warm_timeout_s", 0.3))
        assert freetoken_graphfix.status()["patched"], freetoken_graphfix.status()["reason"]

    return _install


@pytest.fixture
def engine(fake, tmp_path):
    """A real DiskRowTable over a real PleStore, and a model whose forward calls its lookup."""
    table = harness.make_table(harness.write_rows(tmp_path))
    model = harness.PleModel(table, fake, fake.ctx)
    return table, model
