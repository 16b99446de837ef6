"""MLPerf result logs summarised straight from their files (read, then the analyzer's summary)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from tpuanalyze.analyzer.mlperf_summary import summarize
from tpuanalyze.parsers.mlperf import load_mlperf


def summarize_paths(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Summaries straight from result files (no database)."""
    tables = load_mlperf(paths)
    return summarize(tables.results.to_pandas(), tables.intervals.to_pandas())
