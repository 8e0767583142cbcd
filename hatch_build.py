"""Hatch build hook: ship the bootstrap .pth at the root of site-packages.

A .pth runs only from a site directory, so it must sit at the wheel root (purelib), not under
``*.data/`` (coverage 7.12.1b1's mistake). Editable wheels need it too: hatchling's editable mode
only adds the project to ``sys.path`` and would otherwise drop it.
"""

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PTH = "freetoken_graphfix/_bootstrap.pth"
TARGET = "freetoken_graphfix_bootstrap.pth"


class BootstrapPthHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        key = "force_include_editable" if version == "editable" else "force_include"
        build_data.setdefault(key, {})[PTH] = TARGET
