"""Per result folder: the MLPerf time to train (olympic mean), epochs, evals, batch, optimizer, chips.

Scoring follows the MLPerf result summarizer of each round (mlcommons/logging):
- v0.6 (``:::MLL`` logs): the summarizer took ``run_stop - run_start`` of every result file without
  checking the status, sorted, and dropped the best and the worst.
- v0.7 and later: a run whose ``run_stop`` status is not ``success`` is dropped as non-converged;
  the best run is always dropped, the worst only when no run was dropped (the dropped run stands for
  it). More than one dropped run makes the summarizer flag the result as not correct: we keep the
  number and mark the method ``invalid``.
- Fewer than 3 counted runs (not a valid MLPerf submission, where the summarizer would divide by
  zero): the plain mean, method ``mean``; no counted run gives no time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd
from tpuanalyze.analyzer.workload_facts import facts_for, partition_for

SUMMARY_COLUMNS = [
    "folder", "submitter_path", "version", "benchmark", "framework", "cores", "chips", "runs",
    "counted_runs", "failed_runs", "time_to_train_s", "scoring", "epochs", "eval_count", "eval_share",
    "global_batch_size", "per_core_batch", "opt_name", "step_ms_est", "train_samples",
    "eval_s", "lead_s", "init_s", "examples_per_epoch", "partition",
]
# Eval spans covering nearly the whole run are asynchronous evaluation stamped from the block it
# overlaps (SSD's COCO eval, catalog §3.10): it runs beside training and costs the run ~nothing.
ASYNC_EVAL_COVERAGE = 0.9


@dataclass(frozen=True)
class OlympicScore:
    """A time to train and how it was scored (``olympic``, ``olympic-dropped-failed``, ``mean``...)."""

    seconds: float | None
    method: str
    counted: int
    dropped: int


def _is_legacy_ruleset(version: str | None) -> bool:
    return (version or "").strip().lower() in {"v0.5", "v0.6"}


def olympic_score(durations_s: Iterable[float], statuses: Iterable[str | None],
                  version: str | None) -> OlympicScore:
    """Time to train of one result folder, as the round's MLPerf result summarizer scores it."""
    pairs = [(float(d), s) for d, s in zip(durations_s, statuses, strict=True) if d is not None
             and not np.isnan(d)]
    if _is_legacy_ruleset(version):
        scores, dropped = sorted(d for d, _ in pairs), 0
    else:
        scores = sorted(d for d, s in pairs if (s or "").lower() == "success")
        dropped = len(pairs) - len(scores)
    if not scores:
        return OlympicScore(None, "none", 0, dropped)
    if len(scores) + dropped < 3 or len(scores) < 2:
        return OlympicScore(float(np.mean(scores)), "mean", len(scores), dropped)
    countable = scores[1:] if dropped else scores[1:-1]
    method = "olympic" if dropped == 0 else ("olympic-dropped-failed" if dropped == 1 else "invalid")
    return OlympicScore(float(np.mean(countable)), method, len(countable), dropped)


def step_estimates_ms(results: pd.DataFrame, intervals: pd.DataFrame) -> pd.Series:
    """Mean step time per result file from block stamps: block time / steps in the blocks [est].

    Steps per epoch = train_samples / global batch; in BERT logs an "epoch" is a step (catalog §5).
    JAX logs stamp block_stop at dispatch, so their blocks are an approximation (catalog §5).
    """
    blocks = intervals[(intervals["kind"] == "block") & intervals["start_ms"].notna()
                       & intervals["stop_ms"].notna() & intervals["epoch_count"].notna()]
    if blocks.empty:
        return pd.Series(dtype=float)
    per_file = blocks.assign(ms=blocks["stop_ms"] - blocks["start_ms"]).groupby("result_file").agg(
        block_ms=("ms", "sum"), epochs=("epoch_count", "sum"))
    info = results.set_index("result_file")[["benchmark", "train_samples", "global_batch_size"]]
    per_file = per_file.join(info, how="left")
    is_bert = per_file["benchmark"].str.lower().str.contains("bert", na=False)
    steps_per_epoch = np.where(is_bert, 1.0,
                               per_file["train_samples"] / per_file["global_batch_size"])
    steps = per_file["epochs"] * steps_per_epoch
    return (per_file["block_ms"] / steps).where(steps > 0)


def file_timeline(results: pd.DataFrame, intervals: pd.DataFrame | None) -> pd.DataFrame:
    """Per result file, from the logs' intervals: ``eval_s`` = evaluation wall time inside the run that
    training waits for (0 when asynchronous, see ASYNC_EVAL_COVERAGE), ``lead_s`` = run_start to the
    first training block (initialization inside the timed run), ``init_s`` = init_start..init_stop
    (before run_start: not part of the MLPerf time to train)."""
    out = pd.DataFrame({"result_file": results["result_file"]}).set_index("result_file")
    duration_s = ((results["run_stop_ms"] - results["run_start_ms"]) / 1000.0).to_numpy()
    eval_s = (results["eval_ms"] / 1000.0).to_numpy()
    sequential = np.where(eval_s < ASYNC_EVAL_COVERAGE * duration_s, eval_s, 0.0)
    out["eval_s"] = np.where(np.isnan(eval_s), 0.0, sequential)
    out["lead_s"], out["init_s"] = np.nan, np.nan
    if intervals is None or intervals.empty:
        return out
    blocks = intervals[intervals["kind"] == "block"].groupby("result_file")["start_ms"].min()
    runs = intervals[intervals["kind"] == "run"].groupby("result_file")["start_ms"].min()
    inits = intervals[intervals["kind"] == "init"].assign(
        s=lambda f: (f["stop_ms"] - f["start_ms"]) / 1000.0).groupby("result_file")["s"].first()
    out["lead_s"] = ((blocks - runs) / 1000.0).clip(lower=0).reindex(out.index)
    out["init_s"] = inits.reindex(out.index)
    return out


def summarize(results: pd.DataFrame, intervals: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per result folder (columns SUMMARY_COLUMNS), sorted by version, benchmark, chips."""
    results = results.copy()
    results["duration_s"] = (results["run_stop_ms"] - results["run_start_ms"]) / 1000.0
    steps = step_estimates_ms(results, intervals) if intervals is not None else pd.Series(dtype=float)
    timeline = file_timeline(results, intervals)
    rows = []
    for folder, group in results.groupby("folder", sort=False):
        first = group.iloc[0]
        score = olympic_score(group["duration_s"].tolist(), group["status"].tolist(), first["version"])
        legacy = _is_legacy_ruleset(first["version"])
        good = group if legacy else group[group["status"].str.lower() == "success"]
        good = good if not good.empty else group
        ok_durations = good["duration_s"].where(good["duration_s"] > 0)
        eval_share = (good["eval_ms"] / 1000.0 / ok_durations).mean() if good["eval_ms"].notna().any() \
            else None
        batch = _mode(group["global_batch_size"])
        cores = first["cores"]
        step_values = steps.reindex(good["result_file"]).dropna() if not steps.empty else steps
        rows.append({
            "folder": folder,
            "submitter_path": first["submitter_path"],
            "version": first["version"],
            "benchmark": first["benchmark"],
            "framework": first["framework"],
            "cores": _int_or_none(cores),
            "chips": _int_or_none(first["chips"]),
            "runs": len(group),
            "counted_runs": score.counted,
            "failed_runs": int((group["status"].fillna("").str.lower() != "success").sum()),
            "time_to_train_s": score.seconds,
            "scoring": score.method,
            "epochs": float(good["epochs"].mean()) if good["epochs"].notna().any() else None,
            "eval_count": float(good["eval_count"].mean()),
            "eval_share": float(eval_share) if eval_share is not None and not pd.isna(eval_share) else None,
            "global_batch_size": _int_or_none(batch),
            "per_core_batch": float(batch) / float(cores) if batch and cores else None,
            "opt_name": _mode(group["opt_name"]),
            "step_ms_est": float(step_values.mean()) if len(step_values) else None,
            "train_samples": _int_or_none(_mode(group["train_samples"])),
            **_timeline_means(timeline, _counted_files(good, dropped=len(group) - len(good))),
            "examples_per_epoch": _examples_per_epoch(_mode(group["train_samples"]), first["benchmark"],
                                                      batch),
            "partition": partition_for(first["version"], first["benchmark"], _int_or_none(first["chips"])),
        })
    summary = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return summary.sort_values(["version", "benchmark", "chips", "framework"], na_position="last",
                               ignore_index=True)


def _counted_files(good: pd.DataFrame, dropped: int) -> pd.Series:
    """The result files the olympic score averages (see olympic_score): the best dropped, and the worst
    when no failed run stands for it; all of them when there are too few to drop any."""
    ordered = good.sort_values("duration_s")["result_file"]
    if len(ordered) + dropped < 3 or len(ordered) < 2:
        return ordered
    return ordered.iloc[1:] if dropped else ordered.iloc[1:-1]


def _timeline_means(timeline: pd.DataFrame, files: pd.Series) -> dict[str, float | None]:
    """Means over the files the time to train counts, so evals and lead match the scored runs."""
    rows = timeline.reindex(files)
    return {k: (float(rows[k].mean()) if rows[k].notna().any() else None)
            for k in ("eval_s", "lead_s", "init_s")}


def _examples_per_epoch(logged, benchmark: str, batch) -> int | None:
    """Logged ``train_samples`` / ``num_train_examples``, else the benchmark's documented constant.
    In BERT logs an "epoch" is a step (catalog §5): one global batch."""
    if "bert" in str(benchmark).lower():
        return _int_or_none(batch)
    if logged is not None and not pd.isna(logged):
        return int(logged)
    facts = facts_for(benchmark)
    return facts.examples_per_epoch if facts else None


def _mode(values: pd.Series):
    values = values.dropna()
    return values.mode().iloc[0] if not values.empty else None


def _int_or_none(value) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def summarize_db(con: duckdb.DuckDBPyConnection, run_ids: Iterable[int] | None = None) -> pd.DataFrame:
    """Summaries of the MLPerf runs stored in a database (``tpuanalyze ingest`` or ``ingest_mlperf``)."""
    where, params = "", []
    if run_ids is not None:
        ids = list(run_ids)
        where = f"WHERE r.run_id IN ({', '.join('?' for _ in ids)})"
        params = ids
    results = con.execute(
        "SELECT runs.source_path AS folder, r.*, "
        "  TRY_CAST(json_extract(r.hyperparameters, '$.train_samples') AS BIGINT) AS train_samples_a, "
        "  TRY_CAST(json_extract(r.hyperparameters, '$.num_train_examples') AS BIGINT) AS train_samples_b "
        f"FROM mlperf_results r JOIN runs USING (run_id) {where}", params).df()
    results["train_samples"] = results["train_samples_a"].fillna(results["train_samples_b"])
    intervals = con.execute(
        f"SELECT i.* FROM mlperf_intervals i WHERE i.run_id IN (SELECT run_id FROM mlperf_results r {where})",
        params).df()
    return summarize(results, intervals)


def scaling_series(summary: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per (version, benchmark, framework) measured at 2+ chip counts: the table the scaling fit takes
    (run, chips, cores, time_to_train_s, epochs, global_batch, per_core_batch, and for the time-to-train
    model eval_s, eval_count, lead_s, init_s, examples_per_epoch, partition, version, benchmark)."""
    frame = summary[summary["time_to_train_s"].notna() & summary["chips"].notna()].copy()
    frame["framework"] = frame["framework"].astype(object).fillna("")
    series: dict[str, pd.DataFrame] = {}
    for (version, benchmark, framework), group in frame.groupby(["version", "benchmark", "framework"]):
        if group["chips"].nunique() < 2:
            continue
        name = " ".join(part for part in (version, benchmark, framework) if part)
        series[name] = pd.DataFrame({
            "run": group["submitter_path"], "chips": group["chips"].astype(int),
            "cores": group["cores"].astype(float), "time_to_train_s": group["time_to_train_s"],
            "epochs": group["epochs"], "global_batch": group["global_batch_size"],
            "per_core_batch": group["per_core_batch"],
            "eval_s": group["eval_s"], "eval_count": group["eval_count"], "lead_s": group["lead_s"],
            "init_s": group["init_s"], "examples_per_epoch": group["examples_per_epoch"],
            "partition": group["partition"], "version": version, "benchmark": benchmark,
            "folder": group["folder"],
        }).sort_values("chips", ignore_index=True)
    return series
