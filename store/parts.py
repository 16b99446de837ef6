"""Host files' rows as Parquet parts, written by a worker process without the run's database.

The worker converts a host, or several consecutive small hosts of a run (``GroupParts``), with the
loader (``store.load.TablesWriter``: typed columns, stats JSON, time shift) straight into Parquet
parts, through an in-memory DuckDB that holds no table; hosts loaded together share their parts.
The main process later inserts every host's parts in one transaction (``store.commit``), or, for
a Parquet dataset, moves the event parts (one folder per host) into the hive layout.

Memory: a part's rows are gathered as numpy arrays up to ``store.load.FLUSH_EVENTS`` events, and
DuckDB writes each part with a small buffer (``LOAD_MEMORY_LIMIT``), so a worker holds a slice of
its hosts, however large a host or however many the task takes.
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
from tpuanalyze.store.load import TablesWriter

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
    # table -> the Parquet parts holding this host's rows (none: no rows). Hosts loaded together
    # share parts: the first host of the group lists them, with ``group`` the hosts whose rows they
    # hold, in order; the others list none (a dataset's event parts excepted: one folder per host).
    files: dict[str, list[str]] = field(default_factory=dict)
    group: list[str] = field(default_factory=list)
    hive: bool = False  # event tables written without run_id/host columns, under host=<host>/
    retried: str | None = None  # the note when the load ran out of memory and was redone


def host_part_dir(staging: str | Path, table: str, host: str) -> Path:
    """Where a host's part of ``table`` goes inside the staging folder (hive ``host=`` folder)."""
    return Path(staging) / table / f"host={partition_value(host)}"


def group_part_dir(staging: str | Path, table: str, first_host: str) -> Path:
    """Where the parts of ``table`` shared by a group of hosts go (named by its first host)."""
    return Path(staging) / table / f"group={partition_value(first_host)}"


class GroupParts:
    """Consecutive hosts of a run written as one set of Parquet parts under ``staging``.

    ``add`` a host's reader at a time (only one host's rows held, plus at most ``FLUSH_EVENTS``
    pending rows), then ``finish``; ``discard`` removes whatever was written (a failed host, or a
    load redone). Event times are shifted to ``run_t0_ns`` exactly as a direct load shifts them.
    With ``hive_events`` the event tables are written without ``run_id``/``host``, one folder per
    host (they are the dataset's partition folders); every other part keeps ``host`` and leaves
    ``run_id`` to the main process, which alone knows it. ``compact``: the parts travel (zstd).

    ``direct(con, run_id, ...)``: the same rows inserted straight into the database of ``con`` instead,
    inside the caller's transaction (the map ran in the calling process: no parts to write and read
    back); nothing to discard then, the caller's rollback undoes a failure.
    """

    def __init__(
        self, first_host: str, source_format: str, run_t0_ns: int | None, staging: str | Path | None,
        hive_events: bool, compact: bool = False, memory_limit: str | None = None,
        direct: tuple[duckdb.DuckDBPyConnection, int] | None = None,
    ) -> None:
        self.staging = Path(staging) if staging is not None else None
        self.run_t0_ns = run_t0_ns
        self.hive_events = hive_events
        self.first_host = first_host
        self.limit = memory_limit or (LOAD_MEMORY_LIMIT if source_format == "xspace" else JSON_MEMORY_LIMIT)
        compression = KEPT_COMPRESSION if hive_events or compact else STAGING_COMPRESSION
        dropped = {
            table: ("run_id", "host") if hive_events and table in EVENT_TABLES else ("run_id",)
            for table in HOST_TABLES
        }
        self.hosts: list[HostParts] = []
        self._started: list[str] = []  # hosts whose rows were (being) written
        self._direct = direct is not None
        if direct is not None:
            assert not hive_events
            self.folders: dict[str, Path | None] = dict.fromkeys(HOST_TABLES)
            self._con, run_id = direct
            self._writer = TablesWriter(self._con, self.folders, dropped, compression, run_id)
            return
        assert self.staging is not None
        self.folders = {table: group_part_dir(self.staging, table, first_host) for table in HOST_TABLES}
        self._con = _connection()
        try:
            self._con.execute(f"SET memory_limit = '{self.limit}'")
            self._writer = TablesWriter(self._con, self.folders, dropped, compression)
        except BaseException:
            _forget_connection()
            raise

    @classmethod
    def direct(cls, con: duckdb.DuckDBPyConnection, run_id: int, first_host: str, source_format: str,
               run_t0_ns: int | None) -> GroupParts:
        """Hosts of run ``run_id`` inserted into the tables of ``con`` (its open transaction)."""
        return cls(first_host, source_format, run_t0_ns, None, False, direct=(con, run_id))

    def add(self, reader: HostReader) -> HostParts:
        """Write the host's rows (some may stay pending until the next ``add`` or ``finish``)."""
        self._started.append(reader.host)
        try:
            if self.hive_events:  # this host's event parts go to its own folder
                previous = self._writer.event_folders(
                    {table: host_part_dir(self.staging, table, reader.host) for table in EVENT_TABLES}
                )
                self._give_event_files(previous)
            load = self._writer.add_host(reader, self.run_t0_ns)
        except BaseException:
            if not self._direct:
                _forget_connection()  # whatever state a failed statement left: the next host starts afresh
            raise
        parts = HostParts(
            host=reader.host,
            planes=load.counts.planes,
            events=load.counts.events,
            devices=load.devices,
            device_type=load.device_type,
            kinds_with_events=sorted(load.kinds_with_events),
            window=load.window,
            hive=self.hive_events,
        )
        self.hosts.append(parts)
        return parts

    def finish(self) -> list[HostParts]:
        """Write every pending row: each host's ``HostParts``, the group's parts on its first."""
        try:
            files = self._writer.finish()
        except BaseException:
            if not self._direct:
                _forget_connection()
            raise
        if self.hive_events:
            self._give_event_files({table: files.pop(table) for table in EVENT_TABLES})
        if self.hosts:
            first = self.hosts[0]
            first.files.update({table: names for table, names in files.items() if names})
            first.group = [h.host for h in self.hosts]
        return self.hosts

    def _give_event_files(self, files: dict[str, list[str]]) -> None:
        """A dataset's event parts of the host added last: its own folder's."""
        if self.hosts:
            self.hosts[-1].files.update({table: names for table, names in files.items() if names})

    def discard(self) -> None:
        """Remove the group's parts (written or half written). A direct load has none: its running
        statement, if any, is ended (the caller's rollback undoes the rows)."""
        if self._direct:
            self._writer.abort()
            return
        assert self.staging is not None
        for table in HOST_TABLES:
            shutil.rmtree(self.folders[table], ignore_errors=True)
            if self.hive_events and table in EVENT_TABLES:
                for host in self._started:
                    shutil.rmtree(host_part_dir(self.staging, table, host), ignore_errors=True)


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


def make_hive(hosts: list[HostParts]) -> None:
    """Rewrite a run's event parts in the dataset's form (one folder per host, without ``host``,
    which the partition folder names), for a database found to keep its events in a dataset only
    at commit time. ``hosts``: the run's, in order (a group's members follow its first host)."""
    con = duckdb.connect(":memory:")
    try:
        for index, parts in enumerate(hosts):
            if parts.hive:
                continue
            members = hosts[index : index + max(len(parts.group), 1)]
            for table in EVENT_TABLES:
                files = parts.files.pop(table, [])
                if not files:
                    continue
                source = f"read_parquet({_sql_list(files)}, hive_partitioning = false)"
                for member in members:
                    folder = Path(files[0]).parent.parent / f"host={partition_value(member.host)}"
                    folder.mkdir(parents=True, exist_ok=True)
                    target = folder / "part-0.parquet"
                    written = con.execute(
                        f"COPY (SELECT * EXCLUDE (host) FROM {source} WHERE host = $host) "
                        f"TO '{_sql_text(target)}' (FORMAT parquet, COMPRESSION zstd)",
                        {"host": member.host},
                    ).fetchone()
                    if written and written[0]:
                        member.files[table] = [str(target)]
                    else:
                        target.unlink()
                        folder.rmdir()
                for file in files:
                    os.unlink(file)
            for member in members:
                member.hive = True
    finally:
        con.close()


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + _sql_text(Path(p)) + "'" for p in paths) + "]"


def _sql_text(path: Path) -> str:
    return str(path).replace("'", "''")


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove a staging folder (best effort: it is scratch)."""
    shutil.rmtree(path, ignore_errors=True)
