"""freetoken_graphfix: protect only the FreeToken CUDA graphs that need it, at no replay cost.

``import freetoken_graphfix`` installs the shim (mode from ``FT_GRAPH_UPLOAD``, default ``auto``).
"""

from .config import Mode
from .errors import ConfigError, GraphfixError, PatchError, WarmReplayError
from .hooks import install, status, uninstall

__all__ = ["install", "uninstall", "status", "Mode", "GraphfixError", "ConfigError", "WarmReplayError",
           "PatchError"]
__version__ = "0.1.0"

install()
