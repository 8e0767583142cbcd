"""Run in a child whose ``PYTHONPATH`` puts the patched FreeToken 0.2.1 first: drive it on the fake device.

``python -m tests.patched_run`` prints one JSON line: the patched ``GraphRunner`` captures bs 1, 2
and 4 over a real ``DiskRowTable`` (wait-sync) and FreeToken's own ``Engine.forward_batch``
dispatches decode steps in serving order; large graphs block their first never-uploaded launch
behind their WAIT, as on the H200. Then the faults: a rebuild, a fill that raises, a launch that
raises at and before the launch.
"""

import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from .fault_rig import EngineRig
from .harness import Step


class Rig(EngineRig):
    def complete_table(self) -> None:
        """What the patched ``DiskRowTable.__init__`` adds in CUDA wait-sync mode (the harness builds
        the table without its device buffers): the sizes captured and not yet launched, and the
        worker that fills their launches, counting what runs on it."""
        self.table._unlaunched_bs = set()
        self.table._first_fill = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ple-first-fill")
        self.submits = self._before = 0
        submit = self.table._first_fill.submit

        def counting_submit(*args, **kwargs):
            self.submits += 1
            return submit(*args, **kwargs)

        self.table._first_fill.submit = counting_submit

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
                   "hip_worker": rig.table._worker is not None,
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
