"""Bulk-load a run into the public relations from numpy columns (never row by row).

Each plane's lines and event metadata, and each event batch a reader yields, reaches DuckDB as
numpy arrays read by a replacement scan (the arrays are local variables of ``_run_with``) and is
copied with one ``INSERT ... SELECT`` per batch; the run/host-level constants (run_id, host,
plane index, time shift to the run's t0) are bound parameters of that statement. An event batch's
own stats arrive as a long table; SQL turns it into the typed columns and the ``stats`` JSON.

Why replacement scans, not ``register``: DuckDB keeps every object registered inside a
transaction alive until COMMIT (the unregistered view stays visible to the open transaction), so
registering each batch held all of a host's batches in memory at once; a replacement scan's
arrays are freed when the statement ends (benchmarks/results/ingest_memory.md).
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import duckdb
import numpy as np
from tpuanalyze.parsers.staging import (
    SQL_TYPE,
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
)


def _value(column: str, kind: str, source: str = "") -> str:
    """SELECT expression of a loader column: nullable numbers come with a ``__ok`` mask."""
    if kind == "str":
        return f"CAST({source}{column} AS VARCHAR)"
    return f"CASE WHEN {source}{column}__ok THEN {source}{column} END"


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


def _stats_sql() -> str:
    """Per event of a batch (``owner``), from its stats' long table: typed columns and the JSON text
    of the rest.

    A stat feeds its typed column when its value fits the column's kind (a string column takes
    text and integers; numeric columns take numbers); the last such stat of an event wins, and
    where two names feed one column (step_num, iter_num) the first listed wins. Every other stat
    goes to the ``stats`` JSON object, in trace order. Work and memory scale with the stats, not
    the batch: the result is scattered onto the events with numpy (a join + sort over the whole
    batch here cost ~20 MB of peak memory per statement).
    """
    value_of = {
        "str": f"CASE kind WHEN {STAT_TEXT} THEN text WHEN {STAT_INT} THEN CAST(i64 AS VARCHAR) "
        f"WHEN {STAT_UINT} THEN CAST(u64 AS VARCHAR) END",
        "int": f"CASE kind WHEN {STAT_INT} THEN i64 WHEN {STAT_UINT} THEN TRY_CAST(u64 AS BIGINT) "
        f"WHEN {STAT_DOUBLE} THEN TRY_CAST(f64 AS BIGINT) END",
        # a negative int64 stat in a uint64 column is its two's complement, as protobuf writes it
        "uint": f"CASE kind WHEN {STAT_UINT} THEN u64 WHEN {STAT_INT} THEN CAST(CASE WHEN i64 < 0 "
        f"THEN CAST(i64 AS HUGEINT) + 18446744073709551616 ELSE i64 END AS UBIGINT) "
        f"WHEN {STAT_DOUBLE} THEN TRY_CAST(f64 AS UBIGINT) END",
        "double": f"CASE kind WHEN {STAT_DOUBLE} THEN f64 WHEN {STAT_INT} THEN CAST(i64 AS DOUBLE) "
        f"WHEN {STAT_UINT} THEN CAST(u64 AS DOUBLE) END",
    }
    fits = " ".join(
        f"WHEN '{stat}' THEN v_{kind} IS NOT NULL" for stat, (_, kind) in TYPED_STATS.items()
    )
    per_column = []
    for column, kind in TYPED_COLUMNS:
        stats = [stat for stat, (target, _) in TYPED_STATS.items() if target == column]
        picks = [f"arg_max(v_{kind}, seq) FILTER (WHERE key = '{stat}' AND typed)" for stat in stats]
        per_column.append(
            (picks[0] if len(picks) == 1 else f"coalesce({', '.join(picks)})") + f" AS {column}"
        )
    value_json = (
        f"CASE kind WHEN {STAT_INT} THEN CAST(to_json(i64) AS VARCHAR) "
        f"WHEN {STAT_UINT} THEN CAST(to_json(u64) AS VARCHAR) "
        f"WHEN {STAT_DOUBLE} THEN CAST(to_json(f64) AS VARCHAR) "
        f"WHEN {STAT_TEXT} THEN CAST(to_json(text) AS VARCHAR) "
        f"WHEN {STAT_JSON} THEN text ELSE 'null' END"
    )
    return f"""
WITH stat_values AS (
    SELECT owner, seq, CAST(key AS VARCHAR) AS key, kind, i64, u64, f64, CAST(text AS VARCHAR) AS text,
           {value_of["str"]} AS v_str, {value_of["int"]} AS v_int,
           {value_of["uint"]} AS v_uint, {value_of["double"]} AS v_double
    FROM stg_stats
), typed_values AS (
    SELECT *, coalesce(CASE key {fits} END, false) AS typed FROM stat_values
)
SELECT owner, {", ".join(per_column)},
       '{{' || string_agg(CAST(to_json(key) AS VARCHAR) || ':' || {value_json}, ',' ORDER BY seq)
               FILTER (WHERE NOT typed) || '}}' AS stats
FROM typed_values GROUP BY owner
"""


_EVENT_STATS = _stats_sql()
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
SELECT * FROM (
    SELECT $run_id, $host, $plane_index, $first_index + owner,
           {", ".join(f"{_value(c, k)} AS {c}" for c, k in DETAIL_TYPED)},
           CAST(CAST(stats AS VARCHAR) AS JSON) AS stats
    FROM stg_details
)
WHERE {" OR ".join(f"{c} IS NOT NULL" for c, _ in DETAIL_TYPED)} OR stats IS NOT NULL
"""
_INSERT_METADATA = f"""
INSERT INTO event_metadata (run_id, host, plane_index, metadata_id, name, display_name, {_TYPED}, stats)
SELECT $run_id, $host, $plane_index, metadata_id, CAST(name AS VARCHAR), CAST(display_name AS VARCHAR),
       {", ".join(_value(c, k) for c, k in TYPED_COLUMNS)}, CAST(CAST(stats AS VARCHAR) AS JSON)
FROM stg_metadata
"""
_INSERT_LINES = f"""
INSERT INTO lines (run_id, host, plane_index, line_index, line_id, display_id, name, display_name,
                   timestamp_ns, duration_ps, num_events)
SELECT $run_id, $host, $plane_index, {_value("line_index", "int")}, {_value("line_id", "int")},
       {_value("display_id", "int")}, CAST(name AS VARCHAR), CAST(display_name AS VARCHAR),
       {_value("timestamp_ns", "int")}, {_value("duration_ps", "int")}, {_value("num_events", "int")}
FROM stg_lines
"""
_INSERT_PLANE = """
INSERT INTO planes (run_id, host, plane_index, plane_id, name, kind, device_ordinal, device_type,
                    peak_tflops, peak_hbm_bw_gbps, num_lines, num_events, stats)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
assert set(SQL_TYPE) >= {k for _, k in TYPED_COLUMNS}


def _run_with(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: dict[str, Any],
    events: Columns | None = None,
    stats: Columns | None = None,
    lines: Columns | None = None,
    metadata: Columns | None = None,
    details: Any = None,
) -> duckdb.DuckDBPyConnection:
    """Run ``sql`` with the given numpy tables visible to it as stg_events / stg_stats / ... .

    DuckDB resolves an unknown table name to a local variable of the calling frame holding numpy
    arrays (a replacement scan); the arrays are released when the statement is done.
    """
    stg_events, stg_stats, stg_lines, stg_metadata = events, stats, lines, metadata  # noqa: F841
    stg_details = details  # noqa: F841
    return con.execute(sql, params)


# Stat rows aggregated per statement: the ordered string_agg buffers its input, and a batch of
# Kineto events (~8 args each) ran DuckDB's small load buffer out of memory in one piece.
STATS_PIECE_ROWS = 8_192


def _per_event_stats(con: duckdb.DuckDBPyConnection, stats: Columns) -> dict[str, np.ndarray]:
    """``_EVENT_STATS`` over the long stats table, in pieces of whole events (<= STATS_PIECE_ROWS
    stat rows, or one event's), so its memory is bounded whatever the events carry."""
    owner = stats["owner"]
    if len(owner) <= STATS_PIECE_ROWS:
        return _run_with(con, _EVENT_STATS, {}, stats=stats).fetchnumpy()
    order = np.argsort(owner, kind="stable")  # seq (wire order) is kept within an event
    stats = {name: values[order] for name, values in stats.items()}
    owner = stats["owner"]
    results = []
    start, n = 0, len(owner)
    while start < n:
        end = min(start + STATS_PIECE_ROWS, n)
        if end < n:
            end = int(np.searchsorted(owner, owner[end], side="left"))
            if end <= start:  # one event with more stats than a piece
                end = int(np.searchsorted(owner, owner[start], side="right"))
        piece = {name: values[start:end] for name, values in stats.items()}
        results.append(_run_with(con, _EVENT_STATS, {}, stats=piece).fetchnumpy())
        start = end
    return {name: np.ma.concatenate([r[name] for r in results]) for name in results[0]}


def _insert_batch_with_stats(
    con: duckdb.DuckDBPyConnection, batch: EventBatch, params: dict[str, Any]
) -> None:
    """An event batch with stats: its rows (with step_num/group_id) and its event_details rows.

    The stats are aggregated per event once (``_EVENT_STATS``); step_num and group_id are
    scattered onto the batch's rows with numpy, the other values go to event_details as they are.
    """
    assert batch.stats is not None
    n = batch.num_rows
    columns = batch.columns()
    per_event = _per_event_stats(con, batch.stats.columns())
    owner = np.asarray(per_event["owner"])
    for name, _ in ROW_TYPED:
        values = per_event.pop(name)
        present = ~np.ma.getmaskarray(values)
        full = np.zeros(n, dtype=np.int64)
        full[owner[present]] = np.ma.getdata(values)[present]
        ok = np.zeros(n, dtype=bool)
        ok[owner[present]] = True
        columns[name], columns[f"{name}__ok"] = full, ok
    _run_with(con, _INSERT_EVENTS_WITH_STATS, params, events=columns)
    del columns
    details: Columns = {"owner": owner}
    for name, kind in [*DETAIL_TYPED, ("stats", "str")]:
        values = per_event[name]
        present = ~np.ma.getmaskarray(values)
        if kind == "str":
            text = np.full(len(owner), None, dtype=object)
            text[present] = np.ma.getdata(values)[present]
            details[name] = text
        else:
            details[name] = np.where(present, np.ma.getdata(values), 0)
            details[f"{name}__ok"] = present
    detail_params = {k: v for k, v in params.items() if k != "shift_ps"}
    _run_with(con, _INSERT_DETAILS, detail_params, details=details)


@dataclass
class RunPlan:
    """A run about to be loaded: its name/source and one opened reader per host file."""

    name: str
    source_path: str
    source_format: str
    hosts: list[HostReader]
    notes: list[str] = field(default_factory=list)

    fixed_t0: int | None = None

    @property
    def t0_ns(self) -> int | None:
        """Time zero common to all hosts: the earliest host t0 (``fixed_t0`` when already known)."""
        if self.fixed_t0 is not None:
            return self.fixed_t0
        t0s = [h.t0_ns for h in self.hosts if h.t0_ns is not None]
        return min(t0s) if t0s else None


@dataclass
class RunCounts:
    planes: int = 0
    events: int = 0


_DONE = object()


def _prefetched(reader: HostReader, depth: int = 2) -> Iterator[tuple[PlaneData, Iterator[EventBatch]]]:
    """The reader's planes and batches, decoded in a background thread while DuckDB inserts.

    numpy, Arrow and DuckDB release the GIL in their kernels, so decoding the next batch overlaps
    with inserting this one. Reader errors are re-raised here, in the caller's thread.
    """
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for plane in reader.planes():
                items.put(("plane", plane))
                for batch in plane.batches:
                    if stop.is_set():
                        return
                    items.put(("batch", batch))
                items.put(("end", None))
            items.put((_DONE, None))
        except BaseException as exc:  # handed to the consumer
            items.put(("error", exc))

    def batches() -> Iterator[EventBatch]:
        while True:
            kind, value = items.get()
            if kind == "batch":
                yield value
            elif kind == "error":
                raise value
            else:
                return

    thread = threading.Thread(target=produce, name="tpuanalyze-decode", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = items.get()
            if kind == "error":
                raise value
            if kind is _DONE:
                return
            yield value, batches()
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
    for plane, batches in _prefetched(reader):
        info = plane.info
        params = {"run_id": run_id, "host": reader.host, "plane_index": info.plane_index}
        con.execute(
            _INSERT_PLANE,
            [
                run_id,
                reader.host,
                info.plane_index,
                info.plane_id,
                info.name,
                info.kind,
                info.device_ordinal,
                info.device_type,
                info.peak_tflops,
                info.peak_hbm_bw_gbps,
                info.num_lines,
                info.num_events,
                info.stats,
            ],
        )
        _run_with(con, _INSERT_LINES, params, lines=plane.lines)
        _run_with(con, _INSERT_METADATA, params, metadata=plane.metadata)
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


def insert_run(
    con: duckdb.DuckDBPyConnection,
    run: RunPlan,
    run_id: int,
    on_batch: Callable[[int], None] | None = None,
) -> RunCounts:
    """Insert one run (inside the caller's transaction): planes, lines, metadata, events, hosts, run."""
    counts = RunCounts()
    facts: dict[str, Any] = {"devices": 0, "device_type": None, "kinds_with_events": set()}
    run_t0 = run.t0_ns
    # One DuckDB thread while streaming events: a streamed Arrow scan is serial anyway, and idle
    # worker threads each keep their own allocator caches (measured: peak RSS -40 MB on 2M
    # events, no slower). The caller's setting is restored afterwards.
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    con.execute("SET threads = 1")
    try:
        for reader in run.hosts:
            _load_host(con, run_id, run_t0, reader, counts, facts, on_batch)
            release = getattr(reader, "release", None)
            if release:
                release()
    finally:
        try:
            con.execute(f"SET threads = {int(threads)}")
        except duckdb.Error:  # transaction aborted by a failed load: keep the original error
            pass
    con.execute(
        """INSERT INTO hosts
           SELECT $run_id, unnest($host), unnest($file_path), unnest($file_bytes),
                  unnest(CAST($hostnames AS VARCHAR[][])), unnest(CAST($errors AS VARCHAR[][])),
                  unnest(CAST($warnings AS VARCHAR[][]))""",
        {
            "run_id": run_id,
            "host": [h.host for h in run.hosts],
            "file_path": [h.file_path for h in run.hosts],
            "file_bytes": [int(h.file_bytes) for h in run.hosts],
            "hostnames": [list(h.hostnames) for h in run.hosts],
            "errors": [list(h.errors) for h in run.hosts],
            "warnings": [list(h.warnings) for h in run.hosts],
        },
    )
    window = con.execute(
        "SELECT min(start_ps), max(start_ps + duration_ps) FROM event_rows WHERE run_id = ?", [run_id]
    ).fetchall()[0]
    metadata: dict[str, Any] = {}
    for h in run.hosts:
        for key, value in h.metadata.items():
            metadata.setdefault(key, value)
    if run.notes:
        metadata["notes"] = run.notes
    device_type = facts["device_type"]
    if device_type is None:
        kinds = facts["kinds_with_events"]
        device_type = "TPU" if "tpu" in kinds else "GPU" if "gpu" in kinds else "CPU"
    con.execute(
        """INSERT INTO runs (run_id, name, source_path, source_format, device_type, num_hosts,
               num_devices, t0_ns, capture_start_ps, capture_end_ps, num_events, ingested_at, metadata)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        [
            run_id,
            run.name,
            run.source_path,
            run.source_format,
            device_type,
            len(run.hosts),
            facts["devices"],
            run_t0,
            window[0],
            window[1],
            counts.events,
            datetime.now(timezone.utc).replace(tzinfo=None),
            json.dumps(metadata, default=str) if metadata else None,
        ],
    )
    return counts
