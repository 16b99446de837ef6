"""Shared test fixtures: where the shared real traces live, skipped with a reason when absent."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
