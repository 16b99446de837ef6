"""The events' INSERT of a direct load, fed as an Arrow stream from a helper thread (store/streamed.py).

What must hold: the batches' values reach DuckDB as they were (NULL where unset, the host strings
of the codes), the rows in the order given; a failing statement raises in the caller's thread, at
the next ``put`` or at ``close``, and leaves the connection usable for the rollback; ``abort``
ends the statement whatever its state. A one-file ingest that streams does not import pandas
(``pyarrow.array`` would: ~0.2 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tpuanalyze.store.streamed import StreamedInsert, arrow_batch

DTYPES = [np.int32, np.int64, np.uint64, np.float64, np.bool_]


@st.composite
def _columns(draw: st.DrawFn) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[str]]:
    n = draw(st.integers(0, 300))
    columns: dict[str, np.ndarray] = {}
    valid: dict[str, np.ndarray] = {}
    for i, dtype in enumerate(DTYPES):
        if dtype is np.bool_:
            values = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
        elif dtype is np.float64:
            floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
            values = np.array(draw(st.lists(floats, min_size=n, max_size=n)), dtype=dtype)
        else:
            info = np.iinfo(dtype)
            ints = st.integers(int(info.min), int(info.max))
            values = np.array(draw(st.lists(ints, min_size=n, max_size=n)), dtype=dtype)
        columns[f"c{i}"] = values
        if draw(st.booleans()):
            valid[f"c{i}"] = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    hosts = draw(st.lists(st.text(max_size=12), min_size=1, max_size=4))
    columns["host"] = np.array(draw(st.lists(st.integers(0, len(hosts) - 1), min_size=n, max_size=n)),
                               dtype=np.int32)
    return columns, valid, hosts


@settings(max_examples=60, deadline=None)
@given(_columns())
def test_a_batch_reads_back_as_its_values_nulls_and_host_strings(
    drawn: tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[str]],
) -> None:
    columns, valid, hosts = drawn
    # slices of a longer array: what the loader hands over (views, not copies)
    sliced = {name: np.concatenate([values, values])[len(values):] for name, values in columns.items()}
    batch = arrow_batch(sliced, valid, {"host": hosts})
    stg = batch  # noqa: F841
    got = duckdb.connect().execute("SELECT * FROM stg").fetchall()
    n = len(columns["host"])
    expected = []
    for row in range(n):
        out = []
        for name, values in columns.items():
            if name == "host":
                out.append(hosts[values[row]])
            elif name in valid and not valid[name][row]:
                out.append(None)
            else:
                out.append(values[row].item())
        expected.append(tuple(out))
    assert got == expected


def _con(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    con.execute("CREATE TABLE t (i BIGINT NOT NULL, host VARCHAR)")
    return con


def _batch(start: int, n: int, valid: bool = True) -> pa.RecordBatch:
    values = np.arange(start, start + n, dtype=np.int64)
    ok = {} if valid else {"i": np.arange(n) != n // 2}
    return arrow_batch({"i": values, "host": np.zeros(n, np.int32)}, ok, {"host": ["h"]})


INSERT = "INSERT INTO t SELECT i, host FROM stg_rows"


def test_the_batches_go_in_in_order_by_one_statement(tmp_path: Path) -> None:
    con = _con(tmp_path)
    con.execute("BEGIN")
    stream = StreamedInsert(con, INSERT, {}, _batch(0, 1).schema)
    for start in range(0, 50_000, 5_000):
        stream.put(_batch(start, 5_000))
    stream.close()
    con.execute("COMMIT")
    rows = [r[0] for r in con.execute("SELECT i FROM t ORDER BY rowid").fetchall()]
    assert rows == list(range(50_000))
    assert con.execute("SELECT DISTINCT host FROM t").fetchall() == [("h",)]


def test_a_failing_statement_raises_in_the_caller_and_the_rollback_goes_through(tmp_path: Path) -> None:
    con = _con(tmp_path)
    con.execute("INSERT INTO t VALUES (-1, 'before')")
    con.execute("BEGIN")
    stream = StreamedInsert(con, INSERT, {}, _batch(0, 1).schema)
    stream.put(_batch(0, 1_000))
    with pytest.raises(duckdb.ConstraintException):
        stream.put(_batch(1_000, 1_000, valid=False))  # a NULL into NOT NULL
        for start in range(2_000, 200_000, 1_000):  # raised by a later put, or by close
            stream.put(_batch(start, 1_000))
        stream.close()
    con.execute("ROLLBACK")
    assert con.execute("SELECT * FROM t").fetchall() == [(-1, "before")]


def test_abort_ends_a_waiting_statement_and_drops_its_error(tmp_path: Path) -> None:
    con = _con(tmp_path)
    con.execute("BEGIN")
    stream = StreamedInsert(con, INSERT, {}, _batch(0, 1).schema)
    stream.put(_batch(0, 10))
    stream.abort()  # the statement was waiting for more batches
    con.execute("ROLLBACK")
    con.execute("BEGIN")
    failing = StreamedInsert(con, INSERT, {}, _batch(0, 1).schema)
    failing.put(_batch(0, 10, valid=False))
    failing.abort()  # its constraint error is the caller's to ignore
    con.execute("ROLLBACK")  # (the failed statement left an aborted transaction)
    assert con.execute("SELECT count(*) FROM t").fetchall() == [(0,)]


def test_a_streamed_one_file_ingest_does_not_import_pandas(tmp_path: Path, sample_traces: Path) -> None:
    """The stream starts at a few hundred events here (the real threshold: 131,072); the JAX capture
    has ~10K. pyarrow is loaded (the stream), pandas is not."""
    capture = next((sample_traces / "jax_cpu").rglob("*.xplane.pb"))
    code = f"""
import sys
from tpuanalyze.store import load, streamed
load.FLUSH_EVENTS, load.STREAM_BATCH_ROWS = 500, 256
used = []
real = streamed.StreamedInsert.__init__
def init(self, *a, **k):
    used.append(1)
    real(self, *a, **k)
streamed.StreamedInsert.__init__ = init
from tpuanalyze.pipeline import ingest_paths
summary = ingest_paths([{str(capture)!r}], {str(tmp_path / "db.duckdb")!r}, workers=1)
print(summary.events, len(used), "pyarrow" in sys.modules, "pandas" in sys.modules)
"""
    env = {**os.environ, "TPUANALYZE_DIRECT_LOAD": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    events, streams, arrow, pandas = out.stdout.split()
    assert int(events) > 1_000 and int(streams) >= 1
    assert (arrow, pandas) == ("True", "False")


def test_the_streamed_rows_refuse_an_expression_they_do_not_evaluate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The streamed rows evaluate event_rows' SELECT expressions in numpy (store/load.py): a new kind of
    expression there must not pass unnoticed (the rows would differ from the parts')."""
    from tpuanalyze.store import load

    load._check_stored_forms()  # today's expressions: all known
    monkeypatch.setitem(load._EXPRESSIONS["event_rows"], "duration_ps", "duration_ps * 2")
    load._check_stored_forms.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="duration_ps"):
            load._check_stored_forms()
    finally:
        load._check_stored_forms.cache_clear()
