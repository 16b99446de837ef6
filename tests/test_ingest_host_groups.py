"""Several small hosts of a run loaded by one task into one set of Parquet parts.

A pod's host files are small (a pod host: ~37K events), so a load task takes consecutive hosts
of a run (``pipeline.ingest.GROUP_EVENTS``) and writes one set of parts for them. What must hold:
every host's rows exactly as a task per host stores them (order included), the Parquet dataset
still one folder per host, a host that fails inside a group named alone with the database
unchanged, and the grouping consecutive, bounded and balanced over the workers.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pytest
from conftest import run_cli_process
from tpuanalyze.generator import generate
from tpuanalyze.store import load

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.pipeline import ingest as pipeline_ingest
from tpuanalyze.pipeline import ingest_paths
from tpuanalyze.pipeline.ingest import _group_cap, _load_groups
from tpuanalyze.pipeline.tasks import HostInput, LoadTask, Probe, load_host, probe_host

TABLES = ("planes", "lines", "event_metadata", "event_rows", "event_details", "hosts")


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated 8-host run (ResNet-50 on 32 chips, 3 steps)."""
    return generate("resnet50", 32, steps=3, out=tmp_path_factory.mktemp("pod"))


def _stored(db: Path) -> dict[str, list[tuple]]:
    """Every table's rows in stored order (rowid), the runs row without its ingest time."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for table in TABLES:
            columns = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
            select = ", ".join(f"CAST({c} AS VARCHAR)" for c in columns)
            out[table] = con.execute(f"SELECT {select} FROM {table} ORDER BY rowid").fetchall()
        out["runs"] = con.execute(
            "SELECT * EXCLUDE (ingested_at, metadata), CAST(metadata AS VARCHAR) FROM runs ORDER BY run_id"
        ).fetchall()
        return out
    finally:
        con.close()


def _one_host_per_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_ingest, "GROUP_EVENTS", 0)
    monkeypatch.setattr(pipeline_ingest, "_group_cap", lambda probes, workers: 0)


def test_hosts_loaded_together_store_the_rows_of_a_task_per_host(
    pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grouped = tmp_path / "grouped.duckdb"
    tasks: list[LoadTask] = []
    real_load = pipeline_ingest.load_host

    def counting(task: LoadTask):
        tasks.append(task)
        return real_load(task)

    monkeypatch.setattr(pipeline_ingest, "load_host", counting)
    monkeypatch.setenv("TPUANALYZE_DIRECT_LOAD", "0")  # parts, as a pool's workers write them
    summary = ingest_paths([pod], grouped, workers=1)
    assert summary.hosts == 8 and len(tasks) == 1 and len(tasks[0].inputs) == 8  # one task, all hosts
    with monkeypatch.context() as alone:
        _one_host_per_task(alone)
        tasks.clear()
        ingest_paths([pod], tmp_path / "alone.duckdb", workers=1)
        assert len(tasks) == 8
    assert _stored(grouped) == _stored(tmp_path / "alone.duckdb")
    # parts cut inside hosts and across host boundaries: the same rows, in the same order
    monkeypatch.setattr(load, "FLUSH_EVENTS", 5_000)
    monkeypatch.setattr(load, "FLUSH_PLANE_ROWS", 11)
    ingest_paths([pod], tmp_path / "cut.duckdb", workers=1)
    assert _stored(tmp_path / "cut.duckdb") == _stored(grouped)
    # loaded straight into the database (no parts): the same rows, in the same order
    monkeypatch.setenv("TPUANALYZE_DIRECT_LOAD", "1")
    tasks.clear()
    direct = ingest_paths([pod], tmp_path / "direct.duckdb", workers=1)
    assert not tasks and direct.events == summary.events
    assert _stored(tmp_path / "direct.duckdb") == _stored(grouped)
    # the events streamed to one statement (store/streamed.py), in batches cut inside and across
    # hosts, paused whenever another table's rows are written: the same rows, in the same order
    streams = _count_streams(monkeypatch)
    monkeypatch.setattr(load, "STREAM_BATCH_ROWS", 3_000)
    ingest_paths([pod], tmp_path / "streamed.duckdb", workers=1)
    assert len(streams) > 2 and sum(streams) == summary.events
    assert _stored(tmp_path / "streamed.duckdb") == _stored(grouped)


def _count_streams(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each streamed events statement of the direct loads from now on."""
    from tpuanalyze.store import streamed

    counts: list[int] = []
    real_init, real_put = streamed.StreamedInsert.__init__, streamed.StreamedInsert.put

    def init(self, *args, **kwargs):
        counts.append(0)
        real_init(self, *args, **kwargs)

    def put(self, batch):
        counts[-1] += batch.num_rows
        real_put(self, batch)

    monkeypatch.setattr(streamed.StreamedInsert, "__init__", init)
    monkeypatch.setattr(streamed.StreamedInsert, "put", put)
    return counts


def test_two_workers_group_hosts_and_store_the_same_rows(pod: Path, tmp_path: Path) -> None:
    ingest_paths([pod], tmp_path / "one.duckdb", workers=1)
    ingest_paths([pod], tmp_path / "two.duckdb", workers=2)
    assert _stored(tmp_path / "two.duckdb") == _stored(tmp_path / "one.duckdb")


def test_a_dataset_keeps_one_folder_per_host_when_hosts_are_loaded_together(
    pod: Path, tmp_path: Path
) -> None:
    dataset = tmp_path / "events"
    summary = ingest_paths([pod], tmp_path / "pq.duckdb", workers=1, parquet=dataset)
    hosts = sorted(p.name.removesuffix(".xplane.pb") for p in pod.glob("*.xplane.pb"))
    for table in ("event_rows", "event_details"):
        run = dataset / table / f"run_id={summary.run_ids[0]}"
        assert sorted(p.name for p in run.iterdir()) == [f"host={h}" for h in hosts], table
        for folder in run.iterdir():  # each host's folder holds that host's rows only, without `host`
            host = folder.name.removeprefix("host=")
            con = duckdb.connect()
            try:
                files = f"read_parquet('{folder}/*.parquet', hive_partitioning = false)"
                described = con.execute(f"DESCRIBE SELECT * FROM {files}").fetchall()
                columns = [r[0] for r in described]
                assert "host" not in columns and "group" not in columns
            finally:
                con.close()
            assert host in hosts
    ingest_paths([pod], tmp_path / "plain.duckdb", workers=1)
    con = duckdb.connect(str(tmp_path / "pq.duckdb"), read_only=True)
    plain = duckdb.connect(str(tmp_path / "plain.duckdb"), read_only=True)
    try:
        for table in ("event_rows", "event_details"):
            query = f"SELECT * REPLACE (CAST(stats AS VARCHAR) AS stats) FROM {table} ORDER BY ALL"
            if table == "event_rows":
                query = "SELECT * FROM event_rows ORDER BY ALL"
            rows = plain.execute(query).fetchall()
            assert con.execute(query).fetchall() == rows and rows, table
    finally:
        con.close()
        plain.close()


def _digest(db: Path) -> str:
    return hashlib.sha256(db.read_bytes()).hexdigest()


@pytest.mark.parametrize("mode", ["parts", "direct", "streamed"])
def test_a_host_that_fails_inside_a_group_is_named_and_the_database_is_unchanged(
    pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sample_traces: Path, mode: str
) -> None:
    """The file in the middle of a group changes between the two rounds (validated, then cut short):
    the load's error names that file, nothing is stored, no staging folder is left. Loaded straight
    into the database, the rows of the hosts before it are rolled back; a database the call would
    have created is not left behind. ``streamed``: the events' statement is running (its helper
    thread reading the stream) when the file fails; it is ended, and the rollback goes through."""
    import shutil

    direct = mode != "parts"
    monkeypatch.setenv("TPUANALYZE_DIRECT_LOAD", "1" if direct else "0")
    streams = _count_streams(monkeypatch)
    if mode == "streamed":
        monkeypatch.setattr(load, "FLUSH_EVENTS", 5_000)
        monkeypatch.setattr(load, "STREAM_BATCH_ROWS", 3_000)
    db = tmp_path / "db.duckdb"
    ingest_paths([sample_traces / "generated" / "resnet50_v3-32_baseline"], db, workers=1)
    before = _digest(db)
    run = tmp_path / "logdir" / "plugins" / "profile" / "run1"
    shutil.copytree(pod, run)
    victim = sorted(run.glob("*.xplane.pb"))[4]
    whole = victim.read_bytes()
    patched = "load_direct" if direct else "_load_all"
    real = getattr(pipeline_ingest, patched)

    def truncate_then_load(*args, **kwargs):
        from tpuanalyze.pipeline import tasks

        tasks.forget_kept()  # the load reads the files again, as a pool's workers do
        victim.write_bytes(whole[:1000])
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline_ingest, patched, truncate_then_load)
    for target in (db, tmp_path / "new.duckdb"):
        victim.write_bytes(whole)
        with pytest.raises(TpuAnalyzeError) as caught:
            ingest_paths([run.parent.parent.parent], target, workers=1)
        assert caught.value.path in (str(victim.resolve()), str(victim))
        assert "truncated" in caught.value.reason
    assert _digest(db) == before
    assert not (tmp_path / "new.duckdb").exists() and not (tmp_path / "new.duckdb.wal").exists()
    assert not list(tmp_path.glob(".tpuanalyze-staging-*"))
    assert bool(streams) == (mode == "streamed")  # (the 8 small hosts stream only when told to)


def test_a_load_task_stops_at_its_first_bad_host_and_removes_its_parts(pod: Path, tmp_path: Path) -> None:
    files = sorted(pod.glob("*.xplane.pb"))
    bad = tmp_path / "bad.xplane.pb"
    bad.write_bytes(files[0].read_bytes()[:500])
    inputs = tuple(HostInput(p.name.removesuffix(".xplane.pb"), str(p), "xspace") for p in files[:2])
    inputs += (HostInput("bad", str(bad), "xspace"),)
    inputs += tuple(HostInput(p.name.removesuffix(".xplane.pb"), str(p), "xspace") for p in files[2:4])
    staging = tmp_path / "staging"
    loaded = load_host(LoadTask(inputs, None, str(staging), False))
    assert loaded.parts is None and loaded.error is not None
    assert loaded.error.path in (str(bad), str(bad.resolve()))
    assert not [p for p in staging.rglob("*") if p.is_file()]  # the good hosts' parts are gone too


def test_the_cli_reports_a_bad_host_among_grouped_ones_in_one_line(pod: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(pod, run)
    victim = sorted(run.glob("*.xplane.pb"))[5]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 3])
    db = tmp_path / "db.duckdb"
    done = run_cli_process("ingest", str(run), "--db", str(db), "--workers", "1")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tpuanalyze: error: {victim}: "), done.stderr
    assert not db.exists() or not duckdb.connect(str(db), read_only=True).execute(
        "SELECT count(*) FROM runs").fetchone()[0]


def _probes(events: list[int]) -> list[Probe]:
    return [Probe(t0_ns=0, num_events=n) for n in events]


def _inputs(formats: list[str]) -> list[HostInput]:
    return [HostInput(f"h{i}", f"/x/h{i}", fmt) for i, fmt in enumerate(formats)]


def test_groups_are_consecutive_hosts_up_to_the_cap_and_json_hosts_go_alone() -> None:
    events = [300, 300, 300, 900, 100, 100, 2000, 50]
    formats = ["xspace"] * 5 + ["chrome_json", "xspace", "xspace"]
    groups = _load_groups(_probes(events), _inputs(formats), cap=1000)
    assert [i for g in groups for i in g] == list(range(len(events)))  # every host once, in order
    assert groups == [[0, 1, 2], [3, 4], [5], [6], [7]]
    assert all(sum(events[i] for i in g) <= 1000 for g in groups if len(g) > 1)
    assert _load_groups(_probes(events), _inputs(formats), cap=0) == [[i] for i in range(len(events))]


def test_the_cap_leaves_every_worker_several_tasks() -> None:
    pod64 = [_probes([36_868] * 64)]
    assert _group_cap(pod64, 1) == pipeline_ingest.GROUP_EVENTS
    cap = _group_cap(pod64, 2)
    groups = _load_groups(pod64[0], _inputs(["xspace"] * 64), cap)
    assert len(groups) >= pipeline_ingest.TASKS_PER_WORKER * 2
    pod512 = [_probes([36_868] * 512)]
    assert _group_cap(pod512, 2) == pipeline_ingest.GROUP_EVENTS  # 28 hosts a task, 19 tasks
    assert _group_cap(pod64, 0) == 0  # a caller's executor (a cluster): a task per host


def test_probe_and_load_of_one_host_still_work_alone(pod: Path, tmp_path: Path) -> None:
    path = sorted(pod.glob("*.xplane.pb"))[0]
    item = HostInput(path.name.removesuffix(".xplane.pb"), str(path), "xspace")
    probe = probe_host(item)
    loaded = load_host(LoadTask((item,), probe.t0_ns, str(tmp_path / "s"), False))
    assert loaded.error is None and loaded.parts is not None and len(loaded.parts) == 1
    assert loaded.parts[0].events == probe.num_events > 0
    assert loaded.parts[0].group == [item.host]
