"""bench: what the capture-time upload and each mode cost on this GPU, and whether any first launch
blocks. One subcommand per benchmark, each with its own options: argparse refuses an option a
benchmark does not read."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from freetoken_graphfix import exits
from freetoken_graphfix.errors import GraphfixError
from freetoken_graphfix.exits import ERROR, OK, Parser, UsageError

from . import arms, model, options, record_files, records
from .cases import Models
from .options import models_options, non_negative, outputs_options, positive, seconds, watchdog_option, whole_at_least
from .outputs import check_writable, logs_unusable, none_for, write_outputs
from .reports import Report, report_of
from .settings import DeadlockSettings, EngineSettings, Outputs, ProbeSettings, RigSettings, ServeSettings, from_options
from .startup import MIN_RUNS

MODELS_TAKE_FT_ARGS = ("engine", "serve")  # the benchmarks FreeToken's own options after -- go to
INSTALL_HINT = {"freetoken": "freetoken (the release to measure)", "openai": "'freetoken-graphfix[serve]'",
                "matplotlib": "'freetoken-graphfix[plot]'"}
EPILOG = """\
examples:
  bench rig                                          does the upload cost this GPU? (a decode-like graph)
  bench engine --model ~/models/Qwen3-8B -- --attention-backend triton
  bench engine --layers 320 --experts nvfp4 -- --moe-strategy hybrid   (#775's layout)
  bench report 775.json --markdown 775.md            a saved record, judged again
  bench nsys ft-upstream.csv ft-auto.csv             Nsight Systems traces, per graph
"""


def add_rig(sub: argparse._SubParsersAction, prog: str) -> None:
    """``bench rig`` and ``bench deadlock`` (and the hidden per-case ``_probe``): the benchmarks on the rig's synthetic
    graph."""
    rig = sub.add_parser("rig", help="replay cost per mode on a decode-like graph behind a real PLE table's WAIT",
                         parents=[outputs_options(), watchdog_option()], **own(prog, "rig"),
                         description="Replay cost per shim mode: graph instances captured through the shim on "
                                     "FreeToken's real GraphRunner and PLE table, replayed interleaved, with a "
                                     "positive control. Needs a CUDA device.")
    rig.add_argument("--kernels", type=positive, default=1090, help="small kernels per graph (default 1090)")
    rig.add_argument("--streams", type=positive, default=4, help="streams, fork/join per layer (default 4)")
    rig.add_argument("--batch-sizes", type=positive, nargs="+", default=[1, 2], metavar="BS",
                     help="one graph each (default 1 2)")
    rig.add_argument("--instances", type=positive, default=12,
                     help="graphs captured per mode and bs: the unit ratios are measured over (default 12)")
    rig.add_argument("--reps", type=positive, default=300,
                     help="interleaved timed replays per graph instance (default 300)")
    rig.add_argument("--profile-reps", type=non_negative, default=20,
                     help="replays per mode traced for CUPTI gaps (0: off; default 20)")
    rig.add_argument("--no-wait", action="store_true", help="no head WAIT (no PLE table in the graph)")
    rig.add_argument("--h2d", action="store_true", help="add a pinned-host H2D copy per layer (MoE-offload-like)")
    rig.add_argument("--modes", nargs="+", default=list(arms.SHIM_MODES), choices=arms.SHIM_MODES, metavar="MODE",
                     help=f"of: {', '.join(arms.SHIM_MODES)} (default: all)")
    rig.add_argument("--gaps-child", action="store_true", help=argparse.SUPPRESS)  # cupti.gaps_from_child's child
    deadlock = sub.add_parser("deadlock", help="does a first launch block, per graph size, streams and mode",
                              parents=[outputs_options(markdown=False, plot=False), watchdog_option()],
                              **own(prog, "deadlock"),
                              description="The first-launch matrix: one graph per (kernels, streams, mode) case, "
                                          "each captured and first launched in a process of its own. Exits 1 when a "
                                          "protected mode blocked. Needs a CUDA device.")
    deadlock.add_argument("--sizes", type=positive, nargs="+", default=[1000, 8000, 32000, 64000], metavar="N",
                          help="graph sizes in kernels (default 1000 8000 32000 64000)")
    deadlock.add_argument("--modes", nargs="+", default=list(arms.SHIM_MODES), choices=arms.SHIM_MODES,
                          metavar="MODE", help=f"of: {', '.join(arms.SHIM_MODES)} (default: all)")
    deadlock.add_argument("--jobs", type=positive, default=1, help="cases run at once (default 1)")


def add_engine(sub: argparse._SubParsersAction, prog: str) -> None:
    """``bench engine`` and ``bench serve``: the benchmarks on FreeToken's real engine, each with only the options it
    reads."""
    names = ", ".join(arms.ARMS)
    engine = sub.add_parser("engine", help="every arm in FreeToken's real offline engine, #775's workload",
                            parents=[models_options(), outputs_options(verbose=True), watchdog_option()],
                            **own(prog, "engine", ft_args=True),
                            description="Every arm in FreeToken's real offline engine, a process per arm and round: "
                                        "safety (never blocked, the reference's tokens), the upload inside each "
                                        "process's decode loop with a positive control, the arms across processes. "
                                        "FreeToken's own ft serve options go after --. Needs a CUDA device.")
    engine.add_argument("--arms", nargs="+", choices=arms.ARMS, metavar="ARM",
                        help=f"arms, of: {names} (default: {' '.join(arms.ENGINE_DEFAULT)}, and deferred where the "
                             "graphs hold the WAIT; patched runs the patch series)")
    engine.add_argument("--rounds", type=positive, default=4,
                        help="runs of every arm, each in its own process, in rotated order: the samples of every "
                             "cross-process ratio (default 4)")
    engine.add_argument("--copies", type=non_negative, default=4,
                        help="fresh executables of each engine graph per process, as many uploaded and never "
                             "uploaded, launched in turn with the engine's own in its decode loop: the upload "
                             "measured inside one process (0: off; default 4)")
    engine.add_argument("--replays", type=positive, default=50,
                        help="timed replays of each executable from an idle GPU, after the workload: a diagnostic "
                             "(default 50)")
    engine.add_argument("--trace-steps", type=non_negative, default=24,
                        help="decode steps per request of each traced run (0: no kernel timeline; default 24)")
    engine.add_argument("--trace-runs", type=positive, default=2, help="traced processes per arm, at most --rounds "
                                                                       "(default 2)")
    engine.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="no unrecorded warm-up run (kernel compilation then lands on the first arm)")
    engine.add_argument("--hang-timeout", type=seconds, default=300.0,
                        help="seconds before an engine process is killed (default 300)")
    serve = sub.add_parser("serve", help="every arm in a real ft serve, OpenAI client, through a cache rebuild",
                           parents=[models_options(), outputs_options(markdown=False, plot=False)],
                           **own(prog, "serve", ft_args=True),
                           description="Every arm in a real ft serve driven by the OpenAI client, through a cache "
                                       "rebuild: hangs, tokens, the shim's capture passes, a clean stop. Exits 1 when "
                                       "a protected arm hangs or changes the text. Needs a CUDA device and "
                                       "pip install 'freetoken-graphfix[serve]'.")
    serve.add_argument("--arms", nargs="+", choices=arms.SERVE_ARMS, metavar="ARM",
                       help=f"arms, of: {', '.join(arms.SERVE_ARMS)} (default: {' '.join(arms.SERVE_DEFAULT)})")
    serve.add_argument("--jobs", type=positive, default=1, help="arms after the first run at once (default 1)")
    serve.add_argument("--ready-timeout", type=seconds, default=300.0,
                       help="seconds for a server to be ready (default 300)")
    serve.add_argument("--request-timeout", type=seconds, default=45.0,
                       help="seconds before a request counts as hung (default 45)")


def add_tools(sub: argparse._SubParsersAction, prog: str) -> None:
    """``startup``, ``report``, ``nsys``, ``launch`` and ``write-model``: the tools beside the benchmarks."""
    startup = sub.add_parser("startup", help="interpreter start-up with and without the .pth (no GPU)",
                             parents=[outputs_options(markdown=False, plot=False)], **own(prog, "startup"),
                             description="python -c pass in a bare venv and in one holding this package's .pth, "
                                         "FT_GRAPH_UPLOAD unset, armed and off, paired run by run.")
    startup.add_argument("--runs", type=whole_at_least(MIN_RUNS), default=200,
                         help=f"interpreter starts per arm, {MIN_RUNS} or more (default 200)")
    report = sub.add_parser("report", help="judge a saved record again by this version's rules and show it",
                            parents=[outputs_options(verbose=True)], **own(prog, "report"),
                            description="Read a record a bench --json wrote (any kind, any schema), judge it by "
                                        "this version's rules and show it as its run would; --json writes it again "
                                        "in the current schema. Exits 1 when the record fails its checks.")
    report.add_argument("record", metavar="RECORD", help="the record (a --json file)")
    nsys = sub.add_parser("nsys", help="#775's figures from Nsight Systems traces, per graph", **own(prog, "nsys"),
                          description="Per trace and per graph (known by its kernels per launch): graph launches, "
                                      "kernel busy time, the stall at the PLE WAIT on its own, the median gap per "
                                      "stream with the stall left out. Reads nsys stats --report cuda_gpu_trace "
                                      "--format csv, its --output file or its stdout.")
    nsys.add_argument("traces", nargs="+", metavar="CSV", help="one per build, e.g. ft-upstream_cuda_gpu_trace.csv")
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
    launch = sub.add_parser("launch", help="a tracer's cost to cuGraphLaunch on the host (run it under nsys too)",
                            **own(prog, "launch"),
                            description="Host time of cuGraphLaunch for one graph, untraced and under CUPTI (as "
                                        "bench engine's traced runs); under nsys profile the untraced figure is "
                                        "Nsight Systems'. A wait-sync graph's PLE WAIT stalls for that long. Needs a "
                                        "CUDA device.")
    launch.add_argument("--kernels", type=positive, default=1700, help="small kernels in the graph (default 1700)")
    launch.add_argument("--launches", type=positive, default=200, help="timed launches each way (default 200)")
    # one first-launch case, in its own process (rig.deadlock.run_case): no help, so not listed
    probe = sub.add_parser("_probe", parents=[watchdog_option()], prog=f"{prog} _probe", command="bench _probe")
    probe.add_argument("--kernels", type=positive, required=True)
    probe.add_argument("--streams", type=positive, required=True)
    probe.add_argument("--mode", choices=arms.SHIM_MODES, required=True)


VISIBLE = ("rig", "deadlock", "engine", "serve", "startup", "report", "nsys", "launch", "write-model")


def parser(prog: str = "freetoken-graphfix bench") -> argparse.ArgumentParser:
    """The whole ``bench`` command line: one subparser per benchmark, so argparse refuses what a benchmark does not
    read."""
    ap = Parser(prog=prog, command="bench", usage="%(prog)s <benchmark> [options] (-h: all)",
                                 description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="bench", required=True, title="benchmarks", metavar="{" + ",".join(VISIBLE) + "}")
    add_rig(sub, prog)
    add_engine(sub, prog)
    add_tools(sub, prog)
    for sub_parser in sub.choices.values():  # each benchmark's refusals are said with its own usage
        sub_parser.set_defaults(bench_parser=sub_parser)
    return ap


def own(prog: str, name: str, ft_args: bool = False) -> dict[str, Any]:
    """A benchmark's parser's name and its short usage (argparse's own lists every option, twenty lines
    above a one-line error)."""
    tail = " [-- FreeToken's ft serve options]" if ft_args else ""
    return {"prog": f"{prog} {name}", "usage": f"%(prog)s [options]{tail} (-h: all)", "command": f"bench {name}"}


def checked(ap: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options, refused in one line (exit 2) before anything runs where they cannot work: FreeToken
    options for a benchmark that runs no FreeToken server options, an output that could not be written,
    ``--plot`` without matplotlib, ``--logs`` that cannot hold the logs."""
    ours, ft_args = options.split_freetoken_args(argv)
    named = next((a for a in ours if not a.startswith("-")), None)
    if named is not None and named not in RUN:
        ap.error(f"{named!r} is not a benchmark; accepted values: {', '.join(VISIBLE)}")
    opts, extra = ap.parse_known_args(ours)
    sub = opts.bench_parser
    if extra:  # said by the benchmark's own parser, with its own usage
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if ft_args and opts.bench not in MODELS_TAKE_FT_ARGS:
        sub.error(f"FreeToken options after -- are for {' and '.join(MODELS_TAKE_FT_ARGS)}, not {opts.bench}: "
                  f"{shlex.join(ft_args)}")
    for option in ("json", "markdown", "plot"):
        why = check_writable(getattr(opts, option, None), f"--{option}")
        if why:
            sub.error(why)
    if getattr(opts, "plot", None) and getattr(opts, "profile_reps", None) == 0:
        sub.error("--plot draws the CUPTI gaps, which --profile-reps 0 turns off")
    if getattr(opts, "plot", None) and importlib.util.find_spec("matplotlib") is None:
        sub.error(f"--plot needs matplotlib, which is not installed here (pip install {INSTALL_HINT['matplotlib']})")
    why = logs_unusable(getattr(opts, "logs", None))
    if why:
        sub.error(why)
    return opts, ft_args


def main(argv: list[str] | None = None, prog: str = "freetoken-graphfix bench") -> int:
    """Entry point of ``bench`` (the tool's ``freetoken-graphfix bench``, or this package's ``__main__``): every error
    said in the command line's one line, with its exit code (``exits.run``)."""
    argv = sys.argv[1:] if argv is None else argv
    return exits.run(lambda: run(argv, prog))


def run(argv: list[str], prog: str) -> int:
    """Parse, run the chosen benchmark, and turn a missing module into one line."""
    opts, ft_args = checked(parser(prog), argv)
    opts.command = shlex.join(["freetoken-graphfix", "bench", *argv])
    say = f"bench {opts.bench}"
    try:
        return RUN[opts.bench](opts, ft_args, say)
    except ModuleNotFoundError as exc:  # bench's own needs (FreeToken, its tokenizer...): one line, not a traceback
        name = (exc.name or "?").split(".")[0]
        raise refused(say, f"needs the Python module {name!r}, which is not installed here "
                           f"(pip install {INSTALL_HINT.get(name, name)})") from None


def refused(say: str, why: str) -> GraphfixError:
    """The one shape every refusal of a benchmark takes: ``bench SUBCOMMAND: why``, exit 1."""
    return GraphfixError(f"{say}: {why}")


def finish(opts: argparse.Namespace, record: records.Record, report: Report | None = None) -> int:
    """A finished run's (or a read record's) report printed, its files written; exit 1 where it failed."""
    report = report or report_of(record)
    print(report.text or "\n".join(report.failures))
    outputs = Outputs(opts.json, getattr(opts, "markdown", None), getattr(opts, "plot", None),
                      getattr(opts, "verbose", False))
    written = write_outputs(outputs, record, report)
    return ERROR if not written or report.failed else OK


def cuda_missing() -> str | None:
    """Why nothing can be measured here, or ``None``: checked before FreeToken is imported."""
    import torch

    return None if torch.cuda.is_available() else ("no CUDA device; nothing to measure (bench startup, report, nsys "
                                                      "and write-model need none)")


def do_rig(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench rig``, or its hidden CUPTI child (``--gaps-child``), which the rig starts in a fresh process."""
    from .rig.measure import gaps_child, run_arms

    why = cuda_missing()
    if why:
        raise refused(say, why)
    if opts.gaps_child:
        return gaps_child(from_options(RigSettings, opts))
    return finish(opts, run_arms(from_options(RigSettings, opts), opts.command))


def do_deadlock(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench deadlock``: the first-launch matrix, refused where there is no CUDA device."""
    from .rig.deadlock import deadlock_matrix

    why = cuda_missing()
    if why:
        raise refused(say, why)
    return finish(opts, deadlock_matrix(from_options(DeadlockSettings, opts)))


def do_models(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench engine`` or ``bench serve`` over the cases the models give, after the checks that need FreeToken."""
    from . import cases
    from .serve.run import openai_missing

    asked = Models(opts.model, tuple(opts.layers) if opts.layers else None, opts.experts, opts.context,
                   opts.decode_steps, opts.prompt_file)
    why = cases.early_checks(asked, ft_args) or cuda_missing()
    found: list[cases.Case] = []
    if not why:
        found, why = cases.prepare(asked, ft_args)
    why = why or (openai_missing() if opts.bench == "serve" else None)
    if why:
        raise refused(say, why)
    log_dir = opts.logs or tempfile.mkdtemp(prefix=f"graphfix-{opts.bench}-")
    os.makedirs(log_dir, mode=0o700, exist_ok=True)  # --logs: checked private (or made so) before anything ran
    if opts.bench == "serve":
        from .serve.run import serve_case

        settings = from_options(ServeSettings, opts, arms=tuple(opts.arms or arms.SERVE_DEFAULT))
        record: records.Record = records.ServeRecord([serve_case(c, settings, log_dir) for c in found])
    else:
        from .engine.run import engine_case

        chosen = opts.arms or arms.default_engine_arms(any(c.target.expects_wait for c in found))
        settings = from_options(EngineSettings, opts, arms=tuple(chosen))
        record = records.EngineRecord([engine_case(c, settings, log_dir) for c in found])
    code = finish(opts, record)
    print(f"{opts.bench} logs: {log_dir}")
    return code


def do_startup(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench startup``: needs no GPU, so nothing to check before it runs."""
    from .startup import startup

    return finish(opts, startup(opts.runs))


def do_report(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """A saved record judged again: refused first where an option asks for what its kind lacks."""
    try:
        record = record_files.read(opts.record)
        report = report_of(record)
    except record_files.RecordError as exc:
        raise refused(say, str(exc)) from None
    except record_files.DAMAGED as exc:
        raise refused(say, record_files.damaged(opts.record, exc)) from None
    if opts.verbose and not report.has_detail:
        raise refused(say, f"--verbose: a {report.kind} record has no detail beyond its report; it is for engine "
                          "records")
    for option in ("markdown", "plot"):
        if getattr(opts, option) is not None and getattr(report, option) is None:
            raise refused(say, none_for(f"--{option}", report.kind))
    try:
        return finish(opts, record, report)
    except record_files.DAMAGED as exc:  # --markdown and --plot are drawn only now
        raise refused(say, record_files.damaged(opts.record, exc)) from None


def do_nsys(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench nsys``: a trace that is not one is a one-line error naming the file and the row."""
    from . import nsys

    try:
        print(nsys.report([nsys.read(path) for path in opts.traces]))
    except nsys.TraceError as exc:
        raise refused(say, str(exc)) from None
    return OK


def do_launch(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench launch``: a tracer's cost to one launch, printed (a diagnostic, no record)."""
    from .launch import measure, render

    why = cuda_missing()
    if why:
        raise refused(say, why)
    print(render(measure(opts.kernels, opts.launches)))
    return OK


def do_write_model(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench write-model``: a folder it will not write into is a usage error (exit 2), said in one line."""
    try:
        print(model.write_model(opts.folder, opts.family, opts.layers, opts.experts))
    except ValueError as exc:
        raise UsageError(f"bench {exc}") from None  # its message names write-model and the folder
    return OK


def do_probe(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """One first-launch case of ``bench deadlock``, in the fresh process the matrix starts: its result as its
    answer (``child.answer``)."""
    import dataclasses

    from freetoken_graphfix import child

    from .rig.deadlock import probe

    child.answer(dataclasses.asdict(probe(from_options(ProbeSettings, opts))))
    return OK


RUN: dict[str, Callable[[argparse.Namespace, list[str], str], int]] = {
    "rig": do_rig, "deadlock": do_deadlock, "engine": do_models, "serve": do_models, "startup": do_startup,
    "report": do_report, "nsys": do_nsys, "launch": do_launch, "write-model": do_write_model, "_probe": do_probe}
