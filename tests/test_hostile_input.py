"""Hostile input through the real CLI: values a reader must not store, files that cost too much,
odd file-system objects. Each case is refused with one line naming the input file (exit 2, no
traceback, the database unchanged) or handled as docs/input.md says. Inputs are built from the
real traces (../shared/traces, skipped when absent) and the bundled JAX CPU captures."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import duckdb
import numpy as np
import pytest
from conftest import PROJECT_ROOT, SHARED_TRACES, run_cli, run_cli_process
from fuzz.harness import db_state
from tpuanalyze.parsers import wire

from tpuanalyze.pipeline import ingest_paths
from tpuanalyze.proto import xplane_pb2

JAX = PROJECT_ROOT / "sample_traces" / "jax_cpu"
RUN = next((JAX / "single_jit_train" / "plugins" / "profile").iterdir())
XSPACE = RUN / "vm.xplane.pb"
TRACE_JSON = RUN / "vm.trace.json.gz"
KINETO = SHARED_TRACES / "chrome_json" / "kineto_nccl_rank0.json.gz"
DAY_US = 86_400e6


cli = run_cli_process


@pytest.fixture(scope="module")
def pristine_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled single-jit run ingested once; each test gets a copy of this file."""
    path = tmp_path_factory.mktemp("pristine") / "runs.duckdb"
    ingest_paths([XSPACE], path)
    return path


@pytest.fixture()
def db(tmp_path: Path, pristine_db: Path) -> Path:
    """A database of this test's own, already holding the bundled single-jit run."""
    path = tmp_path / "runs.duckdb"
    shutil.copyfile(pristine_db, path)
    assert not pristine_db.with_name(pristine_db.name + ".wal").exists()  # the copy is the whole database
    return path


def assert_refused(result, path: Path, *words: str) -> None:
    err = result.stderr.strip() if hasattr(result, "stderr") else ""
    assert result.returncode == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tpuanalyze: error: {path}"), err
    for word in words:
        assert word in lines[0], err


def refused_in_process(db: Path, path: Path, *words: str) -> None:
    before = db_state(db)
    result = run_cli("ingest", str(path), "--db", str(db))
    assert_refused(result, path, *words)
    assert db_state(db) == before


def json_doc(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def write_json(tmp_path: Path, doc: dict, name: str = "bad.trace.json.gz") -> Path:
    """The trace as gzip JSON text; the string "__1e999__" stands for the number literal 1e999
    (which JSON allows and a parser reads as infinity)."""
    path = tmp_path / name
    text = json.dumps(doc).replace('"__1e999__"', "1e999")
    path.write_bytes(gzip.compress(text.encode()))
    return path


def timed_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


# ------------------------------------------------------------------ Chrome JSON: times and fields


def test_one_far_event_in_a_real_kineto_trace_is_refused_not_shifting_the_others(
    tmp_path: Path, db: Path
) -> None:
    if not KINETO.exists():
        pytest.skip(f"shared Kineto trace not present at {KINETO}")
    doc = json_doc(KINETO)
    timed_events(doc)[5]["ts"] = 0  # ts 0 among epoch microseconds: 55 years before the rest
    refused_in_process(db, write_json(tmp_path, doc), "traceEvents[", "days from the median", "7 days")


@pytest.mark.parametrize(
    "gap_days,words", [(106, "days from the median"), (30, "days from the median"), (-8, "is negative")]
)
def test_an_event_days_away_is_refused(tmp_path: Path, db: Path, gap_days: int, words: str) -> None:
    doc = json_doc(TRACE_JSON)  # JAX writes ts relative to the capture: days before it is negative
    event = timed_events(doc)[3]
    event["ts"] = float(event["ts"]) + gap_days * DAY_US
    refused_in_process(db, write_json(tmp_path, doc), f"name {event['name'][:20]!r}"[:-1], words)


def test_an_event_within_the_policy_keeps_every_other_start(tmp_path: Path) -> None:
    """An event 6 days away is legal: stored, and the others' starts stay what they were."""
    doc = json_doc(TRACE_JSON)
    events = timed_events(doc)
    events[-1]["ts"] = float(events[-1]["ts"]) + 6 * DAY_US
    path = write_json(tmp_path, doc, "far.trace.json.gz")
    db = tmp_path / "far.duckdb"
    ingest_paths([TRACE_JSON], db)
    ingest_paths([path], db)
    con = duckdb.connect(str(db), read_only=True)
    a, b = (
        con.execute("SELECT start_ps FROM event_rows WHERE run_id = ? ORDER BY start_ps", [r]).fetchnumpy()[
            "start_ps"
        ]
        for r in (1, 2)
    )
    con.close()
    assert len(a) == len(b) and a.min() >= 0 and b.min() >= 0
    assert np.isin(b, a).sum() == len(a) - 1  # every other event starts where it did
    assert b.max() > 5 * DAY_US * 1e6


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("dur", "nan", ("dur is not finite",)),
        ("dur", "__1e999__", ("not valid JSON", "infinity")),  # orjson refuses the literal itself
        ("dur", "inf", ("dur is not finite",)),
        ("dur", -5, ("negative",)),
        ("dur", 30 * DAY_US, ("longer than 7 days",)),
        ("dur", [1], ("dur is not a number",)),
        ("ts", True, ("ts is not a number",)),
        ("ts", "abc", ("ts is not a number",)),
        ("ts", "-inf", ("ts is not finite",)),
        ("ts", {"a": 1}, ("ts is not a number",)),
        ("pid", [1, 2], ("pid is a list",)),
        ("tid", {"x": 1}, ("tid is a dict",)),
    ],
)
def test_chrome_json_values_that_cannot_be_stored_are_refused(
    tmp_path: Path, db: Path, field: str, value, words: tuple[str, ...]
) -> None:
    doc = json_doc(TRACE_JSON)
    timed_events(doc)[7][field] = value
    where = () if "not valid JSON" in words else ("traceEvents[",)  # the event is named
    refused_in_process(db, write_json(tmp_path, doc), *where, *words)


def test_an_end_before_its_begin_is_refused(tmp_path: Path, db: Path) -> None:
    doc = {
        "traceEvents": [
            {"ph": "B", "ts": 50, "pid": 1, "tid": 1, "name": "a"},
            {"ph": "E", "ts": 10, "pid": 1, "tid": 1},
        ]
    }
    refused_in_process(db, write_json(tmp_path, doc), "ends before its B")


# ------------------------------------------------------------------ XSpace: times and field numbers


def xspace_with(tmp_path: Path, change) -> Path:
    space = xplane_pb2.XSpace()
    space.ParseFromString(XSPACE.read_bytes())
    lines = [line for plane in space.planes for line in plane.lines if line.events]
    change(space, lines)
    path = tmp_path / "bad.xplane.pb"
    path.write_bytes(space.SerializeToString())
    return path


@pytest.mark.parametrize("offset", [(1 << 63) - 1, (1 << 63) - 10**6, -(1 << 63), 100 * 86_400 * 10**12])
def test_xspace_offsets_near_int64_max_do_not_wrap(tmp_path: Path, db: Path, offset: int) -> None:
    def change(space, lines):
        lines[0].events[0].offset_ps = offset

    refused_in_process(db, xspace_with(tmp_path, change), "an event of line", "plane")
    # and the database still reports its good run
    assert (
        run_cli(
            "sql", "SELECT min(start_ps) >= 0 AS ok FROM events", "--db", str(db), "--format", "csv"
        ).stdout.splitlines()[1]
        == "True"
    )


@pytest.mark.parametrize(
    "duration,words", [(-1, "negative duration"), (8 * 86_400 * 10**12, "longer than 7 days")]
)
def test_xspace_bad_durations_are_refused(tmp_path: Path, db: Path, duration: int, words: str) -> None:
    def change(space, lines):
        lines[-1].events[-1].duration_ps = duration

    refused_in_process(db, xspace_with(tmp_path, change), words)


def test_xspace_line_100_days_away_is_refused(tmp_path: Path, db: Path) -> None:
    def change(space, lines):
        lines[-1].timestamp_ns += 100 * 86_400 * 10**9

    refused_in_process(db, xspace_with(tmp_path, change), "days from the host's other lines")


def test_xspace_field_numbers_above_2_29_are_refused(tmp_path: Path, db: Path) -> None:
    path = tmp_path / "bigfield.xplane.pb"
    path.write_bytes(
        XSPACE.read_bytes() + bytes([0x80, 0x80, 0x80, 0x80, 0x10, 0x01])
    )  # field 2^29, varint 1
    refused_in_process(db, path, "field number 536870912 out of range")
    # inside an event (decoded by numpy): field 2^29 in the event's bytes
    event = xplane_pb2.XEvent(metadata_id=1, duration_ps=5).SerializeToString() + bytes(
        [0x80, 0x80, 0x80, 0x80, 0x10, 0x01]
    )
    buf = np.frombuffer(event, dtype=np.uint8)
    with pytest.raises(wire.WireError, match="2\\^29-1"):
        wire.decode_fields(buf, np.array([0]), np.array([len(event)]))


def test_hosts_of_a_run_starting_100_days_apart_are_refused(tmp_path: Path, db: Path) -> None:
    folder = tmp_path / "logdir" / "plugins" / "profile" / "run"
    folder.mkdir(parents=True)
    (folder / "a.xplane.pb").write_bytes(XSPACE.read_bytes())
    (folder / "c.xplane.pb").write_bytes(XSPACE.read_bytes())

    def change(space, lines):
        for plane in space.planes:
            for line in plane.lines:
                line.timestamp_ns += 100 * 86_400 * 10**9

    xspace_with(tmp_path, change).rename(folder / "b.xplane.pb")
    before = db_state(db)
    result = run_cli("ingest", str(folder), "--db", str(db))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "b.xplane.pb: starts 100.0 days away from the other hosts" in result.stderr
    assert db_state(db) == before


# ------------------------------------------------------------------ MLPerf garbage lines

MLLOG_LINES = {
    "time_ms list": ':::MLLOG {"namespace": "", "time_ms": [1], "key": "run_start", "value": null}',
    "metadata str": ':::MLLOG {"time_ms": 1, "key": "run_start", "value": 1, "metadata": "str"}',
    "MLL nan": ':::MLL nan run_start: {"value": null}',
    "MLL 1e999": ':::MLL 1e999 run_start: {"value": null}',
    "time_ms 1e999": ':::MLLOG {"namespace": "", "time_ms": 1e999, "key": "run_start", "value": null}',
    "negative": ':::MLLOG {"namespace": "", "time_ms": -5, "key": "run_start", "value": null}',
}


@pytest.mark.parametrize("case", sorted(MLLOG_LINES))
def test_mlperf_garbage_lines_are_one_line_errors(
    tmp_path: Path, db: Path, shared_mlperf: Path, case: str
) -> None:
    source = sorted(shared_mlperf.rglob("result_0.txt"))[-1]
    lines = source.read_text().splitlines()
    at = len(lines) // 2
    lines.insert(at, MLLOG_LINES[case])
    folder = tmp_path / "v0.7" / "tpu-v3-32" / "resnet"
    folder.mkdir(parents=True)
    path = folder / "result_0.txt"
    path.write_text("\n".join(lines) + "\n")
    before = db_state(db)
    result = run_cli("ingest", str(path), "--db", str(db))
    assert_refused(result, path.resolve(), f"line {at + 1}:")
    assert db_state(db) == before
    result = run_cli("mlperf", str(path))
    assert_refused(result, path.resolve())


# ------------------------------------------------------------------ resource bounds


# Peak memory and time of one command: with the other tests that measure them, on one worker
RESOURCES = pytest.mark.xdist_group("resources")

# A fresh interpreter that runs one command and writes that command's peak RSS (KiB) to a file: this
# process's RUSAGE_CHILDREN is the maximum over every child any earlier test waited for.
_PEAK_WRAPPER = ("import pathlib, resource, subprocess, sys; r = subprocess.run(sys.argv[2:]); "
                 "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
                 "pathlib.Path(sys.argv[1]).write_text(str(peak)); sys.exit(r.returncode)")


def cli_peak(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """``cli(*args)`` and the peak RSS in MiB of that command alone."""
    peak = tmp_path / "peak_kib.txt"
    command = [sys.executable, "-c", _PEAK_WRAPPER, str(peak), sys.executable, "-m", "tpuanalyze.cli", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    return result, int(peak.read_text()) / 1024


def _gzip_stream(path: Path, head: bytes, body: bytes, repeat: int, tail: bytes) -> None:
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    with path.open("wb") as out:
        out.write(compressor.compress(head))
        for _ in range(repeat):
            out.write(compressor.compress(body))
        out.write(compressor.compress(tail) + compressor.flush())


@RESOURCES
def test_gzip_bomb_is_refused_quickly_with_bounded_memory(tmp_path: Path) -> None:
    """256 MB of inflated text in a ~250 KB file: refused after 64 MB (the ratio check), not inflated."""
    bomb = tmp_path / "bomb.trace.json.gz"
    _gzip_stream(bomb, b'{"traceEvents": [', b" " * (1 << 20), 256, b"]}")
    started = time.monotonic()
    result, peak_mb = cli_peak(tmp_path, "ingest", str(bomb), "--db", str(tmp_path / "x.duckdb"))
    assert_refused(result, bomb, "decompression bomb")
    assert time.monotonic() - started < 30
    assert peak_mb < 400
    assert not (tmp_path / "x.duckdb").exists()


@RESOURCES
def test_millions_of_tiny_json_events_are_refused_before_parsing(tmp_path: Path) -> None:
    """4M events in a 600 KB gzip: refused at the event bound, never turned into 4M Python dicts."""
    many = tmp_path / "many.trace.json.gz"
    event = b'{"ph":"X","ts":1,"dur":1,"pid":1,"tid":1,"name":"a"},'
    _gzip_stream(many, b'{"traceEvents": [', event * 1000, 4000, event[:-1] + b"]}")
    result, peak_mb = cli_peak(tmp_path, "ingest", str(many), "--db", str(tmp_path / "x.duckdb"))
    assert_refused(result, many, "more than 1,000,000 trace events", "TPUANALYZE_MAX_JSON_EVENTS")
    assert peak_mb < 400
    # the bound is the documented knob: raised, a smaller file of the same kind loads
    small = tmp_path / "small.trace.json.gz"
    _gzip_stream(small, b'{"traceEvents": [', event * 100, 30, event[:-1] + b"]}")
    result = run_cli(
        "ingest", str(small), "--db", str(tmp_path / "y.duckdb"), env={"TPUANALYZE_MAX_JSON_EVENTS": "2000"}
    )
    assert_refused(result, small, "more than 2,000 trace events")
    assert run_cli("ingest", str(small), "--db", str(tmp_path / "y.duckdb")).returncode == 0


def _many_planes(path: Path, count: int) -> None:
    space = xplane_pb2.XSpace()
    space.ParseFromString(XSPACE.read_bytes())
    for i in range(count):
        space.planes.add(id=i, name=f"/host:empty{i}")
    path.write_bytes(space.SerializeToString())


@RESOURCES
def test_200k_empty_planes_are_refused_quickly(tmp_path: Path) -> None:
    path = tmp_path / "planes.xplane.pb"
    _many_planes(path, 200_000)
    started = time.monotonic()
    result, peak_mb = cli_peak(tmp_path, "ingest", str(path), "--db", str(tmp_path / "x.duckdb"))
    assert_refused(result, path, "more than 16,384 planes")
    assert time.monotonic() - started < 20
    assert peak_mb < 400


@RESOURCES
def test_empty_planes_under_the_bound_cost_little(tmp_path: Path) -> None:
    path = tmp_path / "planes.xplane.pb"
    _many_planes(path, 2_000)
    started = time.monotonic()
    result = run_cli("ingest", str(path), "--db", str(tmp_path / "x.duckdb"))
    assert result.returncode == 0, result.stderr
    assert "2003 planes" in result.stdout
    assert time.monotonic() - started < 20  # ~0.3 ms per empty plane; was ~0.5 s per 1,000 and growing


# ------------------------------------------------------------------ file-system objects


def test_symlinked_run_folder_is_one_run_with_its_own_name(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(RUN)
    db = tmp_path / "x.duckdb"
    result = run_cli("ingest", str(link), str(RUN), "--db", str(db))
    assert result.returncode == 0, result.stderr
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT name, source_path, source_format FROM runs").fetchall()
    assert [(path, fmt) for _, path, fmt in rows] == [(str(RUN.resolve()), "xspace")]
    assert rows[0][0].endswith(RUN.name)  # named after the run folder, not the link
    con.close()


def test_file_symlinked_beside_its_run_is_not_a_second_run(tmp_path: Path) -> None:
    logdir = tmp_path / "logdir"
    run = logdir / "plugins" / "profile" / "r1"
    run.mkdir(parents=True)
    (run / "vm.xplane.pb").write_bytes(XSPACE.read_bytes())
    (logdir / "copy.xplane.pb").symlink_to(run / "vm.xplane.pb")
    result = run_cli("ingest", str(logdir), "--db", str(tmp_path / "x.duckdb"))
    assert result.returncode == 0, result.stderr
    assert "ingested 1 run(s)" in result.stdout
    assert "already part of another run" in result.stderr


def test_fifo_named_like_a_trace_is_skipped_not_waited_for(tmp_path: Path) -> None:
    folder = tmp_path / "walk"
    folder.mkdir()
    (folder / "vm.xplane.pb").write_bytes(XSPACE.read_bytes())
    os.mkfifo(folder / "pipe.xplane.pb")
    result = cli("ingest", str(folder), "--db", str(tmp_path / "x.duckdb"), timeout=60)
    assert result.returncode == 0, result.stderr
    assert "pipe.xplane.pb: skipped, not a regular file" in result.stderr
    named = cli("ingest", str(folder / "pipe.xplane.pb"), "--db", str(tmp_path / "x.duckdb"), timeout=60)
    assert_refused(named, folder / "pipe.xplane.pb", "not a regular file (a FIFO)")


def test_file_symlink_loop_is_one_line(tmp_path: Path) -> None:
    a, b = tmp_path / "a.xplane.pb", tmp_path / "b.xplane.pb"
    a.symlink_to(b)
    b.symlink_to(a)
    assert_refused(run_cli("ingest", str(a), "--db", str(tmp_path / "x.duckdb")), a, "symbolic links")


@pytest.mark.parametrize("target", [":memory:", "md:x", "motherduck:db", "s3://bucket/x.duckdb"])
def test_databases_that_are_not_local_files_are_refused(tmp_path: Path, target: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli("ingest", str(XSPACE), "--db", target)
    assert result.returncode == 2 and "not a database file" in result.stderr, result.stderr
    assert run_cli("sql", "SELECT 1", "--db", target).returncode == 2
    # nothing written under the name either (a new database's template copy once made ':memory:' files)
    assert list(tmp_path.iterdir()) == []


def test_mlperf_lone_surrogate_escape_is_a_one_line_error(
    tmp_path: Path, db: Path, shared_mlperf: Path
) -> None:
    """Found by tests/fuzz/run_fuzz.py: "\\ud800" in a log line reached Arrow as a traceback."""
    source = sorted(shared_mlperf.rglob("result_0.txt"))[-1]
    lines = source.read_text().splitlines()
    lines.insert(3, ':::MLLOG {"time_ms": 1, "key": "opt_name", "value": "\\ud800", "metadata": {}}')
    folder = tmp_path / "v0.7" / "tpu-v3-32" / "resnet"
    folder.mkdir(parents=True)
    (folder / "result_0.txt").write_text("\n".join(lines) + "\n")
    before = db_state(db)
    result = run_cli("ingest", str(folder), "--db", str(db))
    assert_refused(result, (folder / "result_0.txt").resolve(), "line 4:", "lone UTF-16 surrogate")
    assert db_state(db) == before
    lines[3] = (
        ':::MLLOG {"time_ms": 1, "key": "opt_name", "value": "\\ud83d\\ude00", "metadata": {}}'  # a pair
    )
    (folder / "result_0.txt").write_text("\n".join(lines) + "\n")
    assert run_cli("ingest", str(folder), "--db", str(db)).returncode == 0


@pytest.mark.parametrize("kind", ["xspace", "mlperf"])
def test_file_names_that_are_not_utf8_are_one_line_errors(
    tmp_path: Path, db: Path, shared_mlperf: Path, kind: str
) -> None:
    root = os.fsencode(tmp_path)
    if kind == "xspace":
        os.makedirs(root + b"/walk")
        with open(root + b"/walk/h\xff.xplane.pb", "wb") as out:
            out.write(XSPACE.read_bytes())
        target = tmp_path / "walk"
    else:
        os.makedirs(root + b"/v0.7/tpu-v3-32/b\xff")
        with open(root + b"/v0.7/tpu-v3-32/b\xff/result_0.txt", "wb") as out:
            out.write(sorted(shared_mlperf.rglob("result_0.txt"))[-1].read_bytes())
        target = tmp_path / "v0.7"
    before = db_state(db)
    result = cli("ingest", str(target), "--db", str(db))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "\\xff" in result.stderr and "not valid UTF-8" in result.stderr
    assert db_state(db) == before
