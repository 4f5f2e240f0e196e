"""Registries of environments and agents, by name or lazily by ``"module:Class"``.

- An unknown name raises ``RegistryError`` listing close matches and every valid name.
- Registering a different object under a taken name raises; registering the same one again is a no-op.
- Import errors of lazy entries surface with the entry named (``ModuleImportError``, an ``ImportError`` that is
  also a ``PettingLLMsError``, so commands print it as a clean error); they are never swallowed.
- A ``"module:Class"`` string works anywhere a name does, so a user's env in their own module needs no
  platform edit. Packages can also register on import through the ``pettingllms.plugins`` entry-point group
  (the built-in ``envs`` package does).
- The current directory is searched for a module only when the user names one (``env.imports``, a
  ``"module:Class"`` name, ``check-env --imports``), as ``python -m`` would: never before, so a file that merely
  lies there (in a shared run directory, say) cannot stand in for an optional package the platform tries to import.
- ``get_env_class`` and ``get_agent_class`` return only subclasses of ``Env`` and ``Agent``: a name that reaches any
  other object (``subprocess:Popen``) is refused before anything is built from it.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from importlib.metadata import entry_points
from typing import Any, Callable, Mapping, Sequence

from pettingllms.core.env import Agent, Env
from pettingllms.core.errors import ConfigError, PettingLLMsError, RegistryError

PLUGIN_GROUP = "pettingllms.plugins"
_plugins_loaded = False


class ModuleImportError(PettingLLMsError, ImportError):
    """A user's module (``env.imports``, ``module:Class``) could not be imported; the message says why and what
    to do."""


def search_current_directory() -> None:
    """Put the current directory on ``sys.path`` (last, so it never shadows an installed package), as ``python -m``
    does: a console script's ``sys.path[0]`` is its own bin directory instead. Called when the user names a module
    of their own, not before."""
    cwd = os.getcwd()
    if not any(os.path.abspath(p or ".") == cwd for p in sys.path):
        sys.path.append(cwd)


def import_module(name: str, what: str, *, users: bool = True) -> Any:
    """``importlib.import_module(name)``; any failure becomes a ModuleImportError naming ``what`` asked for it.
    ``users``: a module the user named, which may lie in the current directory (``search_current_directory``);
    False for an installed package's own lazy entries."""
    if users:
        search_current_directory()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if name.endswith(".py"):  # a file name where a module name goes (env.options.program=my_program.py)
            module = name[:-3].replace("/", ".").lstrip(".")
            raise ModuleImportError(f"{what}: {name!r} is a file name; name its module instead: {module!r} (run "
                                    f"from the folder that holds the file, or put that folder on PYTHONPATH)") from exc
        missing = exc.name or ""
        if missing and "." in missing and (name == missing or name.startswith(missing + ".")):
            parent, _, leaf = missing.rpartition(".")
            raise ModuleImportError(f"{what}: package {parent!r} has no module {leaf!r} (is the file "
                                    f"{missing.replace('.', '/')}.py there?)") from exc
        if missing and (name == missing or name.startswith(missing + ".")):
            raise ModuleImportError(
                f"{what}: no module named {missing!r} on the Python path (searched after the installed packages: "
                f"the current directory, {os.getcwd()}). Install the package that holds it (pip install -e <its "
                f"folder>) or add its folder to PYTHONPATH") from exc
        raise ModuleImportError(f"{what}: importing {name!r} failed: {exc} (a module it imports is missing: "
                                f"install it, or fix the import)") from exc
    except ImportError as exc:
        raise ModuleImportError(f"{what}: importing {name!r} failed: {exc}") from exc
    except Exception as exc:  # the user's module raised while it ran (SyntaxError, NameError, ...)
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" at {where.filename}:{where.lineno}" if where else ""
        raise ModuleImportError(f"{what}: importing {name!r} raised {type(exc).__name__}{at}: {exc}") from exc


def import_modules(names: Sequence[str], what: str = "env.imports") -> None:
    """Import each module (they may register envs and agents); errors are ModuleImportError naming the module."""
    if isinstance(names, str):
        names = [names]
    for name in names:
        if not isinstance(name, str) or not name.strip() or ":" in name or "/" in name:
            raise RegistryError(f"{what}: {name!r} is not a module name; give dotted module names such as "
                                f"[my_envs.guess] (a class is named 'module:Class' in env.name instead)")
        import_module(name.strip(), f"{what} entry {name!r}")


def import_object(path: str, *, users: bool = True) -> Any:
    """Import ``"package.module:Attr"``. Errors name the path. ``users`` as for ``import_module``."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise RegistryError(f"{path!r} is not of the form 'package.module:Name'")
    module = import_module(module_name, f"cannot import module {module_name!r} for {path!r}", users=users)
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
            entry = import_object(entry, users=False)  # a package registered it: installed code
            self._entries[name] = entry
        return entry

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._entries)

    def name_of(self, target: Any) -> str | None:
        """The name ``target`` is registered under (the first in sorted order if several), or None."""
        load_plugins()
        return next((name for name in sorted(self._entries) if _same_target(self._entries[name], target)), None)

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


def get_env_class(name: str) -> type:
    """The ``Env`` subclass registered as ``name`` (or named ``"module:Class"``); anything else is refused."""
    return _subclass_of(Env, ENVS.get(name), name)


def get_agent_class(name: str) -> type:
    """The ``Agent`` subclass registered as ``name`` (or named ``"module:Class"``); anything else is refused."""
    return _subclass_of(Agent, AGENTS.get(name), name)


def _subclass_of(base: type, obj: Any, name: str) -> type:
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise RegistryError(f"{name!r} is {_describe(obj)}, not a subclass of pettingllms.{base.__name__}: only "
                            f"{base.__name__} classes are built from a name")
    return obj


def find_env_class(name: str, imports: Sequence[str] = (), *, named: str = "env.name={!r}",
                   import_with: str = "env.imports=[{}]") -> Any:
    """``get_env_class(name)``; a short name that is not registered also says how to import the module that
    registers it. ``named`` words the name (``env.name='guess'``), ``import_with`` the way this command imports
    modules (``env.imports=[{}]`` for a run, ``--imports {}`` for check-env); ``imports`` are those it imported."""
    try:
        return get_env_class(name)
    except RegistryError as exc:
        if ":" in name:
            raise
        hint = (f"if it is defined in your package, add {import_with.format('your.module')} (the module that calls "
                f"register_env({name!r}, ...))" if not imports else
                f"none of {import_with.format(','.join(imports))} registered it: check the name given to register_env")
        raise RegistryError(f"{named.format(name)} is not registered; {hint}. {exc}") from exc


def make_agents(
    env: Env,
    classes: Mapping[str, str] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    build: Callable[[str, type, dict[str, Any]], Agent] | None = None,
) -> dict[str, Agent]:
    """Build one agent per role of ``env.graph``.

    ``classes`` overrides a role's agent class (a registry name or ``"module:Class"``); ``options`` passes
    keyword options per role; ``build(role, cls, options)`` constructs one agent (default ``cls(role, **options)``;
    a run's plan checks the options and words the errors).
    """
    classes = {**env.agent_classes, **(classes or {})}
    agents = {}
    for role in env.graph.agents:
        if role not in classes:
            env_name = type(env).__name__
            raise ConfigError(f"{env_name} has no agent class for role {role!r} (classes are set for "
                              f"{sorted(classes)}): add {role!r} to {env_name}.agent_classes, or set "
                              f"agents.{role}.cls=<module:Class>")
        cls, role_options = get_agent_class(classes[role]), dict((options or {}).get(role, {}))
        agents[role] = build(role, cls, role_options) if build else cls(role, **role_options)
    return agents
