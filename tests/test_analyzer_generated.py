"""The analyzer against the generator's ground truth, scenario by scenario (the issue's acceptance check):
breakdown within 0.02 per category, mean step time within 3%, the scenario's rule found at medium or
high severity, and no high-severity finding on the baseline. The analyzer never reads ground_truth.json;
only this test does."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from tpuanalyze.analyzer.api import analyze_run
from tpuanalyze.generator.scenarios import SCENARIOS

from tpuanalyze import generator  # a broken generator must fail these tests, not skip them
from tpuanalyze.pipeline import ingest_paths

CASES = [("resnet50", 8, name) for name in SCENARIOS]
CASES += [("bert", 8, "baseline")]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int, str], tuple[Path, int]]:
    out = tmp_path_factory.mktemp("gen")
    dirs = {case: generator.generate(case[0], chips=case[1], steps=6, hosts=1, scenario=case[2], seed=0,
                                     out=out / f"{case[0]}_{case[2]}") for case in CASES}
    db = out / "gen.duckdb"
    summary = ingest_paths(list(dirs.values()), db)
    return {case: (dirs[case], run_id) for case, run_id in zip(CASES, summary.run_ids, strict=True)} | {
        ("db", 0, ""): (db, 0)}


@pytest.fixture(scope="module")
def con(generated: dict) -> duckdb.DuckDBPyConnection:
    db, _ = generated[("db", 0, "")]
    c = duckdb.connect(str(db), read_only=True)
    yield c
    c.close()


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_scenario_matches_ground_truth(case: tuple[str, int, str], generated: dict,
                                       con: duckdb.DuckDBPyConnection) -> None:
    run_dir, run_id = generated[case]
    truth = json.loads((run_dir / "ground_truth.json").read_text())
    a = analyze_run(con, run_id)
    ours = a.summary["breakdown"]
    for category, expected in truth["breakdown"].items():
        assert ours[category] == pytest.approx(expected, abs=0.02), (category, ours, truth["breakdown"])
    assert a.summary["collectives_overlapped"] == pytest.approx(truth["collectives_overlapped"], abs=0.02)
    assert a.summary["step_time_ms"]["mean"] == pytest.approx(truth["step_time_ms"], rel=0.03)
    severities = {f["rule"]: f["severity"] for f in a.findings}
    for rule in truth["injected_rules"]:
        assert severities.get(rule) in ("medium", "high"), (rule, severities)
    if case[2] == "baseline":
        assert "high" not in severities.values(), severities
