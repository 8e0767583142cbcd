"""``bench engine``: every arm in FreeToken's real offline engine, a process per arm; ``child/`` is that process.

Its entry (``ENGINE``); what it runs and judges is imported when it runs.
"""

from __future__ import annotations

import argparse

from .. import arms
from ..benchmark import Benchmark, Subparsers, finish, model_cases, own
from ..options import models_options, non_negative, outputs_options, positive, seconds, watchdog_option
from ..records import EngineRecord
from ..reports import Report
from ..settings import EngineSettings, from_options


def add_engine(sub: Subparsers, prog: str) -> argparse.ArgumentParser:
    """``bench engine``'s options: the model and workload, the arms, and how each is measured."""
    names = ", ".join(arms.ARMS)
    engine = sub.add_parser("engine", help="every arm in FreeToken's real offline engine, on the copy workload",
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
    return engine


def run_engine(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench engine`` over the cases the models give, after the checks that need FreeToken."""
    from .run import engine_case

    found, log_dir = model_cases(opts, ft_args, say)
    chosen = opts.arms or arms.default_engine_arms(any(c.target.expects_wait for c in found))
    settings = from_options(EngineSettings, opts, arms=tuple(chosen))
    record = EngineRecord([engine_case(c, settings, log_dir) for c in found])
    code = finish(opts, record, engine_report(record))
    print(f"engine logs: {log_dir}")
    return code


def engine_report(record: EngineRecord) -> Report:
    """Each case's figures derived and judged; a record with no case fails, since no runs is no pass."""
    from .figures import figures_of
    from .headline import failures as engine_failures
    from .plot import plot
    from .report import markdown_case, render

    judged = [(case, figures_of(case)) for case in record.cases]
    failures = [f for _, figures in judged for f in engine_failures(figures)]
    failures += [f"{case.label}: no process ran (no arm has a run)" for case in record.cases
                 if not any(case.runs.values())]
    if not judged:
        failures.append("no case in this record: nothing was measured")
    return Report("engine", "\n\n".join(render(c, f) for c, f in judged), failures,
                  markdown=lambda verbose: "\n".join(line for c, f in judged for line in markdown_case(c, f, verbose)),
                  plot=(lambda path: plot(*judged[0], path)) if judged else None, has_detail=True)


ENGINE = Benchmark("engine", add_engine, run_engine, EngineRecord, engine_report, ft_args=True)
