"""A run directory's files are data, never code.

A run's ``config.yaml`` names modules and classes: ``env.imports``, ``env.name='module:Class'``,
``agents.<role>.cls='module:Class'``. ``pettingllms eval`` and ``pettingllms export`` read that file for their
defaults; importing what it names would run whatever a shared, copied or downloaded run directory says
(``agents.x.cls=subprocess:Popen`` with shell options; ``env.imports=[evil]`` beside an ``evil.py``). So a setting
that imports code is taken from a run only when the user

- names it on the command line (``env.imports=[my_envs.guess]``, ``agents.<role>.cls=...``), or
- vouches for the run: ``model.trust_run_code=true`` (eval), ``--trust-run-code`` (export).

Registered short names (``math``, ``toy_targets``) are not code settings: they name classes of installed packages,
imported the same way whoever asks. Whatever a name reaches must be an ``Env`` or ``Agent`` subclass
(``core/registry.py``), trusted or not.
"""

from __future__ import annotations

from typing import Any, Mapping

from pettingllms.core import ConfigError


def code_settings(cfg: Any) -> dict[str, str]:
    """Key -> value of every setting of ``cfg`` that imports a module: ``env.imports`` (non-empty), an
    ``env.name`` or ``agents.<role>.cls`` of the form ``module:Class``, an agent program's ``env.options.program``
    (other than this package's own)."""
    found: dict[str, str] = {}
    if list(cfg.env.imports):
        found["env.imports"] = "[" + ",".join(cfg.env.imports) + "]"
    if ":" in cfg.env.name:
        found["env.name"] = cfg.env.name
    program = cfg.env.options.get("program") if cfg.env.name == "program" else None
    if program and not str(program).startswith("pettingllms."):  # an agent program is a module the run imports
        found["env.options.program"] = str(program)
    for role, agent in sorted(cfg.agents.items()):
        if agent.cls and ":" in agent.cls:
            found[f"agents.{role}.cls"] = agent.cls
    return found


def refuse_run_code(settings: Mapping[str, str], run: Any, trust: str) -> None:
    """Raise ConfigError naming ``settings`` (key -> value, taken from the run ``run``) unless there are none.
    ``trust`` is how this command vouches for a run (``model.trust_run_code=true``)."""
    if not settings:
        return
    listed = " ".join(f"{key}={value}" for key, value in settings.items())
    raise ConfigError(
        f"the run {run} names code to import in its config.yaml: {listed}. A run directory's files are data, so "
        f"they are not imported unasked. Name them on the command line yourself (the key=value pairs above, from "
        f"an installed package or your own project), or, for a run you trust as you trust your own code, add {trust}")
