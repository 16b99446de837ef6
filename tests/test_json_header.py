"""Every JSON document starts with schema_version and tool_version (docs/json.md); the run object
carries the roofline; numbers in text never use Python's spelling or scientific notation."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import SAMPLE_TRACES, run_cli
from tpuanalyze.analyzer.api import SCHEMA_VERSION

from tpuanalyze import __version__


def test_report_compare_and_mlperf_json_start_with_the_versions(tmp_path: Path) -> None:
    base = SAMPLE_TRACES / "generated" / "resnet50_v3-32_baseline"
    other = SAMPLE_TRACES / "generated" / "resnet50_v3-32_input-bound"
    report = tmp_path / "r.json"
    assert run_cli("report", str(base), "--json", str(report), "--quiet").returncode == 0
    document = json.loads(report.read_text())
    assert list(document)[:2] == ["schema_version", "tool_version"]
    assert document["schema_version"] == SCHEMA_VERSION and document["tool_version"] == __version__
    roofline = document["runs"][0]["roofline"]
    assert roofline["source"] == "trace" and roofline["programs"][0]["program"] == "all programs"
    assert roofline["programs"][0]["bound_by"] in ("compute", "memory")
    compare = tmp_path / "c.json"
    assert run_cli("compare", str(base), str(other), "--json", str(compare)).returncode == 0
    assert list(json.loads(compare.read_text()))[:2] == ["schema_version", "tool_version"]
    mlperf = tmp_path / "m.json"
    assert run_cli("mlperf", str(SAMPLE_TRACES / "mlperf"), "--json", str(mlperf)).returncode == 0
    assert json.loads(mlperf.read_text())["schema_version"] == SCHEMA_VERSION


def test_numbers_in_text_are_plain() -> None:
    from tpuanalyze.reports.view import finding_view, format_value

    assert format_value(None) == "–" and format_value(False) == "no"
    assert "e-" not in format_value(9.068e-05)
    view = finding_view({"rule": "data-formatting", "severity": "medium", "evidence": {
        "summary": "s", "metrics": {"first_conv_share_of_compute": None, "sharded": False}}})
    text = "; ".join(f"{k} {v}" for k, v in view.evidence_items)
    assert "None" not in text and "False" not in text
