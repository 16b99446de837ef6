"""The analyzer's attribution views in the database, so findings' evidence SQL runs there."""

from __future__ import annotations

import hashlib
import json

import duckdb

from tpuanalyze.store.commit import first_line

VIEWS_MEMORY_LIMIT = "1GB"


def install_default_views(con: duckdb.DuckDBPyConnection) -> tuple[list[str], str | None]:
    """(Re)create step_breakdown, device_breakdown, collective_time, op_steps and att_* with the
    default thresholds. Returns the views and, should it fail, a note (the runs are committed
    already: the call still succeeds, and ``tpuanalyze sql`` then creates them as TEMP views).

    Creating them costs ~0.3 s, so a database already holding this exact set (fingerprint in the
    comment of ``step_breakdown``) is left alone; ``report --db --thresholds`` replaces them.
    """
    from tpuanalyze.analyzer.attribution import STAGE_NAMES, install_views, view_sql
    from tpuanalyze.analyzer.config import load_thresholds

    config = load_thresholds()
    fingerprint = "tpuanalyze views " + hashlib.sha1(
        json.dumps(view_sql(config), sort_keys=True).encode()
    ).hexdigest()[:16]
    try:
        con.execute(f"SET memory_limit = '{VIEWS_MEMORY_LIMIT}'")
        present = con.execute(
            "SELECT view_name, comment FROM duckdb_views() "
            "WHERE database_name = current_database() AND NOT temporary AND list_contains(?, view_name)",
            [STAGE_NAMES],
        ).fetchall()
        if len(present) == len(STAGE_NAMES) and dict(present).get("step_breakdown") == fingerprint:
            return list(STAGE_NAMES), None
        con.execute("BEGIN TRANSACTION")
        try:
            views = install_views(con, config)
            con.execute(f"COMMENT ON VIEW step_breakdown IS '{fingerprint}'")
            con.execute("COMMIT")
            return views, None
        except duckdb.Error:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass
            raise
    except duckdb.Error as exc:
        return [], f"attribution views not installed: {first_line(exc)}"
