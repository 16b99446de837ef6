"""``tpuanalyze sql --db FILE [--format table|csv|json] QUERY``: any SQL over the trace database."""

from __future__ import annotations

import csv
import datetime
import decimal
import json
import re
import sys
import uuid
from typing import Any

import click
import duckdb
from tpuanalyze.reports.options import wait_option
from tpuanalyze.store.database import connect

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.safe_text import json_escape_controls, plain, safe


def _jsonable(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, datetime.timedelta, uuid.UUID)):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def ensure_views(con: duckdb.DuckDBPyConnection, query: str, db_path: str) -> list[str]:
    """Attribution views for a query that names them, on a database that lacks them.

    ``tpuanalyze ingest`` installs step_breakdown, device_breakdown, collective_time, op_steps and
    att_* in the database; one written otherwise (Python ``ingest_mlperf``, an older tpuanalyze,
    a failed view install) gets them here as TEMP views of this read-only connection (same SQL,
    default thresholds; ~0.3 s, so only when the query names one). Returns the views created.
    """
    from tpuanalyze.analyzer.attribution import STAGE_NAMES

    named = re.search(r"\b(" + "|".join(STAGE_NAMES) + r")\b", query, re.IGNORECASE)
    if not named:
        return []
    present = con.execute(
        "SELECT count(*) FROM duckdb_views() WHERE database_name = current_database() "
        "AND NOT temporary AND list_contains(?, view_name)",
        [STAGE_NAMES],
    ).fetchall()[0][0]
    if present == len(STAGE_NAMES):
        return []
    from tpuanalyze.analyzer.attribution import view_sql
    from tpuanalyze.analyzer.config import load_thresholds

    try:
        for name, sql in view_sql(load_thresholds()).items():
            con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {sql}").fetchall()
    except duckdb.Error as exc:
        text = str(exc).strip()
        reason = text.splitlines()[0] if text else type(exc).__name__
        raise TpuAnalyzeError(
            f"query names {named.group(1)}, but the attribution views cannot be created on this "
            f"database (is it a tpuanalyze database?): {reason}",
            db_path,
        ) from None
    return list(STAGE_NAMES)


# Statement kinds that write outside the (read-only) database or change what the session can reach.
_WRITING = {"COPY", "EXPORT", "ATTACH", "DETACH", "LOAD"}


def _writing_statements(query: str) -> list[str]:
    """The kinds of statement in ``query`` that would write files or load extensions (sorted)."""
    try:
        kinds = {s.type.name for s in duckdb.extract_statements(query)}
    except duckdb.Error:  # a syntax error: the query itself reports it
        return []
    return sorted(kinds & _WRITING)


def run_query(db_path: str, query: str) -> tuple[list[str], list[tuple[Any, ...]], list[str]]:
    """Column names, rows and DuckDB type names of a query (read-only); bad SQL -> TpuAnalyzeError.

    The attribution views the findings' evidence SQL uses are created as TEMP views when the
    database lacks them (see ensure_views)."""
    writes = _writing_statements(query)
    if writes:  # a read-only database still lets COPY ... TO, EXPORT and ATTACH write files elsewhere
        raise TpuAnalyzeError(f"{'/'.join(writes)} would write files or load extensions: `tpuanalyze sql` "
                              "only reads (save a result with --format csv and a redirect, or use DuckDB "
                              "itself)", "sql")
    con = connect(db_path, read_only=True)
    try:
        ensure_views(con, query, db_path)
        cursor = con.execute(query)
        if cursor is None:  # no statement at all: empty, blanks, ';' or only a comment
            raise TpuAnalyzeError("empty query: no SQL statement to run", "sql")
        if cursor.description is None:
            return [], [], []
        names = [d[0] for d in cursor.description]
        types = [str(d[1]) for d in cursor.description]
        return names, cursor.fetchall(), types
    except duckdb.Error as exc:
        text = str(exc).strip()
        raise TpuAnalyzeError(text.splitlines()[0] if text else type(exc).__name__, "sql") from None
    finally:
        con.close()


@click.command("sql")
@click.argument("query")
@click.option("--db", "db_path", required=True, type=click.Path(dir_okay=False), help="DuckDB file.")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True
)
@wait_option
def command(query: str, db_path: str, fmt: str) -> None:
    """Run QUERY against the trace database (read-only) and print the result.

    \b
    Relations (columns: docs/schema.md, docs/attribution.md):
      runs, hosts, planes, lines         what was ingested (one row per run, host file, plane, line)
      events, event_stats                one row per trace event (typed stats; every stat)
      event_metadata                     one row per event metadata of a plane
      mlperf_results, mlperf_intervals   MLPerf result logs (runs with source_format 'mlperf')
      step_breakdown, device_breakdown   attribution per step and per device (categories in ps)
      collective_time, op_steps          collectives per step; every device op with its step
      att_*                              the attribution's intermediate views

    \b
    Examples (from the repository root):
      tpuanalyze ingest sample_traces/jax_cpu --db demo.duckdb
      tpuanalyze sql --db demo.duckdb "SELECT run_id, name, num_devices, num_events FROM runs"
      tpuanalyze sql --db demo.duckdb --format csv "SELECT run_id, device_ordinal, step_num, duration_ps FROM step_breakdown LIMIT 5"
    """  # noqa: E501 (example lines are shown as they are typed)
    names, rows, types = run_query(db_path, query)
    if fmt == "json":
        records = [{n: _jsonable(v) for n, v in zip(names, row, strict=False)} for row in rows]
        for record, row in zip(records, rows, strict=False):
            for n, t, v in zip(names, types, row, strict=False):
                if t == "JSON" and isinstance(v, str):
                    try:
                        record[n] = json.loads(v)
                    except ValueError:
                        pass
        # JSON escapes C0 controls itself; C1 and bidi controls too (the same data, no terminal codes)
        click.echo(json_escape_controls(json.dumps(records, indent=1, ensure_ascii=False)))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        if sys.stdout.isatty():  # data for a person: control characters made visible
            writer.writerow([plain(n) for n in names])
            writer.writerows([[v if v is None else plain(v) for v in row] for row in rows])
        else:  # data for a file or a program: as stored
            writer.writerow(names)
            writer.writerows(rows)
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(show_header=True, header_style="bold")
        for name, type_name in zip(names, types, strict=False):
            numeric = any(k in type_name for k in ("INT", "DOUBLE", "FLOAT", "DECIMAL"))
            # fold, never truncate: a query result must show every character of every value
            table.add_column(safe(name), justify="right" if numeric else "left", overflow="fold")
        for row in rows:  # values are data: never markup, never terminal codes
            table.add_row(*("NULL" if v is None else safe(v) for v in row))
        console = Console(soft_wrap=False)
        if not console.is_terminal:  # piped: as wide as the table wants, so rows stay on one line
            natural = Console(width=1_000_000).measure(table).maximum
            console = Console(soft_wrap=False, width=max(natural, 20))
        console.print(table)
        click.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})", err=True)
