"""FreeToken's real capture loop, replay and PLE disk table, driven on the fake device.

``make_table`` builds a real ``DiskRowTable`` in CUDA wait-sync state over a real ``PleStore``
(FreeToken's compiled row store, reading a row file this module writes). ``__init__`` itself needs
a GPU (pinned allocations, ``torch.cuda.current_device``), so the attributes it would set are set
here, as the imported release sets them on CUDA in wait-sync mode (0.2.1 ``ple_disk.py`` 145-222,
0.1.3 ``ple_disk.py`` 120-165).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

HEADS, ROW_BYTES, ROWS, EOS = 2, 64, 200, 7
SIZES, OFFSETS, MULTIPLIERS = [97, 89], [0, 97], [3, 5, 7]
VOCAB = 16


class FakeEvent:
    def record(self, stream: object = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def write_rows(folder: Path) -> Path:
    path = folder / "ple-rows.bin"
    np.random.default_rng(1234).integers(0, 120, (ROWS, ROW_BYTES), dtype=np.uint8).tofile(path)
    return path


def release() -> tuple[int, ...]:
    """The imported FreeToken's release, as a tuple."""
    from freetoken.version import __version__

    return tuple(int(p) for p in __version__.split(".")[:3])


def memop_extension():
    """The extension whose ``memop_wait_reset`` a capture's WAIT goes through."""
    if release() < (0, 2):
        from freetoken.kernel import _ple_store

        return _ple_store
    from freetoken.kernel import _row_store

    return _row_store


def make_store(path: Path):
    PleStore = memop_extension().PleStore  # noqa: N806  (0.2.x re-exports it from kernel.row_store)

    return PleStore(paths=[str(path)], extent_file=[0], extent_base=[0], rows_per_extent=ROWS,
                    row_bytes=ROW_BYTES, row_stride=ROW_BYTES, multipliers=MULTIPLIERS,
                    head_vocab_sizes=SIZES, head_offsets=OFFSETS, eos_token_id=EOS, use_io_uring=False)


def make_table(path: Path, max_graph_rows: int = 8):
    from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

    t = object.__new__(DiskRowTable)
    t.num_rows, t.head_dim, t._ggml_type, t._row_bytes = ROWS, ROW_BYTES, None, ROW_BYTES
    t._row_dtype, t.dtype, t.heads, t.scale = torch.float8_e4m3fn, torch.bfloat16, HEADS, 1.0
    t.eos_token_id, t.image_token_id = EOS, None
    t._store = make_store(path)
    t._store_path = str(path)  # for expect(): an independent store over the same file
    t._device = torch.device("cpu")
    t._token_bytes = HEADS * ROW_BYTES
    t._graph_pinned = torch.zeros(max_graph_rows * t._token_bytes, dtype=torch.uint8)
    t._graph_dev = torch.empty_like(t._graph_pinned)
    t._graph_consumed = FakeEvent()
    if release() < (0, 2):  # one eager staging buffer, no events
        t._eager_pinned = torch.zeros(64 * t._token_bytes, dtype=torch.uint8)
        t._eager_dev = torch.empty_like(t._eager_pinned)
    else:
        t._eager_pinned = [torch.zeros(64 * t._token_bytes, dtype=torch.uint8) for _ in range(2)]
        t._eager_read, t._eager_slot = [FakeEvent(), FakeEvent()], 0
        t._eager_dev = torch.empty_like(t._eager_pinned[0])
    t._wait_sync = True
    t._flag = torch.zeros(1, dtype=torch.int64)
    t._token_readback = torch.zeros(max_graph_rows, dtype=torch.int32)
    t._readback_event = FakeEvent()
    t._worker, t._pending, t._failed = None, None, False
    return t


class Ctx:
    """Stands in for FreeToken's global Context (only forward_batch is used around capture/replay)."""

    def __init__(self) -> None:
        self.batch = None

    @contextlib.contextmanager
    def forward_batch(self, batch):
        assert self.batch is None, "Nested forward_batch is not allowed"
        self.batch = batch
        try:
            yield
        finally:
            self.batch = None


class PleModel:
    """A decode forward: the real ``DiskRowTable.lookup`` (WAIT + staging copy), then a kernel that
    reads the staged rows as the GPU would, after the WAIT. ``head_s``: a slow head, GPU work of
    that many seconds ahead of the WAIT (a shared or profiled GPU, a large first layer)."""

    def __init__(self, table, fake, ctx: Ctx, kernels: int = 0, head_s: float = 0.0) -> None:
        self.table, self.fake, self.ctx, self.kernels, self.head_s = table, fake, ctx, kernels, head_s
        self.seen: dict[int, torch.Tensor] = {}

    def forward(self) -> torch.Tensor:
        bs = self.ctx.batch.padded_size
        if self.head_s:
            self.fake.enqueue(lambda: time.sleep(self.head_s))
        self.table.lookup(torch.zeros(bs, HEADS, dtype=torch.int64))
        seen = self.seen.setdefault(bs, torch.zeros(bs * self.table._token_bytes, dtype=torch.uint8))
        pinned = self.table._graph_pinned
        self.fake.enqueue(lambda: seen.copy_(pinned[: seen.numel()]))
        return torch.zeros(bs, VOCAB)


class Attn:
    """The attention backend's capture/replay calls; ``fail_next_replay`` makes the next
    ``prepare_for_replay`` raise, as a launch that fails before ``cudaGraphLaunch`` does."""

    fail_next_replay = False

    def init_capture_graph(self, **kwargs: object) -> None:
        pass

    def prepare_for_capture(self, batch: object) -> None:
        pass

    def prepare_for_replay(self, batch: object) -> None:
        if self.fail_next_replay:
            self.fail_next_replay = False
            raise RuntimeError("prepare_for_replay failed before the launch")


class OffloadCache:
    """Stands in for FreeToken's ``OffloadMoeCache`` where only its ``reset()`` matters: each reset
    notes how many graph launches had run by then (``launches`` counts them, from the runner)."""

    def __init__(self) -> None:
        self.runner = None
        self.resets: list[int] = []

    def reset(self) -> None:
        graphs = getattr(self.runner, "graph_map", {}) if self.runner is not None else {}
        self.resets.append(sum(getattr(g, "launches", 0) for g in graphs.values()))


def make_runner(model: PleModel, stream, bs_list=(1, 2), moe_offload_cache=None):
    from freetoken.engine.graph import GraphRunner

    dummy = SimpleNamespace(linear_slot_idx=None, table_idx=0, input_ids=torch.zeros(2, dtype=torch.int64),
                            device_len=1)
    cls = GraphRunner
    if moe_offload_cache is not None:  # the cache sees the runner's graphs as they are captured
        class CacheRunner(GraphRunner):
            def __init__(self, *args, **kwargs):
                moe_offload_cache.runner = self
                super().__init__(*args, **kwargs)

        cls = CacheRunner
    return cls(stream=stream, device=torch.device("cpu"), model=model, attn_backend=Attn(),
               cuda_graph_bs=list(bs_list), cuda_graph_max_bs=max(bs_list), free_memory=1 << 40,
               max_seq_len=64, vocab_size=VOCAB, dummy_req=dummy, moe_offload_cache=moe_offload_cache)


class Step(SimpleNamespace):
    launch_s: float
    fired: bool
    ok: bool
    flag_after: int
    padded_size: int


def make_batch(bs: int, seed: int, runner=None):
    """A decode batch as the scheduler hands it to the engine, and the PLE runs its fill will stage.
    With ``runner``, padded the way FreeToken's scheduler pads it (``GraphRunner.pad_batch``: 3
    requests run on the bs-4 graph, dummy requests in the extra lanes)."""
    from freetoken.core import Batch
    from freetoken.models.qwen4_exp.ple_disk import _context

    g = torch.Generator().manual_seed(seed)
    reqs = []
    for _ in range(bs):
        ids = torch.randint(0, 5000, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g)
        reqs.append(SimpleNamespace(input_ids=ids, device_len=len(ids), complete_one=lambda: None))
    batch = Batch(reqs=reqs, phase="decode")
    batch.padded_reqs = reqs
    if runner is not None:
        runner.pad_batch(batch)
    padded = batch.padded_size
    batch.input_ids = torch.randint(0, 5000, (padded,), generator=g, dtype=torch.int32)
    batch.positions = torch.zeros(padded, dtype=torch.int32)
    batch.out_loc = None
    runs = [torch.tensor([*_context(r.input_ids, r.device_len - 1, EOS), int(t)], dtype=torch.int64)
            for r, t in zip(reqs, batch.input_ids[:bs], strict=True)]
    return batch, runs


def engine_for(runner, table, model: PleModel, ctx: Ctx):
    """FreeToken's real ``Engine.forward_batch`` on an engine assembled from these pieces (its
    ``__init__`` needs a GPU): the dispatch protocol of whichever release is imported."""
    from freetoken.engine.engine import Engine

    engine = object.__new__(Engine)
    engine.stream, engine.graph_runner, engine.ctx, engine.cpu_moe_executor = runner.stream, runner, ctx, None
    engine.model = SimpleNamespace(forward_host_ctx=table.forward_host_ctx, forward=model.forward)
    engine.sampler = SimpleNamespace(sample=lambda logits, args: logits.argmax(-1))
    return engine


def decode_step(runner, table, model: PleModel, ctx: Ctx, fake, bs: int, seed: int,
                watchdog_s: float = 1.0, pad: bool = False, engine=None) -> Step:
    """One decode step in FreeToken's serving order (engine.py 1272): forward_host_ctx around replay,
    or FreeToken's own ``Engine.forward_batch`` when ``engine`` is given (``engine_for``).
    ``pad``: ``bs`` requests padded to the runner's next graph size, as the scheduler does."""
    # imported here, not at the top: tests/patched_run.py uses this module without the shim
    from freetoken_graphfix_bench.rig.pieces import (
        watchdog,  # releases the flag: a blocked launch is reported, not hung
    )

    batch, runs = make_batch(bs, seed, runner if pad else None)
    with watchdog(table._flag, watchdog_s) as fired, fake.stream(runner.stream):
        t0 = time.perf_counter()
        if engine is not None:
            engine.forward_batch(batch, None)
        else:
            with ctx.forward_batch(batch), table.forward_host_ctx(batch, True):
                runner.replay(batch)
        launch_s = time.perf_counter() - t0
        runner.stream.synchronize()
    want = expect(table, runs)
    seen = model.seen[batch.padded_size][: want.numel()]  # the real requests' lanes
    return Step(launch_s=launch_s, fired=fired.is_set(), ok=bool(torch.equal(seen, want)),
                flag_after=int(table._flag[0]), padded_size=batch.padded_size)


def expect(table, runs) -> torch.Tensor:
    """The rows FreeToken's fill stages for ``runs``, staged independently into a plain buffer."""
    n = sum(r.numel() - 2 for r in runs)
    out = torch.zeros(n * table._token_bytes, dtype=torch.uint8)
    store, off = make_store(Path(table._store_path)), 0
    for run in runs:
        store.stage(run.data_ptr(), run.numel() - 2, out.data_ptr() + off * table._token_bytes)
        off += run.numel() - 2
    store.flush(0)
    return out
