"""Input per device: infeed (or host-only input wait) per train step, raw and exposed (catalog §3.8:
infeed max >> average across cores = a slow host), and host-side input work on the host plane."""

from __future__ import annotations

from typing import Any

import duckdb
import pandas as pd
from tpuanalyze.analyzer.classify import sql_literal


def infeed_sql(op_rows: str) -> str:
    """Input op time per device over ``op_rows`` (op_steps' columns): a sum per host and device, so the
    sums of batches of hosts (analyzer/per_host.py) are the run's rows."""
    return (f"SELECT host, device_ordinal, sum(duration_ps) AS infeed_ps FROM {op_rows} "
            "WHERE category = 'input' AND step_start IS NOT NULL AND NOT step_is_eval GROUP BY ALL")


def input_frame(con: duckdb.DuckDBPyConnection, rel: dict[str, str]) -> pd.DataFrame:
    """host, device_ordinal, infeed_ms_per_step (input op time, or input wait on host-only traces),
    exposed_input_ms_per_step (attributed input), train_steps. ``rel['infeed_parts']``, when given, is
    a table of ``infeed_sql``'s rows (appended batch by batch); else they come from ``rel['op_steps']``."""
    infeed = (f"SELECT * FROM {rel['infeed_parts']}" if "infeed_parts" in rel
              else infeed_sql(rel["op_steps"]))
    return con.execute(
        f"""WITH s AS (
                SELECT host, device_ordinal, count(*) AS train_steps, sum(input_ps) AS exposed_ps
                FROM {rel['step_breakdown']} WHERE NOT is_eval GROUP BY ALL
            ), o AS ({infeed})
            SELECT s.host, s.device_ordinal,
                   coalesce(o.infeed_ps, s.exposed_ps) / s.train_steps / 1e9 AS infeed_ms_per_step,
                   s.exposed_ps / s.train_steps / 1e9 AS exposed_input_ms_per_step,
                   s.train_steps
            FROM s LEFT JOIN o USING (host, device_ordinal)
            ORDER BY s.host, s.device_ordinal"""
    ).df()


def host_input_work(con: duckdb.DuckDBPyConnection, run_id: int, config: dict[str, Any],
                    rel: dict[str, str]) -> dict[str, float]:
    """Host-plane input pipeline time per host within the steps' span (catalog §3.8): total time of
    host events matching the input pattern, split into enqueue (host->device transfer) and the rest."""
    pats = config["patterns"]
    row = con.execute(
        f"""WITH span AS (SELECT min(start_ps) AS s0, max(start_ps + duration_ps) AS s1
                          FROM {rel['step_breakdown']}),
            hev AS (
                SELECT e.host, e.duration_ps,
                       regexp_matches(lower(e.name), {sql_literal(pats['host_enqueue'])}) AS enqueue
                FROM events e, span
                WHERE e.run_id = {int(run_id)} AND e.plane LIKE '/host:%'
                  AND e.start_ps >= span.s0 AND e.start_ps < span.s1
                  AND (regexp_matches(lower(e.name), {sql_literal(pats['host_input'])})
                       OR regexp_matches(lower(e.name), {sql_literal(pats['host_enqueue'])}))
            )
            SELECT count(DISTINCT host), coalesce(sum(duration_ps) FILTER (WHERE enqueue), 0),
                   coalesce(sum(duration_ps) FILTER (WHERE NOT enqueue), 0)
            FROM hev"""
    ).fetchone()
    hosts, enqueue_ps, other_ps = row
    return {"hosts": int(hosts or 0), "enqueue_ms": enqueue_ps / 1e9, "non_enqueue_ms": other_ps / 1e9}
