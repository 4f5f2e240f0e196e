"""Where a run's problems come from: ``env.dataset`` and ``env.benchmark`` resolved to problems.

``env.dataset`` (training) and each entry of ``env.benchmark`` (validation) is one of:
- a **name**: ``data/<domain>/<split>/<name>.parquet`` under ``env.data_root`` (what the loaders write;
  ``<domain>`` is the env's ``domain`` attribute);
- a **local file**: a path ending in ``.parquet``, ``.jsonl`` or ``.json``;
- a **hub id** ``owner/name`` (optionally ``owner/name:split``), read with ``datasets.load_dataset`` (a local
  dataset folder works the same way); a hub dataset the loaders know (POLARIS, AIME, ...) is converted as the
  loader converts it;
- a **list** of those: their problems one after another (for ``env.benchmark``: one validation set each);
- a **mixture** ``{name: weight, ...}``: the largest sample that keeps the weights, drawn without replacement
  and seeded by ``training.seed``.

Unset ``env.dataset`` means the env generates its training problems (``env.procedural_problems("train", n)``);
an empty ``env.benchmark`` validates on the env's own "test" split when it has one. Each row becomes a
``Problem`` whose data is the row and whose id is the row's ``id`` column (else ``<label>/<row>``). A missing file
is an error naming the command that makes it; nothing falls back to a default puzzle.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from pettingllms.core import DataError, Env, Problem
from pettingllms.core.env import PROCEDURAL_TEST_SIZE, PROCEDURAL_TRAIN_SIZE
from pettingllms.data.cell_sizes import refuse_huge_cells
from pettingllms.data.layout import dataset_path
from pettingllms.data.row_checks import Fields, check_rows, fields_of

PROCEDURAL = "procedural"
FILE_SUFFIXES = (".parquet", ".jsonl", ".json")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_HUB_ID = re.compile(r"(?P<id>[A-Za-z0-9][\w.\-]*/[\w.\-]+)(?::(?P<split>[\w.\-]+))?")


# ----------------------------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class DataSource:
    """One place problems come from: a named file of the data tree, a local file, or a hub dataset."""

    kind: str  # name | file | hub
    spec: str  # as the user wrote it
    label: str  # prefix of generated problem ids, and the benchmark's key (val/<label>/...)
    domain: str
    split: str  # train | test: the data-tree split; for hub datasets the split asked of load_dataset
    path: Path | None = None  # name, file

    def describe(self) -> str:
        if self.kind == "hub":
            return f"hub dataset {self.spec} (split {self.split}; read at start-up)"
        size = _row_count(self.path) if self.path.suffix == ".parquet" else None
        return f"{self.path}" + (f" ({size} rows)" if size is not None else "")

    def check(self) -> None:
        """Raise DataError if a file is missing. A hub dataset is only checked when it is read."""
        if self.kind == "name" and not self.path.is_file():
            from pettingllms.data.catalog import make_command

            raise DataError(f"dataset {self.spec!r}: {self.path} does not exist. "
                            f"{make_command(self.domain, self.split, self.spec)}")
        if self.kind == "file" and not self.path.is_file():
            raise DataError(f"dataset file {self.path} does not exist (from {self.spec!r}; relative paths are from "
                            f"the current directory {Path.cwd()})")

    def load(self, fields: Fields | None = None) -> list[Problem]:
        """Every row as a problem, each checked against ``fields`` (default: the domain loader's columns)."""
        self.check()
        rows = _read_hub(self) if self.kind == "hub" else _read_file(self.path)
        where = f"hub dataset {self.spec} (split {self.split})" if self.kind == "hub" else str(self.path)
        check_rows(rows, fields_of(None, self.domain) if fields is None else fields, where,
                   f"{self.domain} envs", _convert_hint(self.domain))
        return [Problem(str(row.get("id") or f"{self.label}/{i}"), row) for i, row in enumerate(rows)]


def parse_source(entry: Any, domain: str, data_root: str | Path, split: str) -> DataSource:
    """Classify one entry: a data-tree name, a local file, or a hub id. Raises DataError for anything else."""
    text = str(entry).strip()
    if not text:
        raise DataError(f"empty dataset entry in {_key(split)}")
    expanded = Path(text).expanduser()
    if text.lower().endswith(FILE_SUFFIXES):
        return DataSource("file", text, _label(expanded.stem), domain, split, expanded)
    if "/" not in text and "\\" not in text and _NAME.fullmatch(text):
        return DataSource("name", text, text, domain, split, dataset_path(data_root, domain, split, text))
    hub = _HUB_ID.fullmatch(text)
    if hub or expanded.is_dir():
        hub_id, hub_split = (hub.group("id"), hub.group("split") or split) if hub else (text, split)
        label = _label(hub_id.rstrip("/").rsplit("/", 1)[-1] + (f"_{hub.group('split')}" if hub and hub.group("split") else ""))
        return DataSource("hub", hub_id, label, domain, hub_split)
    raise DataError(f"{_key(split)} entry {text!r} is not a dataset name (data/<domain>/{split}/<name>.parquet), a "
                    f"file ({', '.join(FILE_SUFFIXES)}) or a hub id (owner/name[:split])")


@dataclass(frozen=True)
class DataSpec:
    """A resolved ``env.dataset`` value (or one benchmark): its sources, and weights when it is a mixture."""

    parts: tuple[DataSource, ...]
    weights: tuple[float, ...] | None = None  # a mixture; None: the parts one after another

    @property
    def label(self) -> str:
        return "+".join(p.label for p in self.parts)

    def describe(self) -> str:
        if self.weights is None:
            return " + ".join(p.describe() for p in self.parts)
        return "mixture of " + ", ".join(f"{w:g} x {p.describe()}" for p, w in zip(self.parts, self.weights))

    def check(self) -> None:
        for part in self.parts:
            part.check()

    def load(self, seed: int = 0, fields: Fields | None = None) -> list[Problem]:
        loaded = [part.load(fields) for part in self.parts]
        if self.weights is None:
            return [problem for problems in loaded for problem in problems]
        return mixture(loaded, self.weights, seed)


def parse_spec(value: Any, domain: str, data_root: str | Path, split: str) -> DataSpec:
    """A name/file/hub id, a list of them, or a ``{entry: weight}`` mixture."""
    if isinstance(value, Mapping):
        if not value:
            raise DataError(f"{_key(split)}: an empty mixture")
        parts = tuple(parse_source(entry, domain, data_root, split) for entry in value)
        try:
            weights = tuple(float(w) for w in value.values())
        except (TypeError, ValueError) as exc:
            raise DataError(f"{_key(split)} mixture {dict(value)}: weights must be numbers") from exc
        if any(w < 0 or not math.isfinite(w) for w in weights) or sum(weights) <= 0:
            raise DataError(f"{_key(split)} mixture {dict(value)}: weights must be >= 0 with a positive sum")
        return DataSpec(parts, weights)
    if isinstance(value, (list, tuple)):
        if not value:
            raise DataError(f"{_key(split)}: an empty list")
        nested = [v for v in value if isinstance(v, (Mapping, list, tuple))]
        if nested:
            raise DataError(f"{_key(split)}: a list holds names, files or hub ids, not {nested[0]!r}")
        return DataSpec(tuple(parse_source(v, domain, data_root, split) for v in value))
    return DataSpec((parse_source(value, domain, data_root, split),))


def mixture(parts: Sequence[Sequence[Problem]], weights: Sequence[float], seed: int) -> list[Problem]:
    """The largest sample of ``parts`` whose sizes follow ``weights``, without replacement, shuffled with ``seed``.

    ``n_i = floor(N * w_i / sum(w))`` with the largest N for which every ``n_i <= len(part_i)``."""
    total = sum(weights)
    size = min(len(p) * total / w for p, w in zip(parts, weights) if w > 0)
    rng = random.Random(f"mixture/{seed}")
    chosen: list[Problem] = []
    for problems, weight in zip(parts, weights):
        take = min(len(problems), math.floor(size * weight / total + 1e-9))
        chosen += rng.sample(list(problems), take)
    rng.shuffle(chosen)
    if not chosen:
        raise DataError("the mixture drew no problems (all weights round down to 0 rows)")
    return chosen


# ----------------------------------------------------------------------------------------------- what runs read
def training_spec(env: Env, data_root: str | Path, dataset: Any) -> DataSpec | None:
    """The training data of a run; None when the env generates its problems."""
    if dataset is None:
        return None
    return parse_spec(dataset, _domain(env), data_root, "train")


def benchmark_specs(env: Env, data_root: str | Path, benchmark: Any) -> dict[str, DataSpec | None]:
    """Validation sets by label (None: the env's own test split). ``[]`` = the env's test split if it has one."""
    entries = benchmark_entries(benchmark)
    if not entries:
        return {PROCEDURAL: None} if generates_problems(env) else {}
    specs: dict[str, DataSpec | None] = {}
    for entry in entries:
        spec = None if entry == PROCEDURAL else parse_spec(entry, _domain(env), data_root, "test")
        label = PROCEDURAL if spec is None else spec.label
        if label in specs:
            raise DataError(f"env.benchmark lists {label!r} twice (entries {entries})")
        specs[label] = spec
    return specs


def training_problems(env: Env, data_root: str | Path, dataset: Any, seed: int = 0) -> list[Problem]:
    spec = training_spec(env, data_root, dataset)
    if spec is None:
        if not generates_problems(env):
            raise _no_training_data(env)
        return list(env.procedural_problems("train", PROCEDURAL_TRAIN_SIZE))
    return spec.load(seed, fields_of(env, _domain(env)))


def benchmark_problems(env: Env, data_root: str | Path, benchmark: Any, limit: int = 0) -> list[Problem]:
    """The first ``limit`` problems (0 = all) of one benchmark; "procedural" uses the env's own test split."""
    if benchmark in ("", PROCEDURAL):
        return list(env.procedural_problems("test", limit or PROCEDURAL_TEST_SIZE))
    problems = parse_spec(benchmark, _domain(env), data_root, "test").load(fields=fields_of(env, _domain(env)))
    return problems[:limit] if limit > 0 else problems


def benchmark_label(entry: Any) -> str:
    """The key a benchmark entry is reported under: a name, a file's stem, a hub id's last part, ``a+b`` for a
    mixture."""
    if entry in ("", PROCEDURAL):
        return PROCEDURAL
    return parse_spec(entry, "misc", ".", "test").label


def benchmark_sets(env: Env, data_root: str | Path, benchmark: Any, limit: int = 0) -> dict[str, list[Problem]]:
    """Every validation set of ``env.benchmark`` by label, each cut to its first ``limit`` problems (0 = all)."""
    out = {}
    for label, spec in benchmark_specs(env, data_root, benchmark).items():
        if spec is None:
            out[label] = list(env.procedural_problems("test", limit or PROCEDURAL_TEST_SIZE))
        else:
            problems = spec.load(fields=fields_of(env, _domain(env)))
            out[label] = problems[:limit] if limit > 0 else problems
    return out


def shared_problems(training: Sequence[Problem], benchmarks: Mapping[str, Sequence[Problem]]) -> dict[str, list[str]]:
    """Per validation set, the problem ids it shares with the training problems (the first 5 of each): validation
    that scores tasks the policy trains on measures memory, not skill. Empty when every set is disjoint."""
    trained = {p.problem_id for p in training}
    out = {}
    for label, problems in benchmarks.items():
        shared = [p.problem_id for p in problems if p.problem_id in trained]
        if shared:
            out[label] = shared[:5] + ([f"... {len(shared)} in all"] if len(shared) > 5 else [])
    return out


def check_disjoint(env: Env, training: Sequence[Problem], benchmarks: Mapping[str, Sequence[Problem]]) -> list[str]:
    """Refuse an env whose own "test" split shares task ids with its "train" split (``procedural_problems`` promises
    disjoint splits: an agent program's ``tasks`` too); returns a warning for each file or hub set that shares ids
    with the training data (training and validating on one file may be meant, and is said)."""
    warnings = []
    for label, ids in shared_problems(training, benchmarks).items():
        if label == PROCEDURAL:
            raise DataError(f"{type(env).__name__}.procedural_problems: the 'test' split shares task ids with "
                            f"'train' ({', '.join(ids)}), so validation would score tasks the run trains on; make "
                            f"the splits disjoint (check-env checks the same counts)")
        warnings.append(f"validation set {label!r} shares problem ids with the training data ({', '.join(ids)}): "
                        f"its scores include problems the run trains on")
    return warnings


class DataProblems(DataError):
    """Several data problems found at once (each set is checked whatever the others hold): ``problems``."""

    def __init__(self, problems: Sequence[DataError]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = list(problems)


def describe_data(env: Env, data_root: str | Path, dataset: Any, benchmark: Any, batch_size: int = 0,
                  max_val_problems: int = 0) -> list[str]:
    """Where a run's problems come from (``--dry-run``), reading every row of every local file and checking it as
    the run will (hub datasets are read at start-up), with a warning line when a local training set holds fewer
    problems than a step's ``batch_size``. Every set is checked: one DataError, or DataProblems for several."""
    lines: list[str] = []
    problems: list[DataError] = []
    try:
        lines += _describe_training(env, data_root, dataset, batch_size)
    except DataError as exc:
        problems.append(exc)
    entries = benchmark_entries(benchmark)
    labels: list[str] = []
    for group in [[entry] for entry in entries] or [entries]:  # one entry at a time: a missing one hides no other
        try:
            for label, bench in benchmark_specs(env, data_root, group).items():
                if label in labels:
                    raise DataError(f"env.benchmark lists {label!r} twice (entries {entries})")
                labels.append(label)
                lines.append(_describe_benchmark(env, label, bench, max_val_problems))
        except DataError as exc:
            problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise DataProblems(problems)
    return lines


def _describe_training(env: Env, data_root: str | Path, dataset: Any, batch_size: int) -> list[str]:
    spec = training_spec(env, data_root, dataset)
    if spec is None:
        if not generates_problems(env):
            raise _no_training_data(env)
        return [f"train:    generated by {type(env).__name__}.procedural_problems('train', n)"]
    rows = _verify_local(spec, env)
    lines = [f"train:    {spec.describe()}"]
    if _local(spec) and 0 < rows < batch_size:
        lines.append(f"warning:  training.train_batch_size={batch_size} is more than the training set's {rows} "
                     f"problems: every step holds some problems more than once")
    return lines


def _describe_benchmark(env: Env, label: str, bench: DataSpec | None, max_val_problems: int) -> str:
    if bench is None:
        count = max_val_problems or PROCEDURAL_TEST_SIZE
        return f"validate: {label}: generated by {type(env).__name__}.procedural_problems('test', {count})"
    rows = _verify_local(bench, env)
    first = (f", validation reads its first {max_val_problems} (env.max_val_problems)"
             if 0 < max_val_problems < rows else "")
    return f"validate: {label}: {bench.describe()}{first}"


def preview_problems(env: Env, data_root: str | Path, dataset: Any, benchmark: Any, train_limit: int,
                     max_val_problems: int = 0) -> tuple[list[Problem], dict[str, list[Problem]]]:
    """(the first ``train_limit`` training problems, each benchmark's problems as validation reads them) for the
    dry run's prompt check; sets that read a hub dataset are left out (they are read at start-up)."""
    spec = training_spec(env, data_root, dataset)
    if spec is None:
        training = list(env.procedural_problems("train", train_limit)) if generates_problems(env) else []
    else:
        training = spec.load(fields=fields_of(env, _domain(env)))[:train_limit] if _local(spec) else []
    benchmarks = {}
    for label, bench in benchmark_specs(env, data_root, benchmark).items():
        if bench is None:
            benchmarks[label] = list(env.procedural_problems("test", max_val_problems or PROCEDURAL_TEST_SIZE))
        elif _local(bench):
            problems = bench.load(fields=fields_of(env, _domain(env)))
            benchmarks[label] = problems[:max_val_problems] if max_val_problems > 0 else problems
    return training, benchmarks


def _local(spec: DataSpec) -> bool:
    return all(part.kind != "hub" for part in spec.parts)


def _verify_local(spec: DataSpec, env: Env) -> int:
    """Check ``spec`` and read every row of its local parts as the run will; returns how many problems they hold."""
    spec.check()
    return sum(len(part.load(fields_of(env, part.domain))) for part in spec.parts if part.kind != "hub")


def _no_training_data(env: Env) -> DataError:
    name = type(env).__name__
    hint = ("a name of the data tree, a .parquet/.jsonl file or a hub id (docs/datasets.md)"
            if _domain(env) != "misc" else "a .parquet/.jsonl file with one row per problem, or a hub id")
    return DataError(f"env.dataset is unset, so the env must generate its training problems, but {name} does not "
                     f"implement procedural_problems(split, count). Either set env.dataset to {hint}, or implement "
                     f"{name}.procedural_problems (see docs/custom_env.md, 'Where problems come from')")


def generates_problems(env: Env) -> bool:
    """Whether the env makes its own problems (overrides ``Env.procedural_problems``)."""
    try:
        env.procedural_problems("test", 1)
    except DataError:
        return False
    return True


def load_problems(path: Path, domain: str, name: str) -> list[Problem]:
    """Rows of one data-tree parquet file as problems (``id`` column, else ``<name>/<row>``)."""
    return DataSource("name", name, name, domain, path.parent.name, Path(path)).load()


# ----------------------------------------------------------------------------------------------- reading
def _read_file(path: Path) -> list[dict[str, Any]]:
    if path.stat().st_size == 0:
        raise DataError(f"dataset file {path} is empty (0 bytes): write it again (a .parquet table or .jsonl rows)")
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises its own error types
            raise DataError(f"cannot read parquet file {path}: {exc}") from exc
        refuse_huge_cells(table, f"dataset file {path}")
        return table.to_pylist()
    from pettingllms.data.sources import read_local

    return read_local(path)


def _read_hub(source: DataSource) -> list[dict[str, Any]]:
    """``datasets.load_dataset(id, split=...)``: the hub (or its cache), or a local dataset folder of that name."""
    import datasets

    from pettingllms.data.catalog import hub_source
    from pettingllms.data.sources import convert_rows

    known = hub_source(source.domain, source.spec, source.split)
    try:
        table = datasets.load_dataset(source.spec, known.config if known else None, split=source.split)
    except Exception as exc:  # datasets raises many types (connection, missing split, missing files)
        raise DataError(
            f"cannot load hub dataset {source.spec!r} (split {source.split!r}): {type(exc).__name__}: "
            f"{str(exc)[:300]}. Without a network, give a local file instead (a .parquet/.jsonl path), or make it "
            f"once where a network exists (docs/datasets.md)") from exc
    refuse_huge_cells(table.data.table, f"hub dataset {source.spec!r} (split {source.split!r})")
    rows = [dict(row) for row in table]
    return convert_rows(known, rows) if known is not None else rows


def _convert_hint(domain: str) -> str:
    from pettingllms.data.catalog import loader_script

    script = loader_script(domain)
    if script is None:
        return "Give the env the columns it reads (docs/datasets.md)"
    return f"Convert the file with python {script} --from-file FILE --name NAME [--format SOURCE] (docs/datasets.md)"


def _row_count(path: Path) -> int | None:
    try:
        import pyarrow.parquet as pq

        return pq.read_metadata(path).num_rows
    except Exception:  # only for the description; load() reports a broken file properly
        return None


def benchmark_entries(benchmark: Any) -> list[Any]:
    if benchmark is None or benchmark == "":
        return []
    if isinstance(benchmark, (list, tuple)):
        return list(benchmark)
    return [benchmark]  # one name/file/hub id, or one mixture


def _domain(env: Env) -> str:
    return getattr(env, "domain", "misc")


def _key(split: str) -> str:
    return "env.dataset" if split == "train" else "env.benchmark"


def _label(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", text) or "data"
