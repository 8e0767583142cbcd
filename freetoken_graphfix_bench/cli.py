"""bench: what the capture-time upload and each mode cost on this GPU, and whether any first launch
blocks. One subcommand per benchmark, each with its own options: argparse refuses an option a
benchmark does not read."""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys

from freetoken_graphfix.tools import exits
from freetoken_graphfix.tools.exits import Parser

from . import options, registry
from .benchmark import refused
from .outputs import check_writable, logs_unusable

INSTALL_HINT = {"freetoken": "freetoken (the release to measure)", "openai": "'freetoken-graphfix[serve]'",
                "matplotlib": "'freetoken-graphfix[plot]'"}
EPILOG = """\
examples:
  bench rig                                          does the upload cost this GPU? (a decode-like graph)
  bench engine --model ~/models/Qwen3-8B -- --attention-backend triton
  bench engine --layers 320 --experts nvfp4 -- --moe-strategy hybrid   (the reported layout)
  bench report 775.json --markdown 775.md            a saved record, judged again
  bench nsys ft-upstream.csv ft-auto.csv             Nsight Systems traces, per graph
"""


def parser(prog: str = "freetoken-graphfix bench") -> argparse.ArgumentParser:
    """The whole ``bench`` command line: one subparser per benchmark in ``registry``, so argparse refuses what a
    benchmark does not read."""
    ap = Parser(prog=prog, command="bench", usage="%(prog)s <benchmark> [options] (-h: all)",
                description=__doc__.split("\n\n")[0], epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="bench", required=True, title="benchmarks", metavar="{" + ",".join(visible()) + "}")
    for bench in registry.BENCHMARKS:
        own_parser = bench.add_parser(sub, prog)
        own_parser.set_defaults(bench_parser=own_parser)  # each benchmark's refusals said in its own usage
    return ap


def visible() -> list[str]:
    """The benchmarks ``bench -h`` lists (not the hidden entries child processes run)."""
    return [b.name for b in registry.BENCHMARKS if not b.hidden]


def checked(ap: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options, refused in one line (exit 2) before anything runs where they cannot work: FreeToken
    options for a benchmark that runs no FreeToken server options, an output that could not be written,
    ``--plot`` without matplotlib, ``--logs`` that cannot hold the logs."""
    ours, ft_args = options.split_freetoken_args(argv)
    named = next((a for a in ours if not a.startswith("-")), None)
    if named is not None and named not in (b.name for b in registry.BENCHMARKS):
        ap.error(f"{named!r} is not a benchmark; accepted values: {', '.join(visible())}")
    opts, extra = ap.parse_known_args(ours)
    sub = opts.bench_parser
    if extra:  # said by the benchmark's own parser, with its own usage
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    takers = [b.name for b in registry.BENCHMARKS if b.ft_args]
    if ft_args and opts.bench not in takers:
        sub.error(f"FreeToken options after -- are for {' and '.join(takers)}, not {opts.bench}: {shlex.join(ft_args)}")
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
        return registry.named(opts.bench).run(opts, ft_args, say)
    except ModuleNotFoundError as exc:  # bench's own needs (FreeToken, its tokenizer...): one line, not a traceback
        name = (exc.name or "?").split(".")[0]
        raise refused(say, f"needs the Python module {name!r}, which is not installed here "
                           f"(pip install {INSTALL_HINT.get(name, name)})") from None
