"""``ingest_paths``: traces -> DuckDB, all or nothing per call.

Every file of every run is parsed (and validated) before the database is even opened, so a bad
file leaves the database exactly as it was; then one transaction replaces runs that came from the
same source path and inserts the new ones, and any database error rolls it all back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
from tpuanalyze.parsers.chrome_json import read_chrome_json
from tpuanalyze.parsers.discover import RunSource, discover
from tpuanalyze.parsers.staging import HostTables
from tpuanalyze.parsers.xspace import read_xspace
from tpuanalyze.store.database import connect, delete_run, new_run_id
from tpuanalyze.store.load import RunTables, insert_run

from tpuanalyze.errors import TpuAnalyzeError, TraceFormatError

READERS: dict[str, Callable[[Path, str], HostTables]] = {
    "xspace": lambda path, host: read_xspace(path, host),
    "chrome_json": lambda path, host: read_chrome_json(path, host),
}


@dataclass
class IngestSummary:
    """What one ``ingest_paths`` call loaded."""

    runs: int = 0
    hosts: int = 0
    planes: int = 0
    events: int = 0
    seconds: float = 0.0
    run_ids: list[int] = field(default_factory=list)
    replaced_run_ids: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def read_run(source: RunSource, on_file: Callable[[Path], None] | None = None) -> RunTables:
    """Parse every host file of a run; the run's t0 is the earliest host t0 (common to all hosts)."""
    reader = READERS[source.source_format]
    hosts: list[HostTables] = []
    for host, path in source.files:
        hosts.append(reader(path, host))
        if on_file:
            on_file(path)
    t0s = [h.t0_ns for h in hosts if h.t0_ns is not None]
    return RunTables(
        name=source.name,
        source_path=source.source_path,
        source_format=source.source_format,
        hosts=hosts,
        t0_ns=min(t0s) if t0s else None,
        notes=list(source.notes),
    )


class _Progress:
    """A rich progress bar over files (only when asked, i.e. on a terminal)."""

    def __init__(self, enabled: bool, total_bytes: int) -> None:
        self.bar = None
        if enabled:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TimeElapsedColumn(),
                transient=True,
            )
            self.task = self.bar.add_task("reading traces", total=total_bytes)

    def __enter__(self) -> _Progress:
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar:
            self.bar.stop()

    def advance(self, path: Path) -> None:
        if self.bar:
            self.bar.update(self.task, advance=_size(path), description=f"read {path.name}")

    def stage(self, text: str) -> None:
        if self.bar:
            self.bar.update(self.task, description=text)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def ingest_paths(paths: list[str | Path], db_path: str | Path, progress: bool = False) -> IngestSummary:
    """Ingest the runs the paths name into ``db_path``; re-ingesting a source path replaces its run."""
    started = time.perf_counter()
    if not paths:
        raise TpuAnalyzeError("no paths given")
    sources = discover(list(paths))
    total = sum(_size(p) for s in sources for _, p in s.files)
    summary = IngestSummary()
    with _Progress(progress, total) as bar:
        runs = [read_run(source, bar.advance) for source in sources]
        bar.stage("loading into DuckDB")
        _store(runs, db_path, summary)
    for run in runs:
        summary.runs += 1
        summary.hosts += len(run.hosts)
        summary.planes += run.num_planes
        summary.events += run.num_events
        summary.notes.extend(run.notes)
    summary.seconds = time.perf_counter() - started
    return summary


def _store(runs: list[RunTables], db_path: str | Path, summary: IngestSummary) -> None:
    con = connect(db_path)
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            for run in runs:
                old = con.execute(
                    "SELECT run_id FROM runs WHERE source_path = ? ORDER BY run_id", [run.source_path]
                ).fetchall()
                for (old_id,) in old:
                    delete_run(con, old_id)
                    summary.replaced_run_ids.append(old_id)
                run_id = new_run_id(con)
                insert_run(con, run, run_id)
                summary.run_ids.append(run_id)
            con.execute("COMMIT")
        except BaseException as exc:
            con.execute("ROLLBACK")
            summary.run_ids.clear()
            summary.replaced_run_ids.clear()
            if isinstance(exc, duckdb.Error):
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise TpuAnalyzeError(f"loading failed, database unchanged: {first}", str(db_path)) from None
            raise
    finally:
        con.close()


__all__ = ["IngestSummary", "ingest_paths", "read_run", "TraceFormatError"]
