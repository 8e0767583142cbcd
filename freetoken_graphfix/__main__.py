"""``python -m freetoken_graphfix``, and the ``freetoken-graphfix`` console script (``console``)."""

from __future__ import annotations

import sys


def console(argv: list[str] | None = None) -> None:
    """The command line, with a Ctrl-C that lands while its modules are still importing ending it as
    a shell would (130, no traceback): the console script's own import of this module is all that
    runs before this function."""
    try:
        from .tools.cli import main

        code = main(argv)
    except KeyboardInterrupt:
        code = 128 + 2  # exits.INTERRUPTED: exits itself may not be imported yet
    sys.exit(code)


if __name__ == "__main__":
    console()
