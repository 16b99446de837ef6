"""What both renderers (terminal and HTML) show of a RunAnalysis, computed once.

The analyzer's summary follows the JSON contract; findings may carry evidence as text, as a dict
(numbers plus ``sql``) or as a list, and the estimated gain as a fraction, a dict or a label. This
module turns them into one shape, ranks findings by estimated gain and formats numbers, so the
terminal summary and the HTML report never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from tpuanalyze.reports.charts import CATEGORIES, CATEGORY_LABELS

SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}
# Keys of an evidence dict that hold reproducing SQL rather than a measured number.
SQL_KEYS = ("sql", "query", "queries")
# Keys that hold a sentence rather than one number.
TEXT_KEYS = ("text", "summary", "message", "description")


@dataclass
class FindingView:
    rule: str
    severity: str
    gain_fraction: float | None  # estimated step-time saving as a fraction of step time, if known
    gain_ms: float | None
    gain_text: str
    evidence_text: str
    gain_model: str = ""  # how the estimate was made (the catalog cost model), when given
    evidence_items: list[tuple[str, str]] = field(default_factory=list)
    sql: list[str] = field(default_factory=list)
    recommendation: str = ""
    catalog: str = ""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def format_value(value: Any) -> str:
    """Numbers compact and readable (3 significant digits, thousands separators), the rest as text."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3g}"
        if abs(value) >= 100:
            return f"{value:,.1f}"
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={format_value(v)}" for k, v in value.items())
    return str(value)


def format_bytes(value: float) -> str:
    """Decimal units, as network and HBM bandwidths are quoted: 9.37 MB, 64 KB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def format_metric(name: str, value: Any) -> str:
    """Like format_value, but fractions (by their name) as percentages."""
    if _is_number(value) and any(word in name for word in ("fraction", "share", "_frac", "utilization")):
        return f"{float(value):.1%}"
    if _is_number(value) and "bytes" in name:
        return format_bytes(float(value))
    return format_value(value)


def _gain(raw: Any) -> tuple[float | None, float | None, str]:
    """(fraction, ms, label) from a gain given as a number, a dict or text."""
    if raw is None:
        return None, None, "no estimate"
    if _is_number(raw):
        fraction = float(raw)
        return fraction, None, f"~{fraction:.1%} of step time (estimate)"
    if isinstance(raw, dict):
        fraction = next(
            (
                float(raw[k])
                for k in ("fraction", "step_fraction", "share", "step_time_fraction")
                if _is_number(raw.get(k))
            ),
            None,
        )
        ms = next(
            (float(raw[k]) for k in ("ms_per_step", "ms", "step_ms", "saving_ms") if _is_number(raw.get(k))),
            None,
        )
        label = next((str(raw[k]) for k in ("label", "text", "description") if raw.get(k)), "")
        parts = []
        if fraction is not None:
            parts.append(f"~{fraction:.1%} of step time")
        if ms is not None:
            parts.append(f"~{ms:.3g} ms/step")
        text = " · ".join(parts)
        if label and label not in text:
            text = f"{text} ({label})" if text else label
        elif text:
            text += " (estimate)"
        return fraction, ms, text or format_value(raw)
    return None, None, str(raw)


def _evidence(raw: Any) -> tuple[str, list[tuple[str, str]], list[str]]:
    """(sentence, [(name, value)], [sql]) from evidence given as text, a dict or a list."""
    if raw is None:
        return "", [], []
    if isinstance(raw, str):
        return raw, [], []
    if isinstance(raw, (list, tuple)):
        texts, items, sqls = [], [], []
        for part in raw:
            t, i, s = _evidence(part)
            if t:
                texts.append(t)
            items += i
            sqls += s
        return "; ".join(texts), items, sqls
    if isinstance(raw, dict):
        text = "; ".join(str(raw[k]) for k in TEXT_KEYS if raw.get(k))
        sqls: list[str] = []
        items: list[tuple[str, str]] = []
        for key, value in raw.items():
            if key in TEXT_KEYS:
                continue
            if key in SQL_KEYS or key.endswith("_sql"):
                values = value if isinstance(value, (list, tuple)) else [value]
                sqls += [str(v).strip() for v in values if v]
            elif isinstance(value, dict):  # e.g. {"metrics": {name: number}}: one item per number
                items += [(k.replace("_", " "), format_metric(k, v)) for k, v in value.items()]
            else:
                items.append((key.replace("_", " "), format_metric(key, value)))
        return text, items, sqls
    return str(raw), [], []


# Section titles of catalog.md §3 (the optimization catalog), for findings that cite a bare number.
CATALOG_SECTIONS = {
    "3.1": "Model parallelism / spatial partitioning",
    "3.2": "Weight-update sharding",
    "3.3": "Gradient all-reduce on the 2-D torus",
    "3.4": "bf16 gradient all-reduce",
    "3.5": "All-reduce combining and overlap",
    "3.6": "Distributed batch norm",
    "3.7": "On-device training loops",
    "3.8": "Host input pipeline scaling",
    "3.9": "Space-to-depth and layouts",
    "3.10": "Distributed, overlapped evaluation",
    "3.11": "Large-batch optimizers (LARS, LAMB)",
    "3.12": "Padding, bucketing, packing",
    "3.13": "Limited data parallelism, unscaled weights",
}


def catalog_title(section: str) -> str:
    """'3.8' -> '§3.8 Host input pipeline scaling' (several sections separated by commas)."""
    parts = [p.strip() for p in section.replace(";", ",").split(",") if p.strip()]
    return ", ".join(f"§{p} {CATALOG_SECTIONS[p]}" if p in CATALOG_SECTIONS else f"§{p}" for p in parts)


def finding_view(finding: dict) -> FindingView:
    raw_gain = finding.get("estimated_gain")
    fraction, ms, gain_text = _gain(raw_gain)
    gain_model = str(raw_gain.get("model") or "") if isinstance(raw_gain, dict) else ""
    text, items, sqls = _evidence(finding.get("evidence"))
    if finding.get("sql"):
        extra = finding["sql"]
        sqls += [str(s) for s in (extra if isinstance(extra, (list, tuple)) else [extra])]
    catalog = finding.get("catalog") or ""
    if isinstance(catalog, dict):
        catalog = " ".join(str(v) for v in catalog.values())
    catalog = str(catalog)
    if catalog[:1].isdigit():  # a bare section number "3.8" -> "catalog §3.8 <title>"
        catalog = catalog_title(catalog)
    return FindingView(
        rule=str(finding.get("rule", "?")),
        severity=str(finding.get("severity", "low")).lower(),
        gain_fraction=fraction,
        gain_ms=ms,
        gain_text=gain_text,
        gain_model=gain_model,
        evidence_text=text,
        evidence_items=items,
        sql=sqls,
        recommendation=str(finding.get("recommendation") or ""),
        catalog=str(catalog),
    )


def ranked_findings(findings: list[dict] | None) -> list[FindingView]:
    """Findings by estimated gain (largest first), then severity: what to fix first comes first."""
    views = [finding_view(f) for f in findings or []]
    return sorted(
        views,
        key=lambda v: (
            -(v.gain_fraction if v.gain_fraction is not None else -1.0),
            -(v.gain_ms if v.gain_ms is not None else -1.0),
            SEVERITY_RANK.get(v.severity, 3),
            v.rule,
        ),
    )


def series_findings(items: Sequence[Any]) -> list[dict]:
    """Cross-run findings (scaling-limit, catalog §3.13) of ScalingAnalysis series; runs have their own."""
    return [
        f for item in items if hasattr(item, "projection") for f in (getattr(item, "findings", None) or [])
    ]


def run_findings(analysis: Any) -> list[dict]:
    """The run's findings: the summary's list is the contract; the attribute is a convenience copy."""
    findings = analysis.summary.get("findings")
    if findings is None:
        findings = getattr(analysis, "findings", None)
        if isinstance(findings, pd.DataFrame):
            findings = findings.to_dict("records")
    return list(findings or [])


@dataclass
class BreakdownRow:
    category: str
    label: str
    share: float
    ms_per_step: float | None
    min_share: float | None = None  # across cores (summary["across_cores"], when the analyzer gives it)
    max_share: float | None = None
    worst: str = ""  # the core (host : ordinal) that is worst for this category


def breakdown_rows(summary: dict, steps: pd.DataFrame | None = None) -> list[BreakdownRow]:
    """One row per category in contract order: share of wall time (the summary) and ms per train step.

    Shares are of the devices' wall time (eval and the idle gaps between steps included), so the
    milliseconds come from the per-step rows (mean over train steps and cores), not share x step time.
    """
    breakdown = summary.get("breakdown") or {}
    across = summary.get("across_cores") or {}
    ms_by_category: dict[str, float] = {}
    if steps is not None and not steps.empty:
        train = steps
        if "is_eval" in steps.columns:
            train = steps[~steps["is_eval"].fillna(False).astype(bool)]
            eval_steps = steps[steps["is_eval"].fillna(False).astype(bool)]
            if "is_warmup" in train.columns and not _warmup_kept(summary):
                train = train[~train["is_warmup"].fillna(False).astype(bool)]
            if not eval_steps.empty:
                ms_by_category["eval"] = float(eval_steps["duration_ps"].mean()) / 1e9
        for category in CATEGORIES:
            column = f"{category}_ps"
            if category != "eval" and column in train.columns and not train.empty:
                ms_by_category[category] = float(train[column].fillna(0).mean()) / 1e9
    rows = []
    for category in CATEGORIES:
        share = breakdown.get(category)
        share = float(share) if _is_number(share) else 0.0
        row = BreakdownRow(category, CATEGORY_LABELS[category], share, ms_by_category.get(category))
        spread = across.get(category) if isinstance(across.get(category), dict) else {}
        row.min_share = float(spread["min"]) if _is_number(spread.get("min")) else None
        row.max_share = float(spread["max"]) if _is_number(spread.get("max")) else None
        core = spread.get("worst_core")
        if isinstance(core, dict) and core.get("host") is not None and row.max_share != row.min_share:
            row.worst = f"{core.get('host')} : {core.get('device_ordinal')}"
        rows.append(row)
    return rows


def _warmup_kept(summary: dict) -> bool:
    """Whether the analysis kept warm-up steps in its statistics (`report --keep-warmup`)."""
    for warning in capture_warnings(summary):
        if warning.get("code") == "warmup-step":
            return bool(warning.get("kept"))
    return False


def capture_warnings(summary: dict) -> list[dict]:
    """The run's capture-health warnings (docs/json.md `capture.warnings`), [] when there are none."""
    capture = summary.get("capture") if isinstance(summary, dict) else None
    warnings = capture.get("warnings") if isinstance(capture, dict) else None
    return [w for w in warnings or [] if isinstance(w, dict)]


def program_rows(summary: dict) -> list[dict]:
    """Per-program statistics (docs/json.md `programs`), present when a trace runs several programs."""
    rows = []
    for program in summary.get("programs") or []:
        if isinstance(program, dict):
            runs = program.get("executions_per_device")
            if _is_number(runs) and float(runs).is_integer():  # 100, not 100.0
                program = {**program, "executions_per_device": int(runs)}
            rows.append(program)
    return rows


def format_ms(value: Any) -> str:
    """Milliseconds with 4 significant digits at most (209.1, 24.37, 0.8640), thousands separated."""
    if not _is_number(value):
        return "–"
    value = float(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    if abs(value) >= 10:
        return f"{value:.2f}"
    return f"{value:.3f}"


def step_time_text(summary: dict) -> str:
    st = summary.get("step_time_ms") or {}
    if not _is_number(st.get("mean")):
        return "no steps found"
    return (
        f"{format_ms(st['mean'])} ms mean · median {format_ms(st.get('median'))} · "
        f"min {format_ms(st.get('min'))} · max {format_ms(st.get('max'))}"
    )


def per_core_step_ms(steps: pd.DataFrame | None) -> pd.DataFrame:
    """Per core, means over train steps: step ms, own ms (step minus exposed collectives) and categories.

    In synchronous training every core's step lasts as long as the slowest one's, so step time does
    not show a straggler: the others wait for it in the collectives. What a core spends *outside*
    collective waits ("own" time) does: the straggler has the most (catalog §3.3 sync vs compute).
    """
    if steps is None or steps.empty:
        return pd.DataFrame()
    train = steps
    if "is_eval" in steps.columns:
        train = steps[~steps["is_eval"].fillna(False).astype(bool)]
    if train.empty:
        return pd.DataFrame()
    data = pd.DataFrame({"host": train["host"].astype(str), "device_ordinal": train["device_ordinal"]})
    data["step_ms"] = train["duration_ps"].astype("float64") / 1e9
    for category in CATEGORIES:
        column = f"{category}_ps"
        if category != "eval" and column in train.columns:
            data[category] = train[column].fillna(0).astype("float64") / 1e9
    data["own_ms"] = data["step_ms"] - data.get("collectives", 0.0)
    return data.groupby(["host", "device_ordinal"], as_index=False).mean(numeric_only=True)


def worst_rows(
    steps: pd.DataFrame | None, keys: list[str], limit: int = 5, fallback: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The cores (keys host, device_ordinal) or hosts (key host) with the most own time.

    Columns: keys, step_time_ms, own_ms, vs_median (own time vs the median core/host), largest_excess
    (the category furthest above its median, e.g. input on a straggler host). A host is its slowest core.
    ``fallback`` (per_core/per_host frames) ranks by step time when there are no step rows.
    """
    cores = per_core_step_ms(steps)
    if cores.empty:
        return _worst_by_step_time(fallback, keys, limit)
    if keys == ["host"]:
        cores = cores.loc[cores.groupby("host")["own_ms"].idxmax()].reset_index(drop=True)
    data = cores.rename(columns={"step_ms": "step_time_ms"})
    median = float(data["own_ms"].median())
    data["vs_median"] = data["own_ms"] / median - 1.0 if median else float("nan")
    data["largest_excess"] = _largest_excess(
        data, [c for c in CATEGORIES if c in data.columns], 0.005 * median
    )
    data = data.sort_values(["own_ms", "step_time_ms"], ascending=False).head(limit)
    return data[[*keys, "step_time_ms", "own_ms", "vs_median", "largest_excess"]].reset_index(drop=True)


def _largest_excess(data: pd.DataFrame, columns: list[str], minimum: float) -> pd.Series:
    """Per row, the category furthest above its median over all rows ("" below ``minimum``: noise)."""
    if not columns:
        return pd.Series("", index=data.index)
    values = data[columns].astype("float64")
    excess = values - values.median()
    labels = excess.idxmax(axis=1).map(CATEGORY_LABELS)
    return labels.where(excess.max(axis=1) >= max(minimum, 1e-12), "")


def _worst_by_step_time(frame: pd.DataFrame | None, keys: list[str], limit: int) -> pd.DataFrame:
    if frame is None or frame.empty or "step_time_ms" not in frame.columns:
        return pd.DataFrame()
    data = frame.copy()
    median = float(data["step_time_ms"].median())
    data["own_ms"] = float("nan")
    data["vs_median"] = data["step_time_ms"] / median - 1.0 if median else float("nan")
    data["largest_excess"] = _largest_excess(data, [c for c in CATEGORIES if c in data.columns], 0.005)
    data = data.sort_values("step_time_ms", ascending=False).head(limit)
    return data[[*keys, "step_time_ms", "own_ms", "vs_median", "largest_excess"]].reset_index(drop=True)
