"""Rules on small hand-built XSpaces (real wire format, real DuckDB): the §3.6 distributed batch-norm
rule, training-only rules silent on inference, payload bytes in SQL equal the Python parser's, and how
gains combine (same category not additive, total within the time outside compute)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from test_attribution_xspace import XSpaceBuilder, hlo_op
from tpuanalyze.analyzer.api import analyze_run
from tpuanalyze.analyzer.collectives import shape_bytes
from tpuanalyze.analyzer.config import load_thresholds
from tpuanalyze.analyzer.findings.rules import payload_bytes_sql
from tpuanalyze.analyzer.findings.tree import resolve

from tpuanalyze.pipeline import ingest_paths


def _bn_run(tmp: Path, shape: str, training: bool = True) -> tuple[duckdb.DuckDBPyConnection, int]:
    """Two cores, 3 steps of 10 ms: fusions 0-8 ms, 20 all-reduces of `shape` (0.05 ms each) 8-9 ms,
    then the optimizer (training) or another fusion (inference) 9-9.5 ms."""
    b = XSpaceBuilder()
    for ordinal in (0, 1):
        core = b.tpu_core(ordinal)
        for step in range(3):
            o = step * 10.0
            core.event("Steps", str(step), o, o + 10, event_stats={"step_num": step, "group_id": step})
            module = "jit_train_step(1)" if training else "jit_forward(1)"
            core.event("XLA Modules", module, o, o + 10, event_stats={"group_id": step})
            hlo_op(core, "fusion.1", o, o + 8, "convolution fusion", flops=1e9)
            for i in range(20):
                start = o + 8 + i * 0.05
                hlo_op(core, f"all-reduce.{i}", start, start + 0.05, "all-reduce", shape=shape)
            tf_op = "train/Momentum/update_weights" if training else "model/dense/add"
            hlo_op(core, "fusion.3", o + 9, o + 9.5, "loop fusion", tf_op=tf_op)
    run_dir = tmp / ("train" if training else "infer") / shape.replace("[", "_").replace("]", "")
    b.write(run_dir / "plugins" / "profile" / "r" / "host0.xplane.pb")
    db = tmp / f"{run_dir.name}-{training}.duckdb"
    run_id = ingest_paths([run_dir], db).run_ids[0]
    return duckdb.connect(str(db), read_only=True), run_id


def test_distributed_batch_norm_fires_on_many_tiny_allreduces(tmp_path: Path) -> None:
    con, run_id = _bn_run(tmp_path, "f32[16]")  # 64 bytes each: batch-norm statistics
    a = analyze_run(con, run_id)
    assert a.summary["identity"]["workload"]["mode"] == "training"
    found = {f["rule"]: f for f in a.findings}
    bn = found["distributed-batch-norm"]
    m = bn["evidence"]["metrics"]
    assert m["small_allreduce_fraction_of_step"] == pytest.approx(0.10, abs=1e-6)  # 1 ms of 10
    assert m["small_allreduce_count_per_step"] == pytest.approx(20)
    assert bn["catalog"] == "3.6" and "torus" in bn["recommendation"]


def test_distributed_batch_norm_silent_on_large_allreduces(tmp_path: Path) -> None:
    con, run_id = _bn_run(tmp_path, "f32[1048576]")  # 4 MB each: gradient buckets, not batch norm
    a = analyze_run(con, run_id)
    assert "distributed-batch-norm" not in {f["rule"] for f in a.findings}


def test_training_only_rules_stay_silent_on_inference(tmp_path: Path) -> None:
    con, run_id = _bn_run(tmp_path, "f32[16]", training=False)
    a = analyze_run(con, run_id)
    assert a.summary["identity"]["workload"]["mode"] == "inference"
    rules = {f["rule"] for f in a.findings}
    assert "distributed-batch-norm" not in rules and "weight-update-unsharded" not in rules
    for f in a.findings:
        assert "backward" not in f["recommendation"] and "gradient" not in f["recommendation"]


@pytest.mark.parametrize("shape", ["f32[1024]", "bf16[8,224,224,3]", "(f32[4,4], bf16[8])", "pred[]",
                                   "s32[0]", "f8e4m3fn[3,5]", "c64[2]", "(f32[], u8[7,1])"])
def test_payload_bytes_in_sql_equal_the_python_parser(shape: str) -> None:
    expected, _ = shape_bytes(shape)
    con = duckdb.connect()
    got = con.execute(f"SELECT {payload_bytes_sql('?')}", [shape]).fetchone()[0]
    assert got == expected


def _draft(rule: str, gain_ms: float, category: str, caused_by: str | None = None,
           severity: str = "medium") -> dict:
    f = {"rule": rule, "severity": severity, "evidence": {"summary": "", "metrics": {}, "sql": ""},
         "recommendation": "r", "catalog": "3.3", "_gain_ms": gain_ms, "_model": "m", "_category": category}
    if caused_by:
        f["caused_by"] = caused_by
    return f


STEP = {"step_ms": 100.0, "compute_fraction": 0.5, "compute_ms": 50.0, "collectives_ms": 20.0,
        "input_ms": 10.0, "output_ms": 0.0, "idle_ms": 20.0, "weight_update_ms": 0.0}


def test_gains_on_one_category_are_not_additive() -> None:
    # two halvings of the same 20 ms: 20 x (1 - 0.5 x 0.5) = 15 ms, shared 7.5 / 7.5
    found = resolve([_draft("collective-bound", 10.0, "collectives"),
                     _draft("f32-gradient-allreduce", 10.0, "collectives")], load_thresholds(), STEP)
    assert [f["estimated_gain"]["ms"] for f in found] == [7.5, 7.5]
    assert all(f["estimated_gain"]["own_ms"] == 10.0 for f in found)


def test_total_gain_is_capped_by_the_time_outside_compute() -> None:
    found = resolve([_draft("input-bound", 10.0, "input"), _draft("host-overhead", 20.0, "idle"),
                     _draft("eval-overhead", 40.0, "eval")], load_thresholds(), STEP)
    total = sum(f["estimated_gain"]["ms"] for f in found)
    assert total == pytest.approx(50.0, abs=1e-3)  # 100 ms step, half of it compute
    ratios = {f["rule"]: f["estimated_gain"]["ms"] / f["estimated_gain"]["own_ms"] for f in found}
    assert max(ratios.values()) == pytest.approx(min(ratios.values()), rel=1e-3)  # scaled alike


def test_a_caused_finding_adds_nothing_and_follows_its_cause() -> None:
    drafts = [_draft("collective-bound", 10.0, "collectives", severity="high"),
              _draft("straggler", 15.0, "collectives+input")]
    drafts[1]["evidence"]["metrics"] = {"collective_compute_ms": 1.0, "collective_sync_ms": 9.0}
    drafts[1]["_reasons"] = ["sync"]
    found = resolve(drafts, load_thresholds(), STEP)
    assert [f["rule"] for f in found] == ["straggler", "collective-bound"]
    assert found[1]["caused_by"] == "straggler" and found[1]["estimated_gain"]["ms"] == 0
    assert found[0]["estimated_gain"]["ms"] == pytest.approx(15.0)
    assert not any(k.startswith("_") for f in found for k in f)
