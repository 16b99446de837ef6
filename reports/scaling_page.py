"""The stand-alone ``tpuanalyze scaling --html`` page, in the report's own style.

Same stylesheet, same offline rules (Vega inlined, a CSP that forbids any fetch) and the same render
bookkeeping (``#render-status``) as the HTML report, so the two pages look and behave alike: tables of
measured runs, fits and projections with percentages (never 9.07e-05), wrapping instead of scrolling
sideways, and the series' charts in cards.
"""

from __future__ import annotations

import datetime as _dt
import html as _html
import math
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from tpuanalyze.analyzer.scaling import ScalingAnalysis
from tpuanalyze.reports import view
from tpuanalyze.reports.palette import CATEGORY_COLORS, CATEGORY_LABELS

from tpuanalyze import __version__

_CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
        "img-src data: blob:; font-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'")


@lru_cache(maxsize=1)
def report_css() -> str:
    """The HTML report's stylesheet (templates/report.html.j2), so both pages share one look."""
    from tpuanalyze.reports.html import TEMPLATE_DIR

    text = (TEMPLATE_DIR / "report.html.j2").read_text(encoding="utf-8")
    match = re.search(r"<style>(.*?)</style>", text, re.S)
    return match.group(1) if match else ""


@lru_cache(maxsize=1)
def report_scripts() -> tuple[str, str]:
    """The report's two scripts: the render bookkeeping (head) and the chart embedding (end of body)."""
    from tpuanalyze.reports.html import TEMPLATE_DIR

    text = (TEMPLATE_DIR / "report.html.j2").read_text(encoding="utf-8")
    scripts = re.findall(r"<script>\n(.*?)</script>", text, re.S)
    head = next(s for s in scripts if "__tpuReport" in s and "vegaEmbed" not in s)
    head = head.replace("{{ chart_count }}", "0")  # the embedding script counts the charts itself
    embed = next(s for s in scripts if "vegaEmbed" in s)
    return head, embed


# The report's look, plus what wide tables need to fit the page instead of scrolling sideways.
_PAGE_CSS = """
table.scaling { font-size: .8rem; }
table.scaling th, table.scaling td { padding: 4px 5px; }
table.scaling th { text-transform: none; letter-spacing: 0; font-size: .74rem; white-space: normal; }
table.scaling td.num, table.scaling th.num { white-space: normal; }
table.scaling td:first-child { overflow-wrap: anywhere; max-width: 16em; }
table.scaling small { color: var(--muted); font-weight: 400; }
h2 small { font-weight: 400; font-size: .9rem; }
"""


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _pct(value: Any, digits: int = 1) -> str:
    return "–" if _missing(value) else f"{float(value) * 100:.{digits}f}%"


def _num(value: Any) -> str:
    return "–" if _missing(value) else view.format_ms(value)


def _small(value: Any) -> str:
    """An error that may be tiny: 3 significant digits, never scientific notation (0.0002, 4.20)."""
    return "–" if _missing(value) else view.format_value(float(value))


def _label(category: str) -> str:
    return CATEGORY_LABELS.get(category, category.replace("_", " "))


def _swatch(category: str) -> str:
    color = CATEGORY_COLORS.get(category)
    return f'<span class="swatch" style="background:{color}"></span>' if color else ""


def _table(head: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    cells = "".join(f'<th class="num">{h}</th>' if i >= numeric_from else f"<th>{h}</th>"
                    for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i >= numeric_from else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return (f'<div class="card"><table class="scaling"><thead><tr>{cells}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _categories(analysis: ScalingAnalysis) -> list[str]:
    return [c for c in analysis.fits if c in analysis.measured.columns]


def measured_table(analysis: ScalingAnalysis) -> str:
    unit, metric = analysis.unit, analysis.metric
    cats = _categories(analysis)
    head = ["run", "chips", f"{metric.replace('_', ' ')}"] + [
        f"{_swatch(c)}{_html.escape(_label(c))}<br><small>{unit} · of the step</small>" for c in cats
    ] + ["per-core throughput<br><small>vs smallest run</small>", "speedup"]
    rows = []
    for row in analysis.measured.to_dict("records"):
        rows.append(
            [_html.escape(str(row.get("run"))), f"{int(row['chips']):,}", _num(row.get(metric))]
            + [f"{_num(row.get(c))}<br><small>{_pct(row.get(f'{c}_share'))}</small>" for c in cats]
            + [_pct(row.get("per_core_throughput_rel")),
               "–" if _missing(row.get("speedup")) else f"{float(row['speedup']):.2f}x"]
        )
    return _table(head, rows, numeric_from=1)


def fits_table(analysis: ScalingAnalysis) -> str:
    rows = [[f"{_swatch(c)}{_html.escape(_label(c))}", _html.escape(f.form),
             f"<code>{_html.escape(f.formula)}</code>", _small(f.rms_error), _small(f.loo_error)]
            for c, f in analysis.fits.items()]
    return _table(["category", "form", f"model ({analysis.unit}, N = chips)", "in-sample rms",
                   "leave-one-out rms"], rows, numeric_from=3)


def projection_table(analysis: ScalingAnalysis) -> str:
    metric = analysis.metric
    cats = [c for c in _categories(analysis) if f"{c}_share_est" in analysis.projection.columns]
    head = ["chips", f"{metric.replace('_', ' ')} (estimate)", "model error"] + [
        f"{_swatch(c)}{_html.escape(_label(c))}<br><small>of the step</small>" for c in cats
    ] + ["per-core throughput<br><small>vs smallest run</small>"]
    rows = []
    for row in analysis.projection.to_dict("records"):
        chips = f"{int(row['chips']):,}" + ("" if row.get("measured") else " <small>(estimate)</small>")
        rows.append([chips, _num(row.get(f"{metric}_est")),
                     "–" if _missing(row.get("error_est")) else f"±{_pct(row['error_est'])}"]
                    + [_pct(row.get(f"{c}_share_est")) for c in cats]
                    + [_pct(row.get("per_core_throughput_rel_est"))])
    return _table(head, rows, numeric_from=0)


def time_to_train_section(analysis: ScalingAnalysis) -> str:
    """The time-to-train model's limit and remedies, and the trace runs beside the logged results."""
    parts = []
    limits = (getattr(analysis, "time_to_train", None) or {}).get("limits")
    if limits:
        passes = limits.get("fixed_passes_compute_chips")
        cap, limit = limits["convergence_cap_batch"], limits["data_parallel_limit_chips"]
        where = f"passes compute at ~{passes:,} chips." if passes else "never passes compute."
        parts.append('<h3>The limit (estimates)</h3>'
                     f'<div class="card"><p>Global batch capped at {cap:,}: data '
                     f"parallelism runs out at ~{limit:,} chips (one example per core, catalog §3.1); the "
                     f"non-shrinking step (all-reduce, weight update, overhead) {where}</p><ul>")
        for remedy in limits["remedies"]:
            parts.append(f"<li>{_html.escape(remedy['remedy'])} (catalog §{remedy['catalog']}) at "
                         f"{remedy['at_chips']:,} chips: {_small(remedy['gain_s'])} s = "
                         f"{_pct(remedy['fraction'])} of time to train ({_html.escape(remedy['model'])}; "
                         "estimate)</li>")
        parts.append("</ul></div>")
    joined = getattr(analysis, "joined", None)
    if joined:
        rows = [[_html.escape(str(j.get("trace_run"))), f"{int(j['chips']):,}", _num(j.get("trace_step_ms")),
                 _num(j.get("logged_step_ms_est")), _small(j.get("logged_steps")),
                 _num(j.get("time_to_train_from_trace_s_est")), _num(j.get("logged_time_to_train_s")),
                 _pct(j.get("difference")) if not isinstance(j.get("difference"), str)
                 else _html.escape(j["difference"])] for j in joined]
        parts.append("<h3>Trace runs beside the MLPerf result at the same chips</h3>" + _table(
            ["trace run", "chips", "trace step ms", "logged step ms (estimate)", "logged steps",
             "time to train from the trace, s (estimate)", "logged time to train, s", "difference"], rows))
    return "".join(parts)


def _findings(analysis: ScalingAnalysis) -> str:
    cards = []
    for finding in view.ranked_findings(analysis.findings):
        cards.append(
            f'<article class="card finding {finding.severity}" data-rule="{_html.escape(finding.rule)}">'
            f'<div class="head"><span class="rule">{_html.escape(finding.rule)}</span>'
            f'<span class="badge {finding.severity}">{finding.severity}</span>'
            f'<span class="gain">gain {_html.escape(finding.gain_text)}</span></div><dl>'
            f"<dt>Evidence</dt><dd>{_html.escape(finding.evidence_text or '–')}</dd>"
            f"<dt>Recommendation</dt><dd>{_html.escape(finding.recommendation or '–')}</dd>"
            + (f"<dt>Catalog</dt><dd>{_html.escape(finding.catalog)}</dd>" if finding.catalog else "")
            + "</dl></article>"
        )
    return f'<div class="findings">{"".join(cards)}</div>' if cards else ""


def scaling_html(analyses: Sequence[ScalingAnalysis], title: str = "tpuanalyze scaling") -> str:
    """The whole page as one self-contained HTML string."""
    from tpuanalyze.reports.html import _fit_container, spec_json, vendor_javascript
    from tpuanalyze.reports.scaling_charts import charts_for

    head_script, embed_script = report_scripts()
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        f'<meta name="generator" content="tpuanalyze {__version__}"><title>{_html.escape(title)}</title>',
        f"<style>{report_css()}\n{_PAGE_CSS}</style>",
        f"<script>\n{head_script}</script></head><body>",
        f'<header class="top"><div class="wrap"><h1>{_html.escape(title)}</h1><div class="sub">Generated '
        f"{generated} by tpuanalyze {__version__} · projections are estimates from fitted models, not "
        "measurements</div></div></header>",
        '<main><div class="wrap">',
    ]
    chart_id = 0
    for analysis in analyses:
        name = _html.escape(analysis.workload or "series")
        mode = _html.escape(analysis.batch_mode)
        parts.append(f'<section class="run"><h2>{name} <small class="none">({mode})</small></h2>')
        parts.append(_findings(analysis))
        parts.append(f"<h3>Measured runs</h3>{measured_table(analysis)}")
        if analysis.holdout and "relative_error" in analysis.holdout:
            h = analysis.holdout
            parts.append(f'<p class="lead">Held-out check: fitted on {h["fitted_on_chips"]} chips, the model '
                         f"predicts {_num(h['predicted'])} {analysis.unit} at {h['chips']:,} chips against "
                         f"{_num(h['measured'])} measured ({h['relative_error']:+.1%}).</p>")
        parts.append(time_to_train_section(analysis))
        parts.append(f"<h3>Fitted model per category</h3>{fits_table(analysis)}")
        parts.append("<h3>Projection (estimates from the fitted model, not measurements)</h3>"
                     f"{projection_table(analysis)}")
        parts.append('<div class="grid2" style="margin-top:14px">')
        for chart_title, caption, chart in charts_for(analysis):
            cid = f"scaling-{chart_id}"
            chart_id += 1
            parts.append(
                f'<figure class="chart-block"><figcaption><h4>{_html.escape(chart_title)}</h4>'
                f"<p>{_html.escape(caption)}</p></figcaption>"
                f'<div class="chart" id="{cid}" data-spec="spec-{cid}" role="img" '
                f'aria-label="{_html.escape(chart_title)}"></div>'
                f'<script type="application/json" id="spec-{cid}">{spec_json(_fit_container(chart))}</script>'
                "</figure>")
        parts.append("</div></section>")
    parts.append('</div></main><footer><div class="wrap">tpuanalyze · this file is self-contained and works '
                 "offline: Vega, Vega-Lite and vega-embed (BSD-3-Clause) are inlined below.</div></footer>")
    parts.append('<pre id="render-status" hidden></pre>')
    parts.append(f"<script>\n{vendor_javascript()}\n</script>")
    parts.append(f"<script>\n{embed_script}</script></body></html>")
    return "\n".join(parts)
