"""Load a config through Hydra's compose API (tests, tools) and turn it into the typed schema object."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pettingllms.config.schema import AgentConfig, Config, ModelConfig, register_schema
from pettingllms.core.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def compose(config_name: str = "train", overrides: Sequence[str] = (), config_dir: Path | None = None) -> DictConfig:
    """Compose ``pettingllms/configs/<config_name>.yaml`` with Hydra overrides; bad keys raise ConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    register_schema()
    overrides = [_open_dict_override(o) for o in overrides]
    directory = Path(config_dir or CONFIG_DIR).resolve()
    if not directory.is_dir():
        raise ConfigError(f"config directory {directory} does not exist")
    try:
        with initialize_config_dir(config_dir=str(directory), version_base=None):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"invalid config {config_name!r} with overrides {list(overrides)}: {exc}") from exc


OPEN_SECTIONS = ("base_models.", "agents.")


def _open_dict_override(override: str) -> str:
    """``base_models.*`` and ``agents.*`` entries may be added without Hydra's ``+``.

    These sections are dicts of user-named entries; each entry is still checked field by field against its
    dataclass in ``to_schema``, so a typo in a field name fails at start-up all the same.
    """
    if override.startswith(OPEN_SECTIONS) and "=" in override:
        return "++" + override
    return override


def to_schema(cfg: DictConfig) -> Config:
    """The typed object (dataclass instances all the way down); raises ConfigError on bad or missing values."""
    try:
        config: Config = OmegaConf.to_object(cfg)  # type: ignore[assignment]
        config.base_models = {k: _typed(ModelConfig, v, f"base_models.{k}") for k, v in config.base_models.items()}
        config.agents = {k: _typed(AgentConfig, v, f"agents.{k}") for k, v in config.agents.items()}
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {exc}") from exc
    return config


def _typed(schema: type, value: object, where: str):
    """Validate one entry of a dict-of-dataclasses section against its dataclass schema."""
    try:
        node = OmegaConf.merge(OmegaConf.structured(schema), value if value is not None else {})
        missing = sorted(OmegaConf.missing_keys(node))
        if missing:
            raise ConfigError(f"{where}: missing value(s) for {missing}")
        return OmegaConf.to_object(node)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{where}: {exc}") from exc
