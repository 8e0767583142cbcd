"""A real ``ft serve`` on the GPU (marker ``gpu``), driven by the openai client through ``bench --serve``.

320 layers, where never-uploaded decode graphs block their first launch: ``skip`` (the negative
control) must hang at its first decode and be stopped with nothing left running; ``upstream`` and
``auto`` must answer every request before and after ``POST /v1/cache/rebuild``, with the same
single-request tokens, and ``auto``'s scheduler process must log capture passes 0 and 1. Needs
the package installed in site-packages (its ``.pth`` brings the shim into the server's scheduler)
and the ``serve`` extra; without them the run fails, it never skips.
"""

from __future__ import annotations

import pytest

from freetoken_graphfix import bootstrap

from .bench_run import bench_record

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]  # a module fixture runs whole engines


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    assert bootstrap.installed_pth() is not None, "install the package (pip install '.[serve]') for its .pth"
    return bench_record(["--serve", "--layers", "320", "--decode-steps", "16", "--context", "256", "--jobs", "1",
                         "--request-timeout", "30", "--serve-arms", "upstream", "auto", "skip"],
                        tmp_path_factory.mktemp("serve"))


def test_skip_hangs_and_is_stopped_cleanly(served):
    record, _ = served
    skip = record["runs"]["skip"]
    assert skip["hung"] >= 1, "skip answered: at this size it could not have failed"
    assert skip["outlived"] == [] and skip["stragglers"] == [], skip
    assert record["problems"]["skip"] == []


@pytest.mark.parametrize("arm", ["upstream", "auto"])
def test_protected_arms_serve_through_a_rebuild(served, arm):
    record, _ = served
    rec = record["runs"][arm]
    assert record["problems"][arm] == [], record["problems"][arm]
    assert rec["hung"] == 0 and rec["rebuild"]["status"] == "ok"
    assert rec["cache_status"]["num_pages"] == rec["rebuild"]["num_pages"]


def test_auto_logs_both_capture_passes_from_one_process(served):
    record, code = served
    passes = record["runs"]["auto"]["passes"]
    assert [line.split(":")[0] for _, line in passes] == ["capture pass 0", "capture pass 1"], passes
    assert len({pid for pid, _ in passes}) == 1, passes
    assert code == 0  # bench's own verdict agrees
