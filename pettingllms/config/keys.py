"""Every key of the config schema as a record: its dotted name, type, default, help text and choices.

This is the one walk over the schema. Unknown-key hints (``load``), the numeric keys that need a range (``ranges``),
``--help`` and the key tables of docs/training.md and docs/evaluation.md (``entry/help.py``) read these records,
so a key is described once, on its schema field (``schema.setting``), and nowhere else.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pettingllms.config.schema import HELP, AgentConfig, Config, ModelConfig

# Sections that are dicts of user-named entries, each entry typed by a dataclass (see schema.Config).
OPEN_SECTIONS: dict[str, type] = {"base_models": ModelConfig, "agents": AgentConfig}
ENTRY = "<name>"  # the entry name of an open section in a key: base_models.<name>.lora.rank


@dataclass(frozen=True)
class Key:
    name: str  # dotted; entries of an open section are written <name>
    hint: Any  # the field's type
    default: Any  # the schema's default (omegaconf.MISSING: the key is required)
    help: str  # markdown; its first sentence is the summary

    @property
    def section(self) -> str:
        """The table the key is listed in: "" (top level), ``base_models.<name>``, ``agents.<name>``, ``env`` ..."""
        parts = self.name.split(".")
        if parts[0] in OPEN_SECTIONS:
            return ".".join(parts[:2])
        return parts[0] if len(parts) > 1 else ""

    @property
    def choices(self) -> tuple[str, ...]:
        """The names an enum-typed key (or a list of them) takes (``core/choices.py``); () for other keys."""
        return _choices(self.hint)

    @property
    def summary(self) -> str:
        """The help's first sentence as plain text (``--help``)."""
        return plain(_SENTENCE_END.split(self.help, maxsplit=1)[0])


_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.\s")


def config_keys(root: type = Config) -> list[Key]:
    """Every leaf key of ``root`` in schema order, with the defaults of a fresh instance (so ``val_sampling``'s
    temperature is 0, as its section's default gives it)."""
    keys: list[Key] = []

    def walk(node: Any, prefix: str, top: bool) -> None:
        hints = typing.get_type_hints(type(node))
        for f in dataclasses.fields(node):
            value, name = getattr(node, f.name), f"{prefix}{f.name}"
            if dataclasses.is_dataclass(value):
                walk(value, name + ".", False)
            elif top and f.name in OPEN_SECTIONS:
                walk(OPEN_SECTIONS[f.name](), f"{name}.{ENTRY}.", False)
            else:
                keys.append(Key(name, hints[f.name], value, f.metadata.get(HELP, "")))

    walk(root(), "", True)
    return keys


def key_named(name: str, root: type = Config) -> Key:
    """The key ``name`` written as on the command line (``base_models.policy_0.path``); KeyError if none."""
    parts = name.split(".")
    if parts[0] in OPEN_SECTIONS and len(parts) > 2:
        parts[1] = ENTRY
    pattern = ".".join(parts)
    for key in config_keys(root):
        if key.name == pattern:
            return key
    raise KeyError(name)


def plain(markdown: str) -> str:
    """Markdown as terminal text: links keep their text, code loses its backticks."""
    return re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", markdown).replace("`", "")


def _choices(hint: Any) -> tuple[str, ...]:
    if isinstance(hint, type) and issubclass(hint, Enum):
        return tuple(member.value for member in hint)
    for arg in typing.get_args(hint):
        found = _choices(arg)
        if found:
            return found
    return ()


def format_value(value: Any) -> str:
    """A value as it is written on the command line: true, null, [a, b], {a: 1}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)
