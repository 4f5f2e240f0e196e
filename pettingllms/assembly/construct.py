"""Building a user's class (an env, an agent) from config options, with errors that name the key and the fix.

- The options are checked against the constructor's signature first: an option it does not take is refused with
  the close matches and every option it has (``env.options.lyout: AuctionEnv has no option 'lyout'. Did you mean
  'layout'?``), and so is a required option left unset. A constructor taking ``**kwargs`` accepts any option.
- An error the constructor raises itself becomes one ConfigError line naming the class and the option values; the
  traceback goes to the debug log (errors of this library, which already say what to do, pass through).
"""

from __future__ import annotations

import difflib
import inspect
import logging
from typing import Any, Mapping

from pettingllms.core import ConfigError, PettingLLMsError

log = logging.getLogger("pettingllms.assembly")
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def check_options(cls: type, options: Mapping[str, Any], where: str, *, reserved: Mapping[str, str] | None = None,
                  positional: int = 0) -> None:
    """Raise ConfigError unless ``cls(*first, **fixed, **options)`` can bind ``options``.

    ``where`` is the config key of the options (``env.options``); ``reserved`` maps the keyword arguments the
    platform passes itself (``max_turns``) to what to write instead; ``positional`` counts the arguments it passes
    by position (an agent's name), whatever the constructor calls them."""
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
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        for key in options:
            if key not in named:
                close = difflib.get_close_matches(str(key), named, n=3, cutoff=0.6)
                hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
                listed = ", ".join(named) if named else "none"
                raise ConfigError(f"{where}.{key}: {cls.__name__} has no option {key!r}.{hint} Options: {listed}")
    for p in parameters:
        if p.kind in _NAMED and p.default is inspect.Parameter.empty and p.name not in reserved and p.name not in options:
            raise ConfigError(f"{where}: {cls.__name__} needs the option {p.name!r}: set {where}.{p.name}=<value>")


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
