"""`tpuanalyze sql` table output piped: every value whole (no truncation), one line per row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import SAMPLE_TRACES


def test_piped_table_keeps_long_values_whole(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    run = [sys.executable, "-m", "tpuanalyze.cli"]
    trace = SAMPLE_TRACES / "jax_cpu" / "single_jit_train"
    subprocess.run([*run, "ingest", str(trace), "--db", str(db)], check=True, capture_output=True)
    out = subprocess.run(
        [*run, "sql", "--db", str(db), "SELECT source_path, name FROM runs"],
        check=True, capture_output=True, text=True,
    ).stdout
    [source_path] = [p for p in out.split() if p.startswith(str(trace.resolve()))]
    assert Path(source_path).is_dir()  # the whole path, not an ellipsis
    assert "…" not in out
