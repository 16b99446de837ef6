"""``tpuanalyze.keys``: the lookup of (host, plane, line) ids gives the same values through its dense
table and its sorted search (sparse, negative or huge ids: never an error), and the op line test is
the SQL form's."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuanalyze import keys
from tpuanalyze.keys import dense_extents, is_op_line, lookup


def _expected(key_cols: list[tuple[int, ...]], values: list[int], id_cols: list[tuple[int, ...]],
              default: int) -> list[int]:
    known = dict(zip(key_cols, values, strict=True))  # (a repeated key: its last value)
    return [known.get(c, default) for c in id_cols]


IDS = st.one_of(st.integers(0, 5), st.integers(-(1 << 62), 1 << 62), st.integers(0, 1 << 30))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), width=st.integers(1, 3))
def test_lookup_is_a_dict_of_columns(data: st.DataObject, width: int) -> None:
    column = st.tuples(*[IDS] * width)
    key_cols = data.draw(st.lists(column, max_size=8))
    key_cols += data.draw(st.lists(st.sampled_from(key_cols), max_size=4)) if key_cols else []
    values = data.draw(st.lists(st.integers(-100, 100), min_size=len(key_cols), max_size=len(key_cols)))
    id_cols = data.draw(st.lists(st.one_of(column, st.sampled_from(key_cols)) if key_cols else column,
                                 max_size=20))
    default = data.draw(st.integers(-5, 5))
    key_array = np.array(key_cols, dtype=np.int64).reshape(-1, width).T
    id_array = np.array(id_cols, dtype=np.int64).reshape(-1, width).T
    want = _expected(key_cols, values, id_cols, default)
    for limit in (None, 0):  # dense where the ids allow it; the sorted search always
        got = lookup(key_array, np.array(values, dtype=np.int64), id_array, default=default, limit=limit)
        assert got.dtype == np.int64
        assert got.tolist() == want


def test_lookup_of_sparse_ids_searches_instead_of_a_dense_table() -> None:
    """Ids whose dense table would be too large (a plane index of 2**40, a negative line): a search."""
    key_array = np.array([[0, 1, 1], [3, 1 << 40, 2], [7, 5, -1]], dtype=np.int64)
    id_array = np.array([[1, 0, 1, 1], [1 << 40, 3, 2, 2], [5, 7, -1, 0]], dtype=np.int64)
    assert dense_extents(id_array) is None
    got = lookup(key_array, np.array([True, True, True]), id_array, default=False)
    assert got.tolist() == [True, True, True, False]
    assert lookup(key_array[:, :0], np.array([], bool), id_array, default=False).tolist() == [False] * 4


def test_dense_extents() -> None:
    assert dense_extents(np.array([[0, 2], [1, 4]])) == (3, 5)
    assert dense_extents(np.array([[0, 2], [1, 4]]), limit=14) is None
    assert dense_extents(np.array([[0, -1], [1, 4]])) is None
    assert dense_extents(np.zeros((3, 0), np.int64)) == (1, 1, 1)
    assert keys.DENSE_LOOKUP_LIMIT == 1 << 24


PLANES = ["/device:TPU:0", "/device:GPU:3", "/device:CPU:0", "/host:CPU", "/device:TPU", None, ""]
LINES = ["XLA Ops", "Async XLA Ops", "Stream #1(compute)", "Stream #", "XLA Modules", "Steps", "stream #1",
         "XLA Ops ", None, ""]


def test_is_op_line_is_the_sql_forms() -> None:
    from tpuanalyze.analyzer.op_kinds import OP_LINES_SQL

    con = duckdb.connect()
    pairs = [(p, line) for p in PLANES for line in LINES]
    con.execute("CREATE TABLE t (i INTEGER, plane VARCHAR, line VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, p, line) for i, (p, line) in enumerate(pairs)])
    sql = OP_LINES_SQL.replace("p.name", "plane").replace("l.name", "line")
    chosen = {i for (i,) in con.execute(f"SELECT i FROM t WHERE {sql}").fetchall()}
    assert chosen == {i for i, (p, line) in enumerate(pairs) if is_op_line(p, line)}
    assert is_op_line("/device:GPU:0", "Stream #7") and not is_op_line("/device:CPU:0", "XLA Ops")


@pytest.mark.parametrize("dtype", [bool, np.int8, np.int64])
def test_lookup_keeps_the_values_dtype(dtype: type) -> None:
    got = lookup(np.array([[0], [1]]), np.array([1], dtype=dtype), np.array([[0, 0], [1, 0]]))
    assert got.dtype == np.dtype(dtype)
    assert got.tolist() == [1, 0]
