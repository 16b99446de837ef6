"""Collectives per kind: count, payload bytes and dtype, exposed vs overlapped time, XProf's
compute/sync split (catalog §3.3, §4: compute = minimum duration across cores, sync = the rest)."""

from __future__ import annotations

import re

import duckdb
import pandas as pd
from tpuanalyze.analyzer.classify import COLLECTIVE_KINDS

DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
_ARRAY_RE = re.compile(
    r"(pred|s8|u8|f8e4m3fn|f8e5m2|s16|u16|f16|bf16|s32|u32|f32|s64|u64|f64|c64|c128)\[([0-9,]*)\]"
)

# The shape text of an op: shape_with_layout, else the result type in the HLO text ("%x = f32[..] op(").
SHAPE_TEXT_SQL = "coalesce(shape, regexp_extract(name, '=\\s*([^ ]+|\\([^)]*\\))\\s', 1))"


def shape_bytes(shape: str | None) -> tuple[float | None, str | None]:
    """Payload bytes and element type of an HLO shape text (tuples summed; first dtype reported)."""
    if not shape:
        return None, None
    total, dtype = 0, None
    for match in _ARRAY_RE.finditer(shape):
        elems = 1
        for dim in filter(None, match.group(2).split(",")):
            elems *= int(dim)
        total += elems * DTYPE_BYTES[match.group(1)]
        dtype = dtype or match.group(1)
    return (float(total), dtype) if dtype else (None, None)


COLUMNS = ["kind", "count_per_step", "bytes", "dtype", "exposed_ms_per_step", "overlapped_ms_per_step",
           "compute_ms", "sync_ms", "median_op_bytes", "ops_per_step_total_ms"]


def collectives_frame(con: duckdb.DuckDBPyConnection, rel: dict[str, str]) -> pd.DataFrame:
    """One row per collective kind seen in train steps; times are per device step (mean)."""
    n_steps = con.execute(
        f"SELECT count(*) FROM {rel['step_breakdown']} WHERE NOT is_eval"
    ).fetchone()[0]
    if not n_steps:
        return pd.DataFrame(columns=COLUMNS)
    ops = con.execute(
        f"""SELECT collective_kind AS kind, short_name, {SHAPE_TEXT_SQL} AS shape_text, bytes_accessed,
                   host, device_ordinal, step_num, step_start, start_ps, duration_ps, line
            FROM {rel['op_steps']}
            WHERE collective_kind IS NOT NULL AND step_start IS NOT NULL AND NOT step_is_eval"""
    ).df()
    times = con.execute(
        f"""SELECT c.kind, sum(c.exposed_ps) AS exposed_ps, sum(c.overlapped_ps) AS overlapped_ps
            FROM {rel['collective_time']} c
            JOIN {rel['step_breakdown']} s ON s.host = c.host AND s.device_ordinal = c.device_ordinal
                 AND s.start_ps = c.step_start
            WHERE NOT s.is_eval GROUP BY c.kind"""
    ).df().set_index("kind")
    if ops.empty and times.empty:
        return pd.DataFrame(columns=COLUMNS)
    # payload per op instance: the shape's bytes, else the trace's bytes_accessed
    shapes = {s: shape_bytes(s) for s in ops["shape_text"].dropna().unique()}
    none = (None, None)
    ops["payload"] = [shapes.get(s, none)[0] if isinstance(s, str) else None for s in ops["shape_text"]]
    ops["payload"] = ops["payload"].fillna(ops["bytes_accessed"])
    ops["dtype"] = [shapes.get(s, none)[1] if isinstance(s, str) else None for s in ops["shape_text"]]
    # one op per collective: the -done half of an async pair is its wait, not a second collective
    sync_ops = ops[ops["line"] != "Async XLA Ops"]
    counted = sync_ops[~sync_ops["short_name"].str.contains(r"-done", regex=True, na=False)]
    split = _compute_sync_split(sync_ops)
    rows = []
    for kind in COLLECTIVE_KINDS:
        k_ops = counted[counted["kind"] == kind]
        if k_ops.empty and kind not in times.index:
            continue
        dtype = k_ops["dtype"].mode()
        rows.append({
            "kind": kind,
            "count_per_step": len(k_ops) / n_steps,
            "bytes": float(k_ops["payload"].sum()) / n_steps if k_ops["payload"].notna().any() else None,
            "dtype": dtype.iloc[0] if len(dtype) else None,
            "exposed_ms_per_step": float(times["exposed_ps"].get(kind, 0.0)) / n_steps / 1e9,
            "overlapped_ms_per_step": float(times["overlapped_ps"].get(kind, 0.0)) / n_steps / 1e9,
            "compute_ms": split.get(kind, (None, None))[0],
            "sync_ms": split.get(kind, (None, None))[1],
            "median_op_bytes": float(k_ops["payload"].median()) if k_ops["payload"].notna().any() else None,
            "ops_per_step_total_ms": float(sync_ops.loc[sync_ops["kind"] == kind, "duration_ps"].sum())
            / n_steps / 1e9,
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def _compute_sync_split(ops: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """XProf's split per kind, per device step (ms): compute = sum over collective instances of the
    minimum duration across devices; sync = mean total duration per device step - compute.

    Instances are matched across devices by (step number, op name, occurrence within the step)."""
    if ops.empty:
        return {}
    df = ops.sort_values("start_ps").copy()
    df["occurrence"] = df.groupby(["host", "device_ordinal", "step_start", "short_name"]).cumcount()
    n_dev_steps = df.groupby(["host", "device_ordinal", "step_start"]).ngroups
    out = {}
    for kind, k in df.groupby("kind"):
        per_instance = k.groupby(["step_num", "short_name", "occurrence"], dropna=False)["duration_ps"].min()
        n_step_nums = max(k["step_num"].nunique(dropna=False), 1)
        compute_ms = float(per_instance.sum()) / n_step_nums / 1e9
        total_ms = float(k["duration_ps"].sum()) / n_dev_steps / 1e9
        out[kind] = (compute_ms, max(total_ms - compute_ms, 0.0))
    return out
