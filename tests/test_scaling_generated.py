"""Scaling from generated TPU-v3 traces: ResNet-50 at 256, 1024 and 4096 chips (MLPerf presets, one
host written per run, few steps). The analysis reads the traces only; ground_truth.json is read here,
by the test, as the independent reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli as _cli
from tpuanalyze.analyzer.scaling import analyze_scaling, holdout_check
from tpuanalyze.reports.cmd_scaling import trace_series

from tpuanalyze import generator  # a broken generator must fail these tests, not skip them
from tpuanalyze.pipeline.runs import RunLoader

CHIPS = (256, 1024, 4096)


@pytest.fixture(scope="module")
def resnet_runs(tmp_path_factory) -> dict[int, Path]:
    out = tmp_path_factory.mktemp("scaling")
    return {chips: generator.generate("resnet50", chips, steps=3, hosts=1, seed=1, out=out / f"r{chips}")
            for chips in CHIPS}


@pytest.fixture(scope="module")
def series(resnet_runs, tmp_path_factory):
    from tpuanalyze.pipeline import ingest_paths

    db = tmp_path_factory.mktemp("scaling-db") / "runs.duckdb"
    for path in resnet_runs.values():
        ingest_paths([path], db)
    with RunLoader(db) as loader:
        runs = [run for spec in ("1", "2", "3") for run in loader.load(spec)]
        frame = trace_series(runs, {})
    frame.attrs["db"] = db
    return frame


def test_chips_and_batch_come_from_the_trace(series, resnet_runs):
    assert list(series["chips"]) == list(CHIPS)
    for row in series.itertuples():
        truth = json.loads((resnet_runs[row.chips] / "ground_truth.json").read_text())
        assert row.per_core_batch == pytest.approx(truth["model"]["per_core_batch"])
        assert row.step_time_ms == pytest.approx(truth["step_time_ms"], rel=0.05)


def test_two_smaller_runs_predict_the_largest_within_10_percent(series):
    check = holdout_check(series.drop(columns=["workload"]))
    assert check["fitted_on_chips"] == [256, 1024] and check["chips"] == 4096
    assert abs(check["relative_error"]) < 0.10, check


def test_shares_move_as_the_cost_model_says(series):
    analysis = analyze_scaling(series.drop(columns=["workload"]), workload="resnet50")
    measured = analysis.measured.set_index("chips")
    # per-core batch shrinks with scale (MLPerf presets), the gradient all-reduce does not: its share grows
    assert measured.loc[4096, "collectives_share"] > measured.loc[256, "collectives_share"]
    assert measured.loc[4096, "weight_update_share"] >= measured.loc[256, "weight_update_share"]
    assert measured.loc[4096, "compute_share"] < measured.loc[256, "compute_share"]
    assert analysis.growing == "collectives"
    assert any(f["rule"] == "scaling-limit" and f["evidence"]["metrics"]["category"] == "collectives"
               for f in analysis.findings)
    # efficiency: per-core throughput falls with scale
    assert measured["per_core_throughput_rel"].is_monotonic_decreasing


def test_cli_scaling_from_a_database(series, tmp_path):
    out = tmp_path / "s.json"
    result = _cli("scaling", "--db", str(series.attrs["db"]), "--json", str(out), "--project", "8192")
    assert result.returncode == 0, result.stderr
    series = json.loads(out.read_text())["series"][0]
    assert [r["chips"] for r in series["runs"]] == list(CHIPS)
    assert 8192 in [r["chips"] for r in series["projection"]["rows"]]
    assert series["holdout"]["chips"] == 4096


def test_mixed_workloads_and_single_run_are_rejected(resnet_runs, tmp_path):
    gnmt = generator.generate("gnmt", 16, steps=2, hosts=1, out=tmp_path / "gnmt")
    mixed = _cli("scaling", str(resnet_runs[256]), str(gnmt))
    assert mixed.returncode == 2 and "not the same workload" in mixed.stderr and mixed.stderr.count("\n") == 1
    single = _cli("scaling", str(resnet_runs[256]))
    assert single.returncode == 2 and "at least 2 runs" in single.stderr


def test_chips_override(resnet_runs, tmp_path):
    out = tmp_path / "o.json"
    result = _cli("scaling", str(resnet_runs[256]), str(resnet_runs[1024]), "--chips",
                  f"{resnet_runs[1024]}=2048", "--json", str(out))
    assert result.returncode == 0, result.stderr
    runs = json.loads(out.read_text())["series"][0]["runs"]
    assert [r["chips"] for r in runs] == [256, 2048]
    bad = _cli("scaling", str(resnet_runs[256]), str(resnet_runs[1024]), "--chips", "x=abc")
    assert bad.returncode == 2 and "RUN=N" in bad.stderr


def test_sample_demo(sample_traces, tmp_path):
    demo = sample_traces / "scaling"
    runs = sorted(demo.glob("gnmt_*"), key=lambda p: int(p.name.split("_")[1]))
    assert len(runs) >= 3, "bundled sample_traces/scaling is missing runs"
    size = sum(p.stat().st_size for p in demo.rglob("*") if p.is_file())
    assert size < 1.5e6
    out = tmp_path / "demo.json"
    result = _cli("scaling", *map(str, runs), "--json", str(out))
    assert result.returncode == 0, result.stderr
    series = json.loads(out.read_text())["series"][0]
    assert [r["chips"] for r in series["runs"]] == [16, 64, 512]
    limit = [f for f in series["findings"] if f["rule"] == "scaling-limit"]
    assert limit and limit[0]["evidence"]["metrics"]["category"] == "collectives"
    assert limit[0]["severity"] == "high"


def _layers(spec: dict) -> list[dict]:
    """Every single-mark view of a Vega-Lite spec (layers, concatenations, or the spec itself)."""
    children = [c for key in ("layer", "hconcat", "vconcat", "concat") for c in spec.get(key, [])]
    return [view for child in children for view in _layers(child)] if children else [spec]


def test_scaling_charts_for_the_html_report(series):
    from tpuanalyze.analyzer.api import analyze_db
    from tpuanalyze.reports.scaling_charts import scaling_charts, scaling_html

    analyses = analyze_db(series.attrs["db"])
    assert scaling_charts(analyses) == []  # RunAnalysis objects state no chip count: no series from them
    analysis = analyze_scaling(series.drop(columns=["workload"]), workload="resnet50")
    blocks = scaling_charts([analysis, *analyses])
    assert [title for title, _, _ in blocks] == [
        "resnet50: time vs chips", "resnet50: time per step by category", "resnet50: share of the step",
        "resnet50: scaling efficiency"]
    for title, caption, chart in blocks:
        spec = chart.to_dict()
        assert spec["$schema"] and "estimate" in caption
        views = _layers(spec)
        for view in views:  # tooltips on every mark, the shaded projection range included
            assert "tooltip" in view["encoding"], (title, view["mark"])
        marks = [v["mark"]["type"] if isinstance(v["mark"], dict) else v["mark"] for v in views]
        if title.endswith("time vs chips"):
            # regime boundaries (rule + label) follow the measured and projected layers when in range
            assert marks[:3] == ["area", "line", "point"] and set(marks[3:]) <= {"rule", "text"}
        for view, mark in zip(views, marks, strict=True):  # projections read as estimates: dashed lines
            if mark == "line":
                assert view["mark"]["strokeDash"], title
        # Vega-Lite warns on opacity/size over an unsorted nominal field.
        opacity = [v["encoding"]["opacity"] for v in views if "field" in v["encoding"].get("opacity", {})]
        for channel in opacity:
            assert channel["type"] in ("ordinal", "quantitative") and channel.get("sort"), channel
    share = blocks[2][2].to_dict()
    kinds = {row["kind"] for row in share["datasets"][share["data"]["name"]]}
    assert kinds == {"measured", "estimate"}
    page = scaling_html([analysis])
    assert page.count('<div class="chart" id="scaling-') == 4 and "connect-src 'none'" in page
    assert '<pre id="render-status" hidden>' in page and "vegaEmbed(" in page


def test_the_limit_of_a_trace_series(series):
    analysis = analyze_scaling(series.drop(columns=["workload"]), workload="resnet50")
    limits = analysis.limits
    # largest global batch 65536 (the 4096-chip preset) over 2 cores per chip: 1 example per core
    assert limits["convergence_cap_batch"] == int(series["global_batch"].max()) == 65536
    assert limits["data_parallel_limit_chips"] == 32768 and limits["label"] == "estimate"
    crossing = limits["fixed_passes_compute_chips"]
    assert crossing is None or crossing > 4096   # compute still dominates the measured runs
    remedies = {r["catalog"]: r for r in limits["remedies"]}
    assert set(remedies) == {"3.1", "3.2", "3.4"}
    assert all(r["label"] == "estimate" and r["gain_ms"] >= 0 for r in remedies.values())
    at = limits["at_chips"]
    collectives = analysis.fits["collectives"].predict(at)[0]
    assert remedies["3.4"]["gain_ms"] == pytest.approx(0.5 * collectives)   # half the all-reduce
    assert analysis.to_json()["limits"] == limits
