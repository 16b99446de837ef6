"""The run's notes: plain sentences on what the trace lacks, how its steps were found, and what lies
outside the figures (time outside the step cycle, a step series that is one program of many), so a
number is never read for more than it measures (docs/json.md `notes`)."""

from __future__ import annotations

import duckdb
import pandas as pd

# Time outside the step cycle worth a note: above host-overhead's 3% trigger (catalog §3.7, §4), where
# the breakdown's idle and host-overhead's step-cycle idle could disagree on whether the rule fires.
OUTSIDE_CYCLE_SHARE = 0.05
# The step program's share of program time below which the notes say that steps describe one program of
# many (a training capture's step program is nearly all of it: v6e 99%; the MI300X eager attention 56%).
STEP_PROGRAM_SHARE = 0.75


def trace_notes(con: duckdb.DuckDBPyConnection, rel: dict[str, str], steps: pd.DataFrame) -> list[str]:
    """Plain statements of what the trace lacks or how steps were found."""
    notes = []
    has_dev, has_steps_line, is_kineto = con.execute(
        f"SELECT has_device_planes, has_steps_line, is_kineto FROM {rel['att_runs']}"
    ).fetchone() or (False, False, False)
    if is_kineto:
        notes.append("no XSpace device planes: GPU kernels and memcpys of the Chrome trace (Kineto) are the "
                     "device ops; steps from ProfilerStep#N annotations")
    elif not has_dev:
        n_ops = con.execute(f"SELECT count(*) FROM {rel['att_ops']}").fetchone()[0]
        if n_ops:
            notes.append("no device planes with events: host-only trace; XLA CPU ops on host threads are the "
                         "device ops (device = their device_ordinal stat)")
        else:
            notes.append("no device planes and no XLA op events: nothing to attribute")
    if steps.empty:
        notes.append("no steps: no Steps line, no XLA module executions and no step annotations (step_num)")
    else:
        sources = sorted(set(steps["step_source"]))
        programs = sorted(set(steps["program"].dropna())) if "program" in steps else []
        program = f" ({programs[0]})" if len(programs) == 1 else ""
        if "xla_modules" in sources:
            notes.append(f"no Steps line: each execution of the dominant XLA program{program} on a device is "
                         "treated as one step")
        if "program_launches" in sources:
            notes.append(f"no Steps line and no XLA Modules line: each execution of the dominant program"
                         f"{program} (its device ops launched inside one host execute call) is one step")
        if "group_id" in sources:
            notes.append("no Steps line: device ops grouped by the profiler's group_id, one step per group")
        if "op_span" in sources:
            notes.append("no steps: no Steps line, no XLA module executions and no step annotations "
                         "(step_num); each device's op span is treated as one step")
        if "step_annotation" in sources and not is_kineto:
            notes.append("steps from host step annotations (StepTraceAnnotation step_num); input = time from "
                         "the step's start to its first program dispatch")
        if not has_steps_line and has_dev and not {"xla_modules", "op_span", "program_launches",
                                                    "group_id"} & set(sources):
            notes.append("no Steps line on the device planes")
        if not (~steps["is_eval"]).any():
            notes.append("no train steps: only eval steps")
        notes += _outside_cycle_note(con, rel)
    return notes


def _outside_cycle_note(con: duckdb.DuckDBPyConnection, rel: dict[str, str]) -> list[str]:
    """Time before a device's first step or after its last (set-up programs, a capture started early):
    outside the step cycle (attribution.sql, device_breakdown.cycle_ps), said when it is large enough
    for the breakdown's idle and host-overhead's to tell different stories."""
    row = con.execute(f"""
        WITH cycle AS (SELECT wall_ps, cycle_ps, idle_ps, idle_in_cycle_ps FROM {rel['device_breakdown']}
                       WHERE cycle_ps IS NOT NULL AND wall_ps > 0)
        SELECT avg((wall_ps - cycle_ps) / wall_ps), avg((idle_ps - idle_in_cycle_ps) / wall_ps)
        FROM cycle""").fetchone()
    outside, idle = row if row else (None, None)
    if outside is None or outside < OUTSIDE_CYCLE_SHARE:
        return []
    return [f"{outside:.1%} of wall time lies outside the step cycle (before the first step or after the "
            f"last: set-up program executions, a capture started early), {idle:.1%} of wall idle there: "
            f"the breakdown's shares count it, as XProf's duty cycle does; host-overhead does not"]


def step_program_note(programs: pd.DataFrame) -> list[str]:
    """Said when the step series (one program's executions) is a minor part of the device's program
    time: an eager-style capture of many small programs, where step statistics describe one of them."""
    step = programs[programs["is_step_program"]]
    total = float(programs["total_ms_per_device"].sum())
    if step.empty or not total:
        return []
    share = float(step["total_ms_per_device"].sum()) / total
    if share >= STEP_PROGRAM_SHARE:
        return []
    return [f"the step series is {step['program'].iloc[0]}'s executions, {share:.0%} of the devices' "
            f"program time; {len(programs) - len(step)} other program(s) run beside it (an eager-style "
            f"capture?): step time, the breakdown per step and per-step gains describe that program alone"]
