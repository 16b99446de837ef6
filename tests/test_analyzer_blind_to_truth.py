"""The analysis reads traces only (the analyzer never reads what only the generator writes): the same
numbers with ground_truth.json removed."""

from __future__ import annotations

import shutil
from pathlib import Path

from tpuanalyze.analyzer.api import analyze_db, report_json

from tpuanalyze import generator
from tpuanalyze.pipeline import ingest_paths


def _report(run_dir: Path, db: Path) -> dict:
    ingest_paths([run_dir], db)
    document = report_json(analyze_db(db))
    for run in document["runs"]:
        run.pop("run_id", None)
    return document


def test_report_is_identical_without_ground_truth(tmp_path: Path) -> None:
    run_dir = generator.generate("resnet50", chips=8, steps=3, hosts=1, scenario="input-bound",
                                 seed=1, out=tmp_path / "gen")
    # the same layout and logdir name (the run's display name comes from it), minus the truth
    blind = tmp_path / "blind" / "gen" / "plugins" / "profile" / run_dir.name
    shutil.copytree(run_dir, blind)
    (blind / "ground_truth.json").unlink()
    with_truth = _report(run_dir, tmp_path / "a.duckdb")
    without_truth = _report(blind, tmp_path / "b.duckdb")
    assert with_truth["runs"][0]["breakdown"]["input"] > 0.05  # a real, non-trivial analysis
    assert with_truth == without_truth
