"""The HTML report's building blocks: vendored Vega inlined, nothing fetched, charts that aggregate.

These tests need no trace: they check the vendored files, the offline scanner, and that the chart
functions stay bounded in size and degrade to "not in this trace" on empty frames.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
from tpuanalyze.reports import charts, html

STEP_COLUMNS = [
    "host",
    "device_ordinal",
    "step_num",
    "is_eval",
    "start_ps",
    "duration_ps",
    "compute_ps",
    "weight_update_ps",
    "collectives_ps",
    "input_ps",
    "output_ps",
    "idle_ps",
    "collectives_overlapped_ps",
]
COLLECTIVE_COLUMNS = [
    "kind",
    "count_per_step",
    "bytes",
    "dtype",
    "exposed_ms_per_step",
    "overlapped_ms_per_step",
    "compute_ms",
    "sync_ms",
]
INPUT_COLUMNS = ["host", "device_ordinal", "infeed_ms_per_step"]
OP_COLUMNS = [
    "name",
    "category",
    "count",
    "self_time_ms",
    "share",
    "flops",
    "bytes_accessed",
    "flop_utilization",
]


class ExternalReferenceScanner(HTMLParser):
    """Collects every attribute or CSS that could make a browser fetch something."""

    FETCHING_ATTRS = {
        "src",
        "href",
        "srcset",
        "poster",
        "data",
        "action",
        "formaction",
        "background",
        "manifest",
    }

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_style = tag == "style"
        if tag == "script" and any(name == "src" for name, _ in attrs):
            self.problems.append("<script src=...>")
        if tag == "link":
            self.problems.append(f"<link {attrs}>")
        if tag in ("iframe", "object", "embed", "base"):
            self.problems.append(f"<{tag}>")
        for name, value in attrs:
            value = value or ""
            if name in self.FETCHING_ATTRS and not value.startswith(("#", "data:")):
                self.problems.append(f"<{tag} {name}={value!r}>")
            if name == "style":
                self._check_css(value, f"style attribute of <{tag}>")

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self._check_css(data, "<style>")

    def _check_css(self, css: str, where: str) -> None:
        if "@import" in css:
            self.problems.append(f"@import in {where}")
        for url in re.findall(r"url\(\s*['\"]?([^'\")]+)", css):
            if not url.startswith(("data:", "#")):
                self.problems.append(f"url({url}) in {where}")


def external_references(document: str) -> list[str]:
    scanner = ExternalReferenceScanner()
    scanner.feed(document)
    return scanner.problems


def test_vendored_libraries_are_minified_builds_with_licenses() -> None:
    vendor = html.VENDOR_DIR
    sizes = {name: (vendor / name).stat().st_size for name in html.VENDOR_FILES}
    # Minified UMD builds: each well under 1 MB, together under 1 MB (see vendor/README.md).
    assert sum(sizes.values()) < 1_000_000, sizes
    for name in ("vega", "vega-lite", "vega-embed"):
        license_text = (vendor / f"LICENSE-{name}.txt").read_text()
        assert "Redistribution and use in source and binary forms" in license_text
    js = html.vendor_javascript()
    assert "sourceMappingURL" not in js
    assert "</script" not in js.lower()
    # The UMD wrappers define the globals the page script uses.
    assert ".vega={}" in js or ".vega = {}" in js
    assert "vegaEmbed" in js and "vegaLite" in js


def test_scanner_catches_every_kind_of_external_reference() -> None:
    # Negative control: the scanner used on real reports must see each of these.
    bad = (
        '<script src="https://cdn.example/vega.js"></script><link rel="stylesheet" href="x.css">'
        '<img src="http://example.com/a.png"><div style="background:url(https://e.com/b.png)"></div>'
        "<style>@import url(https://fonts.example/css);</style>"
    )
    found = external_references(bad)
    assert len(found) >= 5, found
    assert external_references('<a href="#run-0">x</a><img src="data:image/png;base64,AA==">') == []


def test_empty_frames_give_no_chart_and_an_honest_note() -> None:
    empty_steps = pd.DataFrame(columns=STEP_COLUMNS)
    assert charts.step_breakdown_chart(empty_steps) is None
    assert charts.step_time_heatmap(empty_steps) is None
    assert charts.collectives_by_kind_chart(pd.DataFrame(columns=COLLECTIVE_COLUMNS)) is None
    assert charts.collectives_size_chart(pd.DataFrame(columns=COLLECTIVE_COLUMNS)) is None
    assert charts.input_wait_chart(pd.DataFrame(columns=INPUT_COLUMNS)) is None
    assert charts.top_ops_chart(pd.DataFrame(columns=OP_COLUMNS)) is None
    assert charts.category_shares_chart({"r": {}}) is None
    block = html._block("x", "Collectives by kind", "", None, note=html.NOT_IN_TRACE)
    assert block.spec_json is None and block.note == "not in this trace"


def _pod_steps(hosts: int, cores_per_host: int, steps: int, seed: int = 0) -> pd.DataFrame:
    """Per-device-step rows shaped like RunAnalysis.steps for a pod (aggregation input, not a trace)."""
    rng = np.random.default_rng(seed)
    n = hosts * cores_per_host * steps
    host = np.repeat([f"t1v-n-{h:05d}-w-{h}" for h in range(hosts)], cores_per_host * steps)
    ordinal = np.tile(np.repeat(np.arange(cores_per_host), steps), hosts)
    step = np.tile(np.arange(steps), hosts * cores_per_host)
    parts = {
        c: rng.uniform(0.5, 1.5, n) * w * 1e9
        for c, w in (
            ("compute", 10),
            ("weight_update", 1),
            ("collectives", 2),
            ("input", 1),
            ("output", 0.1),
            ("idle", 0.3),
        )
    }
    duration = sum(parts.values())
    frame = pd.DataFrame(
        {
            "host": host,
            "device_ordinal": ordinal,
            "step_num": step,
            "is_eval": False,
            "start_ps": step * 20e9,
            "duration_ps": duration,
            **{f"{c}_ps": v for c, v in parts.items()},
            "collectives_overlapped_ps": 1e9,
        }
    )
    return frame


@pytest.mark.parametrize("hosts", [4, 512])
def test_step_charts_aggregate_so_size_does_not_grow_with_cores(hosts: int) -> None:
    steps = _pod_steps(hosts, 8, 10)
    breakdown = html.spec_json(charts.step_breakdown_chart(steps))
    heatmap = html.spec_json(charts.step_time_heatmap(steps))
    # Per-step bars: 10 steps x 6 categories whatever the core count.
    assert breakdown.count('"category"') <= 10 * 6 + 20
    # Heatmap: one row per core up to 64 cores, else one row per host (slowest core).
    rows = 4 * 8 if hosts == 4 else hosts
    assert heatmap.count('"step_ms"') <= rows * 10 + 20
    assert len(heatmap) < 200 * rows * 10
    if hosts == 512:
        assert "host (its core with most own time)" in heatmap


def test_many_steps_fold_into_bins() -> None:
    steps = _pod_steps(2, 2, 1000)
    spec = html.spec_json(charts.step_breakdown_chart(steps))
    assert "bins of" in spec
    assert spec.count('"category"') <= charts.MAX_STEP_COLUMNS * 6 + 20
