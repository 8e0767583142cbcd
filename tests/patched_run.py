"""Run in a child whose ``PYTHONPATH`` puts the patched FreeToken 0.2.1 first: drive it on the fake device.

``python -m tests.patched_run`` prints one JSON line. Per ``FREETOKEN_GRAPH_PROTECT`` value: the
patched ``GraphRunner`` captures bs 1, 2 and 4 over a real ``DiskRowTable`` (wait-sync) and
FreeToken's own ``Engine.forward_batch`` dispatches decode steps in serving order; large graphs
block their first never-uploaded launch behind their WAIT, as on the H200. Then, in the default
mode, the faults: a rebuild, a fill that raises, a launch that raises at and before the launch.
"""

import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from . import harness
from .fakecuda import FakeCuda, wire


class Rig:
    def __init__(self, tmp: str) -> None:
        self.mp, self.fake = pytest.MonkeyPatch(), FakeCuda()
        wire(self.mp, self.fake)
        self.table = harness.make_table(harness.write_rows(Path(tmp)))
        # what the patched DiskRowTable.__init__ sets in wait-sync mode on CUDA: a worker that runs
        # nothing until a graph's first launch is filled on it
        self.table._worker = ThreadPoolExecutor(1, "ple-fill")
        self.submits = 0
        submit = self.table._worker.submit

        def counting_submit(*args, **kwargs):
            self.submits += 1
            return submit(*args, **kwargs)

        self.table._worker.submit = counting_submit
        self.model = harness.PleModel(self.table, self.fake, self.fake.ctx)
        self.capture()

    def capture(self) -> None:
        self.runner = harness.make_runner(self.model, self.fake.default, bs_list=(1, 2, 4))
        self.engine = harness.engine_for(self.runner, self.table, self.model, self.fake.ctx)

    def step(self, bs: int, seed: int, pad: bool = False) -> dict:
        before = self.submits
        try:
            s = harness.decode_step(self.runner, self.table, self.model, self.fake.ctx, self.fake, bs, seed,
                                    pad=pad, engine=self.engine)
        except Exception as exc:
            self.runner.stream.synchronize()  # returns: no WAIT may be left pending
            return {"raised": repr(exc), "flag_after": int(self.table._flag[0])}
        if s.fired:
            self.table._flag.zero_()  # the watchdog's and the fill's releases: drop the surplus
        return {"fired": s.fired, "ok": s.ok, "flag_after": s.flag_after, "worker": self.submits - before,
                "padded": s.padded_size}

    def close(self) -> None:
        self.fake.halt.set()
        self.mp.undo()


def run_mode(mode: str) -> dict:
    os.environ["FREETOKEN_GRAPH_PROTECT"] = mode
    with tempfile.TemporaryDirectory() as tmp:
        try:
            rig = Rig(tmp)
        except ValueError as exc:
            return {"error": str(exc)}
        try:
            graphs = [rig.runner.graph_map[bs] for bs in (4, 2, 1)]
            out = {"uploaded": [g.uploaded for g in graphs], "launched_at_capture": [g.launches for g in graphs],
                   "steps": [rig.step(bs, seed, pad=bs == 3) for seed, bs in enumerate([2, 2, 1, 3, 1])]}
            if mode != "first-launch":
                return out
            rig.runner.destroy_cuda_graphs()  # Engine.rebuild_runtime_cache: a new runner
            rig.capture()
            out["rebuild"] = [rig.step(bs, seed) for seed, bs in enumerate([1, 2], start=10)]
            from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

            real_fill = DiskRowTable.fill

            def broken(self, runs, *, graph):
                raise OSError("disk read failed")

            rig.mp.setattr(DiskRowTable, "fill", broken)
            out["fill_raises"] = rig.step(4, seed=20, pad=True)
            rig.mp.setattr(DiskRowTable, "fill", real_fill)
            out["after_fill_raised"] = rig.step(4, seed=21)
            rig.capture()
            rig.runner.graph_map[2].fail_launch = True
            out["launch_raises"] = rig.step(2, seed=30)
            rig.runner.graph_map[2].fail_launch = False
            out["launch_retry"] = rig.step(2, seed=31)
            rig.runner.attn_backend.fail_next_replay = True
            out["raises_before_launch"] = rig.step(1, seed=32)
            out["retry_after_raise_before_launch"] = rig.step(1, seed=33)
            return out
        finally:
            rig.close()


def main() -> None:
    import freetoken.engine.graph as graph

    out = {"freetoken_file": graph.__file__, "shim": None}
    if "freetoken_graphfix" in sys.modules:  # before anything here imports it: only the .pth can have
        st = sys.modules["freetoken_graphfix"].status()
        out["shim"] = {"patched": st["patched"], "reason": st["reason"],
                       "upload_wrapped": type(vars(graph)["_upload_graph"]).__name__}
    out.update({mode: run_mode(mode) for mode in ("first-launch", "upload", "none", " Upload ", "bogus")})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
