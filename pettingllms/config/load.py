"""Load a config through Hydra's compose API and turn it into the typed schema object.

Every command (``pettingllms train``, ``eval``, the scripts, the tests) composes through ``compose``, which makes
these promises:
- an unknown key is an error, written with or without Hydra's ``+``/``++``, with the close matches named
  (``+rollout.branchng=4`` would otherwise add a key the schema drops, and the run would train on the defaults);
- ``hydra.*`` overrides are refused: configs are composed with the compose API, no Hydra app runs, so they
  would change nothing;
- a bad value names the key and shows OmegaConf's cause (not only "Error merging override");
- ``config_dir`` is searched before the packaged configs (``pettingllms/configs``), so a user config can start
  from them (``defaults: [train, _self_]``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import re
import typing
from pathlib import Path
from typing import Any, Iterator, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pettingllms.config.frozen import freeze, thaw
from pettingllms.config.keys import OPEN_SECTIONS, config_keys
from pettingllms.config.ranges import check_ranges
from pettingllms.config.schema import AgentConfig, Config, EvalRunConfig, ModelConfig, register_schema
from pettingllms.core.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
OPEN_DICT_PREFIXES = (*(f"{s}." for s in OPEN_SECTIONS), "env.options.")  # entries added without Hydra's +
KEYS_HELP = "every key is listed in docs/training.md; `pettingllms train --dry-run` prints the resolved config"


def compose(config_name: str = "train", overrides: Sequence[str] = (), config_dir: str | Path | None = None) -> DictConfig:
    """Compose ``<config_name>.yaml`` (from ``config_dir``, then ``pettingllms/configs``) with Hydra overrides.

    Raises ConfigError for unparsable overrides, ``hydra.*`` overrides, unknown keys (with close matches), bad
    values (with OmegaConf's cause) and unknown config names (with the ones that exist)."""
    from hydra import compose as hydra_compose
    from hydra.errors import HydraException, MissingConfigException

    register_schema()
    overrides = list(overrides)
    parsed = parse_overrides(overrides)
    try:
        with _config_search_path(search_dirs(config_dir)):
            cfg = hydra_compose(config_name=config_name, overrides=[_open_dict_override(o) for o in overrides])
    except MissingConfigException as exc:
        raise ConfigError(_missing_config_message(config_name, config_dir, exc)) from exc
    except (HydraException, OmegaConfBaseException) as exc:
        groups = list(config_groups(config_dir))
        root = _schema_of(config_name, config_dir)
        unknown = list(_override_keys_unknown(parsed, groups, root)) if root is not None else []
        if any(path in str(exc) for path, _ in unknown):  # Hydra stops at the first misspelt key: name them all
            raise ConfigError(unknown_keys_message(unknown, root, overrides, groups)) from exc
        raise ConfigError(f"invalid config {config_name!r}: {explain(exc)}") from exc
    check_known_keys(cfg, config_name, overrides, list(config_groups(config_dir)))
    return cfg


def search_dirs(config_dir: str | Path | None = None) -> list[Path]:
    """Where configs are looked up, first match wins: ``config_dir`` (if given), then the packaged configs."""
    if config_dir is None:
        return [CONFIG_DIR]
    directory = Path(config_dir).expanduser().resolve()
    if not directory.is_dir():
        raise ConfigError(f"--config-dir {config_dir}: {directory} is not a directory")
    return [directory] if directory == CONFIG_DIR else [directory, CONFIG_DIR]


@contextlib.contextmanager
def _config_search_path(directories: Sequence[Path]) -> Iterator[None]:
    """``hydra.initialize_config_dir`` with several directories (Hydra's public API takes one).

    Hydra's ``hydra.searchpath`` override cannot do this: Hydra looks the primary config up (and caches the miss)
    before it extends the search path, so a packaged config name given with ``--config-dir`` would not be found.
    """
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    version.setbase(None)
    search_path = create_config_search_path(search_path_dir=str(directories[0]))
    anchor = "main"
    for index, directory in enumerate(directories[1:]):
        provider = f"pettingllms-{index}"
        search_path.append(provider, f"file://{directory}", anchor=anchor)  # after the previous dir, before schema
        anchor = provider
    Hydra.create_main_hydra2(task_name="pettingllms", config_search_path=search_path)
    try:
        yield
    finally:
        restore_gh_from_backup(backup)


# ----------------------------------------------------------------------------------------------- overrides
def parse_overrides(overrides: Sequence[str]) -> list:
    """Parse with Hydra's override grammar; refuse ``hydra.*``. Returns Hydra's ``Override`` objects."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parsed = []
    for text in overrides:
        if text.startswith("-"):
            raise ConfigError(f"unknown option {text!r}. Options: --config-name NAME, --config-dir DIR, --dry-run, "
                              f"--multirun/-m, --help; everything else is a key=value override")
        try:
            (override,) = OverridesParser.create().parse_overrides([text])
        except HydraException as exc:
            raise ConfigError(f"cannot parse the override {text!r}: {_first_line(exc)}. Overrides are key=value "
                              f"(Hydra's grammar: https://hydra.cc/docs/advanced/override_grammar/basic/)"
                              f"{_quoting_hint(text)}") from exc
        key = override.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            raise ConfigError(
                f"{text!r}: hydra.* overrides have no effect here and are refused. pettingllms composes its config "
                "with Hydra's compose API and runs no Hydra app (no Hydra run directory, logging, launcher or "
                "sweeper). Use training.log_dir (eval.log_dir) for run directories, --multirun for sweeps and "
                "--config-dir for your own config files")
        parsed.append(override)
    return parsed


def _quoting_hint(text: str) -> str:
    """A value with characters Hydra's grammar reads (an OpenSpiel game's parameters, ``kuhn_poker(players=3)``)
    parses as one string inside quotes that reach Hydra: the hint shows the shell line that does it."""
    key, sep, value = text.partition("=")
    if not sep or not value or value[0] in "'\"[{" or not any(c in value for c in "()=,: "):
        return ""
    return f"; a value with ( ) = , : or spaces is one string in quotes, on a shell line: \"{key}='{value}'\""


def _open_dict_override(override: str) -> str:
    """``base_models.*``, ``agents.*`` and ``env.options.*`` entries may be added without Hydra's ``+``; a single
    module in ``env.imports=my.module`` is a one-element list.

    The sections are dicts of user-named entries, each still checked field by field against its dataclass
    (``check_known_keys``, ``to_schema``), and options are checked against the env's or agent's constructor when the
    run is planned (``assembly/construct.py``), so a typo in a name fails at start-up all the same.
    """
    if override.startswith(OPEN_DICT_PREFIXES) and "=" in override:
        return "++" + override
    single_import = re.fullmatch(r"(\+{0,2}env\.imports)=([A-Za-z_][\w.]*)", override)
    if single_import and single_import.group(2) != "null":
        return f"{single_import.group(1)}=[{single_import.group(2)}]"
    return override


def config_names(config_dir: str | Path | None = None) -> list[str]:
    """Names ``--config-name`` accepts: the YAML files of ``config_dir`` and of the packaged configs."""
    folders = ([Path(config_dir).expanduser()] if config_dir else []) + [CONFIG_DIR]
    return sorted({p.stem for folder in folders if folder.is_dir() for p in folder.glob("*.yaml")})


def config_groups(config_dir: str | Path | None = None) -> dict[str, list[str]]:
    """Config groups (sub-folders of YAML files) and their options, e.g. ``specialization: [L0, L1, L2, L3]``."""
    folders = ([Path(config_dir).expanduser()] if config_dir else []) + [CONFIG_DIR]
    groups: dict[str, set[str]] = {}
    for folder in folders:
        if folder.is_dir():
            for path in folder.glob("*/*.yaml"):
                groups.setdefault(path.parent.name, set()).add(path.stem)
    return {group: sorted(options) for group, options in sorted(groups.items())}


def _missing_config_message(config_name: str, config_dir, exc: Exception) -> str:
    where = f"{config_dir} and {CONFIG_DIR}" if config_dir else str(CONFIG_DIR)
    text = str(exc)
    option = re.search(r"Could not find '([^'/]+)/([^']+)'", text)
    if option:
        group, name = option.groups()
        options = config_groups(config_dir).get(group)
        if options is None:
            return f"config {config_name!r}: there is no config group {group!r} (groups: {sorted(config_groups(config_dir))})"
        close = difflib.get_close_matches(name, options, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        return f"{group}={name}: config group {group!r} has no option {name!r}.{hint} Options: {', '.join(options)}"
    if "primary config" in text:
        close = difflib.get_close_matches(config_name, config_names(config_dir), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        return (f"no config named {config_name!r} in {where}.{hint} Configs: {config_names(config_dir)}; "
                f"add your own directory with --config-dir DIR")
    return f"config {config_name!r}: {_first_line(exc)} (config groups: {config_groups(config_dir)})"


# ----------------------------------------------------------------------------------------------- unknown keys
def check_known_keys(cfg: DictConfig, config_name: str = "train", overrides: Sequence[str] = (),
                     groups: Sequence[str] = ()) -> None:
    """Raise ConfigError if the composed config holds a key the schema lacks (only Hydra's ``+`` can add one)."""
    root = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(root):
        raise ConfigError(f"config {config_name!r} is not built on the pettingllms schema: its defaults list must "
                          f"start with `train` (or `eval`, `pettingllms_schema`), e.g. `defaults: [train, _self_]`")
    unknown = list(_unknown_keys(OmegaConf.to_container(cfg, resolve=False), root, ""))
    if unknown:
        raise ConfigError(unknown_keys_message(unknown, root, overrides, groups))


def unknown_keys_message(unknown: Sequence[tuple[str, type]], root: type, overrides: Sequence[str],
                         groups: Sequence[str]) -> str:
    """One unknown key: ``unknown_key_message``; several: each with its suggestions, one per line."""
    if len(unknown) == 1:
        path, schema = unknown[0]
        return unknown_key_message(path, schema, root, _override_for(path, overrides), groups)
    lines = [f"{len(unknown)} unknown config keys:"]
    for path, schema in unknown:
        lines.append("  " + unknown_key_message(path, schema, root, _override_for(path, overrides), groups,
                                                brief=True))
    return "\n".join([*lines, KEYS_HELP])


def _schema_of(config_name: str, config_dir: str | Path | None) -> type | None:
    """The schema dataclass ``config_name`` composes into without overrides (None if it does not compose)."""
    from hydra import compose as hydra_compose

    try:
        with _config_search_path(search_dirs(config_dir)):
            schema = OmegaConf.get_type(hydra_compose(config_name=config_name))
    except Exception:  # noqa: BLE001 - the caller reports the original error
        return None
    return schema if dataclasses.is_dataclass(schema) else None


def _override_keys_unknown(parsed: Sequence[Any], groups: Sequence[str], root: type) -> Iterator[tuple[str, type]]:
    """The keys of a command line's overrides that ``root`` lacks (config groups left out)."""
    tree: dict[str, Any] = {}
    for override in parsed:
        key = override.key_or_group
        if "/" in key or key.split(".")[0] in groups:
            continue
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node.setdefault(leaf, None)
    yield from _unknown_keys(tree, root, "")


def _unknown_keys(node: Any, schema: type, prefix: str) -> Iterator[tuple[str, type]]:
    """(dotted key, the dataclass it is not a field of) for every key of ``node`` outside ``schema``."""
    if not isinstance(node, dict):
        return
    hints = _field_types(schema)
    for key, value in node.items():
        path = f"{prefix}{key}"
        if key not in hints:
            yield path, schema
        elif dataclasses.is_dataclass(hints[key]):
            yield from _unknown_keys(value, hints[key], path + ".")
        elif not prefix and key in OPEN_SECTIONS and isinstance(value, dict):
            for name, entry in value.items():
                yield from _unknown_keys(entry, OPEN_SECTIONS[key], f"{path}.{name}.")


def _field_types(schema: type) -> dict[str, Any]:
    hints = typing.get_type_hints(schema)
    return {f.name: hints[f.name] for f in dataclasses.fields(schema)}


def unknown_key_message(path: str, schema: type, root: type = Config, override: str | None = None,
                        groups: Sequence[str] = (), brief: bool = False) -> str:
    """``unknown config key 'rollout.branchng' (from +rollout.branchng=4). Did you mean 'rollout.branching'?``,
    then the section's keys; ``brief``: ``'rollout.branchng' (from ...). Did you mean ...?`` alone."""
    parent, _, key = path.rpartition(".")
    fields = list(_field_types(schema))
    close = [f"{parent}.{f}" if parent else f for f in difflib.get_close_matches(key, fields, n=3, cutoff=0.6)]
    if not parent:  # a misspelt config group (+experimnt=quick_test)
        close += [f"+{g}=..." for g in difflib.get_close_matches(key, list(groups), n=2, cutoff=0.6)]
    if not close:  # the right name in another section (training.lr -> optim.lr)?
        close = difflib.get_close_matches(key, [p for p in schema_keys(root)], n=3, cutoff=0.9)
        close += [p for p in schema_keys(root) if p.rsplit(".", 1)[-1] == key and p not in close][:3]
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    where = f" (from {override})" if override else ""
    if brief:
        return f"{path!r}{where}.{hint}"
    section = f"{_section_name(parent)} has" if parent else "top-level keys are"
    return f"unknown config key {path!r}{where}.{hint} {section}: {', '.join(fields)}; {KEYS_HELP}"


def _section_name(parent: str) -> str:
    parts = parent.split(".")
    if parts[0] in OPEN_SECTIONS and len(parts) >= 2:
        return ".".join([parts[0], "<name>", *parts[2:]]) + f" ({parent})"
    return parent


def schema_keys(root: type = Config) -> list[str]:
    """Every dotted leaf key of the schema (open sections with a placeholder entry name)."""
    return [key.name for key in config_keys(root)]


def _override_for(path: str, overrides: Sequence[str]) -> str | None:
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        if key == path or path.startswith(key + "."):
            return text
    return None


# ----------------------------------------------------------------------------------------------- errors
def explain(exc: BaseException) -> str:
    """Hydra's message and the OmegaConf cause under it; an unknown key becomes our message with suggestions."""
    messages, list_key = [], None
    for error in _chain(exc):
        object_type, key = getattr(error, "object_type", None), getattr(error, "key", None)
        full_key = getattr(error, "full_key", None) or ""
        if full_key and "is not a ListConfig, list or tuple" in str(error):
            list_key = full_key
        if (type(error).__name__ in ("ConfigAttributeError", "ConfigKeyError") and dataclasses.is_dataclass(object_type)
                and key is not None and f"Key '{key}' not in" in str(error)):
            root = Config
            return unknown_key_message(str(full_key or key), object_type, root)
        line = _first_line(error)
        if "$VALUE" in line or "$KEY" in line:  # OmegaConf's message template, repeated by its wrapper
            continue
        if full_key and "full_key" in str(error) and full_key not in line:
            line += f" (key {full_key})"
        if line and line not in messages:
            messages.append(line)
    if list_key:  # a YAML scalar where the schema has a list (an override's is made a list: _open_dict_override)
        messages.append(f"{list_key} is a list: write the value in brackets, e.g. {list_key.rsplit('.', 1)[-1]}: [x]")
    return ": ".join(messages)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


# ----------------------------------------------------------------------------------------------- typed object
def to_schema(cfg: DictConfig) -> Config:
    """The typed, frozen object (dataclass instances all the way down, read-only: ``config/frozen.py``); raises
    ConfigError on bad or missing values, and on numbers outside their range (``config/ranges.py``)."""
    try:
        config: Config = OmegaConf.to_object(cfg)  # type: ignore[assignment]
        config.base_models = {k: _typed(ModelConfig, v, f"base_models.{k}") for k, v in config.base_models.items()}
        config.agents = {k: _typed(AgentConfig, v, f"agents.{k}") for k, v in config.agents.items()}
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {explain(exc)}") from exc
    check_ranges(config, training=not isinstance(config, EvalRunConfig))
    return freeze(config)


def from_schema(config: Config) -> DictConfig:
    """The typed object back as an OmegaConf config (schema defaults filled in): ``config.yaml`` of a run, the
    dry run's printout, the trackers' hyperparameters."""
    return OmegaConf.structured(thaw(config))


def to_yaml(config: Config) -> str:
    return OmegaConf.to_yaml(from_schema(config))


def to_dict(config: Config) -> dict[str, Any]:
    """Plain dicts, lists and scalars (choices as their names): what trackers log and the resume hash reads."""
    return OmegaConf.to_container(from_schema(config), enum_to_str=True)  # type: ignore[return-value]


def _typed(schema: type, value: object, where: str):
    """Validate one entry of a dict-of-dataclasses section against its dataclass schema."""
    try:
        node = OmegaConf.merge(OmegaConf.structured(schema), value if value is not None else {})
        missing = sorted(OmegaConf.missing_keys(node))
        if missing:
            raise ConfigError(f"{where}: missing value(s) for {missing}")
        return OmegaConf.to_object(node)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{where}: {explain(exc)}") from exc
