"""The tools beside the benchmarks, which save no record: ``bench nsys`` (Nsight Systems traces read per
graph), ``bench launch`` (a tracer's cost to one launch) and ``bench write-model`` (a model to run)."""

from __future__ import annotations

import argparse

from freetoken_graphfix.tools.exits import OK, UsageError

from . import model
from .benchmark import Benchmark, Subparsers, needs_cuda, own, refused
from .options import positive


def add_nsys(sub: Subparsers, prog: str) -> argparse.ArgumentParser:
    """``bench nsys``'s arguments: the traces."""
    nsys = sub.add_parser("nsys", help="the regression's figures from Nsight Systems traces, per graph",
                          **own(prog, "nsys"),
                          description="Per trace and per graph (known by its kernels per launch): graph launches, "
                                      "kernel busy time, the stall at the PLE WAIT on its own, the median gap per "
                                      "stream with the stall left out. Reads nsys stats --report cuda_gpu_trace "
                                      "--format csv, its --output file or its stdout.")
    nsys.add_argument("traces", nargs="+", metavar="CSV", help="one per build, e.g. ft-upstream_cuda_gpu_trace.csv")
    return nsys


def run_nsys(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench nsys``: a trace that is not one is a one-line error naming the file and the row."""
    from . import nsys

    try:
        print(nsys.report([nsys.read(path) for path in opts.traces]))
    except nsys.TraceError as exc:
        raise refused(say, str(exc)) from None
    return OK


def add_launch(sub: Subparsers, prog: str) -> argparse.ArgumentParser:
    """``bench launch``'s options: the graph's size and the launches timed."""
    launch = sub.add_parser("launch", help="a tracer's cost to cuGraphLaunch on the host (run it under nsys too)",
                            **own(prog, "launch"),
                            description="Host time of cuGraphLaunch for one graph, untraced and under CUPTI (as "
                                        "bench engine's traced runs); under nsys profile the untraced figure is "
                                        "Nsight Systems'. A wait-sync graph's PLE WAIT stalls for that long. Needs a "
                                        "CUDA device.")
    launch.add_argument("--kernels", type=positive, default=1700, help="small kernels in the graph (default 1700)")
    launch.add_argument("--launches", type=positive, default=200, help="timed launches each way (default 200)")
    return launch


def run_launch(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench launch``: a tracer's cost to one launch, printed (a diagnostic, no record)."""
    from .launch import measure, render

    needs_cuda(say)
    print(render(measure(opts.kernels, opts.launches)))
    return OK


def add_write_model(sub: Subparsers, prog: str) -> argparse.ArgumentParser:
    """``bench write-model``'s arguments: the folder and the model."""
    write = sub.add_parser("write-model", help="write a model to run (then: bench engine --model DIR)",
                           **own(prog, "write-model"),
                           description="Write the synthetic qwen4_exp (a disk PLE table whose WAIT every decode graph "
                                       "holds) or a config-only model of another family (for -- --dummy-weight) into "
                                       "DIR, a new or empty directory.")
    write.add_argument("folder", metavar="DIR", help="a new or empty directory")
    write.add_argument("--family", choices=(model.SYNTHETIC, *model.FAMILIES), default=model.SYNTHETIC,
                       help=f"of: {', '.join((model.SYNTHETIC, *model.FAMILIES))} (default {model.SYNTHETIC})")
    write.add_argument("--layers", type=positive, help="layers (default 48 for the synthetic qwen4_exp)")
    write.add_argument("--experts", choices=model.EXPERTS, default="bf16", help="the synthetic model's experts")
    return write


def run_write_model(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench write-model``: a folder it will not write into is a usage error (exit 2), said in one line."""
    try:
        print(model.write_model(opts.folder, opts.family, opts.layers, opts.experts))
    except ValueError as exc:
        raise UsageError(f"bench {exc}") from None  # its message names write-model and the folder
    return OK


NSYS = Benchmark("nsys", add_nsys, run_nsys)
LAUNCH = Benchmark("launch", add_launch, run_launch)
WRITE_MODEL = Benchmark("write-model", add_write_model, run_write_model)
