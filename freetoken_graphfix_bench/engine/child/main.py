"""One arm of ``bench engine``: FreeToken's real offline engine in this fresh process.

Run by path (``python child/main.py SPEC.json``), never imported, and it imports nothing of
freetoken_graphfix: the shim must reach this process the way it reaches a user's engine, through
its ``.pth`` bootstrap and ``FT_GRAPH_UPLOAD``. Its sibling modules (``child_*.py``) come from this
file's own directory, which Python puts first on ``sys.path``. The engine is built from FreeToken's
own ``ft serve`` options (its own parser), as ``ft serve`` would build it. What this adds is
instrumentation only: the seams of ``child_seams`` (the upload, the WAITs, the capture, the copies and
the positive control), the timed decode loop of ``child_loop`` with its launch watchdog, which
releases the PLE flag when a graph launch blocks so a deadlock is reported instead of hanging, and
the record this file writes.

With ``spec["copies"]`` the capture also keeps each graph's ``cudaGraph_t`` and makes fresh
executables of it, as many uploaded as never uploaded, each launched once right after the capture
with its WAIT released beforehand; the decode loop then launches, step by step in a fixed cycle
(``child_copies.loop_schedule``), the engine's own executable and those copies in the engine's own
slot (same graph, same memory, same inputs, the WAIT released by the step's own fill), so the upload
is measured inside the decode loop of one process. A traced run (``spec["trace"]``) initialises
CUPTI before the capture, makes no copies, and records the decode workload's kernel timeline instead
of timing it. Prints one ``GRAPHFIX_ENGINE_RESULT {json}`` line.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import sys
import time
from importlib import metadata
from typing import Any

from child_copies import Driver, LoopSchedule, destroy_all, time_replays
from child_loop import DecodeLoop
from child_seams import (
    CaptureSeam,
    LaunchWatchdog,
    UploadSeam,
    WaitCounter,
    count_self_released_waits,
    wait_flag,
)

RESULT_TAG = "FREETOKEN_GRAPHFIX_RESULT "  # child.RESULT_TAG: this process must not import the package


def carries_series() -> bool:
    """Whether this FreeToken carries patches/: its DiskRowTable.lookup records the sizes it is
    captured at (``self._unlaunched_bs``, the marker the shim's compat check reads too)."""
    import inspect

    try:
        from freetoken.models.qwen4_exp.ple_disk import DiskRowTable
    except ImportError:  # a release without the disk PLE table
        return False
    return "self._unlaunched_bs" in inspect.getsource(DiskRowTable.lookup)


def engine_options(model_dir: str, ft_args: list[str]):
    """(dtype, the keyword arguments of ``freetoken.llm.LLM``) from FreeToken's own ``ft serve`` parser:
    every SchedulerConfig field as ``ft serve`` would set it; the server-only ones are not the engine's."""
    import dataclasses

    from freetoken.scheduler.config import SchedulerConfig
    from freetoken.server.args import parse_args

    args, _ = parse_args(["--model", model_dir, *ft_args])
    own = ("model_path", "tp_info", "dtype", "offline_mode", "_unique_suffix")  # LLM sets these itself
    return args.dtype, {f.name: getattr(args, f.name) for f in dataclasses.fields(SchedulerConfig)
                        if f.init and f.name not in own}


def run_workload(llm: Any, spec: dict[str, Any]) -> list:
    """#775's workload, greedy: the pair of prompts at once (bs 2, where the engine runs two), then the
    single one (bs 1); under the profiler (CUDA activity only) for a traced run, whose chrome trace
    is written to its path."""
    from freetoken.core import SamplingParams

    trace = spec.get("trace")
    params = SamplingParams(temperature=0.0, max_tokens=trace["steps"] if trace else spec["decode_steps"],
                            ignore_eos=True)
    prompts, outs = spec["prompts"], []

    def workload() -> None:
        if spec["pair"]:
            outs.extend(llm.generate([prompts["left"], prompts["right"]], params))
        outs.extend(llm.generate([prompts["single"]], params))

    if trace:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            workload()
        prof.export_chrome_trace(trace["path"])
    else:
        workload()
    return outs


def engine_result(graph_mod: Any, upload: UploadSeam, waits: WaitCounter, self_released: dict,
                  capture: CaptureSeam, loop: DecodeLoop, table: Any, build_s: float, free_after_capture: int,
                  prompts: dict[str, list[int]], outs: list) -> dict[str, Any]:
    """The process's record: what ran (versions, the table, the graphs, the WAITs), the seams'
    figures, the decode loop's, and the tokens."""
    import torch

    token_ids = [o["token_ids"] for o in outs]
    shim = sys.modules.get("freetoken_graphfix")  # observed, never imported here
    result = {
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
        "freetoken": metadata.version("freetoken"),
        "freetoken_patched": carries_series(),
        "freetoken_file": graph_mod.__file__,
        "freetoken_uploads": upload.original is not None,  # FreeToken's own protection (#697), absent in 0.1.3
        "table": type(table).__name__, "wait_sync": bool(getattr(table, "_wait_sync", False)),
        "fill_worker": getattr(table, "_worker", None) is not None, "hip": torch.version.hip is not None,
        "graph_bs": sorted(loop.runner.graph_map), "captured_waits": waits.captured,
        "self_released_waits": self_released,
        "capture_ms": capture.ms, "upload_ms": upload.ms, "build_s": build_s,
        "free_mib_after_capture": free_after_capture / 2**20,
        **loop.figures(),
        "copies_made": {str(bs): sum(label.startswith("never") for label in made)
                        for bs, made in capture.copies.items()},
        "control_spin": capture.control or None,
        "prompt_tokens": {name: len(ids) for name, ids in prompts.items()},
        "tokens": [len(t) for t in token_ids],
        "distinct_tokens": len({t for ids in token_ids for t in ids}),
        "token_hash": hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:16],
        "token_ids": token_ids,
        "shim": None if shim is None else {k: v for k, v in shim.status().items() if k != "freetoken"},
    }
    if capture.notes:
        result["copies_error"] = "; ".join(capture.notes)
    return result


def main(spec_path: str) -> None:
    """Run one arm as its spec says and write its record: FreeToken's LLM on the workload, with the seams installed
    before the engine exists."""
    with open(spec_path) as fh:
        spec = json.load(fh)
    faulthandler.dump_traceback_later(spec["hang_timeout_s"], exit=True)  # never hang the bench

    import freetoken.engine.graph as graph_mod
    import torch
    from freetoken.llm import LLM

    assert not torch.cuda.is_initialized(), "Engine.__init__ must initialise CUDA itself"
    trace, driver = spec.get("trace"), Driver()
    upload = UploadSeam(graph_mod, skip=spec["no_upload"])
    waits = WaitCounter(torch.cuda.is_current_stream_capturing)
    self_released = count_self_released_waits(torch.cuda.is_current_stream_capturing)
    capture = CaptureSeam(graph_mod.GraphRunner, driver, waits.release, spec["copies"],
                          spec.get("control") or 0.0, bool(trace))

    t0 = time.perf_counter()
    dtype, options = engine_options(spec["model_dir"], spec["ft_args"])
    llm = LLM(spec["model_dir"], dtype=dtype, **options)
    build_s = time.perf_counter() - t0
    eng = llm.engine
    free_after_capture = torch.cuda.mem_get_info()[0]
    table = getattr(eng.model, "_ple_table", None)
    flag = wait_flag(table)
    loop = DecodeLoop(eng, eng.graph_runner, graph_mod.GraphRunner, LoopSchedule(capture.copies), driver,
                      LaunchWatchdog(flag, spec["watchdog_s"], waits.release), flag,
                      capture.control.get("spin_cycles"))
    loop.install()
    outs = run_workload(llm, spec)
    torch.cuda.synchronize()

    result = engine_result(graph_mod, upload, waits, self_released, capture, loop, table, build_s,
                           free_after_capture, spec["prompts"], outs)
    if trace:
        result["launch_bs"] = [bs for bs, _ in loop.launches]
    else:
        try:
            result["replay_gpu_ms"], result["copies_gpu_ms"] = time_replays(
                eng.graph_runner, eng.stream, flag, spec["replays"], capture.copies, waits.release, driver)
        except Exception as exc:  # report the run's figures even so
            result["replay_error"] = repr(exc)
    destroy_all(driver, capture.copies)
    faulthandler.cancel_dump_traceback_later()
    print(RESULT_TAG + json.dumps(result), flush=True)
    try:
        llm.shutdown()
    except Exception as exc:  # the result is out; a teardown error must not hide it
        print(f"shutdown: {exc!r}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
