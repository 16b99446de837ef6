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


def host_input_ctes(run_id: int, steps: str, pats: dict[str, Any]) -> str:
    """CTEs ``span`` (the steps' span, from the relation or FROM clause ``steps``) and ``hev``: per host
    and event name, the time of the run's host-plane events starting inside the span whose names match
    the input or enqueue patterns (catalog §3.8), and whether the name is an enqueue. Python-tracer
    frames (``$file:line function``, JAX's host_tracer_level 2) are left out: they nest, and a name
    such as ``$<frozen os>:760 decode`` is no input decode.

    Why from ``event_rows`` and the plane and metadata tables, summed per metadata id before the names
    are read and matched, not each event through the ``events`` view: on a 512-host pod that was
    1.5 CPU s a query, the view's metadata and detail joins over every host event (0.1-0.3 here). The
    view's join with ``lines`` drops no row (the readers store every line that holds an event), and
    here it cost 2.5 CPU s (DuckDB's plan for the four-key join)."""
    enqueue, host_input = sql_literal(pats["host_enqueue"]), sql_literal(pats["host_input"])
    return (f"span AS (SELECT min(start_ps) AS s0, max(start_ps + duration_ps) AS s1 FROM {steps}),\n"
            f"host_ids AS (SELECT r.host, r.plane_index, r.metadata_id, sum(r.duration_ps) AS ps\n"
            f"             FROM event_rows r JOIN planes p USING (run_id, host, plane_index), span\n"
            f"             WHERE r.run_id = {int(run_id)} AND p.name LIKE '/host:%'\n"
            f"               AND r.start_ps >= span.s0 AND r.start_ps < span.s1 GROUP BY ALL),\n"
            f"host_names AS (SELECT i.host, COALESCE(m.name, '') AS name, sum(i.ps) AS ps FROM host_ids i\n"
            f"               LEFT JOIN event_metadata m ON m.run_id = {int(run_id)} AND m.host = i.host\n"
            f"                AND m.plane_index = i.plane_index AND m.metadata_id = i.metadata_id\n"
            f"               GROUP BY ALL),\n"
            f"hev AS (SELECT host, ps AS duration_ps, regexp_matches(lower(name), {enqueue}) AS enqueue\n"
            f"        FROM host_names WHERE NOT starts_with(name, '$')\n"
            f"          AND (regexp_matches(lower(name), {host_input})\n"
            f"               OR regexp_matches(lower(name), {enqueue})))")


def host_input_work(con: duckdb.DuckDBPyConnection, run_id: int, config: dict[str, Any],
                    rel: dict[str, str]) -> dict[str, float]:
    """Host-plane input pipeline time per host within the steps' span (catalog §3.8): total time of
    host events matching the input pattern, split into enqueue (host->device transfer) and the rest."""
    row = con.execute(
        f"""WITH {host_input_ctes(run_id, rel['step_breakdown'], config['patterns'])}
            SELECT count(DISTINCT host), coalesce(sum(duration_ps) FILTER (WHERE enqueue), 0),
                   coalesce(sum(duration_ps) FILTER (WHERE NOT enqueue), 0)
            FROM hev"""
    ).fetchone()
    hosts, enqueue_ps, other_ps = row
    return {"hosts": int(hosts or 0), "enqueue_ms": enqueue_ps / 1e9, "non_enqueue_ms": other_ps / 1e9}
