"""Bulk-load one run's staging Arrow tables into the public relations with INSERT ... SELECT.

Arrow tables are registered as DuckDB views; DuckDB joins events with their plane, line and event
metadata, pivots the long stats table into the typed columns, and folds the remaining stats into
the ``stats`` JSON (event stats override the same key on the event metadata). No row-by-row work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from tpuanalyze.parsers.staging import TYPED_STATS, HostTables

# How each typed column reads its value out of the long stats table (columns i64 u64 f64 s).
_VALUE_SQL = {
    "str": "COALESCE(s, CAST(i64 AS VARCHAR), CAST(u64 AS VARCHAR), CAST(f64 AS VARCHAR))",
    "double": "COALESCE(f64, CAST(i64 AS DOUBLE), CAST(u64 AS DOUBLE), TRY_CAST(s AS DOUBLE))",
    "uint": (
        "COALESCE(u64, CASE WHEN i64 < 0 THEN CAST(CAST(i64 AS HUGEINT) + 18446744073709551616 AS UBIGINT)"
        " ELSE CAST(i64 AS UBIGINT) END, TRY_CAST(s AS UBIGINT))"
    ),
    "int": "COALESCE(i64, TRY_CAST(u64 AS BIGINT), TRY_CAST(s AS BIGINT))",
}
_JSON_VALUE_SQL = "COALESCE(to_json(i64), to_json(u64), to_json(f64), to_json(s), CAST(j AS JSON))"


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _typed_aggregates() -> tuple[str, list[str]]:
    """SELECT list pivoting typed stats (one FILTERed aggregate per stat name) and the column list."""
    by_column: dict[str, list[tuple[str, str]]] = {}
    for stat, (column, kind) in TYPED_STATS.items():
        by_column.setdefault(column, []).append((stat, kind))
    parts = []
    for column, stats in by_column.items():
        options = [
            f"max({_VALUE_SQL[kind]}) FILTER (WHERE key = {_sql_str(stat)})" for stat, kind in stats
        ]
        expr = options[0] if len(options) == 1 else f"COALESCE({', '.join(options)})"
        parts.append(f"{expr} AS {column}")
    return ",\n       ".join(parts), list(by_column)


_TYPED_SELECT, TYPED_EVENT_COLUMNS = _typed_aggregates()
_TYPED_KEYS = ", ".join(_sql_str(k) for k in TYPED_STATS)

_INSERT_EVENTS = f"""
INSERT INTO events
WITH typed AS (
    SELECT ev_row,
       {_TYPED_SELECT}
    FROM stg_stats WHERE key IN ({_TYPED_KEYS})
    GROUP BY ev_row
), other AS (
    SELECT ev_row, json_group_object(key, {_JSON_VALUE_SQL}) AS stats
    FROM stg_stats WHERE key NOT IN ({_TYPED_KEYS})
    GROUP BY ev_row
)
SELECT $run_id, e.host, e.plane_index, e.line_index, p.name, l.name, p.device_ordinal,
       COALESCE(m.name, ''), COALESCE(NULLIF(m.display_name, ''), m.name, ''),
       e.start_ps, e.duration_ps, e.num_occurrences,
       {", ".join(f"COALESCE(t.{c}, m.{c})" for c in TYPED_EVENT_COLUMNS)},
       CASE WHEN o.stats IS NULL THEN CAST(m.stats AS JSON)
            WHEN m.stats IS NULL THEN o.stats
            ELSE json_merge_patch(CAST(m.stats AS JSON), o.stats) END
FROM stg_events e
JOIN stg_planes p ON p.host = e.host AND p.plane_index = e.plane_index
JOIN stg_lines l ON l.host = e.host AND l.plane_index = e.plane_index AND l.line_index = e.line_index
LEFT JOIN stg_meta m ON m.host = e.host AND m.plane_index = e.plane_index AND m.md_id = e.md_id
LEFT JOIN typed t ON t.ev_row = e.ev_row
LEFT JOIN other o ON o.ev_row = e.ev_row
ORDER BY e.ev_row
"""


@dataclass
class RunTables:
    """A parsed run: every host's staging tables, times shifted to the run's common t0."""

    name: str
    source_path: str
    source_format: str
    hosts: list[HostTables]
    t0_ns: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def num_events(self) -> int:
        return sum(h.num_events for h in self.hosts)

    @property
    def num_planes(self) -> int:
        return sum(h.planes.num_rows for h in self.hosts)


def _with_host(table: pa.Table, host: str) -> pa.Table:
    column = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(table.num_rows, dtype=np.int32)), pa.array([host], pa.string())
    )
    return table.add_column(0, "host", column.cast(pa.string()))


def _shift(table: pa.Table, column: str, by: int) -> pa.Table:
    if by == 0 or table.num_rows == 0:
        return table
    idx = table.schema.get_field_index(column)
    shifted = pa.array(table.column(column).to_numpy() + np.int64(by), pa.int64())
    return table.set_column(idx, column, shifted)


def _staging(run: RunTables) -> dict[str, pa.Table]:
    """Concatenate hosts: add the host column, make ev_row unique across hosts, shift start_ps."""
    parts: dict[str, list[pa.Table]] = {k: [] for k in ("planes", "lines", "events", "stats", "meta")}
    row_base = 0
    for h in run.hosts:
        shift_ps = ((h.t0_ns or 0) - (run.t0_ns or 0)) * 1000
        events = _shift(_shift(h.events, "start_ps", shift_ps), "ev_row", row_base)
        stats = _shift(h.stats, "ev_row", row_base)
        parts["planes"].append(_with_host(h.planes, h.host))
        parts["lines"].append(_with_host(h.lines, h.host))
        parts["events"].append(_with_host(events, h.host))
        parts["stats"].append(stats)
        parts["meta"].append(_with_host(h.meta, h.host))
        row_base += h.num_events
    return {k: pa.concat_tables(v) for k, v in parts.items()}


def insert_run(con: duckdb.DuckDBPyConnection, run: RunTables, run_id: int) -> None:
    """Insert one run (inside the caller's transaction)."""
    staged = _staging(run)
    for name, table in staged.items():
        con.register(f"stg_{name}", table)
    try:
        params = {"run_id": run_id}
        events = staged["events"]
        if events.num_rows:
            start = int(np.min(events.column("start_ps").to_numpy()))
            end = int(np.max(events.column("start_ps").to_numpy() + events.column("duration_ps").to_numpy()))
        else:
            start = end = None
        devices = sum(
            sum(1 for k in h.planes.column("kind").to_pylist() if k in ("tpu", "gpu")) for h in run.hosts
        )
        device_type = _device_type(run)
        metadata: dict[str, Any] = {}
        for h in run.hosts:
            for key, value in h.metadata.items():
                metadata.setdefault(key, value)
        if run.notes:
            metadata["notes"] = run.notes
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
                devices,
                run.t0_ns,
                start,
                end,
                run.num_events,
                datetime.now(timezone.utc).replace(tzinfo=None),
                json.dumps(metadata, default=str) if metadata else None,
            ],
        )
        hosts = pa.table(
            {
                "host": [h.host for h in run.hosts],
                "file_path": [h.file_path for h in run.hosts],
                "file_bytes": pa.array([h.file_bytes for h in run.hosts], pa.int64()),
                "hostnames": pa.array([h.hostnames for h in run.hosts], pa.list_(pa.string())),
                "errors": pa.array([h.errors for h in run.hosts], pa.list_(pa.string())),
                "warnings": pa.array([h.warnings for h in run.hosts], pa.list_(pa.string())),
            }
        )
        con.register("stg_hosts", hosts)
        con.execute(
            "INSERT INTO hosts SELECT $run_id, host, file_path, file_bytes, hostnames, errors, warnings "
            "FROM stg_hosts",
            params,
        )
        con.execute(
            """INSERT INTO planes SELECT $run_id, host, plane_index, plane_id, name, kind, device_ordinal,
                   device_type, peak_tflops, peak_hbm_bw_gbps, num_lines, num_events, CAST(stats AS JSON)
               FROM stg_planes ORDER BY host, plane_index""",
            params,
        )
        con.execute(
            """INSERT INTO lines SELECT $run_id, host, plane_index, line_index, line_id, display_id, name,
                   display_name, timestamp_ns, duration_ps, num_events
               FROM stg_lines ORDER BY host, plane_index, line_index""",
            params,
        )
        con.execute(_INSERT_EVENTS, params)
    finally:
        for name in (*staged, "hosts"):
            try:
                con.unregister(f"stg_{name}")
            except duckdb.Error:
                pass


def _device_type(run: RunTables) -> str | None:
    kinds: set[str] = set()
    for h in run.hosts:
        for kind, dtype, events in zip(
            h.planes.column("kind").to_pylist(),
            h.planes.column("device_type").to_pylist(),
            h.planes.column("num_events").to_pylist(), strict=False,
        ):
            if dtype and kind in ("tpu", "gpu"):
                return dtype
            if kind in ("tpu", "gpu") and events:
                kinds.add(kind)
    if "tpu" in kinds:
        return "TPU"
    if "gpu" in kinds:
        return "GPU"
    return "CPU" if run.hosts else None
