"""Findings: thresholds from one documented place, overridable; evidence SQL; gains labelled estimates."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from test_attribution_xspace import XSpaceBuilder, design_example_step, hlo_op
from tpuanalyze.analyzer.api import analyze_run, install_views
from tpuanalyze.analyzer.config import load_thresholds
from tpuanalyze.analyzer.findings import ADVICE, recommendation
from tpuanalyze.analyzer.platform import advice_platform

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.pipeline import ingest_paths

RULE_IDS = {"input-bound", "host-input-processing", "outfeed-bound", "collective-bound",
            "f32-gradient-allreduce", "latency-bound-collectives", "weight-update-unsharded", "eval-overhead",
            "host-overhead", "data-parallel-limit", "partition-overhead", "data-formatting", "straggler",
            "distributed-batch-norm"}


@pytest.fixture(scope="module")
def example_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[duckdb.DuckDBPyConnection, int]:
    """Two cores of design.md's step; core 1 waits 4x longer in infeed (a slow host's symptom)."""
    tmp = tmp_path_factory.mktemp("findings")
    b = XSpaceBuilder()
    design_example_step(b.tpu_core(0))
    core = b.tpu_core(1)
    core.event("Steps", "0", 0, 10, event_stats={"step_num": 0})
    hlo_op(core, "infeed", 0, 8, "infeed", shape="bf16[8,224,224,3]")
    hlo_op(core, "fusion.1", 8, 10, "convolution fusion")
    run_dir = tmp / "run" / "plugins" / "profile" / "r1"
    b.write(run_dir / "host0.xplane.pb")
    db = tmp / "f.duckdb"
    run_id = ingest_paths([run_dir], db).run_ids[0]
    con = duckdb.connect(str(db))
    install_views(con)
    return con, run_id


def test_every_rule_has_catalog_text_and_thresholds() -> None:
    assert set(ADVICE) == RULE_IDS
    config = load_thresholds()
    for key in ("input_bound", "outfeed_bound", "collective_bound", "weight_update_unsharded",
                "eval_overhead", "host_overhead", "partition_overhead", "data_formatting", "straggler",
                "patterns"):
        assert key in config


def test_findings_shape_and_evidence(example_db: tuple[duckdb.DuckDBPyConnection, int]) -> None:
    con, run_id = example_db
    a = analyze_run(con, run_id)
    found = {f["rule"]: f for f in a.findings}
    assert found["input-bound"]["severity"] == "high"  # (0.2 + 0.8) / 2 = 50% of step >= 20%
    assert found["straggler"]["evidence"]["metrics"]["infeed_worst_over_rest"] == pytest.approx(4.0)
    for f in a.findings:
        assert f["rule"] in RULE_IDS and f["severity"] in ("high", "medium", "low")
        platform = advice_platform(a.summary["identity"])
        assert f["recommendation"] == recommendation(f["rule"], platform) and f["catalog"]
        gain = f["estimated_gain"]
        assert gain["label"] == "estimate" and gain["model"] and gain["ms"] >= 0
        assert con.execute(f["evidence"]["sql"]).fetchall()  # the SQL runs against the views
    sql_value = con.execute(found["input-bound"]["evidence"]["sql"]).fetchall()[0][0]
    assert sql_value == pytest.approx(found["input-bound"]["evidence"]["metrics"]["input_fraction_of_step"],
                                      abs=1e-6)
    # a tree: root causes by severity, each followed by the findings it explains
    roots = [f["severity"] for f in a.findings if "caused_by" not in f]
    assert roots == sorted(roots, key=("high", "medium", "low").index)
    rules = [f["rule"] for f in a.findings]
    for position, f in enumerate(a.findings):
        if "caused_by" in f:
            assert f["caused_by"] in rules[:position] and f["estimated_gain"]["ms"] == 0
    # core 1's slow infeed is a straggler host, and it is what makes the step input-bound
    assert found["input-bound"]["caused_by"] == "straggler"


def test_thresholds_override_by_dict_and_file(example_db: tuple[duckdb.DuckDBPyConnection, int],
                                              tmp_path: Path) -> None:
    con, run_id = example_db
    relaxed = analyze_run(con, run_id, thresholds={"input_bound": {"high": 0.6}})
    assert {f["rule"]: f["severity"] for f in relaxed.findings}["input-bound"] == "medium"
    toml = tmp_path / "t.toml"
    toml.write_text("[input_bound]\nmedium = 0.7\nhigh = 0.9\n")
    silent = analyze_run(con, run_id, thresholds=toml)
    assert "input-bound" not in {f["rule"] for f in silent.findings}
    assert load_thresholds(toml)["collective_bound"] == load_thresholds()["collective_bound"]  # merged


def test_bad_thresholds_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[input_bound\nmedium = ")
    with pytest.raises(TpuAnalyzeError) as err:
        load_thresholds(bad)
    assert err.value.path == str(bad) and "\n" not in str(err.value)
    with pytest.raises(TpuAnalyzeError):
        load_thresholds(tmp_path / "missing.toml")


def test_optimizer_patterns_are_configurable(tmp_path: Path) -> None:
    """Weight-update recognition comes from the config's regex, not from generator markers."""
    b = XSpaceBuilder()
    core = b.tpu_core(0)
    core.event("Steps", "0", 0, 10, event_stats={"step_num": 0})
    hlo_op(core, "fusion.1", 0, 5, "convolution fusion")
    hlo_op(core, "fusion.2", 5, 9, "loop fusion", tf_op="model/MyCustomStep/apply")
    run_dir = tmp_path / "run" / "plugins" / "profile" / "r1"
    b.write(run_dir / "host0.xplane.pb")
    db = tmp_path / "o.duckdb"
    run_id = ingest_paths([run_dir], db).run_ids[0]
    con = duckdb.connect(str(db))
    default = analyze_run(con, run_id)
    assert default.summary["breakdown"]["weight_update"] == 0.0
    custom = analyze_run(con, run_id, thresholds={"patterns": {"weight_update": "mycustomstep"}})
    assert custom.summary["breakdown"]["weight_update"] == pytest.approx(0.4)
    assert {f["rule"] for f in custom.findings} >= {"weight-update-unsharded"}


def test_analyzer_never_reads_ground_truth() -> None:
    """The analysis reads traces only; ground_truth.json is for tests only."""
    import tpuanalyze.analyzer as analyzer_pkg

    folder = Path(analyzer_pkg.__file__).parent
    mine = ["api.py", "attribution.py", "attribution.sql", "classify.py", "collectives.py", "config.py",
            "input.py", "ops.py", "platform.py", "steps.py", "thresholds.toml"]
    sources = [folder / name for name in mine] + sorted((folder / "findings").glob("*.py"))
    assert len(sources) >= len(mine) + 4
    for path in sources:
        assert "ground_truth" not in path.read_text(), path
