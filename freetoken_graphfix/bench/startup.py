"""Interpreter start-up with and without the bootstrap ``.pth``. Needs no GPU."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import tempfile
import time
from typing import Any

from .stats import summary


def startup(runs: int) -> tuple[dict[str, Any], str]:
    """``python -c pass`` in two fresh venvs, interleaved: one bare, one holding this package's .pth
    (FT_GRAPH_UPLOAD unset). Needs no GPU."""
    import shutil
    import venv

    from ..bootstrap import PTH_NAME, installed_pth

    pth = installed_pth()
    if pth is None:
        raise RuntimeError(f"{PTH_NAME} is not installed in this environment")
    root = tempfile.mkdtemp(prefix="graphfix-startup-")
    try:
        pythons = {}
        for name in ("without", "with"):
            venv.create(os.path.join(root, name), with_pip=False, symlinks=True)
            py = os.path.join(root, name, "bin", "python")
            site_dir = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                      capture_output=True, text=True, check=True).stdout.strip()
            if name == "with":
                shutil.copy(pth, os.path.join(site_dir, PTH_NAME))
            pythons[name] = py
        env = {k: v for k, v in os.environ.items() if k not in ("FT_GRAPH_UPLOAD", "PYTHONPATH")}
        times: dict[str, list[float]] = {"without": [], "with": []}
        for i in range(runs):
            for name in (("with", "without") if i % 2 else ("without", "with")):
                t0 = time.perf_counter()
                subprocess.run([pythons[name], "-c", "pass"], env=env, check=True)
                times[name].append(1e3 * (time.perf_counter() - t0))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    record = {"runs": runs, "ms": {k: summary(v) for k, v in times.items()}, "ratio": med["with"] / med["without"],
              "delta_ms": med["with"] - med["without"], "python": platform.python_version()}
    text = (f"python -c pass, {runs} interleaved runs each, FT_GRAPH_UPLOAD unset: without the package "
            f"{med['without']:.2f} ms, with its .pth {med['with']:.2f} ms (median); ratio {record['ratio']:.4f}, "
            f"delta {record['delta_ms']:+.3f} ms")
    return record, text
