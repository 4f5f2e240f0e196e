"""A dataset cell too large for any prompt is refused in the Arrow table, in seconds and bounded memory, before rows
become Python objects (a 4.7 MB parquet file holding a 100 MB string once took minutes and 8.7 GB)."""

from __future__ import annotations

import json
import resource
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pettingllms.core import DataError
from pettingllms.data.cell_sizes import MAX_CELL_BYTES, refuse_huge_cells
from pettingllms.data.problems import _read_file


def test_a_compressed_huge_string_is_refused_fast_naming_column_and_row(tmp_path):
    path = tmp_path / "bomb.parquet"
    huge = "a" * (100 * 2**20)
    pq.write_table(pa.table({"question": ["What is 1+1?", huge], "answer": ["2", "2"]}), path, compression="zstd")
    assert path.stat().st_size < 2**20  # it compresses to almost nothing
    del huge
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"column 'question', row 1 holds a value of 104,857,600 bytes, over the limit"):
        _read_file(path)
    assert time.perf_counter() - start < 10
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 600  # the Arrow column once (100 MiB) and its lengths, no Python copies or tokens


def test_lists_and_jsonl_files_are_checked_too_and_ordinary_cells_pass(tmp_path):
    table = pa.table({"tests": [["assert f(1) == 1"], ["x" * 64]], "id": ["a", "b"]})
    refuse_huge_cells(table, "small")  # passes
    with pytest.raises(DataError, match=r"column 'tests' holds a value of 64 bytes, over the limit of 32"):
        refuse_huge_cells(table, "small", limit=32)
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "q" * (MAX_CELL_BYTES + 1), "answer": "1"}) + "\n")
    with pytest.raises(DataError, match=r"local data file .*rows.jsonl: column 'question'"):
        _read_file(path)
