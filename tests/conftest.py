"""Shared fixtures: a clean shim per test, and the fake CUDA device wired under the real FreeToken."""

from __future__ import annotations

import os

os.environ.pop("FT_GRAPH_UPLOAD", None)  # the tests choose modes explicitly

import pytest  # noqa: E402
import torch  # noqa: E402

import freetoken_graphfix  # noqa: E402
from freetoken_graphfix import shim  # noqa: E402
from tests.helpers import harness  # noqa: E402
from tests.helpers.fakecuda import FakeCuda, wire  # noqa: E402


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
    shim.latest, shim.refused = None, ""
    yield
    freetoken_graphfix.uninstall()
    shim.latest, shim.refused = None, ""
    os.environ.pop("FT_GRAPH_UPLOAD", None)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, clean_shim):
    """The fake device under FreeToken 0.2.1's real graph runner, row store and PLE table."""
    dev = FakeCuda()
    wire(monkeypatch, dev)
    yield dev
    dev.halt.set()


@pytest.fixture(scope="session")
def freetoken_tree(tmp_path_factory, request):
    """``freetoken_tree(version)``: a real release's ``freetoken/`` tree unpacked from its PyPI wheel
    (cached across runs), in a fresh directory each call."""
    import subprocess
    import sys
    import zipfile

    cache = request.config.cache.mkdir("freetoken-wheels")

    def get(version: str):
        wheels = list(cache.glob(f"freetoken-{version}-*.whl"))
        if not wheels:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "-d", str(cache), f"freetoken=={version}"], check=True)
            wheels = list(cache.glob(f"freetoken-{version}-*.whl"))
        root = tmp_path_factory.mktemp(f"freetoken-{version}")
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(root)
        return root

    return get


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
