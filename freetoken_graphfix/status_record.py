"""What ``status()`` reports: typed records of what the shim found, did and decided, per capture pass.

Kept apart from the shim (``shim``) so that the answer for a shim that cannot load (a dependency an
offline ``--no-deps`` install left out) is built from the very same records, and so that a tool can
read a status written by another process (``FT_GRAPHFIX_STATUS_DIR``) without importing the shim.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GraphRecord:
    """One captured graph as the shim saw it."""

    index: int  # capture order within the pass
    name: str  # "bs=8" when the capture loop's batch size is visible, else "graph #i"
    waits: list[dict[str, str]]  # each WAIT: its owner, when it is released, its flag's address
    action: str
    reason: str
    hook_ms: float  # time spent in the _upload_graph hook (a warm replay included)
    first_launch: str = ""  # deferred graphs: "pending", then how the first launch went


@dataclass
class CapturePass:
    """One ``GraphRunner._capture_graphs`` call (startup, a cache rebuild, its rollback)."""

    index: int
    source: str  # "GraphRunner._capture_graphs" or "direct _upload_graph call"
    graphs: list[GraphRecord] = field(default_factory=list)
    done: bool = False

    def summary(self) -> str:
        """The pass's one INFO line: ``capture pass 0: 2 graphs: 2 deferred (PLE wait-sync)``."""
        counts = Counter((g.action, g.reason) for g in self.graphs)
        parts = ", ".join(f"{n} {action} ({reason})" for (action, reason), n in counts.items())
        return f"capture pass {self.index}: {len(self.graphs)} graphs: {parts or 'none captured'}"


@dataclass(frozen=True)
class FreeTokenFound:
    """The FreeToken the shim inspected (``None`` everywhere until it was, or where none is installed)."""

    version: str | None = None
    path: str | None = None
    tested: bool | None = None


@dataclass(frozen=True)
class DeferredGuard:
    """Whether the deferred first-launch guard can work here, and what it still holds."""

    available: bool = False
    reason: str | None = None
    pending_first_launches: int = 0
    at_uninstall: str = ""  # what uninstall() did with graphs still awaiting a first launch


@dataclass(frozen=True)
class Status:
    """The shim's state in one process."""

    installed: bool
    mode: str | None
    patched: bool
    reason: str
    freetoken: FreeTokenFound = FreeTokenFound()
    deferred: DeferredGuard = DeferredGuard()
    mode_changes: list[str] = field(default_factory=list)
    passes: list[CapturePass] = field(default_factory=list)
    pid: int = field(default_factory=os.getpid)

    def as_dict(self) -> dict[str, Any]:
        """What ``freetoken_graphfix.status()`` returns: plain data, JSON as it is."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Status:
        """A status another process wrote (``write``), read back."""
        passes = [CapturePass(p["index"], p["source"], [GraphRecord(**g) for g in p["graphs"]], p["done"])
                  for p in data["passes"]]
        return cls(data["installed"], data["mode"], data["patched"], data["reason"],
                   FreeTokenFound(**data["freetoken"]), DeferredGuard(**data["deferred"]), list(data["mode_changes"]),
                   passes, data["pid"])

    def actions(self) -> list[str]:
        """Every graph's action, over every capture pass, in capture order."""
        return [g.action for p in self.passes for g in p.graphs]


def unavailable(why: str) -> Status:
    """The status of a shim that cannot be loaded: nothing patched, and why."""
    return Status(installed=False, mode=None, patched=False, reason=why, deferred=DeferredGuard(reason=why))


def write(status: Status, directory: str) -> str:
    """``status`` as JSON in ``directory`` (this user's alone: ``safe_files.private_dir``), replacing this
    process's previous one atomically, through a file no other user could have planted."""
    from . import safe_files

    safe_files.private_dir(directory, "FT_GRAPHFIX_STATUS_DIR")
    path = os.path.join(directory, f"freetoken_graphfix-{status.pid}.json")
    safe_files.write_text(path, json.dumps(status.as_dict()), mode=0o600)
    return path


def read_all(directory: str) -> list[Status]:
    """Every status written to ``directory``, by pid."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("freetoken_graphfix-") and name.endswith(".json"):
            path = os.path.join(directory, name)
            try:
                with open(path, encoding="utf-8") as fh:
                    found.append(Status.from_dict(json.load(fh)))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise StatusFileError(f"{path}: not a status this package wrote ({type(exc).__name__}: {exc})") \
                    from None
    return sorted(found, key=lambda s: s.pid)


class StatusFileError(ValueError):
    """A file in the status folder that is not a whole status: one line naming it, never a traceback."""
