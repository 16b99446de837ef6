"""Runs side by side (``tpuanalyze compare``), and turning the user's run arguments into analyzed runs
(trace paths ingested into a scratch database, or ``DB:run`` references) for compare and scaling."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
from tpuanalyze.analyzer.identity import differences, platform_key

from tpuanalyze.errors import TpuAnalyzeError

IN_STEP_CATEGORIES = ["compute", "weight_update", "collectives", "memory_transfer", "input", "output", "idle"]
_DB_SUFFIXES = (".duckdb", ".db", ".ddb")

@dataclass
class LoadedRun:
    """One analyzed run and where it came from."""

    label: str                    # what the user typed (plus the run name when a path held several)
    run_id: int
    name: str
    analysis: Any                 # tpuanalyze.analyzer.api.RunAnalysis
    facts: dict[str, Any] = field(default_factory=dict)


# --- facts of a run (chips, batch, workload) -----------------------------------------------------------

def run_facts(analysis: Any) -> dict[str, Any]:
    """Chips, cores, batch, workload and platform of an analyzed run, from its ``identity`` (the trace's
    own facts, analyzer/identity.py; never the generator's metadata or ground_truth.json)."""
    identity = dict(analysis.summary.get("identity") or {})
    per_chip = identity.get("cores_per_chip") or 1
    chips = identity.get("chips")
    workload = identity.get("workload") or {}
    return {
        "chips": chips,
        "chips_source": identity.get("chips_source"),
        "cores": chips * per_chip if chips else None,
        "cores_per_chip": per_chip,
        "per_core_batch": identity.get("per_core_batch"),
        "global_batch": identity.get("global_batch"),
        "workload": workload.get("label"),
        "platform": platform_key(identity),
        "identity": identity,
    }


# --- resolving user arguments into analyzed runs ------------------------------------------------------

def _looks_like_db(path: Path) -> bool:
    if path.suffix.lower() in _DB_SUFFIXES:
        return True
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError:
        return False
    return len(head) >= 12 and head[8:12] == b"DUCK"


def _lookup(con: duckdb.DuckDBPyConnection, ref: str, db_label: str) -> list[tuple[int, str]]:
    """Run ids for a reference: a run id, a run name, or a source path (exact)."""
    if ref.strip().isdigit():
        rows = con.execute("SELECT run_id, name, source_format FROM runs WHERE run_id = ?",
                           [int(ref)]).fetchall()
    else:
        rows = con.execute(
            "SELECT run_id, name, source_format FROM runs WHERE name = ? OR source_path = ? "
            "OR (? <> '' AND ends_with(name, '/' || ?)) ORDER BY run_id",
            [ref, str(Path(ref).resolve()) if ref else ref, ref, ref]).fetchall()
    if not rows:
        raise TpuAnalyzeError(f"no run '{ref}' in the database", db_label)
    if any(r[2] == "mlperf" for r in rows):
        raise TpuAnalyzeError(f"run '{ref}' is an MLPerf result folder, not a trace (see tpuanalyze mlperf)",
                              db_label)
    return [(int(r[0]), str(r[1])) for r in rows]


ALLOW_MIXED_FLAG = "--allow-mixed"


def check_comparable(runs: list[LoadedRun], allow_mixed: bool = False) -> list[str]:
    """Refuse runs of different platforms or workloads (``TpuAnalyzeError``, one line naming both runs
    and what differs); with ``allow_mixed`` the differences come back as warnings instead."""
    warnings = []
    first = runs[0]
    for other in runs[1:]:
        diff = differences(first.facts.get("identity") or {}, other.facts.get("identity") or {})
        if not diff:
            continue
        text = f"{first.label} and {other.label} are not the same workload on the same platform: " + \
            "; ".join(diff)
        if not allow_mixed:
            raise TpuAnalyzeError(f"{text} ({ALLOW_MIXED_FLAG} compares them anyway)")
        warnings.append(f"{text} (compared anyway: {ALLOW_MIXED_FLAG})")
    return warnings


def size_warnings(a: LoadedRun, b: LoadedRun) -> list[str]:
    """Chips or per-core batch that differ between two compared runs: step times then differ for that
    reason too (throughput per chip compares such runs: ``compare --per-chip``)."""
    out = []
    if a.facts.get("chips") and b.facts.get("chips") and a.facts["chips"] != b.facts["chips"]:
        out.append(f"chips differ: A {a.facts['chips']} vs B {b.facts['chips']}")
    ba, bb = a.facts.get("per_core_batch"), b.facts.get("per_core_batch")
    if ba and bb and ba != bb:
        out.append(f"per-core batch differs: A {ba:g} vs B {bb:g}")
    return out


def throughput_per_chip(run: LoadedRun, step_ms: float) -> float | None:
    """Examples per second per chip (global batch / step time / chips), when the trace states the batch;
    else train steps per second per chip."""
    chips = run.facts.get("chips")
    if not chips or not step_ms:
        return None
    work = run.facts.get("global_batch") or 1.0
    return float(work) / (step_ms / 1e3) / float(chips)


# --- per-step numbers of an analyzed run --------------------------------------------------------------

def step_categories_ms(analysis: Any) -> dict[str, float]:
    """Mean train-step time and each in-step category in ms per step (devices pooled)."""
    steps = analysis.steps
    train = steps[~steps["is_eval"].astype(bool)] if not steps.empty else steps
    if "is_warmup" in train and not train.empty:  # warm-up steps stay out, as in step_time_ms
        warm = train["is_warmup"].astype(bool)
        train = train[~warm] if not warm.all() else train
    if train.empty:
        mean = (analysis.summary.get("step_time_ms") or {}).get("mean")
        if mean is None:
            raise TpuAnalyzeError(f"run '{analysis.summary.get('run')}' has no train steps")
        breakdown = analysis.summary.get("breakdown") or {}
        in_step = sum(breakdown.get(c, 0.0) for c in IN_STEP_CATEGORIES) or 1.0
        return {"step_time_ms": float(mean),
                **{c: float(mean) * breakdown.get(c, 0.0) / in_step for c in IN_STEP_CATEGORIES}}
    out = {"step_time_ms": float(train["duration_ps"].mean()) / 1e9}
    for category in IN_STEP_CATEGORIES:
        column = f"{category}_ps"
        out[category] = float(train[column].fillna(0).mean()) / 1e9 if column in train else 0.0
    out["collectives_overlapped"] = float(train["collectives_overlapped_ps"].fillna(0).mean()) / 1e9
    return out


def ops_per_step(analysis: Any) -> pd.DataFrame:
    """Op self time in ms per device step (name, category, ms), so runs of any size compare."""
    ops = analysis.ops
    device_steps = max(len(analysis.steps), 1)
    if ops is None or ops.empty:
        return pd.DataFrame(columns=["name", "category", "ms_per_step"])
    grouped = ops.groupby("name", as_index=False).agg(category=("category", "first"),
                                                      self_time_ms=("self_time_ms", "sum"))
    grouped["ms_per_step"] = grouped["self_time_ms"] / device_steps
    return grouped[["name", "category", "ms_per_step"]]


# --- comparison ---------------------------------------------------------------------------------------

@dataclass
class RunComparison:
    """B against A: step time, per-category time per step, the ops that moved most, findings."""

    a: str
    b: str
    step_a_ms: float
    step_b_ms: float
    breakdown: pd.DataFrame
    ops: pd.DataFrame
    findings_appeared: list[dict]
    findings_resolved: list[dict]
    findings_kept: list[str]
    warnings: list[str] = field(default_factory=list)
    throughput_per_chip: dict[str, float | None] = field(default_factory=dict)

    @property
    def slower_pct(self) -> float:
        """How much slower B's step is than A's, in percent (negative: B is faster)."""
        return (self.step_b_ms - self.step_a_ms) / self.step_a_ms * 100.0

    @property
    def slower_per_chip_pct(self) -> float | None:
        """How much lower B's throughput per chip is than A's, in percent (None when unknown)."""
        a, b = self.throughput_per_chip.get("a"), self.throughput_per_chip.get("b")
        return (a - b) / a * 100.0 if a and b else None

    def to_json(self) -> dict:
        return {
            "a": self.a, "b": self.b,
            "step_time_ms": {"a": self.step_a_ms, "b": self.step_b_ms},
            "b_slower_pct": self.slower_pct,
            "throughput_per_chip": {**self.throughput_per_chip, "unit": self.throughput_per_chip.get("unit"),
                                    "b_slower_pct": self.slower_per_chip_pct},
            "warnings": self.warnings,
            "breakdown": _records(self.breakdown),
            "top_ops": _records(self.ops),
            "findings": {"appeared": self.findings_appeared, "resolved": self.findings_resolved,
                         "kept": self.findings_kept},
        }


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and np.isnan(v) else
                 (v.item() if isinstance(v, np.generic) else v)) for k, v in row.items()}
            for row in frame.to_dict(orient="records")]


def _finding_key(finding: dict) -> str:
    return str(finding.get("rule"))


def compare_runs(a: LoadedRun, b: LoadedRun, top: int = 10) -> RunComparison:
    """Side by side numbers of two analyzed runs."""
    cats_a, cats_b = step_categories_ms(a.analysis), step_categories_ms(b.analysis)
    rows = []
    for category in IN_STEP_CATEGORIES + ["collectives_overlapped"]:
        ms_a, ms_b = cats_a.get(category, 0.0), cats_b.get(category, 0.0)
        rows.append({"category": category, "a_ms": ms_a, "b_ms": ms_b, "delta_ms": ms_b - ms_a,
                     "a_share": ms_a / cats_a["step_time_ms"], "b_share": ms_b / cats_b["step_time_ms"]})
    breakdown = pd.DataFrame(rows)

    ops_a, ops_b = ops_per_step(a.analysis), ops_per_step(b.analysis)
    ops = ops_a.merge(ops_b, on="name", how="outer", suffixes=("_a", "_b"))
    ops["category"] = ops["category_a"].fillna(ops["category_b"])
    ops["a_ms"] = ops["ms_per_step_a"].fillna(0.0)
    ops["b_ms"] = ops["ms_per_step_b"].fillna(0.0)
    ops["delta_ms"] = ops["b_ms"] - ops["a_ms"]
    ops["status"] = np.where(ops["ms_per_step_a"].isna(), "new",
                             np.where(ops["ms_per_step_b"].isna(), "gone", "changed"))
    ops = ops.reindex(ops["delta_ms"].abs().sort_values(ascending=False).index).head(top)
    ops = ops[["name", "category", "a_ms", "b_ms", "delta_ms", "status"]].reset_index(drop=True)

    per_chip_unit = "examples/s per chip" if a.facts.get("global_batch") and b.facts.get("global_batch") \
        else "steps/s per chip"
    if per_chip_unit == "steps/s per chip":  # one unit for both, or the two numbers do not compare
        tpc = {"a": 1e3 / cats_a["step_time_ms"] / a.facts["chips"] if a.facts.get("chips") else None,
               "b": 1e3 / cats_b["step_time_ms"] / b.facts["chips"] if b.facts.get("chips") else None}
    else:
        tpc = {"a": throughput_per_chip(a, cats_a["step_time_ms"]),
               "b": throughput_per_chip(b, cats_b["step_time_ms"])}
    findings_a = {_finding_key(f): f for f in a.analysis.findings or []}
    findings_b = {_finding_key(f): f for f in b.analysis.findings or []}
    return RunComparison(
        a=a.label, b=b.label, step_a_ms=cats_a["step_time_ms"], step_b_ms=cats_b["step_time_ms"],
        breakdown=breakdown, ops=ops,
        findings_appeared=[_brief(findings_b[k]) for k in findings_b if k not in findings_a],
        findings_resolved=[_brief(findings_a[k]) for k in findings_a if k not in findings_b],
        findings_kept=sorted(k for k in findings_a if k in findings_b),
        warnings=size_warnings(a, b),
        throughput_per_chip={**tpc, "unit": per_chip_unit},
    )


def _brief(finding: dict) -> dict:
    return {key: finding.get(key) for key in ("rule", "severity", "recommendation") if key in finding}
