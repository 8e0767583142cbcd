"""A CPU stand-in for the CUDA device, and only for the device: FreeToken itself is the real one.

The fake replaces the driver-facing edges FreeToken calls (``torch.cuda`` graph/stream calls,
``memop_wait_reset`` of ``_row_store`` (0.2.x) or ``_ple_store`` (0.1.3), the ctypes
``cuGraphUpload``). A graph is a list of nodes run by
a "GPU" thread at launch: a WAIT polls the real host flag until it is >= 1 and writes 0 (the memop
pair ``wait_reset`` enqueues), a kernel node runs a Python callable. As measured on an H200 with
FreeToken's own row store (docs/measurements.md, "First launches"), the first launch of a *large*,
never-uploaded graph blocks until its first WAIT is consumed; uploaded graphs and later launches
never block.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

_handles = itertools.count(0x1000)


def flag_value(ptr: int) -> int:
    return ctypes.c_int64.from_address(ptr).value


@dataclass
class Node:
    kind: str  # "wait" or "kernel"
    ptr: int = 0
    fn: Callable[[], None] | None = None


class FakeStream:
    def __init__(self, device: FakeCuda) -> None:
        self.cuda_stream = next(_handles)
        self._device = device
        self.gpu: threading.Thread | None = None

    def synchronize(self) -> None:
        if self.gpu is not None:
            self.gpu.join()

    def wait_stream(self, other: FakeStream) -> None:
        pass


@dataclass
class FakeGraph:
    """A captured graph; ``large`` graphs block their first un-uploaded launch behind their WAIT."""

    device: FakeCuda
    large: bool = True
    nodes: list[Node] = field(default_factory=list)
    uploaded: bool = False
    launches: int = 0
    blocked_ms: list[float] = field(default_factory=list)
    exec_handle: int = field(default_factory=lambda: next(_handles))
    fail_launch: bool = False

    def __hash__(self) -> int:
        return id(self)

    def pool(self) -> int:
        return 0

    def raw_cuda_graph_exec(self) -> int:
        self.device.execs[self.exec_handle] = self
        return self.exec_handle

    def replay(self) -> None:
        """cudaGraphLaunch on the current stream."""
        import time

        if self.fail_launch:
            raise RuntimeError("fake cudaGraphLaunch failure")
        stream = self.device.current
        first, self.launches = self.launches == 0, self.launches + 1
        first_wait_done = threading.Event()

        def run() -> None:
            for node in self.nodes:
                if node.kind == "wait":
                    while flag_value(node.ptr) < 1:
                        if self.device.halt.wait(0.0005):
                            return
                    ctypes.c_int64.from_address(node.ptr).value = 0
                    first_wait_done.set()
                else:
                    node.fn()
            first_wait_done.set()

        if stream.gpu is not None:
            stream.gpu.join()  # stream order: after earlier work
        stream.gpu = threading.Thread(target=run, daemon=True)
        stream.gpu.start()
        if first and not self.uploaded and self.large and any(n.kind == "wait" for n in self.nodes):
            t0 = time.perf_counter()
            first_wait_done.wait()  # the implicit upload stuck behind the graph's own WAIT
            self.blocked_ms.append(1e3 * (time.perf_counter() - t0))


class FakeCuda:
    """The device seam of freetoken_graphfix (``Device``) plus the torch.cuda calls FreeToken makes."""

    def __init__(self) -> None:
        self.capturing_graph: FakeGraph | None = None
        self.default = FakeStream(self)
        self.current = self.default
        self.execs: dict[int, FakeGraph] = {}
        self.world = 1
        self.halt = threading.Event()  # ends every fake GPU thread at teardown
        self.large = True
        self.device_index = 0  # the engine thread's CUDA device
        self._thread_device = threading.local()
        self.helper_devices: list[int] = []

    # ---- freetoken_graphfix.device.Device
    def is_capturing(self) -> bool:
        return self.capturing_graph is not None

    def replay(self, graph: FakeGraph, stream: FakeStream) -> None:
        with self.stream(stream):
            graph.replay()

    @contextlib.contextmanager
    def track_captures(self) -> Iterator[Callable[[], int | None]]:
        yield lambda: id(self.capturing_graph) if self.capturing_graph is not None else None

    def upload(self, graph: FakeGraph, stream: FakeStream) -> None:
        graph.uploaded = True

    def wait_idle(self, stream: FakeStream, timeout_s: float) -> bool:
        if stream.gpu is None:
            return True
        stream.gpu.join(timeout_s)
        return not stream.gpu.is_alive()

    def world_size(self) -> int:
        return self.world

    def helper_context(self):
        """Helpers record the device index the engine thread was on when they started."""
        index = self.device_index

        @contextlib.contextmanager
        def on_device():
            before = getattr(self._thread_device, "index", 0)
            self._thread_device.index = index
            self.helper_devices.append(index)
            try:
                yield
            finally:
                self._thread_device.index = before

        return on_device

    # ---- what torch.cuda / the driver provide to FreeToken
    @contextlib.contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    @contextlib.contextmanager
    def capture(self, graph: FakeGraph, stream: FakeStream | None = None) -> Iterator[FakeGraph]:
        self.capturing_graph = graph
        try:
            with self.stream(stream or self.current):
                yield graph
        finally:
            self.capturing_graph = None

    def new_graph(self, *args: object, **kwargs: object) -> FakeGraph:
        return FakeGraph(self, large=self.large)

    def memop_wait_reset(self, stream_handle: int, ptr: int) -> None:
        assert self.capturing_graph is not None, "wait_reset outside a capture"
        self.capturing_graph.nodes.append(Node("wait", ptr=ptr))

    def enqueue(self, fn: Callable[[], None]) -> None:
        """A kernel: recorded when capturing, else run now (eager)."""
        if self.capturing_graph is not None:
            self.capturing_graph.nodes.append(Node("kernel", fn=fn))
        else:
            fn()

    def cu_graph_upload(self, exec_handle: int, stream_handle: int) -> int:
        self.execs[exec_handle].uploaded = True
        return 0


def wire(mp, dev: FakeCuda) -> None:
    """Put ``dev`` under FreeToken: the driver-facing calls its graph runner and row store make.
    ``mp`` is a ``pytest.MonkeyPatch``, which undoes it all."""
    import freetoken.engine.graph as graph
    import torch
    from freetoken.distributed.info import DistributedInfo

    from tests.helpers.harness import Ctx, FakeEvent, memop_extension

    mp.setattr(memop_extension(), "memop_wait_reset", dev.memop_wait_reset)
    if hasattr(graph, "_cu_graph_upload"):  # 0.2.x; 0.1.3 never uploads
        mp.setattr(graph, "_cu_graph_upload", lambda: dev.cu_graph_upload)
    mp.setattr(graph, "get_free_memory", lambda device: 1 << 40)
    mp.setattr(graph, "get_tp_info", lambda: DistributedInfo(0, dev.world))
    dev.ctx = Ctx()
    mp.setattr(graph, "get_global_ctx", lambda: dev.ctx)
    cuda = torch.cuda
    mp.setattr(cuda, "is_current_stream_capturing", dev.is_capturing)
    mp.setattr(cuda, "current_stream", lambda *a, **k: dev.current)
    mp.setattr(cuda, "stream", dev.stream)
    mp.setattr(cuda, "CUDAGraph", dev.new_graph)
    mp.setattr(cuda, "graph", lambda g, pool=None, stream=None: dev.capture(g, stream))
    mp.setattr(cuda, "Event", lambda *a, **k: FakeEvent())  # Engine.forward_batch's copy-done event
    mp.setattr(cuda, "device", lambda *a, **k: contextlib.nullcontext())  # a worker entering its device
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        mp.setattr(cuda, name, lambda *a, **k: None)
