"""The per-host map: the same report with one worker or two (real worker processes), the Parquet
dataset layout giving the same ``events`` relation, and a host that fails in the map (a corrupt
file, a worker process that dies) leaving the database exactly as it was."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import duckdb
import pytest
from conftest import run_cli_process
from test_report_progress import _read_all
from tpuanalyze.generator import generate

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.pipeline import ingest_paths


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated 4-host run (ResNet-50 on 16 chips, 3 steps): small, but one task per host."""
    out = tmp_path_factory.mktemp("pod")
    return generate("resnet50", 16, steps=3, out=out)


def _report(paths: list[Path], workers: int, tmp: Path) -> dict:
    target = tmp / f"report-{workers}.json"
    done = run_cli_process("report", *map(str, paths), "--workers", str(workers), "--json", str(target), "-q")
    assert done.returncode == 0, done.stderr
    return json.loads(target.read_text(encoding="utf-8"))


def test_one_and_two_workers_give_the_same_report_json_on_a_generated_pod(pod: Path, tmp_path: Path) -> None:
    assert len(list(pod.glob("*.xplane.pb"))) == 4
    one = _report([pod], 1, tmp_path)
    two = _report([pod], 2, tmp_path)
    assert one == two
    assert one["runs"][0]["hosts"] == 4
    assert one["runs"][0]["breakdown"]["compute"] > 0


def test_one_and_two_workers_give_the_same_report_json_on_shared_traces(
    shared_traces: Path, tmp_path: Path
) -> None:
    """Several runs in one call: the map spans the hosts of every run."""
    paths = [shared_traces / "jax_cpu"]
    one = _report(paths, 1, tmp_path)
    two = _report(paths, 2, tmp_path)
    assert len(one["runs"]) == 3
    assert one == two


def _relation(db: Path, relation: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        columns = [r[0] for r in con.execute(f"DESCRIBE {relation}").fetchall()]
        select = ", ".join(f"CAST({c} AS VARCHAR)" if c in ("stats", "all_stats") else c for c in columns)
        return sorted(con.execute(f"SELECT {select} FROM {relation}").fetchall(), key=repr)
    finally:
        con.close()


def test_parquet_dataset_gives_the_same_events_relation(pod: Path, tmp_path: Path) -> None:
    plain, layered, dataset = tmp_path / "plain.duckdb", tmp_path / "pq.duckdb", tmp_path / "events"
    ingest_paths([pod], plain, workers=1)
    summary = ingest_paths([pod], layered, workers=2, parquet=dataset)
    assert summary.parquet == str(dataset.resolve())
    events = _relation(plain, "events")
    assert len(events) == summary.events > 0
    assert _relation(layered, "events") == events
    assert _relation(layered, "event_stats") == _relation(plain, "event_stats")
    hosts = sorted(p.name.removesuffix(".xplane.pb") for p in pod.glob("*.xplane.pb"))
    folders = sorted(p.name for p in (dataset / "event_rows" / f"run_id={summary.run_ids[0]}").iterdir())
    assert folders == [f"host={h}" for h in hosts]

    # other tools read the same files: pyarrow sees every event row, hive columns included
    import pyarrow.dataset as ds

    table = ds.dataset(dataset / "event_rows", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == len(events)
    assert {"run_id", "host", "start_ps"} <= set(table.column_names)

    # re-ingesting the same run replaces its partition (same run_id, no stale files)
    again = ingest_paths([pod], layered, workers=1)
    assert again.run_ids == summary.run_ids and again.replaced_run_ids == summary.run_ids
    assert _relation(layered, "events") == events
    assert sorted(p.name for p in dataset.iterdir()) == ["event_details", "event_rows"]

    # the attribution views and `tpuanalyze sql` work on the dataset unchanged
    done = run_cli_process("sql", "--db", str(layered), "SELECT count(*) AS n FROM step_breakdown")
    assert done.returncode == 0, done.stderr
    con = duckdb.connect(str(plain), read_only=True)
    steps = con.execute("SELECT count(*) FROM step_breakdown").fetchall()[0][0]
    con.close()
    assert str(steps) in done.stdout and steps > 0


def test_parquet_refused_on_a_database_that_holds_its_events(pod: Path, tmp_path: Path) -> None:
    db = tmp_path / "db.duckdb"
    ingest_paths([pod], db, workers=1)
    with pytest.raises(TpuAnalyzeError, match="--parquet needs a new database"):
        ingest_paths([pod], db, workers=1, parquet=tmp_path / "events")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _corrupt_copy(pod: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The pod with its third host file truncated mid-message."""
    run = tmp_path / "logdir" / "plugins" / "profile" / pod.name
    shutil.copytree(pod, run)
    victim = sorted(run.glob("*.xplane.pb"))[2]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    return run, victim


@pytest.mark.parametrize("parquet", [False, True], ids=["duckdb", "parquet"])
def test_a_corrupt_host_among_good_ones_leaves_the_database_as_it_was(
    pod: Path, tmp_path: Path, parquet: bool, sample_traces: Path
) -> None:
    db, dataset = tmp_path / "db.duckdb", tmp_path / "events"
    layout = ["--parquet", str(dataset)] if parquet else []
    first = run_cli_process("ingest", str(sample_traces / "generated" / "resnet50_v3-32_baseline"),
                            "--db", str(db), *layout)
    assert first.returncode == 0, first.stderr
    before = _digest(db)
    files_before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    run, victim = _corrupt_copy(pod, tmp_path)
    done = run_cli_process("ingest", str(run), "--db", str(db), "--workers", "2")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tpuanalyze: error: {victim}: "), done.stderr
    assert "Traceback" not in done.stderr
    assert _digest(db) == before
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "logdir" not in p.parts)
    assert after == [f for f in files_before if "logdir" not in f]  # no staging folder left behind


_CRASH_HOST = "TPUANALYZE_TEST_CRASH_HOST"


def _crash_on_host() -> None:
    """Pool initializer: the worker process dies (no exception, no cleanup) loading one host."""
    from tpuanalyze.pipeline import tasks

    real = tasks.GroupParts.add

    def dying(self, reader, *args, **kwargs):
        if reader.host == os.environ[_CRASH_HOST]:
            os._exit(17)
        return real(self, reader, *args, **kwargs)

    tasks.GroupParts.add = dying


def test_a_worker_that_dies_leaves_the_database_as_it_was(
    pod: Path, tmp_path: Path, sample_traces: Path
) -> None:
    db = tmp_path / "db.duckdb"
    ingest_paths([sample_traces / "generated" / "resnet50_v3-32_baseline"], db, workers=1)
    before = _digest(db)
    victim = sorted(pod.glob("*.xplane.pb"))[1]
    os.environ[_CRASH_HOST] = victim.name.removesuffix(".xplane.pb")
    try:
        spawn = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(2, mp_context=spawn, initializer=_crash_on_host)
        with pool, pytest.raises(TpuAnalyzeError) as caught:
            ingest_paths([pod], db, executor=pool)
    finally:
        del os.environ[_CRASH_HOST]
    assert "worker process died" in str(caught.value)
    assert _digest(db) == before
    assert not list(tmp_path.glob(".tpuanalyze-staging-*"))


def test_ingest_progress_shows_hosts_events_per_second_and_eta_on_a_terminal(
    pod: Path, tmp_path: Path
) -> None:
    master, slave = os.openpty()
    env = {**os.environ, "COLUMNS": "160", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuanalyze.cli", "ingest", str(pod), "--db", str(tmp_path / "p.duckdb"),
         "--workers", "2"],
        stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL, env=env, cwd=tmp_path,
    )
    os.close(slave)
    output = _read_all(master, proc, timeout=300).decode("utf-8", "replace")
    os.close(master)
    assert proc.wait(timeout=60) == 0, output
    assert "4/4" in output and "hosts" in output  # hosts done of total
    assert "events/s" in output and "ETA" in output
    assert "\x1b[" in output


def test_hosts_written_in_many_parts_give_the_same_rows(
    pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host's rows gathered across planes are written in parts of a bounded size (the memory of a
    large host): cut into many small parts, the rows, their order included, are the same."""
    from tpuanalyze.store import load

    one_part = tmp_path / "one.duckdb"
    ingest_paths([pod], one_part, workers=1)
    monkeypatch.setattr(load, "FLUSH_EVENTS", 1000)
    monkeypatch.setattr(load, "FLUSH_PLANE_ROWS", 7)
    many_parts = tmp_path / "many.duckdb"
    ingest_paths([pod], many_parts, workers=1)
    for relation in ("events", "planes", "lines", "event_metadata", "event_details"):
        assert _relation(many_parts, relation) == _relation(one_part, relation), relation
    order = "SELECT host, plane_index, event_index FROM event_rows"  # stored order: no ORDER BY
    with duckdb.connect(str(many_parts), read_only=True) as many:
        with duckdb.connect(str(one_part), read_only=True) as one:
            assert many.execute(order).fetchall() == one.execute(order).fetchall()


def test_a_busy_database_at_the_glance_still_gets_its_parts_in_its_dataset(
    pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sample_traces: Path
) -> None:
    """While another process writes the database, the ingest cannot see where it keeps its events
    before the map; the commit then turns the event parts into the dataset's form."""
    from tpuanalyze.pipeline import ingest as pipeline_ingest

    layered, plain, dataset = tmp_path / "pq.duckdb", tmp_path / "plain.duckdb", tmp_path / "events"
    small = sample_traces / "generated" / "resnet50_v3-32_baseline"
    ingest_paths([small], layered, workers=1, parquet=dataset)
    ingest_paths([small, pod], plain, workers=1)
    monkeypatch.setattr(pipeline_ingest, "_dataset_of", lambda db_path, parquet: None)
    summary = ingest_paths([pod], layered, workers=1)
    assert _relation(layered, "events") == _relation(plain, "events")
    assert (dataset / "event_rows" / f"run_id={summary.run_ids[0]}").is_dir()


def test_hosts_written_from_threads_at_once_give_the_same_parts(pod: Path, tmp_path: Path) -> None:
    """A Dask worker runs tasks in threads of one process: each thread writes through its own DuckDB
    connection, so hosts loaded at once give the parts they give one by one."""
    from concurrent.futures import ThreadPoolExecutor

    from tpuanalyze.parsers.xspace import XSpaceReader
    from tpuanalyze.store.parts import GroupParts

    files = sorted(pod.glob("*.xplane.pb"))
    assert len(files) >= 2

    def write(args: tuple[Path, Path]) -> dict[str, list]:
        path, staging = args
        reader = XSpaceReader(path)
        group = GroupParts(reader.host, reader.source_format, reader.t0_ns, staging, False)
        group.add(reader)
        parts = group.finish()[0]
        with duckdb.connect() as con:
            return {table: con.execute(f"SELECT * FROM read_parquet({[str(f) for f in fs]})").fetchall()
                    for table, fs in parts.files.items()}

    one_by_one = [write((f, tmp_path / "serial")) for f in files]
    with ThreadPoolExecutor(max_workers=len(files)) as pool:
        at_once = list(pool.map(write, [(f, tmp_path / f"threads-{i}") for i, f in enumerate(files)]))
    assert at_once == one_by_one


def _worker_memory_state() -> tuple[bool, int]:
    """In a pool worker: whether it keeps freed memory, and the page faults of allocating a freed
    16 MB array again (none when glibc kept it; ~500 huge or ~4,000 small pages when it did not)."""
    import resource

    import numpy as np

    from tpuanalyze.pipeline import executors

    first = np.ones(2 << 20)  # 16 MB, below the worker's mmap threshold
    del first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    again = np.ones(2 << 20)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del again
    return executors.memory_kept, faults


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt: Linux only")
def test_pool_workers_keep_the_memory_their_tasks_free() -> None:
    from tpuanalyze.pipeline.executors import make_executor

    pool = make_executor(2)
    try:
        kept, faults = pool.submit(_worker_memory_state).result()
    finally:
        pool.shutdown()
    assert kept
    assert faults < 50


def _map_in_worker(items: list, t0: int, staging: str) -> dict[str, object]:
    """In a pool worker: a map task, then twice: 64 MB of arrays freed, a map task (in the worker's kept
    DuckDB, then in a DuckDB opened and closed for it as outside a pool), the arrays allocated again.

    Returns the page faults of each allocation again (few when the task handed no memory back to the
    system), the databases attached to the kept DuckDB after, whether the tasks shared it and succeeded."""
    import dataclasses
    import resource

    import numpy as np
    from tpuanalyze.analyzer.config import load_thresholds

    from tpuanalyze.pipeline import executors, tasks

    task = tasks.MapTask(tasks.LoadTask(tuple(items), t0, staging, False), load_thresholds(), 0, "xspace",
                         store_op_events=False)
    first = tasks.map_hosts(task)  # (the imports and the first allocations)
    database = tasks._worker_database
    faults: dict[str, int] = {}
    ok = [first.error is None]
    for mode in ("kept", "opened"):
        executors.pool_worker = mode == "kept"
        freed = [np.ones(2 << 20) for _ in range(4)]  # 16 MB each: below the worker's mmap threshold
        del freed
        ok.append(tasks.map_hosts(dataclasses.replace(task, index=len(ok))).error is None)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        again = [np.ones(2 << 20) for _ in range(4)]
        faults[mode] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        del again
    executors.pool_worker = True
    assert tasks._worker_database is not None
    attached = [row[0] for row in tasks._worker_database.execute(
        "SELECT database_name FROM duckdb_databases() WHERE NOT internal ORDER BY 1").fetchall()]
    shared = tasks._worker_database is database
    return {"faults": faults, "attached": attached, "shared": shared, "ok": all(ok)}


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc_trim: Linux only")
def test_a_pool_workers_map_tasks_share_one_duckdb_and_keep_the_memory_they_free(tmp_path: Path) -> None:
    """A pool worker's map tasks run in databases attached to one DuckDB it keeps (detached after each):
    opening or closing a DuckDB, or setting its threads or memory limit, calls ``malloc_trim(0)``, which
    hands the memory freed before back to the system for the next task to fault in again."""
    from tpuanalyze.parsers.discover import discover_inputs

    from tpuanalyze.pipeline.executors import make_executor
    from tpuanalyze.pipeline.tasks import HostInput, forget_kept, probe_host

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "generated" / "resnet50_v3-32_baseline"
    (source,) = discover_inputs([sample]).runs
    items = [HostInput(host, str(path), source.source_format) for host, path in source.files]
    t0 = min(p.t0_ns for p in map(probe_host, items) if p.t0_ns is not None)
    forget_kept()
    pool = make_executor(2)
    try:
        got = pool.submit(_map_in_worker, items, t0, str(tmp_path)).result()
    finally:
        pool.shutdown()
    assert got["ok"] and got["shared"]
    assert got["attached"] == ["memory"]  # each task's database detached
    faults = got["faults"]
    # 64 MB: ~16,000 small pages (or ~32 huge ones and the rest small) when all of it was handed back
    assert faults["opened"] > 1000, faults  # (the trim happens here: else the check below says nothing)
    assert faults["kept"] < faults["opened"] / 4, faults
