"""``tpuanalyze ingest`` loads MLPerf result logs beside traces (one call, one transaction), and every
ingested database carries the attribution views the findings' evidence SQL queries; ``tpuanalyze sql``
creates them as TEMP views on a database that lacks them. CLI run in-process (``tpuanalyze.cli.main``)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import duckdb
import pytest
from conftest import SAMPLE_TRACES
from conftest import run_cli as cli
from tpuanalyze.analyzer.api import analyze_db
from tpuanalyze.analyzer.attribution import STAGE_NAMES
from tpuanalyze.parsers.discover import discover_inputs

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.pipeline import ingest_paths

JAX_TRAIN = SAMPLE_TRACES / "jax_cpu" / "single_jit_train"
INPUT_BOUND = SAMPLE_TRACES / "generated" / "resnet50_v3-32_input-bound"
RESNET_V07 = Path("v0.7") / "tpu-v3-32-TF2.0" / "resnet"


def query(db: Path, sql: str, *params) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def persistent_views(db: Path) -> set[str]:
    rows = query(db, "SELECT view_name FROM duckdb_views() WHERE NOT temporary AND NOT internal")
    return {r[0] for r in rows}


def sql_json(db: Path, text: str) -> list[dict]:
    code, out, err = cli("sql", "--db", str(db), "--format", "json", text)
    assert code == 0, err
    return json.loads(out)


def test_ingest_mlperf_only_folder(tmp_path: Path, shared_mlperf: Path) -> None:
    root = shared_mlperf / "v0.7"
    result_files = sorted(root.rglob("result_*.txt"))
    folders = {f.parent.resolve() for f in result_files}
    db = tmp_path / "mlperf.duckdb"
    code, out, err = cli("ingest", str(root), "--db", str(db))
    assert code == 0, err
    assert f"{len(folders)} MLPerf result folder(s): {len(result_files)} result file(s)" in out
    runs = query(db, "SELECT source_format, source_path, num_hosts FROM runs")
    assert {r[0] for r in runs} == {"mlperf"}
    assert {Path(r[1]) for r in runs} == folders
    assert all(r[2] == 0 for r in runs)
    # both spellings of the logs' platform ('tpu-v3-8192', 'TPUv3-8192') read as the trace planes' 'TPU v3'
    assert query(db, "SELECT DISTINCT device_type FROM runs") == [("TPU v3",)]
    assert query(db, "SELECT count(*) FROM mlperf_results") == [(len(result_files),)]
    assert query(db, "SELECT count(DISTINCT run_id) FROM mlperf_intervals") == [(len(folders),)]
    # the views exist on an MLPerf-only database too (empty: nothing was traced)
    assert set(STAGE_NAMES) <= persistent_views(db)
    assert sql_json(db, "SELECT count(*) AS n FROM step_breakdown") == [{"n": 0}]

    # time to train read back from the database = the one computed from the files
    from_db, from_files = tmp_path / "db.json", tmp_path / "files.json"
    assert cli("mlperf", "--db", str(db), "--json", str(from_db))[0] == 0
    assert cli("mlperf", str(shared_mlperf / RESNET_V07), "--json", str(from_files))[0] == 0
    want = json.loads(from_files.read_text())["mlperf"][0]
    got = {r["submitter_path"]: r for r in json.loads(from_db.read_text())["mlperf"]}
    assert got[want["submitter_path"]]["time_to_train_s"] == pytest.approx(want["time_to_train_s"], rel=1e-12)
    assert got[want["submitter_path"]]["runs"] == want["runs"]

    # re-ingest replaces the folders (same run ids, no duplicate rows)
    ids = sorted(r[0] for r in query(db, "SELECT run_id FROM runs"))
    code, out, err = cli("ingest", str(root), "--db", str(db))
    assert code == 0, err
    assert "replaced run(s)" in out
    assert sorted(r[0] for r in query(db, "SELECT run_id FROM runs")) == ids
    assert query(db, "SELECT count(*) FROM mlperf_results") == [(len(result_files),)]


def test_mixed_call_loads_traces_and_mlperf(tmp_path: Path, shared_mlperf: Path) -> None:
    folder = shared_mlperf / RESNET_V07
    db = tmp_path / "mixed.duckdb"
    code, out, err = cli("ingest", str(JAX_TRAIN), str(folder), "--db", str(db))
    assert code == 0, err
    assert "ingested 2 run(s) (1 MLPerf result folder(s)" in out
    formats = dict(query(db, "SELECT source_format, count(*) FROM runs GROUP BY ALL"))
    assert formats == {"xspace": 1, "mlperf": 1}
    files = len(list(folder.glob("result_*.txt")))
    assert query(db, "SELECT count(*) FROM mlperf_results") == [(files,)]
    assert query(db, "SELECT count(*) > 0 FROM events") == [(True,)]
    assert query(db, "SELECT count(DISTINCT run_id) FROM runs") == [(2,)]


def test_one_folder_holding_both_kinds(tmp_path: Path, shared_mlperf: Path) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(JAX_TRAIN, mixed / "capture")
    shutil.copytree(shared_mlperf / RESNET_V07, mixed / "mlperf" / "resnet")
    (mixed / "notes.txt").write_text("plain notes, no MLPerf lines\n")  # sniffed and skipped
    (mixed / "README.md").write_text(":::MLLOG {}\n")  # not a sniffed name: never read as MLPerf
    found = discover_inputs([mixed])
    assert len(found.runs) == 1
    assert {p.name for p in found.mlperf_files} == {p.name for p in (mixed / "mlperf" / "resnet").iterdir()}
    summary = ingest_paths([mixed], tmp_path / "one.duckdb")
    assert summary.runs == 2 and summary.mlperf_runs == 1 and summary.hosts == 1
    assert summary.mlperf_results == len(found.mlperf_files) and summary.events > 0


def test_bad_mlperf_file_in_the_mix_changes_nothing(tmp_path: Path, shared_mlperf: Path) -> None:
    db = tmp_path / "kept.duckdb"
    assert cli("ingest", str(INPUT_BOUND), "--db", str(db))[0] == 0
    before = digest(db)
    bad = tmp_path / "bad" / "result_0.txt"
    bad.parent.mkdir()
    bad.write_text(':::MLLOG {"namespace": "", "time_ms": 1, "key": "run_start", "value": null\n')
    code, out, err = cli("ingest", str(JAX_TRAIN), str(shared_mlperf / RESNET_V07), str(bad.parent),
                         "--db", str(db))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and str(bad) in err and "MLPerf" in err
    assert digest(db) == before
    assert query(db, "SELECT count(*) FROM runs") == [(1,)]


def test_evidence_sql_runs_on_an_ingested_database(tmp_path: Path) -> None:
    db = tmp_path / "input.duckdb"
    code, _, err = cli("ingest", str(INPUT_BOUND), "--db", str(db))
    assert code == 0, err
    assert set(STAGE_NAMES) <= persistent_views(db)
    steps = sql_json(db, "SELECT count(*) AS n FROM step_breakdown")[0]["n"]
    (analysis,) = analyze_db(db)
    assert steps == len(analysis.steps) > 0
    finding = next(f for f in analysis.findings if f["rule"] == "input-bound")
    rows = sql_json(db, finding["evidence"]["sql"])
    assert rows, finding["evidence"]["sql"]
    fraction = rows[0]["input_fraction_of_step"]
    assert fraction == pytest.approx(finding["evidence"]["metrics"]["input_fraction_of_step"], abs=1e-3)


def test_sql_creates_temp_views_when_the_database_lacks_them(tmp_path: Path) -> None:
    db = tmp_path / "noviews.duckdb"
    ingest_paths([INPUT_BOUND], db)
    want = query(db, "SELECT count(*), sum(input_ps) FROM step_breakdown")[0]
    con = duckdb.connect(str(db))
    for name in reversed(STAGE_NAMES):
        con.execute(f"DROP VIEW {name}")
    con.close()
    assert not set(STAGE_NAMES) & persistent_views(db)
    got = sql_json(db, "SELECT count(*) AS n, sum(input_ps) AS input_ps FROM step_breakdown")[0]
    assert (got["n"], got["input_ps"]) == (want[0], want[1])
    assert not set(STAGE_NAMES) & persistent_views(db)  # read-only: the file is not changed
    foreign = tmp_path / "foreign.duckdb"
    duckdb.connect(str(foreign)).close()
    code, out, err = cli("sql", "--db", str(foreign), "SELECT * FROM step_breakdown")
    assert code == 2 and err.count("\n") == 1 and "attribution views" in err


def test_mlperf_write_failure_rolls_back_the_traces_too(tmp_path: Path, shared_mlperf: Path) -> None:
    """Trace runs and MLPerf folders share one transaction: an MLPerf row refused by the database (a
    CHECK constraint planted on ``mlperf_intervals``) undoes the trace run loaded before it."""
    db = tmp_path / "strict.duckdb"
    ingest_paths([INPUT_BOUND], db)
    con = duckdb.connect(str(db))
    con.execute("DROP TABLE mlperf_intervals")
    con.execute(
        "CREATE TABLE mlperf_intervals (run_id INTEGER NOT NULL, result_file VARCHAR NOT NULL, "
        "kind VARCHAR NOT NULL CHECK (kind <> 'eval'), start_ms DOUBLE, stop_ms DOUBLE, epoch DOUBLE, "
        "epoch_count DOUBLE, value DOUBLE)"
    )
    con.close()
    before = query(db, "SELECT run_id, source_path FROM runs ORDER BY run_id")
    with pytest.raises(TpuAnalyzeError, match="database unchanged"):
        ingest_paths([JAX_TRAIN, shared_mlperf / RESNET_V07], db)
    assert query(db, "SELECT run_id, source_path FROM runs ORDER BY run_id") == before
    assert query(db, "SELECT count(*) FROM mlperf_results") == [(0,)]

    # and without the planted constraint the same call loads both kinds
    con = duckdb.connect(str(db))
    con.execute("DROP TABLE mlperf_intervals")
    con.close()
    summary = ingest_paths([JAX_TRAIN, shared_mlperf / RESNET_V07], db)
    assert summary.runs == 2 and summary.mlperf_runs == 1 and summary.events > 0
    formats = dict(query(db, "SELECT source_format, count(*) FROM runs GROUP BY ALL"))
    assert formats == {"xspace": 2, "mlperf": 1}
