"""The generated parts of the docs: the key tables of docs/training.md and docs/evaluation.md (from the schema's
help texts, ``config/keys.py``) and the list of valid ranges (``config/ranges.py``).

``python -m pettingllms.entry.key_docs`` rewrites each part between its markers; ``--check`` only says which are
stale (exit 1). ``tests/entry/test_training_docs.py`` checks that the docs hold what this writes.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from omegaconf import MISSING, OmegaConf

from pettingllms.config.keys import ENTRY, OPEN_SECTIONS, Key, config_keys, format_value
from pettingllms.config.load import compose
from pettingllms.config.ranges import RANGES
from pettingllms.config.schema import Config, EvalRunConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"
# How the docs write an open section's entry name.
DOC_ENTRY = {"base_models": "<policy>", "agents": "<role>"}
REGENERATE = "python -m pettingllms.entry.key_docs"


@dataclass(frozen=True)
class Part:
    doc: str  # file name under docs/
    marker: str  # <!-- <marker>:start --> ... <!-- <marker>:end -->
    render: Callable[[], str]


def key_tables(root: type, config_name: str, sections: tuple[str, ...] | None = None) -> str:
    """One markdown table per section (``sections``: only these), one row per key: name, the default that
    ``<config_name>.yaml`` gives it, and its help text."""
    composed = compose(config_name)
    by_section: dict[str, list[Key]] = {}
    for key in config_keys(root):
        if sections is None or key.section in sections:
            by_section.setdefault(key.section, []).append(key)
    blocks = []
    for section, keys in by_section.items():
        heading = f"### `{_doc_name(section)}`" if section else "### top level"
        rows = [heading, "| key | default | meaning |", "|---|---|---|"]
        for key in keys:
            relative = key.name[len(section) + 1:] if section else key.name
            meaning = key.help.replace("|", "\\|")
            rows.append(f"| `{relative}` | {_default_cell(key, composed, config_name)} | {meaning} |")
        blocks.append("\n".join(rows))
    return "\n\n".join(blocks)


def range_list() -> str:
    return "\n".join(f"- `{key}`: {rule.describe().removeprefix('must be ')}" for key, rule in RANGES.items())


PARTS = (
    Part("training.md", "keys", lambda: key_tables(Config, "train")),
    Part("training.md", "ranges", range_list),
    Part("evaluation.md", "eval-keys", lambda: key_tables(EvalRunConfig, "eval", ("eval", "model"))),
)


def markers(part: Part) -> tuple[str, str]:
    return (f"<!-- {part.marker}:start (generated from the schema: {REGENERATE}) -->",
            f"<!-- {part.marker}:end -->")


def generated_in(text: str, part: Part) -> str:
    """What ``text`` holds between ``part``'s markers (ValueError if they are missing)."""
    start, end = markers(part)
    return text[text.index(start) + len(start):text.index(end)].strip("\n")


def stale_parts(write: bool) -> list[str]:
    """The parts whose doc differs from what they render (rewritten when ``write``)."""
    stale = []
    for part in PARTS:
        path = DOCS / part.doc
        text, rendered = path.read_text(), part.render()
        if generated_in(text, part) == rendered:
            continue
        stale.append(f"docs/{part.doc} ({part.marker})")
        if write:
            start, end = markers(part)
            head, rest = text.split(start, 1)
            path.write_text(f"{head}{start}\n{rendered}\n{end}{rest.split(end, 1)[1]}")
    return stale


def _doc_name(section: str) -> str:
    top = section.split(".")[0]
    return section.replace(ENTRY, DOC_ENTRY[top]) if top in OPEN_SECTIONS else section


def _default_cell(key: Key, composed: Any, config_name: str) -> str:
    """The value ``<config_name>.yaml`` gives the key (an open section's first entry; none: the schema's)."""
    given = _given(key, composed)
    if key.default == MISSING:
        return "(required)" + (f"; {config_name}.yaml: `{format_value(given)}`" if given is not MISSING else "")
    value = key.default if given is MISSING else given
    return f"`{format_value(value)}`" if value != "" else '`""`'


def _given(key: Key, composed: Any) -> Any:
    parts = key.name.split(".")
    if parts[0] in OPEN_SECTIONS:
        entries = list(composed.get(parts[0]) or {})
        if not entries:
            return MISSING
        parts[1] = entries[0]
    parent, leaf = ".".join(parts[:-1]), parts[-1]
    node = OmegaConf.select(composed, parent) if parent else composed
    if node is None or leaf not in node or OmegaConf.is_missing(node, leaf):
        return MISSING
    value = node[leaf]
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale parts (exit 1), write nothing")
    args = parser.parse_args(argv)
    stale = stale_parts(write=not args.check)
    if stale:
        print(("stale: " if args.check else "rewrote: ") + ", ".join(stale))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
