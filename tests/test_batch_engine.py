"""The batch engine (analyzer/batch_engine.py: att_elementary, step_breakdown, collective_time and
op_steps built from arrays) reports what the stages' SQL reports (TPUANALYZE_BATCH_ENGINE=0), batch of
hosts by batch, on every bundled and shared capture and on generated pods: the same per-step, per-core,
per-host, collective, input and op frames and the same JSON (floats to 1e-9: sums in another order)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from conftest import CaptureSet
from test_per_host import ONE_HOST, _analyse, _same, four_host_pod, host_count
from tpuanalyze.analyzer import per_host
from tpuanalyze.analyzer.api import RunAnalysis


def _with_engine(db: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[RunAnalysis], int]:
    """Every run of ``db`` analysed host by host with the batch engine, and how many batches it built (a
    run on accelerator op lines uses it, a CPU-only one does not)."""
    built = []
    real = per_host.sweep_batch

    def counted(*args, **kwargs):
        built.append(1)
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(per_host, "sweep_batch", counted)
        m.setenv("TPUANALYZE_BATCH_ENGINE", "1")
        return _analyse(db, ONE_HOST, m), len(built)


def _both_ways(db: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[RunAnalysis], list[RunAnalysis], int]:
    """Every run of ``db`` analysed host by host with the stages' SQL, then with the batch engine (and
    the batches it built)."""
    with monkeypatch.context() as m:
        m.setenv("TPUANALYZE_BATCH_ENGINE", "0")
        sql = _analyse(db, ONE_HOST, m)
    return (sql, *_with_engine(db, monkeypatch))


def _without_engine_calls(db: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setenv("TPUANALYZE_BATCH_ENGINE", "0")
    calls = []
    monkeypatch.setattr(per_host, "sweep_batch", lambda *a, **k: calls.append(1))
    _analyse(db, ONE_HOST, monkeypatch)
    return len(calls)


def test_bundled_captures_report_the_same_with_the_engine(sample_captures: CaptureSet,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    sql, engine, built = _both_ways(sample_captures.db, monkeypatch)
    assert built > 0, "the bundled TPU pods take the engine"
    assert any(a.summary["steps"] for a in sql)
    _same(sql, engine)


def test_shared_captures_report_the_same_with_the_engine(shared_captures: CaptureSet,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sql, engine, built = _both_ways(shared_captures.db, monkeypatch)
    assert built > 0, "the shared TPU and GPU captures take the engine"
    _same(sql, engine)


@pytest.mark.parametrize("scenario", ["straggler", "f32-gradient-allreduce", "eval-overhead"])
def test_generated_pods_report_the_same_with_the_engine(tmp_path: Path, scenario: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4-host pod batch by batch: collectives matched across hosts, eval steps, a slow host."""
    db = four_host_pod(tmp_path, seed=2, scenario=scenario, steps=4)
    hosts = host_count(db)
    sql, engine, built = _both_ways(db, monkeypatch)
    assert built == hosts >= 4, "every host's batch built by the engine"
    assert sql[0].summary["steps"] > 0 and sql[0].summary["collectives"]
    _same(sql, engine)


def test_engine_off_runs_no_engine(sample_captures: CaptureSet, monkeypatch: pytest.MonkeyPatch) -> None:
    """TPUANALYZE_BATCH_ENGINE=0 really is the stages' SQL (else the comparisons above compare the
    engine with itself)."""
    assert _without_engine_calls(sample_captures.db, monkeypatch) == 0


def test_a_batch_the_sweep_hands_back_to_sql_reports_the_same(sample_captures: CaptureSet,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A span without a time makes ``sweep_batch`` hand its batch to the stages' SQL mid-way, over op
    rows the numpy form already made (a registered Arrow table, no rowid): the same report."""
    engine, built = _with_engine(sample_captures.db, monkeypatch)
    handed = []

    def hand_back(*args, **kwargs):
        handed.append(1)
        return None

    monkeypatch.setattr(per_host, "sweep_batch", hand_back)
    fallback = _analyse(sample_captures.db, ONE_HOST, monkeypatch)
    assert len(handed) == built > 0
    _same(engine, fallback)


def test_a_map_task_the_sweep_hands_back_to_sql_returns_the_same(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The same hand-back in a map worker (analyzer/batch_map.py), whose op rows go to a Parquet file:
    the same op rows and relations."""
    import tempfile

    from test_map_analysis import SAMPLES, _batch
    from tpuanalyze.analyzer.api import load_thresholds

    from tpuanalyze.pipeline.tasks import LoadTask, MapTask, map_hosts

    _, items, t0 = _batch([SAMPLES / "generated" / "resnet50_v3-32_input-bound"])
    seen = {}
    handed = []
    for mode in ("engine", "handed back"):
        if mode == "handed back":
            monkeypatch.setattr(per_host, "sweep_batch", lambda *a, **k: handed.append(1))
        task = MapTask(LoadTask(tuple(items), t0, tempfile.mkdtemp(dir=tmp_path), False), load_thresholds(),
                       0, "xspace", store_op_events=False)
        result = map_hosts(task).result
        con = duckdb.connect()
        con.register("k", result.kinds)
        rows = con.execute(f"SELECT o.* EXCLUDE (kind_id), k.* EXCLUDE (kind_id) FROM read_parquet("
                           f"'{result.op_rows}') o JOIN k USING (kind_id) ORDER BY ALL").fetchall()
        seen[mode] = (rows, {name: sorted(map(str, t.to_pylist())) for name, t in result.relations.items()})
    assert handed and seen["engine"][0]
    assert seen["engine"] == seen["handed back"]
