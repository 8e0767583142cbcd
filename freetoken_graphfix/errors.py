"""Exceptions raised by freetoken_graphfix: one base, one small subclass per kind."""


class GraphfixError(Exception):
    """The base class of every error freetoken_graphfix raises on purpose; ``code`` is the command line's exit code for
    it (``exits``)."""

    code = 1


class ConfigError(GraphfixError):
    """A setting (environment variable or argument) holds a value the shim does not accept."""


class WarmReplayError(GraphfixError):
    """A capture-time warm replay failed where falling back would split tensor-parallel ranks."""


class PatchError(GraphfixError):
    """The patch series does not fit the target tree."""


def shown(value: object, limit: int = 60) -> str:
    """``value`` as an error message quotes it (``repr``), cut to ``limit`` characters with its length
    said: a 5,000-character value must not flood the one line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(value))} characters)"


class UnsafePathError(GraphfixError):
    """A path the package would write through is not safe to write: a link, another user's folder."""
