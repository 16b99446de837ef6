"""One INSERT statement fed batch by batch while its rows are still being read.

Why: a direct load (one process reading a file into the database) ran the events' INSERTs on its
main thread, ~1.6 of a 6M-event file's ~2.6 s, between the Python work of gathering the rows; a
second thread decoded. With the statement in a helper thread of its own, reading the rows as an
Arrow stream, DuckDB inserts while the main thread gathers the next rows: 2.0-2.2 s
(benchmarks/results/bench_ingest.md). DuckDB releases the GIL while it works. The caller ``put``s
Arrow batches and ``close`` ends the stream and waits for the statement.

A connection runs one statement at a time: ``close`` before anything else uses it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

# Batches handed over ahead of the statement: DuckDB seldom waited for the loader with 2 (a 6M-event
# file: as fast as with 4, and 8-15 MB less peak RSS); each holds ~4 MB at 65,536 event rows.
STREAM_DEPTH = 2
_WAIT_S = 0.05  # how often a blocked put or close checks that the statement still runs


def arrow_batch(
    columns: dict[str, np.ndarray],
    valid: dict[str, np.ndarray] | None = None,
    dictionaries: dict[str, list[str]] | None = None,
) -> pa.RecordBatch:
    """1-D numpy columns (numbers or booleans) as an Arrow batch, sharing the numbers' memory.
    ``valid[name]``: which of that column's values are set (the others are NULL);
    ``dictionaries[name]``: that column holds int32 codes into these strings.

    Built from buffers: ``pyarrow.array`` imports pandas on first use (~0.2 s of a one-file ingest)."""
    valid, dictionaries = valid or {}, dictionaries or {}
    arrays = []
    for name, values in columns.items():
        values = np.ascontiguousarray(values)
        n = len(values)
        mask = valid.get(name)
        bitmap = None if mask is None or mask.all() else _bits(mask)
        if values.dtype == np.bool_:
            array = pa.Array.from_buffers(pa.bool_(), n, [bitmap, _bits(values)])
        else:
            kind = pa.from_numpy_dtype(values.dtype)
            array = pa.Array.from_buffers(kind, n, [bitmap, pa.py_buffer(values)])
        if name in dictionaries:
            array = pa.DictionaryArray.from_arrays(array, _strings(dictionaries[name]))
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, names=list(columns))


def _bits(flags: np.ndarray) -> pa.Buffer:
    """Booleans as Arrow's bitmap (least significant bit first)."""
    return pa.py_buffer(np.packbits(flags, bitorder="little"))


def _strings(values: list[str]) -> pa.Array:
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(encoded), buffers)


class StreamedInsert:
    """``sql`` (reading the relation ``stg_rows``) run in a helper thread over the batches given to
    ``put``, all of ``schema``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any], schema: pa.Schema,
                 depth: int = STREAM_DEPTH) -> None:
        self.schema = schema
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._con = con
        reader = pa.RecordBatchReader.from_batches(schema, self._batches())
        self._thread = threading.Thread(target=self._run, args=(sql, params, reader),
                                        name="tpuanalyze-insert", daemon=True)
        self._thread.start()

    def put(self, batch: pa.RecordBatch) -> None:
        """Hand ``batch`` to the statement (waits while ``depth`` batches are ahead); raises the
        statement's error if it failed."""
        if batch.schema != self.schema:
            batch = batch.cast(self.schema)
        while True:
            if not self._thread.is_alive():
                self.close()  # it ended early: a failure, raised here
                raise RuntimeError("the streamed insert ended before its rows")
            try:
                self._queue.put(batch, timeout=_WAIT_S)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """End the stream after the batches given, wait for the statement, and raise its error."""
        self._end()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def abort(self) -> None:
        """End the statement (the caller is failing: its own error wins, the statement's is dropped)."""
        try:
            self._end()
        finally:
            self._error = None

    def _end(self) -> None:
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=_WAIT_S)
                break
            except queue.Full:
                continue
        self._thread.join()

    def _batches(self) -> Iterator[pa.RecordBatch]:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            yield batch

    def _run(self, sql: str, params: dict[str, Any], reader: pa.RecordBatchReader) -> None:
        stg_rows = reader  # noqa: F841  (DuckDB's replacement scan finds it in this frame)
        try:
            self._con.execute(sql, params)
        except BaseException as exc:  # raised in the caller's thread by put or close
            self._error = exc
