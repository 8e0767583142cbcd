#!/usr/bin/env python3
"""What arming the shim costs a FreeToken process: ``import freetoken.engine.graph`` after torch and
FreeToken are imported, with ``FT_GRAPH_UPLOAD=auto`` against unset (the shim's whole install: its
modules, FreeToken's compatibility check, the wraps), in fresh interpreters, the two arms interleaved
and paired run by run. Needs no GPU; run it in the environment FreeToken runs in, this package
installed there (its ``.pth``).

    python3 scripts/arming_cost.py [--runs 21]

Prints each arm's median and the median of the paired differences with its 95% interval. The package's
bytecode is compiled first, as ``pip install`` does: where ``PYTHONDONTWRITEBYTECODE`` is set and no bytecode
is cached, every process would compile the shim's modules again (about 8 ms here), a cost no install has.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

# The import timed whole; where the shim is armed, its install (the hook FreeToken's import runs) timed on its own
# too, inside the same import: the import's own noise (tens of ms) does not reach that figure.
PROBE = """\
import sys, time, torch, freetoken
hook = []
pending = getattr(sys.modules.get("freetoken_graphfix.bootstrap"), "_Pending", None)
if pending is not None and pending.hook is not None:
    def timed(module, install=pending.hook):
        t = time.perf_counter()
        install(module)
        hook.append(1e3 * (time.perf_counter() - t))
    pending.hook = timed
t = time.perf_counter()
import freetoken.engine.graph
print(1e3 * (time.perf_counter() - t), hook[0] if hook else "nan")
"""


def timed(value: str | None) -> tuple[float, float]:
    """One fresh interpreter: the import of the graph module and the shim's install inside it, in ms."""
    env = {k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}
    if value is not None:
        env["FT_GRAPH_UPLOAD"] = value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    whole, hook = out.stdout.strip().splitlines()[-1].split()
    return float(whole), float(hook)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=21, help="paired runs (default 21)")
    runs = ap.parse_args().runs
    import compileall

    import freetoken_graphfix
    from freetoken_graphfix_bench.stats import median_band

    compileall.compile_dir(os.path.dirname(freetoken_graphfix.__file__), quiet=1)

    unset, auto = [], []
    for i in range(runs):
        for value, into in (((None, unset), ("auto", auto)) if i % 2 else (("auto", auto), (None, unset))):
            into.append(timed(value))
    mid, low, high = median_band([a[0] - u[0] for a, u in zip(auto, unset, strict=True)])
    hook, hook_low, hook_high = median_band([a[1] for a in auto])
    print(f"import freetoken.engine.graph after torch and FreeToken, {runs} paired runs: unset "
          f"{statistics.median(u[0] for u in unset):.1f} ms, auto {statistics.median(a[0] for a in auto):.1f} ms; "
          f"paired difference {mid:+.1f} ms [{low:+.1f}, {high:+.1f}]; the shim's install inside the import "
          f"{hook:.1f} ms [{hook_low:.1f}, {hook_high:.1f}] (medians, 95% intervals)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
