"""``python -m freetoken_graphfix bench``: what the upload and each strategy cost on this GPU."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from . import engine, serve
from .common import ERR, OK, environment, non_negative, positive, write_json
from .deadlock import deadlock_matrix, probe
from .replay import STRATEGIES, gaps_child, run_arms
from .report import markdown, plot, render
from .startup import startup


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m freetoken_graphfix bench", description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=positive, default=1090, help="small kernels per graph (default 1090)")
    ap.add_argument("--streams", type=positive, default=4, help="streams, fork/join per layer (default 4)")
    ap.add_argument("--batch-sizes", type=positive, nargs="+", default=[1, 2], help="one graph each (default 1 2)")
    ap.add_argument("--instances", type=positive, default=12,
                    help="graphs captured per strategy and bs: the unit ratios are measured over (default 12)")
    ap.add_argument("--reps", type=positive, default=300,
                    help="interleaved timed replays per graph instance (default 300)")
    ap.add_argument("--profile-reps", type=non_negative, default=20,
                    help="replays per arm traced for CUPTI gaps (0: off)")
    ap.add_argument("--no-wait", action="store_true", help="no head WAIT (no PLE table in the graph)")
    ap.add_argument("--h2d", action="store_true", help="add a pinned-host H2D copy per layer (MoE-offload-like)")
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    ap.add_argument("--watchdog", type=float, default=4.0, help="seconds before a blocked launch is released")
    ap.add_argument("--json", metavar="PATH", help="write every raw figure here")
    ap.add_argument("--markdown", metavar="PATH", help="write a report to paste upstream (GPU, versions, command, "
                    "ms per step, ratios, verdict)")
    ap.add_argument("--plot", metavar="PATH", help="PNG of the gap distributions (needs matplotlib)")
    ap.add_argument("--deadlock", action="store_true", help="first-launch probe matrix, a subprocess per case")
    ap.add_argument("--matrix-kernels", type=positive, nargs="+", default=[1000, 8000, 32000, 64000])
    ap.add_argument("--jobs", type=positive, default=1,
                    help="--deadlock cases, or --serve arms after the first, run at once (default 1)")
    ap.add_argument("--startup", action="store_true", help="interpreter start-up with and without the .pth")
    ap.add_argument("--startup-runs", type=positive, default=200)
    engine.add_arguments(ap.add_argument_group(
        "--engine: every mode in FreeToken's real engine (synthetic qwen4_exp)"))
    serve.add_arguments(ap.add_argument_group(
        "--serve: every mode in a real ft serve, OpenAI client, through a cache rebuild (with --layers, --tokens, "
        "--logs, --jobs)"))
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gaps-child", metavar="PATH", help=argparse.SUPPRESS)
    ap.add_argument("--strategy", default="auto", choices=STRATEGIES, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    opts = parser().parse_args(argv)
    if opts.startup:
        record, text = startup(opts.startup_runs)
        write_json(opts.json, record)
        print(text)
        return OK
    import torch

    if not torch.cuda.is_available():
        print("bench: no CUDA device; nothing to measure (use --startup for the start-up benchmark)",
              file=sys.stderr)
        return ERR
    if opts.engine:
        return engine.main(opts)
    if opts.serve:
        return serve.main(opts)
    if opts.probe:
        print(json.dumps(probe(opts)))
        return OK
    if opts.gaps_child:
        return gaps_child(opts)
    if opts.deadlock:
        rows, text = deadlock_matrix(opts)
        write_json(opts.json, {"env": environment(), "probes": rows})
        print(text)
        protected = [r for r in rows if r["strategy"] != "skip"]
        return ERR if any(r.get("error") or r.get("blocked") for r in protected) else OK
    record = run_arms(opts)
    record["command"] = shlex.join(["python", "-m", "freetoken_graphfix", "bench", *argv])
    write_json(opts.json, record)
    if opts.markdown:
        with open(opts.markdown, "w") as fh:
            fh.write(markdown(record))
    print(render(record))
    if opts.plot:
        print(plot(record, opts.plot))
    return OK
