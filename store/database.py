"""Opening the trace database: one DuckDB file holding many runs (schema in ``store/schema.sql``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import duckdb

from tpuanalyze.errors import TpuAnalyzeError


def schema_sql() -> str:
    """The public relations as DDL (idempotent: ``CREATE ... IF NOT EXISTS``)."""
    return resources.files("tpuanalyze.store").joinpath("schema.sql").read_text(encoding="utf-8")


def connect(db_path: str | Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) the database and make sure every public relation exists.

    Read-only connections never create anything: a missing file is a ``TpuAnalyzeError``.
    """
    path = Path(db_path)
    if read_only and not path.exists():
        raise TpuAnalyzeError("no such database file", str(path))
    try:
        con = duckdb.connect(str(path), read_only=read_only)
        con.execute("SET enable_progress_bar = false")  # never draw on the user's terminal
    except duckdb.Error as exc:
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
