"""The per-host tasks of the map: top-level functions of picklable arguments (file paths as
strings), so any executor, a process pool or a cluster, can run them.

``probe_host`` validates a host file and finds its time zero (the run's t0 is the earliest host's);
``load_host`` reads it again, shifted to the run's t0, into Parquet parts (``store.parts``), or
several consecutive small hosts of a run into one set of parts (a pod's per-host fixed costs,
paid once per task). Each returns only small things; a bad file is an error *result* (reason and
path), so the main process reports the first bad host of the call and leaves the database as it was.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from tpuanalyze.errors import TpuAnalyzeError, TraceFormatError
from tpuanalyze.parsers.readers import READERS
from tpuanalyze.parsers.remote import is_url, local_input
from tpuanalyze.parsers.staging import HostReader
from tpuanalyze.store.commit import HostFile
from tpuanalyze.store.parts import RETRY_MEMORY_LIMIT, GroupParts, HostParts

# Readers a probe keeps for the load of the same process (the inline executor): an XSpace reader
# holds byte ranges (kilobytes), a Chrome-trace reader every event, kept while they fit.
KEEP_BYTES = 256 << 20
_kept: dict[str, HostReader] = {}
_kept_bytes = 0


@dataclass(frozen=True)
class HostInput:
    """One host file of a run."""

    host: str
    path: str
    source_format: str  # 'xspace' | 'chrome_json'
    # 'numpy': an XSpace file read with the numpy decoder whatever its size (the direct load of one
    # process: its inserts set the pace, parsers/xspace.py); 'auto': the reader's choice by event count
    decoder: str = "auto"


@dataclass
class TaskError:
    """A host the map could not read: the one-line reason and the file it names."""

    reason: str
    path: str | None


@dataclass
class Probe:
    """A validated host file: its time zero, size and the facts of its ``hosts`` row."""

    t0_ns: int | None = None
    num_events: int = 0
    file: HostFile | None = None
    error: TaskError | None = None


@dataclass(frozen=True)
class LoadTask:
    """Load consecutive hosts of one run (most often one), in order, times shifted to
    ``run_t0_ns``, as one set of Parquet parts under ``staging``."""

    inputs: tuple[HostInput, ...]
    run_t0_ns: int | None
    staging: str
    hive_events: bool = False
    compact: bool = False  # the parts travel (from a cluster's worker): smallest files
    compiled: bool = False  # this process reads enough events for the compiled decoder


    @property
    def input(self) -> HostInput:
        """The first host (what a failure of the whole task is reported under)."""
        return self.inputs[0]


@dataclass
class Loaded:
    parts: list[HostParts] | None = None  # one per host of the task, in order
    error: TaskError | None = None


def _open(item: HostInput, local: Path | None = None) -> HostReader:
    """The host's reader; for a URL, over its local copy ``local``, the URL kept as its file_path."""
    if item.decoder != "auto" and item.source_format == "xspace":
        reader = READERS["xspace"](local or Path(item.path), item.host, decoder=item.decoder)
    else:
        reader = READERS[item.source_format](local or Path(item.path), item.host)
    if local is not None:
        reader.file_path = item.path  # what the database stores and errors name (docs/cluster.md)
    return reader


def _error(exc: BaseException, item: HostInput) -> TaskError:
    if isinstance(exc, TpuAnalyzeError):
        return TaskError(exc.reason, exc.path or item.path)
    assert isinstance(exc, OSError)
    return TaskError(f"cannot read: {exc.strerror or exc}", item.path)


def probe_host(item: HostInput) -> Probe:
    """Open and validate the host file (every reader checks its whole file when opened)."""
    global _kept_bytes
    url = is_url(item.path)
    try:
        with local_input(item.path) as local:  # a URL: a local copy while it is read
            reader = _open(item, local if url else None)
    except (TpuAnalyzeError, OSError) as exc:
        return Probe(error=_error(exc, item))
    size = 0 if item.source_format == "xspace" else reader.file_bytes
    if not url and _kept_bytes + size <= KEEP_BYTES:  # a URL's copy is gone: never kept
        _kept[item.path] = reader
        _kept_bytes += size
    facts = HostFile(
        host=reader.host,
        file_path=reader.file_path,
        file_bytes=int(reader.file_bytes),
        hostnames=list(reader.hostnames),
        errors=list(reader.errors),
        warnings=list(reader.warnings),
        metadata=dict(reader.metadata),
    )
    return Probe(t0_ns=reader.t0_ns, num_events=int(reader.num_events), file=facts)


def load_host(task: LoadTask) -> Loaded:
    """Read the task's host files, in order, into one set of Parquet parts
    (``store.parts.GroupParts``); the first file that cannot be read is the task's error, and
    nothing the task wrote is left. Out of DuckDB's load buffer: redone once with more."""
    try:
        return _load(task, None)
    except _OutOfMemory as short:
        loaded = _load(task, RETRY_MEMORY_LIMIT)
        if loaded.parts:
            loaded.parts[0].retried = (
                f"DuckDB ran out of its {short.limit} load buffer; loaded again with {RETRY_MEMORY_LIMIT}"
            )
        return loaded


class _OutOfMemory(Exception):
    """A load ran out of its DuckDB buffer (``limit``); its parts are removed."""

    def __init__(self, limit: str) -> None:
        super().__init__(limit)
        self.limit = limit


def _add_host(group: GroupParts, item: HostInput, compiled: bool) -> HostParts:
    """Read one host file into ``group``: the reader its probe kept in this process, else the file
    opened again (a URL: over a local copy while it is read); the reader's buffers released after."""
    url = is_url(item.path)
    with local_input(item.path) as local:
        reader = _kept.pop(item.path, None) or _open(item, local if url else None)
        use_compiled = getattr(reader, "use_compiled", None)
        if compiled and use_compiled:
            use_compiled()
        parts = group.add(reader)
    release = getattr(reader, "release", None)
    if release:
        release()
    return parts


def _load(task: LoadTask, memory_limit: str | None) -> Loaded:
    first = task.input
    group = GroupParts(first.host, first.source_format, task.run_t0_ns, task.staging, task.hive_events,
                       task.compact, memory_limit)
    try:
        for item in task.inputs:
            try:
                _add_host(group, item, task.compiled)
            except (TpuAnalyzeError, OSError) as exc:
                group.discard()
                return Loaded(error=_error(exc, item))
        return Loaded(parts=group.finish())
    except duckdb.OutOfMemoryException:
        group.discard()
        if memory_limit == RETRY_MEMORY_LIMIT:
            raise
        raise _OutOfMemory(group.limit) from None
    except BaseException:
        group.discard()
        raise


def load_direct(con: duckdb.DuckDBPyConnection, run_id: int, inputs: list[HostInput], run_t0_ns: int | None,
                compiled: bool = False, on_host: Callable[[str, int], None] | None = None) -> list[HostParts]:
    """Read a run's host files, in order, straight into the tables of ``con`` as run ``run_id``
    (``GroupParts.direct``: inside the caller's transaction, which a failure rolls back). For a map
    that runs in this process: no Parquet parts written and read back (benchmarks/results/
    bench_ingest.md). ``on_host(file name, events)`` after each host. A file that cannot be read
    raises ``TraceFormatError`` naming it."""
    if not inputs:
        return []
    first = inputs[0]
    group = GroupParts.direct(con, run_id, first.host, first.source_format, run_t0_ns)
    try:
        for item in inputs:
            try:
                parts = _add_host(group, item, compiled)
            except (TpuAnalyzeError, OSError) as exc:
                error = _error(exc, item)
                raise TraceFormatError(error.reason, error.path) from None
            if on_host is not None:
                on_host(Path(item.path).name, parts.events)
        return group.finish()
    except BaseException:
        group.discard()  # ends a statement still reading the events: the caller's rollback needs ``con``
        raise


def forget_kept() -> None:
    """Drop the readers kept by this process's probes (end of an ingest call)."""
    global _kept_bytes
    _kept.clear()
    _kept_bytes = 0


@dataclass(frozen=True)
class MapTask:
    """Load consecutive hosts of a run (``load``) and attribute them where they were read
    (analyzer/batch_map.py): the batch ``index`` of its run. ``programs_run``: the run's program
    executions (Arrow), for a batch attributed again with the run's dominant program."""

    load: LoadTask
    config: dict
    index: int
    source_format: str
    programs_run: Any = None
    # the events of device op lines stored too (their op rows come back from the map either way): a
    # report's temporary database needs only the others (analyzer/event_partials.py)
    store_op_events: bool = True
    analyze: bool = True  # False: a plain load (``load_host``: parts, every event) of a run analysed later

    @property
    def input(self) -> HostInput:
        return self.load.input

    @property
    def inputs(self) -> tuple[HostInput, ...]:
        return self.load.inputs


@dataclass
class Mapped:
    """A map task's hosts (their parts for the commit) and the batch's analysis results."""

    parts: list[HostParts] | None = None
    result: Any = None  # analyzer.batch_map.BatchResult
    error: TaskError | None = None


# the run id of a map worker's own database (the run's real id is the commit's)
MAP_RUN_ID = 0


def map_hosts(task: MapTask) -> Mapped:
    """Read the task's hosts into memory (``store.batch.BatchTables``), write the parts of the rows to
    store for the commit (without the device op events unless ``store_op_events``), then attribute
    the hosts where they are (``analyzer.batch_map.map_batch`` over a DuckDB of this process given the
    batch as its base tables): the op rows go to a Parquet file beside the parts, the rest comes back
    in the result."""
    from tpuanalyze.analyzer.batch_map import map_batch
    from tpuanalyze.store.batch import BatchTables
    from tpuanalyze.store.database import table_ddl

    load = task.load
    if not task.analyze:
        loaded = load_host(load)
        return Mapped(parts=loaded.parts, error=loaded.error)
    first = load.input
    with _map_database() as con:
        con.execute(table_ddl("runs"))
        con.execute("INSERT INTO runs (run_id, name, source_path, source_format, num_hosts, num_devices, "
                    "t0_ns, num_events, ingested_at) VALUES (?, ?, ?, ?, ?, 0, ?, 0, now())",
                    [MAP_RUN_ID, first.host, first.path, task.source_format, len(load.inputs),
                     load.run_t0_ns])
        batch = BatchTables(con, load.run_t0_ns)
        for item in load.inputs:
            try:
                _add_host(batch, item, load.compiled)  # type: ignore[arg-type]
            except (TpuAnalyzeError, OSError) as exc:
                return Mapped(error=_error(exc, item))
        hosts = batch.write_parts(load.staging, "zstd" if load.compact else "snappy",
                                  None if task.store_op_events else batch.off_op_lines())
        batch.register(con, MAP_RUN_ID)
        op_rows = Path(load.staging) / "op_rows" / f"batch-{task.index}.parquet"
        op_rows.parent.mkdir(parents=True, exist_ok=True)
        result = map_batch(con, MAP_RUN_ID, task.config, task.index, op_rows, task.programs_run, batch)
        return Mapped(parts=hosts, result=result)


# A pool worker's DuckDB database, kept for all its map tasks (``_map_database``)
_worker_database: duckdb.DuckDBPyConnection | None = None
_task_count = 0


@contextmanager
def _map_database() -> Iterator[duckdb.DuckDBPyConnection]:
    """A map task's own empty DuckDB database, one thread (the pool provides the parallelism).

    In a pool worker: a database attached in memory to one DuckDB instance the worker keeps for all its
    tasks, and detached after. Why: opening and closing a DuckDB instance, and setting its threads or
    memory limit, each call glibc's ``malloc_trim(0)``, which hands the memory the previous task freed
    back to the system, and the next task page-faults it in again (executors.keep_freed_memory;
    ~45 calls per worker at 512 hosts, benchmarks/results/pod.md). Elsewhere (this process, a
    cluster's worker threads): a fresh in-memory instance per task, closed after."""
    global _worker_database, _task_count
    from tpuanalyze.analyzer.resources import MEMORY_LIMIT_BYTES
    from tpuanalyze.pipeline import executors

    if not executors.pool_worker:
        con = duckdb.connect(":memory:")
        try:
            con.execute("SET enable_progress_bar = false")
            con.execute("SET threads = 1")
            yield con
        finally:
            con.close()
        return
    if _worker_database is None:
        spill = tempfile.mkdtemp(prefix="tpuanalyze-map-")
        atexit.register(shutil.rmtree, spill, True)
        _worker_database = duckdb.connect(":memory:", config={
            "threads": 1, "async_threads": 0, "memory_limit": f"{MEMORY_LIMIT_BYTES // 2**20}MiB",
            "temp_directory": f"{spill}/spill"})
    _task_count += 1
    name = f"ta_map_{_task_count}"
    con = _worker_database.cursor()  # its temporary tables and registered views go with it
    try:
        con.execute("SET enable_progress_bar = false")
        con.execute(f"ATTACH ':memory:' AS {name}")
        con.execute(f"USE {name}")
        yield con
    finally:
        try:
            con.execute("USE memory")
            con.execute(f"DETACH DATABASE IF EXISTS {name}")
        finally:
            con.close()


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")
