"""The command line shared by ``scripts/dataprocess/load_math.py`` and ``load_code.py``.

One run: load each ``--sources`` entry (hub, offline generator or special offline source), optionally convert
a local ``--from-file``, build a ``--mix``, then decontaminate the training files it wrote against every test
file of the domain. Errors name the source and what to do.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pettingllms.core.errors import DataError
from pettingllms.data.sources import (
    HubSource, ProceduralSource, Row, convert_rows, decontaminate_root, mix, dataset_path,
    parse_weights, read_hub, read_local, read_written, write_rows,
)

# (rows, args) -> rows; lets a domain filter a source's rows (e.g. past AIME minus benchmark years)
PostHook = Callable[[str, list[Row], argparse.Namespace], list[Row]]
# args -> {split: rows}; offline sources with their own logic (HumanEval)
SpecialSource = Callable[[argparse.Namespace], Mapping[str, list[Row]]]


@dataclass
class DomainSpec:
    domain: str
    required: tuple[str, ...]
    hub: Mapping[str, HubSource]
    procedural: Mapping[str, ProceduralSource] = field(default_factory=dict)
    special: Mapping[str, SpecialSource] = field(default_factory=dict)
    file_names: Mapping[str, str] = field(default_factory=dict)
    offline_default: tuple[str, ...] = ()
    paper_default: tuple[str, ...] = ()
    post: PostHook | None = None
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None

    def known(self) -> list[str]:
        return sorted({*self.hub, *self.procedural, *self.special})


def build_parser(spec: DomainSpec) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=f"Prepare {spec.domain} datasets under <data-root>/{spec.domain}/{{train,test}}/<name>.parquet "
                    f"(docs/datasets.md). Sources: {', '.join(spec.known())}.")
    parser.add_argument("--data-root", type=Path, default=Path("data"))
    parser.add_argument("--sources", default=None,
                        help=f"comma-separated sources (default: the offline set {','.join(spec.offline_default)})")
    parser.add_argument("--paper", action="store_true",
                        help=f"the paper's sources: {','.join(spec.paper_default)} (needs the hub or --hub-cache)")
    parser.add_argument("--hub-cache", type=Path, default=None,
                        help="read hub sources from DIR/<source>.{parquet,jsonl,json} (raw hub rows) instead of the hub")
    parser.add_argument("--limit", type=int, default=None, help="keep at most N rows per source")
    parser.add_argument("--train-size", type=int, default=2000, help="rows per generated (offline) train set")
    parser.add_argument("--test-size", type=int, default=200, help="rows per generated (offline) test set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--from-file", type=Path, default=None, help="convert a local .parquet/.jsonl/.json file")
    parser.add_argument("--name", default=None, help="output name for --from-file")
    parser.add_argument("--split", choices=("train", "test"), default="train", help="output split for --from-file")
    parser.add_argument("--format", default=None,
                        help="hub source whose raw format --from-file has (default: rows already in our columns)")
    parser.add_argument("--mix", default=None, help="weighted mixture of train sets, e.g. polaris=0.7,dapo_math=0.3")
    parser.add_argument("--mix-name", default="mixture")
    parser.add_argument("--mix-size", type=int, default=1000)
    parser.add_argument("--no-decontaminate", action="store_true")
    parser.add_argument("--ngram", type=int, default=13, help="decontamination n-gram length (tokens)")
    if spec.add_arguments:
        spec.add_arguments(parser)
    return parser


def main(spec: DomainSpec, argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser(spec).parse_args(argv)
    try:
        return run(spec, args)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


def run(spec: DomainSpec, args: argparse.Namespace) -> dict[str, Any]:
    written: dict[str, list[str]] = {"train": [], "test": []}
    counts: dict[str, int] = {}
    names = _requested(spec, args)
    # test sets first, so training sets decontaminate against everything this run produced
    for name in sorted(names, key=lambda n: _split_of(spec, n) != "test"):
        for split, rows in _load_source(spec, name, args).items():
            file_name = spec.file_names.get(name, name)
            write_rows(rows, args.data_root, spec.domain, split, file_name, spec.required)
            written[split].append(file_name)
            counts[f"{split}/{file_name}"] = len(rows)
    if args.from_file is not None:
        split, file_name, n = _load_file(spec, args)
        written[split].append(file_name)
        counts[f"{split}/{file_name}"] = n
    if args.mix:
        file_name, n = _load_mix(spec, args)
        written["train"].append(file_name)
        counts[f"train/{file_name}"] = n
    removed = {}
    if not args.no_decontaminate and written["train"]:
        # procedural (templated) rows are matched exactly only; see sources.decontaminate
        removed = decontaminate_root(args.data_root, spec.domain, dict.fromkeys(written["train"]), n=args.ngram,
                                     exact_only_sources=set(spec.procedural))
        for file_name, n in removed.items():
            counts[f"train/{file_name}"] -= n
    for key, n in counts.items():
        note = f" ({removed[key[6:]]} removed by decontamination)" if key.startswith("train/") and removed.get(key[6:]) else ""
        print(f"wrote {dataset_path(args.data_root, spec.domain, *key.split('/'))}: {n} rows{note}")
    return {"counts": counts, "removed": removed}


def _requested(spec: DomainSpec, args: argparse.Namespace) -> list[str]:
    if args.sources:
        names = [n.strip() for n in args.sources.split(",") if n.strip()]
    elif args.paper:
        names = list(spec.paper_default)
    elif args.from_file is not None or args.mix:
        names = []
    else:
        names = list(spec.offline_default)
    unknown = [n for n in names if n not in spec.known()]
    if unknown:
        raise DataError(f"unknown {spec.domain} source(s) {unknown}; known: {spec.known()}")
    return names


def _split_of(spec: DomainSpec, name: str) -> str:
    return spec.hub[name].split if name in spec.hub else "both"


def _load_source(spec: DomainSpec, name: str, args: argparse.Namespace) -> Mapping[str, list[Row]]:
    if name in spec.special:
        out = spec.special[name](args)
    elif name in spec.procedural:
        source = spec.procedural[name]
        sizes = {"train": args.train_size, "test": args.test_size}
        out = {split: source.generate(split, _capped(sizes[split], args.limit), args.seed) for split in source.splits}
    else:
        source = spec.hub[name]
        rows = convert_rows(source, read_hub(source, args.hub_cache), args.limit)
        out = {source.split: rows}
    if spec.post:
        out = {split: spec.post(name, rows, args) for split, rows in out.items()}
    empty = [split for split, rows in out.items() if not rows]
    if empty:
        raise DataError(f"source {name!r} produced no rows for split(s) {empty}")
    return out


def _capped(size: int, limit: int | None) -> int:
    return size if limit is None else min(size, limit)


def _load_file(spec: DomainSpec, args: argparse.Namespace) -> tuple[str, str, int]:
    if not args.name:
        raise DataError("--from-file needs --name (the output file name)")
    raw = read_local(args.from_file)
    if args.format:
        if args.format not in spec.hub:
            raise DataError(f"--format {args.format!r} is not a {spec.domain} hub source; known: {sorted(spec.hub)}")
        rows = convert_rows(spec.hub[args.format], raw, args.limit)
    else:
        rows = [dict(row, id=row.get("id") or f"{args.name}/{i}") for i, row in enumerate(raw)][: args.limit]
        missing = [c for c in spec.required if c != "id" and raw and c not in raw[0]]
        if missing:
            raise DataError(f"{args.from_file} lacks column(s) {missing}; it has {sorted(raw[0]) if raw else []}. "
                            f"Pass --format <source> if it holds raw rows of a known source.")
    if spec.post:
        rows = spec.post(args.format or args.name, rows, args)
    write_rows(rows, args.data_root, spec.domain, args.split, args.name, spec.required)
    return args.split, args.name, len(rows)


def _load_mix(spec: DomainSpec, args: argparse.Namespace) -> tuple[str, int]:
    weights = parse_weights(args.mix)
    loaded = {}
    for name in weights:
        path = dataset_path(args.data_root, spec.domain, "train", name)
        if not path.is_file():
            raise DataError(f"mixture part {name!r}: {path} does not exist; load it first (--sources {name})")
        loaded[name] = read_written(path)
    rows = mix(loaded, weights, args.mix_size, args.seed)
    write_rows(rows, args.data_root, spec.domain, "train", args.mix_name, spec.required)
    return args.mix_name, len(rows)

