"""What the benchmarks' running loops share: the arm order of each pass and the progress bar (a child
process is run by ``freetoken_graphfix.tools.child``)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def rotated(names: Sequence[T], rep: int) -> list[T]:
    """Arm order for pass ``rep``: each arm takes every position in turn, so none is always first."""
    k = rep % len(names)
    return [*names[k:], *names[:k]]


def progress(iterable: Iterable[T], total: int, desc: str) -> Iterable[T]:
    """A progress bar on a terminal; nothing where stderr is a file or a pipe (a log, CI), which a
    bar would fill with carriage-return updates (tqdm's own convention)."""
    if not sys.stderr.isatty():
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False)

