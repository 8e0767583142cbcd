"""What a record says, by the current rules, whichever way it came: from a run that just ended or read
back by ``bench report``. Each benchmark's entry makes its record's ``Report`` (``registry.report_of``
finds it), one path for both, so a saved record is judged exactly as its run was."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


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
