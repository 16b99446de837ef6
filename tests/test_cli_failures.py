"""Inputs that used to end in an unexpected exception (exit 70 since the CLI reports bugs on one line;
a crash hunt over every verb found them): each is the input's error now, one line naming the input, exit
2, or (an HTML page of steps without numbers) no error at all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from conftest import SAMPLE_TRACES, run_cli

MLPERF = SAMPLE_TRACES / "mlperf"
BASELINE = SAMPLE_TRACES / "generated" / "resnet50_v3-32_baseline"


def _one_error(result, where: str, reason: str) -> None:  # noqa: ANN001 - conftest.CliResult
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("tpuanalyze: ")]
    prefix = f"tpuanalyze: error: {where}: {reason}" if where else "tpuanalyze: error: "
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("query", ["", "  ", ";", "/* only a comment */"])
def test_sql_without_a_statement(tmp_path: Path, query: str) -> None:
    db = tmp_path / "x.duckdb"
    run = SAMPLE_TRACES / "jax_cpu" / "single_jit_train"
    assert run_cli("ingest", str(run), "--db", str(db)).returncode == 0
    _one_error(run_cli("sql", "--db", str(db), query), "sql", "empty query")


def test_compare_and_scaling_refuse_a_duckdb_file_that_is_not_ours(tmp_path: Path) -> None:
    empty, foreign = tmp_path / "empty.duckdb", tmp_path / "foreign.duckdb"
    duckdb.connect(str(empty)).close()
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE runs (x INTEGER)")
    con.close()
    for db in (empty, foreign):
        reason = "not a tpuanalyze database (no runs table)"
        _one_error(run_cli("compare", "--db", str(db), "1", "2"), str(db), reason)
        _one_error(run_cli("compare", f"{db}:1", f"{db}:2"), str(db), reason)
        _one_error(run_cli("scaling", "--db", str(db)), str(db), reason)


def test_output_paths_are_checked_before_the_work(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "out.json"
    for args in (("scaling", str(SAMPLE_TRACES / "scaling"), "--json"),
                 ("scaling", str(SAMPLE_TRACES / "scaling"), "--html"),
                 ("mlperf", str(MLPERF), "--json"),
                 ("compare", str(BASELINE), str(BASELINE), "--json")):
        _one_error(run_cli(*args, str(missing)), str(missing), "cannot write here: no such directory")
        _one_error(run_cli(*args, str(tmp_path)), str(tmp_path), "cannot write here: a directory")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = run_cli("generate", "--model", "bert", "--chips", "4", "--out", str(blocker / "run"))
    assert result.returncode == 2 and "cannot write the generated run" in result.stderr, result.stderr
    assert "internal error" not in result.stderr


def test_mlperf_runs_a_year_apart_and_a_record_without_time(tmp_path: Path) -> None:
    """Result files of runs months apart in one folder span more picoseconds than BIGINT holds: the
    run is stored (its capture end unknown); a :::MLLOG record without time_ms is a format error, not
    a run started in 1970."""
    apart = tmp_path / "apart" / "resnet"
    apart.mkdir(parents=True)
    shutil.copy(MLPERF / "v0.6" / "tpu-v3-32" / "resnet" / "result_0.txt", apart / "result_0.txt")
    shutil.copy(MLPERF / "v0.7" / "tpu-v3-32-TF2.0" / "resnet" / "result_1.txt", apart / "result_1.txt")
    db = tmp_path / "m.duckdb"
    assert run_cli("ingest", str(apart.parent), "--db", str(db)).returncode == 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        (end,) = con.execute("SELECT capture_end_ps FROM runs").fetchone()
    finally:
        con.close()
    assert end is None
    notime = tmp_path / "notime" / "resnet"
    notime.mkdir(parents=True)
    lines = (MLPERF / "v0.7" / "tpu-v3-32-TF2.0" / "resnet" / "result_0.txt").read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if '"key": "run_start"' in ln)
    record = json.loads(lines[at].split(":::MLLOG ", 1)[1])
    del record["time_ms"]
    lines[at] = ":::MLLOG " + json.dumps(record)
    (notime / "result_0.txt").write_text("\n".join(lines) + "\n")
    result = run_cli("ingest", str(notime.parent), "--db", str(tmp_path / "n.duckdb"))
    _one_error(result, str(notime / "result_0.txt"), f"line {at + 1}: bad MLPerf log line (MLLOG record "
                                                     f"without time_ms)")


def test_parquet_dataset_gone_is_the_databases_error(tmp_path: Path) -> None:
    db, dataset = tmp_path / "p.duckdb", tmp_path / "pq"
    run = SAMPLE_TRACES / "jax_cpu" / "single_jit_train"
    assert run_cli("ingest", str(run), "--db", str(db), "--parquet", str(dataset)).returncode == 0
    shutil.rmtree(dataset / "event_rows")
    _one_error(run_cli("report", str(db), "-q"), str(db), "cannot read the run's events")


def test_html_of_steps_without_numbers(tmp_path: Path) -> None:
    """Kineto ProfilerStep numbers too large for BIGINT: every step_num is NULL; the step heatmap has
    no cell and is left out instead of a NaN colour domain failing the page."""
    events = [{"ph": "X", "pid": 1, "tid": 1, "ts": 1000.0 * i, "dur": 900.0, "cat": "user_annotation",
               "name": f"ProfilerStep#{10**30 + i}"} for i in range(3)]
    events.append({"ph": "X", "pid": 0, "tid": 7, "ts": 100.0, "dur": 50.0, "cat": "kernel", "name": "k",
                   "args": {"device": 0, "stream": 7}})
    trace = tmp_path / "bigsteps.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    html = tmp_path / "r.html"
    result = run_cli("report", str(trace), "-q", "--html", str(html))
    assert result.returncode == 0, result.stderr
    assert html.stat().st_size > 10_000


@pytest.mark.parametrize("query", ["COPY runs TO '{out}'", "EXPORT DATABASE '{dir}'",
                                   "SELECT 1; COPY (SELECT 1) TO '{out}'", "ATTACH '{dir}/other.duckdb'",
                                   "INSTALL httpfs"])
def test_sql_only_reads(tmp_path: Path, query: str) -> None:
    """The database is opened read-only, but DuckDB would still write a file for COPY ... TO or EXPORT
    (and ATTACH, INSTALL reach beyond it): refused before anything runs, nothing written."""
    db = tmp_path / "x.duckdb"
    run = SAMPLE_TRACES / "jax_cpu" / "single_jit_train"
    assert run_cli("ingest", str(run), "--db", str(db)).returncode == 0
    out, folder = tmp_path / "out.csv", tmp_path / "export"
    folder.mkdir()
    result = run_cli("sql", "--db", str(db), query.format(out=out, dir=folder))
    _one_error(result, "sql", "")
    assert "would write files or load extensions" in result.stderr
    assert not out.exists() and not any(folder.iterdir())
    assert run_cli("sql", "--db", str(db), "SELECT count(*) FROM runs").returncode == 0


def test_scaling_chips_override_must_name_a_run() -> None:
    """`--chips RUN=N` with a name no run has is refused (a typo used to leave the trace's count)."""
    result = run_cli("scaling", str(SAMPLE_TRACES / "scaling"), "--chips", "gnmt_61=64")
    _one_error(result, "", "")  # no path: the option is wrong, not a file
    assert "--chips gnmt_61=N names no run given" in result.stderr


def test_chrome_json_time_past_a_nanosecond_clock(tmp_path: Path) -> None:
    """A ts of 2**70 us passes the 7-day window when it is the file's only event, but its t0 in ns does
    not fit BIGINT: the file's own error (it used to fail at the database load, naming the database)."""
    trace = tmp_path / "far.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1,
                                                  "ts": 2**70, "dur": 1}]}))
    _one_error(run_cli("report", str(trace), "-q"), str(trace), "traceEvents[0]")
    assert "beyond what a nanosecond clock holds" in run_cli("ingest", str(trace), "--db",
                                                            str(tmp_path / "x.duckdb")).stderr
