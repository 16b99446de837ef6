"""Bad input never damages the database: one-line error naming the file and the reason, exit 2,
no traceback, and an existing database byte-for-byte unchanged (API and CLI)."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from conftest import SHARED_TRACES

from tpuanalyze.errors import TpuAnalyzeError, TraceFormatError
from tpuanalyze.pipeline import ingest_paths
from tpuanalyze.proto import xplane_pb2

CORRUPT = SHARED_TRACES / "real" / "corrupt_reencoded_tpu_inference.xplane.pb"


def small_xspace() -> bytes:
    space = xplane_pb2.XSpace(hostnames=["h"])
    plane = space.planes.add(id=1, name="/host:CPU")
    plane.event_metadata[1].id = 1
    plane.event_metadata[1].name = "work"
    line = plane.lines.add(id=7, name="python", timestamp_ns=1000)
    for i in range(50):
        line.events.add(metadata_id=1, offset_ps=i * 1000, duration_ps=500)
    return space.SerializeToString()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def existing_db(tmp_path: Path) -> Path:
    good = tmp_path / "good.xplane.pb"
    good.write_bytes(small_xspace())
    db = tmp_path / "existing.duckdb"
    ingest_paths([good], db)
    return db


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, words the reason must contain)."""
    data = small_xspace()
    files: dict[str, tuple[Path, str]] = {}

    def put(name: str, content: bytes, reason: str) -> None:
        path = tmp_path / name
        path.write_bytes(content)
        files[name] = (path, reason)

    put("empty.xplane.pb", b"", "empty")
    put("truncated.xplane.pb", data[: len(data) // 2], "XSpace")
    put("garbage.xplane.pb", bytes(range(256)) * 40, "XSpace")
    put("text.xplane.pb", b"this is not a protobuf at all\n" * 20, "XSpace")
    put("gzipped.xplane.pb", gzip.compress(data), "gzip")
    put("notjson.trace.json", b"{not json", "JSON")
    put("list.json", json.dumps([1, 2, 3]).encode(), "Chrome trace")
    put("config.json", json.dumps({"learning_rate": 0.1}).encode(), "Chrome trace")
    put("fakegz.trace.json.gz", b'{"traceEvents": []}', "gzip")
    trace = {
        "traceEvents": [
            {"ph": "X", "name": f"e{i}", "ts": i * 7.5, "dur": i % 13, "pid": 1, "tid": i % 5}
            for i in range(3000)
        ]
    }
    packed = gzip.compress(json.dumps(trace).encode())
    put("truncgz.trace.json.gz", packed[: len(packed) // 2], "gzip")
    put("empty.trace.json", b"", "empty")
    put("notes.txt", b"hello", "not a trace file")
    files["missing.xplane.pb"] = (tmp_path / "missing.xplane.pb", "no such file")
    if CORRUPT.is_file():
        files["shared-corrupt"] = (CORRUPT, "corrupt")
    return files


def test_each_bad_file_is_refused_and_db_unchanged(tmp_path: Path, existing_db: Path) -> None:
    before = _digest(existing_db)
    for name, (path, reason) in _bad_files(tmp_path).items():
        with pytest.raises(TraceFormatError) as info:
            ingest_paths([path], existing_db)
        message = str(info.value)
        assert info.value.path == str(path), name
        assert reason.lower() in message.lower(), (name, message)
        assert "\n" not in message, name
        assert _digest(existing_db) == before, name


def test_one_bad_file_among_good_ones_loads_nothing(tmp_path: Path, existing_db: Path) -> None:
    good = tmp_path / "other.xplane.pb"
    good.write_bytes(small_xspace())
    bad = tmp_path / "bad.xplane.pb"
    bad.write_bytes(small_xspace()[:-7])
    before = _digest(existing_db)
    with pytest.raises(TraceFormatError):
        ingest_paths([good, bad], existing_db)
    assert _digest(existing_db) == before
    con = duckdb.connect(str(existing_db), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchall() == [(1,)]
    con.close()


def test_database_error_rolls_back_everything(tmp_path: Path, existing_db: Path) -> None:
    """A failure inside the load transaction, after the events went in (here a CHECK constraint on
    ``hosts`` that the new file violates), rolls the whole call back."""
    con = duckdb.connect(str(existing_db))
    before = con.execute("SELECT count(*), sum(duration_ps) FROM events").fetchall()
    con.execute("CREATE TABLE hosts_copy AS SELECT * FROM hosts")
    con.execute("DROP TABLE hosts")
    con.execute(
        "CREATE TABLE hosts (run_id INTEGER NOT NULL, host VARCHAR NOT NULL, "
        "file_path VARCHAR NOT NULL CHECK (file_path NOT LIKE '%again%'), file_bytes BIGINT, "
        "hostnames VARCHAR[], errors VARCHAR[], warnings VARCHAR[])"
    )
    con.execute("INSERT INTO hosts SELECT * FROM hosts_copy")
    con.execute("DROP TABLE hosts_copy")
    con.close()
    good = tmp_path / "again.xplane.pb"
    good.write_bytes(small_xspace() * 1)
    with pytest.raises(TpuAnalyzeError, match="database unchanged"):
        ingest_paths([good], existing_db)
    con = duckdb.connect(str(existing_db), read_only=True)
    assert con.execute("SELECT count(*), sum(duration_ps) FROM events").fetchall() == before
    assert con.execute("SELECT count(*) FROM runs").fetchall() == [(1,)]
    con.close()


def test_bad_database_file_is_a_clean_error(tmp_path: Path) -> None:
    good = tmp_path / "g.xplane.pb"
    good.write_bytes(small_xspace())
    not_db = tmp_path / "not.duckdb"
    not_db.write_text("definitely not a database\n" * 100)
    with pytest.raises(TpuAnalyzeError) as info:
        ingest_paths([good], not_db)
    assert info.value.path == str(not_db)


@pytest.mark.parametrize(
    "name",
    [
        "empty.xplane.pb",
        "garbage.xplane.pb",
        "notjson.trace.json",
        "fakegz.trace.json.gz",
        "missing.xplane.pb",
        "shared-corrupt",
    ],
)
def test_cli_bad_input_one_line_exit_2(tmp_path: Path, existing_db: Path, name: str) -> None:
    files = _bad_files(tmp_path)
    if name not in files:
        pytest.skip(f"shared corrupt trace not present at {CORRUPT}")
    path, _ = files[name]
    before = _digest(existing_db)
    proc = subprocess.run(
        [sys.executable, "-m", "tpuanalyze.cli", "ingest", str(path), "--db", str(existing_db)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpuanalyze: error: ") and str(path) in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert _digest(existing_db) == before
