"""Catalog findings (design.md rule ids) for one analysed run.

Each finding: rule, severity (high/medium/low), evidence {summary, metrics, sql}, recommendation (the
catalog §3 technique worded for the run's platform), catalog (section), estimated_gain {ms, fraction,
own_ms, own_fraction, category, label: "estimate", model}, and caused_by (the rule id of the finding
that explains it) where one does. Metrics are the result of the evidence SQL (rules.py); causes and
gain combination are in tree.py; platform-aware advice in advice.py. ``scaling-limit`` is cross-run
(analyzer/scaling.py), not evaluated here. Contract: docs/findings.md, docs/json.md.
"""

from __future__ import annotations

from typing import Any

import duckdb
from tpuanalyze.analyzer.findings.advice import ADVICE, recommendation
from tpuanalyze.analyzer.findings.rules import RULES, Ctx, severity
from tpuanalyze.analyzer.findings.tree import resolve

__all__ = ["ADVICE", "RULE_IDS", "SEVERITY_ORDER", "evaluate_findings", "recommendation", "severity"]

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}
RULE_IDS = tuple(ADVICE)


def evaluate_findings(con: duckdb.DuckDBPyConnection, rel: dict[str, str], run_id: int,
                      config: dict[str, Any], platform: dict[str, Any],
                      identity: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every rule that fires and applies to the run's platform and workload, as a tree: each root cause
    (most severe first, then by combined gain) followed by the findings it explains."""
    c = Ctx(con, rel, run_id, config, platform, identity)
    if not c.n:
        return []
    drafts: list[dict[str, Any]] = []
    for rule in RULES:
        drafts += rule(c)
    if not config["severity"]["report_low"]:
        drafts = [f for f in drafts if f["severity"] != "low"]
    return resolve(drafts, config, c.step)
