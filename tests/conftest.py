"""Shared test fixtures: where the shared real traces live, skipped with a reason when absent."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple
from unittest import mock

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED = PROJECT_ROOT.parent / "shared"
SHARED_TRACES = SHARED / "traces"
SHARED_MLPERF = SHARED / "mlperf_logs"
SAMPLE_TRACES = PROJECT_ROOT / "sample_traces"

HAS_XPROF = importlib.util.find_spec("xprof") is not None


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"shared traces not present at {SHARED_TRACES} (they live beside the project, not in it)")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def shared_mlperf() -> Path:
    if not SHARED_MLPERF.is_dir():
        pytest.skip(f"shared MLPerf logs not present at {SHARED_MLPERF}")
    return SHARED_MLPERF


@pytest.fixture(scope="session")
def sample_traces() -> Path:
    return SAMPLE_TRACES

# Parallel runs (the README's command: ``-n 2 --dist loadgroup --no-loadscope-reorder``, pytest-xdist >= 3.8).
# Under loadgroup a test module runs on one worker, so its module fixtures are made once; modules that
# declare an xdist_group of their own share a worker with the rest of that group: "captures" (the
# session's ingest of the real and bundled captures, made once) and "resources" (tests that measure time
# or memory, send signals or hold database locks, run one after another). The long units go first so
# that no worker is left with one at the end (the reorder by test count is off: it would put the one
# long clone test last). A serial run (no ``-n``) keeps the collection order.
@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set by xdist on its workers under --dist loadgroup
        return
    named = {item.nodeid for item in items if item.get_closest_marker("xdist_group") is not None}
    for item in items:
        if item.nodeid not in named:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") else 1 if item.nodeid in named else 2)


# An interpreter with xprof installed, for cross-checks against XProf's own analysis (an optional,
# independent reader; never a runtime need). `.ci/run` creates it; tests skip when it is absent.
XPROF_PYTHON = os.environ.get("TPUANALYZE_XPROF_PYTHON", "/opt/xprofvenv/bin/python")


# Under CI (CI=true) the independent cross-checks (headless chromium, XProf) must run: a missing
# tool fails the test instead of skipping it, so CI cannot go green without them.
IN_CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")


def missing_tool(reason: str) -> None:
    """Skip the calling test for a missing independent tool, or fail it under CI=true."""
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def xprof_python() -> str:
    """Path of a python that imports xprof, or skip the calling test with the reason (fail under CI)."""
    if HAS_XPROF:
        return sys.executable
    if not Path(XPROF_PYTHON).exists():
        missing_tool(f"no xprof interpreter at {XPROF_PYTHON} (set TPUANALYZE_XPROF_PYTHON)")
    return XPROF_PYTHON


@pytest.fixture
def chromium() -> str:
    """The headless chromium binary, or skip the test (fail under CI=true)."""
    from tpuanalyze.reports import browser

    found = browser.find_chromium()
    if found is None:
        missing_tool("headless chromium not installed (apt-get install chromium)")
    return found


class CliResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, env: dict[str, str] | None = None) -> CliResult:
    """The `tpuanalyze` CLI run in this process (no interpreter start-up): exit status, stdout, stderr.
    Tests where the real process matters (exit codes seen by a shell, tracebacks) use subprocess."""
    from tpuanalyze.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        mock.patch.dict(os.environ, env or {}),
    ):
        try:
            main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return CliResult(code, out.getvalue(), err.getvalue())


def run_cli_process(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
                    **kwargs) -> subprocess.CompletedProcess:
    """The real `tpuanalyze` command in a process of its own (piped: exit status and stderr as a shell
    sees them); ``env`` adds to the environment, other keywords go to subprocess.run."""
    return subprocess.run([sys.executable, "-m", "tpuanalyze.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False, **kwargs)


# ------------------------------------------------------------------ captures ingested once per session


class CaptureSet:
    """Captures ingested once per test session into one database (several runs, as users keep them),
    each run analysed at most once per thresholds override: the tests that only read an analysis of a
    real or bundled capture share it instead of ingesting and analysing the same files again.

    Connections are opened per call and closed, so a test may open the database itself (read-write,
    e.g. to install the views its evidence SQL runs in) between calls."""

    def __init__(self, paths: list[Path], db: Path) -> None:
        import duckdb

        from tpuanalyze.pipeline import ingest_paths

        self.paths = list(paths)
        self.db = db
        ingest_paths(self.paths, db)
        con = duckdb.connect(str(db), read_only=True)
        try:
            self._sources = {Path(s): r for r, s in con.execute(
                "SELECT run_id, source_path FROM runs WHERE source_format <> 'mlperf'").fetchall()}
            # a single-host run is also found by its one file (ingesting the file alone is the same run)
            self._files = {Path(f): r for r, f in con.execute(
                "SELECT run_id, any_value(file_path) FROM hosts GROUP BY run_id HAVING count(*) = 1"
            ).fetchall()}
        finally:
            con.close()
        self._analyses: dict[tuple[int, str], object] = {}

    def run_id(self, path: Path) -> int:
        """The run of a path given to the ingest: a file, a run folder, or a logdir holding one run."""
        path = Path(path).resolve()
        if path in self._sources:
            return self._sources[path]
        if path in self._files:
            return self._files[path]
        inside = [r for source, r in self._sources.items() if path in source.parents]
        assert len(inside) == 1, f"{path}: {len(inside)} runs of the session's captures"
        return inside[0]

    def analysis(self, path: Path, thresholds: dict | None = None):  # noqa: ANN201 - RunAnalysis
        """The run's analysis (read-only connection), computed once per thresholds override."""
        import json

        import duckdb
        from tpuanalyze.analyzer.api import analyze_run

        run_id = self.run_id(path)
        key = (run_id, json.dumps(thresholds, sort_keys=True))
        if key not in self._analyses:
            con = duckdb.connect(str(self.db), read_only=True)
            try:
                self._analyses[key] = analyze_run(con, run_id, thresholds)
            finally:
                con.close()
        return self._analyses[key]


def shared_capture_paths(root: Path) -> list[Path]:
    """Every capture in ../shared/traces that ingests (the corrupt one is refused by design)."""
    real = root / "real"
    paths = sorted(p for p in real.glob("*.xplane.pb") if "corrupt" not in p.name)
    paths += sorted(p for p in real.iterdir() if p.is_dir())
    paths += sorted(p for p in (root / "jax_cpu").iterdir() if p.is_dir())
    paths += sorted((root / "chrome_json").glob("*.json.gz"))
    return paths


def sample_capture_paths(root: Path = SAMPLE_TRACES) -> list[Path]:
    """The bundled captures: JAX CPU, generated pods, the scaling series (one run folder each)."""
    return sorted(run for group in ("jax_cpu", "generated", "scaling") for capture in (root / group).iterdir()
                  if capture.is_dir() for run in (capture / "plugins" / "profile").iterdir() if run.is_dir())


@pytest.fixture(scope="session")
def shared_captures(shared_traces: Path, tmp_path_factory: pytest.TempPathFactory) -> CaptureSet:
    """The shared real captures, ingested and analysed once per session (skipped when absent)."""
    db = tmp_path_factory.mktemp("shared") / "shared.duckdb"
    return CaptureSet(shared_capture_paths(shared_traces), db)


@pytest.fixture(scope="session")
def sample_captures(tmp_path_factory: pytest.TempPathFactory) -> CaptureSet:
    """The bundled captures in sample_traces/, ingested and analysed once per session."""
    return CaptureSet(sample_capture_paths(), tmp_path_factory.mktemp("samples") / "samples.duckdb")
