"""What ``bench engine`` installs on FreeToken at the engine process's start, before the engine is
built: one object per seam, each observing (and timing) what FreeToken does there and changing
nothing else.

- ``UploadSeam``: FreeToken's ``_upload_graph`` (0.2.x), timed, or skipped for the no-upload arm;
- ``WaitCounter``: the PLE table's WAIT, counted where it is captured into a graph;
- ``count_self_released_waits``: the WAITs the MoE offload's own threads release, counted likewise;
- ``CaptureSeam``: ``GraphRunner._capture_graphs``, timed; at the first capture, the copies of each
  graph (``child_copies``) and the positive control's spin, or CUPTI initialised for a traced run.

Module attributes are the seams, as for the shim: ``GraphRunner._capture_graphs`` looks
``_upload_graph`` up as a module global (graph.py 222) and ``ple_disk`` imports its WAIT function at
each lookup. A FreeToken carrying patches/, and 0.1.3, have no ``_upload_graph`` at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from importlib import import_module
from typing import Any

from child_copies import Driver, calibrate_control, destroy_all, keeping_graph_class, make_copies


def ple_flag_ops():
    """(module, name of its WAIT-enqueueing function, release(flag)) of the installed FreeToken: 0.2.x's
    ``kernel.row_store`` (``ple_disk.py`` imports ``wait_reset`` at each lookup), else 0.1.3's
    ``kernel._ple_store`` (its ``ple_disk.py`` 259-267 imports it inside ``lookup``). Both releases are a
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
    it in wait-sync mode alone (0.2.1's ``ple_disk.py`` 206-208), 0.1.3 in every mode, gate too, where a
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
        """The watchdog's thread: checks twenty times a second, so a blocked launch is released within 50 ms of its
        time."""
        while True:
            time.sleep(0.05)
            self.check()

    def check(self) -> None:
        """Release the flag of a launch that has waited longer than the watchdog's seconds, once, and count it: a
        blocked arm must end, and say it blocked."""
        started = self.started
        if started is not None and self.flag is not None and time.perf_counter() - started > self.seconds:
            self.started = None
            self.fired += 1
            self.release(self.flag)


class UploadSeam:
    """FreeToken's ``_upload_graph`` timed per call (``ms``), or, for the no-upload arm (``skip``), timed
    doing nothing. Whatever was there is what runs: the shim's wrapper where its bootstrap ran."""

    def __init__(self, graph_mod: Any, skip: bool) -> None:
        self.original = getattr(graph_mod, "_upload_graph", None)
        self.skip = skip
        self.ms: list[float] = []
        if self.original is not None:
            graph_mod._upload_graph = self.timed

    def timed(self, *args, **kwargs) -> None:
        """The wrapped ``_upload_graph``: FreeToken's (or the shim's) call timed, or nothing for the no-upload arm."""
        t0 = time.perf_counter()
        if not self.skip:
            self.original(*args, **kwargs)
        self.ms.append(1e3 * (time.perf_counter() - t0))


class WaitCounter:
    """The PLE table's WAIT-enqueueing function (``ple_flag_ops``), counting its calls while a graph is
    being captured (``captured``); ``release`` is that FreeToken's own flag release."""

    def __init__(self, capturing: Callable[[], bool]) -> None:
        self.module, self.name, self.release = ple_flag_ops()
        self.original = getattr(self.module, self.name)
        self.capturing = capturing
        self.captured = 0
        setattr(self.module, self.name, self.counting)

    def counting(self, *args):
        """The WAIT function, counting its calls made while a graph is captured: the report says how many WAITs each
        process's graphs hold."""
        self.captured += bool(self.capturing())
        return self.original(*args)


class CaptureSeam:
    """``GraphRunner._capture_graphs`` timed per call (``ms``). At the first capture: with ``trace``,
    CUPTI initialised before it (PyTorch #75504: graphs captured before go untraced); with
    ``copies``, each graph kept and copied (``make_copies``), and with ``control`` (a fraction of the
    graph's time) the positive control's spin calibrated (``calibrate_control``). Copies that cannot
    be made leave none behind and a note saying why (``notes``); the run goes on without them."""

    def __init__(self, runner_cls: Any, driver: Driver, release, copies: int, control: float,
                 trace: bool) -> None:
        self.driver, self.release = driver, release
        self.n_copies, self.control_added, self.trace = copies, control, trace
        self.ms: list[float] = []
        self.copies: dict[int, dict[str, int]] = {}  # bs: label: CUgraphExec
        self.control: dict = {}  # the spin's calibration, where copies were made with a control
        self.notes: list[str] = []
        original = runner_cls._capture_graphs

        def capture_graphs(runner, *args, **kwargs):
            return self.capture(original, runner, *args, **kwargs)

        runner_cls._capture_graphs = capture_graphs

    def capture(self, original, runner, *args, **kwargs):
        """The wrapped ``_capture_graphs``: timed, and at the first capture the tracer set up first and the copies made
        after, since both need the graphs as captured."""
        import torch

        first = not self.ms
        if self.trace and first:
            from torch.profiler import _utils

            _utils._init_for_cuda_graphs()  # CUDA is up here: Engine.__init__ asserts it is not, before
        cuda_graph, kept = torch.cuda.CUDAGraph, None
        if self.n_copies and not self.trace and first:  # graph.py 204: torch.cuda.CUDAGraph() per bs
            kept = keeping_graph_class()
            if kept is None:
                self.notes.append("no copies of the graphs: this torch's CUDAGraph cannot keep its graph")
            else:
                torch.cuda.CUDAGraph = kept
        t0 = time.perf_counter()
        try:
            out = original(runner, *args, **kwargs)
        finally:
            self.ms.append(1e3 * (time.perf_counter() - t0))
            torch.cuda.CUDAGraph = cuda_graph
        if kept is not None:
            model = args[2] if len(args) > 2 else kwargs.get("model")
            self.make_copies(runner, wait_flag(getattr(model, "_ple_table", None)))
        return out

    def make_copies(self, runner, flag) -> None:
        """Copies of each graph and the control's calibration, or none and a note: a process without copies still
        answers safety and the cross-process figures."""
        control = bool(self.control_added)
        try:
            self.copies.update(make_copies(runner, self.n_copies, flag, self.release, self.driver, control))
            if control:
                self.control.update(calibrate_control(self.copies, runner.stream, flag, self.release, self.driver,
                                                      self.control_added))
        except Exception as exc:  # the run goes on without copies, and the report says why
            self.notes.append(f"no copies of the graphs: {exc!r}")
            destroy_all(self.driver, self.copies)
            self.control.clear()
            if flag is not None:
                flag.zero_()  # no surplus release may reach the engine's own first WAIT
