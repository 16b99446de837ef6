"""A run attributed where it is read (the map: store/batch.py, analyzer/batch_map.py, analyzer/mapped.py)
reports what the analysis of its database reports: same JSON on every bundled sample and shared trace,
with one task or a task per host, with the run's flags and dominant program decided over all hosts; the
pieces that replace SQL in the map (the batch's Arrow tables, its flags, its op rows from arrays) equal
what the SQL reads or makes; a report's temporary database stores every event but the device ops'; a
bad host in the map stops the call before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from test_per_host import close_json, dominant_program_run, steps_line_on_one_host_run
from tpuanalyze.analyzer.api import analyze_mapped, analyze_run, report_json
from tpuanalyze.analyzer.config import load_thresholds

from tpuanalyze.pipeline import ingest as ingest_module
from tpuanalyze.pipeline import ingest_paths

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
BUNDLED = [
    *sorted((SAMPLES / "generated").glob("resnet50_*")),
    *sorted(p for p in (SAMPLES / "jax_cpu").iterdir() if p.is_dir()),
    *sorted(p for p in (SAMPLES / "scaling").iterdir() if p.is_dir()),
]
SHARED_INPUTS = ["real/gpu_mi300x_jax08_attention.xplane.pb", "real/gpu_mi300x_jax08_conv.xplane.pb",
                 "real/gpu_mi300x_jax08_elementwise.xplane.pb", "real/gpu_mi300x_jax08_gemm.xplane.pb",
                 "real/gpu_mi300x_jax_conv_rundir", "real/gpu_mi355x_jax_te_fused_attn.xplane.pb",
                 "real/gpu_v100x8_tf_multiworker.xplane.pb", "real/tpu_v6e_4chip_jax_inference.xplane.pb",
                 "jax_cpu/pmap8_input_bound", "jax_cpu/pmap8_train_eval", "jax_cpu/single_jit_train"]


def _mapped(paths: list[Path], db: Path) -> tuple[list[Any], Any]:
    """The runs' analyses attributed in the map (a report's temporary database: no device op events)."""
    summary = ingest_paths(paths, db, workers=1, analyze=load_thresholds(), store_op_events=False)
    con = duckdb.connect(str(db), read_only=True)
    try:
        analyses = [analyze_mapped(con, rid, summary.mapped[rid]) if rid in summary.mapped
                    else analyze_run(con, rid) for rid in summary.run_ids]
    finally:
        con.close()
        summary.close()
    return analyses, summary


def _from_database(paths: list[Path], db: Path) -> list[Any]:
    summary = ingest_paths(paths, db, workers=1)
    con = duckdb.connect(str(db), read_only=True)
    try:
        return [analyze_run(con, rid) for rid in summary.run_ids]
    finally:
        con.close()


def _assert_same(paths: list[Path], tmp_path: Path) -> Any:
    mapped, summary = _mapped(paths, tmp_path / "mapped.duckdb")
    classic = _from_database(paths, tmp_path / "classic.duckdb")
    assert close_json(report_json(mapped), report_json(classic)) == []
    return summary


@pytest.mark.parametrize("path", BUNDLED, ids=[p.name for p in BUNDLED])
def test_bundled_samples_attributed_in_the_map_report_as_their_database(path: Path,
                                                                         tmp_path: Path) -> None:
    summary = _assert_same([path], tmp_path)
    assert summary.mapped, "an XSpace run is attributed in the map"


@pytest.mark.parametrize("name", SHARED_INPUTS)
def test_shared_traces_attributed_in_the_map_report_as_their_database(name: str, shared_traces: Path,
                                                                        tmp_path: Path) -> None:
    summary = _assert_same([shared_traces / name], tmp_path)
    assert summary.mapped


@pytest.mark.parametrize("scenario", ["baseline", "straggler", "input-bound"])
def test_a_task_per_host_reports_as_one_task(scenario: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Several map tasks per run (a generated 4-host pod, a task per host): the batches' relations,
    kinds, op rows and partials combined."""
    from test_report_pipeline import generated_run

    monkeypatch.setattr(ingest_module, "MAP_GROUP_EVENTS", 1)
    run = generated_run(model="resnet50", chips=16, scenario=scenario, steps=4, seed=1)
    summary = _assert_same([run], tmp_path)
    (results,) = summary.mapped.values()
    assert len(results) >= 4  # a batch per host
    kinds = [set(r.kinds.column("kind_id").to_pylist()) for r in results]
    assert all(not a & b for i, a in enumerate(kinds) for b in kinds[i + 1:]), "each batch its own kind ids"


def test_the_dominant_program_is_the_runs_when_a_batch_guessed_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Steps line: host0 alone would step jit_a, the run steps jit_b; host0's batch is attributed
    again with the run's programs, and the report equals the database's."""
    monkeypatch.setattr(ingest_module, "MAP_GROUP_EVENTS", 1)
    summary = _assert_same([dominant_program_run(tmp_path)], tmp_path)
    (results,) = summary.mapped.values()
    assert [r.programs_run_used for r in results] == [True, False]  # host0's batch attributed again
    assert [r.dominant for r in results] == ["jit_a(1)", "jit_b(2)"]  # (each batch's own programs')


def test_flags_that_differ_between_batches_report_from_the_full_database(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Steps line on one host only: the batches' flags differ, so the run is loaded in full and
    attributed from its database (no map results), with the same report."""
    monkeypatch.setattr(ingest_module, "MAP_GROUP_EVENTS", 1)
    summary = _assert_same([steps_line_on_one_host_run(tmp_path)], tmp_path)
    assert not summary.mapped
    con = duckdb.connect(str(tmp_path / "mapped.duckdb"), read_only=True)
    try:
        stored = con.execute("SELECT count(*) FROM event_rows").fetchone()[0]
        total = con.execute("SELECT num_events FROM runs").fetchone()[0]
    finally:
        con.close()
    assert stored == total, "the database the report reads holds every event of the run"


def test_the_temporary_database_stores_every_event_but_the_device_ops(tmp_path: Path) -> None:
    run = SAMPLES / "generated" / "resnet50_v3-32_baseline"
    summary = ingest_paths([run], tmp_path / "m.duckdb", workers=1, analyze=load_thresholds(),
                           store_op_events=False)
    summary.close()
    ingest_paths([run], tmp_path / "c.duckdb", workers=1)
    op_line = ("(plane LIKE '/device:TPU:%' OR plane LIKE '/device:GPU:%') "
               "AND (line IN ('XLA Ops', 'Async XLA Ops') OR line LIKE 'Stream #%')")

    def rows(db: str, where: str) -> list[tuple]:
        con = duckdb.connect(str(tmp_path / db), read_only=True)
        try:
            return con.execute(f"SELECT host, plane_index, line_index, name, start_ps, duration_ps, "
                               f"step_num, group_id, stats FROM events WHERE {where} ORDER BY ALL").fetchall()
        finally:
            con.close()

    assert rows("m.duckdb", "TRUE") == rows("c.duckdb", f"NOT ({op_line})")
    assert rows("m.duckdb", op_line) == [] and rows("c.duckdb", op_line)
    facts = []
    for db in ("m.duckdb", "c.duckdb"):  # the run's own row counts every event either way
        con = duckdb.connect(str(tmp_path / db), read_only=True)
        facts.append(con.execute("SELECT num_events, num_devices, capture_start_ps, capture_end_ps "
                                 "FROM runs").fetchall())
        con.close()
    assert facts[0] == facts[1]


def _batch(paths: list[Path]) -> Any:
    """The hosts of ``paths`` read into a BatchTables (one map task's batch)."""
    from tpuanalyze.parsers.discover import discover_inputs
    from tpuanalyze.store.batch import BatchTables

    from tpuanalyze.pipeline.tasks import HostInput, _add_host, forget_kept, probe_host

    (source,) = discover_inputs(paths).runs
    items = [HostInput(host, str(path), source.source_format) for host, path in source.files]
    t0 = min(p.t0_ns for p in map(probe_host, items) if p.t0_ns is not None)
    forget_kept()
    batch = BatchTables(duckdb.connect(), t0)
    for item in items:
        _add_host(batch, item, False)
    return batch, items, t0


ARRAY_INPUTS = [SAMPLES / "generated" / "resnet50_v3-32_baseline", SAMPLES / "jax_cpu" / "pmap8_train_eval",
                SAMPLES / "scaling" / "gnmt_16"]


@pytest.mark.parametrize("path", ARRAY_INPUTS, ids=[p.name for p in ARRAY_INPUTS])
def test_a_batchs_arrow_tables_are_the_rows_its_parts_store(path: Path, tmp_path: Path) -> None:
    """``BatchTables.arrow`` (numpy to Arrow) gives what the loader's SQL casts write as parts."""
    from tpuanalyze.store.parts import HOST_TABLES

    batch, _, _ = _batch([path])
    hosts = batch.write_parts(tmp_path / "parts", "snappy")
    con = duckdb.connect()
    for table in HOST_TABLES:
        files = hosts[0].files.get(table, [])
        arrow = batch.arrow(table, 7)
        if not files:
            assert arrow.num_rows == 0
            continue
        con.register("a", arrow)
        listed = ", ".join(f"'{f}'" for f in files)
        columns = [c for c in arrow.column_names if c != "run_id"]
        select = ", ".join(f"CAST({c} AS VARCHAR)" if c == "stats" else c for c in columns)
        ours = con.execute(f"SELECT {select} FROM a").fetchall()
        stored = con.execute(f"SELECT {select} FROM read_parquet([{listed}])").fetchall()
        assert ours == stored, table
        assert set(con.execute("SELECT run_id FROM a").fetchall()) <= {(7,)}
        con.unregister("a")


def test_a_batchs_op_lines_are_found_again_when_a_host_is_added(tmp_path: Path) -> None:
    """``op_line_mask`` is kept once found, until the batch reads another host."""
    from tpuanalyze.generator import generate
    from tpuanalyze.store.batch import BatchTables

    from tpuanalyze.pipeline.tasks import _add_host

    generate(model="resnet50", chips=16, steps=2, scenario="baseline", seed=1, out=tmp_path / "logs")
    whole, items, t0 = _batch([tmp_path / "logs"])
    assert len(items) >= 2
    batch = BatchTables(duckdb.connect(), t0)
    _add_host(batch, items[0], False)
    first = batch.op_line_mask()
    for item in items[1:]:
        _add_host(batch, item, False)
    mask = batch.op_line_mask()
    assert len(first) < len(mask) == len(whole.columns("event_rows")["host_code"])
    assert first.any() and np.array_equal(mask, whole.op_line_mask())
    assert np.array_equal(mask[: len(first)], first)


@pytest.mark.parametrize("name", ["generated/resnet50_v3-32_baseline", "jax_cpu/pmap8_input_bound",
                                  "scaling/gnmt_64"])
def test_a_batchs_flags_from_its_arrays_are_att_runs(name: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Also where the batch's ids are too sparse for a dense (host, plane, line) table (forced here: no
    dense table at all): its lines are then found by a sorted search, never an error."""
    from string import Template

    from tpuanalyze.analyzer.attribution import RUN_FLAGS, _substitutions, load_stages, run_flags
    from tpuanalyze.analyzer.batch_engine import batch_flags

    from tpuanalyze import keys

    batch, items, t0 = _batch([SAMPLES / name])
    con = duckdb.connect()
    con.execute("CREATE TABLE runs AS SELECT 3 AS run_id, 'xspace' AS source_format")
    batch.register(con, 3)
    stage = dict(load_stages())["att_runs"]
    subs = _substitutions(load_thresholds(), "run_id = 3", {}, chrome_json=False)
    sql = Template(stage).safe_substitute(subs)
    con.execute(f"CREATE TABLE flags AS {sql}")
    assert batch_flags(batch) == run_flags(con, "flags")
    assert set(batch_flags(batch)) == set(RUN_FLAGS)
    mask = batch.op_line_mask()
    monkeypatch.setattr(keys, "DENSE_LOOKUP_LIMIT", 0)
    assert batch_flags(batch) == run_flags(con, "flags")
    fresh, _, _ = _batch([SAMPLES / name])  # (a batch finds its op lines once: another one, searched)
    assert np.array_equal(fresh.op_line_mask(), mask)


def map_task_rows(items: list, t0: int, tmp_path: Path) -> tuple[list, dict[str, list[str]]]:
    """One map task over ``items``: its op rows (joined to their kinds, sorted) and its relations' rows."""
    import tempfile

    from tpuanalyze.analyzer.op_kinds import KIND_COLUMNS

    from tpuanalyze.pipeline.tasks import LoadTask, MapTask, map_hosts

    task = MapTask(LoadTask(tuple(items), t0, tempfile.mkdtemp(dir=tmp_path), False), load_thresholds(),
                   0, "xspace", store_op_events=False)
    result = map_hosts(task).result
    con = duckdb.connect()
    con.register("k", result.kinds)
    rows = con.execute(f"SELECT o.* EXCLUDE (kind_id), {', '.join('k.' + c for c in KIND_COLUMNS)} "
                       f"FROM read_parquet('{result.op_rows}') o JOIN k USING (kind_id) "
                       "ORDER BY ALL").fetchall()
    return rows, {name: sorted(map(str, t.to_pylist())) for name, t in result.relations.items()}


def test_op_rows_from_arrays_equal_the_sql_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A map task's op rows (and every relation it returns) are the same made from its arrays, from its
    registered tables by SQL-fetched arrays, and all in SQL."""
    _, items, t0 = _batch([SAMPLES / "generated" / "resnet50_v3-32_weight-update-unsharded"])
    seen = {}
    for mode in ("arrays", "fetch", "sql"):
        monkeypatch.setenv("TPUANALYZE_OP_ROWS", mode)
        seen[mode] = map_task_rows(items, t0, tmp_path)
    assert seen["arrays"][0] and seen["arrays"] == seen["fetch"] == seen["sql"]


def test_a_bad_host_in_the_map_stops_the_report_with_nothing_written(tmp_path: Path) -> None:
    """One good host and one truncated: exit 2, one line naming the bad file, no database created."""
    run_dir = tmp_path / "logs" / "plugins" / "profile" / "r1"
    run_dir.mkdir(parents=True)
    good = next((SAMPLES / "generated" / "resnet50_v3-32_baseline").rglob("*.xplane.pb"))
    (run_dir / "host0.xplane.pb").write_bytes(good.read_bytes())
    data = good.read_bytes()
    (run_dir / "host1.xplane.pb").write_bytes(data[: len(data) // 2])
    db = tmp_path / "kept.duckdb"
    proc = subprocess.run([sys.executable, "-m", "tpuanalyze.cli", "report", str(run_dir), "--db",
                           str(db), "--workers", "2", "-q", "--no-progress"], capture_output=True, text=True,
                          env={**os.environ, "TPUANALYZE_DEBUG": ""}, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "host1.xplane.pb" in lines[0] and lines[0].startswith("tpuanalyze: error:")
    assert not db.exists()
    assert not any(p.name.startswith(".tpuanalyze-staging-") for p in tmp_path.iterdir())


def test_two_worker_processes_report_as_one(tmp_path: Path) -> None:
    """The map in two worker processes (several tasks of several hosts) against the calling process."""
    from test_report_pipeline import cli, generated_run

    run = generated_run(model="resnet50", chips=32, hosts=4, steps=3)
    outputs = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}.json"
        proc = cli("report", str(run), "--workers", workers, "--json", str(out), "-q", "--no-progress")
        assert proc.returncode == 0, proc.stderr
        outputs.append(out.read_text())
    import json

    one, two = (json.loads(text) for text in outputs)
    assert close_json(one, two) == []
    assert np.isclose(sum(one["runs"][0]["breakdown"].values()), 1.0)


def test_one_large_host_is_attributed_batch_wise_as_the_whole_run(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of one host larger than a batch takes the per-host path with the batch engine (one batch:
    a 6M-event host took 5.1 GB by the whole-run SQL), and reports what the whole-run SQL reports."""
    from tpuanalyze.analyzer import per_host

    run = SAMPLES / "generated" / "resnet50_v3-32_input-bound"
    db = tmp_path / "one.duckdb"
    ingest_paths([run], db, workers=1)
    con = duckdb.connect(str(db), read_only=True)
    try:
        whole = analyze_run(con, 1)
        calls = []
        original = per_host.materialize_per_host
        monkeypatch.setattr("tpuanalyze.analyzer.api.materialize_per_host",
                            lambda *a, **k: calls.append(len(a[3])) or original(*a, **k))
        monkeypatch.setattr(per_host, "BATCH_EVENTS", 1000)
        batched = analyze_run(con, 1)
    finally:
        con.close()
    assert calls == [1], "one batch, by the per-host path"
    assert close_json(report_json([whole]), report_json([batched])) == []


def test_batches_results_become_one_relation_in_order_whatever_their_arrow_types() -> None:
    """materialize_mapped's concatenation: one statement for batches of one schema, one per batch when a
    column is all NULL in some batch (Arrow's null type): the same rows in batch order either way."""
    import pyarrow as pa
    from tpuanalyze.analyzer.mapped import _concat, _concatenated

    types = [("run_id", "INTEGER"), ("host", "VARCHAR"), ("step_num", "BIGINT")]
    alike = [pa.table({"run_id": [0, 0], "host": ["a", "a"], "step_num": [1, 2]}),
             pa.table({"run_id": [0], "host": ["b"], "step_num": [3]})]
    unlike = [alike[0], pa.table({"run_id": [0], "host": ["c"], "step_num": pa.nulls(1)})]
    assert _concatenated(alike) is not None and _concatenated(unlike) is None
    con = duckdb.connect()
    for batches, expected in ((alike, [(7, "a", 1), (7, "a", 2), (7, "b", 3)]),
                              (unlike, [(7, "a", 1), (7, "a", 2), (7, "c", None)])):
        _concat(con, "t", "t", [(table, types) for table in batches], 7)
        assert con.execute("SELECT * FROM t").fetchall() == expected
