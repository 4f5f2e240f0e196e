"""Building a user's class (an env, an agent) from config options, with errors that name the key and the fix.

- The options are checked against the constructor's signature first: an option it does not take is refused with
  the close matches and every option it has (``env.options.lyout: AuctionEnv has no option 'lyout'. Did you mean
  'layout'?``), and so is a required option left unset.
- A constructor taking ``**options`` passes them on to its base classes' constructors (whose named parameters are
  options too) and from ``Env``'s or ``Agent``'s own into ``self.options``: those must be in the class's
  ``known_options``, the options it reads there. A class that declares none cannot be checked: the options no
  parameter names are passed on, with one warning (once a process) naming them and how to declare them.
- An error the constructor raises itself becomes one ConfigError line naming the class and the option values; the
  traceback goes to the debug log (errors of this library, which already say what to do, pass through).
"""

from __future__ import annotations

import difflib
import inspect
import logging
from typing import Any, Mapping, Sequence

from pettingllms.core import ConfigError, PettingLLMsError

log = logging.getLogger("pettingllms.assembly")
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def check_options(cls: type, options: Mapping[str, Any], where: str, *, reserved: Mapping[str, str] | None = None,
                  positional: int = 0, elsewhere: Mapping[str, Sequence[str]] | None = None) -> None:
    """Raise ConfigError unless ``cls(*first, **fixed, **options)`` can bind ``options`` and the class reads them.

    ``where`` is the config key of the options (``env.options``); ``reserved`` maps the keyword arguments the
    platform passes itself (``max_turns``) to what to write instead; ``positional`` counts the arguments it passes
    by position (an agent's name), whatever the constructor calls them; ``elsewhere`` maps options that belong to
    another class to their keys (``one_shot`` -> ``agents.reasoner.options.one_shot``), offered as close matches."""
    reserved = reserved or {}
    for key in options:
        if key in reserved:
            raise ConfigError(f"{where}.{key}: {reserved[key]}")
    try:
        parameters = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):  # no introspectable signature: the constructor's own error will have to do
        return
    by_position = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    first = [p for p in parameters if p.kind in by_position][:positional]
    for p in first:
        if p.name in options:
            raise ConfigError(f"{where}.{p.name}: {cls.__name__} takes {p.name!r} from the run itself; rename the option")
    parameters = [p for p in parameters if p not in first]
    named = [p.name for p in parameters if p.kind in _NAMED and p.name not in reserved]
    takes_any = _takes_any(parameters)
    if takes_any:  # **options goes up to the base classes' constructors, and from the last one to self.options
        inherited, takes_any = _forwarded(cls, positional)
        named += [name for name in inherited if name not in named and name not in reserved]
    declared = _known_options(cls) if takes_any else ()
    if declared is None:
        _warn_unchecked(cls, [key for key in options if key not in named], where)
    else:
        accepted = [*named, *(name for name in declared if name not in named)]
        for key in options:
            if key not in accepted:
                raise ConfigError(_unknown(cls, str(key), where, accepted, elsewhere or {}, takes_any))
    for p in parameters:
        if p.kind in _NAMED and p.default is inspect.Parameter.empty and p.name not in reserved and p.name not in options:
            raise ConfigError(f"{where}: {cls.__name__} needs the option {p.name!r}: set {where}.{p.name}=<value>")


def accepted_options(cls: type, positional: int = 0) -> list[str]:
    """The options ``check_options`` lets through for ``cls`` (its constructors' named parameters past the first
    ``positional``, and its ``known_options``); empty when they cannot be known."""
    try:
        parameters = _after(list(inspect.signature(cls).parameters.values()), positional)
        named = [p.name for p in parameters if p.kind in _NAMED]
        inherited, takes_any = _forwarded(cls, positional) if _takes_any(parameters) else ([], False)
        declared = (_known_options(cls) or ()) if takes_any else ()
    except (TypeError, ValueError, ConfigError):
        return []
    return list(dict.fromkeys([*named, *inherited, *declared]))


def _forwarded(cls: type, positional: int) -> tuple[list[str], bool]:
    """The named parameters of the base classes' ``__init__`` that the ``**options`` of ``cls``'s own reach
    (``SokobanEnv(**options)`` passes ``no_action_penalty`` to ``GameEnv``), assuming each passes them on to
    ``super().__init__``; and whether the last one takes ``**options`` too (then they end in ``self.options``)."""
    inits = [vars(k)["__init__"] for k in cls.__mro__ if k is not object and "__init__" in vars(k)]
    names: list[str] = []
    for init in inits[1:]:  # the first is the constructor the caller has already read
        try:
            parameters = _after(list(inspect.signature(init).parameters.values())[1:], positional)  # [1:]: self
        except (TypeError, ValueError):  # not introspectable: what it takes cannot be known
            return names, True
        names += [p.name for p in parameters if p.kind in _NAMED]
        if not _takes_any(parameters):
            return names, False
    return names, True


def _after(parameters: list[inspect.Parameter], positional: int) -> list[inspect.Parameter]:
    """``parameters`` without the first ``positional`` ones taken by position (the run passes those itself)."""
    by_position = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    first = [p for p in parameters if p.kind in by_position][:positional]
    return [p for p in parameters if p not in first]


def _takes_any(parameters: Sequence[inspect.Parameter]) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _known_options(cls: type) -> tuple[str, ...] | None:
    declared = getattr(cls, "known_options", None)
    if declared is None:
        return None
    if isinstance(declared, str) or not all(isinstance(name, str) for name in declared):
        raise ConfigError(f"{cls.__name__}.known_options must be a tuple of option names, e.g. ('layout',), "
                          f"got {declared!r}")
    return tuple(declared)


def _unknown(cls: type, key: str, where: str, accepted: Sequence[str], elsewhere: Mapping[str, Sequence[str]],
             takes_any: bool) -> str:
    close = difflib.get_close_matches(key, [*accepted, *(k for k in elsewhere if k not in accepted)], n=3, cutoff=0.6)
    named = [repr(name) if name in accepted else " or ".join(elsewhere[name]) for name in close]
    hint = f" Did you mean {' or '.join(named)}?" if named else ""
    listed = ", ".join(accepted) if accepted else "none"
    declare = f" (those read from self.options are declared in {cls.__name__}.known_options)" if takes_any else ""
    return f"{where}.{key}: {cls.__name__} has no option {key!r}.{hint} Options: {listed}{declare}"


_warned: set[tuple[str, str, tuple[str, ...]]] = set()  # each unchecked set of options is reported once a process


def _warn_unchecked(cls: type, unchecked: Sequence[str], where: str) -> None:
    key = (f"{cls.__module__}.{cls.__qualname__}", where, tuple(map(str, unchecked)))
    if not unchecked or key in _warned:
        return
    _warned.add(key)
    log.warning("%s: %s takes **options and does not declare which it reads, so %s cannot be checked (a misspelt "
                "one would be ignored); declare the options it reads from self.options in the class: "
                "known_options = %r", where, cls.__name__, ", ".join(key[2]), key[2])


def construct(cls: type, what: str, settings: str, *args: Any, **kwargs: Any) -> Any:
    """``cls(*args, **kwargs)``; an exception from the constructor becomes ``<what> could not be built with
    <settings>: <type>: <message>`` (``what``: ``env 'auction' (AuctionEnv)``; ``settings``: the options, as keys)."""
    try:
        return cls(*args, **kwargs)
    except PettingLLMsError:
        raise
    except Exception as exc:
        log.debug("%s could not be built with %s", what, settings, exc_info=True)
        raise ConfigError(f"{what} could not be built with {settings}: {type(exc).__name__}: {exc}") from exc
