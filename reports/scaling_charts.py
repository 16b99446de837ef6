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
    BOUNDARY,
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
    boundaries = _boundaries(analysis)
    hi = float(analysis.projection["chips"].max())
    boundaries = boundaries[boundaries["chips"] <= hi]
    lo = float(analysis.measured["chips"].min())
    return alt.layer(band, line, points, *_rules(boundaries, lo, hi)).properties(
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


# --- the time-to-train model (MLPerf series, and trace series placed in it) -----------------------------

# palette colors no category wears: measured dots, the estimate, regime boundaries
_MEASURED, _ESTIMATE, _BOUNDARY = MEASURED_POINT, TOTAL, BOUNDARY


def _boundaries(analysis: ScalingAnalysis) -> pd.DataFrame:
    """Regime boundaries of a series (estimates): the data-parallel limit and where the non-shrinking
    step passes compute (``analysis.limits``)."""
    rows = []
    limits = analysis.limits
    if limits:
        cap = limits["convergence_cap_batch"]
        rows.append({"chips": limits["data_parallel_limit_chips"],
                     "boundary": f"data-parallel limit (1 per core at batch {cap})"})
        if limits.get("fixed_passes_compute_chips"):
            rows.append({"chips": limits["fixed_passes_compute_chips"],
                         "boundary": "non-shrinking step > compute"})
    out = pd.DataFrame(rows, columns=["chips", "boundary"]).sort_values("chips", ignore_index=True)
    out["label_y"] = 4 + 13 * np.arange(len(out))   # pixels from the top: labels never overlap
    return out


def _grid(analysis: ScalingAnalysis, boundaries: pd.DataFrame) -> np.ndarray:
    lo = float(analysis.measured["chips"].min())
    hi = float(analysis.projection["chips"].max())
    if not boundaries.empty:
        hi = max(hi, min(float(boundaries["chips"].max()) * 2, hi * 16))
    steps = int(round(2 * np.log2(hi / lo))) + 1
    return np.unique(np.concatenate([lo * np.exp2(np.arange(steps) / 2), analysis.measured["chips"]]))


def _rules(boundaries: pd.DataFrame, lo: float, hi: float) -> list[alt.Chart]:
    """Vertical rules at the boundaries, labelled to the right of the rule in the left part of the
    axis [lo, hi] and to its left in the right part (labels stay inside the plot)."""
    if boundaries.empty:
        return []
    tooltip = [alt.Tooltip("boundary:N", title="regime boundary (estimate)"),
               alt.Tooltip("chips:Q", format="d")]
    layers: list[alt.Chart] = [alt.Chart(boundaries).mark_rule(color=_BOUNDARY, strokeWidth=2).encode(
        x=_x(), tooltip=tooltip)]
    position = np.log(boundaries["chips"].astype(float) / lo) / max(np.log(hi / lo), 1e-9)
    for side, rows in (("left", boundaries[position < 0.6]), ("right", boundaries[position >= 0.6])):
        if rows.empty:
            continue
        layers.append(alt.Chart(rows).mark_text(
            align=side, dx=4 if side == "left" else -4, fontSize=10, color="#2f6f6a", baseline="top").encode(
            x=_x(), y=alt.Y("label_y:Q", scale=None, axis=None), text="boundary:N", tooltip=tooltip))
    return layers


def _ttt_frames(analysis: ScalingAnalysis) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(measured, estimate curve with its band, boundaries) of a time-to-train series."""
    boundaries = _boundaries(analysis)
    error = float((analysis.time_to_train or {}).get("loo_error") or 0.0)
    grid = _grid(analysis, boundaries)
    curve = analysis.model.curve(grid)
    examples = float(analysis.measured["examples_per_epoch"].iloc[-1])
    cores = curve["chips"] * analysis.model.cores_per_chip
    curve["throughput"] = curve["epochs_est"] * examples / (curve["time_to_train_s_est"] * cores)
    curve["low"], curve["high"] = curve["time_to_train_s_est"] * (1 - error), \
        curve["time_to_train_s_est"] * (1 + error)
    curve["throughput_low"] = curve["throughput"] / (1 + error)
    curve["throughput_high"] = curve["throughput"] / max(1 - error, 1e-3)
    curve["error"] = error
    measured = analysis.measured[["run", "chips", "time_to_train_s", "per_core_examples_per_s",
                                  "global_batch", "epochs"]].copy()
    return measured, curve, boundaries


def time_to_train_chart(analysis: ScalingAnalysis) -> alt.LayerChart:
    """Time to train vs chips: logged points, the model's projection (dashed) with its leave-one-out
    band, and the regime boundaries (estimates)."""
    measured, curve, boundaries = _ttt_frames(analysis)
    y = alt.Y("time_to_train_s_est:Q", title="time to train [s]", scale=alt.Scale(type="log"))
    tips = [alt.Tooltip("chips:Q", format="d"),
            alt.Tooltip("global_batch:Q", title="global batch", format="d"),
            alt.Tooltip("epochs_est:Q", title="epochs (estimate)", format=".1f"),
            alt.Tooltip("time_to_train_s_est:Q", title="time to train, estimate [s]", format=".1f")]
    band = alt.Chart(curve).mark_area(opacity=0.15, color=_ESTIMATE).encode(
        x=_x(), y=alt.Y("low:Q", title="time to train [s]", scale=alt.Scale(type="log")), y2="high:Q",
        tooltip=tips + [alt.Tooltip("low:Q", title="estimate range from", format=".1f"),
                        alt.Tooltip("high:Q", title="estimate range to", format=".1f")])
    line = alt.Chart(curve).mark_line(strokeDash=[6, 4], color=_ESTIMATE).encode(x=_x(), y=y, tooltip=tips)
    points = alt.Chart(measured).mark_point(filled=True, size=80, color=_MEASURED).encode(
        x=_x(), y=alt.Y("time_to_train_s:Q", scale=alt.Scale(type="log")),
        tooltip=["run:N", alt.Tooltip("chips:Q", format="d"),
                 alt.Tooltip("global_batch:Q", title="global batch", format="d"),
                 alt.Tooltip("time_to_train_s:Q", title="logged time to train [s]", format=".1f")])
    layers = [band, line, points] + _rules(boundaries, curve["chips"].min(), curve["chips"].max())
    return alt.layer(*layers).properties(
        width=420, height=260,
        title="time to train vs chips (dots logged; dashed model estimate, shaded leave-one-out error)")


def throughput_chart(analysis: ScalingAnalysis) -> alt.LayerChart:
    """Examples per second per core vs chips: logged, projected (estimate) and the regime boundaries."""
    measured, curve, boundaries = _ttt_frames(analysis)
    title = "examples/s per core"
    tips = [alt.Tooltip("chips:Q", format="d"), alt.Tooltip("per_core_batch:Q", title="per-core batch"),
            alt.Tooltip("throughput:Q", title=f"{title}, estimate", format=".1f")]
    band = alt.Chart(curve).mark_area(opacity=0.15, color=EFFICIENCY).encode(
        x=_x(), y=alt.Y("throughput_low:Q", title=title, scale=alt.Scale(type="log")),
        y2="throughput_high:Q", tooltip=tips)
    line = alt.Chart(curve).mark_line(strokeDash=[6, 4], color=EFFICIENCY).encode(
        x=_x(), y=alt.Y("throughput:Q", scale=alt.Scale(type="log")), tooltip=tips)
    points = alt.Chart(measured).mark_point(filled=True, size=80, color=_MEASURED).encode(
        x=_x(), y=alt.Y("per_core_examples_per_s:Q", scale=alt.Scale(type="log")),
        tooltip=["run:N", alt.Tooltip("chips:Q", format="d"),
                 alt.Tooltip("per_core_examples_per_s:Q", title=f"{title}, logged", format=".1f")])
    rules = _rules(boundaries, curve["chips"].min(), curve["chips"].max())
    return alt.layer(band, line, points, *rules).properties(
        width=420, height=260, title="per-core throughput vs chips (dots logged; dashed estimate)")


def step_split_chart(analysis: ScalingAnalysis) -> alt.LayerChart:
    """The model's step: what shrinks with the per-core batch vs what does not (estimates)."""
    _, curve, boundaries = _ttt_frames(analysis)
    parts = curve.melt(id_vars=["chips", "per_core_batch"],
                       value_vars=["step_time_ms_est", "compute_ms_est", "fixed_ms_est"],
                       var_name="part", value_name="ms")
    names = {"step_time_ms_est": "step (sum)", "compute_ms_est": "compute + input (shrinks with b)",
             "fixed_ms_est": "all-reduce + update + overhead"}
    parts["part"] = parts["part"].map(names)
    color = alt.Color("part:N", title="step part", scale=alt.Scale(
        domain=list(names.values()), range=["#555555", CATEGORY_COLORS.get("compute", "#4c78a8"),
                                            CATEGORY_COLORS.get("collectives", "#f58518")]))
    lines = alt.Chart(parts).mark_line(strokeDash=[6, 4]).encode(
        x=_x(), y=alt.Y("ms:Q", title="ms per step (estimate)", scale=alt.Scale(type="log")), color=color,
        tooltip=["part:N", alt.Tooltip("chips:Q", format="d"), alt.Tooltip("per_core_batch:Q"),
                 alt.Tooltip("ms:Q", title="ms per step, estimate", format=".2f")])
    measured = analysis.measured[["run", "chips", "step_time_ms"]]
    points = alt.Chart(measured).mark_point(filled=True, size=60, color=_MEASURED).encode(
        x=_x(), y=alt.Y("step_time_ms:Q", scale=alt.Scale(type="log")),
        tooltip=["run:N", alt.Tooltip("chips:Q", format="d"),
                 alt.Tooltip("step_time_ms:Q", title="step from the logs [ms, est]", format=".2f")])
    rules = _rules(boundaries, curve["chips"].min(), curve["chips"].max())
    return alt.layer(lines, points, *rules).properties(
        width=420, height=260, title="step split (dots: logged step; dashed: the model's two parts)")


def _time_to_train_blocks(analysis: ScalingAnalysis) -> list[tuple[str, str, Any]]:
    name = analysis.workload or "series"
    ttt = analysis.time_to_train or {}
    error = ttt.get("loo_error")
    caption = (f"{name}: time = epochs(batch) x steps x step(per-core batch, partitioning) + evals; "
               f"projections are estimates (leave-one-out error ~{error:.1%}); past the largest run the "
               f"batch is {ttt.get('batch_assumption')}")
    return [(f"{name}: time to train vs chips", caption, time_to_train_chart(analysis)),
            (f"{name}: per-core throughput", caption, throughput_chart(analysis)),
            (f"{name}: step split", caption, step_split_chart(analysis))]


def trace_time_to_train_chart(analysis: ScalingAnalysis) -> alt.LayerChart | None:
    """A trace series in its benchmark's time-to-train model: estimates from the traces' steps, with
    the logged results at the same chips beside them."""
    ttt = analysis.time_to_train
    if not ttt or not ttt.get("projection"):
        return None
    rows = pd.DataFrame(ttt["projection"])
    error = float(ttt.get("loo_error_logs") or 0.0)
    rows["low"] = rows["time_to_train_s_est"] * (1 - error)
    rows["high"] = rows["time_to_train_s_est"] * (1 + error)
    tips = [alt.Tooltip("chips:Q", format="d"),
            alt.Tooltip("global_batch:Q", title="global batch", format="d"),
            alt.Tooltip("time_to_train_s_est:Q", title="time to train, estimate [s]", format=".1f")]
    band = alt.Chart(rows).mark_area(opacity=0.15, color=_ESTIMATE).encode(
        x=_x(), y=alt.Y("low:Q", title="time to train [s]", scale=alt.Scale(type="log")), y2="high:Q",
        tooltip=tips)
    line = alt.Chart(rows).mark_line(strokeDash=[6, 4], color=_ESTIMATE, point=False).encode(
        x=_x(), y=alt.Y("time_to_train_s_est:Q", scale=alt.Scale(type="log")), tooltip=tips)
    layers: list[alt.Chart] = [band, line]
    joined = pd.DataFrame(analysis.joined)
    if not joined.empty:
        layers.append(alt.Chart(joined).mark_point(filled=True, size=80, color=_MEASURED).encode(
            x=_x(), y=alt.Y("logged_time_to_train_s:Q", scale=alt.Scale(type="log")),
            tooltip=[alt.Tooltip("chips:Q", format="d"), "mlperf_run:N",
                     alt.Tooltip("logged_time_to_train_s:Q", title="logged time to train [s]", format=".1f"),
                     alt.Tooltip("time_to_train_from_trace_s_est:Q", title="from the trace [s, est]",
                                 format=".1f"),
                     alt.Tooltip("difference:Q", format="+.1%")]))
    return alt.layer(*layers).properties(
        width=420, height=260,
        title=f"time to train from the traces (dashed, estimate) with {ttt['from_logs']}'s epochs; "
              "dots logged")


def charts_for(analysis: ScalingAnalysis) -> list[tuple[str, str, Any]]:
    """(title, caption, chart) blocks of one series, for the HTML report."""
    if analysis.model is not None:
        return _time_to_train_blocks(analysis)
    name = analysis.workload or "series"
    error = analysis.projection["error_est"].iloc[0]
    caption = (f"{name}: {analysis.batch_mode}; fitted per category, projections are estimates"
               + (f" (model error ~{error:.1%})" if error is not None and not pd.isna(error) else ""))
    blocks: list[tuple[str, str, Any]] = [(f"{name}: time vs chips", caption, step_time_chart(analysis))]
    for title, chart in (("time per step by category", category_chart(analysis)),
                         ("share of the step", share_chart(analysis)),
                         ("scaling efficiency", efficiency_chart(analysis)),
                         ("time to train", trace_time_to_train_chart(analysis))):
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
