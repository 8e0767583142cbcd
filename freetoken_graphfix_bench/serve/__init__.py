"""``bench serve``: every arm in a real ``ft serve``, driven by the OpenAI client, through a cache rebuild.

Its entry (``SERVE``); what it runs and judges is imported when it runs.
"""

from __future__ import annotations

import argparse

from .. import arms
from ..benchmark import Benchmark, Subparsers, finish, model_cases, own
from ..options import models_options, outputs_options, positive, seconds
from ..records import ServeRecord
from ..reports import Report
from ..settings import ServeSettings, from_options


def add_serve(sub: Subparsers, prog: str) -> argparse.ArgumentParser:
    """``bench serve``'s options: the model and workload, the arms, the timeouts."""
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
    return serve


def run_serve(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench serve`` over the cases the models give, after the checks that need FreeToken and the client."""
    from .run import openai_missing, serve_case

    found, log_dir = model_cases(opts, ft_args, say, also=openai_missing)
    settings = from_options(ServeSettings, opts, arms=tuple(opts.arms or arms.SERVE_DEFAULT))
    record = ServeRecord([serve_case(c, settings, log_dir) for c in found])
    code = finish(opts, record, serve_report(record))
    print(f"serve logs: {log_dir}")
    return code


def serve_report(record: ServeRecord) -> Report:
    """Each case judged; a record with no case fails, since no runs is no pass."""
    from .report import judge, render

    judged = [(case, judge(case)) for case in record.cases]
    failures = [f for _, verdict in judged for f in verdict.failures()]
    if not judged:
        failures.append("no case in this record: nothing was measured")
    return Report("serve", "\n\n".join(render(c, v) for c, v in judged), failures)


SERVE = Benchmark("serve", add_serve, run_serve, ServeRecord, serve_report, ft_args=True)
