"""How close one file's ingest comes to DuckDB's own insert of the same rows: the floor of the default
(one DuckDB file) layout, beside `tpuanalyze ingest FILE --db NEW` in the same run.

Why: the issue's target for one file is 3 M events/s end to end. The ingest decodes, shifts and types
the rows, then DuckDB inserts them; this measures the insert alone: the file's rows, already in memory
as the Arrow tables a map worker builds (``store.batch.BatchTables.arrow``: the database's columns and
types; the host a dictionary), inserted into a fresh on-disk database of the store's schema in the
loader's pieces (``FLUSH_EVENTS`` rows), committed and checkpointed. No decode, no interpreter start:
nothing the ingest could skip. Alternated ``--repeat`` times with the CLI; CPU seconds are the
comparable figure on a shared machine.

Usage (from the project root)::

    python benchmarks/make_large_xspace.py --events 6000000 --out /tmp/large6m.xplane.pb
    python benchmarks/bench_insert_floor.py /tmp/large6m.xplane.pb --repeat 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import CLI_SECONDS, run_measured  # noqa: E402


def arrow_tables(path: Path) -> dict[str, object]:
    """The file's rows per host table, as the database stores them (run_id 1)."""
    import duckdb
    from tpuanalyze.store.batch import BatchTables
    from tpuanalyze.store.parts import HOST_TABLES

    from tpuanalyze.pipeline.tasks import HostInput, _add_host, forget_kept, probe_host

    item = HostInput(path.name, str(path), "xspace")
    t0 = probe_host(item).t0_ns
    forget_kept()
    batch = BatchTables(duckdb.connect(), t0)
    _add_host(batch, item, True)
    return {table: _dictionary_host(batch.arrow(table, 1)) for table in HOST_TABLES}


def _dictionary_host(table: Any) -> Any:
    """``table`` with its host column dictionary-encoded: DuckDB then inserts one string, not one a row
    (1.45 vs 1.84 s for a 6M-event file's event_rows), the cheapest form of the same values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    at = table.schema.get_field_index("host")
    if at < 0 or pa.types.is_dictionary(table.schema.field(at).type):
        return table
    return table.set_column(at, "host", pc.dictionary_encode(table.column(at)))


def insert_floor(tables: dict[str, object], folder: Path) -> tuple[float, float, int]:
    """(wall s, CPU s, event rows) of inserting ``tables`` into a fresh database file, in pieces."""
    import duckdb
    from tpuanalyze.store.database import schema_sql
    from tpuanalyze.store.load import FLUSH_EVENTS

    db = folder / "floor.duckdb"
    db.unlink(missing_ok=True)
    con = duckdb.connect(str(db))
    con.execute(schema_sql())
    # as the ingest's direct load (pipeline/ingest.py): one thread, beside the decoding thread. With
    # the machine's two, these small statements wrote half-filled row groups that the checkpoint
    # rewrote: 2.6 s instead of 1.5 for a 6M-event file's rows (benchmarks/results/bench_ingest.md)
    con.execute("SET threads = 1")
    wall, cpu = time.perf_counter(), time.process_time()
    con.execute("BEGIN")
    for table, rows in tables.items():
        for start in range(0, max(rows.num_rows, 1), FLUSH_EVENTS):  # type: ignore[attr-defined]
            piece = rows.slice(start, FLUSH_EVENTS)  # type: ignore[attr-defined]  # noqa: F841
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM piece")
    con.execute("COMMIT")
    con.execute("CHECKPOINT")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    events = con.execute("SELECT count(*) FROM event_rows").fetchone()[0]
    con.close()
    return wall, cpu, int(events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--exe", default="tpuanalyze", help="the tpuanalyze command to time")
    args = parser.parse_args(argv)
    tables = arrow_tables(args.trace)
    rows: dict[str, list[tuple[float, float, float]]] = {"DuckDB insert of the rows (floor)": [],
                                                          "tpuanalyze ingest (CLI)": []}
    events = 0
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for _ in range(args.repeat):
            wall, cpu, events = insert_floor(tables, folder)
            rows["DuckDB insert of the rows (floor)"].append((wall, wall, cpu))
            db = folder / "cli.duckdb"
            db.unlink(missing_ok=True)
            m = run_measured([args.exe, "ingest", str(args.trace), "--db", str(db)])
            reported = CLI_SECONDS.search(m.stdout)
            rows["tpuanalyze ingest (CLI)"].append((m.wall_s, float(reported.group(1)) if reported
                                                    else m.wall_s, m.cpu_s))
    print(f"File `{args.trace}`: {events:,} events; best of {args.repeat} alternated runs.\n")
    print("| contender | wall s | work s | CPU s | events/s (work) | events/CPU-s |")
    print("|---|---:|---:|---:|---:|---:|")
    best = {}
    for name, runs in rows.items():
        wall, work, cpu = min(runs, key=lambda r: r[1])
        best[name] = (work, cpu)
        rates = f"{events / work:,.0f} | {events / cpu:,.0f}"
        print(f"| {name} | {wall:.2f} | {work:.2f} | {cpu:.2f} | {rates} |")
    floor, cli = best["DuckDB insert of the rows (floor)"], best["tpuanalyze ingest (CLI)"]
    print(f"\nThe ingest takes {cli[0] / floor[0]:.2f}x the insert's time alone and {cli[1] / floor[1]:.2f}x "
          "its CPU seconds.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
