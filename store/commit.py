"""The reduce side of an ingest: every host's Parquet parts into the database in ONE transaction.

The workers have already read and converted each host (``store.parts``); what is left here is
cheap and serial: replace the runs that came from the same source paths, give each run its id and
name, ``INSERT ... SELECT FROM read_parquet([...])`` each table, write the ``hosts`` and ``runs``
rows and the MLPerf result folders, and, for a Parquet dataset, move the event parts into its hive
layout. Any error rolls the whole call back (files moved back too): all or nothing.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
from tpuanalyze.store.database import delete_run, new_run_id
from tpuanalyze.store.names import unique_run_name
from tpuanalyze.store.parts import EVENT_TABLES, HOST_TABLES, HostParts, partition_value, remove_tree

from tpuanalyze.errors import TpuAnalyzeError

if TYPE_CHECKING:  # MLPerf tables are Arrow: imported only when MLPerf logs are ingested
    from tpuanalyze.parsers.mlperf import MlperfTables

# DuckDB's buffer while the parts are inserted. With the machine's threads, DuckDB inserts a table's
# row groups in parallel and still in file order (its batch insert), if it may buffer the row groups
# that finish early: 512-host pod, 18.9M events on two cores, 11.5 s wall with 512 MB against 17.0
# with 256 MB and 20.8 on one thread with 64 MB, at about the same CPU (rows and order identical).
# Should it run out, the load is rolled back and redone once with RETRY.
COMMIT_MEMORY_LIMIT = "512MB"
RETRY_MEMORY_LIMIT = "1GB"
# DuckDB's buffer for XSpace runs loaded directly (``RunToStore.load``): a transaction keeps the rows it
# appends in memory until its writer has them on disk, as much as the buffer allows. With 512 MB that
# was ~100 MB of a 2M-event file's ingest (peak RSS 211 MB, 383 for 6M events); with 128 MB: 180 and
# 352-356, in the same time; 64 MB: 172 and 332, 3.5% slower (benchmarks/results/bench_ingest.md)
DIRECT_XSPACE_MEMORY_LIMIT = "128MB"
PARQUET_COMMENT = "parquet:"  # comment of the event_rows view of a Parquet-layout database


@dataclass
class HostFile:
    """A host file as the ``hosts`` table describes it (from its reader)."""

    host: str
    file_path: str
    file_bytes: int
    hostnames: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


# A direct load: writes a run's host rows into the database's tables itself (given the connection,
# inside the transaction, and the run's id) and returns each host's ``HostParts`` (no files).
DirectLoad = Callable[[duckdb.DuckDBPyConnection, int], list[HostParts]]


@dataclass
class RunToStore:
    """A run whose hosts are loaded as parts, or by ``load`` inside the transaction (the map ran in
    this process: its rows go straight into the tables): what its ``runs`` and ``hosts`` rows need."""

    name: str
    source_path: str
    source_format: str
    t0_ns: int | None
    files: list[HostFile]  # discovery order
    parts: list[HostParts]  # same order (a direct load's: filled by ``load``)
    notes: list[str] = field(default_factory=list)
    load: DirectLoad | None = None


@dataclass
class Stored:
    """What the transaction wrote."""

    run_ids: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    replaced_run_ids: list[int] = field(default_factory=list)
    run_notes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planes: int = 0
    events: int = 0
    mlperf_runs: int = 0
    mlperf_results: int = 0
    mlperf_intervals: int = 0


def parquet_dir_of(con: duckdb.DuckDBPyConnection) -> Path | None:
    """The Parquet dataset a database's events live in, or None (events in the database file)."""
    rows = con.execute(
        "SELECT comment FROM duckdb_views() WHERE view_name = 'event_rows' "
        "AND database_name = current_database() AND NOT temporary"
    ).fetchall()
    if rows and rows[0][0] and str(rows[0][0]).startswith(PARQUET_COMMENT):
        return Path(str(rows[0][0])[len(PARQUET_COMMENT):])
    return None


def check_layout(con: duckdb.DuckDBPyConnection, db_path: str | Path, parquet: Path | None) -> Path | None:
    """The dataset this ingest writes events to (None: the database file), refusing a mismatch:
    a database keeps its events in one place, its own file or one Parquet dataset."""
    current = parquet_dir_of(con)
    if parquet is None:
        return current
    parquet = parquet.resolve()
    if current is not None and current != parquet:
        raise TpuAnalyzeError(
            f"the database's events are in the Parquet dataset {current}, not {parquet}", str(db_path)
        )
    if current is None:
        rows = con.execute("SELECT count(*) FROM event_rows").fetchall()[0][0]
        if rows:
            raise TpuAnalyzeError(
                "the database holds its events in its own file; --parquet needs a new database",
                str(db_path),
            )
    return parquet


def store_runs(
    con: duckdb.DuckDBPyConnection,
    db_path: str | Path,
    runs: list[RunToStore],
    mlperf: MlperfTables | None,
    parquet: Path | None,
) -> Stored:
    """Write every run (and the MLPerf folders) in one transaction; retried once with a larger
    DuckDB buffer should the first attempt run out of memory (a note says so)."""
    direct = all(run.load is not None and run.source_format == "xspace" for run in runs)
    first = DIRECT_XSPACE_MEMORY_LIMIT if runs and direct else COMMIT_MEMORY_LIMIT
    try:
        return _store_once(con, db_path, runs, mlperf, parquet, first)
    except _OutOfMemory:
        stored = _store_once(con, db_path, runs, mlperf, parquet, RETRY_MEMORY_LIMIT)
        stored.notes.append(
            f"DuckDB ran out of its {first} load buffer; loaded again with {RETRY_MEMORY_LIMIT}"
        )
        return stored


class _OutOfMemory(Exception):
    """The load ran out of DuckDB's buffer (rolled back; retried with more)."""


class _Moves:
    """Folders moved into a Parquet dataset during the transaction, undone if it fails."""

    def __init__(self, dataset: Path) -> None:
        self.dataset = dataset
        self.trash = dataset / f".replaced-{uuid.uuid4().hex[:12]}"
        self.done: list[tuple[Path, Path]] = []

    def move(self, source: Path, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
        self.done.append((source, target))

    def set_aside(self, folder: Path) -> None:
        """An old run's partition: out of the dataset's glob until the commit removes it."""
        if folder.exists():
            self.move(folder, self.trash / folder.relative_to(self.dataset))

    def undo(self) -> None:
        for source, target in reversed(self.done):
            try:
                source.parent.mkdir(parents=True, exist_ok=True)
                os.replace(target, source)
            except OSError:
                pass
        self.done.clear()
        remove_tree(self.trash)

    def finish(self) -> None:
        remove_tree(self.trash)


def _store_once(
    con: duckdb.DuckDBPyConnection,
    db_path: str | Path,
    runs: list[RunToStore],
    mlperf: MlperfTables | None,
    parquet: Path | None,
    memory_limit: str,
) -> Stored:
    stored = Stored()
    moves = _Moves(parquet) if parquet is not None else None
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute("BEGIN TRANSACTION")
    try:
        if parquet is not None:
            _make_event_views(con, parquet, with_files=False)  # the tables become views (no rows yet)
        for run in runs:
            # a re-ingested source keeps its run_id (saved `db:4` references stay valid) and name
            old_ids = _delete_previous(con, run.source_path, stored)
            run_id = old_ids[0] if old_ids else new_run_id(con)
            name = unique_run_name(con, run.source_path)
            notes = [f"{name}: {note}" for note in run.notes]
            if moves is not None:  # the replaced runs' partitions, and any left by a killed ingest
                for stale_id in sorted({*old_ids, run_id}):
                    for table in EVENT_TABLES:
                        moves.set_aside(parquet / table / f"run_id={stale_id}")
            if run.load is not None:
                assert parquet is None
                run.parts = run.load(con, run_id)
            _insert_parts(con, run, run_id, parquet, moves)
            _insert_hosts(con, run, run_id)
            _insert_run_row(con, run, run_id, name, notes)
            stored.run_ids.append(run_id)
            stored.names.append(name)
            stored.run_notes.extend(notes)
            stored.planes += sum(p.planes for p in run.parts)
            stored.events += sum(p.events for p in run.parts)
        _store_mlperf(con, mlperf, stored)
        if parquet is not None:
            _make_event_views(con, parquet, with_files=True)
        con.execute("COMMIT")
    except BaseException as exc:
        _rollback(con)
        if moves is not None:
            moves.undo()
        if isinstance(exc, duckdb.OutOfMemoryException) and memory_limit != RETRY_MEMORY_LIMIT:
            raise _OutOfMemory() from None
        if isinstance(exc, duckdb.InterruptException):  # Ctrl-C inside a statement: exit 130
            raise KeyboardInterrupt() from None
        if isinstance(exc, duckdb.Error):
            raise TpuAnalyzeError(
                f"loading failed, database unchanged: {first_line(exc)}", str(db_path)
            ) from None
        if isinstance(exc, OSError):
            raise TpuAnalyzeError(
                f"loading failed, database unchanged: {exc.strerror or exc}", str(exc.filename or db_path)
            ) from None
        raise
    if moves is not None:
        moves.finish()
    return stored


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    """A public table's columns in order (from the schema; event tables may be views)."""
    return [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def _insert_parts(
    con: duckdb.DuckDBPyConnection,
    run: RunToStore,
    run_id: int,
    parquet: Path | None,
    moves: _Moves | None,
) -> None:
    """One ``INSERT ... SELECT FROM read_parquet([...])`` per table over all hosts of the run
    (hosts in discovery order), or, for the dataset's event tables, the parts moved into place."""
    for table in HOST_TABLES:
        files = [file for p in run.parts for file in p.files.get(table, [])]
        if not files:
            continue
        if parquet is not None and table in EVENT_TABLES:
            assert moves is not None
            for part in run.parts:
                if part.files.get(table):
                    folder = Path(part.files[table][0]).parent
                    target = parquet / table / f"run_id={run_id}" / f"host={partition_value(part.host)}"
                    moves.move(folder, target)
            continue
        columns = [c for c in _columns(con, table) if c != "run_id"]
        names = ", ".join(columns)
        con.execute(
            f"INSERT INTO {table} (run_id, {names}) "
            f"SELECT $run_id, {names} FROM read_parquet({_sql_list(files)}, hive_partitioning = false)",
            {"run_id": run_id},
        )


def _insert_hosts(con: duckdb.DuckDBPyConnection, run: RunToStore, run_id: int) -> None:
    con.execute(
        """INSERT INTO hosts
           SELECT $run_id, unnest($host), unnest($file_path), unnest($file_bytes),
                  unnest(CAST($hostnames AS VARCHAR[][])), unnest(CAST($errors AS VARCHAR[][])),
                  unnest(CAST($warnings AS VARCHAR[][]))""",
        {
            "run_id": run_id,
            "host": [h.host for h in run.files],
            "file_path": [h.file_path for h in run.files],
            "file_bytes": [int(h.file_bytes) for h in run.files],
            "hostnames": [list(h.hostnames) for h in run.files],
            "errors": [list(h.errors) for h in run.files],
            "warnings": [list(h.warnings) for h in run.files],
        },
    )


def _insert_run_row(
    con: duckdb.DuckDBPyConnection, run: RunToStore, run_id: int, name: str, notes: list[str]
) -> None:
    """The ``runs`` row: capture window, devices and device type from the hosts' parts."""
    starts = [p.window[0] for p in run.parts if p.window[0] is not None]
    ends = [p.window[1] for p in run.parts if p.window[1] is not None]
    metadata: dict[str, Any] = {}
    for h in run.files:
        for key, value in h.metadata.items():
            metadata.setdefault(key, value)
    if notes:
        metadata["notes"] = notes
    device_type = next((p.device_type for p in run.parts if p.device_type), None)
    if device_type is None:
        kinds = {k for p in run.parts for k in p.kinds_with_events}
        device_type = "TPU" if "tpu" in kinds else "GPU" if "gpu" in kinds else "CPU"
    con.execute(
        """INSERT INTO runs (run_id, name, source_path, source_format, device_type, num_hosts,
               num_devices, t0_ns, capture_start_ps, capture_end_ps, num_events, ingested_at, metadata)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        [
            run_id,
            name,
            run.source_path,
            run.source_format,
            device_type,
            len(run.files),
            sum(p.devices for p in run.parts),
            run.t0_ns,
            min(starts) if starts else None,
            max(ends) if ends else None,
            sum(p.events for p in run.parts),
            datetime.now(timezone.utc).replace(tzinfo=None),
            json.dumps(metadata, default=str) if metadata else None,
        ],
    )


_HIVE_TYPES = "{'run_id': INTEGER, 'host': VARCHAR}"


def _make_event_views(con: duckdb.DuckDBPyConnection, dataset: Path, with_files: bool) -> None:
    """``event_rows`` / ``event_details`` as views over the dataset's hive folders, with the
    schema's column names, order and types (an empty typed relation while a table has no files)."""
    for table in EVENT_TABLES:
        described = con.execute(f"DESCRIBE {table}").fetchall()
        typed = [(r[0], r[1]) for r in described]
        kind = con.execute(
            "SELECT table_type FROM information_schema.tables WHERE table_schema = 'main' AND table_name = ?",
            [table],
        ).fetchall()
        if kind and kind[0][0] == "BASE TABLE":
            con.execute(f"DROP TABLE {table}")
        pattern = dataset / table / "*" / "*" / "*.parquet"
        has_files = with_files and any((dataset / table).glob("run_id=*/host=*/*.parquet"))
        if has_files:
            select = ", ".join(f"CAST({c} AS {t}) AS {c}" for c, t in typed)
            source = (
                f"read_parquet('{_sql_text(pattern)}', hive_partitioning = true, "
                f"hive_types = {_HIVE_TYPES}, union_by_name = true)"
            )
            body = f"SELECT {select} FROM {source}"
        else:
            body = "SELECT " + ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in typed) + " WHERE false"
        con.execute(f"CREATE OR REPLACE VIEW {table} AS {body}")
        con.execute(f"COMMENT ON VIEW {table} IS '{_sql_text(PARQUET_COMMENT + str(dataset))}'")


def _sql_text(value: object) -> str:
    return str(value).replace("'", "''")


def _store_mlperf(con: duckdb.DuckDBPyConnection, mlperf: MlperfTables | None, stored: Stored) -> None:
    """Write the parsed MLPerf result folders inside the caller's transaction (after the trace runs,
    so their run ids come first). A re-ingested folder keeps its run_id; it is reported as replaced."""
    if mlperf is None:
        return
    from tpuanalyze.store.mlperf import ingest_tables_into

    folders = sorted(set(mlperf.results.column("folder").to_pylist()))
    old = con.execute(
        "SELECT run_id FROM runs WHERE list_contains(?, source_path) ORDER BY run_id", [folders]
    ).fetchall()
    counts = ingest_tables_into(con, mlperf)
    stored.replaced_run_ids.extend(int(r[0]) for r in old)
    stored.run_ids.extend(int(r) for r in counts["run_ids"])
    stored.mlperf_runs = int(counts["runs"])
    stored.mlperf_results = int(counts["results"])
    stored.mlperf_intervals = int(counts["intervals"])


def _delete_previous(con: duckdb.DuckDBPyConnection, source_path: str, stored: Stored) -> list[int]:
    """Remove the runs loaded earlier from the same source; their ids, smallest first."""
    old = con.execute(
        "SELECT run_id FROM runs WHERE source_path = ? ORDER BY run_id", [source_path]
    ).fetchall()
    for (old_id,) in old:
        delete_run(con, old_id)
        stored.replaced_run_ids.append(old_id)
    return [int(r[0]) for r in old]


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back if a transaction is still open; a failed COMMIT (disk full) has already ended it,
    and its error, not "cannot rollback", is the one to report."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
