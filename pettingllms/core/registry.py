"""Registries of environments and agents, by name or lazily by ``"module:Class"``.

- An unknown name raises ``RegistryError`` listing close matches and every valid name.
- Registering a different object under a taken name raises; registering the same one again is a no-op.
- Import errors of lazy entries surface with the entry named; they are never swallowed.
- A ``"module:Class"`` string works anywhere a name does, so a user's env in their own module needs no
  platform edit. Packages can also register on import through the ``pettingllms.plugins`` entry-point group
  (the built-in ``envs`` package does).
"""

from __future__ import annotations

import difflib
import importlib
from importlib.metadata import entry_points
from typing import Any, Callable

from pettingllms.core.errors import RegistryError

PLUGIN_GROUP = "pettingllms.plugins"
_plugins_loaded = False


def import_object(path: str) -> Any:
    """Import ``"package.module:Attr"``. Errors name the path."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise RegistryError(f"{path!r} is not of the form 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot import module {module_name!r} for {path!r}: {exc}") from exc
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise RegistryError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from exc
    return obj


def load_plugins() -> None:
    """Import every package that registered itself under the ``pettingllms.plugins`` entry-point group."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=PLUGIN_GROUP):
        ep.load()


class Registry:
    """Name -> class (or lazy ``"module:Class"`` string)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str, target: Any = None) -> Any:
        """``register("x", Cls)``, ``register("x", "pkg.mod:Cls")`` or ``@register("x")``."""
        if target is None:

            def decorator(obj: Any) -> Any:
                self.register(name, obj)
                return obj

            return decorator
        if not isinstance(name, str) or not name or ":" in name:
            raise RegistryError(f"{self.kind} name must be a non-empty string without ':', got {name!r}")
        existing = self._entries.get(name)
        if existing is not None and not _same_target(existing, target):
            raise RegistryError(
                f"{self.kind} {name!r} is already registered as {_describe(existing)}; "
                f"refusing to replace it with {_describe(target)}. Pick another name."
            )
        if existing is None or isinstance(existing, str):
            self._entries[name] = target
        return target

    def get(self, name: str) -> Any:
        if ":" in name:
            return import_object(name)
        load_plugins()
        if name not in self._entries:
            close = difflib.get_close_matches(name, self._entries, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}.{hint} Registered: {sorted(self._entries)}. "
                f"A class in your own module can be named as 'package.module:ClassName'."
            )
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = import_object(entry)
            self._entries[name] = entry
        return entry

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        load_plugins()
        return name in self._entries


def _same_target(a: Any, b: Any) -> bool:
    if a is b:
        return True
    return _describe(a) == _describe(b)


def _describe(target: Any) -> str:
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", "?")
    qualname = getattr(target, "__qualname__", repr(target))
    return f"{module}:{qualname}"


ENVS = Registry("env")
AGENTS = Registry("agent")

register_env: Callable[..., Any] = ENVS.register
register_agent: Callable[..., Any] = AGENTS.register
get_env_class = ENVS.get
get_agent_class = AGENTS.get
