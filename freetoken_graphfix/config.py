"""The ``FT_GRAPH_UPLOAD`` setting: which protection replaces FreeToken's capture-time upload."""

from __future__ import annotations

import enum
import os

from .errors import ConfigError, shown

ENV_MODE = "FT_GRAPH_UPLOAD"
"""Mode of the shim: ``auto`` (default), ``upload``, ``skip``, ``warm``, ``deferred``, or ``off``
(also ``0``, ``false``) to leave FreeToken untouched. Case and surrounding whitespace are ignored.
Setting it also arms the ``.pth`` bootstrap in every Python process of the environment."""

OFF_VALUES = ("off", "0", "false")

ENV_STATUS_DIR = "FT_GRAPHFIX_STATUS_DIR"
"""A directory: when set, each process whose shim completes a capture pass writes its ``status()`` there
as ``freetoken_graphfix-<pid>.json`` (replaced after every pass), so a tool reads the decisions taken
in a server's scheduler process as data, not from its log."""

WARM_TIMEOUT_S = 10.0
"""How long a warm replay waits for its graph to finish before it reports the graph still running
(``WarmReplayError``). A slow GPU consuming a WAIT late is a success, not a timeout."""


class Mode(str, enum.Enum):
    """What the shim does with each captured graph (docs/modes.md)."""

    AUTO = "auto"  # no-op where no WAIT is released after the launch, else the fastest protection
    UPLOAD = "upload"  # FreeToken's own behaviour: cuGraphUpload + synchronize on every graph
    SKIP = "skip"  # never upload; warn for graphs whose first launch can deadlock
    WARM = "warm"  # one threaded warm replay at capture time for graphs that need protection
    DEFERRED = "deferred"  # no upload; the first launch's fill runs on a thread started before it
    OFF = "off"  # the shim patches nothing


ACCEPTED = tuple(m.value for m in Mode if m is not Mode.OFF) + OFF_VALUES
SKIP_RISK = "protects nothing: a graph whose first launch waits on a PLE wait-sync flag can deadlock there"


def parse_mode(value: str | None, *, source: str = ENV_MODE) -> Mode:
    """Return the :class:`Mode` named by ``value`` (``None`` or empty means ``auto``).

    Raises :class:`ConfigError` naming ``source``, the value and the accepted values otherwise, and
    for an empty value given as an option (``source`` other than the variable): there, empty is a
    mistake, not "unset".
    """
    if value is None:
        return Mode.AUTO
    if isinstance(value, Mode):
        return value
    text = str(value).strip().lower()
    if text == "" and source == ENV_MODE:
        return Mode.AUTO
    if text in OFF_VALUES:
        return Mode.OFF
    try:
        return Mode(text)
    except ValueError:
        raise ConfigError(
            f"{source}={shown(value)} is not a valid mode; accepted values: {', '.join(ACCEPTED)}"
        ) from None


def env_value() -> str | None:
    """``FT_GRAPH_UPLOAD`` as set, ``None`` when unset or empty (both mean ``auto``; the ``.pth``
    arms the shim for an empty one, not for an unset one)."""
    value = os.environ.get(ENV_MODE)
    return value if value and value.strip() else None
