"""Altair charts of a scaling series (measured runs + fitted projections), and a small offline HTML page.

``scaling_charts(items)`` is what the HTML report calls with ScalingAnalysis series (the report verb
builds them from the traces' own chip counts, ``cmd_report.scaling_series``). Anything else, e.g. bare
RunAnalysis objects, carries no chip count and gives no charts. Every chart marks projections as
estimates (dashed lines, a shaded range, lighter bars) and every mark has a tooltip.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import altair as alt
import numpy as np
import pandas as pd
from tpuanalyze.analyzer.scaling import ScalingAnalysis
from tpuanalyze.reports.palette import (
    CATEGORY_COLORS,
    CATEGORY_LABELS,
    EFFICIENCY,
    MEASURED_POINT,
    OTHER,
    TOTAL,
)

_COLORS = {**CATEGORY_COLORS, "other": OTHER, "total": TOTAL}
_LABELS = {**CATEGORY_LABELS, "other": "other (not in a category)", "total": "time to train"}


def _x(title: str = "chips") -> alt.X:
    # Plain integers: chip counts are powers of two, SI suffixes would print 1024 as "1.024k".
    return alt.X("chips:Q", scale=alt.Scale(type="log", base=2), title=title, axis=alt.Axis(format="d"))


def _symlog_ticks(peak: float) -> list[float] | None:
    """0 and 1-2-5 steps up to the peak: symlog's default ticks crowd together at the top.

    Below 1 the symlog scale is nearly linear, so small peaks keep Vega's own ticks (None)."""
    if not peak >= 2:
        return None
    ticks, decade = [0.0], 1.0
    while decade <= peak:
        ticks.extend(v for v in (decade, 2 * decade, 5 * decade) if v <= peak)
        decade *= 10
    return ticks


def _fit_curve(analysis: ScalingAnalysis) -> pd.DataFrame:
    """Dense fitted curves per category (and the total) across measured + projected chips."""
    from tpuanalyze.analyzer.scaling import factors_at, predict

    lo, hi = analysis.measured["chips"].min(), analysis.projection["chips"].max()
    grid = np.unique(np.concatenate([np.geomspace(lo, hi, 40), analysis.measured["chips"].astype(float)]))
    factors = factors_at(analysis.measured, grid)  # the measured table carries batch and epochs
    predictions = predict(analysis.fits, grid, factors)
    rows = []
    for category, values in predictions.items():
        for chips, value in zip(grid, values, strict=True):
            rows.append({"chips": chips, "category": _LABELS.get(category, category), "value": value})
    total = sum(predictions.values())
    for chips, value in zip(grid, total, strict=True):
        rows.append({"chips": chips, "category": "step (sum)", "value": value})
    return pd.DataFrame(rows)


def step_time_chart(analysis: ScalingAnalysis) -> alt.LayerChart:
    """Measured metric (points) and the fitted model (dashed, estimate) vs chips."""
    metric, unit = analysis.metric, analysis.unit
    measured = analysis.measured[["run", "chips", metric]].rename(columns={metric: "value"})
    projection = analysis.projection[["chips", f"{metric}_est", "error_est"]].rename(
        columns={f"{metric}_est": "value"})
    projection["low"] = projection["value"] * (1 - projection["error_est"].fillna(0))
    projection["high"] = projection["value"] * (1 + projection["error_est"].fillna(0))
    label = "step time" if metric == "step_time_ms" else "time to train"
    y = alt.Y("value:Q", title=f"{label} [{unit}]", scale=alt.Scale(zero=False))
    band = alt.Chart(projection).mark_area(opacity=0.15, color=TOTAL).encode(
        x=_x(), y=alt.Y("low:Q", title=f"{label} [{unit}]"), y2="high:Q",
        tooltip=[alt.Tooltip("chips:Q", format="d"),
                 alt.Tooltip("value:Q", title=f"estimate [{unit}]", format=".3f"),
                 alt.Tooltip("low:Q", title="estimate range from", format=".3f"),
                 alt.Tooltip("high:Q", title="estimate range to", format=".3f")])
    curve = _fit_curve(analysis)
    curve = curve[curve["category"] == "step (sum)"]
    line = alt.Chart(curve).mark_line(strokeDash=[6, 4], color=TOTAL).encode(
        x=_x(), y=y, tooltip=[alt.Tooltip("chips:Q", format="d"),
                              alt.Tooltip("value:Q", title=f"estimate [{unit}]", format=".3f")])
    points = alt.Chart(measured).mark_point(filled=True, size=80, color=MEASURED_POINT).encode(
        x=_x(), y=y, tooltip=["run:N", "chips:Q", alt.Tooltip("value:Q", title=f"measured [{unit}]",
                                                              format=".3f")])
    return (band + line + points).properties(
        width=420, height=260,
        title=f"{label} vs chips (dots measured; dashed fitted estimate, shaded its error range)")


def category_chart(analysis: ScalingAnalysis) -> alt.LayerChart | None:
    """Each category's time per step: measured points and fitted curves (estimates)."""
    categories = [c for c in analysis.fits if c in analysis.measured]
    if not categories:
        return None
    curves = _fit_curve(analysis)
    curves = curves[curves["category"] != "step (sum)"]
    measured = analysis.measured.melt(id_vars=["run", "chips"], value_vars=categories,
                                      var_name="category", value_name="value")
    measured["category"] = measured["category"].map(lambda c: _LABELS.get(c, c))
    names = [_LABELS.get(c, c) for c in analysis.fits]
    color = alt.Color("category:N", scale=alt.Scale(domain=names,
                                                    range=[_COLORS.get(c, "#888") for c in analysis.fits]))
    peak = float(max(curves["value"].max(), measured["value"].max()))
    y = alt.Y("value:Q", title=f"{analysis.unit} per step", scale=alt.Scale(type="symlog"),
              axis=alt.Axis(values=_symlog_ticks(peak) or alt.Undefined, format="~f"))
    lines = alt.Chart(curves).mark_line(strokeDash=[6, 4]).encode(
        x=_x(), y=y, color=color,
        tooltip=["category:N", alt.Tooltip("chips:Q", format="d"),
                 alt.Tooltip("value:Q", title=f"estimate [{analysis.unit}]", format=".3f")])
    points = alt.Chart(measured).mark_point(filled=True, size=60).encode(
        x=_x(), y=y, color=color,
        tooltip=["run:N", "category:N", alt.Tooltip("chips:Q", format="d"),
                 alt.Tooltip("value:Q", title=f"measured [{analysis.unit}]", format=".3f")])
    return (lines + points).properties(
        width=420, height=260, title="time per step by category (dots measured, dashed fitted estimate)")


def share_chart(analysis: ScalingAnalysis) -> alt.Chart | None:
    """Category shares of the step: measured runs and projected chip counts (lighter = estimate)."""
    categories = [c for c in analysis.fits if f"{c}_share_est" in analysis.projection]
    if not categories:
        return None
    rows = []
    measured_chips = set(analysis.measured["chips"].astype(int))
    for record in analysis.measured.to_dict(orient="records"):
        for c in categories:
            rows.append({"chips": str(int(record["chips"])), "category": _LABELS.get(c, c),
                         "share": record.get(f"{c}_share", 0.0), "kind": "measured"})
    for record in analysis.projection.to_dict(orient="records"):
        if int(record["chips"]) in measured_chips:
            continue
        for c in categories:
            rows.append({"chips": f"{int(record['chips'])} (est)", "category": _LABELS.get(c, c),
                         "share": record[f"{c}_share_est"], "kind": "estimate"})
    frame = pd.DataFrame(rows)
    order = list(dict.fromkeys(frame["chips"]))
    names = [_LABELS.get(c, c) for c in categories]
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("chips:N", sort=order, title="chips"),
        y=alt.Y("share:Q", stack="normalize", axis=alt.Axis(format="%"), title="share of step"),
        color=alt.Color("category:N", scale=alt.Scale(domain=names,
                                                      range=[_COLORS.get(c, "#888") for c in categories])),
        # Ordinal and sorted: Vega-Lite warns about opacity on an unsorted nominal field.
        opacity=alt.Opacity("kind:O", sort=["measured", "estimate"], title="source",
                            scale=alt.Scale(domain=["measured", "estimate"], range=[1.0, 0.45])),
        tooltip=["chips:N", "category:N", alt.Tooltip("share:Q", format=".1%"),
                 alt.Tooltip("kind:O", title="source")],
    ).properties(width=420, height=260, title="share of the step by category")


def efficiency_chart(analysis: ScalingAnalysis) -> alt.LayerChart:
    """Per-core throughput relative to the smallest run (scaling efficiency)."""
    measured = analysis.measured[["run", "chips", "per_core_throughput_rel"]]
    projection = analysis.projection[["chips", "per_core_throughput_rel_est"]]
    y = alt.Y("eff:Q", title="per-core throughput vs smallest run", axis=alt.Axis(format="%"))
    line = alt.Chart(projection.rename(columns={"per_core_throughput_rel_est": "eff"})).mark_line(
        strokeDash=[6, 4], color=EFFICIENCY).encode(
        x=_x(), y=y, tooltip=[alt.Tooltip("chips:Q", format="d"),
                              alt.Tooltip("eff:Q", title="estimate", format=".1%")])
    points = alt.Chart(measured.rename(columns={"per_core_throughput_rel": "eff"})).mark_point(
        filled=True, size=80, color=EFFICIENCY).encode(
        x=_x(), y=y, tooltip=["run:N", alt.Tooltip("chips:Q", format="d"),
                              alt.Tooltip("eff:Q", title="measured", format=".1%")])
    return (line + points).properties(width=420, height=260,
                                      title="scaling efficiency (dots measured, dashed fitted estimate)")


def charts_for(analysis: ScalingAnalysis) -> list[tuple[str, str, Any]]:
    """(title, caption, chart) blocks of one series, for the HTML report."""
    name = analysis.workload or "series"
    error = analysis.projection["error_est"].iloc[0]
    caption = (f"{name}: {analysis.batch_mode}; fitted per category, projections are estimates"
               + (f" (model error ~{error:.1%})" if error is not None and not pd.isna(error) else ""))
    blocks: list[tuple[str, str, Any]] = [(f"{name}: time vs chips", caption, step_time_chart(analysis))]
    for title, chart in (("time per step by category", category_chart(analysis)),
                         ("share of the step", share_chart(analysis)),
                         ("scaling efficiency", efficiency_chart(analysis))):
        if chart is not None:
            blocks.append((f"{name}: {title}", caption, chart))
    return blocks


def scaling_charts(items: Sequence[Any]) -> list[tuple[str, str, Any]]:
    """Chart blocks of every ScalingAnalysis in ``items`` for the HTML report.

    Other items (RunAnalysis objects) are skipped: their summaries state no chip count, so the report
    verb builds the series from the traces first (``cmd_report.scaling_series``).
    """
    return [block for item in items if isinstance(item, ScalingAnalysis) for block in charts_for(item)]


def scaling_html(analyses: Sequence[ScalingAnalysis], title: str = "tpuanalyze scaling") -> str:
    """The stand-alone scaling page (reports/scaling_page.py: the report's style, offline)."""
    from tpuanalyze.reports.scaling_page import scaling_html as page

    return page(analyses, title)


def dumps_specs(analyses: Sequence[ScalingAnalysis]) -> str:
    """The Vega-Lite specs as JSON (handy for tests and other front ends)."""
    return json.dumps([chart.to_dict() for a in analyses for _, _, chart in charts_for(a)])
