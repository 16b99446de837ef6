"""Bulk-load one host into the public relations from numpy columns (never row by row): the loader
each per-host map task runs into its own DuckDB (store/parts.py).

Each event batch a reader yields, and the planes, lines and event metadata of a few planes at a
time, reach DuckDB as numpy arrays read by a replacement scan (the arrays are local variables of
``_run_with``) and are copied with one ``INSERT ... SELECT``; the run/host-level constants (run_id,
host, plane index, time shift to the run's t0) are bound parameters of that statement. An event
batch's own stats arrive as a long table: numpy turns it into the typed columns, SQL into the
``stats`` JSON of the rest.

Why replacement scans, not ``register``: DuckDB keeps every object registered inside a
transaction alive until COMMIT (the unregistered view stays visible to the open transaction), so
registering each batch held all of a host's batches in memory at once; a replacement scan's
arrays are freed when the statement ends (benchmarks/results/ingest_memory.md).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
from tpuanalyze.parsers.staging import (
    STAT_DOUBLE,
    STAT_INT,
    STAT_JSON,
    STAT_TEXT,
    STAT_UINT,
    TYPED_COLUMNS,
    TYPED_STATS,
    Columns,
    EventBatch,
    HostReader,
    PlaneData,
    PlaneInfo,
    nullable_columns,
    text_column,
)


def _value(column: str, kind: str) -> str:
    """SELECT expression of a loader column: nullable numbers come with a ``__ok`` mask."""
    if kind == "str":
        return f"CAST({column} AS VARCHAR)"
    return f"CASE WHEN {column}__ok THEN {column} END"


_TYPED = ", ".join(c for c, _ in TYPED_COLUMNS)
# An event's own typed values: step_num and group_id (common per event) in event_rows, the rest
# in event_details (schema.sql says why event_rows stays narrow).
ROW_TYPED = [(c, k) for c, k in TYPED_COLUMNS if c in ("step_num", "group_id")]
DETAIL_TYPED = [(c, k) for c, k in TYPED_COLUMNS if (c, k) not in ROW_TYPED]
_INSERT_EVENTS_PLAIN = """
INSERT INTO event_rows (run_id, host, plane_index, line_index, event_index, metadata_id, start_ps,
                        duration_ps, num_occurrences)
SELECT $run_id, $host, $plane_index, line_index, $first_index + row, metadata_id, start_ps + $shift_ps,
       duration_ps, CASE WHEN num_occurrences__ok THEN num_occurrences END
FROM stg_events
"""


def _stats_json_sql() -> str:
    """Per event (``owner``) of a batch: the JSON object of its stats that are not typed columns,
    in trace order (values as JSON: numbers, strings escaped by to_json, ``STAT_JSON`` text as is)."""
    value_json = (
        f"CASE kind WHEN {STAT_INT} THEN CAST(to_json(i64) AS VARCHAR) "
        f"WHEN {STAT_UINT} THEN CAST(to_json(u64) AS VARCHAR) "
        f"WHEN {STAT_DOUBLE} THEN CAST(to_json(f64) AS VARCHAR) "
        f"WHEN {STAT_TEXT} THEN CAST(to_json(CAST(text AS VARCHAR)) AS VARCHAR) "
        f"WHEN {STAT_JSON} THEN CAST(text AS VARCHAR) ELSE 'null' END"
    )
    return f"""
SELECT owner,
       '{{' || string_agg(CAST(to_json(CAST(key AS VARCHAR)) AS VARCHAR) || ':' || {value_json}, ','
                          ORDER BY seq) || '}}' AS stats
FROM stg_stats GROUP BY owner
"""


_EVENT_STATS_JSON = _stats_json_sql()
_INSERT_EVENTS_WITH_STATS = f"""
INSERT INTO event_rows (run_id, host, plane_index, line_index, event_index, metadata_id, start_ps,
                        duration_ps, num_occurrences, {", ".join(c for c, _ in ROW_TYPED)})
SELECT $run_id, $host, $plane_index, line_index, $first_index + row, metadata_id, start_ps + $shift_ps,
       duration_ps, CASE WHEN num_occurrences__ok THEN num_occurrences END,
       {", ".join(_value(c, k) for c, k in ROW_TYPED)}
FROM stg_events
"""
_INSERT_DETAILS = f"""
INSERT INTO event_details (run_id, host, plane_index, event_index, {", ".join(c for c, _ in DETAIL_TYPED)},
                           stats)
SELECT $run_id, $host, $plane_index, $first_index + owner,
       {", ".join(_value(c, k) for c, k in DETAIL_TYPED)}, CAST(CAST(stats AS VARCHAR) AS JSON)
FROM stg_details
"""
_INSERT_METADATA = f"""
INSERT INTO event_metadata (run_id, host, plane_index, metadata_id, name, display_name, {_TYPED}, stats)
SELECT $run_id, $host, plane_index, metadata_id, CAST(name AS VARCHAR), CAST(display_name AS VARCHAR),
       {", ".join(_value(c, k) for c, k in TYPED_COLUMNS)}, CAST(CAST(stats AS VARCHAR) AS JSON)
FROM stg_metadata
"""
_INSERT_LINES = f"""
INSERT INTO lines (run_id, host, plane_index, line_index, line_id, display_id, name, display_name,
                   timestamp_ns, duration_ps, num_events)
SELECT $run_id, $host, plane_index, {_value("line_index", "int")}, {_value("line_id", "int")},
       {_value("display_id", "int")}, CAST(name AS VARCHAR), CAST(display_name AS VARCHAR),
       {_value("timestamp_ns", "int")}, {_value("duration_ps", "int")}, {_value("num_events", "int")}
FROM stg_lines
"""
_PLANE_COLUMNS = [
    ("plane_id", "int"),
    ("name", "str"),
    ("kind", "str"),
    ("device_ordinal", "int"),
    ("device_type", "str"),
    ("peak_tflops", "double"),
    ("peak_hbm_bw_gbps", "double"),
    ("num_lines", "int"),
    ("num_events", "int"),
    ("stats", "str"),
]
_INSERT_PLANES = f"""
INSERT INTO planes (run_id, host, plane_index, {", ".join(c for c, _ in _PLANE_COLUMNS)})
SELECT $run_id, $host, plane_index, {", ".join(_value(c, k) for c, k in _PLANE_COLUMNS[:-1])},
       CAST(CAST(stats AS VARCHAR) AS JSON)
FROM stg_planes
"""


def _run_with(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: dict[str, Any],
    events: Columns | None = None,
    stats: Columns | None = None,
    lines: Columns | None = None,
    metadata: Columns | None = None,
    details: Columns | None = None,
    planes: Columns | None = None,
) -> duckdb.DuckDBPyConnection:
    """Run ``sql`` with the given numpy tables visible to it as stg_events / stg_stats / ... .

    DuckDB resolves an unknown table name to a local variable of the calling frame holding numpy
    arrays (a replacement scan); the arrays are released when the statement is done.
    """
    stg_events, stg_stats, stg_lines, stg_metadata = events, stats, lines, metadata  # noqa: F841
    stg_details, stg_planes = details, planes  # noqa: F841
    return con.execute(sql, params)


# Stat rows per JSON statement: the ordered string_agg buffers its input, and a batch of Kineto
# events (~8 args each) ran DuckDB's small load buffer out of memory in one piece.
STATS_PIECE_ROWS = 8_192
_INT64_LIMIT = 2.0**63
_UINT64_LIMIT = 2.0**64


def _stats_json(con: duckdb.DuckDBPyConnection, stats: Columns) -> tuple[np.ndarray, np.ndarray]:
    """(owners, JSON text) from ``_EVENT_STATS_JSON``, run in pieces of whole events (<=
    STATS_PIECE_ROWS stat rows, or one event's), so its memory is bounded whatever the events carry."""
    owner = stats["owner"]
    order = np.argsort(owner, kind="stable")  # seq (trace order) is kept within an event
    stats = {name: values[order] for name, values in stats.items()}
    owner = stats["owner"]
    owners: list[np.ndarray] = []
    texts: list[np.ndarray] = []
    start, n = 0, len(owner)
    while start < n:
        end = min(start + STATS_PIECE_ROWS, n)
        if end < n:
            end = int(np.searchsorted(owner, owner[end], side="left"))
            if end <= start:  # one event with more stats than a piece
                end = int(np.searchsorted(owner, owner[start], side="right"))
        piece = {name: values[start:end] for name, values in stats.items()}
        result = _run_with(con, _EVENT_STATS_JSON, {}, stats=piece).fetchnumpy()
        owners.append(np.asarray(result["owner"]))
        texts.append(np.asarray(np.ma.getdata(result["stats"]), dtype=object))
        start = end
    return np.concatenate(owners), np.concatenate(texts)


def _converted(target: str, stats: Columns, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values of stat rows ``rows`` as a typed column of kind ``target``, and which fit.

    SQL's cast rules: a string column takes text and integers (as decimal text); integer columns
    take integers in range and doubles rounded half to even (DuckDB's TRY_CAST); a negative
    int64 in a uint64 column is its two's complement, as protobuf writes it; a double column takes
    any number. Anything else does not fit (and stays in the stats JSON)."""
    kind = stats["kind"][rows]
    i64, u64, f64 = stats["i64"][rows], stats["u64"][rows], stats["f64"][rows]
    is_int, is_uint, is_double = kind == STAT_INT, kind == STAT_UINT, kind == STAT_DOUBLE
    if target == "str":
        values = np.array(stats["text"][rows], dtype=object)
        for mask, numbers in ((is_int, i64), (is_uint, u64)):
            where = np.flatnonzero(mask)
            if len(where):
                values[where] = [str(v) for v in numbers[where].tolist()]
        return values, (kind == STAT_TEXT) | is_int | is_uint
    if target == "double":
        values = np.where(is_double, f64, np.where(is_int, i64.astype(np.float64), u64.astype(np.float64)))
        return values, is_int | is_uint | is_double
    rounded = np.rint(np.where(is_double, f64, 0.0))
    if target == "int":
        double_fits = is_double & (rounded >= -_INT64_LIMIT) & (rounded < _INT64_LIMIT)
        values = np.where(is_int, i64, 0)
        values = np.where(is_uint, u64.astype(np.int64), values)
        values = np.where(double_fits, np.where(double_fits, rounded, 0).astype(np.int64), values)
        return values, is_int | (is_uint & (u64 < np.uint64(2**63))) | double_fits
    double_fits = is_double & (rounded >= 0) & (rounded < _UINT64_LIMIT)
    values = np.where(is_uint, u64, i64.view(np.uint64))
    values = np.where(double_fits, np.where(double_fits, rounded, 0).astype(np.uint64), values)
    return values, is_int | is_uint | double_fits


def _typed_columns(stats: Columns, n: int) -> tuple[Columns, np.ndarray]:
    """Each typed column of the batch's events from their stat rows (numpy), and the mask of stat
    rows that fed no typed column (they go to the stats JSON).

    A stat feeds its column when its value fits (``_converted``); the last such stat of a name
    wins, and where two names feed one column (step_num, iter_num) the first listed wins. Every
    fitting stat of a typed name is kept out of the JSON, as its value is in the column.
    """
    keys, owner = stats["key"], stats["owner"]
    names, codes = np.unique(keys, return_inverse=True)
    codes = codes.reshape(-1)
    code_of = {str(name): i for i, name in enumerate(names.tolist())}
    typed_rows = np.zeros(len(keys), dtype=bool)
    columns: Columns = {}
    for column, kind in TYPED_COLUMNS:
        stat_names = [stat for stat, (target, _) in TYPED_STATS.items() if target == column]
        if kind == "str":
            full = np.full(n, None, dtype=object)
        else:
            full = np.zeros(n, dtype={"double": np.float64, "uint": np.uint64, "int": np.int64}[kind])
        ok = np.zeros(n, dtype=bool)
        for stat in reversed(stat_names):  # lower precedence first: the first listed overwrites
            if stat not in code_of:
                continue
            rows = np.flatnonzero(codes == code_of[stat])
            values, fits = _converted(kind, stats, rows)
            rows, values = rows[fits], values[fits]
            if not len(rows):
                continue
            typed_rows[rows] = True
            backwards = np.arange(len(rows) - 1, -1, -1)
            last = backwards[np.unique(owner[rows][backwards], return_index=True)[1]]  # last per event
            full[owner[rows[last]]] = values[last]
            ok[owner[rows[last]]] = True
        columns[column] = full
        columns[f"{column}__ok"] = ok
    return columns, ~typed_rows


def _insert_batch_with_stats(
    con: duckdb.DuckDBPyConnection, batch: EventBatch, params: dict[str, Any]
) -> None:
    """An event batch with stats: its rows (with step_num/group_id) and its event_details rows.

    Typed columns come from numpy (``_typed_columns``); only the JSON of the other stats is built
    in SQL, and only when there are such stats. (One SQL aggregate doing both cost ~10 ms of
    planning per batch: ingesting 256 small generated hosts took 1.7x longer.)
    """
    assert batch.stats is not None
    n = batch.num_rows
    columns = batch.columns()
    stats = batch.stats.columns()
    typed, untyped = _typed_columns(stats, n)
    for column, _ in ROW_TYPED:
        columns[column], columns[f"{column}__ok"] = typed[column], typed[f"{column}__ok"]
    _run_with(con, _INSERT_EVENTS_WITH_STATS, params, events=columns)
    del columns
    json_text = np.full(n, None, dtype=object)
    if untyped.any():
        owners, texts = _stats_json(con, {name: values[untyped] for name, values in stats.items()})
        json_text[owners] = texts
    del stats
    has_details = json_text != None  # noqa: E711 (elementwise on an object array)
    for column, _ in DETAIL_TYPED:
        has_details |= typed[f"{column}__ok"]
    rows = np.flatnonzero(has_details)
    if not len(rows):
        return
    details: Columns = {"owner": rows.astype(np.int64), "stats": json_text[rows]}
    for column, kind in DETAIL_TYPED:
        details[column] = typed[column][rows]
        if kind != "str":
            details[f"{column}__ok"] = typed[f"{column}__ok"][rows]
    detail_params = {k: v for k, v in params.items() if k != "shift_ps"}
    _run_with(con, _INSERT_DETAILS, detail_params, details=details)


@dataclass
class RunCounts:
    planes: int = 0
    events: int = 0


_DONE = object()


def _prefetched(reader: HostReader, depth: int = 2) -> Iterator[tuple[PlaneData, Iterator[EventBatch]]]:
    """The reader's planes, each with its batches decoded in a background thread while DuckDB
    inserts (numpy and DuckDB release the GIL in their kernels, so the two overlap).

    A plane without events gets no thread: handing planes between threads cost ~0.5 ms each
    (GIL switches), which made a file of many empty planes slow. Reader errors are re-raised
    here, in the caller's thread.
    """
    for plane in reader.planes():
        if not plane.info.num_events:
            yield plane, plane.batches
        else:
            yield plane, _decoded_ahead(plane.batches, depth)


def _decoded_ahead(source: Iterator[EventBatch], depth: int) -> Iterator[EventBatch]:
    """``source``'s batches, decoded up to ``depth`` ahead in a background thread."""
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in source:
                if stop.is_set():
                    return
                items.put(("batch", batch))
            items.put((_DONE, None))
        except BaseException as exc:  # handed to the consumer
            items.put(("error", exc))

    thread = threading.Thread(target=produce, name="tpuanalyze-decode", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = items.get()
            if kind == "error":
                raise value
            if kind is _DONE:
                return
            yield value
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                items.get(timeout=0.05)
            except queue.Empty:
                pass
        thread.join()


def _insert_events(
    con: duckdb.DuckDBPyConnection,
    batches: Iterator[EventBatch],
    params: dict[str, Any],
    on_batch: Callable[[int], None] | None,
) -> int:
    """Insert a plane's event batches, one statement per batch; returns the events loaded."""
    loaded = 0
    for batch in batches:
        rows = batch.num_rows
        step = {**params, "first_index": loaded}
        if batch.stats is not None and len(batch.stats):
            _insert_batch_with_stats(con, batch, step)
        else:
            _run_with(con, _INSERT_EVENTS_PLAIN, step, events=batch.columns())
        del batch
        loaded += rows
        if on_batch:
            on_batch(rows)
    return loaded


class _PlaneTables:
    """A host's planes, lines and event metadata, inserted a few planes at a time.

    Why: each INSERT costs ~3 ms however small, and three per plane were 30% of loading 256
    generated hosts (11 planes each). Buffered up to ``FLUSH_ROWS`` rows, so a host with huge
    metadata tables still holds little.
    """

    FLUSH_ROWS = 4096
    FLUSH_PLANES = 512  # planes without lines or metadata add no rows: bounded by count too

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: int, host: str) -> None:
        self.con, self.params = con, {"run_id": run_id, "host": host}
        self.planes: list[PlaneInfo] = []
        self.lines: list[Columns] = []
        self.metadata: list[Columns] = []
        self.rows = 0

    def add(self, plane: PlaneData) -> None:
        index = plane.info.plane_index
        self.planes.append(plane.info)
        for parts, columns in ((self.lines, plane.lines), (self.metadata, plane.metadata)):
            rows = len(next(iter(columns.values())))
            if rows:  # an empty plane adds nothing here
                parts.append({**columns, "plane_index": np.full(rows, index, dtype=np.int32)})
                self.rows += rows
        if self.rows >= self.FLUSH_ROWS or len(self.planes) >= self.FLUSH_PLANES:
            self.flush()

    def flush(self) -> None:
        if not self.planes:
            return
        infos = self.planes
        planes: Columns = {"plane_index": np.array([i.plane_index for i in infos], dtype=np.int32)}
        for column, kind in _PLANE_COLUMNS:
            values = [getattr(info, column) for info in infos]
            if kind == "str":
                planes[column] = text_column(values)
            else:
                planes.update(nullable_columns(column, values, kind))
        _run_with(self.con, _INSERT_PLANES, self.params, planes=planes)
        if self.lines:
            _run_with(self.con, _INSERT_LINES, self.params, lines=_concat(self.lines))
        if self.metadata:
            _run_with(self.con, _INSERT_METADATA, self.params, metadata=_concat(self.metadata))
        self.planes, self.lines, self.metadata, self.rows = [], [], [], 0


def _concat(parts: list[Columns]) -> Columns:
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _load_host(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    run_t0_ns: int | None,
    reader: HostReader,
    counts: RunCounts,
    facts: dict[str, Any],
    on_batch: Callable[[int], None] | None,
) -> None:
    shift_ps = ((reader.t0_ns or 0) - (run_t0_ns or 0)) * 1000
    tables = _PlaneTables(con, run_id, reader.host)
    for plane, batches in _prefetched(reader):
        info = plane.info
        params = {"run_id": run_id, "host": reader.host, "plane_index": info.plane_index}
        tables.add(plane)
        event_params = {**params, "shift_ps": shift_ps}
        loaded = _insert_events(con, batches, event_params, on_batch)
        counts.events += loaded
        if loaded:
            facts["kinds_with_events"].add(info.kind)
        counts.planes += 1
        if info.kind in ("tpu", "gpu"):
            facts["devices"] += 1
            if info.device_type and not facts["device_type"]:
                facts["device_type"] = info.device_type
    tables.flush()
