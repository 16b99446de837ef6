"""One visual language: a category has the same color in every chart spec of the report and the
scaling page (reports/palette.py), and hosts sort naturally."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
from conftest import SAMPLE_TRACES
from tpuanalyze.analyzer.api import analyze_run
from tpuanalyze.reports.html import render_html
from tpuanalyze.reports.palette import CATEGORY_COLORS, CATEGORY_LABELS, natural_sorted

from tpuanalyze.pipeline import ingest_paths

# 'exposed' is the collectives-by-kind chart's name for the collectives category (overlapped is its shade)
LABEL_TO_CATEGORY = {**{label: c for c, label in CATEGORY_LABELS.items()}, **{c: c for c in CATEGORY_COLORS},
                     "exposed": "collectives"}


def _walk(node, found: list[tuple[str, str, str]], where: str) -> None:
    """Collect (label, color, spec) from every scale with a domain and a range, and fixed mark colors."""
    if isinstance(node, dict):
        scale = node.get("scale")
        if isinstance(scale, dict) and isinstance(scale.get("domain"), list) and isinstance(
                scale.get("range"), list):
            for label, color in zip(scale["domain"], scale["range"], strict=False):
                found.append((str(label), str(color).lower(), where))
        for value in node.values():
            _walk(value, found, where)
    elif isinstance(node, list):
        for value in node:
            _walk(value, found, where)


def _specs(document: str) -> dict[str, dict]:
    pairs = re.findall(r'<script type="application/json" id="spec-([^"]+)">(.*?)</script>', document, re.S)
    return {name: json.loads(text) for name, text in pairs}


def test_every_chart_spec_colors_each_category_the_palette_way(tmp_path: Path) -> None:
    runs = [SAMPLE_TRACES / "generated" / name for name in
            ("resnet50_v3-32_input-bound", "resnet50_v3-32_weight-update-unsharded")]
    db = tmp_path / "p.duckdb"
    run_ids = ingest_paths(runs, db).run_ids
    con = duckdb.connect(str(db), read_only=True)
    try:
        analyses = [analyze_run(con, r) for r in run_ids]
    finally:
        con.close()
    specs = _specs(render_html(analyses))
    assert len(specs) >= 10
    found: list[tuple[str, str, str]] = []
    for name, spec in specs.items():
        _walk(spec, found, name)
    by_category: dict[str, set[str]] = {}
    for label, color, where in found:
        category = LABEL_TO_CATEGORY.get(label)
        if category is not None:
            assert color == CATEGORY_COLORS[category].lower(), (where, label, color)
            by_category.setdefault(category, set()).add(where)
    # the breakdown, the shares and the top-ops charts all carry category scales (none left to defaults)
    charts_with_compute = {w.split("-", 1)[1] for w in by_category["compute"]}
    assert {"shares", "steps", "ops"} <= charts_with_compute, charts_with_compute
    # a color given to a category is never reused for something else in a scale
    palette = {c.lower(): cat for cat, c in CATEGORY_COLORS.items()}
    for label, color, where in found:
        if color in palette and label not in LABEL_TO_CATEGORY:
            raise AssertionError(f"{where}: '{label}' wears {palette[color]}'s color {color}")
    # every 'category' color encoding names its scale (a default scheme would differ chart to chart)
    for name, spec in specs.items():
        text = json.dumps(spec)
        for match in re.finditer(r'"color": \{"field": "category"[^}]*\}', text):
            assert '"scale"' in text[match.start(): match.start() + 2000], name


def test_terminal_and_html_tables_use_the_palette() -> None:
    from tpuanalyze.reports import charts, scaling_charts, terminal

    assert charts.CATEGORY_COLORS is CATEGORY_COLORS
    assert terminal.CATEGORY_COLORS is CATEGORY_COLORS
    assert all(scaling_charts._COLORS[c] == CATEGORY_COLORS[c] for c in CATEGORY_COLORS)
    assert scaling_charts._COLORS["total"] not in CATEGORY_COLORS.values()


def test_hosts_sort_naturally() -> None:
    hosts = ["w-10", "w-2", "w-0", "w-100", "w-1"]
    assert natural_sorted(hosts) == ["w-0", "w-1", "w-2", "w-10", "w-100"]
    assert natural_sorted(["h-1 : 10", "h-1 : 9", "h-0 : 1"]) == ["h-0 : 1", "h-1 : 9", "h-1 : 10"]


def test_charts_put_hosts_in_natural_order_and_a_healthy_pod_stays_calm() -> None:
    import pandas as pd
    from tpuanalyze.reports.charts import HEATMAP_MIN_SPAN, input_wait_chart, step_time_heatmap

    hosts = [f"w-{i}" for i in range(100)]
    inputs = pd.DataFrame({"host": [h for h in hosts for _ in range(2)], "device_ordinal": [0, 1] * 100,
                           "infeed_ms_per_step": [float(i % 7) for i in range(200)]})
    order = input_wait_chart(inputs).to_dict()["layer"][0]["encoding"]["x"]["sort"]
    assert order == natural_sorted(order) and "w-10" in order
    # 12 cores whose steps differ by at most 0.4%: the color scale spans >= 5% of the median step
    rows = [{"host": f"w-{h}", "device_ordinal": d, "step_num": s, "is_eval": False,
             "duration_ps": int(100e9 * (1 + 0.004 * ((h + d + s) % 2))), "input_ps": 0,
             "collectives_ps": int(5e9)} for h in range(6) for d in range(2) for s in range(5)]
    spec = step_time_heatmap(pd.DataFrame(rows)).to_dict()
    scale = spec["encoding"]["color"]["scale"]
    assert scale["domainMid"] == 0 and scale["domain"][1] == -scale["domain"][0]
    assert scale["domain"][1] >= HEATMAP_MIN_SPAN * 100 - 1e-9  # ms: 5% of the 100 ms median step
    worst = 0.004 * 100  # the largest distance from the median, in ms
    assert worst / scale["domain"][1] <= 0.1  # near the neutral middle: calm
    y_order = spec["encoding"]["y"]["sort"]
    assert y_order == natural_sorted(y_order)


def test_scaling_charts_give_category_colors_to_categories_only(tmp_path: Path) -> None:
    """The scaling page's totals, measured points and efficiency never wear a category's color."""
    from tpuanalyze.analyzer.scaling import analyze_scaling
    from tpuanalyze.reports.cmd_scaling import trace_series
    from tpuanalyze.reports.scaling_page import scaling_html

    from tpuanalyze.pipeline.runs import RunLoader

    with RunLoader(None) as loader:
        runs = [run for p in sorted((SAMPLE_TRACES / "scaling").iterdir()) if p.is_dir()
                for run in loader.load(str(p))]
        frame = trace_series(runs, {})
    analysis = analyze_scaling(frame.drop(columns=["workload"]), workload="gnmt")
    specs = _specs(scaling_html([analysis]))
    assert len(specs) >= 4
    palette = {c.lower(): cat for cat, c in CATEGORY_COLORS.items()}
    for name, spec in specs.items():
        found: list[tuple[str, str, str]] = []
        _walk(spec, found, name)
        for label, color, where in found:  # scales: a category label gets its palette color
            if label in LABEL_TO_CATEGORY:
                assert color == CATEGORY_COLORS[LABEL_TO_CATEGORY[label]].lower(), (where, label)
        text = json.dumps(spec).lower()
        fixed = set(re.findall(r'"mark": \{[^}]*"color": "(#[0-9a-f]{6})"', text))
        assert not fixed & set(palette), (name, fixed & set(palette))  # fixed marks: never a category's
