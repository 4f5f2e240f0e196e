"""A dataset's cells checked for size in Arrow, before any row becomes Python objects.

A 4.7 MB parquet file can hold a 100 MB string (it compresses); turned into rows and then tokenised, such a cell took
minutes and 8.7 GB before the prompt-length check refused it. Here every string and binary value (in lists too) is
measured on the Arrow table, which holds it once, and a cell over ``MAX_CELL_BYTES`` is refused in a second naming
the column (and the row, outside lists).
"""

from __future__ import annotations

from typing import Any

from pettingllms.core import DataError

# No problem a model can be prompted with comes near it (a 1M-token context is about 4 MB of text); code datasets'
# test inputs, the largest cells of the domains here, stay under 1 MB.
MAX_CELL_BYTES = 16 * 2**20


def refuse_huge_cells(table: Any, where: str, limit: int = MAX_CELL_BYTES) -> None:
    """Raise DataError when a string or binary value of the pyarrow ``table`` is longer than ``limit`` bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, column in zip(table.column_names, table.columns):
        values, kind, nested = column, column.type, False
        while pa.types.is_list(kind) or pa.types.is_large_list(kind):
            values, kind, nested = pc.list_flatten(values), kind.value_type, True
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
                or pa.types.is_large_binary(kind)):
            continue
        lengths = pc.binary_length(values)
        biggest = pc.max(lengths).as_py()
        if biggest is None or biggest <= limit:
            continue
        row = "" if nested else f", row {pc.index(lengths, biggest).as_py()}"
        raise DataError(f"{where}: column {name!r}{row} holds a value of {biggest:,} bytes, over the limit of "
                        f"{limit:,} bytes per cell; no prompt is that long: fix or drop that row")
