"""Top ops by self time, with category, FLOPs, bytes and FLOP utilization against the device peak.

The op rows are summed in two steps: per (op name, module, framework op) over a set of op rows (one
batch of hosts, or the whole run), then over those partial sums, so a run attributed batch of hosts by
batch (analyzer/per_host.py) never scans its op rows again for the table."""

from __future__ import annotations

import duckdb
import pandas as pd
from tpuanalyze.analyzer.event_partials import partial


def ops_partial_sql(run_id: int, op_rows: str) -> str:
    """Partial sums of the top-ops table over ``op_rows`` (op_steps' columns), one row per op name,
    module and framework op: the self-time rows (in a step, not a control-flow container, not an async
    half on the 'Async XLA Ops' line, so nothing counts twice)."""
    return f"""WITH peaks AS (
                SELECT host, device_ordinal, max(peak_tflops) * 1e12 AS peak_flops
                FROM planes WHERE run_id = {int(run_id)} AND device_ordinal IS NOT NULL GROUP BY ALL
            ), o AS (
                SELECT o.short_name, o.hlo_module, o.hlo_category,
                       coalesce(o.collective_kind, o.category) AS kind,
                       o.category, o.duration_ps, o.flops, o.bytes_accessed, p.peak_flops, o.tf_op
                FROM {op_rows} o
                LEFT JOIN peaks p ON p.host = o.host AND p.device_ordinal = o.device_ordinal
                WHERE o.step_start IS NOT NULL AND NOT o.is_container AND o.line <> 'Async XLA Ops'
            )
            SELECT short_name, hlo_module, tf_op, count(*) AS n, sum(duration_ps) AS duration_ps,
                   sum(flops) AS flops, sum(bytes_accessed) AS bytes_accessed,
                   sum(duration_ps * peak_flops) AS duration_peak,
                   any_value(category) AS category, any_value(kind) AS kind,
                   any_value(hlo_category) AS hlo_category
            FROM o GROUP BY short_name, hlo_module, tf_op"""


def ops_partial_narrow_sql(run_id: int, rows: str, kinds: str) -> str:
    """``ops_partial_sql``'s rows from narrow op rows (op_kinds.OP_STEPS_OWN) and their kinds: counted
    and summed per kind and device first, so the million rows of a batch are grouped on integers and
    only the sums meet the kinds' strings (the FLOPs and bytes of a kind are its rows' times their
    count: equal to the row-by-row sums but for the last digits)."""
    return f"""WITH peaks AS (
                SELECT host, device_ordinal, max(peak_tflops) * 1e12 AS peak_flops
                FROM planes WHERE run_id = {int(run_id)} AND device_ordinal IS NOT NULL GROUP BY ALL
            ), per_kind AS (
                SELECT kind_id, host, device_ordinal, count(*) AS n, sum(duration_ps) AS duration_ps
                FROM {rows} WHERE step_start IS NOT NULL GROUP BY ALL
            ), o AS (
                SELECT k.short_name, k.hlo_module, k.hlo_category,
                       coalesce(k.collective_kind, k.category) AS kind,
                       k.category, k.tf_op, c.n, c.duration_ps, k.flops * c.n AS flops,
                       k.bytes_accessed * c.n AS bytes_accessed, c.duration_ps * p.peak_flops AS duration_peak
                FROM per_kind c JOIN {kinds} k USING (kind_id)
                LEFT JOIN peaks p ON p.host = c.host AND p.device_ordinal = c.device_ordinal
                WHERE NOT k.is_container AND k.line <> 'Async XLA Ops'
            )
            SELECT short_name, hlo_module, tf_op, CAST(sum(n) AS BIGINT) AS n,
                   sum(duration_ps) AS duration_ps,
                   sum(flops) AS flops, sum(bytes_accessed) AS bytes_accessed,
                   sum(duration_peak) AS duration_peak,
                   any_value(category) AS category, any_value(kind) AS kind,
                   any_value(hlo_category) AS hlo_category
            FROM o GROUP BY short_name, hlo_module, tf_op"""


def ops_frame(con: duckdb.DuckDBPyConnection, run_id: int, rel: dict[str, str]) -> pd.DataFrame:
    """One row per op name (and module) over the train and eval steps, most self time first.

    Self time is the op's duration: device op lines are flat (control-flow containers are excluded),
    and async halves on the 'Async XLA Ops' line are left out so nothing counts twice.
    flop_utilization = FLOPs / (self time x the device's peak FLOP/s), where the plane states a peak.
    tf_op is the framework op (TensorFlow op or JAX ``jit(...)/...`` path: the most frequent one of the
    op name, the first in sort order on a tie) and source the file:line of the op's event metadata, where
    the trace has them (else NULL). ``rel['ops_parts']``, when given, holds the partial sums
    (``ops_partial_sql``) of the run's op rows; else they are taken from ``rel['op_steps']``.
    """
    parts = rel.get("ops_parts")
    if parts is None:
        parts = "ta_ops_parts_run"
        con.execute(f"CREATE OR REPLACE TEMP TABLE {parts} AS {ops_partial_sql(run_id, rel['op_steps'])}")
    try:
        return con.execute(
            f"""WITH g AS (
                    SELECT short_name, hlo_module, tf_op, sum(n) AS n, sum(duration_ps) AS duration_ps,
                           sum(flops) AS flops, sum(bytes_accessed) AS bytes_accessed,
                           sum(duration_peak) AS duration_peak, any_value(category) AS category,
                           any_value(kind) AS kind, any_value(hlo_category) AS hlo_category
                    FROM {parts} GROUP BY short_name, hlo_module, tf_op
                ), ranked AS (
                    SELECT *, row_number() OVER (PARTITION BY short_name, hlo_module
                                                 ORDER BY tf_op IS NULL, n DESC, tf_op) AS tf_rank
                    FROM g
                ), total AS (SELECT sum(duration_ps) AS t FROM g),
                src AS (
                    SELECT display_name, any_value(source) AS source
                    FROM {partial(rel, 'op_sources', run_id)} GROUP BY display_name
                )
                SELECT short_name AS name, any_value(category) AS category, any_value(kind) AS kind,
                       any_value(hlo_category) AS hlo_category,
                       hlo_module, CAST(sum(n) AS BIGINT) AS count,
                       sum(duration_ps) / 1e9 AS self_time_ms,
                       sum(duration_ps) / any_value(total.t) AS share,
                       sum(flops) AS flops, sum(bytes_accessed) AS bytes_accessed,
                       sum(flops) / nullif(sum(duration_peak) / 1e12, 0) AS flop_utilization,
                       any_value(tf_op) FILTER (WHERE tf_rank = 1) AS tf_op, any_value(src.source) AS source
                FROM ranked CROSS JOIN total LEFT JOIN src ON src.display_name = ranked.short_name
                GROUP BY short_name, hlo_module
                ORDER BY self_time_ms DESC, name, hlo_module"""
        ).df()
    finally:
        if "ops_parts" not in rel:
            con.execute(f"DROP TABLE IF EXISTS {parts}")
