"""``python -m freetoken_graphfix``."""

import sys

from .cli import main

sys.exit(main())
