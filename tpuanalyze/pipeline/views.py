"""The analyzer's attribution views in the database, so findings' evidence SQL runs there."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import duckdb

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.store.commit import first_line
from tpuanalyze.store.database import check_db_path, connect, schema_sql

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
    fingerprint = _fingerprint(view_sql(config))
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


def _cache_dir() -> Path | None:
    """Where the database template is kept: ``TPUANALYZE_CACHE_DIR``, else the user's cache folder."""
    explicit = os.environ.get("TPUANALYZE_CACHE_DIR")
    if explicit is not None:
        return Path(explicit) if explicit else None  # empty: no template
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpuanalyze"


def _fingerprint(views: dict[str, str]) -> str:
    """What the comment of ``step_breakdown`` says: which views' SQL the database holds."""
    return "tpuanalyze views " + hashlib.sha1(json.dumps(views, sort_keys=True).encode()).hexdigest()[:16]


def _views_fingerprint() -> str:
    from tpuanalyze.analyzer.attribution import view_sql
    from tpuanalyze.analyzer.config import load_thresholds

    return _fingerprint(view_sql(load_thresholds()))


def seed_new_database(db_path: str | Path) -> bool:
    """Create a database file that does not exist yet as a copy of an empty one holding the schema
    and the default views (built once per schema, views and DuckDB version, in the user's cache
    folder). Why: creating the views costs ~0.6 CPU s (DuckDB binds each one), most of a small
    ingest; a copy of the ~1 MB template costs a few ms. Returns whether it did; any problem
    (no cache folder, no room) leaves the file to be created as before."""
    try:
        path = check_db_path(db_path)  # (never a file named ':memory:' or 'md:x': connect refuses those)
    except TpuAnalyzeError:
        return False
    folder = _cache_dir()
    if folder is None or path.exists() or path.with_name(path.name + ".wal").exists():
        return False
    try:
        key = hashlib.sha1(
            f"{schema_sql()}\n{_views_fingerprint()}\n{duckdb.__version__}".encode()
        ).hexdigest()[:16]
        template = folder / f"empty-{key}.duckdb"
        if not template.is_file():
            _build_template(template)
        scratch = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.seed")
        try:
            shutil.copyfile(template, scratch)
            os.link(scratch, path)  # never over a file another process created meanwhile
        finally:
            scratch.unlink(missing_ok=True)
        return True
    except (OSError, duckdb.Error, TpuAnalyzeError):
        return False


def _build_template(template: Path) -> None:
    template.parent.mkdir(parents=True, exist_ok=True)
    scratch = template.with_name(f".{template.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        con = connect(scratch)
        try:
            views, note = install_default_views(con)
        finally:
            con.close()
        if note is not None or not views:
            return
        os.replace(scratch, template)
    finally:
        scratch.unlink(missing_ok=True)
        scratch.with_name(scratch.name + ".wal").unlink(missing_ok=True)
