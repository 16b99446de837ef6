"""One self-contained HTML report: altair charts rendered by Vega inlined into the file.

The report must open offline, years later, from an e-mail attachment: Vega, Vega-Lite and
vega-embed (``reports/vendor/``) are inlined, a Content-Security-Policy forbids any network
fetch, and chart data is aggregated (per step, per host, top ops) so even a 4096-chip run
stays a few MB. The page's script records render results and errors in ``#render-status``,
which the headless-browser test reads.
"""

from __future__ import annotations

import datetime as _dt
import html as _html
import importlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import altair as alt
import jinja2
from tpuanalyze.reports import charts, view
from tpuanalyze.reports.identity_view import identity_rows
from tpuanalyze.reports.xprof_side import xprof_rows

from tpuanalyze import __version__

VENDOR_DIR = Path(__file__).with_name("vendor")
TEMPLATE_DIR = Path(__file__).with_name("templates")
VENDOR_FILES = ("vega.min.js", "vega-lite.min.js", "vega-embed.min.js")
NOT_IN_TRACE = "not in this trace"


@dataclass
class ChartBlock:
    """One chart container: a Vega-Lite spec to embed, or a note saying why there is none."""

    id: str
    title: str
    caption: str
    spec_json: str | None = None
    note: str | None = None


@dataclass
class RunSection:
    index: int
    anchor: str
    summary: dict
    step_time: str
    breakdown: list[view.BreakdownRow]
    findings: list[view.FindingView]
    worst_cores: list[dict]
    worst_hosts: list[dict]
    top_ops: list[dict]
    charts: dict[str, ChartBlock] = field(default_factory=dict)
    identity: list[tuple[str, str]] = field(default_factory=list)
    xprof: list[dict] = field(default_factory=list)
    capture_warnings: list[dict] = field(default_factory=list)
    programs: list[dict] = field(default_factory=list)


@lru_cache(maxsize=1)
def vendor_javascript() -> str:
    """The three vendored libraries, in load order, without source-map comments (they would be fetched)."""
    parts = []
    for name in VENDOR_FILES:
        text = (VENDOR_DIR / name).read_text(encoding="utf-8")
        text = re.sub(r"//# sourceMappingURL=\S+", "", text)
        if "</script" in text.lower():
            raise RuntimeError(f"{name} contains '</script' and cannot be inlined")
        parts.append(f"/* {name} (see LICENSE notes in tpuanalyze/reports/vendor) */\n{text}")
    return "\n;\n".join(parts)


def spec_json(chart: alt.TopLevelMixin | alt.Chart) -> str:
    """The chart's Vega-Lite spec as JSON that is safe inside a <script type="application/json">."""
    # The charts aggregate themselves (see charts.py), so altair's 5000-row guard is not needed here.
    with alt.data_transformers.disable_max_rows():
        spec = chart.to_dict()
    text = json.dumps(spec, separators=(",", ":"), allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _block(block_id: str, title: str, caption: str, chart: Any, note: str = NOT_IN_TRACE) -> ChartBlock:
    if chart is None:
        return ChartBlock(block_id, title, caption, note=note)
    return ChartBlock(block_id, title, caption, spec_json=spec_json(chart))


def _records(frame: Any) -> list[dict]:
    if frame is None or getattr(frame, "empty", True):
        return []
    return frame.to_dict("records")


def _frame(analysis: Any, name: str) -> Any:
    return getattr(analysis, name, None)


def run_section(index: int, analysis: Any) -> RunSection:
    """Everything the template shows of one run; chart ids are prefixed by the run's position."""
    summary = analysis.summary
    steps = _frame(analysis, "steps")
    collectives = _frame(analysis, "collectives")
    ops = _frame(analysis, "ops")
    prefix = f"run{index}"
    section = RunSection(
        index=index,
        anchor=f"run-{index}",
        summary=summary,
        step_time=view.step_time_text(summary),
        breakdown=view.breakdown_rows(summary, steps, _frame(analysis, "per_core")),
        findings=view.ranked_findings(view.run_findings(analysis)),
        worst_cores=_records(
            view.worst_rows(steps, ["host", "device_ordinal"], fallback=_frame(analysis, "per_core"),
                            keep_warmup=view.warmup_kept(summary))
        ),
        worst_hosts=_records(view.worst_rows(steps, ["host"], fallback=_frame(analysis, "per_host"),
                                             keep_warmup=view.warmup_kept(summary))),
        top_ops=_records(ops.sort_values("self_time_ms", ascending=False).head(15))
        if ops is not None and not ops.empty
        else [],
        identity=identity_rows(summary),
        xprof=xprof_rows(summary),
        capture_warnings=view.capture_warnings(summary),
        programs=view.program_rows(summary),
    )
    inputs = _frame(analysis, "input")
    per_host_input = inputs is not None and len(inputs) > charts.MAX_INPUT_BARS
    no_steps = "no device steps in this trace"
    section.charts = {
        "shares": _block(
            f"{prefix}-shares",
            "Category shares",
            "Share of the devices' wall time per category (sums to 100%).",
            charts.category_shares_chart(
                {summary.get("run", f"run {index}"): summary.get("breakdown") or {}}
            ),
        ),
        "steps": _block(
            f"{prefix}-steps",
            "Step-time breakdown per step",
            "Mean over cores of each category's milliseconds in each step; eval steps count as eval.",
            charts.step_breakdown_chart(steps),
            note=no_steps,
        ),
        "heatmap": _block(
            f"{prefix}-heatmap",
            "Stragglers: time per core and step",
            "Colored by own time (step minus exposed collective wait) by default: the others wait for a "
            "straggler inside the collectives, so it is the dark row; a slow step is a dark column. "
            "Switch the color to step time, input wait or exposed collectives below the chart.",
            charts.step_time_heatmap(steps),
            note=no_steps,
        ),
        "coll_kind": _block(
            f"{prefix}-coll-kind",
            "Collectives by kind",
            "Exposed time counts in the step; overlapped time is hidden under compute.",
            charts.collectives_by_kind_chart(collectives),
            note="no collectives in this trace",
        ),
        "coll_size": _block(
            f"{prefix}-coll-size",
            "Collectives by size",
            "Each point is a kind of collective: its median bytes per op against its milliseconds per step; "
            "many small ones are latency bound (catalog §3.5).",
            charts.collectives_size_chart(collectives),
            note="no collectives in this trace"
            if collectives is None or collectives.empty
            else "collective sizes are not in this trace (no shapes on the collective ops)",
        ),
        "input": _block(
            f"{prefix}-input",
            "Input wait per host" if per_host_input else "Input wait per core",
            ("Infeed ms per step of each host (bar: its slowest core, tick: the mean of its cores), hosts "
             "in order; one high bar is a slow host (catalog §3.8)." if per_host_input else
             "Infeed ms per step on each core, cores in host order; one high bar is a slow host "
             "(catalog §3.8)."),
            charts.input_wait_chart(_frame(analysis, "input")),
            note="no input wait in this trace",
        ),
        "ops": _block(
            f"{prefix}-ops",
            "Top ops by self time",
            "The ops that take the most device time, in their category's color; hover for the framework "
            "op, source, FLOPs and roofline.",
            charts.top_ops_chart(ops),
            note="no op events in this trace",
        ),
        "roofline": _block(
            f"{prefix}-roofline",
            "Roofline",
            _roofline_caption(summary.get("roofline") or {}),
            charts.roofline_chart(ops, summary.get("roofline")),
            note=_roofline_note(summary.get("roofline") or {}),
        ),
    }
    return section


def _roofline_caption(roofline: dict) -> str:
    if not roofline.get("peak_tflops"):
        return ""
    source = "the trace's device plane" if roofline.get("source") == "trace" else "the catalog (§2)"
    return (
        f"Each op's FLOPs per HBM byte against its achieved TFLOP/s; the roof is "
        f"{roofline['peak_hbm_gbps']:,.0f} GB/s x intensity up to the ridge point "
        f"({roofline['ridge_flops_per_byte']:,.1f} FLOPs/byte), then {roofline['peak_tflops']:,.1f} TFLOP/s "
        f"(per core, from {source}). Left of the ridge an op is memory bound, right of it compute bound."
    )


def _roofline_note(roofline: dict) -> str:
    if not roofline.get("peak_tflops"):
        return "the device's peak FLOP/s and HBM bandwidth are not in this trace: no roofline"
    return "no op with both FLOPs and bytes accessed in this trace"


def scaling_blocks(analyses: Sequence[Any]) -> list[ChartBlock]:
    """The scaling charts (``reports/scaling_charts.py``) of ScalingAnalysis series or runs.

    The module is optional: without it, or without a series, there is no scaling section.
    """
    if not analyses:
        return []
    try:
        module = importlib.import_module("tpuanalyze.reports.scaling_charts")
    except ImportError:
        return []
    builder = getattr(module, "scaling_charts", None) or getattr(module, "charts", None)
    if builder is None:
        return []
    try:
        items = list(builder(list(analyses)) or [])
    except Exception as exc:  # noqa: BLE001 - a failed fit must not cost the user the whole report
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return [ChartBlock("scaling-error", "Scaling", "", note=f"scaling charts unavailable ({reason})")]
    blocks = []
    for position, item in enumerate(items):
        title, caption, chart = _scaling_item(item, position)
        chart = _fit_container(chart)
        blocks.append(
            _block(f"scaling-{position}", title, caption, chart, note="not enough runs to chart scaling")
        )
    return blocks


def _fit_container(chart: Any) -> Any:
    """Charts made with a fixed width follow the card's width instead (laptop screens, two columns)."""
    try:
        return chart.properties(width="container")
    except Exception:  # noqa: BLE001 - e.g. a concatenation, which has no single width: keep as made
        return chart


def _scaling_item(item: Any, position: int) -> tuple[str, str, Any]:
    """Accept (title, chart), (title, caption, chart), a dict, or a bare chart from scaling_charts."""
    if isinstance(item, dict):
        return (
            str(item.get("title", f"Scaling {position + 1}")),
            str(item.get("caption", "")),
            item.get("chart"),
        )
    if isinstance(item, tuple):
        if len(item) == 3:
            return str(item[0]), str(item[1]), item[2]
        if len(item) == 2:
            return str(item[0]), "", item[1]
    title = getattr(item, "title", None)
    return (str(title) if isinstance(title, str) else f"Scaling {position + 1}"), "", item


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = view.format_value
    env.filters["msf"] = view.format_ms
    env.filters["pct"] = lambda v, d=1: "" if v is None else f"{float(v) * 100:.{d}f}%"
    env.filters["ms"] = lambda v: "" if v is None else f"{float(v):,.3f}"
    env.filters["intensity"] = view.format_intensity
    env.filters["framework"] = view.framework_text
    return env


def render_html(
    analyses: Sequence[Any], title: str | None = None, scaling_items: Sequence[Any] | None = None
) -> str:
    """The whole report as one HTML string.

    ``scaling_items`` are what the scaling charts are built from (default: the analyses themselves);
    the report verb passes the runs with their chip counts when they form a scaling series.
    """
    sections = [run_section(i, a) for i, a in enumerate(analyses)]
    if scaling_items is None:  # several RunAnalysis objects: scaling_charts decides if they form a series
        scaling_items = analyses if len(analyses) > 1 else []
    scaling = scaling_blocks(scaling_items)
    scaling_findings = view.ranked_findings(view.series_findings(scaling_items))
    chart_count = sum(1 for s in sections for c in s.charts.values() if c.spec_json) + sum(
        1 for c in scaling if c.spec_json
    )
    if title is None:
        names = [str(s.summary.get("run", "run")) for s in sections]
        title = "tpuanalyze: " + (names[0] if len(names) == 1 else f"{len(names)} runs")
    template = _environment().get_template("report.html.j2")
    return template.render(
        title=title,
        sections=sections,
        scaling=scaling,
        scaling_findings=scaling_findings if scaling else [],
        chart_count=chart_count,
        categories=charts.CATEGORIES,
        category_colors=charts.CATEGORY_COLORS,
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        version=__version__,
        vendor_js=vendor_javascript(),
        escape=_html.escape,
    )


def write_html(
    analyses: Sequence[Any],
    path: str | Path,
    title: str | None = None,
    scaling_items: Sequence[Any] | None = None,
) -> int:
    """Write the report; returns its size in bytes."""
    data = render_html(analyses, title, scaling_items).encode("utf-8")
    Path(path).write_bytes(data)
    return len(data)
