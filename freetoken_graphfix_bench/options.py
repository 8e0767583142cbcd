"""The option types and option groups ``bench``'s subcommands share: counts and durations refused in one
line naming the accepted values, the output files, the model and the copy workload, the watchdog."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from . import model
from .workload import DEFAULT_CONTEXT, DEFAULT_STEPS


def whole_at_least(low: int) -> Callable[[str], int]:
    """An argparse type for a whole number of at least ``low``, refused in one line naming the accepted values."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: accepted values are whole numbers of {low} or more")
        return value

    return parse


positive, non_negative = whole_at_least(1), whole_at_least(0)


def seconds(text: str) -> float:
    """A duration in seconds: finite and above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: accepted values are seconds above 0")
    return value


def outputs_options(markdown: bool = True, plot: bool = True, verbose: bool = False) -> argparse.ArgumentParser:
    """The output options, only those the benchmark can write: argparse then refuses the rest."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", help="write the record here (every raw figure; bench report reads it)")
    if markdown:
        g.add_argument("--markdown", metavar="PATH", help="write a report to paste upstream (GPU, driver, torch, "
                                                          "FreeToken, the command, the figures with their bands)")
    if verbose:
        g.add_argument("--verbose", action="store_true", help="engine: the --markdown with the detail too (every "
                                                              "process's host level and memory, the kernel timeline "
                                                              "per arm, the diagnostics from idle)")
    if plot:
        g.add_argument("--plot", metavar="PATH", help="a PNG of the inter-kernel gap distributions per stream "
                                                      "(engine: and each process's decode steps); needs matplotlib")
    return p


def models_options() -> argparse.ArgumentParser:
    """The model and workload options ``bench engine`` and ``bench serve`` share: the copy workload, defined once."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("the model and the copy workload (copy a text verbatim, greedy)")
    g.add_argument("--model", metavar="DIR", help="a model directory FreeToken loads (default: the synthetic "
                                                  "qwen4_exp, written per --layers)")
    g.add_argument("--layers", type=positive, nargs="+", metavar="N", help="synthetic qwen4_exp sizes (default 48)")
    g.add_argument("--experts", choices=model.EXPERTS, default="bf16",
                   help="the synthetic qwen4_exp's routed experts: bf16 (an FTW checkpoint, default) or nvfp4 "
                        "(the reported layout: a ModelOpt NVFP4 safetensors checkpoint)")
    g.add_argument("--context", type=positive, default=DEFAULT_CONTEXT,
                   help=f"prompt tokens per request, by the model's own tokenizer (default {DEFAULT_CONTEXT}; "
                        "the report's is 65536)")
    g.add_argument("--decode-steps", type=positive, default=DEFAULT_STEPS,
                   help=f"greedy tokens per request (default {DEFAULT_STEPS}, the report's window)")
    g.add_argument("--prompt-file", metavar="PATH",
                   help="the UTF-8 text to copy (default: the Apache License 2.0 shipped with this package)")
    g.add_argument("--logs", metavar="DIR", help="keep each process's log here (default: a new temporary directory)")
    return p


def watchdog_option() -> argparse.ArgumentParser:
    """``--watchdog``, for every benchmark whose unprotected first launch may block."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--watchdog", type=seconds, default=4.0,
                   help="seconds before a blocked first launch is released (default 4)")
    return p


def split_freetoken_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(bench's own arguments, FreeToken's ``ft serve`` options after the first ``--``)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []
