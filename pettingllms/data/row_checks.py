"""Every row of a dataset checked against the columns its env reads, before step 1 (and in ``--dry-run``).

An env declares them in ``Env.problem_fields`` (``{"question": str, "answer": str}``; ``list[str]`` for a list of
strings). An env without the declaration gets the columns the domain's loader writes (``catalog.required_columns``),
of any type. A value is never converted: an int where a str is declared is an error naming the file, the row
(counted from 0, as problem ids ``<label>/<row>`` are) and the column, so a wrong column is fixed in the data instead
of being trained on as ``str(value)``.
"""

from __future__ import annotations

import typing
from typing import Any, Mapping, Sequence

from pettingllms.core import DataError, Env

Fields = Mapping[str, Any]  # column -> type (str, int, float, bool, list[str], object = any)


def fields_of(env: Env | None, domain: str) -> Fields:
    """The columns every row needs: the env's ``problem_fields``, else its domain loader's (any type)."""
    declared = getattr(env, "problem_fields", None)
    if declared is not None:
        return dict(declared)
    from pettingllms.data.catalog import required_columns

    return {column: object for column in required_columns(domain)}


def check_rows(rows: Sequence[Any], fields: Fields, where: str, reader: str, fix: str = "") -> None:
    """Raise DataError for zero rows, a row that is not a record, a missing column, a null or a wrongly typed value.

    where: the file (or hub dataset) the rows come from; reader: who reads the columns ("math envs");
    fix: a sentence on how to convert a file that lacks columns."""
    if not rows:
        raise DataError(f"dataset {where} has zero rows: a training or validation set needs at least one problem")
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataError(f"dataset {where}: row {index} is a {type(row).__name__}, not a record of columns")
        missing = [column for column in fields if column not in row]
        if missing:
            raise DataError(f"dataset {where}: rows lack column(s) {missing} that {reader} read; they have "
                            f"{sorted(row)}" + (f" (first at row {index})" if index else "") + (f". {fix}" if fix else ""))
        for column, kind in fields.items():
            value = row[column]
            if value is None:
                raise DataError(f"dataset {where}: row {index}, column {column!r} is null; {reader} need a value in "
                                f"every row (fill it, or drop the row)")
            if not matches(value, kind):
                raise DataError(f"dataset {where}: row {index}, column {column!r} holds {type(value).__name__} "
                                f"{_short(value)}, but {reader} read {describe(kind)}; values are not converted, so "
                                f"write the column as {describe(kind)}")
            if kind is str and not value.strip():
                raise DataError(f"dataset {where}: row {index}, column {column!r} is an empty string; {reader} need "
                                f"a value in every row")


def matches(value: Any, kind: Any) -> bool:
    """Whether ``value`` is of the declared ``kind`` (bool is not an int; an int is a float)."""
    if kind is object or kind is Any:
        return True
    if typing.get_origin(kind) in (list, tuple, Sequence):
        (item,) = typing.get_args(kind) or (object,)
        return isinstance(value, (list, tuple)) and all(matches(v, item) for v in value)
    if kind in (list, tuple):
        return isinstance(value, (list, tuple))
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def describe(kind: Any) -> str:
    if typing.get_origin(kind) is not None:
        return f"{typing.get_origin(kind).__name__} of {describe(typing.get_args(kind)[0])}"
    return getattr(kind, "__name__", str(kind))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
