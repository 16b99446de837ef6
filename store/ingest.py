"""``ingest_paths``: traces and MLPerf result logs -> DuckDB, all or nothing per call.

Two passes. First every file of every run is parsed and validated (a bad file stops the call
before the database is even opened, so it stays exactly as it was) and each host's time zero is
found; MLPerf logs are parsed whole. Then one transaction replaces runs that came from the same
source paths and streams the new ones in, plane by plane, in numpy batches, then writes the MLPerf
result folders; any error there rolls the whole call back. After the commit the analyzer's
attribution views are (re)created, so findings' evidence SQL runs on the database.
Validated XSpace readers are kept between the passes (they hold byte ranges, not events); parsed
Chrome-trace files while they fit ``KEEP_BYTES``, else re-read.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
from tpuanalyze.parsers.chrome_json import ChromeJsonReader
from tpuanalyze.parsers.discover import RunSource, discover_inputs
from tpuanalyze.parsers.staging import MAX_SPAN_NS, HostReader
from tpuanalyze.parsers.xspace import XSpaceReader
from tpuanalyze.store.database import connect, delete_run, new_run_id
from tpuanalyze.store.load import RunPlan, insert_run
from tpuanalyze.store.names import unique_run_name

from tpuanalyze.errors import TpuAnalyzeError, TraceFormatError

if TYPE_CHECKING:  # MLPerf tables are Arrow: imported only when MLPerf logs are ingested
    from tpuanalyze.parsers.mlperf import MlperfTables

READERS = {"xspace": XSpaceReader, "chrome_json": ChromeJsonReader}
KEEP_BYTES = 256 << 20  # parsed input kept in memory between the two passes


@dataclass
class IngestSummary:
    """What one ``ingest_paths`` call loaded."""

    runs: int = 0  # trace runs + MLPerf result folders
    hosts: int = 0
    planes: int = 0
    events: int = 0
    seconds: float = 0.0
    run_ids: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # display names of the trace runs, as run_ids
    replaced_run_ids: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mlperf_runs: int = 0  # result folders (each one run, counted in ``runs`` too)
    mlperf_results: int = 0  # result files
    mlperf_intervals: int = 0  # init/run/block/eval/epoch intervals (not counted in ``events``)
    views: list[str] = field(default_factory=list)  # attribution views installed after the load
    run_notes: list[str] = field(default_factory=list)  # the runs' own notes, each naming its run


class _HostSlot:
    """A validated host file: its reader while kept in memory, re-opened on demand otherwise."""

    def __init__(self, fmt: str, path: Path, host: str, keep: bool) -> None:
        self.fmt, self.path, self.host = fmt, path, host
        reader = READERS[fmt](path, host)
        self.t0_ns = reader.t0_ns
        self.num_events = reader.num_events
        self.file_bytes = reader.file_bytes
        self._reader: HostReader | None = reader if keep else None

    def reader(self) -> HostReader:
        reader = self._reader or READERS[self.fmt](self.path, self.host)
        self._reader = None
        return reader


class _LazyHosts(list):
    """Host readers of a run, opened one at a time as the loader reaches them (bounded memory)."""

    def __init__(self, slots: list[_HostSlot]) -> None:
        super().__init__()
        self.slots = slots
        self._opened: list[HostReader] = []

    def __iter__(self):  # type: ignore[override]
        for i, slot in enumerate(self.slots):
            if i >= len(self._opened):
                self._opened.append(slot.reader())
            yield self._opened[i]

    def __len__(self) -> int:
        return len(self.slots)


class _Progress:
    """A rich progress bar (only when asked, i.e. on a terminal); no-op otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),  # stdout carries the result line
                transient=True,
            )

    def __enter__(self) -> _Progress:
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar:
            self.bar.stop()

    def task(self, description: str, total: int) -> int | None:
        return self.bar.add_task(description, total=total) if self.bar else None

    def advance(self, task: int | None, amount: int = 1, description: str | None = None) -> None:
        if self.bar and task is not None:
            from tpuanalyze.safe_text import safe

            kwargs = {"description": safe(description)} if description else {}  # file names: not markup
            self.bar.update(task, advance=amount, **kwargs)


def _validate_runs(sources: list[RunSource], bar: _Progress) -> list[list[_HostSlot]]:
    files = [(s, host, path) for s in sources for host, path in s.files]
    task = bar.task("reading", len(files))
    kept = 0
    slots: list[list[_HostSlot]] = [[] for _ in sources]
    index = {id(s): i for i, s in enumerate(sources)}
    for source, host, path in files:
        # An XSpace reader keeps only plane byte ranges and line rows (kilobytes): always kept.
        # A Chrome-trace reader holds every event: kept while they fit KEEP_BYTES.
        size = path.stat().st_size if path.exists() and source.source_format != "xspace" else 0
        keep = kept + size <= KEEP_BYTES
        kept += size if keep else 0
        slots[index[id(source)]].append(_HostSlot(source.source_format, path, host, keep))
        bar.advance(task, description=f"read {path.name}")
    return slots


def _check_host_offsets(sources: list[RunSource], slots: list[list[_HostSlot]]) -> None:
    """Refuse a run whose hosts start more than ``MAX_SPAN_NS`` apart (time policy, docs/input.md):
    the far host would shift the run's time zero and every other host's events."""
    for source, host_slots in zip(sources, slots, strict=True):
        timed = sorted((h.t0_ns, str(h.path)) for h in host_slots if h.t0_ns is not None)
        if len(timed) < 2 or timed[-1][0] - timed[0][0] <= MAX_SPAN_NS:
            continue
        median = timed[len(timed) // 2][0]
        far = timed[0] if median - timed[0][0] > timed[-1][0] - median else timed[-1]
        days = abs(far[0] - median) / 86_400e9
        raise TraceFormatError(
            f"starts {days:,.1f} days away from the other hosts of run {source.name!r} "
            "(the hosts of a run must start within 7 days of each other)",
            far[1],
        )


def ingest_paths(paths: list[str | Path], db_path: str | Path, progress: bool = False) -> IngestSummary:
    """Ingest the runs the paths name into ``db_path``; re-ingesting a source path replaces its run."""
    started = time.perf_counter()
    if not paths:
        raise TpuAnalyzeError("no paths given")
    inputs = discover_inputs(list(paths))
    sources = inputs.runs
    summary = IngestSummary()
    with _Progress(progress) as bar:
        slots = _validate_runs(sources, bar)
        # parsed whole before the database is opened: a bad log is refused with the database untouched
        mlperf = None
        if inputs.mlperf_files:
            from tpuanalyze.parsers.mlperf import load_mlperf

            mlperf = load_mlperf(inputs.mlperf_files)

        def make_plans() -> list[RunPlan]:
            """Fresh plans (readers re-opened as needed): a load may be retried."""
            plans = [
                RunPlan(s.name, s.source_path, s.source_format, _LazyHosts(host_slots), list(s.notes))
                for s, host_slots in zip(sources, slots, strict=True)
            ]
            for plan, host_slots in zip(plans, slots, strict=True):
                t0s = [h.t0_ns for h in host_slots if h.t0_ns is not None]
                plan.fixed_t0 = min(t0s) if t0s else None
            return plans

        _check_host_offsets(sources, slots)
        total = sum(h.num_events for host_slots in slots for h in host_slots)
        task = bar.task("loading", total)
        # One connection for the load and the views: the write lock is held from the first
        # statement to the last, so no other process can slip in between (and make an ingest
        # that committed fail on its views).
        con = connect(db_path)
        try:
            _store(make_plans, mlperf, con, db_path, summary, lambda n: bar.advance(task, n))
            _install_views(con, summary)
        finally:
            con.close()
    summary.runs = len(sources) + summary.mlperf_runs
    summary.hosts = sum(len(host_slots) for host_slots in slots)
    summary.notes = inputs.notes + summary.run_notes + summary.notes
    summary.seconds = time.perf_counter() - started
    return summary


# DuckDB's buffer pool while loading one transaction. Small on purpose: row groups already
# written to the file stay cached up to this limit and count in our peak memory. Measured on the
# 2M-event benchmark file: peak RSS 180 MiB at 256MB, 149 at 32MB, 126 at 20MB, 122 at 16MB, same
# speed. What a load must pin is the row group being built per table: with planes, lines and
# metadata appended three statements per plane, 16MB ran out on the shared traces ingested in one
# call; batched per host it does not (nor on 256 generated hosts or 16M events). Chrome-trace JSON
# is held whole in memory by its reader anyway and its events carry many args (wide event_details
# rows), so it loads with JSON_MEMORY_LIMIT. Should a load still run out, it is rolled back and
# redone once with RETRY_MEMORY_LIMIT (a note says so).
LOAD_MEMORY_LIMIT = "16MB"
JSON_MEMORY_LIMIT = "256MB"
RETRY_MEMORY_LIMIT = "1GB"


class _OutOfMemory(Exception):
    """A direct load ran out of DuckDB's load buffer (rolled back; retried with more)."""


def _store(
    make_plans: Callable[[], list[RunPlan]],
    mlperf: MlperfTables | None,
    con: duckdb.DuckDBPyConnection,
    db_path: str | Path,
    summary: IngestSummary,
    on_batch,
) -> None:
    """Load the runs in ONE transaction (replacing old runs), whatever their size.

    DuckDB writes a big transaction's full row groups to the file as they fill and only the row
    group being built stays in memory, so with the narrow ``event_rows`` and a small buffer memory
    is flat in the number of events (2M events: 122 MiB peak, 16M: 135). This replaced
    staging through a scratch database above 4M events (8M events: 349 MiB and 1.5x the time).
    """
    plans = make_plans()
    xspace_only = all(plan.source_format == "xspace" for plan in plans)
    limit = LOAD_MEMORY_LIMIT if xspace_only else JSON_MEMORY_LIMIT
    try:
        _store_direct(plans, mlperf, con, db_path, summary, on_batch, limit)
    except _OutOfMemory:
        summary.notes.append(
            f"DuckDB ran out of its {limit} load buffer; loaded again with {RETRY_MEMORY_LIMIT}"
        )
        _store_direct(make_plans(), mlperf, con, db_path, summary, on_batch, RETRY_MEMORY_LIMIT)


def _store_mlperf(
    con: duckdb.DuckDBPyConnection, mlperf: MlperfTables | None, summary: IngestSummary
) -> None:
    """Write the parsed MLPerf result folders inside the caller's transaction (after the trace runs,
    so their run ids come first). A re-ingested folder keeps its run_id; it is reported as replaced."""
    if mlperf is None:
        return
    from tpuanalyze.parsers.mlperf_ingest import ingest_tables_into

    folders = sorted(set(mlperf.results.column("folder").to_pylist()))
    old = con.execute(
        "SELECT run_id FROM runs WHERE list_contains(?, source_path) ORDER BY run_id", [folders]
    ).fetchall()
    counts = ingest_tables_into(con, mlperf)
    summary.replaced_run_ids.extend(int(r[0]) for r in old)
    summary.run_ids.extend(int(r) for r in counts["run_ids"])
    summary.mlperf_runs = int(counts["runs"])
    summary.mlperf_results = int(counts["results"])
    summary.mlperf_intervals = int(counts["intervals"])


def _reset_counts(summary: IngestSummary) -> None:
    summary.run_ids.clear()
    summary.names.clear()
    summary.run_notes.clear()
    summary.replaced_run_ids.clear()
    summary.planes = summary.events = 0
    summary.mlperf_runs = summary.mlperf_results = summary.mlperf_intervals = 0


def _install_views(con: duckdb.DuckDBPyConnection, summary: IngestSummary) -> None:
    """(Re)create the analyzer's attribution views (step_breakdown, device_breakdown, collective_time,
    op_steps, att_*) so findings' evidence SQL runs on this database. Views only, no data copied.

    Right after the commit, in a transaction of its own: the loaded runs never depend on it; should
    it fail, the call still succeeds with a note (``tpuanalyze sql`` then creates them as TEMP views).
    Creating them costs ~0.3 s, so a database already holding this exact set (fingerprint in the
    comment of ``step_breakdown``) is left alone. Default thresholds; ``report --db --thresholds``
    replaces them. The analyzer is imported here: the store must not need it to load.
    """
    from tpuanalyze.analyzer.attribution import STAGE_NAMES, install_views, view_sql
    from tpuanalyze.analyzer.config import load_thresholds

    config = load_thresholds()
    fingerprint = "tpuanalyze views " + hashlib.sha1(
        json.dumps(view_sql(config), sort_keys=True).encode()
    ).hexdigest()[:16]
    try:
        con.execute(f"SET memory_limit = '{RETRY_MEMORY_LIMIT}'")
        present = con.execute(
            "SELECT view_name, comment FROM duckdb_views() "
            "WHERE database_name = current_database() AND NOT temporary AND list_contains(?, view_name)",
            [STAGE_NAMES],
        ).fetchall()
        if len(present) == len(STAGE_NAMES) and dict(present).get("step_breakdown") == fingerprint:
            summary.views = list(STAGE_NAMES)
            return
        con.execute("BEGIN TRANSACTION")
        try:
            views = install_views(con, config)
            con.execute(f"COMMENT ON VIEW step_breakdown IS '{fingerprint}'")
            con.execute("COMMIT")
            summary.views = views
        except duckdb.Error:
            _rollback(con)
            raise
    except duckdb.Error as exc:  # the runs are committed: the call still succeeds
        summary.notes.append(f"attribution views not installed: {_first_line(exc)}")


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back if a transaction is still open; a failed COMMIT (disk full) has already ended it,
    and its error, not "cannot rollback", is the one to report."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _store_direct(
    plans: list[RunPlan],
    mlperf: MlperfTables | None,
    con: duckdb.DuckDBPyConnection,
    db_path: str | Path,
    summary: IngestSummary,
    on_batch,
    memory_limit: str,
) -> None:
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute("BEGIN TRANSACTION")
    try:
        for plan in plans:
            # a re-ingested source keeps its run_id (saved `db:4` references stay valid) and name
            old_ids = _delete_previous(con, plan, summary)
            run_id = old_ids[0] if old_ids else new_run_id(con)
            plan.name = unique_run_name(con, plan.source_path)
            plan.notes = [f"{plan.name}: {note}" for note in plan.notes]
            counts = insert_run(con, plan, run_id, on_batch)
            summary.run_ids.append(run_id)
            summary.names.append(plan.name)
            summary.run_notes.extend(plan.notes)
            summary.planes += counts.planes
            summary.events += counts.events
        _store_mlperf(con, mlperf, summary)
        con.execute("COMMIT")
    except BaseException as exc:
        _rollback(con)
        _reset_counts(summary)
        if isinstance(exc, duckdb.OutOfMemoryException) and memory_limit != RETRY_MEMORY_LIMIT:
            raise _OutOfMemory() from None
        if isinstance(exc, duckdb.InterruptException):  # Ctrl-C inside a statement: exit 130
            raise KeyboardInterrupt() from None
        if isinstance(exc, duckdb.Error):
            raise TpuAnalyzeError(
                f"loading failed, database unchanged: {_first_line(exc)}", str(db_path)
            ) from None
        raise


def _delete_previous(con: duckdb.DuckDBPyConnection, plan: RunPlan, summary: IngestSummary) -> list[int]:
    """Remove the runs loaded earlier from the same source; their ids, smallest first."""
    old = con.execute(
        "SELECT run_id FROM runs WHERE source_path = ? ORDER BY run_id", [plan.source_path]
    ).fetchall()
    for (old_id,) in old:
        delete_run(con, old_id)
        summary.replaced_run_ids.append(old_id)
    return [int(r[0]) for r in old]


@dataclass
class ParsedRun:
    """A run decoded without a database (``read_run``): counts only."""

    name: str
    source_path: str
    hosts: int
    planes: int
    num_events: int


def read_run(source: RunSource) -> ParsedRun:
    """Parse and decode every event batch of a run without touching a database (benchmarks, checks)."""
    planes = events = 0
    for host, path in source.files:
        reader = READERS[source.source_format](path, host)
        for plane in reader.planes():
            planes += 1
            events += sum(batch.num_rows for batch in plane.batches)
    return ParsedRun(source.name, source.source_path, len(source.files), planes, events)
