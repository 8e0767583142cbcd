"""A real ``ft serve`` on the GPU (marker ``gpu``), driven by the openai client through ``bench serve``.

320 layers, where never-uploaded decode graphs block their first launch: ``skip`` (the negative
control) must hang at its first decode and be stopped with nothing left running; ``upstream`` and
``auto`` must answer every request before and after ``POST /v1/cache/rebuild``, with the same
single-request tokens, and ``auto``'s scheduler process must decide capture passes 0 and 1. Needs
the package installed in site-packages (its ``.pth`` brings the shim into the server's scheduler)
and the ``serve`` extra; without them the run fails, it never skips. The checks are ``gpu_checks``'.
"""

from __future__ import annotations

import pytest

from freetoken_graphfix import bootstrap
from tests.helpers import gpu_checks
from tests.helpers.bench_run import bench_record
from tests.helpers.gpu_records import keep

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]  # a module fixture runs whole engines


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """upstream alone first (it compiles FreeToken's kernels into their caches), then auto and skip at
    once: skip's hang and auto's answers do not depend on each other."""
    assert bootstrap.installed_pth() is not None, "install the package (pip install '.[serve]') for its .pth"
    record, code = bench_record(["serve", "--layers", "320", "--decode-steps", "16", "--context", "256", "--jobs",
                                 "2", "--request-timeout", "30", "--arms", "upstream", "auto", "skip"],
                                tmp_path_factory.mktemp("serve"))
    assert code == 0
    return keep("serve", record)


@pytest.mark.parametrize("check", gpu_checks.for_record("serve"))
def test_serve(served, check):
    check(served)
