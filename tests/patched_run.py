"""Run in a child whose ``PYTHONPATH`` puts a patched FreeToken first: capture on the fake device.

``python -m tests.patched_run`` prints one JSON line: per FREETOKEN_GRAPH_UPLOAD value and graph
kind (PLE wait-sync WAIT or none), which graphs were uploaded and launched at capture.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from . import harness
from .fakecuda import FakeCuda, wire


def capture(mode: str, wait: bool) -> dict:
    os.environ["FREETOKEN_GRAPH_UPLOAD"] = mode
    mp, dev = pytest.MonkeyPatch(), FakeCuda()
    try:
        wire(mp, dev)
        with tempfile.TemporaryDirectory() as tmp:
            table = harness.make_table(harness.write_rows(Path(tmp)))
            table._wait_sync = wait
            runner = harness.make_runner(harness.PleModel(table, dev, dev.ctx), dev.default)
            graphs = [runner.graph_map[bs] for bs in sorted(runner.graph_map, reverse=True)]
            return {"uploaded": [g.uploaded for g in graphs], "launches": [g.launches for g in graphs],
                    "flag": int(table._flag[0])}
    except ValueError as exc:
        return {"error": str(exc)}
    finally:
        dev.halt.set()
        mp.undo()


def main() -> None:
    import freetoken.engine.graph as graph

    out = {f"{mode}/{'wait' if wait else 'none'}": capture(mode, wait)
           for mode in ("auto", "always", "never", "warm", " WARM ", "bogus") for wait in (True, False)}
    out["freetoken_file"] = graph.__file__
    out["shim"] = None
    if "freetoken_graphfix" in sys.modules:
        st = sys.modules["freetoken_graphfix"].status()
        out["shim"] = {"patched": st["patched"], "reason": st["reason"],
                       "upload_wrapped": type(vars(graph)["_upload_graph"]).__name__}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
