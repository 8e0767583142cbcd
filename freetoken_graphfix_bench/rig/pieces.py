"""FreeToken's real decode machinery on a synthetic decode-like model, for the benchmark and GPU tests.

Real pieces (FreeToken 0.2.x): ``GraphRunner`` (its ``_capture_graphs``, hence the shim's hooks, and
``replay``), ``DiskRowTable`` in CUDA wait-sync mode over a synthetic PLE checkpoint written in the
layout ``ple_disk.source_from_safetensors`` reads (hash constants from ``derive_ngram_hash_constants``),
``forward_host_ctx`` around every step, ``row_store`` for the WAIT and its release. Stand-ins: the model
(PLE lookup, then small kernels over several streams with a fork/join per layer, optionally pinned
H2D copies), a minimal attention backend and the dummy request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

import freetoken_graphfix
from freetoken_graphfix.device import read_flag
from freetoken_graphfix.status_record import CapturePass, Status

PREFIX = "model.layers.1.ple.ple_embedding.ngram_embedding."
SHARDS, ROWS, DIM, HEADS, VOCAB, EOS, SCALE = 4, 400, 160, 16, 248320, 7, 0.0137
LOGITS = 64  # the width of the synthetic logits


def install_mode(mode: str) -> None:
    """The shim in ``mode`` in this process, whatever the ``.pth`` armed: its graphs captured from now on."""
    freetoken_graphfix.uninstall()
    freetoken_graphfix.install(mode)


def last_pass() -> CapturePass:
    """The shim's latest capture pass, typed, through its public ``status()``."""
    return Status.from_dict(freetoken_graphfix.status()).passes[-1]


def write_ple_checkpoint(folder: str) -> None:
    """Four fp8 shards plus a bf16 scale in two safetensors files and an index (ple_real.py layout)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1234)
    sh = [(torch.randn(ROWS, DIM, generator=g) * 2).to(torch.float8_e4m3fn) for _ in range(SHARDS)]
    files = {"model-00001-of-00002.safetensors": {PREFIX + "shard_0.weight": sh[0], PREFIX + "shard_2.weight": sh[2],
                                                  PREFIX + "weight_scale": torch.tensor(SCALE, dtype=torch.bfloat16)},
             "model-00002-of-00002.safetensors": {PREFIX + "shard_3.weight": sh[3], PREFIX + "shard_1.weight": sh[1]}}
    weight_map = {}
    for name, tensors in files.items():
        save_file(tensors, os.path.join(folder, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)


def hash_constants() -> dict:
    """The PLE n-gram hash constants FreeToken itself derives for the rig's vocabulary, so the table looks rows up as a
    model would."""
    from freetoken.models.qwen4_exp.ple import derive_ngram_hash_constants

    mult, sizes, offs = derive_ngram_hash_constants(vocab_size=VOCAB, ngram_size=3, num_ngram_heads=HEADS,
                                                    ngram_vocab_size_base=61, ple_layer_index=0)
    return {"num_ngram_heads": HEADS, "layer_multipliers": mult, "per_head_vocab_sizes": sizes,
            "per_head_offsets": offs, "eos_token_id": EOS, "image_token_id": None}


class DecodeModel:
    """PLE lookup (the graph's head WAIT) then ``kernels`` small kernels over ``streams`` streams; with
    ``spin_cycles``, a spin of that many GPU clocks last on the main stream (the positive control)."""

    def __init__(self, device: torch.device, table: Any, kernels: int, streams: int, h2d: bool) -> None:
        self.device, self.table, self.streams = device, table, streams
        self.sides = [torch.cuda.Stream(device) for _ in range(streams - 1)]
        self.per_layer = 4  # kernels per stream per layer
        self.layers = max(1, kernels // (streams * self.per_layer))
        g = torch.Generator().manual_seed(11)  # seeded: rigs built apart (another mode, process) compare
        self.x = [torch.randn(1024, generator=g).to(device) for _ in range(streams)]
        self.y = [torch.empty(1024, device=device) for _ in range(streams)]
        self.h2d_src = torch.randn(64 * 1024, pin_memory=True) if h2d else None
        self.h2d_dst = torch.empty(64 * 1024, device=device) if h2d else None
        self.ctx: Any = None
        self.spin_cycles = 0

    def forward(self) -> torch.Tensor:
        """The decode step the graph captures: the PLE lookup (its head WAIT), then the small kernels fanned out over
        the side streams per layer."""
        bs = self.ctx.batch.padded_size
        main = torch.cuda.current_stream(self.device)
        if self.table is not None:
            ple = self.table.lookup(torch.zeros(bs, HEADS, dtype=torch.int64, device=self.device))
            base = ple.float().view(bs, -1)[:, :LOGITS]
        else:
            base = torch.zeros(bs, LOGITS, device=self.device)
        for _ in range(self.layers):
            for side in self.sides:
                side.wait_stream(main)
            if self.h2d_src is not None:
                self.h2d_dst.copy_(self.h2d_src, non_blocking=True)
            for x, y, stream in zip(self.x, self.y, [main, *self.sides], strict=True):
                with torch.cuda.stream(stream):
                    for _ in range(self.per_layer):
                        torch.mul(x, 1.0001, out=y)  # idempotent: replays never drift
            for side in self.sides:
                main.wait_stream(side)
        if self.spin_cycles:
            torch.cuda._sleep(self.spin_cycles)  # after the join: on the critical path, its whole length
        return base + sum(float(i + 1) * y[:LOGITS] for i, y in enumerate(self.y))


class _Attn:
    def init_capture_graph(self, **kwargs: Any) -> None:
        """GraphRunner's attention-backend hook: the rig's model has no attention, so nothing to set up."""

    def prepare_for_capture(self, batch: Any) -> None:
        """GraphRunner's attention-backend hook: the rig's model has no attention, so nothing to prepare."""

    def prepare_for_replay(self, batch: Any) -> None:
        """GraphRunner's attention-backend hook: the rig's model has no attention, so nothing to prepare."""


@dataclass
class StepResult:
    launch_ms: float  # host time of forward_host_ctx + replay (the launch and, on CUDA, the fill)
    fired: bool  # the watchdog had to release the WAIT: the launch blocked
    logits: torch.Tensor


class Rig:
    """One device, one engine stream, one PLE table (or none), one model; runners captured on demand."""

    def __init__(self, *, kernels: int = 1090, streams: int = 4, wait: bool = True, h2d: bool = False,
                 folder: str | None = None, sync: str = "wait") -> None:
        from freetoken import core
        from freetoken.distributed import info

        # read by DiskRowTable.__init__; "gate" (no WAIT, the fill before the launch) is FreeToken's
        # own escape hatch, the reference the protected modes must match
        os.environ["FREETOKEN_PLE_SYNC"] = sync
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.stream = torch.cuda.Stream(self.device)
        torch.cuda.set_stream(self.stream)  # like Engine.__init__ (engine.py 418-419)
        if info.try_get_tp_info() is None:
            info.set_tp_info(0, 1)
        if core._GLOBAL_CTX is None:
            core.set_global_ctx(core.Context(page_size=1))
        self.ctx = core.get_global_ctx()
        self.table = None
        if wait:
            from freetoken.models.qwen4_exp.ple_disk import DiskRowTable, source_from_safetensors

            self._tmp = tempfile.TemporaryDirectory(prefix="graphfix-ple-", dir=folder)
            write_ple_checkpoint(self._tmp.name)
            self.table = DiskRowTable(source_from_safetensors(self._tmp.name), hash_constants(),
                                      max_graph_rows=256, max_extend_tokens=256)
            assert self.table._wait_sync == (sync == "wait"), f"expected FREETOKEN_PLE_SYNC={sync}"
            assert getattr(self.table, "_worker", None) is None, "expected CUDA (no ple-fill worker)"
        self.model = DecodeModel(self.device, self.table, kernels, streams, h2d)
        self.model.ctx = self.ctx
        self._gen = torch.Generator().manual_seed(7)

    def capture(self, bs_list: tuple[int, ...] = (1, 2)) -> Any:
        """A real ``GraphRunner``: captures one graph per bs, largest first, sharing one pool.
        FreeToken's per-pass INFO lines (free memory) are held back: a benchmark captures dozens."""
        from freetoken.engine.graph import GraphRunner

        dummy = SimpleNamespace(linear_slot_idx=None, table_idx=0, input_ids=torch.zeros(2, dtype=torch.int64),
                                device_len=1)
        with _level("freetoken.engine.graph", logging.WARNING):
            return GraphRunner(stream=self.stream, device=self.device, model=self.model, attn_backend=_Attn(),
                               cuda_graph_bs=list(bs_list), cuda_graph_max_bs=max(bs_list),
                               free_memory=torch.cuda.mem_get_info(self.device)[0], max_seq_len=64,
                               vocab_size=LOGITS, dummy_req=dummy)

    def batch(self, bs: int, seed: int) -> Any:
        """A decode batch of ``bs`` seeded requests, in FreeToken's own ``Batch``, as the runner's capture and replay
        read it."""
        from freetoken.core import Batch

        g = torch.Generator().manual_seed(seed)
        reqs = []
        for _ in range(bs):
            ids = torch.randint(0, VOCAB, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g)
            reqs.append(SimpleNamespace(input_ids=ids, device_len=len(ids)))
        batch = Batch(reqs=reqs, phase="decode")
        batch.padded_reqs = reqs
        batch.input_ids = torch.randint(0, VOCAB, (bs,), generator=g).to(torch.int32).to(self.device)
        batch.positions = torch.zeros(bs, dtype=torch.int32, device=self.device)
        batch.out_loc = None
        return batch

    def host_ctx(self, batch: Any) -> Any:
        """What the engine enters around every graph dispatch (engine.py 1272): the table's fill."""
        return self.table.forward_host_ctx(batch, True) if self.table is not None else contextlib.nullcontext()

    def step(self, runner: Any, bs: int, seed: int, watchdog_s: float = 4.0) -> StepResult:
        """One decode step in FreeToken's serving order (engine.py 1272), with a releasing watchdog."""
        batch = self.batch(bs, seed)
        with watchdog(self.table._flag if self.table is not None else None, watchdog_s) as fired:
            t0 = time.perf_counter()
            with torch.cuda.stream(self.stream), self.ctx.forward_batch(batch), self.host_ctx(batch):
                logits = runner.replay(batch)
            launch_ms = 1e3 * (time.perf_counter() - t0)
            self.stream.synchronize()
        if fired.is_set():
            # the watchdog and the fill both released one WAIT: drop the surplus, or every later
            # step's WAIT would pass before its fill (stale rows)
            self.table._flag.zero_()
        if self.table is not None and self.table._flag is not None:
            assert read_flag(self.table._flag) == 0, "a step left the PLE flag released"
        return StepResult(launch_ms, fired.is_set(), logits.clone())


@contextlib.contextmanager
def _level(name: str, level: int):
    """Quiet a logger for a block (never louder than it was): the rig captures hundreds of graphs, and the shim's
    per-pass INFO lines would bury its report."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(max(level, before))
    try:
        yield
    finally:
        logger.setLevel(before)


@contextlib.contextmanager
def watchdog(flag: torch.Tensor | None, seconds: float):
    """Release ``flag`` after ``seconds``, so a blocked launch is reported instead of hanging."""
    done, fired = threading.Event(), threading.Event()

    def run() -> None:
        if flag is not None and not done.wait(seconds):
            from freetoken_graphfix.device import signal_flag

            fired.set()
            signal_flag(flag)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    try:
        yield fired
    finally:
        done.set()
        th.join()
