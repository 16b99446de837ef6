"""The attribution run batch of hosts by batch (analyzer/per_host.py) reports what the whole-run SQL
reports: same per-step breakdown, per-core and collective tables, findings and JSON, on multi-host runs,
including the decisions that are the run's, not a host's (Steps line on some hosts only, the dominant
program over all hosts)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pytest
from test_attribution_xspace import XSpaceBuilder, design_example_step, hlo_op
from tpuanalyze.analyzer import per_host
from tpuanalyze.analyzer.api import RunAnalysis, analyze_run, report_json

from tpuanalyze.pipeline import ingest_paths

WHOLE_RUN = 10**15  # events per batch: every run is one batch (the whole-run SQL)
ONE_HOST = 1  # every host its own batch


def _analyse(db: Path, batch_events: int, monkeypatch: pytest.MonkeyPatch) -> list[RunAnalysis]:
    monkeypatch.setattr(per_host, "BATCH_EVENTS", batch_events)
    con = duckdb.connect(str(db), read_only=True)
    try:
        runs = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
        return [analyze_run(con, run_id) for run_id in runs]
    finally:
        con.close()


def _close(a: Any, b: Any, path: str = "") -> list[str]:
    """Differences between two JSON documents (floats to 1e-9 relative: sums in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in _close(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _close(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def _same(whole: list[RunAnalysis], batched: list[RunAnalysis]) -> None:
    for w, b in zip(whole, batched, strict=True):
        key = ["host", "device_ordinal", "start_ps"]
        pd.testing.assert_frame_equal(w.steps.sort_values(key).reset_index(drop=True),
                                      b.steps.sort_values(key).reset_index(drop=True))
        pd.testing.assert_frame_equal(w.per_core, b.per_core)
        pd.testing.assert_frame_equal(w.per_host, b.per_host)
        pd.testing.assert_frame_equal(w.collectives, b.collectives)
        pd.testing.assert_frame_equal(w.input, b.input)
        pd.testing.assert_frame_equal(w.ops, b.ops)
    assert _close(report_json(whole), report_json(batched)) == []


def _ingest(paths: list[Path], db: Path) -> Path:
    ingest_paths(paths, db)
    return db


@pytest.mark.parametrize("scenario", ["baseline", "straggler", "input-bound"])
def test_generated_pod_batched_equals_whole_run(tmp_path: Path, scenario: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated 4-host run (collectives across hosts, a straggler host, a slow input host)."""
    from tpuanalyze.generator import generate

    out = tmp_path / "logs"
    generate(model="resnet50", chips=16, steps=4, scenario=scenario, seed=1, out=out)
    db = _ingest([out], tmp_path / "g.duckdb")
    con = duckdb.connect(str(db), read_only=True)
    hosts = con.execute("SELECT count(DISTINCT host) FROM planes").fetchone()[0]
    assert len(per_host.host_batches(con, 1, ONE_HOST)) == hosts >= 4
    assert len(per_host.host_batches(con, 1, WHOLE_RUN)) == 1
    con.close()
    whole = _analyse(db, WHOLE_RUN, monkeypatch)
    batched = _analyse(db, ONE_HOST, monkeypatch)
    assert whole[0].summary["hosts"] >= 4 and whole[0].summary["steps"] > 0
    assert whole[0].summary["collectives"], "the run has collectives to reduce across hosts"
    _same(whole, batched)


def _program(core: Any, name: str, start: float, end: float) -> None:
    core.event("XLA Modules", name, start, end)
    hlo_op(core, "fusion.1", start, end - 0.5, "convolution fusion", flops=1e9)
    hlo_op(core, "all-reduce.1", end - 0.5, end, "all-reduce", shape="f32[1024]")


def test_dominant_program_is_the_runs_not_a_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Steps line: steps are the executions of the program with the most time over the run.
    host0 spends more time in jit_a, host1 far more in jit_b: the run's steps are jit_b's on both."""
    run_dir = tmp_path / "logs" / "plugins" / "profile" / "r1"
    h0, h1 = XSpaceBuilder(), XSpaceBuilder()
    c0, c1 = h0.tpu_core(0), h1.tpu_core(0)
    for i in range(3):
        _program(c0, "jit_a(1)", 10.0 * i, 10.0 * i + 8)
        _program(c1, "jit_b(2)", 30.0 * i, 30.0 * i + 25)
    _program(c0, "jit_b(2)", 40.0, 45.0)
    _program(c1, "jit_a(1)", 100.0, 102.0)
    h0.write(run_dir / "host0.xplane.pb")
    h1.write(run_dir / "host1.xplane.pb")
    db = _ingest([run_dir], tmp_path / "d.duckdb")
    whole = _analyse(db, WHOLE_RUN, monkeypatch)
    batched = _analyse(db, ONE_HOST, monkeypatch)
    assert set(whole[0].steps["program"]) == {"jit_b(2)"}
    assert len(whole[0].steps) == 4  # host0: one execution of jit_b; host1: three
    _same(whole, batched)


def test_steps_line_on_one_host_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run has a Steps line (host0), so host1, without one, is not stepped by its programs (the
    run's flag decides, as in the whole-run SQL) but gets the op-span step of a device without markers."""
    run_dir = tmp_path / "logs" / "plugins" / "profile" / "r1"
    h0, h1 = XSpaceBuilder(), XSpaceBuilder()
    c0 = h0.tpu_core(0)
    for step in range(3):
        design_example_step(c0, 12.0 * step, step)
    c1 = h1.tpu_core(0)
    for i in range(3):
        _program(c1, "jit_train_step(1)", 12.0 * i, 12.0 * i + 10)
    h0.write(run_dir / "host0.xplane.pb")
    h1.write(run_dir / "host1.xplane.pb")
    db = _ingest([run_dir], tmp_path / "s.duckdb")
    whole = _analyse(db, WHOLE_RUN, monkeypatch)
    batched = _analyse(db, ONE_HOST, monkeypatch)
    sources = whole[0].steps.groupby("host")["step_source"].agg(set).to_dict()
    assert sources == {"host0": {"steps_line"}, "host1": {"op_span"}}
    _same(whole, batched)

