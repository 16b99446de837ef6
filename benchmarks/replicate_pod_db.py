"""Make a larger pod database from an ingested one: every host copied K times under new names.

    python benchmarks/replicate_pod_db.py SOURCE.duckdb DEST.duckdb K

Host ``h`` keeps its name and gains copies ``h-r1`` .. ``h-r<K-1>``, rows written host by host in name
order (as an ingest writes file by file, so a batch of hosts prunes to its row groups); ``runs`` counts
hosts, devices and events K times. Ingesting a generated 512-host run takes most of an hour on 2 shared
cores; this makes the same data per host in minutes, for measuring the analysis (``report DB``) alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import duckdb

# Row order per table: host, then the order the ingest writes a host's rows in.
ORDER = {"event_rows": "host, plane_index, event_index", "event_details": "host, plane_index, event_index",
         "lines": "host, plane_index, line_index", "planes": "host, plane_index",
         "event_metadata": "host, plane_index, metadata_id", "hosts": "host"}


def _create_views(con: duckdb.DuckDBPyConnection, views: list[str]) -> None:
    """Create the views in dependency order (each retried until the ones it reads exist)."""
    pending = views
    while pending:
        left = []
        for sql in pending:
            try:
                con.execute(sql)
            except duckdb.CatalogException:
                left.append(sql)
        if len(left) == len(pending):
            raise RuntimeError(f"views that cannot be created: {left}")
        pending = left


def replicate(source: Path, dest: Path, copies: int) -> None:
    dest.unlink(missing_ok=True)
    con = duckdb.connect(str(dest))
    try:
        con.execute(f"ATTACH '{source}' AS s (READ_ONLY)")
        for kind in ("tables", "sequences"):
            rows = con.execute(f"SELECT sql FROM duckdb_{kind}() WHERE database_name = 's'").fetchall()
            for (sql,) in rows:
                con.execute(sql)
        views = [r[0] for r in con.execute(
            "SELECT sql FROM duckdb_views() WHERE database_name = 's' AND NOT internal").fetchall()]
        copy_ids = " UNION ALL ".join(f"SELECT {i} AS r" for i in range(copies))
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 's'").fetchall()]
        for table in tables:
            cols = [r[0] for r in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE database_name = 's' AND table_name = ? "
                "ORDER BY column_index", [table]).fetchall()]
            if "host" not in cols:
                con.execute(f"INSERT INTO {table} SELECT * FROM s.{table}")
                continue
            select = ", ".join("CASE WHEN x.r = 0 THEN t.host ELSE t.host || '-r' || x.r END AS host"
                               if c == "host" else f"t.{c}" for c in cols)
            con.execute(f"INSERT INTO {table} SELECT * FROM (SELECT {select} FROM s.{table} t, "
                        f"({copy_ids}) x) ORDER BY {ORDER.get(table, 'host')}")
        con.execute(f"UPDATE runs SET num_hosts = num_hosts * {copies}, "
                    f"num_devices = num_devices * {copies}, num_events = num_events * {copies}")
        con.execute("DETACH s")
        _create_views(con, views)
    finally:
        con.close()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    replicate(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
