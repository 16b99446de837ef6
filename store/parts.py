"""One host file's rows as Parquet parts, written by a worker process without the run's database.

The worker loads the host with the very loader the database uses (``store.load._load_host``: the
same typed columns, stats JSON and time shift) into a scratch DuckDB file of its own, then copies
each table to Parquet. The main process later inserts every host's parts in one transaction
(``store.commit``), or, for a Parquet dataset, moves the event parts into the hive layout.

A host file up to ``IN_MEMORY_BYTES`` loads into an in-memory DuckDB (creating, committing and
closing a database file cost ~0.3 s a host, most of the work of a small host); a larger one into a
scratch *file*: with the load's small memory limit DuckDB writes full row groups to disk as they
fill, so a worker's memory stays bounded by a row group, not by its host.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb
from tpuanalyze.parsers.staging import HostReader
from tpuanalyze.store.database import schema_sql
from tpuanalyze.store.load import RunCounts, _load_host

# The tables a host fills, in load order; ``EVENT_TABLES`` are the ones a Parquet dataset holds.
HOST_TABLES = ("planes", "lines", "event_metadata", "event_rows", "event_details")
EVENT_TABLES = ("event_rows", "event_details")

# DuckDB's buffer while a worker loads its host (benchmarks/results/ingest_memory.md has the figures): XSpace
# loads in 16MB; Chrome-trace JSON carries wide stats rows. Out of memory: redone once with more.
LOAD_MEMORY_LIMIT = "16MB"
JSON_MEMORY_LIMIT = "256MB"
RETRY_MEMORY_LIMIT = "1GB"
IN_MEMORY_BYTES = 16 << 20
IN_MEMORY_LIMIT = "256MB"  # the host's rows are held by this buffer until copied out


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
    files: dict[str, str] = field(default_factory=dict)  # table -> Parquet file ('' if no rows)
    hive: bool = False  # event tables written without run_id/host columns, under host=<host>/
    retried: str | None = None  # the note when the load ran out of memory and was redone


def host_part_dir(staging: str | Path, table: str, host: str) -> Path:
    """Where a host's part of ``table`` goes inside the staging folder (hive ``host=`` folder)."""
    return Path(staging) / table / f"host={partition_value(host)}"


def write_host_parts(
    reader: HostReader, run_t0_ns: int | None, staging: str | Path, hive_events: bool
) -> HostParts:
    """Load one host into a scratch DuckDB file and copy its tables to ``staging`` as Parquet.

    Event times are shifted to ``run_t0_ns`` exactly as a direct load shifts them. With
    ``hive_events`` the event tables are written without ``run_id``/``host`` (they are the
    dataset's partition folders); every other part keeps ``host`` and leaves ``run_id`` to the
    main process, which alone knows it.
    """
    staging = Path(staging)
    if reader.file_bytes <= IN_MEMORY_BYTES:
        scratch = None
        limit = IN_MEMORY_LIMIT
    else:
        scratch = staging / "scratch" / f"{partition_value(reader.host)}.duckdb"
        scratch.parent.mkdir(parents=True, exist_ok=True)
        limit = LOAD_MEMORY_LIMIT if reader.source_format == "xspace" else JSON_MEMORY_LIMIT
    try:
        try:
            parts = _load_into_scratch(reader, run_t0_ns, scratch, limit, staging, hive_events)
        except duckdb.OutOfMemoryException:
            _remove_db(scratch)
            parts = _load_into_scratch(reader, run_t0_ns, scratch, RETRY_MEMORY_LIMIT, staging, hive_events)
            parts.retried = (
                f"DuckDB ran out of its {limit} load buffer; loaded again with {RETRY_MEMORY_LIMIT}"
            )
    finally:
        _remove_db(scratch)
    return parts


def _load_into_scratch(
    reader: HostReader,
    run_t0_ns: int | None,
    scratch: Path | None,
    memory_limit: str,
    staging: Path,
    hive_events: bool,
) -> HostParts:
    con = duckdb.connect(str(scratch) if scratch is not None else ":memory:")
    try:
        con.execute("SET enable_progress_bar = false")
        con.execute(f"SET memory_limit = '{memory_limit}'")
        con.execute("SET threads = 1")  # one worker = one core; the pool provides the parallelism
        con.execute("SET preserve_insertion_order = true")
        con.execute(schema_sql())
        counts = RunCounts()
        facts: dict[str, Any] = {"devices": 0, "device_type": None, "kinds_with_events": set()}
        con.execute("BEGIN TRANSACTION")
        _load_host(con, 0, run_t0_ns, reader, counts, facts, None)
        con.execute("COMMIT")
        window = con.execute(
            "SELECT min(start_ps), max(start_ps + duration_ps) FROM event_rows"
        ).fetchall()[0]
        parts = HostParts(
            host=reader.host,
            planes=counts.planes,
            events=counts.events,
            devices=int(facts["devices"]),
            device_type=facts["device_type"],
            kinds_with_events=sorted(facts["kinds_with_events"]),
            window=(window[0], window[1]),
            hive=hive_events,
        )
        for table in HOST_TABLES:
            hive = hive_events and table in EVENT_TABLES
            dropped = "run_id, host" if hive else "run_id"
            folder = host_part_dir(staging, table, reader.host)
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / "part-0.parquet"
            written = con.execute(
                f"COPY (SELECT * EXCLUDE ({dropped}) FROM {table}) TO '{_sql_text(target)}' "
                "(FORMAT parquet, COMPRESSION zstd)"
            ).fetchall()[0][0]
            if written:
                parts.files[table] = str(target)
            else:  # no part for an empty table (a dataset holds no empty files)
                target.unlink()
                folder.rmdir()
                parts.files[table] = ""
        return parts
    finally:
        con.close()


def make_hive(parts: HostParts) -> None:
    """Rewrite a host's event parts in the dataset's form (without ``host``, which the partition
    folder names), for a database found to keep its events in a dataset only at commit time."""
    if parts.hive:
        return
    con = duckdb.connect(":memory:")
    try:
        for table in EVENT_TABLES:
            if not parts.files.get(table):
                continue
            source = Path(parts.files[table])
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


def _remove_db(path: Path | None) -> None:
    if path is None:
        return
    for extra in (path, path.with_name(path.name + ".wal")):
        if extra.exists():
            extra.unlink()
    spill = path.with_name(path.name + ".tmp")
    if spill.is_dir():
        shutil.rmtree(spill, ignore_errors=True)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove a staging folder (best effort: it is scratch)."""
    shutil.rmtree(path, ignore_errors=True)
