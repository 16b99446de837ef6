"""Capture health: what about a capture itself limits the analysis (docs/json.md, `capture.warnings`).

Each warning is ``{"code", "message", ...details}``; the codes are a contract. They describe the trace,
not the workload: empty device planes, warm-up steps left out, hosts the capture names but did not
write, clocks of hosts that disagree, a profile window or event limit that cuts the run, and the
profiler's own errors and warnings (XSpace ``errors`` / ``warnings``).
"""

from __future__ import annotations

import json
import math
from typing import Any

import duckdb
import pandas as pd

# Stats a capture may carry that state how many hosts (tasks) the job ran on.
_HOST_COUNT_STATS = ("host_count", "num_hosts", "hosts", "task_count", "num_tasks", "world_size")


def _warning(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **details}


def _empty_device_planes(con: duckdb.DuckDBPyConnection, run_id: int, rel: dict[str, str]) -> list[dict]:
    """Device planes with no op timeline: no events at all, or only memory copies."""
    rows = con.execute(
        f"""WITH busy AS (
                SELECT DISTINCT host, device FROM {rel['att_ops']}
                WHERE category NOT IN ('input', 'output', 'memory_transfer'))
            SELECT p.host, p.name, p.kind, p.num_events, b.device IS NOT NULL AS has_ops
            FROM planes p LEFT JOIN busy b ON b.host = p.host AND b.device = p.device_ordinal
            WHERE p.run_id = ? AND p.kind IN ('tpu', 'gpu')
            ORDER BY p.host, p.plane_index""", [int(run_id)]
    ).fetchall()
    if not rows or all(has_ops for *_, has_ops in rows) or not any(has_ops for *_, has_ops in rows):
        # all planes empty is "nothing to attribute" (a note says so); none empty is healthy
        return []
    empty = [(host, name, n) for host, name, _kind, n, has_ops in rows if not has_ops]
    kind = rows[0][2].upper()
    names = ", ".join(name for _h, name, _n in empty)
    with_copies = sum(1 for *_, n in empty if n)
    detail = f" ({with_copies} with memory copies only)" if with_copies else ""
    return [_warning(
        "empty-device-planes",
        f"{len(empty)} of {len(rows)} {kind} device planes carry no op timeline{detail}: {names}; "
        f"the breakdown covers the other {len(rows) - len(empty)}",
        empty=len(empty), total=len(rows), planes=[{"host": h, "plane": n} for h, n, _ in empty])]


def _warmup(steps: pd.DataFrame, kept: bool) -> list[dict]:
    if steps.empty or "is_warmup" not in steps or not steps["is_warmup"].any():
        return []
    train = steps[~steps["is_eval"]]
    warm = train[train["is_warmup"]]
    rest = train[~train["is_warmup"]]
    warm_ms = warm.groupby("step_num")["duration_ps"].mean() / 1e9
    median_ms = float(rest.groupby("step_num")["duration_ps"].mean().median() / 1e9) if len(rest) else None
    nums = [int(n) for n in warm_ms.index]
    what = "kept in" if kept else "left out of"
    med = f" vs median {median_ms:.1f} ms" if median_ms is not None else ""
    return [_warning(
        "warmup-step",
        f"warm-up step{'s' if len(nums) > 1 else ''} {', '.join(map(str, nums))} "
        f"({', '.join(f'{v:.1f} ms' for v in warm_ms)}{med}) {'include' if len(nums) > 1 else 'includes'} "
        "compilation or start-up; "
        f"{what} step-time statistics" + ("" if kept else " (`--keep-warmup` keeps them)"),
        steps=nums, step_ms=[float(v) for v in warm_ms], median_ms=median_ms, kept=kept)]


def _stated_hosts(con: duckdb.DuckDBPyConnection, run_id: int,
                  identity: dict[str, Any] | None) -> tuple[int | None, str | None]:
    """The job's host count where the capture states it: the run identity's job size (collective
    replica groups, else the TPU planes' global chip ids as a lower bound; analyzer/identity.py), the
    hostnames listed in the XSpaces, or a host/task count stat on the Task Environment plane. The largest
    statement wins; None when the trace does not say."""
    best: int | None = None
    source: str | None = None

    def offer(value: int | None, why: str) -> None:
        nonlocal best, source
        if value is not None and value > 0 and (best is None or value > best):
            best, source = int(value), why

    ident = identity or {}
    offer(ident.get("hosts_in_job"), "the collectives' replica groups span the job's devices")
    chips, hosts = ident.get("chips_captured"), ident.get("hosts_captured")
    at_least = ident.get("chips_at_least")
    if chips and hosts and at_least and at_least > chips:
        per_host = chips / hosts
        offer(math.ceil(at_least / per_host),
              f"the TPU planes' global chip ids (core_details) reach chip {at_least - 1} with "
              f"{per_host:g} chips per host: at least that many hosts (or processes)")
    named = con.execute(
        "SELECT count(DISTINCT h) FROM (SELECT unnest(hostnames) AS h FROM hosts WHERE run_id = ?) "
        "WHERE h <> ''", [int(run_id)]).fetchone()[0]
    offer(int(named) if named else None, "XSpace hostnames")
    for (stats,) in con.execute(
            # only the profiler's Task Environment plane: /host:metadata stats are the generator's own
            "SELECT stats FROM planes WHERE run_id = ? AND name = 'Task Environment' AND stats IS NOT NULL",
            [int(run_id)]).fetchall():
        values = json.loads(stats) if isinstance(stats, str) else stats
        for key in _HOST_COUNT_STATS:
            value = values.get(key) if isinstance(values, dict) else None
            if isinstance(value, (int, float)):
                offer(int(value), f"Task Environment stat {key}")
    return best, source


def _hosts_missing(con: duckdb.DuckDBPyConnection, run_id: int,
                   identity: dict[str, Any] | None) -> list[dict]:
    written = con.execute("SELECT count(*) FROM hosts WHERE run_id = ?", [int(run_id)]).fetchone()[0]
    stated, source = _stated_hosts(con, run_id, identity)
    if stated is None or not written or written >= stated:
        return []
    return [_warning(
        "hosts-missing",
        f"{written} host file(s) written, the job has {stated} ({source}); cross-host figures "
        "(stragglers, skew, the worst host) cover only the hosts written",
        hosts_written=int(written), hosts_stated=stated, source=source)]


def _clock_skew(steps: pd.DataFrame, max_fraction: float, min_steps: int) -> list[dict]:
    """Hosts of a synchronous job start each step together (the collectives line them up); a steady
    offset between hosts' step starts beyond max_fraction of the median step is a clock disagreement."""
    if steps.empty or steps["host"].nunique() < 2:
        return []
    train = steps[~steps["is_eval"] & ~steps["is_warmup"]]
    starts = train.groupby(["step_num", "host"])["start_ps"].min().unstack("host").dropna()
    if len(starts) < min_steps:
        return []
    spread = (starts.max(axis=1) - starts.min(axis=1)) / 1e9
    step_ms = float(train.groupby("step_num")["duration_ps"].mean().median() / 1e9)
    skew_ms = float(spread.median())
    if not step_ms or skew_ms <= max_fraction * step_ms:
        return []
    offsets = (starts.sub(starts.min(axis=1), axis=0) / 1e9).median()
    worst = str(offsets.idxmax())
    return [_warning(
        "clock-skew",
        f"hosts' step starts differ by {skew_ms:.2f} ms (median over {len(starts)} steps; "
        f"{skew_ms / step_ms:.0%} of the {step_ms:.2f} ms step, threshold {max_fraction:.0%}); worst host "
        f"{worst}: cross-host timing (stragglers, sync waits) is unreliable",
        skew_ms=skew_ms, step_ms=step_ms, threshold_fraction=max_fraction, worst_host=worst)]


def _truncated_steps(steps: pd.DataFrame, partial_fraction: float,
                     activity: pd.DataFrame | None = None) -> list[dict]:
    """A first or last step much shorter than the median: the profile window cut it. With ``activity``
    (per host and device_ordinal: first_ps, last_ps of its captured program executions, steps and eval
    spans) a short step with captured activity before it (first) or after it (last) is no cut: the
    window saw past it, the step is only short (a smaller problem size, another program's step)."""
    if steps.empty:
        return []
    # per device (in host, device order), its train steps by start: the first and the last step of a
    # device with at least 3 steps that is shorter than partial_fraction x the device's median
    train = steps[~steps["is_eval"] & steps["host"].notna() & steps["device_ordinal"].notna()]
    train = train.sort_values(["host", "device_ordinal", "start_ps"], kind="stable")
    by_device = train.groupby(["host", "device_ordinal"], sort=False)["duration_ps"]
    short = ((by_device.transform("size") >= 3)
             & (train["duration_ps"] < partial_fraction * by_device.transform("median")))
    at_first, at_last = pd.Series(True, index=train.index), pd.Series(True, index=train.index)
    if activity is not None and not activity.empty and short.any():
        seen = train[["host", "device_ordinal"]].merge(activity, on=["host", "device_ordinal"], how="left")
        seen.index = train.index
        at_first = ~(seen["first_ps"] < train["start_ps"])  # nothing captured before it on its device
        at_last = ~(seen["last_ps"] > train["start_ps"] + train["duration_ps"])
    cut: dict[str, list[int]] = {}
    for edge, at_edge in (("first", (by_device.cumcount() == 0) & at_first),
                          ("last", (by_device.cumcount(ascending=False) == 0) & at_last)):
        cut[edge] = [int(n) for n in pd.unique(train.loc[short & at_edge, "step_num"].astype("int64"))]
    if not cut["first"] and not cut["last"]:
        return []
    parts = [f"{edge} step {', '.join(map(str, nums))}" for edge, nums in cut.items() if nums]
    return [_warning(
        "truncated",
        f"the profile window cuts the run: {' and '.join(parts)} shorter than {partial_fraction:.0%} of the "
        "median step (partial)",
        first_steps=cut["first"], last_steps=cut["last"], threshold_fraction=partial_fraction)]


def _device_activity(con: duckdb.DuckDBPyConnection, rel: dict[str, str]) -> pd.DataFrame:
    """Per device: the first start and last end of its captured program executions, steps, eval spans."""
    return con.execute(f"""
        SELECT host, device AS device_ordinal, min(start_ps) AS first_ps, max(end_ps) AS last_ps FROM (
            SELECT host, device, start_ps, end_ps FROM {rel['att_programs']}
            UNION ALL SELECT host, device, start_ps, end_ps FROM {rel['att_steps']}
            UNION ALL SELECT host, device, start_ps, end_ps FROM {rel['att_eval_spans']})
        GROUP BY ALL""").df()


def _truncated_event_limit(con: duckdb.DuckDBPyConnection, run_id: int, limit: int) -> list[dict]:
    """Chrome-trace JSON written by TF/JAX stops at a fixed event count (1M): a file at that count
    lost everything after it."""
    rows = con.execute(
        """SELECT e.host, count(*) FROM events e JOIN runs r USING (run_id)
           WHERE e.run_id = ? AND r.source_format = 'chrome_json' GROUP BY e.host""",
        [int(run_id)]).fetchall()
    capped = [(h, n) for h, n in rows if limit <= n <= limit * 1.01]
    if not capped:
        return []
    return [_warning(
        "truncated",
        f"{len(capped)} trace file(s) hold {capped[0][1]:,} events, the trace.json event limit ({limit:,}): "
        "events after it were dropped by the profiler, so the run's end is missing",
        hosts=[h for h, _ in capped], event_limit=limit)]


def _profiler_messages(con: duckdb.DuckDBPyConnection, run_id: int) -> list[dict]:
    rows = con.execute(
        "SELECT host, errors, warnings FROM hosts WHERE run_id = ? ORDER BY host", [int(run_id)]).fetchall()
    out = []
    for host, errors, warnings in rows:
        for code, texts in (("profiler-error", errors), ("profiler-warning", warnings)):
            for text in texts or []:
                out.append(_warning(code, f"{host}: the profiler recorded: {text}", host=host))
    return out


def capture_warnings(con: duckdb.DuckDBPyConnection, run_id: int, rel: dict[str, str],
                     steps: pd.DataFrame, config: dict[str, Any],
                     identity: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """All capture-health warnings of one run, in a fixed order of codes. ``identity`` is the run's
    identity (analyzer/identity.py): its job size is the first statement of the job's hosts."""
    th = config["capture"]
    kept = bool(config["warmup"].get("keep"))
    warnings: list[dict[str, Any]] = []
    warnings += _empty_device_planes(con, run_id, rel)
    warnings += _warmup(steps, kept)
    warnings += _hosts_missing(con, run_id, identity)
    warnings += _clock_skew(steps, float(th["clock_skew_fraction"]), int(th["clock_skew_min_steps"]))
    warnings += _truncated_steps(steps, float(th["partial_step_fraction"]), _device_activity(con, rel))
    warnings += _truncated_event_limit(con, run_id, int(th["trace_json_event_limit"]))
    warnings += _profiler_messages(con, run_id)
    return warnings
