"""What the loaders can make, so that an error about a missing file names the command that writes it (and only
commands that exist), and a hub id given to ``env.dataset`` is converted like the loader converts it.

The loaders are ``scripts/dataprocess/load_<domain>.py`` in a checkout of the repository: ``load_math.py`` and
``load_code.py`` (``pettingllms/data/loader.py``), and ``load_sokoban.py``, ``load_sudoku.py``,
``load_plan_path.py`` (``pettingllms/data/games.py``). A domain without a loader (a user's own env) has no command
to name: its error says how to give the data instead.
"""

from __future__ import annotations

import re
from typing import Sequence

from pettingllms.data.sources import HubSource

TABULAR = ("math", "code")  # loaders built on pettingllms/data/loader.py
GAMES = {  # domain -> (default file name, how other names are made)
    "sokoban": ("sokoban_6x6_b1", "--size N --boxes B"),
    "sudoku": ("sudoku_4x4", "--size 4|9 --holes N"),
    "plan_path": ("plan_path_10x10", "--size N --wall-prob P"),
}


def loader_script(domain: str) -> str | None:
    """``scripts/dataprocess/load_<domain>.py`` if the repository has a loader for ``domain``, else None."""
    return f"scripts/dataprocess/load_{domain}.py" if domain in TABULAR or domain in GAMES else None


def _domain_spec(domain: str):
    if domain == "math":
        from pettingllms.data.math_sources import domain_spec
    elif domain == "code":
        from pettingllms.data.code_sources import domain_spec
    else:
        return None
    return domain_spec()


def required_columns(domain: str) -> tuple[str, ...]:
    """Columns every row of a ``domain`` dataset must have (empty for domains without a loader)."""
    spec = _domain_spec(domain)
    return tuple(c for c in spec.required if c != "id") if spec else ()


def make_command(domain: str, split: str, name: str) -> str:
    """How to make ``data/<domain>/<split>/<name>.parquet``: a sentence naming existing commands only."""
    script = loader_script(domain)
    if script is None:
        return (f"No loader writes {domain!r} data: point the key at your file itself (a .parquet or .jsonl path, one "
                f"row per problem; your env reads the row as Problem.data), or a hub id; or, if the env generates its "
                f"own problems (procedural_problems), leave env.dataset unset (see docs/custom_env.md)")
    if domain in GAMES:
        default, options = GAMES[domain]
        if name == default:
            return f"Make it with: python {script} (see docs/datasets.md)"
        size = re.fullmatch(r"sudoku_(\d+)x\1", name)
        if domain == "sudoku" and size and size.group(1) in ("4", "9"):
            return f"Make it with: python {script} --size {size.group(1)} (see docs/datasets.md)"
        return (f"Make it with: python {script} --name {name} [{options}] (see docs/datasets.md); or leave "
                f"env.dataset unset: the env generates its puzzles")
    spec = _domain_spec(domain)
    sources = [s for s in spec.known() if spec.file_names.get(s, s) == name and _writes(spec, s, split)]
    if sources:
        source = sources[0]
        hub = spec.hub.get(source)
        where = f" (downloads {hub.hub_id}; without a network add --hub-cache DIR)" if hub else " (offline)"
        alternative = ""
        if hub and spec.offline_default:
            offline = spec.offline_default[0]
            alternative = (f". Offline instead: python {script}, then {_key(split)}={offline}"
                           if split == "train" or _writes(spec, offline, split) else "")
        return f"Make it with: python {script} --sources {source}{where}{alternative} (see docs/datasets.md)"
    return (f"No {domain} source is named {name!r} (sources: {', '.join(spec.known())}). Convert your own rows with "
            f"python {script} --from-file FILE --name {name} --split {split}, or point the key at the file itself "
            f"(see docs/datasets.md)")


def _key(split: str) -> str:
    return "env.dataset" if split == "train" else "env.benchmark"


def _writes(spec, source: str, split: str) -> bool:
    hub = spec.hub.get(source)
    return hub is None or hub.split == split


def hub_source(domain: str, hub_id: str, hub_split: str) -> HubSource | None:
    """The loader's converter for ``hub_id`` (e.g. POLARIS' ``problem`` column -> our ``question``), if it has one."""
    spec = _domain_spec(domain)
    if spec is None:
        return None
    matches: Sequence[HubSource] = [s for s in spec.hub.values() if s.hub_id == hub_id and not s.data_files]
    exact = [s for s in matches if s.hub_split == hub_split]
    return (exact or list(matches) or [None])[0]
