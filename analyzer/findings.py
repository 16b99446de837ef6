"""Catalog findings (design.md rule ids) from a RunAnalysis: severity, evidence, recommendation, gain."""

from __future__ import annotations

from typing import Any

from tpuanalyze.analyzer.api import RunAnalysis


def evaluate_findings(analysis: RunAnalysis, config: dict[str, Any], run_id: int,
                      host_input: dict[str, float] | None = None,
                      run_metadata: Any = None) -> list[dict[str, Any]]:
    """Every rule the trace supports, most severe first."""
    return []
