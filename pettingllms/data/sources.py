"""What every dataset loader shares: sources, reading (hub or local files), writing, mixtures, decontamination.

A ``HubSource`` names a hub dataset and a converter from its raw rows to ours. The same converter runs on
rows read from the hub (``datasets.load_dataset``) and on rows read from a local copy (``--hub-cache DIR``
or ``--from-file``), so the hub path is tested offline on fixture files.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

from pettingllms.core.atomic import atomic_file
from pettingllms.core.errors import DataError
from pettingllms.data.cell_sizes import refuse_huge_cells
from pettingllms.data.layout import SPLITS, dataset_path

LOCAL_SUFFIXES = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
Row = dict[str, Any]


@dataclass(frozen=True)
class HubSource:
    """A hub dataset and how to turn one of its raw rows into ours (``None``: skip the row)."""

    name: str  # the file written: data/<domain>/<split>/<name>.parquet
    split: str  # "train" or "test"
    hub_id: str
    convert: Callable[[Mapping[str, Any], int], Row | None]
    config: str | None = None
    hub_split: str = "train"
    data_files: str | None = None  # for hub repos served as raw files (no loading script)
    row_range: tuple[int, int] | None = None  # keep raw rows [start, stop) only
    dedupe: bool = False  # drop rows whose question repeats (DAPO-Math repeats every problem ~100 times)
    description: str = ""
    columns: tuple[str, ...] | None = None  # read only these from the hub (None: all): rows can be huge


@dataclass(frozen=True)
class ProceduralSource:
    """An offline generator: ``generate(split, count, seed) -> rows``; train and test use disjoint seeds."""

    name: str
    generate: Callable[[str, int, int], list[Row]]
    description: str = ""
    splits: tuple[str, ...] = SPLITS


# ------------------------------------------------------------------------------------------- reading
def read_local(path: Path) -> list[Row]:
    """Rows of a local .parquet/.jsonl/.json file, through ``datasets`` like the hub path."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"local data file {path} does not exist")
    kind = LOCAL_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"cannot read {path}: use one of {sorted(LOCAL_SUFFIXES)}")
    import datasets

    try:
        table = datasets.load_dataset(kind, data_files=str(path), split="train")
    except Exception as exc:
        cause = exc.__cause__ or exc.__context__  # datasets wraps the parser's error in a generic one
        detail = f"{exc}" + (f" ({type(cause).__name__}: {str(cause)[:200]})" if cause is not None else "")
        raise DataError(f"cannot read local data file {path} as {kind}: {detail}") from exc
    refuse_huge_cells(table.data.table, f"local data file {path}")
    return [dict(row) for row in table]


def cached_file(source: HubSource, hub_cache: Path) -> Path:
    for suffix in LOCAL_SUFFIXES:
        candidate = Path(hub_cache) / f"{source.name}{suffix}"
        if candidate.is_file():
            return candidate
    raise DataError(f"source {source.name!r}: no {source.name}.parquet/.jsonl/.json in --hub-cache {hub_cache}")


def read_hub(source: HubSource, hub_cache: Path | None = None) -> list[Row]:
    """Raw rows of ``source``: from ``hub_cache`` when given (same format as the hub), else from the hub."""
    if hub_cache is not None:
        return read_local(cached_file(source, hub_cache))
    import datasets

    try:
        if source.data_files:
            table = datasets.load_dataset("json", data_files=source.data_files, split="train")
        else:
            table = datasets.load_dataset(source.hub_id, source.config, split=source.hub_split)
        if source.columns is not None:
            table = table.select_columns([name for name in source.columns if name in table.column_names])
        if source.row_range is not None:  # convert_rows keeps [start, stop): rows past stop never become Python
            table = table.select(range(min(source.row_range[1], len(table))))
    except Exception as exc:
        where = source.data_files or (f"{source.hub_id}{', ' + source.config if source.config else ''}, "
                                      f"split {source.hub_split}")
        raise DataError(
            f"cannot load source {source.name!r} from the hub ({where}): {type(exc).__name__}: "
            f"{str(exc)[:300]}. Without a network, pass --hub-cache DIR with {source.name}.parquet/.jsonl "
            "(the raw hub rows), or --from-file with converted rows."
        ) from exc
    return [dict(row) for row in table]


def convert_rows(source: HubSource, raw: Sequence[Mapping[str, Any]], limit: int | None = None) -> list[Row]:
    if source.row_range is not None:
        raw = raw[source.row_range[0]: source.row_range[1]]
    rows, seen = [], set()
    for i, item in enumerate(raw):
        row = source.convert(item, i)
        if row is None:
            continue
        if source.dedupe:
            key = normalise_text(row["question"])
            if key in seen:
                continue
            seen.add(key)
        row.setdefault("id", f"{source.name}/{i}")
        row.setdefault("source", source.name)
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise DataError(f"source {source.name!r}: no usable rows after conversion ({len(raw)} raw rows)")
    return rows


# ------------------------------------------------------------------------------------------- writing
def write_rows(rows: Sequence[Row], data_root: Path, domain: str, split: str, name: str,
               required: Sequence[str]) -> Path:
    """Write ``rows`` atomically (temp file, then rename). Every row needs the ``required`` columns."""
    if not rows:
        raise DataError(f"refusing to write an empty dataset {domain}/{split}/{name}")
    for i, row in enumerate(rows):
        missing = [c for c in required if c not in row or row[c] is None]
        if missing:
            raise DataError(f"{domain}/{split}/{name}: row {i} lacks {missing}")
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = dataset_path(data_root, domain, split, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(c for row in rows for c in row))
    table = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows])
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp)
    return path


def read_written(path: Path) -> list[Row]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


# ------------------------------------------------------------------------------------------- mixtures
def parse_weights(spec: str) -> dict[str, float]:
    """``"polaris=0.7,dapo_math=0.3"`` (``:`` also works) -> weights."""
    weights = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, value = part.replace(":", "=").partition("=")
        try:
            weights[name.strip()] = float(value) if sep else 1.0
        except ValueError as exc:
            raise DataError(f"bad mixture weight in {part!r}: expected name=weight") from exc
    if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise DataError(f"mixture {spec!r} needs at least one positive weight")
    return weights


def mix(datasets_by_name: Mapping[str, Sequence[Row]], weights: Mapping[str, float], size: int, seed: int) -> list[Row]:
    """``size`` rows drawn without replacement, ``round(size * w / sum(w))`` from each dataset (all of a dataset
    when it is smaller), shuffled with ``seed``. Each row keeps its id and records its ``source``."""
    rng = random.Random(seed)
    total = sum(weights.values())
    rows: list[Row] = []
    for name, weight in weights.items():
        if name not in datasets_by_name:
            raise DataError(f"mixture source {name!r} is not loaded; have {sorted(datasets_by_name)}")
        pool = list(datasets_by_name[name])
        take = min(len(pool), round(size * weight / total))
        for row in rng.sample(pool, take):
            rows.append({**row, "source": row.get("source", name)})
    rng.shuffle(rows)
    return rows


# ------------------------------------------------------------------------------------------- decontamination
_TOKEN = re.compile(r"\w+|[^\w\s]")


def normalise_text(text: Any) -> str:
    return " ".join(_TOKEN.findall(str(text).lower()))


def _words(text: str) -> list[str]:
    """Word tokens for n-gram overlap (punctuation would make shared code syntax look like shared text)."""
    return re.findall(r"\w+", text.lower())


def _ngrams(tokens: Sequence[str], n: int) -> Iterable[tuple[str, ...]]:
    return (tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _text_of(row: Mapping[str, Any]) -> str:
    """The problem statement to compare: ``problem`` (the statement without our instructions) if a source
    keeps one, else ``question``. Boilerplate shared by every row must not count as overlap."""
    return str(row.get("problem") or row.get("question") or "")


def decontaminate(train: Sequence[Row], tests: Iterable[Sequence[Row]], n: int | None = 13,
                  exact_only_sources: Collection[str] = ()) -> tuple[list[Row], list[Row]]:
    """Split ``train`` into (kept, removed): a row is removed when its question equals a test question
    (normalised: lower case, punctuation as tokens, whitespace collapsed) or shares a run of ``n`` words with
    one (test questions shorter than ``n`` words only match exactly). ``n=None``: exact matches only.

    Rows whose ``source`` is in ``exact_only_sources`` (procedural, templated sets whose train and test items
    share long runs of template words by design, drawn from disjoint seeds) are matched exactly only."""
    exact: set[str] = set()
    grams: set[tuple[str, ...]] = set()
    for rows in tests:
        for row in rows:
            text = _text_of(row)
            exact.add(normalise_text(text))
            if n:
                grams.update(_ngrams(_words(text), n))
    kept, removed = [], []
    for row in train:
        text = _text_of(row)
        use_ngrams = n and row.get("source") not in exact_only_sources
        hit = normalise_text(text) in exact or bool(use_ngrams and any(g in grams for g in _ngrams(_words(text), n)))
        (removed if hit else kept).append(row)
    return kept, removed


def decontaminate_root(data_root: Path, domain: str, names: Iterable[str], n: int | None = 13,
                       exact_only_sources: Collection[str] = ()) -> dict[str, int]:
    """Rewrite each ``train/<name>.parquet`` without rows that overlap any ``test/*.parquet`` of the domain.
    Returns rows removed per name."""
    test_dir = Path(data_root) / domain / "test"
    tests = [read_written(p) for p in sorted(test_dir.glob("*.parquet"))] if test_dir.is_dir() else []
    removed_counts = {}
    for name in names:
        path = dataset_path(data_root, domain, "train", name)
        rows = read_written(path)
        kept, removed = decontaminate(rows, tests, n=n, exact_only_sources=exact_only_sources)
        removed_counts[name] = len(removed)
        if removed:
            if not kept:
                raise DataError(f"decontamination removed every row of {path}: it overlaps the test sets entirely")
            import pyarrow as pa
            import pyarrow.parquet as pq

            with atomic_file(path) as tmp:
                pq.write_table(pa.Table.from_pylist(kept), tmp)
    return removed_counts
