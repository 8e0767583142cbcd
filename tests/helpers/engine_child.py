"""The engine child's modules (``bench/engine/child/``) imported on CPU as the child imports them: by
their top-level names, from the child's own directory on ``sys.path``."""

from __future__ import annotations

import sys

from freetoken_graphfix_bench.engine import run as engine_run

if str(engine_run.CHILD_DIR) not in sys.path:
    sys.path.append(str(engine_run.CHILD_DIR))

import child_copies as copies  # noqa: E402
import child_loop as loop  # noqa: E402
import child_seams as seams  # noqa: E402

__all__ = ["copies", "loop", "seams"]
