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

from .fault_rig import EngineRig
from .harness import Step


class Rig(EngineRig):
    def __init__(self, tmp: str) -> None:
        super().__init__(tmp)
        # what the patched DiskRowTable.__init__ sets in wait-sync mode on CUDA: a worker that runs
        # nothing until a graph's first launch is filled on it
        self.table._worker = ThreadPoolExecutor(1, "ple-fill")
        self.submits = self._before = 0
        submit = self.table._worker.submit

        def counting_submit(*args, **kwargs):
            self.submits += 1
            return submit(*args, **kwargs)

        self.table._worker.submit = counting_submit

    def step(self, bs: int, seed: int, pad: bool = False) -> dict:
        self._before = self.submits
        return super().step(bs, seed, pad)

    def record(self, s: Step) -> dict:
        return {**super().record(s), "worker": self.submits - self._before, "padded": s.padded_size}


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
            out["rebuild"] = rig.rebuild()
            rig.faults(out)
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
