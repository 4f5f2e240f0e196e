"""docs/training.md documents every config key of the schema, with the default that ``train.yaml`` really gives."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from pathlib import Path

from omegaconf import MISSING, OmegaConf

from pettingllms.config.load import compose
from pettingllms.config.schema import AgentConfig, Config, ModelConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "training.md"
OPEN_SECTIONS = {"base_models": ("<policy>", ModelConfig), "agents": ("<role>", AgentConfig)}


def schema_leaves() -> dict[str, object]:
    """Dotted key -> schema default, for every leaf; dict-of-entries sections use a placeholder name."""
    leaves: dict[str, object] = {}

    def walk(obj, prefix):
        for f in dataclasses.fields(obj):
            value, key = getattr(obj, f.name), f"{prefix}{f.name}"
            if f.name in OPEN_SECTIONS and not prefix:
                placeholder, entry = OPEN_SECTIONS[f.name]
                walk(entry(), f"{key}.{placeholder}.")
            elif dataclasses.is_dataclass(value):
                walk(value, key + ".")
            else:
                leaves[key] = value

    walk(Config(), "")
    return leaves


@functools.lru_cache(maxsize=1)
def composed_train_yaml():
    return compose("train")


def train_yaml_value(key: str, schema_default):
    """The value after composing pettingllms/configs/train.yaml, else the schema default (MISSING stays MISSING).
    ``<policy>`` is read as ``policy_0``; train.yaml sets no agents, so ``<role>`` keys keep the schema default."""
    if "<role>" in key:
        return schema_default
    parent, _, leaf = key.replace("<policy>", "policy_0").rpartition(".")
    node = OmegaConf.select(composed_train_yaml(), parent) if parent else composed_train_yaml()
    if node is None or leaf not in node or OmegaConf.is_missing(node, leaf):
        return schema_default
    value = node[leaf]
    return OmegaConf.to_object(value) if OmegaConf.is_config(value) else value


def split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "[{("
        depth -= char in "]})"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [p for p in [*parts, current.strip()] if p]


def expand(name: str, fields_of) -> list[str]:
    """``a.{b,c}`` -> a.b, a.c; ``a.*`` -> every field of a (in schema order)."""
    braces = re.fullmatch(r"(.*)\{(.*)\}", name)
    if braces:
        return [braces.group(1) + part for part in braces.group(2).split(",")]
    if name.endswith(".*"):
        return [f"{name[:-2]}.{f}" for f in fields_of(name[:-2])]
    return [name]


def documented_rows() -> list[tuple[list[str], list[str], str]]:
    """(full keys, default parts, raw default cell) of every row of the tables under '## Keys'."""
    leaves = schema_leaves()

    def fields_of(prefix):
        return [k[len(prefix) + 1:] for k in leaves if k.startswith(prefix + ".")]

    rows, in_keys, prefixes = [], False, []
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            in_keys = line.strip() == "## Keys"
            continue
        if not in_keys:
            continue
        if line.startswith("### "):
            prefixes = re.findall(r"`([^`]+)`", line)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = []
        for name in re.findall(r"`([^`]+)`", cells[0]):
            # Under one section heading names are relative to it; under a combined heading (`rollout`, `reward`)
            # or none they are written in full.
            full = f"{prefixes[0]}.{name}" if len(prefixes) == 1 else name
            names += expand(full, lambda p: fields_of(p))
        rows.append((names, split_top_level(cells[1].replace("`", "")), cells[1]))
    return rows


def parse_default(text: str):
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if text.startswith("[") and text.endswith("]"):
        return [p.strip() for p in text[1:-1].split(",") if p.strip()]
    if text == "{}":
        return {}
    try:
        return float(text)
    except ValueError:
        return text


def same(documented, actual) -> bool:
    if isinstance(actual, bool) or actual is None or isinstance(documented, bool):
        return documented is actual
    if isinstance(actual, (int, float)) and isinstance(documented, float):
        return math.isclose(documented, float(actual), rel_tol=1e-12)
    if isinstance(actual, list):
        return documented == [str(a) for a in actual]
    return documented == actual


def test_every_schema_key_is_documented_and_every_documented_key_exists():
    leaves = schema_leaves()
    documented = [k for names, _, _ in documented_rows() for k in names]
    assert sorted(set(leaves) - set(documented)) == [], "schema keys missing from docs/training.md"
    assert sorted(set(documented) - set(leaves)) == [], "docs/training.md documents keys the schema lacks"
    assert len(documented) == len(set(documented)), "a key is documented twice"


def test_documented_defaults_are_the_real_ones():
    leaves = schema_leaves()
    wrong = []
    for names, parts, cell in documented_rows():
        if len(parts) != len(names) and not (len(names) == 1 and "(required)" in cell):
            wrong.append(f"{names}: {len(names)} key(s) but default cell {cell!r}")
            continue
        for name, part in zip(names, parts):
            if name not in leaves:
                continue  # reported by the test above
            if leaves[name] == MISSING:  # required in the schema: say so, and show train.yaml's value if it sets one
                given = train_yaml_value(name, MISSING)
                if "(required)" not in cell or (given != MISSING and f"`{given}`" not in cell):
                    wrong.append(f"{name}: required, train.yaml gives {given!r}; documented {cell!r}")
                continue
            actual = train_yaml_value(name, leaves[name])
            if not same(parse_default(part), actual):
                wrong.append(f"{name}: documented {part!r}, actual {actual!r}")
    assert wrong == []


def test_the_key_tables_and_the_range_list_are_what_the_schema_generates():
    """docs/training.md's key tables and range list and docs/evaluation.md's key tables are made from the schema
    (``python -m pettingllms.entry.key_docs``): a changed help text, default or range shows up here until rerun."""
    from pettingllms.entry.key_docs import DOCS, PARTS, generated_in

    for part in PARTS:
        assert generated_in((DOCS / part.doc).read_text(), part) == part.render(), (
            f"docs/{part.doc} ({part.marker}) is stale: run python -m pettingllms.entry.key_docs")
