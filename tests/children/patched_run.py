"""Run in a child whose ``PYTHONPATH`` puts the patched FreeToken 0.2.1 first: drive it on the fake device.

``python -m tests.children.patched_run`` prints one JSON line: the patched ``GraphRunner`` captures bs 1, 2
and 4 over a real ``DiskRowTable`` (wait-sync) and FreeToken's own ``Engine.forward_batch``
dispatches decode steps in serving order; large graphs block their first never-uploaded launch
behind their WAIT, as on the H200. Then a rebuild, and the faults on the worker's path: a fill that
raises there (its launch returned) surfaces and leaves the table usable, as on CUDA's own path; a
launch that raises fails the table as on HIP, the next dispatch says so, and a recreated engine is
protected again.
"""

import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.helpers import harness
from tests.helpers.fault_rig import EngineRig
from tests.helpers.harness import Step


class Rig(EngineRig):
    def __init__(self, tmp: str) -> None:
        self.tmp, self.submits, self._before, self.engines = tmp, 0, 0, 1
        super().__init__(tmp)

    def complete_table(self) -> None:
        """What the patched ``DiskRowTable.__init__`` sets in CUDA wait-sync mode (the harness builds
        the table without its device buffers): the worker, which 0.2.1 creates on HIP only, counting
        what runs on it, and the sizes captured and not yet launched."""
        self.table._captured_bs, self.table._unlaunched_bs = set(), set()
        self.table._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ple-fill")
        submit = self.table._worker.submit

        def counting_submit(*args, **kwargs):
            self.submits += 1
            return submit(*args, **kwargs)

        self.table._worker.submit = counting_submit

    def recreate(self) -> None:
        """What a failed table asks for: a new engine, so a new table and its graphs captured again."""
        self.table._worker.shutdown(wait=True)
        self.runner.destroy_cuda_graphs()
        self.engines += 1
        again = Path(self.tmp) / f"engine-{self.engines}"
        again.mkdir()
        self.table = harness.make_table(harness.write_rows(again))
        self.complete_table()
        self.model = harness.PleModel(self.table, self.fake, self.fake.ctx)
        self.capture()

    def faults(self, out: dict) -> None:
        """A fill that raises leaves the table usable (the next step runs); a launch that raises fails
        it, as on HIP: the next step says so, and the recreated engine's first launches are protected
        again."""
        self.fill_fault(out)
        self.capture()  # a rebuild: the launch that raises below is a first launch, on the worker's path
        self.runner.graph_map[2].fail_launch = True
        out["launch_raises"] = self.step(2, seed=30)
        self.runner.graph_map[2].fail_launch = False
        out["after_launch_raised"] = self.step(2, seed=31)
        self.recreate()
        out["recreated"] = [self.step(bs, seed) for seed, bs in enumerate([2, 2], start=40)]

    def step(self, bs: int, seed: int, pad: bool = False) -> dict:
        self._before = self.submits
        return super().step(bs, seed, pad)

    def record(self, s: Step) -> dict:
        return {**super().record(s), "worker": self.submits - self._before, "padded": s.padded_size}


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        rig = Rig(tmp)
        try:
            graphs = [rig.runner.graph_map[bs] for bs in (4, 2, 1)]
            out = {"uploaded": [g.uploaded for g in graphs], "launched_at_capture": [g.launches for g in graphs],
                   "worker": rig.table._worker is not None,
                   "steps": [rig.step(bs, seed, pad=bs == 3) for seed, bs in enumerate([2, 2, 1, 3, 1])]}
            out["rebuild"] = rig.rebuild()
            rig.faults(out)
            return out
        finally:
            rig.close()


def main() -> None:
    import freetoken.engine.graph as graph

    out = {"freetoken_file": graph.__file__, "shim": None, "upload_function": hasattr(graph, "_upload_graph")}
    if "freetoken_graphfix" in sys.modules:  # before anything here imports it: only the .pth can have
        st = sys.modules["freetoken_graphfix"].status()
        out["shim"] = {"patched": st["patched"], "reason": st["reason"]}
    out["run"] = run()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
