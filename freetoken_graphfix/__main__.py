"""``python -m freetoken_graphfix``."""

import sys

try:
    from .cli import main

    sys.exit(main())
except KeyboardInterrupt:  # Ctrl-C before a command handles it (while importing): no traceback
    sys.exit(130)
