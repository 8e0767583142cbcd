"""One arm of ``bench --engine``: FreeToken's real offline engine in this fresh process.

Run by path (``python _engine_child.py SPEC.json``), never imported, and it imports nothing of
freetoken_graphfix: the shim must reach this process the way it reaches a user's engine, through
its ``.pth`` bootstrap and ``FT_GRAPH_UPLOAD``. The engine is built from FreeToken's own ``ft serve``
options (its own parser), as ``ft serve`` would build it. What this adds is instrumentation only:
timing wrappers on ``_upload_graph`` (0.2.x) and ``GraphRunner._capture_graphs``, a counter on the
PLE table's WAIT (``row_store.wait_reset`` in 0.2.x, ``_ple_store.memop_wait_reset`` in 0.1.3) and
on the Python calls that enqueue the MoE offload's self-released WAITs (``self_released_waits``), CUDA
events around ``Engine.forward_batch``, ``GraphRunner.replay`` and each graph launch, free GPU memory
around each graph's first launch, and a launch watchdog that releases the PLE flag when a graph
launch blocks, so a deadlock is reported instead of hanging.

With ``spec["copies"]`` the capture also keeps each graph's ``cudaGraph_t`` and makes fresh
executables of it, as many uploaded as never uploaded, each launched once right after the capture
with its WAIT released beforehand; the decode loop then launches, step by step in a fixed cycle
(``loop_schedule``), the engine's own executable and those copies in the engine's own slot (same
graph, same memory, same inputs, the WAIT released by the step's own fill), so the upload is
measured inside the decode loop of one process. A traced run (``spec["trace"]``) initialises CUPTI
before the capture, makes no copies, and records the decode workload's kernel timeline instead of
timing it.
Prints one ``GRAPHFIX_ENGINE_RESULT {json}`` line.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import sys
import threading
import time
from importlib import import_module, metadata

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # run by path: the package directory must not shadow top-level modules

RESULT_TAG = "GRAPHFIX_ENGINE_RESULT "


def ple_flag_ops():
    """(module, name of its WAIT-enqueueing function, release(flag)) of the installed FreeToken: 0.2.x's
    ``kernel.row_store`` (``ple_disk.py`` imports ``wait_reset`` at each lookup), else 0.1.3's
    ``kernel._ple_store`` (``ple_disk.py:259-267`` imports it inside ``lookup``). Both releases are a
    plain host store, safe from any thread."""
    try:
        from freetoken.kernel import row_store
    except ImportError:
        from freetoken.kernel import _ple_store

        return _ple_store, "memop_wait_reset", lambda flag: _ple_store.signal_flag(flag.data_ptr())
    return row_store, "wait_reset", row_store.signal


# The WAITs FreeToken enqueues from C++ and its own threads release (the CPU-MoE executor's flag,
# locked-fetch copies): (module, class, the method whose call enqueues one, whether this instance
# uses stream memops). cpu_executor.py 601-611: decode_sync's flag_wait when _flag_sync;
# locked_fetch.py 211-225: copy's publish, whose C++ waits when memops (_wait_flag 0).
SELF_RELEASED = {
    "cpu_moe": ("freetoken.moe.cpu_executor", "CpuMoeExecutor", "decode_sync",
                lambda ex: bool(getattr(ex, "_flag_sync", False))),
    "locked_fetch": ("freetoken.moe.locked_fetch", "LockedLayerFetch", "copy",
                     lambda lf: getattr(lf, "_wait_flag", None) == 0),
}


def count_self_released_waits(capturing, seams: dict = SELF_RELEASED) -> dict[str, int | None]:
    """Count, per kind, the self-released WAITs captured into graphs: a call of the enqueueing method
    while ``capturing()``, on an instance using memops (without them FreeToken syncs through host
    functions or a spinning kernel: no WAIT). ``None`` for a kind this FreeToken lacks (0.1.3 has no
    locked fetch). Observes only: the original method runs unchanged."""
    counts: dict[str, int | None] = {}
    for kind, (module, cls_name, method, memops) in seams.items():
        try:
            cls = getattr(import_module(module), cls_name)
        except (ImportError, AttributeError):
            counts[kind] = None
            continue
        counts[kind] = 0
        original = getattr(cls, method)

        def counting(self, *args, _original=original, _kind=kind, _memops=memops, **kwargs):
            if capturing() and _memops(self):
                counts[_kind] += 1
            return _original(self, *args, **kwargs)

        setattr(cls, method, counting)
    return counts


def wait_flag(table: object) -> object | None:
    """The pinned flag the decode graphs WAIT on, or ``None`` where they hold no WAIT: 0.2.x allocates
    it in wait-sync mode alone (``ple_disk.py:206-208``), 0.1.3 in every mode, gate too, where a
    release would only leave it at 1."""
    return getattr(table, "_flag", None) if getattr(table, "_wait_sync", False) else None


class LaunchWatchdog:
    """Polls the launch in progress; one that has been inside the launch call for ``seconds`` is
    blocked behind its own WAIT, so release the WAIT's flag the way the fill would. Polling keeps
    the per-step cost to two attribute stores (a thread per step would add to the step time)."""

    def __init__(self, flag, seconds: float, release) -> None:
        self.flag, self.seconds, self.release = flag, seconds, release
        self.started: float | None = None  # perf_counter() when the launch in progress began
        self.fired = 0
        threading.Thread(target=self._run, name="graphfix-launch-watchdog", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(0.05)
            started = self.started
            if started is not None and self.flag is not None and time.perf_counter() - started > self.seconds:
                self.started = None
                self.fired += 1
                self.release(self.flag)


def keeping_graph_class():
    """``torch.cuda.CUDAGraph`` that also keeps its ``cudaGraph_t``: instantiated at capture end as
    FreeToken's own graphs are (``keep_graph=False`` instantiates there too), so ``_upload_graph``
    sees the same executable, and fresh executables of the very same graph can be made afterwards.
    ``None`` where this torch cannot keep a graph."""
    import inspect

    import torch

    if "keep_graph" not in inspect.signature(torch.cuda.CUDAGraph.__new__).parameters:
        return None

    class KeptGraph(torch.cuda.CUDAGraph):
        def __new__(cls, keep_graph: bool = False):
            return super().__new__(cls, True)

        def __init__(self, keep_graph: bool = False) -> None:
            super().__init__(True)  # torch's binding reads keep_graph here, not in __new__

        def capture_end(self) -> None:
            super().capture_end()
            self.instantiate()

    return KeptGraph


class Driver:
    """The CUDA driver calls the copies need (ctypes: this process imports nothing of the package)."""

    def __init__(self) -> None:
        import ctypes

        self.ct, self.cu = ctypes, ctypes.CDLL("libcuda.so.1")

    def _check(self, rc: int, call: str) -> None:
        if rc:
            raise RuntimeError(f"{call} returned CUDA error {rc}")

    def instantiate(self, graph: int) -> int:
        handle = self.ct.c_void_p()
        self._check(self.cu.cuGraphInstantiateWithFlags(self.ct.byref(handle), self.ct.c_void_p(graph),
                                                        self.ct.c_ulonglong(1)), "cuGraphInstantiateWithFlags")
        return handle.value

    def upload(self, handle: int, stream: int) -> None:
        self._check(self.cu.cuGraphUpload(self.ct.c_void_p(handle), self.ct.c_void_p(stream)), "cuGraphUpload")

    def launch(self, handle: int, stream: int) -> None:
        self._check(self.cu.cuGraphLaunch(self.ct.c_void_p(handle), self.ct.c_void_p(stream)), "cuGraphLaunch")

    def destroy(self, handle: int) -> None:
        self.cu.cuGraphExecDestroy(self.ct.c_void_p(handle))


def copy_labels(copies: int, control: bool = False) -> list[str]:
    """The executables of one graph in the decode loop, in the order of a cycle: the copies in pairs
    laid out uploaded-never, never-uploaded (ABBA), the engine's own graph in the middle, so that with
    an even number of copies the uploaded ones, the never-uploaded ones and the own graph sit at the
    same mean position (a drift over the cycle lands on each kind alike). With ``control``, the
    positive control's two executables (never uploaded, a spin after each launch) open and close the
    cycle: their mean position is the middle too."""
    pairs = [[f"uploaded:{i}", f"never:{i}"][::1 if i % 2 == 0 else -1] for i in range(copies)]
    order = [label for pair in pairs for label in pair]
    labels = [*order[:copies], "own", *order[copies:]]
    return ["control:0", *labels, "control:1"] if control and copies else labels


def loop_schedule(labels: list[str], k: int) -> str:
    """The executable the ``k``-th graph step of a size launches after that size's first launch: the
    cycle's order (``copy_labels``) over and over. No executable is ever launched twice in a row:
    the first of a cycle differs from the last, and a relaunch of the very executable just launched
    may run faster than any other, which would favour one copy."""
    return labels[k % len(labels)]


class LoopSchedule:
    """Which executable each graph step of a size runs after that size's first launch: the cycle of
    ``copy_labels`` for the copies ``make_copies`` made, the engine's own graph (handle ``None``)
    where a size has none."""

    def __init__(self, copies: dict[int, dict[str, int]]) -> None:
        self.copies = copies
        self.labels = {bs: copy_labels(sum(label.startswith("never") for label in made),
                                       any(label.startswith("control") for label in made))
                       for bs, made in copies.items()}
        self.steps: dict[int, int] = {}  # bs: graph steps after its first launch, so far

    def next(self, bs: int) -> tuple[str, int | None]:
        k = self.steps[bs] = self.steps.get(bs, -1) + 1
        label = loop_schedule(self.labels.get(bs, ["own"]), k)
        return label, self.copies.get(bs, {}).get(label)


def make_copies(runner, copies: int, flag, release, driver: Driver,
                control: bool = False) -> dict[int, dict[str, int]]:
    """Per bs, ``copies`` fresh executables of the engine's graph uploaded (``cuGraphUpload`` then a
    sync, as 0.2.x's ``_upload_graph``) and as many never uploaded (with ``control``, two more never
    uploaded for the positive control), right after the capture. Each is
    launched once here with its WAIT released just before (the flag back at 0 after it, checked), so
    none can block in the loop; the offload cache is then reset as the capture leaves it
    (``graph.py`` 228). Copies share the graph's memory and differ from its executable only in the
    upload."""
    stream = runner.stream
    made: dict[int, dict[str, int]] = {}
    for bs, graph in runner.graph_map.items():
        made[bs] = {}
        for label in (label for label in copy_labels(copies, control) if label != "own"):
            handle = made[bs][label] = driver.instantiate(graph.raw_cuda_graph())
            if label.startswith("uploaded"):
                driver.upload(handle, stream.cuda_stream)
                stream.synchronize()
            if flag is not None:
                flag.zero_()  # exactly one release per launch
                release(flag)
            driver.launch(handle, stream.cuda_stream)
            stream.synchronize()
            if flag is not None and int(flag[0]) != 0:
                raise RuntimeError(f"bs {bs} {label}: the copy's first launch left the PLE flag at {int(flag[0])}")
    reset = getattr(runner, "_reset_moe_offload_cache", None)
    if reset is not None:
        reset()
    return made


class StandIn:
    """Takes the place of ``graph_map[bs]`` for one step: ``GraphRunner.replay`` (graph.py 238-240)
    looks the graph up and calls its ``replay()``, which here launches the step's executable."""

    __slots__ = ("replay",)

    def __init__(self, launch) -> None:
        self.replay = launch


def timed_launch(driver: Driver, handle: int, stream, flag, release, events) -> float:
    """GPU ms of one launch of the executable ``handle`` on ``stream``, between the two ``events``,
    its WAIT (if ``flag``) released just before."""
    start, end = events
    if flag is not None:
        flag.zero_()
        release(flag)
    start.record(stream)
    driver.launch(handle, stream.cuda_stream)
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end)


def time_replays(runner, stream, flag, reps: int, copies: dict[int, dict[str, int]], release,
                 driver: Driver) -> tuple[dict, dict]:
    """A diagnostic after the workload: GPU ms of each engine graph and of its copies replayed back to
    back from an idle GPU, every executable in rotated order, the WAIT released just before each
    launch. Inside one process the copies' ratio is the upload alone; the engine's own graph over its
    never-uploaded copies divides the process's own speed out."""
    import torch

    keys = [(bs, "own") for bs in runner.graph_map] + [(bs, label) for bs in copies for label in copies[bs]]
    execs = {key: runner.graph_map[key[0]].raw_cuda_graph_exec() if key[1] == "own" else copies[key[0]][key[1]]
             for key in keys}
    times: dict[tuple[int, str], list[float]] = {key: [] for key in keys}
    events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for rep in range(reps + 3):  # the first 3 are warm-up
        for key in keys[rep % len(keys):] + keys[:rep % len(keys)]:
            ms = timed_launch(driver, execs[key], stream, flag, release, events)
            if rep >= 3:
                times[key].append(round(ms, 5))
    own = {str(bs): times[bs, "own"] for bs in runner.graph_map}
    copied = {str(bs): {kind: [times[bs, label] for label in labels if label.startswith(kind)]
                        for kind in ("uploaded", "never")} for bs, labels in copies.items()}
    return own, copied


def spin_module():
    """``bench/spin.py``, loaded by path: importing it as part of the package would import the package."""
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("graphfix_spin", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                  "spin.py"))
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def calibrate_control(copies: dict[int, dict[str, int]], stream, flag, release, driver: Driver,
                      added: float, launches: int = 10) -> dict:
    """The positive control's spin: ``added`` of the largest graph's GPU time, timed here on its
    never-uploaded copies in turn (the WAIT released before each launch), then calibrated
    (``spin.calibrate``); the decode loop launches it right after each control executable."""
    import torch

    bs = max(copies)
    never = [h for label, h in copies[bs].items() if label.startswith("never")]
    events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = [1e3 * timed_launch(driver, never[k % len(never)], stream, flag, release, events) for k in range(launches)]
    graph_us = sorted(times)[len(times) // 2]
    return {**spin_module().calibrate(added * graph_us, stream), "graph_us": graph_us, "bs": bs}


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


def trace_decode(run, path: str) -> None:
    """Run the workload under the profiler (CUDA activity only) and write Kineto's chrome trace."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
    prof.export_chrome_trace(path)


def main(spec_path: str) -> None:
    with open(spec_path) as fh:
        spec = json.load(fh)
    faulthandler.dump_traceback_later(spec["hang_timeout_s"], exit=True)  # never hang the bench

    import freetoken.engine.graph as graph_mod
    import torch
    from freetoken.core import SamplingParams
    from freetoken.llm import LLM

    assert not torch.cuda.is_initialized(), "Engine.__init__ must initialise CUDA itself"
    trace = spec.get("trace")

    # GraphRunner._capture_graphs looks _upload_graph up as a module global (graph.py 222) and
    # ple_disk imports its WAIT function at each lookup: module attributes are the seams, as for the
    # shim. A FreeToken carrying patches/, and 0.1.3, have no _upload_graph at all.
    upload_ms: list[float] = []
    upload = getattr(graph_mod, "_upload_graph", None)  # the shim's wrapper when its bootstrap ran here

    def timed_upload(*args, **kwargs) -> None:
        t0 = time.perf_counter()
        if not spec["no_upload"]:
            upload(*args, **kwargs)
        upload_ms.append(1e3 * (time.perf_counter() - t0))

    if upload is not None:
        graph_mod._upload_graph = timed_upload
    captured_waits = [0]
    wait_module, wait_name, release = ple_flag_ops()
    wait_reset = getattr(wait_module, wait_name)

    def counting_wait_reset(*args):
        captured_waits[0] += torch.cuda.is_current_stream_capturing()
        return wait_reset(*args)

    setattr(wait_module, wait_name, counting_wait_reset)
    self_released = count_self_released_waits(torch.cuda.is_current_stream_capturing)
    capture_ms: list[float] = []
    runner_cls = graph_mod.GraphRunner
    capture = runner_cls._capture_graphs
    driver = Driver()
    copies: dict[int, dict[str, int]] = {}  # bs: label: CUgraphExec, made at the first capture
    control: dict = {}  # the positive control's spin (calibrate_control), where copies were made
    copy_notes: list[str] = []

    def timed_capture(self, *args, **kwargs):
        if trace and not capture_ms:
            from torch.profiler import _utils

            # CUPTI must be initialised before graphs are captured, or their kernels go untraced
            # (PyTorch #75504); here CUDA is up (Engine.__init__ asserts it is not, before).
            _utils._init_for_cuda_graphs()
        cuda_graph, kept = torch.cuda.CUDAGraph, None
        if spec["copies"] and not trace and not capture_ms:  # graph.py 204: torch.cuda.CUDAGraph() per bs
            kept = keeping_graph_class()
            if kept is None:
                copy_notes.append("no copies of the graphs: this torch's CUDAGraph cannot keep its graph")
            else:
                torch.cuda.CUDAGraph = kept
        t0 = time.perf_counter()
        try:
            out = capture(self, *args, **kwargs)
        finally:
            capture_ms.append(1e3 * (time.perf_counter() - t0))
            torch.cuda.CUDAGraph = cuda_graph
        if kept is not None:
            model = args[2] if len(args) > 2 else kwargs.get("model")
            flag = wait_flag(getattr(model, "_ple_table", None))
            try:
                copies.update(make_copies(self, spec["copies"], flag, release, driver, bool(spec.get("control"))))
                if spec.get("control"):
                    control.update(calibrate_control(copies, self.stream, flag, release, driver, spec["control"]))
            except Exception as exc:  # the run goes on without copies, and the report says why
                copy_notes.append(f"no copies of the graphs: {exc!r}")
                for labels in copies.values():
                    for handle in labels.values():
                        driver.destroy(handle)
                copies.clear()
                control.clear()
                if flag is not None:
                    flag.zero_()  # no surplus release may reach the engine's own first WAIT
        return out

    runner_cls._capture_graphs = timed_capture

    t0 = time.perf_counter()
    dtype, options = engine_options(spec["model_dir"], spec["ft_args"])
    llm = LLM(spec["model_dir"], dtype=dtype, **options)
    build_s = time.perf_counter() - t0
    eng, runner = llm.engine, llm.engine.graph_runner
    free_after_capture = torch.cuda.mem_get_info()[0]
    table = getattr(eng.model, "_ple_table", None)
    flag = wait_flag(table)
    dog = LaunchWatchdog(flag, spec["watchdog_s"], release)
    launches: list[tuple[int, float]] = []  # (bs, host ms of the replay call)
    first_launch_free: dict[str, list[int]] = {}  # bs: free bytes before and after its first launch
    steps: list[dict] = []
    fires: list[dict] = []
    seen_bs: set[int] = set()
    schedule = LoopSchedule(copies)
    pending: dict = {}  # what the replay of the step in progress recorded, for forward_batch

    def event():
        return torch.cuda.Event(enable_timing=True)

    def replay(batch):  # instance attribute; the class attribute is looked up per call (deferred hooks)
        bs = batch.padded_size
        first = str(bs) not in first_launch_free
        own = runner.graph_map[bs]
        if first:  # the arm's own first launch, untouched
            first_launch_free[str(bs)] = [torch.cuda.mem_get_info()[0]]
        else:
            label, handle = schedule.next(bs)
            begin, finish = event(), event()

            def launch() -> None:
                begin.record()
                if handle is None:
                    own.replay()
                else:
                    driver.launch(handle, torch.cuda.current_stream().cuda_stream)
                    if label.startswith("control"):
                        torch.cuda._sleep(control["spin_cycles"])  # the control's known extra GPU time
                finish.record()

            runner.graph_map[bs] = StandIn(launch)
            pending.update(exec=label, launch=(begin, finish))
        start, end = event(), event()
        start.record(eng.stream)
        t = dog.started = time.perf_counter()
        try:
            return runner_cls.replay(runner, batch)
        finally:
            dog.started = None
            runner.graph_map[bs] = own
            launches.append((bs, 1e3 * (time.perf_counter() - t)))
            end.record(eng.stream)
            if first:
                first_launch_free[str(bs)].append(torch.cuda.mem_get_info()[0])
            else:
                pending["graph"] = (start, end)

    forward = eng.forward_batch

    def forward_batch(batch, args):  # instance attribute: the scheduler calls self.engine.forward_batch
        on_graph = runner.can_use_cuda_graph(batch)
        bs = batch.padded_size if on_graph else batch.size
        fired_before = dog.fired
        start, end = event(), event()
        pending.clear()
        start.record(eng.stream)
        t = time.perf_counter()
        out = forward(batch, args)
        host_ms = 1e3 * (time.perf_counter() - t)
        end.record(eng.stream)
        if dog.fired > fired_before:
            # the watchdog and then the fill each released this step's WAIT: drop the surplus, or
            # every later WAIT would pass before its own fill (stale rows)
            eng.stream.synchronize()
            fires.append({"step": len(steps), "bs": bs, "flag_after": int(flag[0])})
            flag.zero_()
        kind = "graph" if on_graph else ("decode" if batch.is_decode else "prefill")
        steps.append({"kind": kind, "bs": bs, "first": on_graph and bs not in seen_bs, "events": (start, end),
                      "host_ms": host_ms, **pending})
        if on_graph:
            seen_bs.add(bs)
        return out

    runner.replay, eng.forward_batch = replay, forward_batch
    steps_per_request = trace["steps"] if trace else spec["decode_steps"]
    params = SamplingParams(temperature=0.0, max_tokens=steps_per_request, ignore_eos=True)
    prompts = spec["prompts"]
    outs: list = []

    def workload() -> None:  # bs 2 (the pair at once), then bs 1
        if spec["pair"]:
            outs.extend(llm.generate([prompts["left"], prompts["right"]], params))
        outs.extend(llm.generate([prompts["single"]], params))

    if trace:
        trace_decode(workload, trace["path"])
    else:
        workload()
    torch.cuda.synchronize()

    def ms(events) -> float:
        return round(events[0].elapsed_time(events[1]), 5)

    warm: dict[str, list[dict]] = {}  # per bs: the graph steps after each graph's first
    for s in steps:
        s["gpu_ms"] = ms(s.pop("events"))
        if s["kind"] == "graph" and not s["first"]:
            warm.setdefault(str(s["bs"]), []).append(s)
    first_launch: dict[str, float] = {}
    for bs, host_ms in launches:
        first_launch.setdefault(str(bs), host_ms)
    token_ids = [o["token_ids"] for o in outs]
    shim = sys.modules.get("freetoken_graphfix")  # observed, never imported here
    result = {
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
        "freetoken": metadata.version("freetoken"),
        "freetoken_patched": carries_series(),
        "freetoken_file": graph_mod.__file__,
        "freetoken_uploads": upload is not None,  # FreeToken's own protection (#697), absent in 0.1.3
        "table": type(table).__name__, "wait_sync": bool(getattr(table, "_wait_sync", False)),
        "fill_worker": getattr(table, "_worker", None) is not None, "hip": torch.version.hip is not None,
        "graph_bs": sorted(runner.graph_map), "captured_waits": captured_waits[0],
        "self_released_waits": self_released,
        "capture_ms": capture_ms, "upload_ms": upload_ms, "build_s": build_s,
        "steps": {k: sum(s["kind"] == k for s in steps) for k in ("prefill", "decode", "graph")},
        "fires": fires, "first_launch_ms": first_launch,
        "max_launch_ms": max((host_ms for _, host_ms in launches), default=None),
        "free_mib_after_capture": free_after_capture / 2**20,
        "first_launch_free_mib": {bs: [v / 2**20 for v in free] for bs, free in first_launch_free.items()},
        "first_step_gpu_ms": {str(s["bs"]): s["gpu_ms"] for s in steps if s["first"]},
        "step_gpu_ms": {bs: [s["gpu_ms"] for s in ss] for bs, ss in warm.items()},
        "step_host_ms": {bs: [round(s["host_ms"], 5) for s in ss] for bs, ss in warm.items()},
        "graph_gpu_ms": {bs: [ms(s["graph"]) for s in ss] for bs, ss in warm.items()},
        "launch_gpu_ms": {bs: [ms(s["launch"]) for s in ss] for bs, ss in warm.items()},
        "step_exec": {bs: [s["exec"] for s in ss] for bs, ss in warm.items()},
        "copies_made": {str(bs): sum(label.startswith("never") for label in made) for bs, made in copies.items()},
        "control_spin": control or None,
        "prompt_tokens": {name: len(ids) for name, ids in prompts.items()},
        "tokens": [len(t) for t in token_ids],
        "distinct_tokens": len({t for ids in token_ids for t in ids}),
        "token_hash": hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:16],
        "token_ids": token_ids,
        "shim": None if shim is None else {k: v for k, v in shim.status().items() if k != "freetoken"},
    }
    if copy_notes:
        result["copies_error"] = "; ".join(copy_notes)
    if trace:
        result["launch_bs"] = [bs for bs, _ in launches]
    else:
        try:
            result["replay_gpu_ms"], result["copies_gpu_ms"] = time_replays(
                runner, eng.stream, flag, spec["replays"], copies, release, driver)
        except Exception as exc:  # report the run's figures even so
            result["replay_error"] = repr(exc)
    for made in copies.values():
        for handle in made.values():
            driver.destroy(handle)
    faulthandler.cancel_dump_traceback_later()
    print(RESULT_TAG + json.dumps(result), flush=True)
    try:
        llm.shutdown()
    except Exception as exc:  # the result is out; a teardown error must not hide it
        print(f"shutdown: {exc!r}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
