"""Top ops by self time, with category, FLOPs, bytes and FLOP utilization against the device peak."""

from __future__ import annotations

import duckdb
import pandas as pd


def ops_frame(con: duckdb.DuckDBPyConnection, run_id: int, rel: dict[str, str]) -> pd.DataFrame:
    """One row per op name (and module) over the train and eval steps, most self time first.

    Self time is the op's duration: device op lines are flat (control-flow containers are excluded),
    and async halves on the 'Async XLA Ops' line are left out so nothing counts twice.
    flop_utilization = FLOPs / (self time x the device's peak FLOP/s), where the plane states a peak.
    tf_op is the framework op (TensorFlow op or JAX ``jit(...)/...`` path) and source the file:line of
    the op's event metadata, where the trace has them (else NULL).
    """
    return con.execute(
        f"""WITH peaks AS (
                SELECT host, device_ordinal, max(peak_tflops) * 1e12 AS peak_flops
                FROM planes WHERE run_id = {int(run_id)} AND device_ordinal IS NOT NULL GROUP BY ALL
            ), o AS (
                SELECT o.short_name, o.hlo_module, o.hlo_category,
                       coalesce(o.collective_kind, o.category) AS kind,
                       o.category, o.duration_ps, o.flops, o.bytes_accessed, p.peak_flops, o.tf_op
                FROM {rel['op_steps']} o
                LEFT JOIN peaks p ON p.host = o.host AND p.device_ordinal = o.device_ordinal
                WHERE o.step_start IS NOT NULL AND NOT o.is_container AND o.line <> 'Async XLA Ops'
            ), total AS (SELECT sum(duration_ps) AS t FROM o),
            src AS (
                SELECT display_name, any_value(source) AS source FROM event_metadata
                WHERE run_id = {int(run_id)} AND source IS NOT NULL GROUP BY display_name
            )
            SELECT short_name AS name, any_value(category) AS category, any_value(kind) AS kind,
                   any_value(hlo_category) AS hlo_category,
                   hlo_module, count(*) AS count,
                   sum(duration_ps) / 1e9 AS self_time_ms,
                   sum(duration_ps) / any_value(total.t) AS share,
                   sum(flops) AS flops, sum(bytes_accessed) AS bytes_accessed,
                   sum(flops) / nullif(sum(duration_ps * peak_flops) / 1e12, 0) AS flop_utilization,
                   mode(tf_op) AS tf_op, any_value(src.source) AS source
            FROM o CROSS JOIN total LEFT JOIN src ON src.display_name = o.short_name
            GROUP BY short_name, hlo_module
            ORDER BY self_time_ms DESC, name"""
    ).df()
