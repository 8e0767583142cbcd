"""The acceptance test (marker ``gpu``): FreeToken 0.2.1's real offline engine, every arm.

Nothing of FreeToken is substituted: the real Scheduler, Engine, GraphRunner, qwen4_exp model code
(GDN, QSA, PLE, MoE, FreeToken's triton and JIT kernels) and the disk PLE table in CUDA wait-sync
mode, on a synthetic seeded model (``bench.model.build_model_dir``). Each arm is a fresh engine
process; shim arms get only ``FT_GRAPH_UPLOAD`` in its environment, so this needs the package
installed (``pip install .``) for its ``.pth`` bootstrap to run there. What each record must show
is in ``gpu_checks``; CPU CI checks the same against the records of the last H200 run.
"""

from __future__ import annotations

import dataclasses

import pytest

from freetoken_graphfix import bootstrap
from freetoken_graphfix_bench import arms, model, records, target
from freetoken_graphfix_bench.cases import Case
from freetoken_graphfix_bench.engine.run import engine_case
from freetoken_graphfix_bench.registry import report_of
from freetoken_graphfix_bench.settings import EngineSettings
from tests.helpers import gpu_checks
from tests.helpers.bench_run import bench_record
from tests.helpers.gpu_records import keep

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]  # a module fixture runs whole engines


# 48 layers: the cost check (the never-uploaded arms never block at this size). 320 layers, #775's
# configuration (NVFP4 experts, MoE offload): every arm, where the never-uploaded ones block. Gate (no
# WAIT at all) is bench engine's, not needed here.
SMALL_ARMS = ["upstream", "no-upload", "skip", "auto"]
LARGE_ARMS = [a for a in arms.ARMS if a != arms.GATE]


def engine_record(name: str, layers: int, arm_names: list[str], tmp_path_factory, ft_args: tuple[str, ...] = (),
                  experts: str = "bf16", **over) -> records.EngineRecord:
    assert bootstrap.installed_pth() is not None, (
        "freetoken-graphfix is not installed in this interpreter's site-packages: the engine processes "
        "would never get the shim (pip install . first)")
    settings = EngineSettings(arms=tuple(arm_names), rounds=1, decode_steps=32, context=256, prompt_file=None,
                              replays=50, copies=2, trace_steps=0, trace_runs=1, warmup=True, watchdog=4.0,
                              hang_timeout=300.0)
    settings = dataclasses.replace(settings, **over)
    case = Case(target.synthetic(settings.context, settings.decode_steps, ft_args, experts), layers)
    record = records.EngineRecord([engine_case(case, settings, str(tmp_path_factory.mktemp(f"engine-{layers}")))])
    print("\n" + report_of(record).text)
    return keep(name, record)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """200 decode steps a request, #775's window: fewer leave the decode loop too few cycles to read the
    positive control back (32 gave ±2.5-5% on the H200, wider than the control)."""
    return engine_record("engine-small", 48, SMALL_ARMS, tmp_path_factory, decode_steps=200)


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """Every arm but gate at 320 layers with NVFP4 experts under MoE offload. No copies (their checks
    are the small model's) and no warm-up run (the small model's compiled the same kernels; a first
    arm that compiles them is only slower, never blocked)."""
    return engine_record("engine-large", 320, LARGE_ARMS, tmp_path_factory, ("--moe-strategy", "offload"), "nvfp4",
                         copies=0, warmup=False)


@pytest.fixture(scope="module")
def hybrid_locked(tmp_path_factory):
    """#775's configuration under hybrid with a quarter of the layers on the CPU executor and locked:
    FreeToken caps pinned memory where FREETOKEN_PIN_BUDGET_GB is set (engine.py _pin_budget_bytes), its
    --moe-cpu-layers then lock those layers' banks and hybrid fetches their misses through the locked
    fetch; both kinds of self-released WAIT sit beside the deferred first launch."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FREETOKEN_PIN_BUDGET_GB", "1")
        return engine_record("engine-hybrid-locked", 320, ["upstream", "no-upload", "auto", "patched"],
                             tmp_path_factory, ("--moe-strategy", "hybrid", "--moe-cpu-layers", "0.25"), "nvfp4",
                             copies=0, warmup=False)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """``bench engine --model`` on a config-only llama (16 layers) with FreeToken's dummy weights,
    through the CLI as a user runs it, on #775's workload (a 65,536-token context, 200 greedy decode
    steps): two rounds and two traced runs per arm. At that context the decode step is GPU-bound, so
    the positive control can be read back in the step as well as in the launch."""
    root = tmp_path_factory.mktemp("llama")
    model.write_model(str(root / "llama"), "llama", None)
    record, code = bench_record(["engine", "--model", str(root / "llama"), "--context", "65536", "--decode-steps",
                                 "200", "--rounds", "2", "--trace-steps", "8", "--replays", "50", "--copies", "2",
                                 "--", *model.ENGINE_FLAGS["llama"].split()], root)
    assert code == 0
    return keep("engine-llama", record)


@pytest.mark.parametrize("check", gpu_checks.for_record("engine-small"))
def test_small(small, check):
    check(small)


@pytest.mark.parametrize("check", gpu_checks.for_record("engine-large"))
def test_large(large, check):
    check(large)


@pytest.mark.parametrize("check", gpu_checks.for_record("engine-hybrid-locked"))
def test_hybrid_locked(hybrid_locked, check):
    check(hybrid_locked)


@pytest.mark.parametrize("check", gpu_checks.for_record("engine-llama"))
def test_llama(llama, check):
    check(llama)
