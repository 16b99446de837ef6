"""DuckDB resources of one analysis: a scratch database file for the run's per-op relation, a memory
limit that DuckDB honours by spilling to disk, and the spill folder (a read-only trace database has
none of its own)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
from tpuanalyze.analyzer.per_host import SCRATCH

# DuckDB's share of the analysis memory: the reduce over the run's op rows spills beyond it. A batch's
# stages need up to ~300 bytes per event (att_runs over a 1 M-event batch fails at 256 MiB, runs at
# 512 MiB), so a larger batch (one large host) raises it. Never above a lower limit the caller set.
MEMORY_LIMIT_BYTES = 512 * 1024 * 1024
BYTES_PER_BATCH_EVENT = 512


def _setting(con: duckdb.DuckDBPyConnection, name: str) -> str:
    return str(con.execute(f"SELECT current_setting('{name}')").fetchall()[0][0])


def _limit_bytes(con: duckdb.DuckDBPyConnection) -> int:
    rows = con.execute("SELECT value FROM duckdb_settings() WHERE name = 'memory_limit'").fetchall()
    text = str(rows[0][0]) if rows else ""  # (fetchall: a result left unfinished blocks register())
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 1e3, "MB": 1e6, "GB": 1e9,
             "TB": 1e12, "bytes": 1}
    number, _, unit = text.partition(" ")
    try:
        return int(float(number) * units.get(unit, 1))
    except ValueError:
        return 0


@contextmanager
def scratch_database(con: duckdb.DuckDBPyConnection, batch_events: int = 0,
                     in_memory: bool = False) -> Iterator[str]:
    """Attach a scratch database file as ``ta_scratch`` (deleted afterwards), cap DuckDB's memory for
    batches of up to ``batch_events`` events and point its spill folder beside it; the connection's
    settings are restored on exit. ``in_memory``: the scratch database in memory (a map worker's one
    batch, whose op rows go to a file of their own: no file to create and remove per task)."""
    folder = tempfile.mkdtemp(prefix="tpuanalyze-analysis-")
    saved_limit = _setting(con, "memory_limit")
    saved_temp = _setting(con, "temp_directory")
    capped = False
    try:
        target = ":memory:" if in_memory else f"{folder}/scratch.duckdb"
        con.execute(f"ATTACH '{target}' AS {SCRATCH} (READ_WRITE)")
        if not saved_temp:  # (DuckDB cannot switch it back once used: set only where there is none)
            con.execute(f"SET temp_directory = '{folder}/spill'")
        cap = max(MEMORY_LIMIT_BYTES, BYTES_PER_BATCH_EVENT * batch_events)
        capped = not 0 < _limit_bytes(con) <= cap
        if capped:
            con.execute(f"SET memory_limit = '{cap // 2**20}MiB'")
        yield SCRATCH
    finally:
        try:
            con.execute(f"DETACH DATABASE IF EXISTS {SCRATCH}")
            if capped:  # (only then: setting a limit makes DuckDB return its free memory to the system)
                con.execute(f"SET memory_limit = '{saved_limit}'")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
