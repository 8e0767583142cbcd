"""What each benchmark reads: one small typed settings object per subcommand, built once from its parsed
options at the CLI boundary (``cli``, whose parsers hold every default). Nothing below the CLI reads
argparse's namespace, so each benchmark's signature says which options it takes.

A field's name is the option's ``dest`` (``--decode-steps``: ``decode_steps``); ``from_options``
copies exactly the fields the settings declare, and a namespace missing one fails at the boundary.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any, TypeVar

S = TypeVar("S")


def from_options(cls: type[S], opts: argparse.Namespace, **given: Any) -> S:
    """``cls`` from the options of the same names; ``given`` sets the fields the CLI resolved itself
    (the arms a model's case needs)."""
    values = {f.name: getattr(opts, f.name) for f in fields(cls) if f.name not in given}  # type: ignore[arg-type]
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**values, **given)


@dataclass(frozen=True)
class Outputs:
    """``--json``, ``--markdown``, ``--plot``: the files a finished run writes (``None``: not asked)."""

    json: str | None = None
    markdown: str | None = None
    plot: str | None = None
    verbose: bool = False  # --markdown: the detail too (engine records)


@dataclass(frozen=True)
class RigSettings:
    """``bench rig``: the decode-like graph, its instances and replays; saved as the record's ``config``."""

    kernels: int
    streams: int
    batch_sizes: tuple[int, ...]
    instances: int
    reps: int
    profile_reps: int
    no_wait: bool
    h2d: bool
    modes: tuple[str, ...]
    watchdog: float


@dataclass(frozen=True)
class DeadlockSettings:
    """``bench deadlock``: the first-launch matrix, a process per case."""

    sizes: tuple[int, ...]
    modes: tuple[str, ...]
    jobs: int
    watchdog: float


@dataclass(frozen=True)
class ProbeSettings:
    """One case of the matrix, in its own process (the hidden ``_probe``)."""

    kernels: int
    streams: int
    mode: str
    watchdog: float


@dataclass(frozen=True)
class Workload:
    """#775's workload, which ``bench engine`` and ``bench serve`` share: the prompt's tokens, the greedy
    decode steps per request, the text to copy (``None``: the licence shipped with the package)."""

    context: int
    decode_steps: int
    prompt_file: str | None


@dataclass(frozen=True)
class EngineSettings(Workload):
    """``bench engine``: the arms, rounds and copies, the engine process's limits, and the workload."""

    arms: tuple[str, ...]
    rounds: int
    copies: int
    replays: int
    trace_steps: int
    trace_runs: int
    warmup: bool
    watchdog: float
    hang_timeout: float
    command: str = ""


@dataclass(frozen=True)
class ServeSettings(Workload):
    """``bench serve``: the arms, how many at once, the server's and the requests' limits, and the workload."""

    arms: tuple[str, ...]
    jobs: int
    ready_timeout: float
    request_timeout: float
