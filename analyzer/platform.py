"""Training or inference, from the trace itself, and the platform as the findings' advice needs it.

Findings word their advice for the platform found and keep training advice to training runs. The
platform (kind, vendor, generation) is the run's identity (analyzer/identity.py, from the device planes'
own stats); this module adds what the workload does: training is recognised by what only training
executes: optimizer / weight-update ops (the ``weight_update`` category), gradient and backward ops,
training programs and step annotations (``patterns.training`` in analyzer/thresholds.toml). A trace with
none of them is treated as inference. Nothing here reads generator-only metadata.
"""

from __future__ import annotations

from typing import Any

import duckdb
from tpuanalyze.analyzer.classify import sql_literal
from tpuanalyze.analyzer.event_partials import partial

# TPU generations whose chips form a 3-D torus over ICI (v4, v5p); the others (v2, v3, v5e, v6e) a 2-D one
TORUS_3D = {"v4", "v5p"}


def _training_evidence(con: duckdb.DuckDBPyConnection, run_id: int, rel: dict[str, str],
                       config: dict[str, Any]) -> str | None:
    """A short statement of what shows training, or None. The example named is chosen
    deterministically (the most frequent name, then the first by name), so the same trace always
    reads the same, however its rows were loaded."""
    updates = con.execute(
        f"SELECT count(*), min(short_name) FROM {rel['att_ops']} WHERE category = 'weight_update'"
    ).fetchone()
    if updates and updates[0]:
        return f"{updates[0]:,} optimizer/weight-update ops (e.g. {updates[1]})"
    pattern = sql_literal(config["patterns"]["training"])
    row = con.execute(  # the pattern runs once per distinct name, not per event
        f"SELECT sum(n), first(name ORDER BY n DESC, name) FROM "
        f"(SELECT name, sum(n) AS n FROM {partial(rel, 'event_names', run_id)} GROUP BY name)"
        f" WHERE regexp_matches(name, {pattern})").fetchone()
    if row and row[0]:
        return (f"{row[0]:,} training events (gradients, backward, optimizer or train steps; "
                f"e.g. {row[1][:60]})")
    return None


def workload_mode(con: duckdb.DuckDBPyConnection, run_id: int, rel: dict[str, str],
                  config: dict[str, Any]) -> dict[str, str]:
    """``identity.workload.mode`` / ``mode_evidence`` (docs/json.md): training or inference, and why."""
    evidence = _training_evidence(con, run_id, rel, config)
    return {"mode": "training" if evidence else "inference",
            "mode_evidence": evidence or "no optimizer, gradient, backward or train-step events in the trace"}


def advice_platform(identity: dict[str, Any]) -> dict[str, Any]:
    """What the advice depends on: family (TPU / GPU / CPU, None unknown), generation, vendor, mode."""
    platform = identity.get("platform") or {}
    workload = identity.get("workload") or {}
    kind = platform.get("kind")
    return {"family": kind.upper() if kind else None, "generation": platform.get("generation"),
            "vendor": platform.get("vendor"), "mode": workload.get("mode")}
