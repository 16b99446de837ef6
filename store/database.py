"""Opening the trace database: one DuckDB file holding many runs (schema in ``store/schema.sql``)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from importlib import resources
from pathlib import Path

import duckdb

from tpuanalyze.errors import TpuAnalyzeError

# How long a verb waits for another process holding the database (an ingest writing it, readers
# while an ingest wants to write) before giving up: ``--wait SECONDS`` or TPUANALYZE_WAIT.
DEFAULT_WAIT_SECONDS = 600.0
_wait_seconds: float | None = None
# Names DuckDB would not treat as a local file: in-memory databases and MotherDuck (network).
_NOT_A_FILE = re.compile(r"^(:memory:|md:|motherduck:|[A-Za-z][A-Za-z0-9+.-]*://)", re.IGNORECASE)


def set_wait_seconds(seconds: float | None) -> None:
    """The lock wait of this process's later opens (None: TPUANALYZE_WAIT or the default)."""
    global _wait_seconds
    _wait_seconds = seconds


def wait_seconds() -> float:
    if _wait_seconds is not None:
        return _wait_seconds
    try:
        return max(0.0, float(os.environ.get("TPUANALYZE_WAIT", DEFAULT_WAIT_SECONDS)))
    except ValueError:
        return DEFAULT_WAIT_SECONDS


def check_db_path(db_path: str | Path) -> Path:
    """The database path, refused when DuckDB would not read it as a local file (``:memory:`` keeps
    nothing, ``md:``/``motherduck:`` and URLs go to the network)."""
    text = str(db_path)
    if _NOT_A_FILE.match(text):
        raise TpuAnalyzeError("not a database file (in-memory and remote databases are not supported)", text)
    if not text:
        raise TpuAnalyzeError("empty database file name")
    return Path(text)


def _is_lock_conflict(exc: duckdb.Error) -> bool:
    return "Could not set lock" in str(exc)


def open_database(db_path: str | Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to the file, waiting (bounded) while another process holds it.

    DuckDB lets one process write a file or several read it, never both: a reader meeting an
    ingest (or an ingest meeting a reader or another ingest) retries with backoff until the other
    side closes, for up to ``wait_seconds()``, saying once on stderr that it waits. It thereby sees
    the last committed state, never a half-loaded run. A writer also removes the spill directory
    (``<db>.tmp``) a killed process may have left: holding the write lock, no one else uses it.
    """
    path = check_db_path(db_path)
    if read_only and not path.exists():
        raise TpuAnalyzeError("no such database file", str(path))
    budget = wait_seconds()
    deadline = time.monotonic() + budget
    delay, said = 0.05, False
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only)
            break
        except duckdb.Error as exc:
            if not _is_lock_conflict(exc):
                raise TpuAnalyzeError(f"cannot open database: {_first_line(exc)}", str(path)) from None
            now = time.monotonic()
            if now >= deadline:
                raise TpuAnalyzeError(
                    f"another process holds the database (still after waiting {budget:g} s; "
                    "see --wait): " + _holder(exc),
                    str(path),
                ) from None
            if not said:
                doing = "read" if read_only else "write"
                print(
                    f"tpuanalyze: waiting to {doing} {path}: another process holds it "
                    f"({_holder(exc)}); up to {budget:g} s (--wait)",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            time.sleep(min(delay, max(0.0, deadline - now)))
            delay = min(delay * 2, 1.0)
    if not read_only:
        _remove_stale_spill(path)
    return con


def _holder(exc: duckdb.Error) -> str:
    match = re.search(r"held in (.*?) \(PID (\d+)\)", str(exc))
    return f"PID {match.group(2)}, {Path(match.group(1)).name}" if match else "lock held"


def _remove_stale_spill(path: Path) -> None:
    """Remove ``<db>.tmp/`` left by a process killed while spilling (we hold the write lock)."""
    spill = path.with_name(path.name + ".tmp")
    if spill.is_dir() and not spill.is_symlink():
        shutil.rmtree(spill, ignore_errors=True)


def schema_sql() -> str:
    """The public relations as DDL (idempotent: ``CREATE ... IF NOT EXISTS``)."""
    return resources.files("tpuanalyze.store").joinpath("schema.sql").read_text(encoding="utf-8")


def table_ddl(table: str) -> str:
    """The ``CREATE TABLE`` statement of one table of schema.sql (a map worker's database has the
    ``runs`` table only: its other tables are a batch's rows, registered)."""
    match = re.search(rf"CREATE TABLE IF NOT EXISTS {re.escape(table)} \(.*?\n\);", schema_sql(), re.DOTALL)
    if match is None:
        raise RuntimeError(f"schema.sql has no table {table}")
    return match.group(0)


_EVENTS_VIEW = re.compile(r"CREATE VIEW IF NOT EXISTS events AS\n(.*?);", re.DOTALL)


def events_select(event_rows: str) -> str:
    """The ``events`` view's SELECT (schema.sql) over the relation ``event_rows`` (a subquery with
    event_rows' columns) instead of the whole table: the view's rows for some of the events."""
    match = _EVENTS_VIEW.search(schema_sql())
    if match is None:
        raise RuntimeError("schema.sql has no events view")
    text = re.sub(r"--[^\n]*", "", match.group(1))
    if text.count("FROM event_rows r") != 1:
        raise RuntimeError("the events view reads event_rows more than once")
    return text.replace("FROM event_rows r", f"FROM {event_rows} r")


def connect(db_path: str | Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) the database and make sure every public relation exists.

    Read-only connections never create anything: a missing file is a ``TpuAnalyzeError``.
    """
    path = check_db_path(db_path)
    con = open_database(path, read_only=read_only)
    try:
        con.execute("SET enable_progress_bar = false")  # never draw on the user's terminal
    except duckdb.Error as exc:
        con.close()
        raise TpuAnalyzeError(f"cannot open database: {_first_line(exc)}", str(path)) from None
    if not read_only:
        try:
            _add_missing_columns(con)
            con.execute(schema_sql())
        except duckdb.Error as exc:
            con.close()
            raise TpuAnalyzeError(f"cannot create schema: {_first_line(exc)}", str(path)) from None
    return con


def _add_missing_columns(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse a database written by an earlier storage layout (``events`` a table, or
    ``event_rows`` without ``event_index``): its rows cannot be read through today's views."""
    rows = con.execute(
        "SELECT table_type FROM information_schema.tables "
        "WHERE table_schema = 'main' AND table_name = 'events'"
    ).fetchall()
    if rows and rows[0][0] == "BASE TABLE":
        raise duckdb.InvalidInputException(
            "written by an older tpuanalyze (events is a table); ingest into a new database file"
        )
    columns = {
        row[0]
        for row in con.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'main' AND table_name = 'event_rows'"
        ).fetchall()
    }
    if columns and "event_index" not in columns:
        raise duckdb.InvalidInputException(
            "written by an older tpuanalyze (event_rows has no event_index); "
            "ingest into a new database file"
        )


def require_runs_table(con: duckdb.DuckDBPyConnection, db_path: str | Path) -> None:
    """A database the verbs can read runs from: a DuckDB file without tpuanalyze's ``runs`` table (a
    new file, someone else's) is the input's error, said before the first query that needs it."""
    try:
        con.execute("SELECT run_id, name, source_format FROM runs LIMIT 0").fetchall()
    except duckdb.Error as exc:
        raise TpuAnalyzeError("not a tpuanalyze database (no runs table)", str(db_path)) from exc


def run_ids(con: duckdb.DuckDBPyConnection) -> list[int]:
    """All run ids in the database, ascending."""
    return [row[0] for row in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]


def new_run_id(con: duckdb.DuckDBPyConnection) -> int:
    """Next free run id from ``run_id_seq`` (skipping ids a foreign writer may have used)."""
    current_max = con.execute("SELECT COALESCE(max(run_id), 0) FROM runs").fetchall()[0][0]
    while True:
        candidate = con.execute("SELECT nextval('run_id_seq')").fetchall()[0][0]
        if candidate > current_max:
            return int(candidate)


def tables_with_run_id(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Base tables keyed by run_id (ours and other writers'), so a run can be removed everywhere."""
    rows = con.execute(
        """
        SELECT DISTINCT c.table_name
        FROM information_schema.columns c
        JOIN information_schema.tables t
          ON t.table_name = c.table_name AND t.table_schema = c.table_schema
        WHERE c.column_name = 'run_id' AND t.table_type = 'BASE TABLE' AND c.table_schema = 'main'
        ORDER BY c.table_name
        """
    ).fetchall()
    return [r[0] for r in rows]


def delete_run(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Remove a run from every table keyed by run_id (``runs`` last). Call inside a transaction."""
    for table in tables_with_run_id(con):
        if table != "runs":
            con.execute(f'DELETE FROM "{table}" WHERE run_id = ?', [run_id])
    con.execute("DELETE FROM runs WHERE run_id = ?", [run_id])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
