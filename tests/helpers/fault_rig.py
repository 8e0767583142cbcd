"""FreeToken's real runner, PLE table and ``Engine.forward_batch`` on the fake device, through a
rebuild and the faults: what ``tests/patched_run.py`` (the series) and ``tests/run_freetoken_013.py`` (the shim
on 0.1.3) both drive, in a child that imports the FreeToken under test first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import harness
from tests.helpers.fakecuda import FakeCuda, wire


class EngineRig:
    def __init__(self, tmp: str) -> None:
        self.mp, self.fake = pytest.MonkeyPatch(), FakeCuda()
        wire(self.mp, self.fake)
        self.arm()
        self.table = harness.make_table(harness.write_rows(Path(tmp)))
        self.complete_table()
        self.model = harness.PleModel(self.table, self.fake, self.fake.ctx)
        try:
            self.capture()
        except BaseException:
            self.close()  # a capture that refuses (a bad mode) leaves nothing wired
            raise

    def arm(self) -> None:
        """Runs once the fake device is wired, before the table exists (the shim's install)."""

    def complete_table(self) -> None:
        """Runs once the table exists, before the capture: what a patched ``__init__`` adds."""

    def capture(self) -> None:
        self.cache = harness.OffloadCache()
        self.runner = harness.make_runner(self.model, self.fake.default, bs_list=(1, 2, 4),
                                          moe_offload_cache=self.cache)
        self.engine = harness.engine_for(self.runner, self.table, self.model, self.fake.ctx)

    def step(self, bs: int, seed: int, pad: bool = False) -> dict:
        try:
            s = harness.decode_step(self.runner, self.table, self.model, self.fake.ctx, self.fake, bs, seed,
                                    pad=pad, engine=self.engine)
        except Exception as exc:
            self.runner.stream.synchronize()  # returns: no WAIT may be left pending
            return {"raised": repr(exc), "flag_after": int(self.table._flag[0])}
        if s.fired:
            self.table._flag.zero_()  # the watchdog's and the fill's releases: drop the surplus
        return self.record(s)

    def record(self, s: harness.Step) -> dict:
        return {"fired": s.fired, "ok": s.ok, "flag_after": s.flag_after}

    def rebuild(self) -> list[dict]:
        """``Engine.rebuild_runtime_cache`` (engine.py 941, 972): the graphs destroyed, a new runner
        captured; then a step at each of two sizes, whose first launches must be protected again."""
        self.runner.destroy_cuda_graphs()
        self.capture()
        return [self.step(bs, seed) for seed, bs in enumerate([1, 2], start=10)]

    def fill_fault(self, out: dict) -> None:
        """A step whose fill raises (bs 3 on the bs 4 graph), then one with the fill working again."""
        from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

        real_fill = DiskRowTable.fill

        def broken(self, runs, *, graph):
            raise OSError("disk read failed")

        self.mp.setattr(DiskRowTable, "fill", broken)
        out["fill_raises"] = self.step(4, seed=20, pad=True)
        self.mp.setattr(DiskRowTable, "fill", real_fill)
        out["after_fill_raised"] = self.step(4, seed=21)

    def faults(self, out: dict) -> None:
        """A fill that raises, a launch that raises, a step that raises before its launch: each
        followed by a step that must still be protected: a fault must neither leave a flag at 1 nor
        unguard the retry."""
        self.fill_fault(out)
        self.capture()
        self.runner.graph_map[2].fail_launch = True
        out["launch_raises"] = self.step(2, seed=30)
        self.runner.graph_map[2].fail_launch = False
        out["launch_retry"] = self.step(2, seed=31)
        self.runner.attn_backend.fail_next_replay = True
        out["raises_before_launch"] = self.step(1, seed=32)
        out["retry_after_raise_before_launch"] = self.step(1, seed=33)

    def close(self) -> None:
        self.fake.halt.set()
        self.mp.undo()
