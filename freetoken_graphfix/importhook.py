"""Run a function when a module is imported, importing nothing now (wrapt's post-import hook, lite).

The ``.pth`` bootstrap arms the shim in every Python process of the environment (pip, tokenizer
workers, scripts), most of which never import FreeToken: there the shim must cost nothing. wrapt's
own ``register_post_import_hook`` imports wrapt, which imports ``asyncio`` and
``importlib.metadata`` (about 30 ms), so this module does the same job with ``sys`` alone: a
``sys.meta_path`` finder that, for the watched names only, wraps the real loader's
``exec_module`` and calls the hooks once the module has run.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: importing typing at start-up costs what this module saves
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}


def when_imported(name: str, hook: Callable[[ModuleType], None]) -> None:
    """Call ``hook(module)`` once ``name`` is imported: now if it already is, else right after its
    import runs. Each hook runs once."""
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
        return
    _hooks.setdefault(name, []).append(hook)
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def discard(name: str, hook: Callable[[ModuleType], None]) -> None:
    """Forget ``hook`` if it has not run yet."""
    hooks = _hooks.get(name, [])
    if hook in hooks:
        hooks.remove(hook)
    if not hooks:
        _hooks.pop(name, None)


def _fire(module: ModuleType) -> None:
    for hook in _hooks.pop(module.__name__, []):
        hook(module)


class _Finder:
    """Finds nothing itself: for a watched name it asks the other finders and wraps their loader."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader:
    """The real loader, plus the hooks after ``exec_module``; everything else is the real one's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader  # inspect, linecache and pickle see the real loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _fire(module)
