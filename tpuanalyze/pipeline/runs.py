"""Runs named on the command line (``compare``, ``scaling``): a database run or trace paths,
which are ingested into a scratch database first, then analysed."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import duckdb

from tpuanalyze.analyzer.compare import LoadedRun, _looks_like_db, _lookup, run_facts
from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.pipeline.ingest import ingest_paths
from tpuanalyze.store.database import open_database, require_runs_table


class RunLoader:
    """Analyzes runs named on the command line; trace paths are ingested into a scratch database.

    Use as a context manager: the scratch database lives until the end of the ``with`` block.
    """

    def __init__(self, db_path: Path | None = None, thresholds: Any = None) -> None:
        self.db_path = db_path
        self.thresholds = thresholds
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._connections: dict[str, duckdb.DuckDBPyConnection] = {}

    def __enter__(self) -> RunLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        for con in self._connections.values():
            con.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _connect(self, db: Path) -> duckdb.DuckDBPyConnection:
        key = str(db.resolve())
        if key not in self._connections:
            if not db.exists():
                raise TpuAnalyzeError("no such database", str(db))
            try:
                con = open_database(key, read_only=True)
            except duckdb.Error as exc:
                raise TpuAnalyzeError(f"not a tpuanalyze database ({exc})", str(db)) from exc
            try:
                require_runs_table(con, db)
            except TpuAnalyzeError:
                con.close()
                raise
            self._connections[key] = con
        return self._connections[key]

    def _scratch(self) -> Path:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tpuanalyze-")
        return Path(self._tmp.name) / "scratch.duckdb"

    def resolve(self, spec: str) -> list[tuple[Path, int, str]]:
        """(database, run_id, run name) for one argument: DB:RUN, a run in --db, or a trace path."""
        path = Path(spec)
        if ":" in spec and not path.exists():
            db_part, _, ref = spec.rpartition(":")
            if db_part and Path(db_part).is_file():
                db = Path(db_part)
                return [(db, rid, name) for rid, name in _lookup(self._connect(db), ref, str(db))]
        if path.is_file() and _looks_like_db(path):
            db = path
            con = self._connect(db)
            return [(db, int(r[0]), str(r[1])) for r in con.execute(
                "SELECT run_id, name FROM runs WHERE source_format <> 'mlperf' ORDER BY run_id").fetchall()]
        if not path.exists():
            if self.db_path is not None:
                return [(self.db_path, rid, name)
                        for rid, name in _lookup(self._connect(self.db_path), spec, str(self.db_path))]
            raise TpuAnalyzeError("no such file or directory (nor a DB:RUN reference)", spec)
        scratch = self._scratch()
        key = str(scratch.resolve())
        if key in self._connections:  # DuckDB allows one writer: close our reader while ingesting
            self._connections.pop(key).close()
        summary = ingest_paths([path], scratch)
        if not summary.run_ids:
            raise TpuAnalyzeError("no trace runs found", spec)
        con = self._connect(scratch)
        names = dict(con.execute("SELECT run_id, name FROM runs").fetchall())
        return [(scratch, int(rid), str(names.get(rid, spec))) for rid in summary.run_ids]

    def load(self, spec: str, chips_override: int | None = None) -> list[LoadedRun]:
        """Analyze every run an argument names."""
        from tpuanalyze.analyzer.api import analyze_run

        runs = []
        resolved = self.resolve(spec)
        for db, run_id, name in resolved:
            con = self._connect(db)
            analysis = analyze_run(con, run_id, self.thresholds)
            facts = run_facts(analysis)
            if chips_override:
                facts["chips"], facts["chips_source"] = chips_override, "--chips override"
                facts["cores"] = chips_override * facts["cores_per_chip"]
            label = spec if len(resolved) == 1 else f"{spec} [{name}]"
            runs.append(LoadedRun(label, run_id, name, analysis, facts))
        return runs


# --- may these runs be compared? -----------------------------------------------------------------------
