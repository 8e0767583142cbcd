"""``bench --from-json``: a record a ``bench --json`` wrote, judged again by this version's rules.

Only the raw figures are read back (each process's results, the rig's replays); every verdict,
ratio and band is computed anew, so a record shared from an earlier run says what the current
rules make of it. What an older record lacks (copies in the decode loop, gap percentiles) is shown
as not measured, never filled in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ACCEPTED = "accepted values are a record written by bench --json (the rig, --engine, --serve or --startup)"


@dataclass
class Saved:
    """A saved record, judged again: ``record`` as ``--json`` writes it, and how it is shown."""

    kind: str
    record: Any
    render: Callable[[], str]
    failed: Callable[[], bool]
    markdown: Callable[[Any], str] | None = None
    plot: Callable[[Any, str], str] | None = None


def load(path: str) -> Saved:
    """Read and judge ``path``; ``ValueError`` in one line naming it when it is no such record."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ValueError(f"--from-json {path!r} does not exist; {ACCEPTED}") from None
    except (OSError, UnicodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"--from-json {path!r} cannot be read as JSON ({exc}); {ACCEPTED}") from None
    try:
        return judged(data)
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ValueError(f"--from-json {path!r}: not a whole bench record (missing or odd {exc}); {ACCEPTED}") from None


def judged(data: Any) -> Saved:
    if isinstance(data, dict) and "arms" in data and "config" in data:
        from .report import markdown, plot, render

        return Saved("rig", data, lambda: render(data), lambda: False, markdown, plot)
    if isinstance(data, dict) and "delta_band_ms" in data:
        from .startup import render as startup_render

        return Saved("startup", data, lambda: startup_render(data), lambda: False)
    if isinstance(data, list) and data and all(isinstance(r, dict) and "runs" in r for r in data):
        if all("traced" in r for r in data):
            from . import engine
            from .engine_plot import plot
            from .engine_report import markdown, render

            for rec in data:
                rec.update(engine.judge(rec["runs"], rec["traced"], rec["expects_wait"]))
            return Saved("engine", data, lambda: "\n\n".join(render(r) for r in data),
                         lambda: any(engine.failures(r) for r in data), markdown, plot)
        if all("problems" in r for r in data):
            from . import serve

            for rec in data:  # a record of an earlier release has no expects_wait: what it found stands
                rec.update(serve.judge(rec["runs"], rec.get("expects_wait", rec["wait_case"])))
            return Saved("serve", data, lambda: "\n\n".join(serve.render(r) for r in data),
                         lambda: any(any(r["problems"].values()) for r in data))
    raise TypeError("its shape")
