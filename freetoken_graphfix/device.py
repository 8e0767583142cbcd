"""The thin seam between the decisions and the GPU, so their logic runs on CPU in tests.

Flags are 1-element int64 host tensors (pinned on CUDA); they are read and written from the host
with plain loads and stores, exactly as the GPU's stream memops see them, on any device.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol


class Device(Protocol):
    """What the protections need from the device: capture state, launch, upload, bounded wait, rank
    count, and the calling thread's device for the helper threads it starts."""

    def is_capturing(self) -> bool:
        """Whether the calling thread's current stream is capturing a graph: a WAIT enqueued then belongs to that
        graph."""

    def replay(self, graph: Any, stream: Any) -> None:
        """Launch ``graph`` on ``stream``, the stream it was captured on."""

    def upload(self, graph: Any, stream: Any) -> None:
        """FreeToken's protection: ``cuGraphUpload`` of ``graph`` on ``stream``, then a synchronize."""

    def wait_idle(self, stream: Any, timeout_s: float) -> bool:
        """Whether ``stream`` finished its work within ``timeout_s``: a warm replay never waits forever."""

    def world_size(self) -> int:
        """The tensor-parallel world size: a rank must not fall back alone where its peers did not."""

    def helper_context(self) -> Callable[[], AbstractContextManager[None]]:
        """What a helper thread enters to run on the calling thread's CUDA device."""

    def track_captures(self) -> AbstractContextManager[Callable[[], int | None]]:
        """A getter of the graph each capture is for, while the block runs: a WAIT is attributed to its own graph."""


class CudaDevice:
    """The real device: torch's CUDA graphs and streams, FreeToken's tensor-parallel info."""

    def is_capturing(self) -> bool:
        """torch's own answer for the current stream."""
        import torch

        return torch.cuda.is_current_stream_capturing()

    def replay(self, graph: Any, stream: Any) -> None:
        """``graph.replay()`` with ``stream`` current."""
        import torch

        # A runtime rebuild in overlap mode captures with the scheduler's stream current, not
        # Engine.stream (freetoken-0.2.1.md 2.2): launch on the stream the graph was captured on.
        with torch.cuda.stream(stream):
            graph.replay()

    def upload(self, graph: Any, stream: Any) -> None:
        """``cuGraphUpload`` on ``stream``, then a synchronize: FreeToken 0.2.x's ``_upload_graph``
        (0.2.1's ``graph.py`` 118-129), made through cuda-python for a release that has none (0.1.3)."""
        from cuda.bindings import driver

        (err,) = driver.cuGraphUpload(driver.CUgraphExec(graph.raw_cuda_graph_exec()),
                                      driver.CUstream(stream.cuda_stream))
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuGraphUpload failed with {err.name}")
        stream.synchronize()

    def wait_idle(self, stream: Any, timeout_s: float) -> bool:
        """Poll an event recorded on ``stream`` every 50 µs until ``timeout_s``: a bounded wait, unlike a
        synchronize."""
        import torch

        done = torch.cuda.Event()
        done.record(stream)
        deadline = time.monotonic() + timeout_s
        while not done.query():
            if time.monotonic() > deadline:
                return False
            time.sleep(50e-6)
        return True

    def helper_context(self) -> Callable[[], AbstractContextManager[None]]:
        """What a helper thread enters to run on the calling thread's CUDA device.

        The current device is per thread: a helper that makes CUDA calls (the PLE fill's event
        syncs) without it would use device 0, and create a context there when the engine runs on
        another GPU (``--gpu 1``)."""
        import torch

        if not torch.cuda.is_initialized():
            return contextlib.nullcontext
        index = torch.cuda.current_device()
        return lambda: torch.cuda.device(index)

    @contextlib.contextmanager
    def track_captures(self) -> Iterator[Callable[[], int | None]]:
        """While the block runs, note which graph each capture is for: yields a getter of the
        ``id()`` of the graph whose ``capture_begin`` ran last (``torch.cuda.graph.__enter__`` calls
        it). A class attribute for the block only, holding no graph."""
        import torch

        cls = torch.cuda.CUDAGraph
        own = "capture_begin" in vars(cls)
        original = cls.capture_begin
        current: list[int | None] = [None]

        def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
            current[0] = id(graph)
            return original(graph, *args, **kwargs)

        cls.capture_begin = capture_begin
        try:
            yield lambda: current[0]
        finally:
            if own:
                cls.capture_begin = original
            else:
                del cls.capture_begin

    def world_size(self) -> int:
        """FreeToken's tensor-parallel size, 1 where it has no such notion (a release without
        ``freetoken.distributed``)."""
        try:
            from freetoken.distributed import try_get_tp_info
        except ImportError:
            return 1
        info = try_get_tp_info()
        return info.size if info is not None else 1


def _word(flag: Any) -> ctypes.c_int64:
    """The flag's 64-bit word in pinned host memory, read and written without a CUDA call."""
    return ctypes.c_int64.from_address(flag.data_ptr())


def read_flag(flag: Any) -> int:
    """The flag's current value, read from host memory (no CUDA call, safe during a capture)."""
    return _word(flag).value


def clear_flag(flag: Any) -> None:
    """Drop a surplus release: a stale 1 would pass the next real step's WAIT before its fill lands."""
    _word(flag).value = 0


def signal_flag(flag: Any) -> None:
    """Release one pending WAIT with FreeToken's own host release-store of 1: ``row_store.signal``
    (0.2.x), ``_ple_store.signal_flag`` (0.1.3)."""
    try:
        from freetoken.kernel.row_store import signal
    except ImportError:
        from freetoken.kernel import _ple_store

        _ple_store.signal_flag(flag.data_ptr())
    else:
        signal(flag)
