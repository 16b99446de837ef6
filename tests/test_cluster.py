"""The per-host map on a real Dask distributed cluster, and trace inputs named by URL (fsspec).

A real ``dask scheduler`` and ``dask worker`` run as subprocesses on loopback, started once for the
module (the worker runs this interpreter, so it imports the tpuanalyze under test). URL inputs use
fsspec's ``file://`` protocol: the same listing and streaming code as ``gs://``, no network.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SAMPLE_TRACES, missing_tool, run_cli
from test_report_pipeline import cli, generated_run

from tpuanalyze.errors import TpuAnalyzeError, TraceFormatError
from tpuanalyze.pipeline.tasks import HostInput

try:
    import distributed
    import fsspec  # noqa: F401
except ImportError:  # the cluster extra is optional: its tests skip (and fail under CI=true)
    distributed = None

START_SECONDS = 120  # a loaded 2-core machine starts a scheduler and a worker in ~5 s


@pytest.fixture(autouse=True)
def _cluster_extra() -> None:
    if distributed is None:
        missing_tool("the cluster extra is not installed (pip install -e '.[cluster]')")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a running Dask scheduler on 127.0.0.1 with one single-threaded worker."""
    folder = tmp_path_factory.mktemp("dask")
    scheduler_file = folder / "scheduler.json"
    logs = [(folder / "scheduler.log").open("w"), (folder / "worker.log").open("w")]
    # The worker imports this module for the tasks defined here; a dead worker fails its task at once.
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--no-dashboard", "--scheduler-file", str(scheduler_file)],
            stdout=logs[0], stderr=subprocess.STDOUT, env=env, cwd=folder,
        )
    ]
    try:
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", "--scheduler-file", str(scheduler_file),
                 "--nthreads", "1", "--nworkers", "1", "--no-dashboard", "--local-directory", str(folder)],
                stdout=logs[1], stderr=subprocess.STDOUT, env=env, cwd=folder,
            )
        )
        deadline = time.monotonic() + START_SECONDS
        while not (scheduler_file.exists() and scheduler_file.stat().st_size):
            if time.monotonic() > deadline or processes[0].poll() is not None:
                pytest.fail(f"dask scheduler did not start: {(folder / 'scheduler.log').read_text()}")
            time.sleep(0.1)
        address = json.loads(scheduler_file.read_text())["address"]
        with distributed.Client(address, timeout=START_SECONDS) as client:
            client.wait_for_workers(1, timeout=START_SECONDS)
        yield address
    finally:
        for process in reversed(processes):
            _stop(process)
        for log in logs:
            log.close()


def _count_events(path: str, host: str) -> tuple[int, str]:
    """A per-host task as the map runs it: a string path (or URL) in, small results out."""
    from tpuanalyze.parsers.remote import local_input
    from tpuanalyze.parsers.xspace import XSpaceReader

    with local_input(path) as local:
        reader = XSpaceReader(local, host)
        reader.file_path = path
        return sum(batch.num_rows for plane in reader.planes() for batch in plane.batches), reader.file_path


def _die(item: object) -> None:
    """A task whose worker process dies (as one killed for its memory would)."""
    os._exit(3)


def _sample_host_file() -> Path:
    (path,) = sorted((SAMPLE_TRACES / "generated" / "resnet50_v3-32_baseline").rglob("*.xplane.pb"))
    return path


# --- URL inputs (fsspec) --------------------------------------------------------------------------


def test_a_url_names_the_same_runs_as_its_local_path() -> None:
    from tpuanalyze.parsers.discover import discover_inputs

    local = discover_inputs([SAMPLE_TRACES])
    remote = discover_inputs([SAMPLE_TRACES.as_uri()])
    assert len(remote.runs) == len(local.runs) >= 5
    for url_run, path_run in zip(remote.runs, local.runs, strict=True):
        assert url_run.name == path_run.name
        assert url_run.source_format == path_run.source_format
        assert url_run.source_path == Path(path_run.source_path).as_uri()
        assert url_run.files == [(host, Path(p).resolve().as_uri()) for host, p in path_run.files]
        assert url_run.notes == path_run.notes
    # MLPerf logs are read from local paths only (docs/cluster.md): a URL walk does not sniff for them
    assert local.mlperf_files and not remote.mlperf_files


def test_a_url_to_a_run_folder_or_a_file_is_one_run() -> None:
    from tpuanalyze.parsers.discover import discover

    host_file = _sample_host_file()
    (by_folder,) = discover([host_file.parent.as_uri()])
    (by_file,) = discover([host_file.as_uri()])
    assert by_folder.files == by_file.files == [(host_file.name.split(".")[0], host_file.as_uri())]
    assert by_folder.name == by_file.name == host_file.parent.name


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("file:///no/such/logdir", "no such file or directory"),
        ("nosuchprotocol://bucket/logdir", "cannot read this URL: Protocol not known: nosuchprotocol"),
        ((SAMPLE_TRACES.parent / "docs").as_uri(), "no trace files (.xplane.pb, .trace.json[.gz]) found"),
        ((SAMPLE_TRACES.parent / "README.md").as_uri(), "not a trace file or MLPerf result log"),
    ],
)
def test_a_bad_url_is_one_line_naming_it(url: str, reason: str) -> None:
    from tpuanalyze.parsers.discover import discover_inputs

    with pytest.raises(TpuAnalyzeError) as exc:
        discover_inputs([url])
    assert str(exc.value).startswith(f"{url}: {reason}")
    assert "\n" not in str(exc.value)


def test_a_url_input_is_read_through_a_temporary_copy_that_is_removed(tmp_path: Path) -> None:
    from tpuanalyze.parsers.remote import local_input

    host_file = _sample_host_file()
    with local_input(host_file.as_uri()) as local:
        assert local != host_file and local.name == host_file.name
        assert local.read_bytes() == host_file.read_bytes()
    assert not local.exists() and not local.parent.exists()
    with local_input(str(host_file)) as same:  # a local path is read where it is
        assert same == host_file


def test_a_bad_file_at_a_url_is_reported_under_the_url(tmp_path: Path) -> None:
    from tpuanalyze.parsers.remote import local_input
    from tpuanalyze.parsers.xspace import XSpaceReader

    broken = tmp_path / "h.xplane.pb"
    broken.write_bytes(_sample_host_file().read_bytes()[:1000])
    with pytest.raises(TraceFormatError) as exc:
        with local_input(broken.as_uri()) as local:
            for plane in XSpaceReader(local, "h").planes():
                list(plane.batches)
    assert exc.value.path == broken.as_uri()
    with pytest.raises(TraceFormatError, match="no such file"):
        with local_input((tmp_path / "gone.xplane.pb").as_uri()):
            pass


# --- the Dask executor ----------------------------------------------------------------------------


def test_tasks_run_on_the_cluster_workers(scheduler: str) -> None:
    from tpuanalyze.pipeline.cluster import dask_executor

    with dask_executor(scheduler) as executor:
        pids = {executor.submit(os.getpid).result(timeout=60) for _ in range(3)}
        host_file = _sample_host_file()
        by_url = executor.submit(_count_events, host_file.as_uri(), "h").result(timeout=60)
        by_path = executor.submit(_count_events, str(host_file), "h").result(timeout=60)
    assert os.getpid() not in pids and len(pids) == 1  # one worker process ran them
    assert by_url == (by_path[0], host_file.as_uri()) and by_path[0] > 1000


def test_a_task_error_arrives_as_raised_and_a_dead_worker_as_one_line(scheduler: str, tmp_path: Path) -> None:
    from tpuanalyze.pipeline.cluster import dask_executor

    missing = (tmp_path / "gone.xplane.pb").as_uri()
    with dask_executor(scheduler) as executor:
        with pytest.raises(TraceFormatError) as exc:
            executor.submit(_count_events, missing, "h").result(timeout=60)
        assert str(exc.value) == f"{missing}: no such file"
        host = HostInput("h", "/pod/h.xplane.pb", "xspace")
        with pytest.raises(TpuAnalyzeError) as died:
            executor.submit(_die, host).result(timeout=120)
        assert str(died.value).startswith("/pod/h.xplane.pb: a Dask worker died while running this task")
        # the nanny restarts the worker: the cluster keeps serving
        assert executor.submit(os.getpid).result(timeout=120) != os.getpid()


def test_an_unreachable_scheduler_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuanalyze.pipeline import cluster

    monkeypatch.setattr(cluster, "CONNECT_SECONDS", 2.0)
    started = time.monotonic()
    with pytest.raises(TpuAnalyzeError) as exc:
        with cluster.dask_executor("tcp://127.0.0.1:9"):
            pass
    assert str(exc.value).startswith("tcp://127.0.0.1:9: cannot reach the Dask scheduler: ")
    assert "\n" not in str(exc.value)
    assert time.monotonic() - started < cluster.CONNECT_SECONDS + 20


def test_without_dask_installed_the_scheduler_option_says_how_to_install_it() -> None:
    code = (
        "import sys; sys.modules['distributed'] = None\n"
        "from tpuanalyze.pipeline.cluster import dask_executor\n"
        "from tpuanalyze.errors import TpuAnalyzeError\n"
        "try:\n"
        "    dask_executor('tcp://127.0.0.1:8786').__enter__()\n"
        "except TpuAnalyzeError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "--scheduler needs Dask distributed: pip install 'tpuanalyze[cluster]'"



# --- the CLI on the cluster -----------------------------------------------------------------------


def _multi_host_run() -> Path:
    run = generated_run(model="resnet50", chips=32, hosts=4, steps=3)
    assert len(list(run.glob("*.xplane.pb"))) == 4
    return run


def _report_json(tmp_path: Path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    proc = cli("report", *args, "--json", str(out), "--quiet", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def local_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The multi-host run's report JSON with the map in this process (``--workers 1``)."""
    return _report_json(tmp_path_factory.mktemp("local"), "local", str(_multi_host_run()), "--workers", "1")


def test_report_on_the_cluster_equals_one_local_worker(
    scheduler: str, local_report: dict, tmp_path: Path
) -> None:
    remote = _report_json(tmp_path, "remote", str(_multi_host_run()), "--scheduler", scheduler)
    assert remote == local_report
    (run_summary,) = local_report["runs"]
    assert abs(sum(run_summary["breakdown"].values()) - 1.0) < 1e-6


def test_a_url_input_on_the_cluster_is_the_same_run_as_its_local_path(
    scheduler: str, local_report: dict, tmp_path: Path
) -> None:
    import duckdb

    run = _multi_host_run()
    db = tmp_path / "url.duckdb"
    by_url = _report_json(tmp_path, "url", run.as_uri(), "--scheduler", scheduler, "--db", str(db))
    assert by_url == local_report
    con = duckdb.connect(str(db), read_only=True)
    try:
        (source,) = con.execute("SELECT source_path FROM runs").fetchone()
        files = sorted(r[0] for r in con.execute("SELECT file_path FROM hosts").fetchall())
    finally:
        con.close()
    assert source == run.as_uri()  # the URL, never a temporary copy
    assert files == sorted(p.as_uri() for p in run.glob("*.xplane.pb"))


def test_workers_and_scheduler_exclude_each_other(tmp_path: Path) -> None:
    db = tmp_path / "unused.duckdb"
    proc = run_cli("ingest", str(_multi_host_run()), "--db", str(db), "--workers", "2",
                   "--scheduler", "tcp://127.0.0.1:9")
    assert proc.returncode == 2
    assert proc.stderr.startswith("tpuanalyze: error: --workers sets the local worker processes")
    assert not db.exists()


def _fingerprint(db: Path) -> list:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(
            "SELECT run_id, name, source_path, num_events FROM runs ORDER BY run_id"
        ).fetchall() + con.execute("SELECT count(*), sum(duration_ps) FROM events").fetchall()
    finally:
        con.close()


@pytest.fixture
def kept_db(tmp_path: Path) -> Path:
    """A database already holding one run, to show a failed call leaves it as it was."""
    db = tmp_path / "kept.duckdb"
    proc = cli("ingest", str(SAMPLE_TRACES / "generated" / "resnet50_v3-32_baseline"), "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    return db


def test_an_unreachable_scheduler_is_one_line_exit_2_database_unchanged(kept_db: Path) -> None:
    before = _fingerprint(kept_db)
    proc = cli("ingest", str(_multi_host_run()), "--db", str(kept_db), "--scheduler", "tcp://127.0.0.1:9",
               env={"TPUANALYZE_DASK_CONNECT_TIMEOUT": "2"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("tpuanalyze: error: tcp://127.0.0.1:9: cannot reach the Dask scheduler: ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert _fingerprint(kept_db) == before


def test_a_failing_host_on_the_cluster_is_one_line_exit_2_database_unchanged(
    scheduler: str, kept_db: Path, tmp_path: Path
) -> None:
    import shutil

    run = tmp_path / "logdir" / "plugins" / "profile" / "broken_run"
    shutil.copytree(_multi_host_run(), run)
    victim = sorted(run.glob("*.xplane.pb"))[2]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    before = _fingerprint(kept_db)
    for target in (str(run), run.as_uri()):
        proc = cli("ingest", target, "--db", str(kept_db), "--scheduler", scheduler)
        assert proc.returncode == 2, proc.stderr
        named = str(victim) if target == str(run) else victim.as_uri()
        assert proc.stderr.startswith(f"tpuanalyze: error: {named}: "), proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert _fingerprint(kept_db) == before


def test_parquet_parts_shipped_from_the_cluster_hold_the_same_events(scheduler: str, tmp_path: Path) -> None:
    import duckdb

    run = _multi_host_run()
    local_db, cluster_db = tmp_path / "local.duckdb", tmp_path / "cluster.duckdb"
    for args in (("--db", str(local_db), "--workers", "1"),
                 ("--db", str(cluster_db), "--parquet", str(tmp_path / "events"), "--scheduler", scheduler)):
        proc = cli("ingest", str(run), *args)
        assert proc.returncode == 0, proc.stderr
    query = "SELECT * EXCLUDE (run_id) FROM events ORDER BY ALL"
    rows = []
    for db in (local_db, cluster_db):
        con = duckdb.connect(str(db), read_only=True)
        try:
            rows.append(con.execute(query).fetchall())
        finally:
            con.close()
    assert rows[0] == rows[1] and len(rows[0]) > 10_000
    hosts = sorted(p.name for p in (tmp_path / "events" / "event_rows" / "run_id=1").iterdir())
    assert hosts == sorted(f"host={p.name.removesuffix('.xplane.pb')}" for p in run.glob("*.xplane.pb"))


def test_options_that_cannot_apply_to_a_url_or_a_database_are_refused(tmp_path: Path, kept_db: Path) -> None:
    url = _sample_host_file().parent.as_uri()
    proc = run_cli("report", url, "--xprof")
    assert proc.returncode == 2
    reason = "--xprof reads local files only; give the local path of the traces"
    assert proc.stderr == f"tpuanalyze: error: {url}: {reason}\n"
    proc = run_cli("report", str(kept_db), "--scheduler", "tcp://127.0.0.1:9")
    assert proc.returncode == 2
    assert "--scheduler runs the ingest of traces; the PATH is already a database" in proc.stderr


def test_without_fsspec_a_url_says_how_to_install_it() -> None:
    code = (
        "import sys; sys.modules['fsspec'] = None; sys.modules['fsspec.core'] = None\n"
        "from tpuanalyze.parsers.discover import discover_inputs\n"
        "from tpuanalyze.errors import TpuAnalyzeError\n"
        "try:\n"
        "    discover_inputs(['gs://bucket/logdir'])\n"
        "except TpuAnalyzeError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    expected = "gs://bucket/logdir: reading URLs needs fsspec: pip install 'tpuanalyze[cluster]'"
    assert out.stdout.strip() == expected
