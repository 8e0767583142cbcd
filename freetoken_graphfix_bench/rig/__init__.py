"""``bench rig`` and ``bench deadlock``: a decode-like graph on FreeToken's real graph runner and PLE table.

Their entries (``RIG``, ``DEADLOCK``, and the hidden ``_probe`` each deadlock case runs in its own
process); what they run is imported when they run.
"""

from __future__ import annotations

import argparse

from .. import arms
from ..benchmark import Benchmark, Subparsers, finish, needs_cuda, own
from ..options import non_negative, outputs_options, positive, watchdog_option
from ..records import DeadlockRecord, RigRecord
from ..reports import Report
from ..settings import DeadlockSettings, ProbeSettings, RigSettings, from_options


def add_rig(sub: Subparsers, prog: str) -> argparse.ArgumentParser:
    """``bench rig``'s options."""
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
    return rig


def run_rig(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench rig``, or its hidden CUPTI child (``--gaps-child``), which the rig starts in a fresh process."""
    from .measure import gaps_child, run_arms

    needs_cuda(say)
    if opts.gaps_child:
        return gaps_child(from_options(RigSettings, opts))
    record = run_arms(from_options(RigSettings, opts), opts.command)
    return finish(opts, record, rig_report(record))


def rig_report(record: RigRecord) -> Report:
    """The replay table, its markdown, and where the CUPTI gaps were traced, their plot."""
    from . import report

    drawable = any(arm.gaps_us for arm in record.arms.values())
    return Report("rig", report.render(record), markdown=lambda verbose: report.markdown(record),
                  plot=(lambda path: report.plot(record, path)) if drawable else None)


def add_deadlock(sub: Subparsers, prog: str) -> argparse.ArgumentParser:
    """``bench deadlock``'s options."""
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
    return deadlock


def run_deadlock(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """``bench deadlock``: the first-launch matrix, refused where there is no CUDA device."""
    from .deadlock import deadlock_matrix

    needs_cuda(say)
    record = deadlock_matrix(from_options(DeadlockSettings, opts))
    return finish(opts, record, deadlock_report(record))


def deadlock_report(record: DeadlockRecord) -> Report:
    """The matrix, failed where a protected mode blocked."""
    from . import deadlock

    return Report("deadlock", deadlock.render(record), deadlock.failures(record))


def add_probe(sub: Subparsers, prog: str) -> argparse.ArgumentParser:
    """One first-launch case, in its own process (``deadlock.run_case``): no help, so not listed."""
    probe = sub.add_parser("_probe", parents=[watchdog_option()], prog=f"{prog} _probe", command="bench _probe")
    probe.add_argument("--kernels", type=positive, required=True)
    probe.add_argument("--streams", type=positive, required=True)
    probe.add_argument("--mode", choices=arms.SHIM_MODES, required=True)
    return probe


def run_probe(opts: argparse.Namespace, ft_args: list[str], say: str) -> int:
    """One first-launch case of ``bench deadlock``, in the fresh process the matrix starts: its result as its
    answer (``child.answer``)."""
    import dataclasses

    from freetoken_graphfix.tools import child

    from .deadlock import probe

    child.answer(dataclasses.asdict(probe(from_options(ProbeSettings, opts))))
    return 0


RIG = Benchmark("rig", add_rig, run_rig, RigRecord, rig_report)
DEADLOCK = Benchmark("deadlock", add_deadlock, run_deadlock, DeadlockRecord, deadlock_report)
PROBE = Benchmark("_probe", add_probe, run_probe, hidden=True)
