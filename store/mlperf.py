"""MLPerf result logs into the trace database: one ``runs`` row per result folder, plus
``mlperf_results`` (one row per result file) and ``mlperf_intervals`` (init, run, block, eval, epoch).

:func:`ingest_mlperf_into` works on an open connection inside the caller's transaction (the
ingest pipeline calls it); :func:`ingest_mlperf` owns its own connection and
transaction (all or nothing). Re-ingesting a folder replaces its rows and keeps its run_id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from tpuanalyze.parsers.mlperf import MlperfTables, load_mlperf
from tpuanalyze.store.database import connect

RESULT_COLUMNS = [
    "run_id", "result_file", "benchmark", "submitter_path", "version", "cores", "chips", "framework",
    "run_start_ms", "run_stop_ms", "status", "global_batch_size", "opt_name", "epochs", "eval_count",
    "eval_ms", "hyperparameters",
]
INTERVAL_COLUMNS = ["run_id", "result_file", "kind", "start_ms", "stop_ms", "epoch", "epoch_count", "value"]


def _scalar(con: duckdb.DuckDBPyConnection, sql: str):
    """First value of a one-row query, fully fetched: DuckDB 2.0 refuses a new statement on a
    connection whose previous result was only partly read (``fetchone``), and this connection is
    the caller's, inside its shared ingest transaction."""
    return con.execute(sql).fetchall()[0][0]


def _next_run_id(con: duckdb.DuckDBPyConnection) -> int:
    has_sequence = _scalar(con, "SELECT count(*) FROM duckdb_sequences() WHERE sequence_name = 'run_id_seq'")
    candidate = int(_scalar(con, "SELECT nextval('run_id_seq')")) if has_sequence else 1
    highest = _scalar(con, "SELECT coalesce(max(run_id), 0) FROM runs")
    return max(candidate, int(highest) + 1)


def _runs_row(folder: str, results: pa.Table, run_id: int) -> dict:
    """The runs row of one result folder (no hosts or devices were traced: counts from the name)."""
    first = results.slice(0, 1).to_pylist()[0]
    starts = [s for s in results.column("run_start_ms").to_pylist() if s is not None]
    stops = [s for s in results.column("run_stop_ms").to_pylist() if s is not None]
    t0_ms = min(starts) if starts else None
    metadata = {
        "version": first["version"], "benchmark": first["benchmark"], "platform": first["platform"],
        "framework": first["framework"], "chips": first["chips"], "cores": first["cores"],
        "result_files": results.num_rows,
    }
    return {
        "run_id": run_id,
        "name": first["submitter_path"],
        "source_path": folder,
        "source_format": "mlperf",
        "device_type": _device_type(first["platform"]),
        "num_hosts": 0,
        "num_devices": int(first["cores"] or 0),
        "t0_ns": int(t0_ms * 1_000_000) if t0_ms is not None else None,
        "capture_start_ps": 0 if t0_ms is not None else None,
        "capture_end_ps": _span_ps(t0_ms, max(stops)) if stops and t0_ms is not None else None,
        "num_events": int(pc.sum(results.column("num_lines")).as_py() or 0),
        "ingested_at": datetime.now(timezone.utc).replace(tzinfo=None),
        "metadata": json.dumps(metadata),
    }


def _span_ps(start_ms: float, stop_ms: float) -> int | None:
    """Picoseconds from start to stop, or None past BIGINT (~106 days: result files of runs months
    apart in one folder span more than a capture's clock can hold)."""
    span = int((stop_ms - start_ms) * 1e9)
    return span if span < 2**63 else None


def _device_type(platform: str | None) -> str | None:
    """The trace planes' spelling, so runs group by device: 'tpu-v3-8192' and 'TPUv3-8192' -> 'TPU v3'."""
    match = re.match(r"tpu-?(v\d+)", platform or "", re.IGNORECASE)
    return f"TPU {match.group(1).lower()}" if match else platform


def ingest_tables_into(con: duckdb.DuckDBPyConnection, tables: MlperfTables) -> dict[str, int]:
    """Write loaded tables; the caller owns the transaction. Returns counts and the run ids."""
    results, intervals = tables
    run_ids: list[int] = []
    runs_rows: list[dict] = []
    folder_ids: dict[str, int] = {}
    for folder in sorted(set(results.column("folder").to_pylist())):
        existing = con.execute(
            "SELECT run_id FROM runs WHERE source_path = ? ORDER BY run_id", [folder]).fetchall()
        run_id = int(existing[0][0]) if existing else _next_run_id(con)
        for (old_id,) in existing:
            _delete_run(con, int(old_id))
        folder_ids[folder] = run_id
        run_ids.append(run_id)
        folder_results = results.filter(pc.equal(results.column("folder"), folder))
        runs_rows.append(_runs_row(folder, folder_results, run_id))

    runs_arrow = pa.Table.from_pylist(runs_rows)  # noqa: F841  (read by DuckDB by name)
    con.execute("INSERT INTO runs (run_id, name, source_path, source_format, device_type, num_hosts, "
                "num_devices, t0_ns, capture_start_ps, capture_end_ps, num_events, ingested_at, metadata) "
                "SELECT run_id, name, source_path, source_format, device_type, num_hosts, num_devices, "
                "t0_ns, capture_start_ps, capture_end_ps, num_events, ingested_at, metadata FROM runs_arrow")

    results_arrow = _with_run_id(results, folder_ids)  # noqa: F841
    intervals_arrow = _with_run_id(intervals, folder_ids)  # noqa: F841
    con.execute(f"INSERT INTO mlperf_results ({', '.join(RESULT_COLUMNS)}) "
                f"SELECT {', '.join(RESULT_COLUMNS)} FROM results_arrow")
    con.execute(f"INSERT INTO mlperf_intervals ({', '.join(INTERVAL_COLUMNS)}) "
                f"SELECT {', '.join(INTERVAL_COLUMNS)} FROM intervals_arrow")
    return {"runs": len(run_ids), "results": results.num_rows, "intervals": intervals.num_rows,
            "run_ids": run_ids}


def _with_run_id(table: pa.Table, folder_ids: dict[str, int]) -> pa.Table:
    ids = [folder_ids[folder] for folder in table.column("folder").to_pylist()]
    return table.append_column("run_id", pa.array(ids, pa.int32()))


def _delete_run(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    for table in ("mlperf_intervals", "mlperf_results", "runs"):
        con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])


def ingest_mlperf_into(con: duckdb.DuckDBPyConnection, paths: Iterable[str | Path]) -> dict[str, int]:
    """Parse then write MLPerf logs with an open connection, inside the caller's transaction.

    Everything is parsed before the first write, so a bad file raises TraceFormatError with the
    database untouched. Returns {"runs", "results", "intervals", "run_ids"}.
    """
    return ingest_tables_into(con, load_mlperf(paths))


def ingest_mlperf(paths: Iterable[str | Path], db_path: str | Path) -> dict[str, int]:
    """Parse MLPerf logs and write them to ``db_path`` in one transaction (all or nothing)."""
    tables = load_mlperf(paths)
    con = connect(db_path)
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            counts = ingest_tables_into(con, tables)
        except Exception:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
        return counts
    finally:
        con.close()
