"""Convert hosts' rows to Parquet parts from numpy columns (never row by row): the loader each
load task of the map runs (store/parts.py), for one host or several consecutive small ones.

The event batches a reader yields, and the planes, lines and event metadata of its planes, are
gathered as numpy arrays across planes and hosts and written by one ``COPY (SELECT ...) TO
'part.parquet'`` per table and ``FLUSH_EVENTS`` events (most tasks: one statement per table),
through an in-memory DuckDB that holds no table: the arrays are read by a replacement scan (local
variables of ``_run_with``), the host and its time shift to the run's t0 are staged columns (the
hosts of a task share the statements), and every column is cast to the type of its table
(``schema.sql``), so the parts are what the tables hold. An event batch's own stats arrive as a
long table: numpy turns it into the typed columns, SQL into the ``stats`` JSON of the rest.

Why one statement per table and task, not per plane and batch, nor per host: each statement costs
~3-8 ms however small, and a pod host has ~20 planes of ~2K events and a few dozen planes and
lines rows (benchmarks/results/bench_pipeline.md, bench_ingest.md).
Why replacement scans, not ``register``: a registered object stays alive until the connection
forgets it; a replacement scan's arrays are freed when the statement ends
(benchmarks/results/ingest_memory.md).
"""

from __future__ import annotations

import functools
import queue
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
from tpuanalyze.parsers.staging import (
    CHUNK_EVENTS,
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
    stat_key_names,
    text_column,
)
from tpuanalyze.store.database import schema_sql


def _value(column: str, kind: str) -> str:
    """SELECT expression of a loader column: nullable numbers come with a ``__ok`` mask."""
    if kind == "str":
        return f"CAST({column} AS VARCHAR)"
    return f"CASE WHEN {column}__ok THEN {column} END"


# An event's own typed values: step_num and group_id (common per event) in event_rows, the rest
# in event_details (schema.sql says why event_rows stays narrow).
ROW_TYPED = [(c, k) for c, k in TYPED_COLUMNS if c in ("step_num", "group_id")]
DETAIL_TYPED = [(c, k) for c, k in TYPED_COLUMNS if (c, k) not in ROW_TYPED]


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
_JSON = "CAST(CAST(stats AS VARCHAR) AS JSON)"
# Each table's column -> SELECT expression over its staged numpy columns (``stg_rows``); run_id is
# the main process's (store/commit.py), host a parameter. Columns absent here: not written.
# A row's host: its index into the statement's list of hosts ($hosts), not a column of Python strings,
# which DuckDB converts one by one holding the GIL (the decoding thread then waits): 6M event rows
# inserted 3.6 -> 3.0 CPU s.
_HOST = "$hosts[host_code + 1]"
_EXPRESSIONS: dict[str, dict[str, str]] = {
    "event_rows": {
        "host": _HOST, "plane_index": "plane_index", "line_index": "line_index",
        "event_index": "event_index", "metadata_id": "metadata_id", "start_ps": "start_ps + shift_ps",
        "duration_ps": "duration_ps", "num_occurrences": _value("num_occurrences", "int"),
        **{c: _value(c, k) for c, k in ROW_TYPED},
    },
    "event_details": {
        "host": _HOST, "plane_index": "plane_index", "event_index": "event_index",
        **{c: _value(c, k) for c, k in DETAIL_TYPED}, "stats": _JSON,
    },
    "event_metadata": {
        "host": _HOST, "plane_index": "plane_index", "metadata_id": "metadata_id",
        "name": _value("name", "str"), "display_name": _value("display_name", "str"),
        **{c: _value(c, k) for c, k in TYPED_COLUMNS}, "stats": _JSON,
    },
    "lines": {
        "host": _HOST, "plane_index": "plane_index",
        **{c: _value(c, "int") for c in ("line_index", "line_id", "display_id", "timestamp_ns",
                                         "duration_ps", "num_events")},
        "name": _value("name", "str"), "display_name": _value("display_name", "str"),
    },
}
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
_EXPRESSIONS["planes"] = {
    "host": _HOST, "plane_index": "plane_index",
    **{c: _value(c, k) for c, k in _PLANE_COLUMNS[:-1]}, "stats": _JSON,
}


@functools.cache
def table_types() -> dict[str, list[tuple[str, str]]]:
    """Each host table's (column, DuckDB type) in table order, from the schema itself."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(schema_sql())
        return {
            table: [(row[0], row[1]) for row in con.execute(f"DESCRIBE {table}").fetchall()]
            for table in _EXPRESSIONS
        }
    finally:
        con.close()


def part_columns(table: str, dropped: tuple[str, ...]) -> list[tuple[str, str]]:
    """(column, type) of ``table`` a part holds, in table order: all but ``dropped``."""
    expressions = _EXPRESSIONS[table]
    return [(c, t) for c, t in table_types()[table] if c not in dropped and c in expressions]


def part_select(table: str, dropped: tuple[str, ...]) -> str:
    """The SELECT writing a part of ``table``: its columns in order, each cast to its type."""
    expressions = _EXPRESSIONS[table]
    casts = ", ".join(f"CAST({expressions[c]} AS {t}) AS {c}" for c, t in part_columns(table, dropped))
    return f"SELECT {casts} FROM stg_rows"


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
    rows: Columns | None = None,
) -> duckdb.DuckDBPyConnection:
    """Run ``sql`` with the given numpy tables visible to it as stg_events / stg_stats / ... .

    DuckDB resolves an unknown table name to a local variable of the calling frame holding numpy
    arrays (a replacement scan); the arrays are released when the statement is done.
    """
    stg_events, stg_stats, stg_lines, stg_metadata = events, stats, lines, metadata  # noqa: F841
    stg_details, stg_planes, stg_rows = details, planes, rows  # noqa: F841
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
    plain = _plain_stats_json(stats)
    if plain is not None:
        return plain
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


def factorize(values: np.ndarray) -> tuple[list[Any], np.ndarray]:
    """(distinct values in order of first appearance, each row's code into them) of an object
    array of a few distinct names. Why not ``np.unique``: sorting Python strings cost ~1 us a row
    (a pod host's stat keys: 50 ms); a dict lookup a row costs a tenth of that."""
    if len(values) >= FACTORIZE_WITH_PANDAS:  # pandas hashes in C: a pod batch's stat keys 2x faster
        import pandas as pd

        codes, uniques = pd.factorize(values, use_na_sentinel=False)
        names = [None if isinstance(u, float) and u != u else u for u in uniques]  # (pandas' None: NaN)
        return names, codes.astype(np.int64, copy=False)
    index: dict[Any, int] = {}
    code = index.setdefault
    codes = np.array([code(value, len(index)) for value in values.tolist()], dtype=np.int64)
    return list(index), codes


FACTORIZE_WITH_PANDAS = 65_536  # rows from which factorize hashes with pandas (imported once, ~0.3 s)


def stat_key_index(stats: Columns) -> tuple[list[Any], np.ndarray]:
    """(the distinct stat names of the rows, each row's index into them): from the rows' name
    numbers where the reader gave them all (``StatLong.key_code``), else by hashing the names."""
    found = stat_key_names(stats["key_code"]) if "key_code" in stats else None
    return factorize(stats["key"]) if found is None else found


# Text that DuckDB's to_json writes as is between quotes (printable ASCII but quote and backslash).
_PLAIN_TEXT = re.compile(r'[ !#-\[\]-~]*')


def _plain_stats_json(stats: Columns) -> tuple[np.ndarray, np.ndarray] | None:
    """``_EVENT_STATS_JSON``'s result without SQL, for stats (sorted by owner, trace order kept)
    that are integers or plain text under plain names, whose JSON is their decimal digits or
    their quoted text (a pod host's ``run_id`` / ``all_reduce_unique_id`` / ``device_ordinal``);
    None for anything else (doubles, escapes, JSON values), which SQL writes."""
    kind = stats["kind"]
    is_int, is_uint, is_text = kind == STAT_INT, kind == STAT_UINT, kind == STAT_TEXT
    if not (is_int | is_uint | is_text).all():
        return None
    match = _PLAIN_TEXT.fullmatch
    names, codes = stat_key_index(stats)
    keys = []
    for name in names:
        if not isinstance(name, str) or not match(name):
            return None
        keys.append(f'"{name}":')
    values = np.empty(len(kind), dtype=object)
    for mask, numbers in ((is_int, stats["i64"]), (is_uint, stats["u64"])):
        rows = np.flatnonzero(mask)
        if len(rows):
            values[rows] = [str(v) for v in numbers[rows].tolist()]
    rows = np.flatnonzero(is_text)
    if len(rows):
        texts = stats["text"][rows].tolist()
        if not all(isinstance(t, str) and match(t) for t in texts):
            return None
        values[rows] = [f'"{t}"' for t in texts]
    pieces = (np.array(keys, dtype=object)[codes] + values).tolist()
    owner = stats["owner"]
    bounds = (np.flatnonzero(np.diff(owner)) + 1).tolist()
    starts, stops = [0, *bounds], [*bounds, len(owner)]
    texts = np.empty(len(starts), dtype=object)
    texts[:] = ["{" + ",".join(pieces[a:b]) + "}" for a, b in zip(starts, stops, strict=True)]
    return owner[starts].astype(np.int64), texts


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
    names, codes = stat_key_index(stats)
    code_of = {str(name): i for i, name in enumerate(names)}
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
            owners = owner[rows]
            if len(owners) < 2 or (owners[1:] >= owners[:-1]).all():  # in event order: each event's last
                last = np.flatnonzero(np.append(owners[1:] != owners[:-1], True))
            else:
                backwards = np.arange(len(rows) - 1, -1, -1)
                last = backwards[np.unique(owners[backwards], return_index=True)[1]]  # last per event
            full[owner[rows[last]]] = values[last]
            ok[owner[rows[last]]] = True
        columns[column] = full
        columns[f"{column}__ok"] = ok
    return columns, ~typed_rows


def _merged_tables(
    items: list[tuple[EventBatch, int, int, int]]
) -> tuple[Columns, Columns | None, Columns | None]:
    """The ``event_rows`` columns (with step_num/group_id) of consecutive event batches (batch,
    plane_index, its first event's index in its plane, its first serial; serials contiguous), their
    ``event_details`` columns (None when no event has details) and the stats left for their JSON
    (None if none); the rows are those of each batch in turn.

    Typed columns come from numpy (``_typed_columns``); the JSON of the other stats is built in
    SQL (``_Details``), for many batches at once: the details rows and those stats carry the
    events' host-wide ``serial`` numbers (``serial`` is the first batch's first). (One SQL aggregate
    doing both cost ~10 ms of planning per batch: ingesting 256 small generated hosts took 1.7x longer.)
    Batches go together because a pod host's ~20 planes of ~2K events each paid the ~30 numpy calls
    of the typed columns apiece; gathered, a host pays them once or twice."""
    serial = items[0][3]
    pieces = []
    stat_pieces = []
    offset = 0
    for batch, plane_index, first_index, _ in items:
        n = batch.num_rows
        piece = batch.columns()
        piece["event_index"] = piece.pop("row") + first_index
        piece["plane_index"] = np.full(n, plane_index, dtype=np.int32)
        pieces.append(piece)
        if batch.stats is not None and len(batch.stats):
            stat_piece = batch.stats.columns()
            if offset:
                stat_piece["owner"] = stat_piece["owner"] + offset
            stat_pieces.append(stat_piece)
        offset += n
    columns = pieces[0] if len(pieces) == 1 else _concat(pieces)
    stats = None
    if len(items) == 1:  # one batch: its stats as they are
        stats = stat_pieces[0] if stat_pieces else None
    elif stat_pieces:
        stats = _concat(stat_pieces)
        stats["seq"] = np.arange(len(stats["owner"]), dtype=np.int64)
    n = len(columns["event_index"])
    if stats is None:
        for column, _ in ROW_TYPED:
            columns[column], columns[f"{column}__ok"] = np.zeros(n, np.int64), np.zeros(n, bool)
        return columns, None, None
    typed, untyped = _typed_columns(stats, n)
    for column, _ in ROW_TYPED:
        columns[column], columns[f"{column}__ok"] = typed[column], typed[f"{column}__ok"]
    has_details = np.zeros(n, dtype=bool)
    json_stats: Columns | None = None
    if untyped.any():
        json_stats = {name: values[untyped] for name, values in stats.items()}
        has_details[json_stats["owner"]] = True
        json_stats["owner"] = json_stats["owner"] + serial
    del stats
    for column, _ in DETAIL_TYPED:
        has_details |= typed[f"{column}__ok"]
    rows = np.flatnonzero(has_details)
    if not len(rows):
        return columns, None, None
    details: Columns = {
        "event_index": columns["event_index"][rows],
        "plane_index": columns["plane_index"][rows],
        "serial": rows.astype(np.int64) + serial,
    }
    for column, kind in DETAIL_TYPED:
        details[column] = typed[column][rows]
        if kind != "str":
            details[f"{column}__ok"] = typed[f"{column}__ok"][rows]
    return columns, details, json_stats


@dataclass
class RunCounts:
    planes: int = 0
    events: int = 0


_DONE = object()
PREFETCH_MIN_EVENTS = 2 * CHUNK_EVENTS


def _prefetched(
    reader: HostReader, depth: int | None = None
) -> Iterator[tuple[PlaneData, Iterator[EventBatch]]]:
    """The reader's planes, each with its batches decoded in a background thread while DuckDB
    inserts (numpy and DuckDB release the GIL in their kernels, so the two overlap).

    A plane of fewer than ``PREFETCH_MIN_EVENTS`` events gets no thread: handing planes between
    threads cost ~0.5 ms each (GIL switches), which made a file of many empty planes slow, and with
    a batch or two there is nothing to overlap (a pod host's ~2K-event planes cost 10% more CPU
    with the thread). Reader errors are re-raised here, in the caller's thread.

    ``depth``: batches decoded ahead, by default a flush's worth and one more. The loader writes
    ``FLUSH_EVENTS`` rows at a time: with fewer batches ahead it waited, after each insert, for the
    rest of the next flush to be decoded, and decoding and inserting took turns instead of
    overlapping (2 ahead, 8 a flush: a 6M-event file's load waited 0.4 s for batches;
    benchmarks/results/bench_ingest.md).
    """
    if depth is None:
        depth = FLUSH_EVENTS // CHUNK_EVENTS + 1
    for plane in reader.planes():
        if plane.info.num_events < PREFETCH_MIN_EVENTS:
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


class _Parts:
    """One table's rows of consecutive hosts, gathered as numpy columns and written as numbered
    Parquet parts of about ``flush_rows`` rows each (one part for most hosts, or for several small
    hosts together), or, with ``run_id``, inserted into ``table`` of ``con`` itself (a direct load:
    ``con`` is the database's connection, inside the transaction of the ingest)."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        table: str,
        folder: Path | None,
        dropped: tuple[str, ...],
        flush_rows: int,
        compression: str,
        run_id: int | None = None,
    ) -> None:
        self.con, self.folder, self.compression = con, folder, compression
        self.select = part_select(table, dropped)
        self.run_id = run_id
        if run_id is not None:
            names = ", ".join(c for c, _ in part_columns(table, dropped))
            self.insert = f"INSERT INTO {table} (run_id, {names}) SELECT $run_id, * FROM ({self.select})"
        self.needs_host = "host" not in dropped  # a dataset's event parts: the folder names the host
        self.flush_rows = flush_rows
        self.pending: list[Columns] = []
        self.hosts: dict[str, int] = {}  # the pending rows' hosts, by host_code
        self.rows = 0
        self.files: list[str] = []
        self._numbers: dict[Path, int] = {}
        self.before: Callable[[], None] | None = None  # called before a statement uses ``con``

    def add(self, columns: Columns, host: str) -> None:
        rows = len(next(iter(columns.values())))
        if not rows:
            return
        if self.needs_host:
            code = self.hosts.setdefault(host, len(self.hosts))
            columns["host_code"] = np.full(rows, code, dtype=np.int32)
        self.pending.append(columns)
        self.rows += rows
        if self.rows >= self.flush_rows:
            self._full()

    def _full(self) -> None:
        """``flush_rows`` rows are pending."""
        self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        if self.before is not None:
            self.before()
        rows = self._rows(_concat(self.pending) if len(self.pending) > 1 else self.pending[0])
        params: dict[str, Any] = {"hosts": list(self.hosts)} if self.needs_host else {}
        self.pending, self.rows, self.hosts = [], 0, {}
        if self.run_id is not None:
            _run_with(self.con, self.insert, {**params, "run_id": self.run_id}, rows=rows)
            return
        assert self.folder is not None
        self.folder.mkdir(parents=True, exist_ok=True)
        number = self._numbers.get(self.folder, 0)
        self._numbers[self.folder] = number + 1
        target = self.folder / f"part-{number}.parquet"  # part-0: the layout docs/schema.md shows
        path = str(target).replace("'", "''")
        sql = (f"COPY ({self.select}) TO '{path}' "
               f"(FORMAT parquet, COMPRESSION {self.compression}, ROW_GROUP_SIZE {PART_ROW_GROUP})")
        _run_with(self.con, sql, params, rows=rows)
        self.files.append(str(target))

    def take_files(self) -> list[str]:
        """The parts written so far (the caller's from now on)."""
        files, self.files = self.files, []
        return files

    def _rows(self, rows: Columns) -> Columns:
        return rows


class _Details(_Parts):
    """``event_details`` parts: the stats JSON of the gathered rows is built when they are written,
    in as few statements as ``_stats_json`` allows (one per ``STATS_PIECE_ROWS`` stats)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stats: list[Columns] = []
        self.stat_rows = 0

    def _rows(self, rows: Columns) -> Columns:
        text = np.full(len(rows["serial"]), None, dtype=object)
        if self.stats:
            owners, texts = _stats_json(self.con, _concat(self.stats))
            text[np.searchsorted(rows["serial"], owners)] = texts  # serials ascend: rows in event order
        self.stats, self.stat_rows = [], 0
        return {**rows, "stats": text}


# Rows per Arrow batch of a streamed insert (~4 MB): under DuckDB's row group (122,880 rows). With
# more than one DuckDB thread, batches of 131,072 rows left a part-filled row group after each, which
# the checkpoint rewrote (6M event rows: a 119 MB file and 2.7 s, against 60 MB and 1.0 s with 65,536).
STREAM_BATCH_ROWS = 65_536


class _StreamedRows(_Parts):
    """A direct load's ``event_rows``, inserted by one statement that reads them as an Arrow stream
    in a helper thread while the loader decodes the next ones (``store.streamed``). The rows arrive
    as the table holds them (``_stored_rows``), so DuckDB's thread does the insert alone. It starts
    with a host of ``FLUSH_EVENTS`` events or more, or once as many rows are pending; fewer are
    inserted as a part is (a small run does not import pyarrow, ~0.1 s). ``pause`` ends the
    statement: the connection is then free for the other tables' statements (their ``before``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self.run_id is not None and self.needs_host
        names = ", ".join(c for c, _ in part_columns("event_rows", ("run_id",)))
        self.streamed_insert = (f"INSERT INTO event_rows (run_id, {names}) "
                                f"SELECT $run_id, {names} FROM stg_rows")
        self.stream: Any = None  # store.streamed.StreamedInsert while a statement runs
        self.streaming = False

    def expect(self, events: int) -> None:
        """A host of ``events`` events comes next: from ``FLUSH_EVENTS`` it streams from its first batch."""
        if events >= FLUSH_EVENTS:
            self.streaming, self.flush_rows = True, STREAM_BATCH_ROWS

    def _full(self) -> None:
        self.streaming, self.flush_rows = True, STREAM_BATCH_ROWS
        self._send(whole_batches=True)

    def flush(self) -> None:
        if self.streaming:
            self._send(whole_batches=False)
            self.pause()
        else:
            super().flush()

    def pause(self) -> None:
        """End the running statement, if any (raises its error)."""
        if self.stream is not None:
            stream, self.stream = self.stream, None
            stream.close()

    def abort(self) -> None:
        """End the running statement after a failure elsewhere (whose error wins)."""
        if self.stream is not None:
            stream, self.stream = self.stream, None
            stream.abort()

    def _send(self, whole_batches: bool) -> None:
        """The pending rows to the statement (started if need be) in batches of
        ``STREAM_BATCH_ROWS``; ``whole_batches``: a remainder stays pending."""
        from tpuanalyze.store.streamed import StreamedInsert, arrow_batch

        if not self.pending:
            return
        rows = _concat(self.pending) if len(self.pending) > 1 else self.pending[0]
        total = len(rows["host_code"])
        end = total - total % STREAM_BATCH_ROWS if whole_batches else total
        hosts = {"host": list(self.hosts)}
        for start in range(0, end, STREAM_BATCH_ROWS):
            columns, valid = _stored_rows({name: values[start:start + STREAM_BATCH_ROWS]
                                           for name, values in rows.items()})
            batch = arrow_batch(columns, valid, hosts)
            if self.stream is None:
                self.stream = StreamedInsert(self.con, self.streamed_insert, {"run_id": self.run_id},
                                             batch.schema)
            self.stream.put(batch)
        if end < total:  # the remainder keeps its host codes (into the same self.hosts)
            self.pending, self.rows = [{name: values[end:] for name, values in rows.items()}], total - end
        else:
            self.pending, self.rows, self.hosts = [], 0, {}


def _stored_rows(rows: Columns) -> tuple[Columns, dict[str, np.ndarray]]:
    """Loader ``event_rows`` columns as the table stores them (``_EXPRESSIONS["event_rows"]``
    evaluated in numpy: the run's clock, NULL where a value is not set; ``host`` the host codes),
    and which values are set."""
    columns: Columns = {}
    valid: dict[str, np.ndarray] = {}
    _check_stored_forms()
    for column, _ in part_columns("event_rows", ("run_id",)):
        if column == "host":
            columns[column] = rows["host_code"]
        elif column == "start_ps":
            columns[column] = rows["start_ps"] + rows["shift_ps"]
        else:
            columns[column] = rows[column]
            if f"{column}__ok" in rows:
                valid[column] = rows[f"{column}__ok"]
    return columns, valid


@functools.cache
def _check_stored_forms() -> None:
    """``_stored_rows`` evaluates the forms of expression ``event_rows`` has today; a new one must be
    taught to it (or the streamed rows would differ from the parts')."""
    known = {"host": _HOST, "start_ps": "start_ps + shift_ps"}
    for column, _ in part_columns("event_rows", ("run_id",)):
        expression = _EXPRESSIONS["event_rows"][column]
        if expression not in (known.get(column), column, _value(column, "int"), _value(column, "uint")):
            raise RuntimeError(f"_stored_rows cannot evaluate event_rows.{column} = {expression}")


def _concat(parts: list[Columns]) -> Columns:
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


@dataclass
class HostLoad:
    """What writing a host's rows found: counts, device facts, capture window."""

    counts: RunCounts
    devices: int = 0
    device_type: str | None = None
    kinds_with_events: set[str] = field(default_factory=set)
    window: tuple[int | None, int | None] = (None, None)  # min start_ps, max end_ps (run-relative)


# Rows per part: a part's rows are held (as numpy columns) until written, so this bounds the
# load's memory: events and details ~70 bytes a row, plane tables more (HLO text names).
FLUSH_EVENTS = 131_072
FLUSH_PLANE_ROWS = 16_384
# Rows per Parquet row group of a part: DuckDB builds a row group in its buffer before writing it,
# and with the 16 MB load buffer its default (122,880 rows of event_rows) wrote 3.8x slower than
# 32,768 (1.4 vs 0.37 CPU us a row, same peak RSS).
PART_ROW_GROUP = 32_768
EVENT_PART_TABLES = ("event_rows", "event_details")


def _parts_class(table: str, direct: bool) -> type[_Parts]:
    if table == "event_details":
        return _Details
    return _StreamedRows if direct and table == "event_rows" else _Parts


class TablesWriter:
    """The rows of one or more consecutive hosts of a run, table by table, as Parquet parts in
    ``folders[table]`` (leaving out the columns ``dropped[table]``, compressed with ``compression``),
    or, with ``run_id``, inserted straight into the tables of ``con`` (``store.parts.GroupParts.direct``).

    Hosts share the parts: each statement costs ~7 ms however few its rows (a pod host's planes
    and lines tables hold a few dozen), so several small hosts written together pay it once. A
    part holds whole batches of consecutive hosts in order, so the rows, their order included, are
    those that host-by-host parts give. ``move_events`` (a Parquet dataset, one folder per host):
    the event tables of the next host go to other folders, after the previous host's are written."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        folders: dict[str, Path | None],
        dropped: dict[str, tuple[str, ...]],
        compression: str = "zstd",
        run_id: int | None = None,
    ) -> None:
        self.parts = {
            table: _parts_class(table, run_id is not None)(
                con, table, folders[table], dropped[table],
                FLUSH_EVENTS if table in EVENT_PART_TABLES else FLUSH_PLANE_ROWS, compression, run_id,
            )
            for table in folders
        }
        self.streamed = self.parts.get("event_rows")
        if isinstance(self.streamed, _StreamedRows):  # its statement ends before any other one
            for table_parts in self.parts.values():
                if table_parts is not self.streamed:
                    table_parts.before = self.streamed.pause
        self.serial = 0  # the events numbered across planes and hosts (pairs details with their stats JSON)

    def event_folders(self, folders: dict[str, Path]) -> dict[str, list[str]]:
        """Write the event tables' pending rows, then send their next rows to ``folders``; the
        event parts written until now, by table."""
        written = {}
        for table, folder in folders.items():
            self.parts[table].flush()
            written[table] = self.parts[table].take_files()
            self.parts[table].folder = folder
        return written

    def finish(self) -> dict[str, list[str]]:
        """Write every pending row; each table's parts not yet taken, in order."""
        for table_parts in self.parts.values():
            table_parts.flush()
        return {table: table_parts.take_files() for table, table_parts in self.parts.items()}

    def abort(self) -> None:
        """After a failure (``GroupParts.discard``): end a streamed statement, so that the connection
        can roll back."""
        if isinstance(self.streamed, _StreamedRows):
            self.streamed.abort()

    def add_host(self, reader: HostReader, run_t0_ns: int | None) -> HostLoad:
        """Add the host's rows, event times shifted from the host's t0 to ``run_t0_ns``."""
        if isinstance(self.streamed, _StreamedRows):
            self.streamed.expect(reader.num_events)
        shift_ps = ((reader.t0_ns or 0) - (run_t0_ns or 0)) * 1000
        host = reader.host
        parts = self.parts
        details_parts = parts["event_details"]
        assert isinstance(details_parts, _Details)
        load = HostLoad(RunCounts())
        infos: list[PlaneInfo] = []
        low: int | None = None
        high: int | None = None
        pending: list[tuple[EventBatch, int, int, int]] = []  # small batches gathered across planes
        pending_rows = 0

        def load_pending() -> None:
            nonlocal pending, pending_rows
            if not pending:
                return
            rows, details, json_stats = _merged_tables(pending)
            pending, pending_rows = [], 0
            rows["shift_ps"] = np.full(len(rows["event_index"]), shift_ps, dtype=np.int64)
            parts["event_rows"].add(rows, host)
            if details is not None:  # its stats first: a flush of the details takes them along
                if json_stats is not None:
                    details_parts.stats.append(json_stats)
                    details_parts.stat_rows += len(json_stats["owner"])
                details_parts.add(details, host)
                if details_parts.stat_rows >= details_parts.flush_rows:
                    details_parts.flush()

        for plane, batches in _prefetched(reader):
            info = plane.info
            infos.append(info)
            for table, columns in (("lines", plane.lines), ("event_metadata", plane.metadata)):
                rows = len(next(iter(columns.values())))
                if rows:  # an empty plane adds nothing here
                    staged = {**columns, "plane_index": np.full(rows, info.plane_index, dtype=np.int32)}
                    parts[table].add(staged, host)
            loaded = 0
            for batch in batches:
                if batch.num_rows:  # the capture window, on the stored (shifted) times
                    start = batch.start_ps.astype(np.int64, copy=False) + shift_ps
                    first = int(start.min())
                    last = int((start + batch.duration_ps.astype(np.int64, copy=False)).max())
                    low = first if low is None else min(low, first)
                    high = last if high is None else max(high, last)
                if batch.num_rows >= CHUNK_EVENTS:
                    load_pending()
                pending.append((batch, info.plane_index, loaded, self.serial))
                pending_rows += batch.num_rows
                loaded += batch.num_rows
                self.serial += batch.num_rows
                del batch
                if pending_rows >= CHUNK_EVENTS:
                    load_pending()
            load.counts.events += loaded
            if loaded:
                load.kinds_with_events.add(info.kind)
            load.counts.planes += 1
            if info.kind in ("tpu", "gpu"):
                load.devices += 1
                if info.device_type and not load.device_type:
                    load.device_type = info.device_type
            if len(infos) >= FLUSH_PLANE_ROWS:
                parts["planes"].add(_plane_columns(infos), host)
                infos = []
        load_pending()
        if infos:
            parts["planes"].add(_plane_columns(infos), host)
        load.window = (low, high)
        return load


def _plane_columns(infos: list[PlaneInfo]) -> Columns:
    planes: Columns = {"plane_index": np.array([i.plane_index for i in infos], dtype=np.int32)}
    for column, kind in _PLANE_COLUMNS:
        values = [getattr(info, column) for info in infos]
        if kind == "str":
            planes[column] = text_column(values)
        else:
            planes.update(nullable_columns(column, values, kind))
    return planes
