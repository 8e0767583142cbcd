"""What a record says, by the current rules, whichever way it came: from a run that just ended or read
back by ``bench report``. One path for both, so a saved record is judged exactly as its run was."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from . import records


@dataclass(frozen=True)
class Report:
    """A record's report: the terminal text, what fails it, and the files it can write."""

    kind: str
    text: str
    failures: list[str] = field(default_factory=list)
    markdown: Callable[[bool], str] | None = None  # its argument: --verbose (the engine's detail)
    plot: Callable[[str], str] | None = None
    has_detail: bool = False  # --verbose adds to the markdown

    @property
    def failed(self) -> bool:
        """Whether the record fails its checks: the benchmark's exit code."""
        return bool(self.failures)


def report_of(record: records.Record) -> Report:
    """The report of any kind of record."""
    if isinstance(record, records.EngineRecord):
        return _engine(record)
    if isinstance(record, records.ServeRecord):
        return _serve(record)
    if isinstance(record, records.RigRecord):
        from .rig import report

        drawable = any(arm.gaps_us for arm in record.arms.values())  # --plot draws the CUPTI gaps
        return Report("rig", report.render(record), markdown=lambda verbose: report.markdown(record),
                      plot=(lambda path: report.plot(record, path)) if drawable else None)
    if isinstance(record, records.DeadlockRecord):
        from .rig import deadlock

        return Report("deadlock", deadlock.render(record), deadlock.failures(record))
    from . import startup

    return Report("startup", startup.render(record))


def _engine(record: records.EngineRecord) -> Report:
    """An engine record's report: each case's figures derived and judged; a record with no case fails, since no runs is
    no pass."""
    from .engine.figures import figures_of
    from .engine.headline import failures as engine_failures
    from .engine.plot import plot
    from .engine.report import markdown_case, render

    judged = [(case, figures_of(case)) for case in record.cases]
    failures = [f for _, figures in judged for f in engine_failures(figures)]
    failures += [f"{case.label}: no process ran (no arm has a run)" for case in record.cases
                 if not any(case.runs.values())]
    if not judged:
        failures.append("no case in this record: nothing was measured")
    return Report("engine", "\n\n".join(render(c, f) for c, f in judged), failures,
                  markdown=lambda verbose: "\n".join(line for c, f in judged for line in markdown_case(c, f, verbose)),
                  plot=(lambda path: plot(*judged[0], path)) if judged else None, has_detail=True)


def _serve(record: records.ServeRecord) -> Report:
    """A serve record's report: each case judged; a record with no case fails, since no runs is no pass."""
    from .serve.report import judge, render

    judged = [(case, judge(case)) for case in record.cases]
    failures = [f for _, verdict in judged for f in verdict.failures()]
    if not judged:
        failures.append("no case in this record: nothing was measured")
    return Report("serve", "\n\n".join(render(c, v) for c, v in judged), failures)
