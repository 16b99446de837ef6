"""MLPerf result logs: parsing both formats, the olympic time to train against the papers' table,
database ingest (all-or-nothing, re-ingest replaces) and the ``tpuanalyze mlperf`` command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest
from conftest import run_cli
from tpuanalyze.analyzer.mlperf_summary import olympic_score, summarize_db
from tpuanalyze.parsers.mlperf import load_mlperf, parse_line
from tpuanalyze.store.mlperf import ingest_mlperf, ingest_mlperf_into

from tpuanalyze.errors import TraceFormatError
from tpuanalyze.pipeline.mlperf import summarize_paths

# catalog §1: the v0.7 headline table (seconds) and the v0.6 scaling table, as (folder, seconds).
V07_HEADLINE = {
    "v0.7/tpu-v3-8192-TF/resnet": 28.88, "v0.7/tpu-v3-8192-JAX/resnet": 28.30,
    "v0.7/tpu-v3-8192-TF/bert": 23.57, "v0.7/tpu-v3-8192-JAX/bert": 24.01,
    "v0.7/tpu-v3-8192-TF/transformer": 21.27, "v0.7/tpu-v3-8192-JAX/transformer": 15.46,
    "v0.7/tpu-v3-8192-TF/ssd": 27.73, "v0.7/tpu-v3-4096-JAX/ssd": 32.81,
    "v0.7/tpu-v3-1024-TF/maskrcnn": 487.75, "v0.7/tpu-v3-1024-TF/gnmt": 126.07,
}
V06_BY_CHIPS = {  # catalog §1, seconds by chips
    "resnet": {16: 2531, 64: 673, 128: 412, 256: 231, 512: 136, 1024: 77.0},
    "ssd": {16: 756, 64: 233, 128: 166, 256: 107, 512: 80.4, 1024: 72.4},
    "transformer": {16: 612, 64: 231, 128: 169, 256: 94.9, 512: 62.8, 1024: 50.9},
    "gnmt": {16: 735, 64: 277, 128: 212, 256: 151, 512: 126.7},
    "mask": {16: 6422, 64: 3448, 128: 2136},
}


def _independent_olympic(folder: Path, version: str) -> float:
    """Time to train computed here from the raw lines, without the parser (regex on run_start/stop)."""
    durations, statuses = [], []
    for file in sorted(folder.glob("result_*.txt")):
        text = file.read_text()
        if version == "v0.6":
            start = float(re.search(r":::MLL (\S+) run_start:", text).group(1))
            stop_match = re.search(r':::MLL (\S+) run_stop: .*"status": "(\w+)"', text)
            durations.append(float(stop_match.group(1)) - start)
            statuses.append(stop_match.group(2))
        else:
            start = json.loads(re.search(r':::MLLOG (\{.*"key": "run_start".*\})', text).group(1))
            stop = json.loads(re.search(r':::MLLOG (\{.*"key": "run_stop".*\})', text).group(1))
            durations.append((stop["time_ms"] - start["time_ms"]) / 1000)
            statuses.append(stop["metadata"]["status"])
    if version == "v0.6":  # the v0.6 summarizer counted every run
        kept = sorted(durations)[1:-1]
    else:  # v0.7: failed runs dropped; the worst is dropped only if nothing else was
        ok = sorted(d for d, s in zip(durations, statuses, strict=True) if s == "success")
        kept = ok[1:] if len(ok) < len(durations) else ok[1:-1]
    return sum(kept) / len(kept)


@pytest.fixture(scope="module")
def summary(shared_mlperf):
    return summarize_paths([shared_mlperf])


def test_every_folder_matches_an_independent_olympic_mean(summary, shared_mlperf):
    assert len(summary) == len({p.parent for p in shared_mlperf.rglob("result_*.txt")})
    for row in summary.itertuples():
        expected = _independent_olympic(Path(row.folder), row.version)
        assert row.time_to_train_s == pytest.approx(expected, abs=0.01), row.submitter_path


def test_v07_headline_table_reproduced(summary):
    by_path = summary.set_index("submitter_path")
    for path, seconds in V07_HEADLINE.items():
        assert round(by_path.loc[path, "time_to_train_s"], 2) == pytest.approx(seconds, abs=0.005), path
    assert by_path.loc["v0.7/tpu-v3-8192-TF/resnet", "chips"] == 4096
    assert by_path.loc["v0.7/tpu-v3-8192-TF/resnet", "global_batch_size"] == 65536
    assert by_path.loc["v0.7/tpu-v3-8192-TF/resnet", "per_core_batch"] == 8
    assert by_path.loc["v0.7/tpu-v3-8192-TF/resnet", "opt_name"] == "lars"
    assert by_path.loc["v0.7/tpu-v3-8192-TF/bert", "opt_name"] == "lamb"
    assert by_path.loc["v0.7/tpu-v3-8192-JAX/transformer", "framework"] == "JAX"
    assert by_path.loc["v0.7/tpu-v3-1024-TF/maskrcnn", "failed_runs"] == 1
    assert by_path.loc["v0.7/tpu-v3-1024-TF/maskrcnn", "scoring"] == "olympic-dropped-failed"


def test_v06_scaling_table_reproduced(summary):
    for benchmark, table in V06_BY_CHIPS.items():
        rows = summary[(summary.version == "v0.6") & (summary.benchmark == benchmark)].set_index("chips")
        assert sorted(rows.index) == sorted(table), benchmark
        for chips, seconds in table.items():
            assert rows.loc[chips, "time_to_train_s"] == pytest.approx(seconds, rel=0.005), (benchmark, chips)
    resnet = summary[(summary.version == "v0.6") & (summary.benchmark == "resnet")].set_index("chips")
    # larger global batch needs more epochs (catalog §1): 4k -> ~62, 32k -> ~74
    assert resnet.loc[16, "epochs"] < resnet.loc[1024, "epochs"]


def test_olympic_rules_for_failed_and_few_runs():
    assert olympic_score([1, 2, 3, 10], ["success"] * 4, "v0.7").seconds == 2.5
    failed = olympic_score([1, 2, 3, 10], ["success", "success", "success", "abort"], "v0.7")
    assert (failed.seconds, failed.method) == (2.5, "olympic-dropped-failed")
    legacy = olympic_score([1, 2, 3, 10], ["success", "success", "success", "abort"], "v0.6")
    assert (legacy.seconds, legacy.method) == (2.5, "olympic")
    assert olympic_score([4, 6], ["success", "success"], "v0.7").method == "mean"
    assert olympic_score([4, 6], ["success", "success"], "v0.7").seconds == 5
    assert olympic_score([4, 6, 8, 9, 20], ["abort", "abort", "success", "success", "success"],
                         "v0.7").method == "invalid"
    assert olympic_score([5], ["abort"], "v0.7").seconds is None


def test_both_line_formats_parse():
    v07 = parse_line(':::MLLOG {"namespace": "", "time_ms": 1500, "key": "run_stop", "value": null, '
                     '"metadata": {"status": "success"}}')
    v06 = parse_line(':::MLL 1.5 run_stop: {"value": null, "metadata": {"status": "success"}}')
    assert (v07.time_ms, v07.key, v07.metadata["status"]) == (1500, "run_stop", "success")
    assert (v06.time_ms, v06.key, v06.metadata["status"]) == (1500, "run_stop", "success")
    assert parse_line("I0101 some other log line") is None


def test_intervals_pair_blocks_and_evals(shared_mlperf):
    tables = load_mlperf([shared_mlperf / "v0.6" / "tpu-v3-32" / "ssd" / "result_0.txt"])
    intervals = tables.intervals.to_pandas()
    evals = intervals[intervals.kind == "eval"]
    assert len(evals) == tables.results.column("eval_count")[0].as_py() == 6
    assert (evals.stop_ms >= evals.start_ms).all()
    assert evals.value.notna().all()  # the accuracy sits on its eval interval
    blocks = intervals[intervals.kind == "block"]
    assert (blocks.epoch_count > 0).all() and (blocks.stop_ms > blocks.start_ms).all()


def test_bad_log_is_one_clear_error(tmp_path):
    bad = tmp_path / "result_0.txt"
    bad.write_text(":::MLLOG {not json\n")
    with pytest.raises(TraceFormatError, match="line 1"):
        load_mlperf([bad])
    empty = tmp_path / "notes.txt"
    empty.write_text("hello\n")
    with pytest.raises(TraceFormatError, match="not an MLPerf result log"):
        load_mlperf([empty])


def test_ingest_roundtrip_reingest_and_rollback(tmp_path, shared_mlperf, summary):
    db = tmp_path / "t.duckdb"
    v07 = shared_mlperf / "v0.7"
    counts = ingest_mlperf([v07], db)
    assert counts["runs"] == 12 and counts["results"] == 90
    again = ingest_mlperf([v07 / "tpu-v3-8192-TF"], db)  # re-ingest replaces and keeps the ids
    assert set(again["run_ids"]) <= set(counts["run_ids"])
    con = duckdb.connect(str(db))
    assert con.execute("SELECT count(*) FROM runs WHERE source_format = 'mlperf'").fetchone()[0] == 12
    assert con.execute("SELECT count(*) FROM mlperf_results").fetchone()[0] == 90
    stored = summarize_db(con).set_index("submitter_path")["time_to_train_s"]
    expected = summary.set_index("submitter_path")["time_to_train_s"]
    for path in stored.index:
        assert stored[path] == pytest.approx(expected[path], abs=1e-6)
    # inside a caller's transaction that fails, nothing stays behind
    bad = tmp_path / "bad" / "result_0.txt"
    bad.parent.mkdir()
    bad.write_text(":::MLL 1.0 run_start: {broken\n")
    con.execute("BEGIN TRANSACTION")
    ingest_mlperf_into(con, [shared_mlperf / "v0.6" / "tpu-v3-32"])
    with pytest.raises(TraceFormatError):
        ingest_mlperf_into(con, [bad])
    con.execute("ROLLBACK")
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 12
    con.close()
    with pytest.raises(TraceFormatError):
        ingest_mlperf([v07, bad], db)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM mlperf_results").fetchone()[0] == 90
    con.close()


def test_cli_prints_table_and_json(tmp_path, shared_mlperf):
    out = tmp_path / "m.json"
    code, stdout, stderr = _cli("mlperf", str(shared_mlperf / "v0.7"), "--json", str(out))
    assert code == 0, stderr
    assert "28.88 s" in stdout and "15.46 s" in stdout
    document = json.loads(out.read_text())
    assert {row["submitter_path"] for row in document["mlperf"]} >= set(V07_HEADLINE)
    code, _, stderr = _cli("mlperf", str(tmp_path / "none"))
    assert code == 2 and stderr.count("\n") == 1 and "none" in stderr


def _cli(*args: str) -> tuple[int, str, str]:
    """The CLI in this process with a wide console: (exit status, stdout, stderr)."""
    return run_cli(*args, env={"COLUMNS": "220"})
