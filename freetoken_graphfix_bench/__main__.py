"""``python -m freetoken_graphfix_bench``: the benchmarks' command line alone (``freetoken-graphfix bench``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m freetoken_graphfix_bench"))
