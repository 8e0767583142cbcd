"""Unified diffs (``git format-patch``'s), parsed and applied to lines in memory: exact hunks at any
offset, no fuzz, as ``git apply`` does, without needing git. ``series`` applies a whole series with it."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Hunk:
    header: str  # "@@ -222,7 +222,8 @@ ...": how errors name it
    old_start: int
    old: list[str]  # the lines it expects (context and removed), with their line ends
    new_start: int
    new: list[str]  # the lines it leaves (context and added)


@dataclass(frozen=True)
class FileDiff:
    path: str  # as the patch names it (``python/freetoken/...``), or under a target's root once placed
    new: bool  # created by the patch (--- /dev/null)
    hunks: list[Hunk]

    def placed(self, strip: int) -> FileDiff:
        """The same diff with its path stripped of ``strip - 1`` leading folders, as ``patch -p`` does."""
        return replace(self, path="/".join(self.path.split("/")[strip - 1:]))


class Misfit(Exception):
    """A hunk whose lines are not in the file (in the direction tried)."""


def parse(text: str) -> list[FileDiff]:
    """The per-file diffs of one patch, in order."""
    out: list[FileDiff] = []
    lines = text.splitlines(keepends=True)
    old_path = path = None
    hunks: list[Hunk] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            if path is not None:
                out.append(FileDiff(path, old_path == "/dev/null", hunks))
            old_path, path, hunks = None, None, []
        elif line.startswith("--- ") and path is None:
            old_path = line[4:].strip()
        elif line.startswith("+++ ") and path is None:
            path = line[4:].strip().removeprefix("b/")
        elif line.startswith("@@ ") and path is not None:
            hunk, i = _hunk(lines, i)
            hunks.append(hunk)
            continue
        i += 1
    if path is not None:
        out.append(FileDiff(path, old_path == "/dev/null", hunks))
    return out


def _hunk(lines: list[str], at: int) -> tuple[Hunk, int]:
    """The hunk whose header is ``lines[at]``, and the index of the line after it."""
    m = HUNK.match(lines[at])
    if m is None:
        raise ValueError(f"not a hunk header: {lines[at].rstrip()!r}")
    old_n, new_n = int(m.group(2) or 1), int(m.group(4) or 1)
    old: list[str] = []
    new: list[str] = []
    sign = " "
    i = at + 1
    while i < len(lines) and (len(old) < old_n or len(new) < new_n or lines[i].startswith("\\")):
        body = lines[i]
        if body.startswith("\\"):  # "\ No newline at end of file": the line before has none
            for side, signs in ((old, " -"), (new, " +")):
                if sign in signs:
                    side[-1] = side[-1].rstrip("\n")
        else:
            sign, text = body[0], body[1:]
            if sign in " -":
                old.append(text)
            if sign in " +":
                new.append(text)
        i += 1
    return Hunk(lines[at].rstrip("\n"), int(m.group(1)), old, int(m.group(3)), new), i


def apply(text: list[str] | None, diff: FileDiff, reverse: bool) -> list[str] | None:
    """``text`` (lines; ``None``: no such file) with ``diff`` applied, or reverted; exact lines, any
    offset. ``None`` when reverting removes a file the patch created, which must hold exactly what it
    created. :class:`Misfit` when a hunk does not fit."""
    if diff.new and (text is not None) != reverse:
        raise Misfit(f"{diff.path} {'already exists' if not reverse else 'is missing'}")
    if text is None and not diff.new:  # an add-only hunk fits an empty file: never create one it edits
        raise Misfit(f"{diff.path} is missing")
    out, drift = list(text or []), 0
    for h in diff.hunks:
        want, put, start = (h.new, h.old, h.new_start) if reverse else (h.old, h.new, h.old_start)
        guess = max(0, start - 1 + drift) if want else max(0, start + drift)
        spots = [k for k in range(len(out) - len(want) + 1) if out[k:k + len(want)] == want]
        if not spots:
            raise Misfit(f"hunk {h.header} does not fit {diff.path}")
        at = min(spots, key=lambda k: abs(k - guess))
        out[at:at + len(want)] = put
        drift += at - guess + len(put) - len(want)
    if diff.new and reverse:
        if out:  # a file the patch created holds more than it created: a local change, not the series'
            raise Misfit(f"{diff.path} holds {len(out)} line(s) the patch did not create")
        return None
    return out
