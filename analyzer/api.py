"""Public analyzer API: step-time attribution, collectives, input, ops and findings for a run.

    analyze_run(con, run_id, thresholds=None) -> RunAnalysis
    analyze_db(db_path, run_ids=None) -> list[RunAnalysis]
    report_json(analyses, cross_run_findings=None) -> {"runs": [summary, ...], "cross_run": {...}}

`RunAnalysis.summary` is exactly the JSON contract's run object (docs/json.md); the DataFrames hold the
same numbers in detail (docs/attribution.md). The analysis reads the trace database only.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
from tpuanalyze.analyzer import attribution, per_host
from tpuanalyze.analyzer.attribution import materialize_run
from tpuanalyze.analyzer.batch_reduce import BatchReduce
from tpuanalyze.analyzer.capture_health import capture_warnings
from tpuanalyze.analyzer.collectives import CollectivePartials, collectives_frame
from tpuanalyze.analyzer.config import load_thresholds
from tpuanalyze.analyzer.coverage import uncovered_notes
from tpuanalyze.analyzer.findings import evaluate_findings
from tpuanalyze.analyzer.identity import run_identity
from tpuanalyze.analyzer.input import host_input_work, input_frame
from tpuanalyze.analyzer.mapped import materialize_mapped
from tpuanalyze.analyzer.notes import step_program_note, trace_notes
from tpuanalyze.analyzer.ops import ops_frame
from tpuanalyze.analyzer.per_host import host_batches, largest_batch_events, materialize_per_host
from tpuanalyze.analyzer.platform import advice_platform, workload_mode
from tpuanalyze.analyzer.resources import scratch_database
from tpuanalyze.analyzer.roofline import add_roofline, device_peaks, programs_roofline, roofline_summary
from tpuanalyze.analyzer.steps import (
    CATEGORIES,
    per_core_frame,
    per_host_frame,
    programs_frame,
    step_times_ms,
    steps_frame,
)
from tpuanalyze.store.database import open_database

from tpuanalyze.errors import TpuAnalyzeError

__all__ = ["RunAnalysis", "analyze_run", "analyze_mapped", "analyze_db", "report_json", "install_views",
           "load_thresholds"]


@dataclass
class RunAnalysis:
    """Everything the analyzer knows about one run (see docs/json.md and docs/attribution.md)."""

    summary: dict[str, Any]
    steps: pd.DataFrame
    per_core: pd.DataFrame
    per_host: pd.DataFrame
    collectives: pd.DataFrame
    input: pd.DataFrame
    ops: pd.DataFrame
    findings: list[dict[str, Any]] = field(default_factory=list)
    run_id: int | None = None
    roofline_programs: pd.DataFrame = field(default_factory=pd.DataFrame)  # docs/json.md `roofline`


def _run_row(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[str, Any]:
    cur = con.execute(
        "SELECT run_id, name, source_path, source_format, device_type, num_hosts, num_devices, metadata "
        "FROM runs WHERE run_id = ?", [int(run_id)]
    )
    row = cur.fetchone()
    if row is None:
        raise TpuAnalyzeError(f"no run with id {run_id} in the database")
    return dict(zip([d[0] for d in cur.description], row, strict=True))


def _device_type(con: duckdb.DuckDBPyConnection, run_id: int, run: dict[str, Any]) -> str | None:
    if run.get("device_type") and run["device_type"] != "CPU":
        return run["device_type"]
    row = con.execute(
        "SELECT any_value(device_type), any_value(kind) FROM planes "
        "WHERE run_id = ? AND kind IN ('tpu', 'gpu') AND num_events > 0", [int(run_id)]
    ).fetchone()
    if row and (row[0] or row[1]):
        return row[0] or row[1].upper()
    host_ops, gpu_kernels = con.execute(
        "SELECT count(*) FILTER (WHERE plane LIKE '/host:%' AND json_extract_string(stats, '$.hlo_op') "
        "IS NOT NULL), count(*) FILTER (WHERE json_extract_string(stats, '$.cat') IN ('Kernel', 'kernel'))"
        " FROM events WHERE run_id = ?", [int(run_id)]
    ).fetchall()[0]
    return "GPU" if gpu_kernels else "CPU" if host_ops else None


def _stats(values: Iterable[float]) -> dict[str, float | None]:
    vals = [float(v) for v in values]
    if not vals:
        return {"mean": None, "median": None, "min": None, "max": None}
    return {"mean": statistics.fmean(vals), "median": statistics.median(vals),
            "min": min(vals), "max": max(vals)}


def _breakdown_summary(per_core: pd.DataFrame, per_host: pd.DataFrame) -> dict[str, Any]:
    """Mean over devices of each category's fraction of wall time, plus min/max and the worst device."""
    if per_core.empty:
        return {"breakdown": dict.fromkeys(CATEGORIES, 0.0), "collectives_overlapped": 0.0,
                "across_cores": {}}
    breakdown = {c: float(per_core[c].fillna(0).mean()) for c in CATEGORIES}
    across: dict[str, Any] = {}
    for c in CATEGORIES:
        col = per_core[c].fillna(0)
        worst = per_core.loc[col.idxmax()] if c != "compute" else per_core.loc[col.idxmin()]
        across[c] = {
            "mean": breakdown[c], "min": float(col.min()), "max": float(col.max()),
            "worst_core": {"host": worst["host"], "device_ordinal": int(worst["device_ordinal"])},
            "worst_host": (per_host.loc[per_host[c].fillna(0).idxmin() if c == "compute"
                                        else per_host[c].fillna(0).idxmax(), "host"]),
        }
    return {
        "breakdown": breakdown,
        "collectives_overlapped": float(per_core["collectives_overlapped"].fillna(0).mean()),
        "across_cores": across,
    }


def _detail_summary(steps: pd.DataFrame, inputs: pd.DataFrame, collectives: pd.DataFrame,
                    ops: pd.DataFrame, host_work: dict[str, float]) -> dict[str, Any]:
    """Extra summary keys: input per core (max vs mean: a slow host), weight update and whether it is
    sharded, collectives per kind, FLOP utilization (docs/json.md)."""
    train = steps[~steps["is_eval"]] if not steps.empty else steps
    step_ps = float(train["duration_ps"].sum()) if len(train) else 0.0
    out: dict[str, Any] = {}
    if not inputs.empty:
        worst = inputs.loc[inputs["infeed_ms_per_step"].idxmax()]
        out["input"] = {
            "infeed_ms_per_step_mean": float(inputs["infeed_ms_per_step"].mean()),
            "infeed_ms_per_step_max": float(worst["infeed_ms_per_step"]),
            "worst_host": worst["host"], "worst_device_ordinal": int(worst["device_ordinal"]),
            "host_enqueue_ms": host_work["enqueue_ms"], "host_processing_ms": host_work["non_enqueue_ms"],
        }
    kinds = set(collectives["kind"]) if not collectives.empty else set()
    wu_ps = float(train["weight_update_ps"].sum()) if len(train) else 0.0
    out["weight_update"] = {
        "ms_per_step": wu_ps / len(train) / 1e9 if len(train) else 0.0,
        "fraction_of_step": wu_ps / step_ps if step_ps else 0.0,
        "sharded": bool({"reduce-scatter", "all-gather"} & kinds),
    }
    out["collectives"] = [
        {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
        for row in collectives.to_dict("records")
    ]
    # FLOPs / (time x peak) over ops with a known peak: sum(flops) / sum(flops / utilization)
    out["flop_utilization"] = None
    if not ops.empty:
        mask = ops["flop_utilization"].notna() & (ops["flops"].fillna(0) > 0)
        if mask.any():
            flops = ops.loc[mask, "flops"]
            out["flop_utilization"] = float(flops.sum() / (flops / ops.loc[mask, "flop_utilization"]).sum())
    return out


def analyze_run(con: duckdb.DuckDBPyConnection, run_id: int,
                thresholds: Mapping[str, Any] | str | Path | None = None) -> RunAnalysis:
    """Attribute one run's step time and evaluate the catalog rules. Works on read-only connections
    (intermediate relations are TEMP tables ``ta_*`` of this connection). A run larger than one batch
    of hosts is attributed batch by batch (analyzer/per_host.py), its per-op relation in a scratch
    database deleted afterwards, DuckDB's memory capped meanwhile (analyzer/resources.py); the top
    ops, collectives and infeed are then combined from each batch's partial aggregates
    (analyzer/batch_reduce.py)."""
    config = load_thresholds(thresholds)
    run = _run_row(con, run_id)
    progress = con.execute("SELECT current_setting('enable_progress_bar')").fetchall()[0][0]
    con.execute("SET enable_progress_bar = false")  # no DuckDB bars on the user's stdout
    try:
        batches = host_batches(con, run_id)
        largest = largest_batch_events(con, run_id)
        # a small run at once by the whole-run SQL; a larger one batch by batch, with the batch engine,
        # also when it is one large host (6M events: 36 -> 9 s, 5.1 -> 1.5 GB, the same JSON); a batch
        # exceeds BATCH_EVENTS only as a single host, so this is "the whole run within BATCH_EVENTS"
        if len(batches) < 2 and largest <= per_host.BATCH_EVENTS:
            rel = materialize_run(con, run_id, config)
            return _analyze(con, run_id, run, config, rel)
        with scratch_database(con, largest):
            reduce = BatchReduce(run_id, keep_warmup=bool(config["warmup"].get("keep")))
            rel = materialize_per_host(con, run_id, config, batches, on_batch=reduce.add_batch)
            reduce.finish(con)
            rel.update(reduce.relations())
            return _analyze(con, run_id, run, config, rel, reduce.collectives)
    finally:
        con.execute(f"SET enable_progress_bar = {'true' if progress else 'false'}")


def analyze_mapped(con: duckdb.DuckDBPyConnection, run_id: int, results: Sequence[Any],
                   thresholds: Mapping[str, Any] | str | Path | None = None) -> RunAnalysis:
    """``analyze_run`` for a run whose batches of hosts were attributed where they were read
    (analyzer/batch_map.py: the map workers' ``BatchResult`` of each, in batch order): the reduce
    alone (analyzer/mapped.py), then the same analysis."""
    config = load_thresholds(thresholds)
    run = _run_row(con, run_id)
    progress = con.execute("SELECT current_setting('enable_progress_bar')").fetchall()[0][0]
    con.execute("SET enable_progress_bar = false")
    try:
        rel, collectives = materialize_mapped(con, run_id, results)
        return _analyze(con, run_id, run, config, rel, collectives)
    finally:
        con.execute(f"SET enable_progress_bar = {'true' if progress else 'false'}")


def _analyze(con: duckdb.DuckDBPyConnection, run_id: int, run: dict[str, Any], config: dict[str, Any],
             rel: dict[str, str], collective_partials: CollectivePartials | None = None) -> RunAnalysis:
    """The run's analysis from its attribution relations (``rel``: stage -> relation, plus the
    partial aggregates of a run attributed batch by batch, analyzer/batch_reduce.py)."""
    steps = steps_frame(con, rel)
    per_core = per_core_frame(con, rel)
    per_host = per_host_frame(con, rel)
    keep_warmup = bool(config["warmup"].get("keep"))
    collectives = collectives_frame(con, rel, collective_partials, keep_warmup=keep_warmup)
    inputs = input_frame(con, rel)
    ops = ops_frame(con, run_id, rel)
    peaks = device_peaks(con, run_id, run.get("device_type"))
    ops = add_roofline(ops, peaks)
    roof_programs = programs_roofline(ops, peaks)
    step_ms = step_times_ms(con, rel, keep_warmup=keep_warmup)
    hosts = con.execute("SELECT count(*) FROM hosts WHERE run_id = ?", [int(run_id)]).fetchone()[0]
    devices = int(per_core.shape[0]) if not per_core.empty else int(run.get("num_devices") or 0)
    bd = _breakdown_summary(per_core, per_host)
    n_train = int(step_ms.shape[0])
    summary: dict[str, Any] = {
        "run": run["name"],
        "device_type": _device_type(con, run_id, run),
        "hosts": int(hosts or run.get("num_hosts") or 0),
        "devices": devices,
        "steps": n_train,
        "step_time_ms": _stats(step_ms),
        "breakdown": bd["breakdown"],
        "collectives_overlapped": bd["collectives_overlapped"],
        "findings": [],
        "run_id": int(run_id),
        "eval_steps": int(steps.loc[steps["is_eval"]].groupby("step_num", dropna=False).ngroups)
        if not steps.empty else 0,
        "warmup_steps": int(steps.loc[steps["is_warmup"] & ~steps["is_eval"], "step_num"].nunique())
        if not steps.empty else 0,
        "across_cores": bd["across_cores"],
        "notes": (["an MLPerf result log, not a trace: nothing to attribute (see `tpuanalyze mlperf`)"]
                  if run.get("source_format") == "mlperf" else trace_notes(con, rel, steps)),
    }
    summary["identity"] = run_identity(con, run_id, summary["device_type"], devices, rel)
    analysis = RunAnalysis(summary=summary, steps=steps, per_core=per_core, per_host=per_host,
                           collectives=collectives, input=inputs, ops=ops, run_id=int(run_id),
                           roofline_programs=roof_programs)
    host_work = host_input_work(con, run_id, config, rel)
    summary.update(_detail_summary(steps, inputs, collectives, ops, host_work))
    summary["roofline"] = roofline_summary(ops, roof_programs, peaks)
    # before the findings, so a rule can read what the capture lacks
    summary["capture"] = {"warnings": capture_warnings(con, run_id, rel, steps, config,
                                                       summary.get("identity"))}
    programs = programs_frame(con, rel)
    if len(programs) > 1:
        summary["programs"] = programs.to_dict("records")
        summary["notes"] += step_program_note(programs)
    summary["identity"]["workload"].update(workload_mode(con, run_id, rel, config))
    analysis.findings = evaluate_findings(con, rel, int(run_id), config, advice_platform(summary["identity"]),
                                          summary["identity"])
    summary["findings"] = analysis.findings
    summary["notes"] += uncovered_notes(summary["breakdown"], analysis.findings, ops)
    return analysis


def install_views(con: duckdb.DuckDBPyConnection,
                  thresholds: Mapping[str, Any] | str | Path | None = None) -> list[str]:
    """Create the attribution views (step_breakdown, device_breakdown, collective_time, op_steps, att_*)
    over all runs of a writable database, so findings' evidence SQL runs in `tpuanalyze sql`."""
    return attribution.install_views(con, load_thresholds(thresholds))


def analyze_db(db_path: str | Path, run_ids: Iterable[int] | None = None,
               thresholds: Mapping[str, Any] | str | Path | None = None) -> list[RunAnalysis]:
    """Analyze runs of a database file (all trace runs when run_ids is None), read-only."""
    path = Path(db_path)
    if not path.exists():
        raise TpuAnalyzeError("no such database", str(path))
    con = open_database(path, read_only=True)
    try:
        if run_ids is None:
            run_ids = [r[0] for r in con.execute(
                "SELECT run_id FROM runs WHERE source_format <> 'mlperf' ORDER BY run_id").fetchall()]
        return [analyze_run(con, rid, thresholds) for rid in run_ids]
    finally:
        con.close()


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            return value.item()
        except (ValueError, AttributeError):
            return value
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    return value


# The JSON documents' shape version (docs/json.md): bumped when a key changes meaning or goes away;
# new keys do not bump it.
SCHEMA_VERSION = 2


def json_header() -> dict[str, Any]:
    """``schema_version`` and ``tool_version``, the first keys of every JSON document tpuanalyze writes."""
    from tpuanalyze import __version__

    return {"schema_version": SCHEMA_VERSION, "tool_version": __version__}


def report_json(analyses: Iterable[RunAnalysis],
                cross_run_findings: Iterable[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The JSON contract (docs/json.md): {"schema_version", "tool_version", "runs": [summary, ...]}, plus
    {"cross_run": {"findings": [...]}} when the report covers several runs (scaling-limit findings of
    their series, empty when none), plain JSON types only."""
    runs = [_jsonable(a.summary) for a in analyses]
    document: dict[str, Any] = {**json_header(), "runs": runs}
    cross = list(cross_run_findings or [])
    if len(runs) > 1 or cross:
        document["cross_run"] = {"findings": _jsonable(cross)}
    return document
