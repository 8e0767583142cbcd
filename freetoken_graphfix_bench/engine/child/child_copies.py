"""The copies of each engine graph that ``bench engine`` launches in the decode loop, and their timing.

Each graph's ``cudaGraph_t`` is kept at capture (``keeping_graph_class``) and instantiated again as
fresh executables, as many uploaded (``cuGraphUpload`` then a sync, as 0.2.x's ``_upload_graph``) as
never uploaded, plus the positive control's two; the decode loop launches them in a fixed cycle
(``copy_labels``, ``LoopSchedule``) in the engine's own slot. Imports nothing of the package: it runs
in the engine process, which must get the shim through its ``.pth`` alone.
"""

from __future__ import annotations

import os


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
        """A CUDA driver call's error code as an exception naming the call: a failed copy must never be timed."""
        if rc:
            raise RuntimeError(f"{call} returned CUDA error {rc}")

    def instantiate(self, graph: int) -> int:
        """A fresh executable of ``graph`` (auto-free on launch, as torch instantiates the engine's own)."""
        handle = self.ct.c_void_p()
        self._check(self.cu.cuGraphInstantiateWithFlags(self.ct.byref(handle), self.ct.c_void_p(graph),
                                                        self.ct.c_ulonglong(1)), "cuGraphInstantiateWithFlags")
        return handle.value

    def upload(self, handle: int, stream: int) -> None:
        """``cuGraphUpload`` of an executable: what FreeToken 0.2.x does to every graph at capture."""
        self._check(self.cu.cuGraphUpload(self.ct.c_void_p(handle), self.ct.c_void_p(stream)), "cuGraphUpload")

    def launch(self, handle: int, stream: int) -> None:
        """``cuGraphLaunch`` of an executable on the engine's stream."""
        self._check(self.cu.cuGraphLaunch(self.ct.c_void_p(handle), self.ct.c_void_p(stream)), "cuGraphLaunch")

    def destroy(self, handle: int) -> None:
        """Free an executable the loop no longer launches."""
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
        """The executable this bs launches at its next graph step, by the fixed cycle: its label, and its handle
        (``None``: the engine's own)."""
        k = self.steps[bs] = self.steps.get(bs, -1) + 1
        label = loop_schedule(self.labels.get(bs, ["own"]), k)
        return label, self.copies.get(bs, {}).get(label)


def make_copies(runner, copies: int, flag, release, driver: Driver,
                control: bool = False) -> dict[int, dict[str, int]]:
    """Per bs, ``copies`` fresh executables of the engine's graph uploaded (``cuGraphUpload`` then a
    sync, as 0.2.x's ``_upload_graph``) and as many never uploaded (with ``control``, two more never
    uploaded for the positive control), right after the capture. Each is launched once here with its
    WAIT released just before (the flag back at 0 after it, checked), so none can block in the loop;
    the offload cache is then reset as the capture leaves it (0.2.1's ``graph.py`` 228). Copies share the
    graph's memory and differ from its executable only in the upload. Where one fails, those made
    are destroyed before the error goes on."""
    stream = runner.stream
    made: dict[int, dict[str, int]] = {}
    try:
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
                    raise RuntimeError(f"bs {bs} {label}: the copy's first launch left the PLE flag at "
                                       f"{int(flag[0])}")
    except BaseException:
        destroy_all(driver, made)
        raise
    reset = getattr(runner, "_reset_moe_offload_cache", None)
    if reset is not None:
        reset()
    return made


def destroy_all(driver: Driver, copies: dict[int, dict[str, int]]) -> None:
    """Every copy's executable destroyed, and the record of them emptied."""
    for made in copies.values():
        for handle in made.values():
            driver.destroy(handle)
    copies.clear()


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

    bench = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/engine/child/
    spec = spec_from_file_location("graphfix_spin", os.path.join(bench, "spin.py"))
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


