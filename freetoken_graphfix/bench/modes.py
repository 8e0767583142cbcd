"""Which benchmark a ``bench`` command line selects, and the options each one reads: an option given
to a benchmark that would ignore it is refused in one line before anything runs, never dropped.
Part of the CLI boundary, beside ``cli``: the one place below it that reads the parsed namespace, to
check it; the modes themselves read their ``settings``."""

from __future__ import annotations

import argparse

RIG, ENGINE, SERVE, STARTUP, DEADLOCK = "the rig", "--engine", "--serve", "--startup", "--deadlock"
WRITE_MODEL, FROM_JSON, FROM_NSYS = "--write-model", "--from-json", "--from-nsys"
SELECTORS = ("from_json", "from_nsys", "startup", "write_model", "engine", "serve", "deadlock")
MODELS = (ENGINE, SERVE)
REPORTERS = (RIG, ENGINE, FROM_JSON)  # what writes --markdown and --plot

READ_BY = {  # an option's dest: the benchmarks that read it (json: every one that writes a record)
    "kernels": (RIG, DEADLOCK), "streams": (RIG, DEADLOCK), "strategies": (RIG, DEADLOCK),
    "batch_sizes": (RIG,), "instances": (RIG,), "reps": (RIG,), "profile_reps": (RIG,), "no_wait": (RIG,),
    "h2d": (RIG,), "matrix_kernels": (DEADLOCK,), "watchdog": (RIG, ENGINE, DEADLOCK),
    "model": MODELS, "context": MODELS, "decode_steps": MODELS, "prompt_file": MODELS, "logs": MODELS,
    "layers": (*MODELS, WRITE_MODEL), "experts": (*MODELS, WRITE_MODEL), "family": (WRITE_MODEL,),
    "jobs": (SERVE, DEADLOCK), "arms": (ENGINE,), "rounds": (ENGINE,), "copies": (ENGINE,), "replays": (ENGINE,),
    "trace_steps": (ENGINE,), "trace_runs": (ENGINE,), "warmup": (ENGINE,), "hang_timeout": (ENGINE,),
    "serve_arms": (SERVE,), "ready_timeout": (SERVE,), "request_timeout": (SERVE,), "startup_runs": (STARTUP,),
    "markdown": REPORTERS, "plot": REPORTERS, "verbose": (ENGINE, FROM_JSON),
    "json": (RIG, ENGINE, SERVE, STARTUP, DEADLOCK, FROM_JSON),
}


def what_runs(opts: argparse.Namespace) -> str:
    """The benchmark these options select, by the name its options are documented under."""
    for flag in SELECTORS:
        if getattr(opts, flag) not in (None, False):
            return "--" + flag.replace("_", "-")
    return RIG


def misplaced(opts: argparse.Namespace, ap: argparse.ArgumentParser) -> str | None:
    """Why this command line cannot run as given, in one line: two benchmarks selected at once, or an
    option set (to anything but its default) that the selected benchmark does not read."""
    chosen = ["--" + flag.replace("_", "-") for flag in SELECTORS if getattr(opts, flag) not in (None, False)]
    if len(chosen) > 1:
        return f"{' and '.join(chosen)} select different benchmarks: give one"
    mode = chosen[0] if chosen else RIG
    names = {a.dest: a.option_strings[0] for a in ap._actions if a.option_strings}
    for dest, readers in READ_BY.items():
        if getattr(opts, dest) != ap.get_default(dest) and mode not in readers:
            verb = "written" if dest in ("markdown", "plot", "json") else "read"
            return f"{names[dest]} is {verb} by {', '.join(readers)}, not by {mode}"
    return None
