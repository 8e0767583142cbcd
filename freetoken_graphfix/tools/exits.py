"""The command line's one convention: its exit codes, and one line for every error, said in one place.

Every error is a :class:`~freetoken_graphfix.errors.GraphfixError` (a refused argument included: argparse's own
two-line refusal becomes one), caught once by :func:`run`, printed as ``freetoken-graphfix: error: <why>`` and
exited with its ``code``. ``bench`` raises the same errors and is run the same way, alone or under the tool.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from ..errors import GraphfixError

OK, USAGE = 0, 2
ERROR = GraphfixError.code  # what every error exits with unless its class says otherwise
PATCH_NOT_APPLIED, PATCH_PARTLY = 3, 4  # 'patch check': 0 applied
NOT_FOUND, NOT_EXECUTABLE = 127, 126  # 'run': a command a shell could not start
INTERRUPTED, BROKEN_PIPE = 128 + 2, 128 + 13  # what a shell exits with for SIGINT and SIGPIPE
PREFIX = "freetoken-graphfix: error: "
WARNING = "freetoken-graphfix: warning: "


class UsageError(GraphfixError):
    """An argument the command refuses before it runs anything."""

    code = USAGE


class Parser(argparse.ArgumentParser):
    """argparse, its refusals raised as :class:`UsageError` naming the command they belong to: one line, the command's
    own ``-h`` one step away, instead of a usage block above the error."""

    def __init__(self, *args: object, command: str = "", **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.command = command  # 'bench engine': where the refused argument was given

    def error(self, message: str) -> NoReturn:
        """Refuse ``message`` in one line (exit 2); the command's ``-h`` says its usage."""
        raise UsageError(f"{self.command}: {message}" if self.command else message)


def run(main: Callable[[], int]) -> int:
    """``main``'s exit code, every error it raises said in one line: a ``GraphfixError`` with its code, Ctrl-C and a
    closed pipe as a shell would (130, 141), no traceback."""
    try:
        return main()
    except GraphfixError as exc:
        print(f"{PREFIX}{exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:  # `doctor | head`: the reader left; say nothing more, as a shell tool would
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE
