"""Altair charts of one analysed run, each built from one RunAnalysis DataFrame.

Every function takes the DataFrame with the columns documented in the analyzer contract and
returns an ``alt.Chart`` (or layer), or ``None`` when the frame holds nothing to draw (a CPU trace
has no collectives): the HTML report then shows a short "not in this trace" note instead.

Charts aggregate before they draw, so a 4096-core run costs a few thousand marks, not one per
trace event: per-step means across cores, a per-host heatmap once there are too many cores to
show one row each, the top ops only. Every mark has a tooltip.
"""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

# One palette for every chart and table (reports/palette.py); re-exported here for older imports.
from tpuanalyze.reports.palette import (
    CATEGORIES,
    CATEGORY_COLORS,
    CATEGORY_LABELS,
    COLLECTIVES_OVERLAPPED,
    ROOFLINE,
    natural_sorted,
)

PS_PER_MS = 1e9

# Above this many cores the heatmap shows hosts (max over the host's cores) instead of cores.
MAX_HEATMAP_CORE_ROWS = 64
# Above this many steps the per-step charts fold consecutive steps into bins of equal width.
MAX_STEP_COLUMNS = 120
# The heatmap folds steps into bins to stay under this many cells (512 hosts x 10 steps fits).
MAX_HEATMAP_CELLS = 6000
# The heatmap's color scale spans at least this fraction of the median step on each side of the median.
HEATMAP_MIN_SPAN = 0.05
# Ops and bars beyond these counts are left to the tables / SQL.
TOP_OPS = 20
MAX_INPUT_BARS = 64


def _category_scale(categories: list[str] | None = None) -> alt.Scale:
    cats = categories or CATEGORIES
    return alt.Scale(domain=[CATEGORY_LABELS[c] for c in cats], range=[CATEGORY_COLORS[c] for c in cats])


def _empty(frame: pd.DataFrame | None) -> bool:
    return frame is None or len(frame) == 0


def _ps_column(frame: pd.DataFrame, category: str) -> pd.Series:
    """The category's picoseconds per step row; absent columns count as zero (e.g. no output)."""
    column = f"{category}_ps"
    if column in frame.columns:
        return frame[column].fillna(0).astype("float64")
    return pd.Series(0.0, index=frame.index)


def step_category_ms(steps: pd.DataFrame) -> pd.DataFrame:
    """Per-step-row milliseconds of each category; an eval step's whole duration is eval.

    The design contract decides eval first, by program: every instant of an eval step is eval.
    """
    is_eval = steps["is_eval"].fillna(False).astype(bool) if "is_eval" in steps.columns else False
    out = pd.DataFrame({"step_num": steps["step_num"]})
    for category in CATEGORIES:
        if category == "eval":
            eval_ps = _ps_column(steps, "eval")
            whole = steps["duration_ps"].astype("float64")
            out["eval"] = eval_ps.where(~is_eval, whole) / PS_PER_MS
        else:
            out[category] = _ps_column(steps, category).where(~is_eval, 0.0) / PS_PER_MS
    out["is_eval"] = is_eval
    return out


def step_bins(step_nums: pd.Series, max_columns: int = MAX_STEP_COLUMNS) -> tuple[pd.Series, int]:
    """Label each step with its bin's first step; bins of equal width keep <= max_columns columns."""
    unique = sorted(step_nums.dropna().unique())
    if len(unique) <= max_columns:
        return step_nums, 1
    width = math.ceil(len(unique) / max_columns)
    rank = {s: i for i, s in enumerate(unique)}
    first = {s: unique[(rank[s] // width) * width] for s in unique}
    return step_nums.map(first), width


def step_breakdown_chart(steps: pd.DataFrame) -> alt.Chart | None:
    """Stacked bars: where each step's time goes, mean over the cores (eval steps in green)."""
    if _empty(steps):
        return None
    per_row = step_category_ms(steps)
    per_row["step"], width = step_bins(per_row["step_num"])
    per_step = per_row.groupby("step", as_index=False)[CATEGORIES].mean()
    per_step["total_ms"] = per_step[CATEGORIES].sum(axis=1)
    long = per_step.melt(id_vars=["step", "total_ms"], value_vars=CATEGORIES, var_name="cat", value_name="ms")
    long = long[long["ms"] > 0].copy()
    long["category"] = long["cat"].map(CATEGORY_LABELS)
    long["share"] = long["ms"] / long["total_ms"].where(long["total_ms"] > 0, 1)
    long["order"] = long["cat"].map({c: i for i, c in enumerate(CATEGORIES)})
    step_title = "step" if width == 1 else f"step (bins of {width})"
    present = [c for c in CATEGORIES if c in set(long["cat"])]
    return (
        alt.Chart(long.drop(columns=["cat"]))
        .mark_bar()
        .encode(
            x=alt.X("step:O", title=step_title),
            y=alt.Y("sum(ms):Q", title="ms per step (mean over cores)", stack="zero"),
            color=alt.Color("category:N", scale=_category_scale(present), title="category"),
            order=alt.Order("order:Q"),
            tooltip=[
                alt.Tooltip("step:O", title=step_title),
                alt.Tooltip("category:N"),
                alt.Tooltip("ms:Q", format=".3f", title="ms (mean over cores)"),
                alt.Tooltip("share:Q", format=".1%", title="share of step"),
                alt.Tooltip("total_ms:Q", format=".3f", title="step ms"),
            ],
        )
        .properties(width="container", height=280)
    )


def category_shares_chart(breakdowns: dict[str, dict[str, float]]) -> alt.Chart | None:
    """One horizontal stacked bar per run: the share of wall time of each category (sums to 1)."""
    rows = []
    for run, breakdown in breakdowns.items():
        for order, category in enumerate(CATEGORIES):
            share = float(breakdown.get(category) or 0.0)
            if share > 0:
                rows.append(
                    {
                        "run": run,
                        "category": CATEGORY_LABELS[category],
                        "share": share,
                        "order": order,
                        "cat": category,
                    }
                )
    if not rows:
        return None
    frame = pd.DataFrame(rows)
    frame["label"] = frame["share"].map(lambda s: f"{s:.0%}" if s >= 0.04 else "")
    present = [c for c in CATEGORIES if c in set(frame["cat"])]
    frame = frame.drop(columns=["cat"])
    base = alt.Chart(frame).encode(
        y=alt.Y(
            "run:N", title=None, sort=list(breakdowns), axis=alt.Axis(labels=len(breakdowns) > 1, ticks=False)
        ),
        x=alt.X(
            "share:Q",
            stack="zero",
            title="share of wall time",
            axis=alt.Axis(format="%"),
            scale=alt.Scale(domain=[0, 1]),
        ),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("category:N"), alt.Tooltip("share:Q", format=".1%")],
    )
    bars = base.mark_bar().encode(
        color=alt.Color(
            "category:N",
            scale=_category_scale(present),
            title=None,
            legend=alt.Legend(orient="bottom", direction="horizontal", columns=4, symbolType="square"),
        )
    )
    # Labels sit at each segment's middle (computed here: text marks do not center in stacks).
    frame_mid = frame.copy()
    frame_mid["mid"] = frame_mid.groupby("run")["share"].cumsum() - frame_mid["share"] / 2
    labels = (
        alt.Chart(frame_mid)
        .mark_text(align="center", baseline="middle", color="white", fontWeight="bold")
        .encode(
            y=alt.Y("run:N", sort=list(breakdowns)),
            x=alt.X("mid:Q"),
            text="label:N",
            tooltip=[alt.Tooltip("run:N"), alt.Tooltip("category:N"), alt.Tooltip("share:Q", format=".1%")],
        )
    )
    return alt.layer(bars, labels).properties(width="container", height=max(60, 44 * len(breakdowns)))


def _core_label(host: pd.Series, ordinal: pd.Series) -> pd.Series:
    return host.astype(str) + " : " + ordinal.astype("Int64").astype(str)


# What the heatmap can color by (a selector in the chart); own time first: in synchronous training
# every core's step lasts as long as the slowest core's, so step time alone hides the straggler.
HEATMAP_METRICS = {
    "own_ms": "own time (step minus exposed collectives)",
    "step_ms": "step time",
    "input_ms": "input wait",
    "collectives_ms": "exposed collectives",
}


def step_time_heatmap(steps: pd.DataFrame) -> alt.Chart | None:
    """Per core (or host, when there are many cores) and step: own time, step time, input, collectives.

    A straggler is a dark row in own time (the others wait for it inside the collectives, so their
    own time is lower); a slow step is a dark column. Eval steps are left out (their length would
    swamp the color scale). Above MAX_HEATMAP_CORE_ROWS cores a row is a host, shown by its core
    with the most own time in that step.
    """
    if _empty(steps):
        return None
    train = steps[~steps["is_eval"].fillna(False).astype(bool)] if "is_eval" in steps.columns else steps
    if train.empty:
        return None
    frame = pd.DataFrame(
        {
            "host": train["host"].astype(str),
            "device_ordinal": train["device_ordinal"],
            "step_ms": train["duration_ps"].astype("float64") / PS_PER_MS,
            "input_ms": _ps_column(train, "input") / PS_PER_MS,
            "collectives_ms": _ps_column(train, "collectives") / PS_PER_MS,
        }
    )
    frame["own_ms"] = frame["step_ms"] - frame["collectives_ms"]
    metrics = list(HEATMAP_METRICS)
    n_cores = frame[["host", "device_ordinal"]].drop_duplicates().shape[0]
    n_rows = n_cores if n_cores <= MAX_HEATMAP_CORE_ROWS else frame["host"].nunique()
    max_columns = max(10, min(MAX_STEP_COLUMNS, MAX_HEATMAP_CELLS // max(1, n_rows)))
    frame["step"], width = step_bins(train["step_num"], max_columns)
    frame["core"] = _core_label(frame["host"], frame["device_ordinal"])
    per_core = frame.groupby(["host", "core", "step"], as_index=False)[metrics].mean()
    if n_cores <= MAX_HEATMAP_CORE_ROWS:
        cells = per_core.assign(row=per_core["core"])
        row_title = "core (host : ordinal)"
    else:
        idx = per_core.groupby(["host", "step"])["own_ms"].idxmax()
        cells = per_core.loc[idx].assign(row=lambda d: d["host"]).reset_index(drop=True)
        row_title = "host (its core with most own time)"
    cells = cells[["row", "core", "step", *metrics]].copy()
    if cells.empty:  # no step has a number (all NULL: too large for BIGINT in the trace): no heatmap
        return None
    # Color = distance from the median cell of the metric (computed by Vega: no extra data inlined), on
    # a scale at least HEATMAP_MIN_SPAN of the median step wide: a healthy pod (every core within 0.5%)
    # stays near the neutral middle.
    span = HEATMAP_MIN_SPAN * float(cells["step_ms"].median() or 0.0)
    for m in metrics:
        span = max(span, float((cells[m] - cells[m].median()).abs().max() or 0.0))
    span = span if math.isfinite(span) and span > 0 else 1.0  # NaN is truthy: `or` would keep it
    cells[metrics] = cells[metrics].round(4)  # 0.1 us: finer than any color step or tooltip digit
    n_rows = cells["row"].nunique()
    row_order = natural_sorted(cells["row"].unique())
    step_title = "step" if width == 1 else f"step (bins of {width})"
    cell_height = 14 if n_rows <= 64 else max(2, int(900 / n_rows))
    metric = alt.param(
        name="heat_metric",
        value="own_ms",
        bind=alt.binding_select(options=metrics, labels=list(HEATMAP_METRICS.values()), name="color by: "),
    )
    return (
        alt.Chart(cells)
        .mark_rect()
        .transform_joinaggregate(**{f"{m}_median": f"median({m})" for m in metrics})
        .transform_calculate(value="datum[heat_metric] - datum[heat_metric + '_median']")
        .encode(
            x=alt.X("step:O", title=step_title),
            y=alt.Y(
                "row:N",
                title=row_title,
                sort=row_order,
                axis=alt.Axis(labels=n_rows <= 64, ticks=n_rows <= 64),
            ),
            color=alt.Color(
                "value:Q",
                title="ms vs median",
                scale=alt.Scale(scheme="blueorange", domain=[-span, span], domainMid=0, clamp=True),
            ),
            tooltip=[
                alt.Tooltip("row:N", title=row_title),
                alt.Tooltip("core:N"),
                alt.Tooltip("step:O", title=step_title),
                *[
                    alt.Tooltip(f"{m}:Q", format=".3f", title=f"{label} ms")
                    for m, label in HEATMAP_METRICS.items()
                ],
            ],
        )
        .add_params(metric)
        .properties(width="container", height=min(1000, max(120, cell_height * n_rows)))
    )


def collectives_by_kind_chart(collectives: pd.DataFrame) -> alt.Chart | None:
    """Per kind of collective: exposed vs overlapped (hidden under compute) milliseconds per step."""
    if _empty(collectives):
        return None
    grouped = collectives.groupby("kind", as_index=False).agg(
        exposed=("exposed_ms_per_step", "sum"),
        overlapped=("overlapped_ms_per_step", "sum"),
        count=("count_per_step", "sum"),
        bytes=("bytes", "sum"),
    )
    long = grouped.melt(
        id_vars=["kind", "count", "bytes"],
        value_vars=["exposed", "overlapped"],
        var_name="time",
        value_name="ms",
    )
    long["mb"] = long["bytes"] / 1e6
    return (
        alt.Chart(long)
        .mark_bar()
        .encode(
            y=alt.Y("kind:N", title=None, sort="-x"),
            x=alt.X("sum(ms):Q", title="ms per step", stack="zero"),
            color=alt.Color(
                "time:N",
                title="time",
                scale=alt.Scale(
                    domain=["exposed", "overlapped"],
                    range=[CATEGORY_COLORS["collectives"], COLLECTIVES_OVERLAPPED],
                ),
            ),
            tooltip=[
                alt.Tooltip("kind:N"),
                alt.Tooltip("time:N", title="exposed / overlapped"),
                alt.Tooltip("ms:Q", format=".3f", title="ms per step"),
                alt.Tooltip("count:Q", format=".1f", title="ops per step"),
                alt.Tooltip("mb:Q", format=",.2f", title="MB (sum of op sizes)"),
            ],
        )
        .properties(width="container", height=max(80, 36 * grouped.shape[0]))
    )


def collectives_size_chart(collectives: pd.DataFrame) -> alt.Chart | None:
    """Each kind of collective as a point: its median message size per op vs its time per step.

    Many small ones are latency bound (catalog §3.5). ``bytes`` (payload per device step) is in the
    tooltip; the x axis is the size of one op, what the latency/bandwidth trade-off depends on."""
    if _empty(collectives):
        return None
    frame = collectives.copy()
    frame["bytes"] = pd.to_numeric(frame["bytes"], errors="coerce")
    if "median_op_bytes" in frame.columns:
        frame["op_bytes"] = pd.to_numeric(frame["median_op_bytes"], errors="coerce")
    else:
        frame["op_bytes"] = frame["bytes"] / frame["count_per_step"].where(frame["count_per_step"] > 0)
    frame = frame[frame["op_bytes"] > 0]  # sizes unknown (no shapes in the trace): nothing to place
    if frame.empty:
        return None
    frame["total_ms"] = frame["exposed_ms_per_step"].fillna(0) + frame["overlapped_ms_per_step"].fillna(0)
    frame["op_bytes"] = frame["op_bytes"].astype("float64").clip(lower=1)
    frame["dtype"] = frame["dtype"].fillna("?").astype(str) if "dtype" in frame.columns else "?"
    frame["sync_ms"] = frame["sync_ms"] if "sync_ms" in frame.columns else float("nan")
    frame["compute_ms"] = frame["compute_ms"] if "compute_ms" in frame.columns else float("nan")
    cols = [
        "kind",
        "op_bytes",
        "bytes",
        "dtype",
        "count_per_step",
        "exposed_ms_per_step",
        "overlapped_ms_per_step",
        "total_ms",
        "compute_ms",
        "sync_ms",
    ]
    return (
        alt.Chart(frame[cols])
        .mark_circle(opacity=0.75, stroke="#333", strokeWidth=0.5)
        .encode(
            x=alt.X(
                "op_bytes:Q",
                scale=alt.Scale(type="log"),
                title="bytes per op (median over the kind's ops)",
                axis=alt.Axis(format="~s"),
            ),
            y=alt.Y("total_ms:Q", title="ms per step (exposed + overlapped)"),
            color=alt.Color("kind:N", title="kind"),
            size=alt.Size("count_per_step:Q", title="ops per step", scale=alt.Scale(range=[40, 600])),
            tooltip=[
                alt.Tooltip("kind:N"),
                alt.Tooltip("dtype:N"),
                alt.Tooltip("op_bytes:Q", format=",.0f", title="bytes per op (median)"),
                alt.Tooltip("bytes:Q", format=",.0f", title="bytes per step (all ops of the kind)"),
                alt.Tooltip("count_per_step:Q", format=".1f", title="ops per step"),
                alt.Tooltip("exposed_ms_per_step:Q", format=".3f", title="exposed ms/step"),
                alt.Tooltip("overlapped_ms_per_step:Q", format=".3f", title="overlapped ms/step"),
                alt.Tooltip("compute_ms:Q", format=".3f", title="compute ms (min over cores)"),
                alt.Tooltip("sync_ms:Q", format=".3f", title="sync ms (waiting)"),
            ],
        )
        .properties(width="container", height=260)
    )


def input_wait_chart(input_frame: pd.DataFrame) -> alt.Chart | None:
    """Infeed wait per core (or per host: max and mean over its cores) per step, hosts in natural order
    (w-2 before w-10), so a slow host stands out where it sits."""
    if _empty(input_frame):
        return None
    frame = input_frame.copy()
    frame["host"] = frame["host"].astype(str)
    frame["infeed_ms_per_step"] = frame["infeed_ms_per_step"].astype("float64").fillna(0)
    if frame.shape[0] <= MAX_INPUT_BARS:
        frame["core"] = _core_label(frame["host"], frame["device_ordinal"])
        order = natural_sorted(frame["core"].unique())
        mean = float(frame["infeed_ms_per_step"].mean()) or 1.0
        frame["vs_mean"] = frame["infeed_ms_per_step"] / mean
        return (
            alt.Chart(frame[["core", "host", "infeed_ms_per_step", "vs_mean"]])
            .mark_bar(color=CATEGORY_COLORS["input"])
            .encode(
                x=alt.X("core:N", sort=order, title="core (host : ordinal)", axis=alt.Axis(labelAngle=-60)),
                y=alt.Y("infeed_ms_per_step:Q", title="infeed ms per step"),
                tooltip=[
                    alt.Tooltip("core:N"),
                    alt.Tooltip("infeed_ms_per_step:Q", format=".3f", title="infeed ms/step"),
                    alt.Tooltip("vs_mean:Q", format=".2f", title="x mean over cores"),
                ],
            )
            .properties(width="container", height=240)
        )
    per_host = frame.groupby("host", as_index=False).agg(
        max_ms=("infeed_ms_per_step", "max"),
        mean_ms=("infeed_ms_per_step", "mean"),
        cores=("infeed_ms_per_step", "size"),
    )
    per_host = per_host.sort_values("max_ms", ascending=False).head(MAX_INPUT_BARS)
    per_host = per_host.set_index("host").loc[natural_sorted(per_host["host"])].reset_index()
    tooltip = [
        alt.Tooltip("host:N"),
        alt.Tooltip("max_ms:Q", format=".3f", title="max over cores ms/step"),
        alt.Tooltip("mean_ms:Q", format=".3f", title="mean over cores ms/step"),
        alt.Tooltip("cores:Q"),
    ]
    x = alt.X(
        "host:N",
        sort=per_host["host"].tolist(),  # explicit order: both layers agree (a field sort would conflict)
        title=f"host (the {per_host.shape[0]} with most input wait, in host order)",
        axis=alt.Axis(labelAngle=-60),
    )
    bars = (
        alt.Chart(per_host)
        .mark_bar(color=CATEGORY_COLORS["input"])
        .encode(
            x=x, y=alt.Y("max_ms:Q", title="infeed ms per step (bar: max core, tick: mean)"), tooltip=tooltip
        )
    )
    ticks = (
        alt.Chart(per_host).mark_tick(color="#222", thickness=2).encode(x=x, y="mean_ms:Q", tooltip=tooltip)
    )
    return alt.layer(bars, ticks).properties(width="container", height=240)


def top_ops_chart(ops: pd.DataFrame) -> alt.Chart | None:
    """The ops that take the most device time, colored by attribution category (the palette)."""
    if _empty(ops):
        return None
    top = ops.sort_values("self_time_ms", ascending=False).head(TOP_OPS).copy()
    for column in ("share", "flops", "bytes_accessed", "flop_utilization", "count", "operational_intensity",
                   "achieved_fraction"):
        if column not in top.columns:
            top[column] = float("nan")
    for column in ("hlo_category", "tf_op", "source", "bound_by"):
        top[column] = top[column].fillna("").astype(str) if column in top.columns else ""
    top["cat"] = top["category"].map(lambda c: c if c in CATEGORY_LABELS else "compute")
    top["category"] = top["cat"].map(CATEGORY_LABELS)
    top["name"] = top["name"].astype(str).map(lambda s: s if len(s) <= 60 else s[:57] + "...")
    cols = [
        "name",
        "category",
        "hlo_category",
        "tf_op",
        "source",
        "count",
        "self_time_ms",
        "share",
        "flops",
        "bytes_accessed",
        "flop_utilization",
        "operational_intensity",
        "bound_by",
        "achieved_fraction",
    ]
    present = [c for c in CATEGORIES if c in set(top["cat"])]
    top = top.replace([np.inf, -np.inf], np.nan)
    return (
        alt.Chart(top[cols])
        .mark_bar()
        .encode(
            y=alt.Y("name:N", sort="-x", title=None, axis=alt.Axis(labelLimit=320)),
            x=alt.X("self_time_ms:Q", title="self time ms (all cores, whole capture)"),
            color=alt.Color("category:N", title="category", scale=_category_scale(present)),
            tooltip=[
                alt.Tooltip("name:N"),
                alt.Tooltip("category:N"),
                alt.Tooltip("hlo_category:N", title="HLO category"),
                alt.Tooltip("tf_op:N", title="framework op"),
                alt.Tooltip("source:N"),
                alt.Tooltip("count:Q", format=",.0f"),
                alt.Tooltip("self_time_ms:Q", format=",.3f", title="self time ms"),
                alt.Tooltip("share:Q", format=".2%", title="share of op time (all ops, all cores)"),
                alt.Tooltip("flops:Q", format=".3~s"),
                alt.Tooltip("bytes_accessed:Q", format=".3~s", title="bytes accessed"),
                alt.Tooltip("flop_utilization:Q", format=".1%", title="FLOP utilization"),
                alt.Tooltip("operational_intensity:Q", format=",.2f", title="FLOPs per byte"),
                alt.Tooltip("bound_by:N", title="bound by"),
                alt.Tooltip("achieved_fraction:Q", format=".1%", title="of its roof"),
            ],
        )
        .properties(width="container", height=max(120, 20 * top.shape[0]))
    )


# The roofline plots this many ops at most (by self time); the rest are in the ops table and JSON.
ROOFLINE_OPS = 60


def roofline_chart(ops: pd.DataFrame, roofline: dict | None) -> alt.LayerChart | None:
    """Ops (and the whole program) on the roofline: FLOPs per byte vs achieved TFLOP/s, log-log.

    The roof is the device's: HBM bandwidth x intensity left of the ridge point, the peak FLOP rate
    right of it. Ops without FLOPs or bytes cannot sit on a log axis and stay in the table.
    """
    if _empty(ops) or not roofline or not roofline.get("peak_tflops") or not roofline.get("peak_hbm_gbps"):
        return None
    if "operational_intensity" not in ops.columns:
        return None
    frame = ops.copy()
    frame["flop_rate_tflops"] = pd.to_numeric(frame.get("flop_rate_tflops"), errors="coerce")
    frame = frame[np.isfinite(frame["operational_intensity"].astype("float64"))
                  & (frame["operational_intensity"] > 0) & (frame["flop_rate_tflops"] > 0)]
    if frame.empty:
        return None
    frame = frame.sort_values("self_time_ms", ascending=False).head(ROOFLINE_OPS)
    peak, bandwidth = float(roofline["peak_tflops"]), float(roofline["peak_hbm_gbps"])
    ridge = peak * 1e3 / bandwidth
    programs = [p for p in roofline.get("programs") or [] if p.get("program") == "all programs"]
    points = pd.DataFrame(
        {
            "name": frame["name"].astype(str),
            "what": "op",
            "framework_op": frame["tf_op"].fillna("").astype(str) if "tf_op" in frame.columns else "",
            "intensity": frame["operational_intensity"].astype("float64"),
            "tflops": frame["flop_rate_tflops"].astype("float64"),
            "self_time_ms": frame["self_time_ms"].astype("float64"),
            "bound_by": frame["bound_by"].fillna("unknown").astype(str),
            "achieved": frame["achieved_fraction"].astype("float64"),
        }
    )
    for program in programs:
        if program.get("operational_intensity") and program.get("flop_rate_tflops"):
            points.loc[len(points)] = {
                "name": "all programs", "what": "program", "framework_op": "",
                "intensity": program["operational_intensity"], "tflops": program["flop_rate_tflops"],
                "self_time_ms": program["self_time_ms"], "bound_by": program["bound_by"] or "unknown",
                "achieved": program["achieved_fraction"],
            }
    lo = min(float(points["intensity"].min()), ridge) / 4
    hi = max(float(points["intensity"].max()), ridge) * 4
    grid = np.geomspace(lo, hi, 60)
    roof = pd.DataFrame({"intensity": grid, "tflops": np.minimum(peak, grid * bandwidth / 1e3)})
    x = alt.X("intensity:Q", scale=alt.Scale(type="log"), title="operational intensity (FLOPs per HBM byte)")
    y = alt.Y("tflops:Q", scale=alt.Scale(type="log"), title="achieved TFLOP/s (per core)")
    roof_line = alt.Chart(roof).mark_line(color=ROOFLINE["roof"], strokeWidth=2).encode(
        x=x, y=y, tooltip=[alt.Tooltip("intensity:Q", format=",.2f", title="FLOPs per byte"),
                           alt.Tooltip("tflops:Q", format=",.2f", title="roof TFLOP/s")])
    ridge_rule = alt.Chart(pd.DataFrame({"intensity": [ridge]})).mark_rule(
        color=ROOFLINE["roof"], strokeDash=[4, 4]).encode(
        x="intensity:Q", tooltip=[alt.Tooltip("intensity:Q", format=",.1f", title="ridge point FLOPs/byte")])
    dots = alt.Chart(points).mark_point(filled=True, opacity=0.8).encode(
        x=x, y=y,
        color=alt.Color("bound_by:N", title="bound by",
                        scale=alt.Scale(domain=["compute", "memory", "unknown"],
                                        range=[ROOFLINE["compute"], ROOFLINE["memory"], "#999999"])),
        shape=alt.Shape("what:N", title=None, scale=alt.Scale(domain=["op", "program"],
                                                              range=["circle", "diamond"])),
        size=alt.Size("self_time_ms:Q", title="self time ms", scale=alt.Scale(range=[30, 500])),
        tooltip=[alt.Tooltip("name:N"), alt.Tooltip("framework_op:N", title="framework op"),
                 alt.Tooltip("intensity:Q", format=",.2f", title="FLOPs per byte"),
                 alt.Tooltip("tflops:Q", format=",.3f", title="achieved TFLOP/s"),
                 alt.Tooltip("bound_by:N", title="bound by"),
                 alt.Tooltip("achieved:Q", format=".1%", title="of its roof"),
                 alt.Tooltip("self_time_ms:Q", format=",.3f", title="self time ms")],
    )
    return alt.layer(roof_line, ridge_rule, dots).properties(width="container", height=300)
