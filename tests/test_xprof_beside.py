"""`report --xprof`: XProf's numbers beside ours.

tests/data/xprof_expected.json pins what XProf (``xprof`` 2.24) says on every real capture in
../shared/traces and every bundled capture in sample_traces/, each entry with the command that made it
(regenerate with tests/data/make_xprof_expected.py). Our numbers must agree with them within 5 points
(step time: 5%), except the disagreements listed in KNOWN with their reason (strict: when one goes
away, the test says so). A second test runs XProf itself through `report --xprof` and checks the pins
still hold, the report shows them, and the trace folders stay untouched.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import HAS_XPROF, SAMPLE_TRACES, SHARED_TRACES, run_cli, xprof_python
from tpuanalyze.reports.xprof_side import beside

pytestmark = pytest.mark.xdist_group("captures")  # the session's shared ingest: one worker makes it

PINNED = json.loads((Path(__file__).parent / "data" / "xprof_expected.json").read_text())["captures"]
METRICS = ("step_time_ms", "idle_percent", "infeed_percent", "all_reduce_percent")
# The shared JAX captures agree since warm-up steps are left out of our step-time statistics.
_WARMUP = ("XProf leaves out the capture's first and last steps; ours leaves out only warm-up steps (this "
           "steady-state capture's slow step 0), so the last step stays in our mean")
KNOWN = {
    ("sample:jax_cpu/single_jit_train", "step_time_ms"): _WARMUP,
}


def _path(key: str) -> Path:
    base, rel = key.split(":", 1)
    return (SHARED_TRACES if base == "shared" else SAMPLE_TRACES) / rel


def _analysis(key: str, request: pytest.FixtureRequest) -> object:
    """Our analysis of the capture, from the session's ingest of the shared or bundled captures."""
    if key.startswith("shared:") and not SHARED_TRACES.is_dir():
        pytest.skip(f"shared traces not present at {SHARED_TRACES}")
    captures = request.getfixturevalue("shared_captures" if key.startswith("shared:") else "sample_captures")
    return captures.analysis(_path(key))


def _cases():
    for key in PINNED:
        for metric in METRICS:
            reason = KNOWN.get((key, metric))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(key, metric, marks=marks, id=f"{key}-{metric}")


@pytest.mark.parametrize(("key", "metric"), list(_cases()))
def test_ours_agree_with_xprof_within_5_points(key: str, metric: str, request) -> None:
    analysis = _analysis(key, request)
    block = beside(analysis, PINNED[key]["xprof"], PINNED[key]["command"])
    row = next(m for m in block["metrics"] if m["metric"] == metric)
    if row["ours"] is None or row["xprof"] is None:
        pytest.skip(f"{key}: {metric} has no number in {'ours' if row['ours'] is None else 'XProf'}")
    assert not row["flagged"], row


def test_every_capture_has_something_compared(request) -> None:
    for key in PINNED:
        if key.startswith("shared:") and not SHARED_TRACES.is_dir():
            continue
        block = beside(_analysis(key, request), PINNED[key]["xprof"], PINNED[key]["command"])
        assert any(m["ours"] is not None and m["xprof"] is not None for m in block["metrics"]), key


def test_a_difference_over_5_points_is_flagged(request) -> None:
    key = "sample:generated/resnet50_v3-32_input-bound"
    theirs = dict(PINNED[key]["xprof"], infeed_percent_average=PINNED[key]["xprof"]["infeed_percent_average"]
                  + 6.0)
    block = beside(_analysis(key, request), theirs, "")
    assert block["flagged"] == ["infeed_percent"]


@pytest.mark.xprof
def test_report_xprof_runs_xprof_and_shows_it(shared_traces, tmp_path, monkeypatch) -> None:
    python = xprof_python()
    monkeypatch.setenv("TPUANALYZE_XPROF_PYTHON", python)
    keys = ["shared:real/tpu_v6e_4chip_jax_inference.xplane.pb",
            "shared:real/gpu_v100x8_tf_multiworker.xplane.pb",
            "sample:generated/resnet50_v3-32_input-bound", "sample:jax_cpu/pmap8_train_eval"]
    before = {p for k in keys for p in (_path(k) if _path(k).is_dir() else _path(k).parent).rglob("*")}
    result = run_cli("report", *[str(_path(k)) for k in keys], "--xprof", "--json", str(tmp_path / "r.json"),
                     "--html", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stderr
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert len(runs) == len(keys)
    for key, run in zip(keys, runs, strict=True):
        block = run["xprof"]
        pinned = PINNED[key]["xprof"]
        by_metric = {m["metric"]: m["xprof"] for m in block["metrics"]}
        assert by_metric["idle_percent"] == (None if pinned["hardware_type"] == "CPU_ONLY"
                                             else pinned["device_idle_time_percent"]), key
        assert by_metric["infeed_percent"] == pinned["infeed_percent_average"], key
        assert by_metric["all_reduce_percent"] == pytest.approx(pinned["all_reduce_percent"]), key
        assert by_metric["step_time_ms"] == (pinned["steptime_ms_average"] or None), key
        assert block["command"].startswith("python xprof_probe.py ")
        assert block["flagged"] == [m for m in METRICS if (key, m) in KNOWN and by_metric[m] is not None]
    assert result.stdout.count("XProf beside ours") == len(keys)
    html = (tmp_path / "r.html").read_text()
    assert html.count("XProf beside ours (same files)") == len(keys)
    after = {p for k in keys for p in (_path(k) if _path(k).is_dir() else _path(k).parent).rglob("*")}
    assert after == before  # XProf's cache went to a scratch folder, not beside the user's traces


@pytest.mark.skipif(HAS_XPROF, reason="xprof is importable here: the missing-xprof path cannot be shown")
def test_report_xprof_without_xprof_says_how_to_install(tmp_path) -> None:
    run = SAMPLE_TRACES / "generated" / "resnet50_v3-32_baseline"
    result = run_cli("report", str(run), "--xprof", env={"TPUANALYZE_XPROF_PYTHON": ""})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "pip install 'tpuanalyze[xprof]'" in lines[0] and "TPUANALYZE_XPROF_PYTHON" in lines[0]
    assert result.stdout == ""
