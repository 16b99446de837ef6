"""The scaling fit on plain tables: form choice, projections, crossovers, findings, MLPerf series, CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli as _cli
from tpuanalyze.analyzer.mlperf_summary import scaling_series
from tpuanalyze.analyzer.scaling import analyze_scaling, fit_category, holdout_check

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.pipeline.mlperf import summarize_paths


def _series(chips, compute, collectives, weight_update, per_core_batch=8.0, global_batch=None):
    n = np.asarray(chips, dtype=float)
    frame = pd.DataFrame({"run": [f"r{int(c)}" for c in n], "chips": n.astype(int),
                          "compute": compute(n), "collectives": collectives(n),
                          "weight_update": weight_update(n), "idle": 0.05})
    frame["step_time_ms"] = frame[["compute", "collectives", "weight_update", "idle"]].sum(axis=1)
    if global_batch is None:
        frame["per_core_batch"] = per_core_batch
    else:
        frame["global_batch"] = global_batch
        frame["per_core_batch"] = global_batch / (2 * n)
    return frame


def test_forms_are_recovered_from_four_runs():
    chips = [64, 256, 1024, 4096]
    frame = _series(chips, lambda n: 5 + 0 * n, lambda n: 0.2 + 0.3 * np.log2(n), lambda n: 1 + 0 * n)
    fits = analyze_scaling(frame).fits
    assert fits["compute"].form == "constant" and fits["compute"].params[0] == pytest.approx(5)
    assert fits["collectives"].form == "log"
    assert fits["collectives"].params == pytest.approx([0.2, 0.3], abs=1e-9)
    assert fits["weight_update"].form == "constant"


def test_fixed_global_batch_compute_is_inverse():
    chips = [128, 256, 512, 1024]
    frame = _series(chips, lambda n: 2000.0 / n + 0.3, lambda n: 1.0 + 0 * n, lambda n: 0.8 + 0 * n,
                    global_batch=4096)
    analysis = analyze_scaling(frame)
    assert analysis.batch_mode == "fixed-global-batch"
    assert analysis.fits["compute"].form == "inverse"
    projected = analysis.projection.set_index("chips")
    assert projected.loc[8192, "compute_est"] == pytest.approx(2000 / 8192 + 0.3, rel=1e-6)
    # at a fixed global batch the update and all-reduce stay while compute shrinks: both grow in share
    assert analysis.growing in {"collectives", "weight_update"}
    crossover = analysis.crossovers["collectives"]
    # 2000/N + 0.3 = 1.0 at N = 2857 (grid resolution ~3%)
    assert crossover == pytest.approx(2857, rel=0.04)
    finding = next(f for f in analysis.findings if f["evidence"]["metrics"]["category"] == "collectives")
    assert finding["rule"] == "scaling-limit" and finding["severity"] == "high"
    assert finding["evidence"]["metrics"]["projected_crossover_chips"] == pytest.approx(2857, rel=0.04)
    assert finding["estimated_gain"]["label"] == "estimate" and finding["catalog"] == "3.13"
    update = next(f for f in analysis.findings if f["evidence"]["metrics"]["category"] == "weight_update")
    # catalog §3.2: gain <= update x (1 - 1/N) at the largest run (1024 chips = 2048 replicas)
    assert update["estimated_gain"]["ms"] == pytest.approx(0.8 * (1 - 1 / 2048), rel=1e-3)


def test_two_runs_fall_back_to_the_cost_model_prior():
    flat = fit_category("compute", [256, 1024], [10.0, 10.05], scale=14)
    assert flat.form == "constant"
    # a ring all-reduce: (n-1)/n * M/B = a + b/N with b < 0 (catalog §2)
    rising = fit_category("collectives", [256, 1024], [2.0, 3.0], scale=14)
    assert rising.form == "inverse"
    assert rising.predict(4096)[0] == pytest.approx(3.25)
    falling = fit_category("collectives", [256, 1024], [3.0, 2.0], scale=14)
    assert falling.form == "constant"  # an all-reduce does not get cheaper with more replicas


def test_holdout_predicts_the_largest_run_and_flat_shares_give_no_finding():
    chips = [256, 1024, 4096]
    frame = _series(chips, lambda n: 7 + 0 * n, lambda n: 1.2 - 40 / n, lambda n: 0.5 + 0 * n)
    check = holdout_check(frame)
    assert check["fitted_on_chips"] == [256, 1024]
    assert abs(check["relative_error"]) < 1e-9
    analysis = analyze_scaling(frame)
    assert analysis.holdout["chips"] == 4096
    assert analysis.findings == []  # collectives share moves < 2 points: no scaling-limit
    assert analysis.measured["per_core_throughput_rel"].iloc[0] == 1.0
    assert (np.diff(analysis.measured["per_core_throughput_rel"]) < 0).all()


@pytest.mark.parametrize("frame, needle", [
    (pd.DataFrame({"run": ["a"], "chips": [8], "step_time_ms": [1.0]}), "at least 2 runs"),
    (pd.DataFrame({"run": ["a", "b"], "chips": [8, 8], "step_time_ms": [1.0, 1.1]}), "2 or more chip"),
])
def test_bad_series_are_clear_errors(frame, needle):
    with pytest.raises(TpuAnalyzeError, match=needle):
        analyze_scaling(frame)


def test_mlperf_resnet_series(shared_mlperf):
    series = scaling_series(summarize_paths([shared_mlperf / "v0.6"]))
    resnet = series["v0.6 resnet"]
    assert list(resnet["chips"]) == [16, 64, 128, 256, 512, 1024]
    analysis = analyze_scaling(resnet, metric="time_to_train_s", workload="resnet")
    # per-core throughput relative to 16 chips, computed independently: epochs / (seconds x cores)
    rate = resnet["epochs"] / (resnet["time_to_train_s"] * resnet["cores"])
    expected = (rate / rate.iloc[0]).to_numpy()
    assert analysis.measured["per_core_throughput_rel"].to_numpy() == pytest.approx(expected)
    assert expected[-1] < expected[1]  # throughput per core falls with scale (catalog §1)
    # time per epoch fitted on 16..512 chips predicts the 1024-chip time to train within 10%
    assert abs(analysis.holdout["relative_error"]) < 0.10


def test_cli_on_mlperf_logs(tmp_path, shared_mlperf):
    out, page = tmp_path / "s.json", tmp_path / "s.html"
    code, stdout, _ = _cli("scaling", str(shared_mlperf / "v0.6"), "--json", str(out), "--html", str(page))
    assert code == 0
    assert "ESTIMATES" in stdout
    document = json.loads(out.read_text())
    names = {s["workload"] for s in document["series"]}
    assert {"MLPerf v0.6 resnet", "MLPerf v0.6 ssd", "MLPerf v0.6 transformer"} <= names
    assert all(s["projection"]["label"].startswith("estimate") for s in document["series"])
    html = page.read_text()
    assert "vegaEmbed" in html and "http://" not in html.split("<script>")[0]
    code, _, stderr = _cli("scaling", str(shared_mlperf / "v0.7" / "tpu-v3-8192-TF"))
    assert code == 2 and "one chip count" in stderr and stderr.count("\n") == 1
