"""One host file's rows as Parquet parts, written by a worker process without the run's database.

The worker converts the host with the loader (``store.load.write_host_tables``: typed columns,
stats JSON, time shift) straight into Parquet parts, through an in-memory DuckDB that holds no
table. The main process later inserts every host's parts in one transaction (``store.commit``), or,
for a Parquet dataset, moves the event parts into the hive layout.

Memory: a part's rows are gathered as numpy arrays up to ``store.load.FLUSH_EVENTS`` events, and
DuckDB writes each part with a small buffer (``LOAD_MEMORY_LIMIT``), so a worker holds a slice of
its host, however large the host.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import duckdb
from tpuanalyze.parsers.staging import HostReader
from tpuanalyze.store.load import write_host_tables

# The tables a host fills, in load order; ``EVENT_TABLES`` are the ones a Parquet dataset holds.
HOST_TABLES = ("planes", "lines", "event_metadata", "event_rows", "event_details")
EVENT_TABLES = ("event_rows", "event_details")

# DuckDB's buffer while a worker writes its host's parts (benchmarks/results/ingest_memory.md has
# the figures): XSpace in 16MB; Chrome-trace JSON carries wide stats rows. Out of memory: redone
# once with more.
LOAD_MEMORY_LIMIT = "16MB"
JSON_MEMORY_LIMIT = "256MB"
RETRY_MEMORY_LIMIT = "1GB"
# Parts the commit reads back once and removes: snappy (a third cheaper to write and read than
# zstd); parts that are kept (a Parquet dataset) or travel (from a cluster's worker): zstd.
STAGING_COMPRESSION = "snappy"
KEPT_COMPRESSION = "zstd"


def partition_value(value: str) -> str:
    """A hive partition value as a folder name: percent-encoded (DuckDB and pyarrow decode it)."""
    return quote(value, safe="")


@dataclass
class HostParts:
    """What a host's load produced: small, picklable (paths as strings)."""

    host: str
    planes: int = 0
    events: int = 0
    devices: int = 0
    device_type: str | None = None
    kinds_with_events: list[str] = field(default_factory=list)
    window: tuple[int | None, int | None] = (None, None)  # min start_ps, max end_ps (run-relative)
    files: dict[str, list[str]] = field(default_factory=dict)  # table -> its Parquet parts (none: no rows)
    hive: bool = False  # event tables written without run_id/host columns, under host=<host>/
    retried: str | None = None  # the note when the load ran out of memory and was redone


def host_part_dir(staging: str | Path, table: str, host: str) -> Path:
    """Where a host's part of ``table`` goes inside the staging folder (hive ``host=`` folder)."""
    return Path(staging) / table / f"host={partition_value(host)}"


def write_host_parts(
    reader: HostReader, run_t0_ns: int | None, staging: str | Path, hive_events: bool, compact: bool = False
) -> HostParts:
    """Write one host's tables to ``staging`` as Parquet parts.

    Event times are shifted to ``run_t0_ns`` exactly as a direct load shifts them. With
    ``hive_events`` the event tables are written without ``run_id``/``host`` (they are the
    dataset's partition folders); every other part keeps ``host`` and leaves ``run_id`` to the
    main process, which alone knows it. ``compact``: the parts travel (zstd, as dataset parts).
    """
    staging = Path(staging)
    compression = KEPT_COMPRESSION if hive_events or compact else STAGING_COMPRESSION
    limit = LOAD_MEMORY_LIMIT if reader.source_format == "xspace" else JSON_MEMORY_LIMIT
    try:
        return _write_parts(reader, run_t0_ns, limit, staging, hive_events, compression)
    except duckdb.OutOfMemoryException:
        _remove_parts(staging, reader.host)
        parts = _write_parts(reader, run_t0_ns, RETRY_MEMORY_LIMIT, staging, hive_events, compression)
        parts.retried = f"DuckDB ran out of its {limit} load buffer; loaded again with {RETRY_MEMORY_LIMIT}"
        return parts


def _write_parts(
    reader: HostReader, run_t0_ns: int | None, memory_limit: str, staging: Path, hive_events: bool,
    compression: str,
) -> HostParts:
    con = _connection()
    try:
        con.execute(f"SET memory_limit = '{memory_limit}'")
        folders = {table: host_part_dir(staging, table, reader.host) for table in HOST_TABLES}
        dropped = {
            table: ("run_id", "host") if hive_events and table in EVENT_TABLES else ("run_id",)
            for table in HOST_TABLES
        }
        load = write_host_tables(con, run_t0_ns, reader, folders, dropped, compression)
    except BaseException:
        _forget_connection()  # whatever state a failed statement left: the next host starts afresh
        raise
    return HostParts(
        host=reader.host,
        planes=load.counts.planes,
        events=load.counts.events,
        devices=load.devices,
        device_type=load.device_type,
        kinds_with_events=sorted(load.kinds_with_events),
        window=load.window,
        files={table: files for table, files in load.files.items() if files},
        hive=hive_events,
    )


_connections: dict[tuple[int, int], duckdb.DuckDBPyConnection] = {}


def _connection() -> duckdb.DuckDBPyConnection:
    """This thread's in-memory DuckDB for writing parts (it holds no table): opened once per
    process and thread, not per host (~25 ms of CPU each, a tenth of a pod host's load). By thread:
    a Dask worker runs several tasks at once in threads of one process, and a DuckDB connection
    runs one statement at a time; a forked worker opens its own."""
    key = (os.getpid(), threading.get_ident())
    con = _connections.get(key)
    if con is None:
        con = duckdb.connect(":memory:")
        con.execute("SET enable_progress_bar = false")
        con.execute("SET threads = 1")  # one worker = one core; the pool provides the parallelism
        con.execute("SET preserve_insertion_order = true")
        _connections[key] = con
    return con


def _forget_connection() -> None:
    con = _connections.pop((os.getpid(), threading.get_ident()), None)
    if con is not None:
        try:
            con.close()
        except duckdb.Error:
            pass


def _remove_parts(staging: Path, host: str) -> None:
    """A host's parts written before its load ran out of memory (redone from the start)."""
    for table in HOST_TABLES:
        shutil.rmtree(host_part_dir(staging, table, host), ignore_errors=True)


def make_hive(parts: HostParts) -> None:
    """Rewrite a host's event parts in the dataset's form (without ``host``, which the partition
    folder names), for a database found to keep its events in a dataset only at commit time."""
    if parts.hive:
        return
    con = duckdb.connect(":memory:")
    try:
        for table in EVENT_TABLES:
            for file in parts.files.get(table, []):
                source = Path(file)
                rewritten = source.with_name("hive-" + source.name)
                con.execute(
                    f"COPY (SELECT * EXCLUDE (host) FROM read_parquet('{_sql_text(source)}')) "
                    f"TO '{_sql_text(rewritten)}' (FORMAT parquet, COMPRESSION zstd)"
                )
                os.replace(rewritten, source)
    finally:
        con.close()
    parts.hive = True


def _sql_text(path: Path) -> str:
    return str(path).replace("'", "''")


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove a staging folder (best effort: it is scratch)."""
    shutil.rmtree(path, ignore_errors=True)
