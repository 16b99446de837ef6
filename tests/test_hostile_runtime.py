"""Hostile conditions around the readers, through the real CLI in processes of their own: trace
names that look like terminal markup or escape codes, a full disk, Ctrl-C, SIGTERM, kill -9, and
several processes on one database (docs/concurrency.md)."""

from __future__ import annotations

import gzip
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from conftest import run_cli
from fuzz.harness import db_state
from test_hostile_input import RUN, TRACE_JSON, XSPACE, cli

from tpuanalyze import generator
from tpuanalyze.pipeline import ingest_paths
from tpuanalyze.safe_text import plain, safe

# signals, a file-size limit and database locks between processes: one after another, on one worker
pytestmark = pytest.mark.xdist_group("resources")

HOSTILE = ["[/x]", "[memory]", "[link=https://evil.example/]click[/link]", "\x1b[31mred\x1b[0m", "[bold]b"]


def _default_sigint() -> None:
    """Ctrl-C as a shell leaves it to the command it starts; a test runner may ignore SIGINT (pytest-xdist
    workers do), and an ignored signal stays ignored in every process started from there."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tpuanalyze.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=_default_sigint,
    )


# ------------------------------------------------------------------ trace text is data, never markup


def hostile_trace(tmp_path: Path) -> Path:
    """The bundled JAX CPU capture (Chrome JSON) with every op name prefixed by markup/escape codes."""
    doc = json.loads(gzip.decompress(TRACE_JSON.read_bytes()))
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    # the op name the analyzer reports: each distinct one gets a prefix by its sorted rank, the same in
    # every run (str hash() is salted per process, which once left no [/x] or escape code in the top ops)
    ops = sorted({str(e["args"]["hlo_op"]) for e in events if "hlo_op" in (e.get("args") or {})})
    prefix = {op: HOSTILE[rank % len(HOSTILE)] for rank, op in enumerate(ops)}
    for i, event in enumerate(events):
        event["name"] = HOSTILE[i % len(HOSTILE)] + str(event.get("name"))
        args = event.get("args") or {}
        if "hlo_op" in args:
            args["hlo_op"] = prefix[str(args["hlo_op"])] + str(args["hlo_op"])
    path = tmp_path / "hostile.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def test_safe_text_escapes_markup_and_control_characters() -> None:
    from rich.console import Console
    from rich.text import Text

    for text in [*HOSTILE, "ends in \\", "a\u202eb", "x\x9by", "tab\there"]:
        rendered = Text.from_markup(safe(text)).plain
        assert rendered == plain(text)
        assert not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in rendered)
    console = Console(record=True, width=200)
    console.print(safe("[/x] [memory] [link=https://e.example]y[/link]"))
    assert "[/x] [memory] [link=https://e.example]y[/link]" in console.export_text()


def test_report_and_sql_print_hostile_names_literally(tmp_path: Path) -> None:
    trace = hostile_trace(tmp_path)
    db = tmp_path / "h.duckdb"
    out = tmp_path / "r.json"
    result = cli("report", str(trace), "--db", str(db), "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert out.exists() and json.loads(out.read_text())
    assert "\x1b" not in result.stdout and "\x1b" not in result.stderr
    shown = [h for h in ("[/x]", "[memory]", "[link=https://evil.example/]", "[bold]b") if h in result.stdout]
    assert shown, result.stdout  # the top ops carry the names, printed as they are
    assert "\\x1b[31mred" in result.stdout and "[/x]" in result.stdout  # escaped, and never markup
    sql = cli(
        "sql",
        "SELECT DISTINCT name FROM events WHERE name LIKE '[%' OR name LIKE '%red%' ORDER BY name",
        "--db",
        str(db),
    )
    assert sql.returncode == 0, sql.stderr
    for text in ("[/x]", "[memory]", "[link=https://evil.example/]click[/link]", "\\x1b[31mred\\x1b[0m"):
        assert text in sql.stdout, sql.stdout
    assert "\x1b" not in sql.stdout
    as_json = cli(
        "sql", "SELECT DISTINCT name FROM events WHERE name LIKE '%red%'", "--db", str(db), "--format", "json"
    )
    assert "\x1b" not in as_json.stdout and "\\u001b[31mred" in as_json.stdout
    assert any("\x1b[31mred" in r["name"] for r in json.loads(as_json.stdout))  # the data is intact


def test_mlperf_and_ingest_notes_print_hostile_paths_literally(tmp_path: Path, shared_mlperf: Path) -> None:
    source = sorted(shared_mlperf.rglob("result_0.txt"))[-1]
    folder = tmp_path / "v0.7" / "tpu-v3-32-[/x]" / "[memory]bench"
    folder.mkdir(parents=True)
    (folder / "result_0.txt").write_text(source.read_text())
    result = cli("mlperf", str(folder), env={"COLUMNS": "200"}, stdin=subprocess.DEVNULL)  # wide, any runner
    assert result.returncode == 0, result.stderr
    assert "[memory]bench" in result.stdout and "[/x]" in result.stdout
    walk = tmp_path / "walk"
    walk.mkdir()
    (walk / "vm.xplane.pb").write_bytes(XSPACE.read_bytes())
    os.mkfifo(walk / "\x1b[31m[memory].xplane.pb")
    result = cli("ingest", str(walk), "--db", str(tmp_path / "w.duckdb"), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "\\x1b[31m[memory].xplane.pb: skipped" in result.stderr and "\x1b" not in result.stderr


# ------------------------------------------------------------------ crash paths


def _limit_file_size(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail (EFBIG), like a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_disk_full_at_commit_is_one_line_and_the_database_unchanged(tmp_path: Path, pod32: Path) -> None:
    db = tmp_path / "full.duckdb"
    ingest_paths([XSPACE], db)
    before = db_state(db)
    result = subprocess.run(
        [sys.executable, "-m", "tpuanalyze.cli", "ingest", str(pod32), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_file_size(db.stat().st_size + 256 * 1024),
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "cannot rollback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tpuanalyze: error: {db}"), result.stderr
    assert "database unchanged" in lines[0] and "File too large" in lines[0]
    assert db_state(db) == before
    assert run_cli("ingest", str(TRACE_JSON), "--db", str(db)).returncode == 0  # and it still works


def _wait_for(predicate, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _report_dirs(tmpdir: Path) -> list[Path]:
    return sorted(tmpdir.glob("tpuanalyze-report-*"))


@pytest.mark.parametrize(
    "signum,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_ctrl_c_and_sigterm_during_report(
    tmp_path: Path, pod32: Path, signum: int, code: int, word: str
) -> None:
    """Exit 130 (Ctrl-C) or 143 (SIGTERM), one line, no traceback, and the temporary database gone."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    run = pod32
    proc = popen("report", str(run), env={"TMPDIR": str(tmpdir)})
    assert _wait_for(lambda: bool(_report_dirs(tmpdir)) or proc.poll() is not None)
    time.sleep(0.5)  # inside the ingest
    assert proc.poll() is None, "report finished before the signal: the test proves nothing"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == f"tpuanalyze: {word}", err
    assert _report_dirs(tmpdir) == []


def test_leftovers_of_a_kill_9_are_cleaned_on_the_next_run(tmp_path: Path, pod32: Path) -> None:
    """kill -9 in the middle of the per-host map: the database is as it was, and the next ingest
    removes what the killed one left (its staging folder of host parts, DuckDB's spill folder)."""
    db = tmp_path / "k.duckdb"
    ingest_paths([XSPACE], db)
    before = db_state(db)
    # one process (no pool): nothing of the killed ingest lives on to write after the kill; parts,
    # as a pool's workers write them (not loaded straight into the database)
    proc = popen("ingest", str(pod32), "--db", str(db), "--workers", "1", env={"TPUANALYZE_DIRECT_LOAD": "0"})

    def staged() -> list[Path]:
        return list(tmp_path.glob(".tpuanalyze-staging-*"))

    assert _wait_for(lambda: any(any(p.rglob("*.parquet")) for p in staged()) or proc.poll() is not None)
    assert proc.poll() is None, "the ingest ended before the kill: the test proves nothing"
    proc.kill()
    proc.communicate()
    assert db_state(db) == before  # nothing was committed
    left = staged()
    assert left and any(any(p.rglob("*.parquet")) for p in left)  # the parts the kill left behind
    spill = tmp_path / "k.duckdb.tmp"  # what a kill -9 while DuckDB spills leaves behind
    spill.mkdir(exist_ok=True)
    (spill / "duckdb_temp_storage-0.tmp").write_bytes(b"\0" * 4096)
    result = run_cli("ingest", str(TRACE_JSON), "--db", str(db))
    assert result.returncode == 0, result.stderr
    assert not spill.exists()
    assert not any(p.exists() for p in left)  # the dead ingest's staging folder is gone
    assert len(db_state(db)[0]) == 2


def test_a_kill_9_inside_a_direct_load_leaves_the_database_as_it_was(tmp_path: Path, pod32: Path) -> None:
    """kill -9 while the hosts are inserted straight into the database (one process): the
    transaction never committed, so the database opens as it was and takes the next ingest."""
    db = tmp_path / "k.duckdb"
    ingest_paths([XSPACE], db)
    before = db_state(db)
    size = db.stat().st_size
    proc = popen("ingest", str(pod32), "--db", str(db), "--workers", "1", env={"TPUANALYZE_DIRECT_LOAD": "1"})
    # the load has begun writing into the database file (its row groups, or the write-ahead log)
    wal = Path(f"{db}.wal")
    assert _wait_for(lambda: db.stat().st_size > size or wal.exists() or proc.poll() is not None)
    assert proc.poll() is None, "the ingest ended before the kill: the test proves nothing"
    proc.kill()
    proc.communicate()
    assert db_state(db) == before  # nothing was committed
    result = run_cli("ingest", str(TRACE_JSON), "--db", str(db))
    assert result.returncode == 0, result.stderr
    assert len(db_state(db)[0]) == 2


# ------------------------------------------------------------------ concurrency


@pytest.fixture(scope="module")
def pod32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated 32-host run (small: 2 steps, ~24 MB): its ingest takes long enough to meet."""
    out = tmp_path_factory.mktemp("pod32")
    return Path(generator.generate(model="resnet50", chips=128, hosts=32, steps=2, out=out))


def _locked(db: Path) -> bool:
    """Another process holds the database (an ingest writing it)."""
    if not db.exists():
        return False
    try:
        duckdb.connect(str(db), read_only=True).close()
    except duckdb.Error as exc:
        return "Could not set lock" in str(exc)
    return False


def _popen_logged(log: Path, *args: str) -> subprocess.Popen:
    """The CLI in a process of its own, its stderr in ``log`` (read while it runs)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tpuanalyze.cli", *args],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )


def test_a_reader_while_another_process_writes_waits_and_answers(tmp_path: Path) -> None:
    """A writer holds the database's lock (as an ingest does while it commits): a reader with
    --wait says it waits, then answers with what the writer committed; --wait 0 is one line."""
    db = tmp_path / "c.duckdb"
    ingest_paths([XSPACE], db)
    writer = duckdb.connect(str(db))  # this process now holds the write lock
    try:
        impatient = cli("sql", "SELECT count(*) FROM runs", "--db", str(db), "--wait", "0")
        log = tmp_path / "reader.err"
        reader = _popen_logged(log, "sql", "SELECT name FROM runs", "--db", str(db), "--format", "csv",
                               "--wait", "300")
        assert _wait_for(lambda: "waiting to read" in log.read_text() or reader.poll() is not None)
        assert reader.poll() is None, log.read_text()
        writer.execute("UPDATE runs SET name = 'written-while-you-waited'")
    finally:
        writer.close()
    out, _ = reader.communicate(timeout=300)
    err = log.read_text()
    assert reader.returncode == 0, err
    assert "waiting to read" in err and "Could not set lock" not in err
    assert out.splitlines()[1] == "written-while-you-waited"  # it saw the committed write
    # --wait 0: one line, naming the database and the option
    assert impatient.returncode == 2, impatient.stderr
    assert impatient.stderr.strip().splitlines()[-1].startswith(f"tpuanalyze: error: {db}: another process")
    assert "--wait" in impatient.stderr


def test_two_ingests_both_land(tmp_path: Path, pod32: Path) -> None:
    """Two ingests that meet a held database both queue (saying so) and both land, each with its views."""
    db = tmp_path / "two.duckdb"
    ingest_paths([XSPACE], db)
    logs = [tmp_path / "first.err", tmp_path / "second.err"]
    writer = duckdb.connect(str(db))  # held until both ingests wait for it
    try:
        first = _popen_logged(logs[0], "ingest", str(pod32), "--db", str(db))
        second = _popen_logged(logs[1], "ingest", str(RUN), "--db", str(db))
        procs = [first, second]
        assert _wait_for(
            lambda: all("waiting to write" in log.read_text() for log in logs)
            or any(p.poll() is not None for p in procs)
        ), [log.read_text() for log in logs]
        assert all(p.poll() is None for p in procs), [log.read_text() for log in logs]
    finally:
        writer.close()
    for proc, log in zip(procs, logs, strict=True):
        proc.communicate(timeout=300)
        assert proc.returncode == 0, log.read_text()
    con = duckdb.connect(str(db), read_only=True)
    runs = con.execute("SELECT source_path, num_hosts FROM runs ORDER BY run_id").fetchall()
    views = con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'step_breakdown'").fetchone()[
        0
    ]
    con.close()
    assert sorted(runs[1:]) == sorted([(str(pod32.resolve()), 32), (str(RUN.resolve()), 1)])
    assert views == 1  # each ingest's exit status 0 means its run and its views are committed


def test_ctrl_c_during_the_analysis_of_a_database(tmp_path: Path, pod32: Path) -> None:
    """Ctrl-C while DuckDB runs the analyzer's queries (was: "RuntimeError: Query interrupted")."""
    db = tmp_path / "a.duckdb"
    ingest_paths([pod32], db)
    proc = popen("report", str(db))
    # past start-up (~0.4 s), into the queries: the 32-host report takes ~1.3 s on an idle machine since
    # reports stopped importing Altair (it was ~1.5 s, which this test's 1.5 s sleep used to outlast)
    time.sleep(0.8)
    assert proc.poll() is None, "report finished before the signal: the test proves nothing"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "tpuanalyze: interrupted", err
