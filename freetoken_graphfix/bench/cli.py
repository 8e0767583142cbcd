"""``bench``: what the capture-time upload and each strategy cost on this GPU, and whether any first
launch blocks: a decode-like graph in a rig, FreeToken's real engine (``--engine``), a real ``ft serve``
(``--serve``), interpreter start-up (``--startup``)."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import shlex
import sys
import tempfile

from . import engine, model, nsys, serve
from .common import (
    ERR,
    OK,
    Case,
    check_writable,
    environment,
    non_negative,
    positive,
    run_cases,
    seconds,
    write_outputs,
)
from .deadlock import deadlock_matrix, probe
from .modes import misplaced, what_runs
from .replay import STRATEGIES, gaps_child, run_arms
from .report import markdown, plot, render
from .settings import (
    DeadlockSettings,
    EngineSettings,
    Outputs,
    ProbeSettings,
    RigSettings,
    ServeSettings,
    from_options,
)
from .startup import startup
from .workload import DEFAULT_CONTEXT, DEFAULT_STEPS

FAMILIES = (model.SYNTHETIC, *model.FAMILIES)  # what --write-model writes

EPILOG = """\
FreeToken's own ft serve options go after --, for --engine and --serve (for the synthetic model
they follow its own and replace them), e.g.:
  python -m freetoken_graphfix bench --engine --model ~/models/Qwen3-8B -- --attention-backend triton
  python -m freetoken_graphfix bench --engine --layers 320 -- --moe-strategy offload
  python -m freetoken_graphfix bench --engine --layers 320 --experts nvfp4 -- --moe-strategy hybrid   (#775's layout)
  python -m freetoken_graphfix bench --write-model /tmp/llama --family llama   (config only: -- --dummy-weight)
"""


def parser(prog: str = "python -m freetoken_graphfix bench") -> argparse.ArgumentParser:
    # a short usage: argparse's own lists every option, twenty lines above a one-line error
    ap = argparse.ArgumentParser(prog=prog, usage="%(prog)s [options] [-- FreeToken's ft serve options] (-h: all)",
                                 description=__doc__.replace("``", "'"), epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    rig = ap.add_argument_group("the rig (default): a decode-like graph behind a real PLE table's WAIT")
    rig.add_argument("--kernels", type=positive, default=1090, help="small kernels per graph (default 1090)")
    rig.add_argument("--streams", type=positive, default=4, help="streams, fork/join per layer (default 4)")
    rig.add_argument("--batch-sizes", type=positive, nargs="+", default=[1, 2], metavar="BS",
                     help="one graph each (default 1 2)")
    rig.add_argument("--instances", type=positive, default=12,
                     help="graphs captured per strategy and bs: the unit ratios are measured over (default 12)")
    rig.add_argument("--reps", type=positive, default=300,
                     help="interleaved timed replays per graph instance (default 300)")
    rig.add_argument("--profile-reps", type=non_negative, default=20,
                     help="replays per arm traced for CUPTI gaps (0: off; default 20)")
    rig.add_argument("--no-wait", action="store_true", help="no head WAIT (no PLE table in the graph)")
    rig.add_argument("--h2d", action="store_true", help="add a pinned-host H2D copy per layer (MoE-offload-like)")
    rig.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES, metavar="MODE",
                     help=f"of: {', '.join(STRATEGIES)} (default: all)")
    rig.add_argument("--deadlock", action="store_true", help="first-launch probe matrix, a subprocess per case")
    rig.add_argument("--matrix-kernels", type=positive, nargs="+", default=[1000, 8000, 32000, 64000], metavar="N",
                     help="--deadlock graph sizes (default 1000 8000 32000 64000)")
    out = ap.add_argument_group("output")
    out.add_argument("--json", metavar="PATH", help="write every raw figure here")
    out.add_argument("--markdown", metavar="PATH",
                     help="write a report to paste upstream (GPU, driver, torch, FreeToken, the command, ms per step "
                          "and the ratios with their bands)")
    out.add_argument("--verbose", action="store_true",
                     help="--engine's --markdown: the detail too (every process's host mode and memory, the kernel "
                          "timeline per arm, the diagnostics from idle; --json always has them)")
    out.add_argument("--plot", metavar="PATH",
                     help="the rig and --engine: a PNG of the inter-kernel gap distributions per stream (--engine: "
                          "and each process's decode steps over the run); needs matplotlib")
    out.add_argument("--from-json", metavar="PATH",
                     help="judge a record a bench --json wrote again, by this version's rules, and print it (with "
                          "--markdown, --plot, --json), instead of running anything")
    out.add_argument("--from-nsys", metavar="CSV", nargs="+",
                     help="#775's table (ms a decode step, median gap per stream) from Nsight Systems' "
                          "`nsys stats --report cuda_gpu_trace --format csv` of runs profiled with "
                          "--cuda-graph-trace=node, one row per file, instead of running anything")
    out.add_argument("--logs", metavar="DIR", help="--engine/--serve: keep each process's log here (default: a "
                                                    "new temporary directory)")
    models = ap.add_argument_group(
        "--engine and --serve: the model and #775's workload (copy a text verbatim, greedy)")
    models.add_argument("--model", metavar="DIR", help="a model directory FreeToken loads (default: the synthetic "
                                                      "qwen4_exp, written per --layers)")
    models.add_argument("--layers", type=positive, nargs="+", metavar="N",
                        help="synthetic qwen4_exp sizes (default 48); with --write-model, the layer count")
    models.add_argument("--context", type=positive, default=DEFAULT_CONTEXT,
                        help=f"prompt tokens per request, by the model's own tokenizer (default {DEFAULT_CONTEXT}; "
                             "#775's is 65536)")
    models.add_argument("--decode-steps", "--tokens", dest="decode_steps", type=positive, default=DEFAULT_STEPS,
                        help=f"greedy tokens per request (default {DEFAULT_STEPS}, #775's window)")
    models.add_argument("--prompt-file", metavar="PATH",
                        help="the UTF-8 text to copy (default: the Apache License 2.0 shipped with this package)")
    models.add_argument("--jobs", type=positive, default=1,
                        help="--serve arms after the first, or --deadlock cases, run at once (default 1)")
    models.add_argument("--experts", choices=model.EXPERTS, default="bf16",
                        help="the synthetic qwen4_exp's routed experts: bf16 (an FTW checkpoint, default) or nvfp4 "
                             "(#775's layout: a ModelOpt NVFP4 safetensors checkpoint)")
    models.add_argument("--write-model", metavar="DIR",
                        help="write a model to run (--family) into DIR, a new or empty directory, and exit")
    models.add_argument("--family", choices=FAMILIES, default="qwen4_exp",
                        help=f"--write-model's model, of: {', '.join(FAMILIES)} (qwen4_exp: the synthetic FTW "
                             "checkpoint with a disk PLE table; the others config-only for -- --dummy-weight)")
    engine.add_arguments(ap.add_argument_group("--engine: every mode in FreeToken's real offline engine"))
    serve.add_arguments(ap.add_argument_group("--serve: every mode in a real ft serve, OpenAI client, through a "
                                              "cache rebuild"))
    ap.add_argument("--watchdog", type=seconds, default=4.0,
                    help="rig and --engine: seconds before a blocked first launch is released (default 4)")
    ap.add_argument("--startup", action="store_true", help="interpreter start-up with and without the .pth")
    ap.add_argument("--startup-runs", type=positive, default=200, help="interpreter starts per arm (default 200)")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gaps-child", metavar="PATH", help=argparse.SUPPRESS)
    ap.add_argument("--strategy", default="auto", choices=STRATEGIES, help=argparse.SUPPRESS)
    return ap


def split_freetoken_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(bench's own arguments, FreeToken's ``ft serve`` options after the first ``--``)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def early_checks(opts: argparse.Namespace, ft_args: list[str]) -> str | None:
    """``--engine``/``--serve`` input that can be refused before FreeToken (or torch) is imported: the
    prompt file, the options the bench owns, the model directory, ``--layers``; why not, in one line."""
    from .target import TargetError, check_synthetic, precheck
    from .workload import read_text

    if opts.model is not None and opts.layers:
        return "--layers sizes the synthetic model; with --model it has no meaning"
    if opts.model is not None and opts.experts != "bf16":
        return "--experts lays out the synthetic model's experts; with --model it has no meaning"
    try:
        read_text(opts.prompt_file)
        if opts.model is not None:
            precheck(opts.model, ft_args)
        else:
            from .model import check_layers

            check_synthetic(ft_args)
            for layers in opts.layers or []:
                check_layers(layers)
    except TargetError as exc:
        return str(exc)
    except ValueError as exc:
        return f"--layers: {exc}" if opts.model is None and "layers=" in str(exc) else str(exc)
    return None


def cuda_missing() -> str | None:
    """Why nothing can be measured here, or ``None``: checked before FreeToken is imported."""
    import torch

    if torch.cuda.is_available():
        return None
    return "no CUDA device; nothing to measure (use --startup for the start-up benchmark)"


def prepare_models(opts: argparse.Namespace, ft_args: list[str]) -> tuple[list[Case], str | None]:
    """The cases to run: ``--model`` resolved through FreeToken's own parser, else the synthetic model at
    each ``--layers`` (48 by default) with the options after ``--``; and the workload checked against
    them. No cases and why not, in one line, where they cannot run."""
    from .target import TargetError, from_model, parse_freetoken_args, synthetic, synthetic_args
    from .workload import build, check, read_text, tokenizer_of

    try:
        text = read_text(opts.prompt_file)
        if opts.model is None:  # FreeToken's own parser over the synthetic model's options and the user's
            with tempfile.TemporaryDirectory() as folder:
                model.write_synthetic_config(folder, model.MIN_LAYERS, opts.experts)
                parse_freetoken_args(folder, [*synthetic_args(0, 0), *ft_args])
                model.write_tokenizer(folder)
                build(tokenizer_of(folder), opts.context, text)  # the prompts fit (built again per case)
        else:
            build(tokenizer_of(opts.model), opts.context, text)
        target = from_model(opts.model, ft_args) if opts.model is not None else None
        check(opts.context, opts.decode_steps, target.max_positions if target else None)
    except (TargetError, ValueError) as exc:
        return [], str(exc)
    if target is not None and not target.synthetic:
        return [Case(target, None)], None
    return [Case(synthetic(opts.context, opts.decode_steps, ft_args, opts.experts), layers)
            for layers in opts.layers or [48]], None


def logs_unusable(logs: str | None) -> str | None:
    """``--logs DIR`` that cannot hold the logs: refused before a run, not a traceback after its start."""
    if logs is None:
        return None
    if not logs:
        return "--logs '': an empty path; accepted values are a directory (made if missing)"
    if os.path.exists(logs) and not os.path.isdir(logs):
        return f"--logs {logs!r} is not a directory; accepted values are a directory (made if missing)"
    parent = os.path.dirname(os.path.abspath(logs))
    if not os.path.isdir(logs) and not (os.path.isdir(parent) and os.access(parent, os.W_OK)):
        return f"--logs {logs!r}: cannot be made here; accepted values are a directory (made if missing)"
    if os.path.isdir(logs) and not os.access(logs, os.W_OK):
        return f"--logs {logs!r}: not writable; accepted values are a directory (made if missing)"
    return None


def plot_missing(opts: argparse.Namespace) -> str | None:
    """``--plot`` where matplotlib is not installed: refused before a run of minutes, not after it."""
    if opts.plot is None or importlib.util.find_spec("matplotlib") is not None:
        return None
    return f"--plot needs matplotlib, which is not installed here (pip install {INSTALL_HINT['matplotlib']})"


def from_json(opts: argparse.Namespace, prog: str) -> int:
    """``--from-json``: a saved record judged again by this version's rules and shown as a run shows it."""
    from . import rejudge

    try:
        saved = rejudge.load(opts.from_json)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return ERR
    for option, writer in (("--markdown", saved.markdown), ("--plot", saved.plot)):
        if getattr(opts, option[2:]) is not None and writer is None:
            print(f"{prog}: error: {option}: a {saved.kind} record has none; it is for the rig and --engine",
                  file=sys.stderr)
            return ERR
    print(saved.render())
    markdown = saved.markdown
    if opts.verbose:
        if saved.kind != "engine":
            print(f"{prog}: error: --verbose: a {saved.kind} record has no detail beyond its --markdown; it is for "
                  "--engine records", file=sys.stderr)
            return ERR
        markdown = functools.partial(saved.markdown, verbose=True)
    written = write_outputs(from_options(Outputs, opts), saved.record, markdown, saved.plot)
    return ERR if not written or saved.failed() else OK


def main(argv: list[str] | None = None, prog: str = "python -m freetoken_graphfix bench") -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, ft_args = split_freetoken_args(argv)
    ap = parser(prog)
    opts = ap.parse_args(own)
    opts.command = shlex.join(["python", "-m", "freetoken_graphfix", "bench", *argv])
    try:  # before a run of minutes, not after it
        for option in ("json", "markdown", "plot"):
            check_writable(getattr(opts, option), f"--{option}")
    except ValueError as exc:
        ap.error(str(exc))
    why = misplaced(opts, ap) or plot_missing(opts) or logs_unusable(opts.logs)
    if why:
        ap.error(why)
    if ft_args and not (opts.engine or opts.serve or opts.startup):  # --startup has always let them pass
        ap.error("FreeToken options after -- are for --engine and --serve")
    if opts.from_json is not None:
        return from_json(opts, prog)
    if opts.from_nsys is not None:
        try:
            print(nsys.table(opts.from_nsys))
        except ValueError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return ERR
        return OK
    if opts.startup:
        record, text = startup(opts.startup_runs)
        print(text)
        return OK if write_outputs(from_options(Outputs, opts), record) else ERR
    try:
        return run(opts, ft_args, prog, ap)
    except ModuleNotFoundError as exc:  # bench's own needs (FreeToken, its tokenizer...): one line, not a traceback
        name = (exc.name or "?").split(".")[0]
        print(f"{prog}: error: {what_runs(opts)} needs the Python module {name!r}, which is not installed here "
              f"(pip install {INSTALL_HINT.get(name, name)})", file=sys.stderr)
        return ERR


INSTALL_HINT = {"freetoken": "freetoken (the release to measure)", "openai": "'freetoken-graphfix[serve]'",
                "matplotlib": "'freetoken-graphfix[plot]'"}


def run(opts: argparse.Namespace, ft_args: list[str], prog: str, ap: argparse.ArgumentParser) -> int:
    """The benchmark the options select, once they passed every check that needs no GPU; each reads
    its own settings (``settings``), built here."""
    if opts.write_model is not None:
        if opts.layers and len(opts.layers) > 1:
            ap.error(f"--layers {' '.join(map(str, opts.layers))}: --write-model writes one model; accepted values "
                     "are one size")
        try:
            print(model.write_model(opts.write_model, opts.family, opts.layers[0] if opts.layers else None,
                                    opts.experts))
        except ValueError as exc:
            ap.error(str(exc))
        return OK
    if opts.engine or opts.serve:
        return run_models(opts, ft_args, prog)
    why = cuda_missing()
    if why:
        print(f"{prog}: error: {why}", file=sys.stderr)
        return ERR
    outputs = from_options(Outputs, opts)
    if opts.probe:
        print(json.dumps(probe(from_options(ProbeSettings, opts))))
        return OK
    if opts.gaps_child:
        return gaps_child(from_options(RigSettings, opts), opts.gaps_child)
    if opts.deadlock:
        rows, text = deadlock_matrix(from_options(DeadlockSettings, opts))
        print(text)
        protected = [r for r in rows if r["strategy"] != "skip"]
        failed = any(r.get("error") or r.get("blocked") for r in protected)
        return ERR if not write_outputs(outputs, {"env": environment(), "probes": rows}) or failed else OK
    record = run_arms(from_options(RigSettings, opts))
    record["command"] = opts.command
    print(render(record))
    return OK if write_outputs(outputs, record, markdown, plot) else ERR


def run_models(opts: argparse.Namespace, ft_args: list[str], prog: str) -> int:
    """``--engine`` or ``--serve`` over the cases the models give, after the checks that need FreeToken."""
    why = early_checks(opts, ft_args) or cuda_missing()
    cases: list[Case] = []
    if not why:
        cases, why = prepare_models(opts, ft_args)
    why = why or (serve.openai_missing() if opts.serve else None)
    if why:
        print(f"{prog}: error: {why}", file=sys.stderr)
        return ERR
    outputs = from_options(Outputs, opts)
    if opts.serve:
        settings = from_options(ServeSettings, opts, arms=tuple(opts.serve_arms or serve.DEFAULT_ARMS))
        return run_cases(cases, settings, opts.logs, outputs, "serve", serve.serve_record, serve.render,
                         lambda r: any(r["problems"].values()))
    from .engine_plot import plot as engine_plot
    from .engine_report import markdown as engine_markdown
    from .engine_report import render as engine_render

    arms = opts.arms or engine.default_arms(any(c.target.expects_wait for c in cases))
    settings = from_options(EngineSettings, opts, arms=tuple(arms))
    return run_cases(cases, settings, opts.logs, outputs, "engine", engine.engine_record, engine_render,
                     lambda r: bool(engine.failures(r)), functools.partial(engine_markdown, verbose=opts.verbose),
                     engine_plot)
