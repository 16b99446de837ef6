"""The analyzer on every real trace in ../shared/traces: never fails, says what a trace lacks, and the
JAX CPU captures show what their programs did (input-bound, eval, psum collectives)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from tpuanalyze.analyzer.api import install_views, report_json

pytestmark = pytest.mark.xdist_group("captures")  # the session's shared ingest: one worker makes it


def _shared_runs(shared: Path) -> list[Path]:
    real = shared / "real"
    paths = sorted(p for p in real.glob("*.xplane.pb") if "corrupt" not in p.name)
    paths += sorted(p for p in real.iterdir() if p.is_dir())
    paths += sorted(p for p in (shared / "jax_cpu").iterdir() if p.is_dir())
    paths += sorted((shared / "chrome_json").glob("kineto_nccl_rank0.json.gz"))  # the smallest JSON
    return paths


class SharedRuns:
    """This module's captures in the session's shared ingest (a database of many runs)."""

    def __init__(self, captures, shared: Path) -> None:  # noqa: ANN001 - conftest.CaptureSet
        self.captures = captures
        self.paths = _shared_runs(shared)
        self.db = captures.db

    def path(self, fragment: str) -> Path:
        found = [p for p in self.paths if fragment in str(p)]
        assert len(found) == 1, (fragment, found)
        return found[0]

    def analysis(self, fragment: str):  # noqa: ANN201 - RunAnalysis
        return self.captures.analysis(self.path(fragment))


@pytest.fixture(scope="module")
def shared_db(shared_traces: Path, shared_captures) -> SharedRuns:
    return SharedRuns(shared_captures, shared_traces)


def test_every_shared_trace_analyzes(shared_db: SharedRuns) -> None:
    assert len(shared_db.paths) >= 10
    analyses = [shared_db.captures.analysis(path) for path in shared_db.paths]
    doc = json.loads(json.dumps(report_json(analyses)))  # plain JSON all the way down
    for run in doc["runs"]:
        assert set(run) >= {"run", "device_type", "hosts", "devices", "steps", "step_time_ms", "breakdown",
                            "collectives_overlapped", "findings", "notes"}
        codes = {w["code"] for w in run["capture"]["warnings"]}
        assert codes <= {"empty-device-planes", "warmup-step", "hosts-missing", "clock-skew", "truncated",
                         "profiler-error", "profiler-warning"}, run["run"]
        assert all(w["message"] for w in run["capture"]["warnings"])
        total = sum(run["breakdown"].values())
        if run["steps"]:
            assert total == pytest.approx(1.0, abs=1e-6), run["run"]
        else:
            assert run["notes"], f"{run['run']}: no steps but no note saying so"
            assert total == 0.0


def test_every_stored_event_has_its_plane_and_line(shared_db: SharedRuns, sample_captures) -> None:  # noqa: ANN001
    """What analyzer/input.py's host-input queries rely on to skip the events view's join with
    ``lines``: no event row lacks its plane or its line, in any real or bundled capture."""
    for db in (shared_db.db, sample_captures.db):
        con = duckdb.connect(str(db), read_only=True)
        try:
            events, orphans = con.execute(
                "SELECT count(*), count(*) FILTER (WHERE l.line_index IS NULL OR p.plane_index IS NULL) "
                "FROM event_rows r LEFT JOIN lines l USING (run_id, host, plane_index, line_index) "
                "LEFT JOIN planes p USING (run_id, host, plane_index)").fetchone()
        finally:
            con.close()
        assert events > 10_000 and orphans == 0, (db, events, orphans)


def test_v6e_inference_has_no_steps_line_and_says_so(shared_db: SharedRuns) -> None:
    a = shared_db.analysis("tpu_v6e_4chip")
    assert a.summary["device_type"].startswith("TPU v6")
    assert a.summary["devices"] == 4
    assert any("no Steps line" in n for n in a.summary["notes"])
    # the capture's psum is a program of its own, outside the jit_f step series, yet device time
    psum = [p for p in a.summary["programs"] if p["program"].startswith("jit__psum")]
    assert psum and not psum[0]["is_step_program"]
    assert a.summary["breakdown"]["collectives"] > 0


def test_kineto_json_gpu_kernels_and_profiler_steps(shared_db: SharedRuns) -> None:
    """PyTorch Kineto JSON: no XSpace device planes; GPU kernels are the device ops, ProfilerStep#N the
    steps, the NCCL kernels collectives."""
    a = shared_db.analysis("kineto_nccl_rank0")
    assert any("Kineto" in n for n in a.summary["notes"])
    assert a.summary["device_type"] == "GPU" and a.summary["steps"] == 2
    assert a.summary["breakdown"]["collectives"] > 0 and not a.collectives.empty


def test_pmap8_input_bound(shared_db: SharedRuns) -> None:
    a = shared_db.analysis("pmap8_input_bound")
    bd = a.summary["breakdown"]
    non_compute = {k: v for k, v in bd.items() if k != "compute"}
    assert max(non_compute, key=non_compute.get) == "input", bd
    assert a.summary["devices"] == 8 and a.summary["device_type"] == "CPU"
    found = {f["rule"]: f for f in a.findings}
    assert found["input-bound"]["severity"] == "high"
    assert "all-reduce" in set(a.collectives["kind"])  # the program's pmean


def test_pmap8_train_eval(shared_db: SharedRuns) -> None:
    a = shared_db.analysis("pmap8_train_eval")
    assert a.summary["breakdown"]["eval"] > 0.01
    # 20 annotated train steps; the first compiles (warm-up) and is left out of the statistics
    assert a.summary["steps"] == 19 and a.summary["warmup_steps"] == 1
    ar = a.collectives.set_index("kind").loc["all-reduce"]
    assert ar["count_per_step"] >= 1 and ar["exposed_ms_per_step"] > 0


def test_single_jit_has_no_collectives(shared_db: SharedRuns) -> None:
    a = shared_db.analysis("single_jit_train")
    assert a.summary["steps"] + a.summary["warmup_steps"] == 12 and a.summary["devices"] == 1
    assert a.collectives.empty and a.summary["breakdown"]["collectives"] == 0.0


def test_evidence_sql_reproduces_the_numbers(shared_db: SharedRuns) -> None:
    """Every finding's evidence SQL runs against the database views and returns its first metric."""
    analyses = {fragment: shared_db.analysis(fragment)
                for fragment in ("pmap8_input_bound", "pmap8_train_eval", "gpu_v100x8")}
    con = duckdb.connect(str(shared_db.db))  # writable: the views `tpuanalyze sql` runs the SQL in
    install_views(con)
    try:
        _check_evidence(con, analyses)
    finally:
        con.close()


def _check_evidence(con: duckdb.DuckDBPyConnection, analyses: dict) -> None:
    for fragment, a in analyses.items():
        assert a.findings, fragment
        for f in a.findings:
            row = con.execute(f["evidence"]["sql"]).fetchall()
            assert row, f["rule"]
            metrics = f["evidence"]["metrics"]
            first_key = next(iter(metrics))
            if f["rule"] in ("input-bound", "collective-bound", "outfeed-bound", "weight-update-unsharded",
                             "eval-overhead", "host-overhead"):
                assert row[0][0] == pytest.approx(metrics[first_key], abs=1e-6), f["rule"]


def test_gpu_xspace_streams(shared_db: SharedRuns) -> None:
    """TF multi-worker on V100: only GPU:4 and GPU:6 carry timelines; H2D/D2H memcpys are input/output."""
    a = shared_db.analysis("gpu_v100x8")
    assert a.summary["device_type"] == "GPU"
    assert sorted(a.per_core["device_ordinal"]) == [4, 6]
    assert a.summary["breakdown"]["compute"] > 0.5
    assert a.summary["breakdown"]["input"] > 0 and a.summary["breakdown"]["output"] > 0
