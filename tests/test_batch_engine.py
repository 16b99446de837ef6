"""The batch engine (analyzer/batch_engine.py: att_elementary, step_breakdown, collective_time and
op_steps built from arrays) reports what the stages' SQL reports (TPUANALYZE_BATCH_ENGINE=0), batch of
hosts by batch, on every bundled and shared capture and on generated pods: the same per-step, per-core,
per-host, collective, input and op frames and the same JSON (floats to 1e-9: sums in another order)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CaptureSet
from test_per_host import ONE_HOST, _analyse, _same, four_host_pod, host_count
from tpuanalyze.analyzer import per_host
from tpuanalyze.analyzer.api import RunAnalysis


def _analysed(db: Path, monkeypatch: pytest.MonkeyPatch, engine: str) -> tuple[list[RunAnalysis], int]:
    """Every run of ``db`` analysed host by host, TPUANALYZE_BATCH_ENGINE=``engine``, and how many batches
    the engine built (a run on accelerator op lines uses it, a CPU-only one does not)."""
    built = []
    real = per_host.sweep_batch

    def counted(*args, **kwargs):
        built.append(1)
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(per_host, "sweep_batch", counted)
        m.setenv("TPUANALYZE_BATCH_ENGINE", engine)
        return _analyse(db, ONE_HOST, m), len(built)


def _both_ways(db: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[RunAnalysis], list[RunAnalysis], int]:
    """Every run of ``db`` analysed host by host with the stages' SQL (which must build no batch with the
    engine, else the comparison compares the engine with itself), then with the batch engine (and the
    batches it built)."""
    sql, sql_built = _analysed(db, monkeypatch, "0")
    assert sql_built == 0, "TPUANALYZE_BATCH_ENGINE=0 runs the stages' SQL"
    return (sql, *_analysed(db, monkeypatch, "1"))


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


def test_a_batch_the_sweep_hands_back_to_sql_reports_the_same(sample_captures: CaptureSet,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A span without a time makes ``sweep_batch`` hand its batch to the stages' SQL mid-way, over op
    rows the numpy form already made (a registered Arrow table, no rowid): the same report."""
    engine, built = _analysed(sample_captures.db, monkeypatch, "1")
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
    from test_map_analysis import SAMPLES, _batch, map_task_rows

    _, items, t0 = _batch([SAMPLES / "generated" / "resnet50_v3-32_input-bound"])
    engine = map_task_rows(items, t0, tmp_path)
    handed = []
    monkeypatch.setattr(per_host, "sweep_batch", lambda *a, **k: handed.append(1))
    handed_back = map_task_rows(items, t0, tmp_path)
    assert handed and engine[0]
    assert engine == handed_back
