"""What both renderers (terminal and HTML) show of a RunAnalysis, computed once.

The analyzer's summary follows the JSON contract (docs/json.md); a finding has one documented shape
(docs/findings.md): evidence {summary, metrics, sql}, estimated_gain {ms, fraction, own_ms, own_fraction,
category, label, model}, catalog (section text), optional caused_by. This module turns findings into
views, orders them as a tree (root causes by estimated gain, each followed by what it explains) and
formats numbers, so the terminal summary and the HTML report never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from tpuanalyze.reports.palette import CATEGORIES, CATEGORY_LABELS

SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}
# idle outside the step cycle gets its own row under idle from this share of wall time on (below it the
# row would only show 0.0%)
OUTSIDE_CYCLE_ROW = 0.001


@dataclass
class FindingView:
    rule: str
    severity: str
    gain_fraction: float | None  # estimated saving as a fraction of wall time, if known
    gain_ms: float | None
    gain_text: str
    evidence_text: str
    gain_model: str = ""  # how the estimate was made (the catalog cost model)
    evidence_items: list[tuple[str, str]] = field(default_factory=list)
    sql: list[str] = field(default_factory=list)
    recommendation: str = ""
    catalog: str = ""
    caused_by: str = ""  # rule id of the finding that explains this one ("" for a root cause)
    depth: int = 0  # 0 for a root cause, 1 under its cause, ...
    label: str = ""  # tree position: "1", "1.1", ...


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool, None or NaN)."""
    return _is_number(value)


def framework_text(op: dict, short_source: bool = False) -> str:
    """The framework op (tf_op / JAX path) and source line of an op row, where the trace has them;
    ``short_source`` keeps the file name and line only (narrow terminals)."""
    parts = []
    for key in ("tf_op", "source"):
        value = op.get(key)
        if isinstance(value, str) and value:
            parts.append(value.rsplit("/", 1)[-1] if key == "source" and short_source else value)
    return " · ".join(parts) or "–"


def format_intensity(value: Any) -> str:
    """FLOPs per byte: '0.125', '60.0', '1,234'; no bytes at all -> '∞'; unknown -> '–'."""
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    if not _is_number(value):
        return "–"
    value = float(value)
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value < 10 else f"{value:.1f}"


def format_value(value: Any) -> str:
    """Numbers compact and readable (3 significant digits, thousands separators), the rest as text.

    Never Python's spelling inside a sentence: None is '–' (not measured), a bool is 'yes' / 'no'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and abs(value) < 1e-3:  # 0.0000907, not 9.07e-05
            if abs(value) < 1e-9:
                return "≈0"
            return f"{value:.{2 - math.floor(math.log10(abs(value)))}f}"
        if abs(value) >= 1e12:
            return f"{value:.3g}"
        if abs(value) >= 1e6:
            return f"{value:,.0f}"
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


def _gain_text(gain: dict, caused_by: str) -> str:
    """'~12.3% of wall time · ~4.56 ms/step (estimate)'; a caused finding says where it is counted."""
    if caused_by:
        own = gain.get("own_fraction")
        own_text = f"own estimate ~{own:.1%} of wall time, " if _is_number(own) else ""
        return f"{own_text}counted under {caused_by}"
    parts = []
    if _is_number(gain.get("fraction")):
        parts.append(f"~{gain['fraction']:.1%} of wall time")
    if _is_number(gain.get("ms")):
        parts.append(f"~{gain['ms']:.3g} ms/step")
    text = " · ".join(parts) or "no estimate"
    own = gain.get("own_fraction")
    if _is_number(own) and _is_number(gain.get("fraction")) and own - gain["fraction"] > 5e-4:
        text += f" (combined; own estimate ~{own:.1%})"
    else:
        text += f" ({gain.get('label') or 'estimate'})"
    return text


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
    """The view of one finding in the documented shape (docs/findings.md)."""
    gain = finding.get("estimated_gain") or {}
    evidence = finding.get("evidence") or {}
    caused_by = str(finding.get("caused_by") or "")
    metrics = evidence.get("metrics") or {}
    catalog = str(finding.get("catalog") or "")
    return FindingView(
        rule=str(finding["rule"]),
        severity=str(finding["severity"]),
        gain_fraction=float(gain["fraction"]) if _is_number(gain.get("fraction")) else None,
        gain_ms=float(gain["ms"]) if _is_number(gain.get("ms")) else None,
        gain_text=_gain_text(gain, caused_by),
        gain_model=str(gain.get("model") or ""),
        evidence_text=str(evidence.get("summary") or ""),
        # an unmeasured number (None / NaN) is left out rather than shown as a dash in a sentence
        evidence_items=[(k.replace("_", " "), format_metric(k, v)) for k, v in metrics.items()
                        if not (v is None or (isinstance(v, float) and math.isnan(v)))],
        sql=[str(evidence["sql"]).strip()] if evidence.get("sql") else [],
        recommendation=str(finding.get("recommendation") or ""),
        catalog=catalog_title(catalog) if catalog[:1].isdigit() else catalog,
        caused_by=caused_by,
    )


def _gain_key(v: FindingView) -> tuple:
    return (-(v.gain_fraction if v.gain_fraction is not None else -1.0),
            -(v.gain_ms if v.gain_ms is not None else -1.0), SEVERITY_RANK.get(v.severity, 3), v.rule)


def ranked_findings(findings: list[dict] | None) -> list[FindingView]:
    """Root causes by estimated gain (largest first), each followed by the findings it explains
    (caused_by), depth first: what to fix first comes first, its symptoms under it."""
    views = [finding_view(f) for f in findings or []]
    rules = {v.rule for v in views}
    children: dict[str, list[FindingView]] = {}
    roots = []
    for v in views:
        if v.caused_by and v.caused_by in rules and v.caused_by != v.rule:
            children.setdefault(v.caused_by, []).append(v)
        else:
            roots.append(v)
    ordered: list[FindingView] = []
    seen: set[int] = set()

    def visit(v: FindingView, depth: int, label: str) -> None:
        if id(v) in seen:
            return
        seen.add(id(v))
        v.depth, v.label = depth, label
        ordered.append(v)
        for i, child in enumerate(sorted(children.get(v.rule, []), key=_gain_key), start=1):
            visit(child, depth + 1, f"{label}.{i}")

    for i, root in enumerate(sorted(roots, key=_gain_key), start=1):
        visit(root, 0, str(i))
    return ordered


def series_findings(items: Sequence[Any]) -> list[dict]:
    """Cross-run findings (scaling-limit, catalog §3.13) of ScalingAnalysis series; runs have their own."""
    return [
        f for item in items if hasattr(item, "projection") for f in (getattr(item, "findings", None) or [])
    ]


def run_findings(analysis: Any) -> list[dict]:
    """The run's findings: the summary's list (the JSON contract)."""
    return list(analysis.summary.get("findings") or [])


@dataclass
class BreakdownRow:
    category: str
    label: str
    share: float
    ms_per_step: float | None
    min_share: float | None = None  # across cores (summary["across_cores"], when the analyzer gives it)
    max_share: float | None = None
    worst: str = ""  # the core (host : ordinal) that is worst for this category
    part_of: str = ""  # a split of another row's share (idle within / between steps), shown indented


def breakdown_rows(
    summary: dict, steps: pd.DataFrame | None = None, per_core: pd.DataFrame | None = None
) -> list[BreakdownRow]:
    """One row per category in contract order: share of wall time (the summary) and ms per train step.

    Shares are of the devices' wall time (eval and the idle gaps between steps included), so the
    milliseconds come from the per-step rows (mean over train steps and cores), not share x step time.
    With ``per_core`` (wall time per core) idle is also split into idle within steps, idle between
    steps (host overhead, catalog §3.7) and idle outside the step cycle (set-up before the first step),
    rows under it: the between-step gap is most of idle when the host launches each step, and the
    in-step ms/step alone would hide it; a one-off set-up gap is no per-step cost.
    """
    breakdown = summary.get("breakdown") or {}
    across = summary.get("across_cores") or {}
    ms_by_category: dict[str, float] = {}
    if steps is not None and not steps.empty:
        train = train_steps(steps, warmup_kept(summary))
        if "is_eval" in steps.columns:
            eval_steps = steps[steps["is_eval"].fillna(False).astype(bool)]
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
        if category == "idle":
            rows += _idle_split(row, per_core)
    return rows


def _idle_split(idle: BreakdownRow, per_core: pd.DataFrame | None) -> list[BreakdownRow]:
    """Idle within train steps, between steps, and outside the step cycle (before the first step or
    after the last: set-up, a capture started early), as shares of wall time; ms per train step for the
    first two (the per-step idle host overhead can cause), none for the third (a one-off gap)."""
    columns = {"wall_ms", "steps", "idle", "idle_in_steps_ms", "idle_in_cycle_ms"}
    if per_core is None or per_core.empty or not columns <= set(per_core.columns) or not idle.share:
        return []
    data = per_core[(per_core["wall_ms"] > 0) & (per_core["steps"].fillna(0) > 0)]
    if data.empty:
        return []
    wall, n = data["wall_ms"].astype("float64"), data["steps"].astype("float64")
    in_ms = data["idle_in_steps_ms"].fillna(0).astype("float64")
    cycle_ms = data["idle_in_cycle_ms"].astype("float64").fillna(in_ms)
    between_ms = (cycle_ms - in_ms).clip(lower=0)
    outside_ms = (data["idle"].fillna(0) * wall - cycle_ms).clip(lower=0)
    idle.ms_per_step = float(((in_ms + between_ms) / n).mean())
    rows = [
        BreakdownRow("idle", "within steps", float((in_ms / wall).mean()), float((in_ms / n).mean()),
                     part_of="idle"),
        BreakdownRow("idle", "between steps", float((between_ms / wall).mean()),
                     float((between_ms / n).mean()), part_of="idle"),
    ]
    outside = float((outside_ms / wall).mean())
    if outside >= OUTSIDE_CYCLE_ROW:
        rows.append(BreakdownRow("idle", "outside the step cycle", outside, None,
                                 part_of="idle"))
    return rows


def train_steps(steps: pd.DataFrame, keep_warmup: bool = False) -> pd.DataFrame:
    """The train step rows the statistics use: eval steps out, warm-up steps out unless kept."""
    train = steps
    if "is_eval" in train.columns:
        train = train[~train["is_eval"].fillna(False).astype(bool)]
    if "is_warmup" in train.columns and not keep_warmup:
        train = train[~train["is_warmup"].fillna(False).astype(bool)]
    return train


def warmup_kept(summary: dict) -> bool:
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


def per_core_step_ms(steps: pd.DataFrame | None, keep_warmup: bool = False) -> pd.DataFrame:
    """Per core, means over train steps: step ms, own ms (step minus exposed collectives) and categories.

    In synchronous training every core's step lasts as long as the slowest one's, so step time does
    not show a straggler: the others wait for it in the collectives. What a core spends *outside*
    collective waits ("own" time) does: the straggler has the most (catalog §3.3 sync vs compute).
    Warm-up steps (compilation) are left out unless ``keep_warmup``, as in the step statistics.
    """
    if steps is None or steps.empty:
        return pd.DataFrame()
    train = train_steps(steps, keep_warmup)
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
    steps: pd.DataFrame | None, keys: list[str], limit: int = 5, fallback: pd.DataFrame | None = None,
    keep_warmup: bool = False,
) -> pd.DataFrame:
    """The cores (keys host, device_ordinal) or hosts (key host) with the most own time.

    Columns: keys, step_time_ms, own_ms, vs_median (own time vs the median core/host), largest_excess
    (the category furthest above its median, e.g. input on a straggler host). A host is its slowest core.
    ``fallback`` (per_core/per_host frames) ranks by step time when there are no step rows.
    """
    cores = per_core_step_ms(steps, keep_warmup)
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
