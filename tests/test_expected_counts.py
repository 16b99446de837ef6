"""Every real ``.xplane.pb`` in ../shared/traces ingests to exactly the events an independent reader
(xprof's ProfileData, ``expected_counts.json``) sees: per (plane, line) event counts, and summed
durations within 1e-6 relative. Files that reader refuses (``error``) must be refused by us too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from conftest import SHARED_TRACES

from tpuanalyze.errors import TraceFormatError
from tpuanalyze.pipeline import ingest_paths

EXPECTED_FILE = SHARED_TRACES / "expected_counts.json"


def _expected() -> dict:
    return json.loads(EXPECTED_FILE.read_text()) if EXPECTED_FILE.is_file() else {}


EXPECTED = _expected()
GOOD = sorted(k for k, v in EXPECTED.items() if "error" not in v)
REFUSED = sorted(k for k, v in EXPECTED.items() if "error" in v)
ABSENT = pytest.mark.skip(reason=f"shared traces not present at {SHARED_TRACES}")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    if not GOOD:
        pytest.skip(f"shared traces not present at {SHARED_TRACES}")
    db = tmp_path_factory.mktemp("counts") / "traces.duckdb"
    summary = ingest_paths([SHARED_TRACES / rel for rel in GOOD], db)
    assert summary.runs == len(GOOD)
    con = duckdb.connect(str(db), read_only=True)
    yield con
    con.close()


@pytest.mark.parametrize("rel", GOOD or [pytest.param("absent", marks=ABSENT)])
def test_counts_and_durations_match_independent_reader(loaded: duckdb.DuckDBPyConnection, rel: str) -> None:
    path = str((SHARED_TRACES / rel).resolve())
    (run_id,) = loaded.execute("SELECT run_id FROM hosts WHERE file_path = ?", [path]).fetchall()[0]
    expected = EXPECTED[rel]
    planes = loaded.execute(
        "SELECT plane_index, name, num_lines FROM planes WHERE run_id = ? ORDER BY plane_index", [run_id]
    ).fetchall()
    assert [(p[1], p[2]) for p in planes] == [(p["name"], len(p["lines"])) for p in expected["planes"]]
    got = {
        (p, ln): (name, count, total)
        for p, ln, name, count, total in loaded.execute(
            """SELECT e.plane_index, e.line_index, any_value(e.line), count(*), sum(e.duration_ps)
               FROM events e WHERE run_id = ? GROUP BY ALL""",
            [run_id],
        ).fetchall()
    }
    lines = {
        (p, ln): name
        for p, ln, name in loaded.execute(
            "SELECT plane_index, line_index, name FROM lines WHERE run_id = ?", [run_id]
        ).fetchall()
    }
    total_events = 0
    for pi, plane in enumerate(expected["planes"]):
        for li, line in enumerate(plane["lines"]):
            assert lines[(pi, li)] == line["name"]
            _, count, total_ps = got.get((pi, li), (line["name"], 0, 0))
            assert count == line["events"], (plane["name"], line["name"])
            want_ns = line["sum_duration_ns"]
            assert abs(total_ps / 1000 - want_ns) <= 1e-6 * max(abs(want_ns), 1.0), (
                plane["name"],
                line["name"],
            )
            total_events += count
    assert total_events == expected["total_events"]
    (num_events,) = loaded.execute("SELECT num_events FROM runs WHERE run_id = ?", [run_id]).fetchall()[0]
    assert num_events == expected["total_events"]


@pytest.mark.parametrize("rel", REFUSED or [pytest.param("absent", marks=ABSENT)])
def test_files_the_independent_reader_refuses_are_refused(tmp_path: Path, rel: str) -> None:
    path = SHARED_TRACES / rel
    db = tmp_path / "db.duckdb"
    with pytest.raises(TraceFormatError) as info:
        ingest_paths([path], db)
    assert info.value.path == str(path)
    assert not db.exists()
    proc = subprocess.run(
        [sys.executable, "-m", "tpuanalyze.cli", "ingest", str(path), "--db", str(db)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and str(path) in proc.stderr
    assert "Traceback" not in proc.stderr
