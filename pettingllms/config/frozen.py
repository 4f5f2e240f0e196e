"""Configs are frozen once loaded: a run reads the config it was started with, and nothing rewrites it on the way.

``load.to_schema`` returns ``freeze(config)``: every schema dataclass refuses attribute assignment, and every dict and
list inside it refuses item assignment. A changed config is a new object, made with ``evolve`` (dotted keys, as in
an override) and frozen again; ``thaw`` hands plain, mutable copies to code outside the config (env classes,
engines, OmegaConf), so their own bookkeeping cannot write back into the run's config.

Why not ``@dataclass(frozen=True)``: OmegaConf marks a frozen structured config read-only, and Hydra then refuses
the command-line overrides; the schema classes must stay writable while Hydra composes them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NoReturn

from pettingllms.core.errors import ConfigError


class FrozenConfigError(ConfigError, AttributeError):
    """A loaded config was written to. Make a changed copy with ``pettingllms.config.frozen.evolve``."""


def _refuse(what: str) -> NoReturn:
    raise FrozenConfigError(f"{what}: configs are frozen after loading; make a changed copy with "
                            f"pettingllms.config.frozen.evolve(cfg, {{'section.key': value}}) or pass an override")


class Freezable:
    """Base of the schema dataclasses: writable while OmegaConf builds them, read-only after ``freeze``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            _refuse(f"cannot set {type(self).__name__}.{name}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if self.__dict__.get("_frozen"):
            _refuse(f"cannot delete {type(self).__name__}.{name}")
        object.__delattr__(self, name)


class FrozenDict(dict):
    """A dict that refuses writes; equal to, and serialised like, a plain dict."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("cannot change a config dict")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):  # pickle and deepcopy rebuild it whole instead of item by item
        return FrozenDict, (dict(self),)


class FrozenList(list):
    """A list that refuses writes; equal to, and serialised like, a plain list."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("cannot change a config list")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = pop = remove = clear = _refuse
    sort = reverse = _refuse

    def __reduce__(self):
        return FrozenList, (list(self),)


def freeze(value: Any) -> Any:
    """``value`` with every schema dataclass, dict and list in it read-only (dataclasses in place).

    A frozen part is returned as it is: only ``freeze`` makes one, after freezing everything inside it."""
    if is_frozen(value):
        return value
    if isinstance(value, Freezable):
        for f in dataclasses.fields(value):  # type: ignore[arg-type]
            object.__setattr__(value, f.name, freeze(getattr(value, f.name)))
        object.__setattr__(value, "_frozen", True)
        return value
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    return value


def is_frozen(value: Any) -> bool:
    if isinstance(value, Freezable):
        return bool(value.__dict__.get("_frozen"))
    return type(value) in (FrozenDict, FrozenList)


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy of a config or of a dict or list in it (OmegaConf, for one, takes only plain
    dicts where the schema says ``Any``: ``OmegaConf.structured(thaw(cfg))``)."""
    if isinstance(value, Freezable):
        return type(value)(**{f.name: thaw(getattr(value, f.name))
                              for f in dataclasses.fields(value) if f.init})  # type: ignore[arg-type]
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    return value


def evolve(config: Any, changes: Mapping[str, Any]) -> Any:
    """A frozen copy of ``config`` with ``changes`` applied, keys dotted as in an override::

        evolve(cfg, {"training.log_dir": "runs/0", "agents": {}, "base_models.policy_0.engine": "hf"})

    The original is unchanged; parts not on a changed key's path are shared with it (they are read-only)."""
    for key, value in changes.items():
        config = _replace(config, key.split("."), value, key)
    return freeze(config)


def _replace(node: Any, path: list[str], value: Any, key: str) -> Any:
    head, rest = path[0], path[1:]
    if isinstance(node, Mapping):
        if rest and head not in node:
            raise ConfigError(f"evolve: {key!r}: no entry {head!r} (entries: {sorted(node)})")
        return {**node, head: _replace(node[head], rest, value, key) if rest else value}
    if not dataclasses.is_dataclass(node) or head not in {f.name for f in dataclasses.fields(node)}:
        raise ConfigError(f"evolve: {key!r}: {type(node).__name__} has no field {head!r}")
    new = _replace(getattr(node, head), rest, value, key) if rest else value
    return dataclasses.replace(node, **{head: new})
