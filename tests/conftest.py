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
