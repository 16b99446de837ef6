"""``tpuanalyze ingest`` and ``tpuanalyze sql`` as a user runs them (real subprocesses), and how
paths become runs (file, run folder, logdir, folder of files)."""

from __future__ import annotations

import csv
import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tpuanalyze.parsers.discover import discover

from tpuanalyze.proto import xplane_pb2


def tpuanalyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuanalyze.cli", *args], capture_output=True, text=True)


def xspace_bytes(events: int = 20, host: str = "h") -> bytes:
    space = xplane_pb2.XSpace(hostnames=[host])
    plane = space.planes.add(id=1, name="/device:TPU:0")
    plane.event_metadata[1].id = 1
    plane.event_metadata[1].name = "fusion"
    line = plane.lines.add(id=1, name="XLA Ops", timestamp_ns=10)
    for i in range(events):
        line.events.add(metadata_id=1, offset_ps=i * 100, duration_ps=50)
    return space.SerializeToString()


def chrome_bytes(events: int = 5) -> bytes:
    trace = {
        "traceEvents": [
            {"ph": "X", "pid": 1, "tid": 1, "ts": i, "dur": 0.5, "name": "x"} for i in range(events)
        ]
    }
    return gzip.compress(json.dumps(trace).encode())


@pytest.fixture()
def logdir(tmp_path: Path) -> Path:
    """Two runs in the standard layout (one with two hosts and a JSON twin), plus loose files."""
    root = tmp_path / "logdir"
    run_a = root / "plugins" / "profile" / "2026_01_01_00_00_00"
    run_b = root / "plugins" / "profile" / "2026_01_02_00_00_00"
    for folder in (run_a, run_b):
        folder.mkdir(parents=True)
    (run_a / "host0.xplane.pb").write_bytes(xspace_bytes(20))
    (run_a / "host1.xplane.pb").write_bytes(xspace_bytes(30))
    (run_a / "host0.trace.json.gz").write_bytes(chrome_bytes(7))
    (run_a / "jit_f(1).hlo_proto.pb").write_bytes(b"ignored")
    (run_b / "host0.trace.json.gz").write_bytes(chrome_bytes(4))
    (root / "loose.xplane.pb").write_bytes(xspace_bytes(3))
    (root / "README.json").write_text('{"not": "a trace"}')  # skipped while walking: not a trace
    return root


def test_discovery_rules(logdir: Path) -> None:
    runs = {r.name: r for r in discover([logdir])}
    assert set(runs) == {"2026_01_01_00_00_00", "2026_01_02_00_00_00", "loose"}
    a = runs["2026_01_01_00_00_00"]
    assert a.source_format == "xspace" and [h for h, _ in a.files] == ["host0", "host1"]
    assert a.notes and "host0.trace.json.gz" in a.notes[0]  # same capture: XSpace preferred
    assert runs["2026_01_02_00_00_00"].source_format == "chrome_json"
    named = discover([logdir / "plugins/profile/2026_01_01_00_00_00/host0.trace.json.gz"])
    assert [(r.source_format, r.name) for r in named] == [("chrome_json", "2026_01_01_00_00_00")]
    # the same run named twice (folder and logdir) is one run
    assert len(discover([logdir, logdir / "plugins/profile/2026_01_02_00_00_00"])) == 3


def test_ingest_cli_reports_what_it_loaded_and_is_quiet_when_piped(logdir: Path, tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    proc = tpuanalyze("ingest", str(logdir), "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip().splitlines()
    assert len(out) == 1
    assert out[0].startswith("ingested 3 run(s)") and "4 host(s)" in out[0] and "57 events" in out[0]
    assert " s into " in out[0]
    assert "\x1b[" not in proc.stderr and "reading" not in proc.stderr  # no progress bar when piped
    # a note names the run it is about (<logdir>/<run>), not just the file
    assert "note: logdir/2026_01_01_00_00_00: host0.trace.json.gz: skipped" in proc.stderr
    again = tpuanalyze("ingest", str(logdir), "--db", str(db))
    assert again.returncode == 0 and "replaced run(s) 1, 2, 3" in again.stdout
    assert "[run_id 1, 2, 3]" in again.stdout  # re-ingested runs keep their ids: `t.duckdb:2` stays valid
    count = tpuanalyze(
        "sql",
        "--db",
        str(db),
        "--format",
        "csv",
        "SELECT count(*) AS n, count(DISTINCT run_id) AS runs FROM events",
    )
    assert list(csv.reader(io.StringIO(count.stdout))) == [["n", "runs"], ["57", "3"]]


def test_sql_formats_and_errors(logdir: Path, tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    assert tpuanalyze("ingest", str(logdir), "--db", str(db)).returncode == 0
    query = "SELECT name, num_hosts, metadata FROM runs ORDER BY name"
    as_json = tpuanalyze("sql", "--db", str(db), "--format", "json", query)
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [r["name"] for r in rows] == ["logdir/2026_01_01_00_00_00", "logdir/2026_01_02_00_00_00",
                                         "logdir/loose"]
    assert rows[0]["num_hosts"] == 2 and isinstance(rows[0]["metadata"], dict)  # JSON columns nested
    table = tpuanalyze("sql", "--db", str(db), query)
    assert table.returncode == 0 and "2026_01_02_00_00_00" in table.stdout and "num_hosts" in table.stdout
    bad = tpuanalyze("sql", "--db", str(db), "SELEKT nonsense")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr and "syntax error" in bad.stderr.lower()
    missing = tpuanalyze("sql", "--db", str(tmp_path / "nope.duckdb"), "SELECT 1")
    assert missing.returncode == 2 and "no such database" in missing.stderr
    assert not (tmp_path / "nope.duckdb").exists()
    write = tpuanalyze("sql", "--db", str(db), "DELETE FROM runs")
    assert write.returncode == 2  # read-only: sql never changes the database
    empty = tpuanalyze("sql", "--db", str(db), "--format", "json", "SELECT * FROM runs WHERE false")
    assert json.loads(empty.stdout) == []


def test_ingest_cli_missing_path(tmp_path: Path) -> None:
    proc = tpuanalyze("ingest", str(tmp_path / "absent"), "--db", str(tmp_path / "x.duckdb"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"tpuanalyze: error: {tmp_path / 'absent'}: no such file or directory"
    assert not (tmp_path / "x.duckdb").exists()
