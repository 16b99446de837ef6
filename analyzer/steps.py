"""Step-level and device-level tables from the attribution pipeline, as pandas DataFrames."""

from __future__ import annotations

import duckdb
import pandas as pd

CATEGORIES = ("compute", "weight_update", "collectives", "memory_transfer", "input", "output", "eval", "idle")
IN_STEP_CATEGORIES = ("compute", "weight_update", "collectives", "memory_transfer", "input", "output", "idle")


def steps_frame(con: duckdb.DuckDBPyConnection, rel: dict[str, str]) -> pd.DataFrame:
    """One row per device step (contract columns first, then eval_ps, step_source, memory_transfer_ps,
    is_warmup and program)."""
    return con.execute(
        f"""SELECT host, device_ordinal, step_num, is_eval, start_ps, duration_ps,
                   compute_ps, weight_update_ps, collectives_ps, input_ps, output_ps, idle_ps,
                   collectives_overlapped_ps, eval_ps, step_source, memory_transfer_ps, is_warmup, program
            FROM {rel['step_breakdown']} ORDER BY host, device_ordinal, start_ps"""
    ).df()


def _fractions_sql(group: str, rel: dict[str, str]) -> str:
    cats = ", ".join(
        f"sum({c}_ps) / nullif(sum(wall_ps), 0) AS {c}" for c in CATEGORIES
    )
    return f"""SELECT {group},
                      sum(train_steps) AS steps,
                      sum(mean_step_ps * train_steps) / nullif(sum(train_steps), 0) / 1e9 AS step_time_ms,
                      sum(wall_ps) / 1e9 AS wall_ms,
                      {cats},
                      sum(collectives_overlapped_ps) / nullif(sum(wall_ps), 0) AS collectives_overlapped,
                      sum(idle_in_steps_ps) / 1e9 AS idle_in_steps_ms,
                      sum(idle_in_cycle_ps) / 1e9 AS idle_in_cycle_ms
               FROM {rel['device_breakdown']} GROUP BY {group} ORDER BY {group}"""


def per_core_frame(con: duckdb.DuckDBPyConnection, rel: dict[str, str]) -> pd.DataFrame:
    """One row per device (TPU core / GPU / CPU device): step count, mean step time, fractions of wall."""
    return con.execute(_fractions_sql("host, device_ordinal", rel)).df()


def per_host_frame(con: duckdb.DuckDBPyConnection, rel: dict[str, str]) -> pd.DataFrame:
    """One row per host: the same fractions, pooled over the host's devices (steps = device steps)."""
    return con.execute(_fractions_sql("host", rel)).df()


def step_times_ms(con: duckdb.DuckDBPyConnection, rel: dict[str, str],
                  keep_warmup: bool = False) -> pd.Series:
    """Train step times in ms, one per step number (mean over the devices that ran it); warm-up steps
    (compilation, docs/attribution.md) are left out unless keep_warmup."""
    warm = "" if keep_warmup else " AND NOT is_warmup"
    df = con.execute(
        f"""SELECT step_num, avg(duration_ps) / 1e9 AS ms FROM {rel['step_breakdown']}
            WHERE NOT is_eval{warm} GROUP BY step_num ORDER BY step_num"""
    ).df()
    return df["ms"] if len(df) else pd.Series(dtype=float)


def programs_frame(con: duckdb.DuckDBPyConnection, rel: dict[str, str]) -> pd.DataFrame:
    """One row per program (XLA module) executed on the devices: executions and their duration per
    device, and whether it is the step program (docs/json.md `programs`). Empty without an XLA Modules
    line or launched program executions (att_programs)."""
    return con.execute(
        f"""WITH steps AS (SELECT DISTINCT program FROM {rel['att_steps']} WHERE program IS NOT NULL)
            SELECT p.program, count(DISTINCT (p.host, p.device)) AS devices,
                   count(*) / count(DISTINCT (p.host, p.device)) AS executions_per_device,
                   avg(p.end_ps - p.start_ps) / 1e9 AS mean_ms,
                   median(p.end_ps - p.start_ps) / 1e9 AS median_ms,
                   min(p.end_ps - p.start_ps) / 1e9 AS min_ms, max(p.end_ps - p.start_ps) / 1e9 AS max_ms,
                   sum(p.end_ps - p.start_ps) / 1e9 / count(DISTINCT (p.host, p.device))
                       AS total_ms_per_device,
                   bool_or(p.named_eval) AS is_eval,
                   p.program IN (SELECT program FROM steps) AS is_step_program
            FROM {rel['att_programs']} p GROUP BY p.program
            ORDER BY total_ms_per_device DESC, p.program"""
    ).df()
