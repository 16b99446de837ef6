"""Collectives per kind: count, payload bytes and dtype, exposed vs overlapped time, XProf's
compute/sync split (catalog §3.3, §4: compute = minimum duration across cores, sync = the rest)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import duckdb
import numpy as np
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


@dataclass
class CollectivePartials:
    """What ``collectives_frame`` needs of the run's collective op rows, summed batch of hosts by batch
    (analyzer/per_host.py): counts and sums, value counts where a median or mode is taken, and the
    per-instance minimum over devices (an instance spans hosts: its minimum is the minimum of the
    batches' minima). Small: per kind and payload, per instance of one device step, not per device."""

    rows: int = 0
    dev_steps: int = 0  # (host, device, step) groups holding a synchronous collective
    payloads: list[pd.DataFrame] = field(default_factory=list)  # kind, payload (NaN kept), n
    dtypes: list[pd.DataFrame] = field(default_factory=list)  # kind, dtype, n
    durations: list[pd.Series] = field(default_factory=list)  # kind -> sum of sync duration_ps
    instances: list[pd.Series] = field(default_factory=list)  # (kind, step_num, short_name, occ) -> min
    step_nums: list[pd.DataFrame] = field(default_factory=list)  # kind, step_num (distinct, NaN kept)
    _shapes: dict[str, tuple[float | None, str | None]] = field(default_factory=dict)

    def add(self, con: duckdb.DuckDBPyConnection, op_rows: str, steps: str | None = None,
            keep_warmup: bool = False) -> None:
        """Add the collective rows of ``op_rows`` (op_steps' columns: one batch of hosts, or all),
        aggregated in DuckDB: only the partials come to pandas. Rows in a warm-up step of ``steps``
        (step_breakdown's columns) are left out unless ``keep_warmup``, as the step statistics do."""
        rows = "ta_collective_rows"
        warm = "" if steps is None or keep_warmup else (
            f" AND (host, device_ordinal, step_start) NOT IN (SELECT host, device_ordinal, start_ps "
            f"FROM {steps} WHERE is_warmup AND device_ordinal IS NOT NULL AND start_ps IS NOT NULL)")
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE {rows} AS
                SELECT collective_kind AS kind, short_name, {SHAPE_TEXT_SQL} AS shape_text, bytes_accessed,
                       host, device_ordinal, step_num, step_start, start_ps, duration_ps,
                       line <> 'Async XLA Ops' AS sync
                FROM {op_rows}
                WHERE collective_kind IS NOT NULL AND step_start IS NOT NULL AND NOT step_is_eval{warm}""")
        try:
            self._add_rows(con, rows)
        finally:
            con.execute(f"DROP TABLE IF EXISTS {rows}")

    def extend(self, other: CollectivePartials) -> None:
        """Add another batch's partials after this one's (batches combined in their order)."""
        self.rows += other.rows
        self.dev_steps += other.dev_steps
        for name in ("payloads", "dtypes", "durations", "instances", "step_nums"):
            getattr(self, name).extend(getattr(other, name))
        self._shapes.update(other._shapes)

    def _add_rows(self, con: duckdb.DuckDBPyConnection, rows: str) -> None:
        n = int(con.execute(f"SELECT count(*) FROM {rows}").fetchone()[0])
        if not n:
            return
        self.rows += n
        # payload per op instance: the shape's bytes (parsed once per distinct shape text), else the
        # trace's bytes_accessed
        texts = [r[0] for r in con.execute(f"SELECT DISTINCT shape_text FROM {rows} "
                                           "WHERE shape_text IS NOT NULL").fetchall()]
        for text in texts:
            if text not in self._shapes:
                self._shapes[text] = shape_bytes(text)
        shapes = pd.DataFrame({"shape_text": pd.Series(texts, dtype="object"),
                               "payload": pd.Series([self._shapes[t][0] for t in texts], dtype="float64"),
                               "dtype": pd.Series([self._shapes[t][1] for t in texts], dtype="object")})
        con.register("ta_collective_shapes", shapes)
        try:
            # one op per collective: the -done half of an async pair is its wait, not a second collective
            counted = con.execute(
                f"""SELECT c.kind, coalesce(s.payload, c.bytes_accessed) AS payload, s.dtype, count(*) AS n
                    FROM {rows} c LEFT JOIN ta_collective_shapes s ON s.shape_text = c.shape_text
                    WHERE c.sync AND (c.short_name IS NULL OR c.short_name NOT LIKE '%-done%')
                    GROUP BY ALL""").df()
        finally:
            con.unregister("ta_collective_shapes")
        self.payloads.append(counted.groupby(["kind", "payload"], dropna=False)["n"].sum().reset_index())
        self.dtypes.append(counted[counted["dtype"].notna()].groupby(["kind", "dtype"])["n"].sum()
                           .reset_index())
        durations = con.execute(f"SELECT kind, CAST(sum(duration_ps) AS BIGINT) AS ps FROM {rows} "
                                "WHERE sync GROUP BY kind").df()
        if durations.empty:
            return
        self.durations.append(durations.set_index("kind")["ps"])
        self.dev_steps += int(con.execute(
            f"SELECT count(*) FROM (SELECT DISTINCT host, device_ordinal, step_start FROM {rows} WHERE sync)"
        ).fetchone()[0])
        # instances matched across devices by (step number, op name, occurrence within the step: in start
        # order, then duration; ops tied on both have the same duration, so which is which never matters)
        instances = con.execute(
            f"""SELECT kind, step_num, short_name, occurrence, min(duration_ps) AS duration_ps
                FROM (SELECT kind, step_num, short_name, duration_ps,
                             row_number() OVER (PARTITION BY host, device_ordinal, step_start, short_name
                                                ORDER BY start_ps, duration_ps) - 1 AS occurrence
                      FROM {rows} WHERE sync)
                GROUP BY ALL""").df()
        self.instances.append(instances.set_index(["kind", "step_num", "short_name", "occurrence"])
                              ["duration_ps"])
        self.step_nums.append(con.execute(f"SELECT DISTINCT kind, step_num FROM {rows} WHERE sync").df())


def collectives_frame(con: duckdb.DuckDBPyConnection, rel: dict[str, str],
                      partials: CollectivePartials | None = None, keep_warmup: bool = False) -> pd.DataFrame:
    """One row per collective kind seen in train steps (warm-up steps left out unless
    ``keep_warmup``); times are per device step (mean). ``partials`` holds the collective op rows added
    batch by batch; without it they are read from ``rel['op_steps']`` at once."""
    train = "NOT is_eval" + ("" if keep_warmup else " AND NOT is_warmup")
    n_steps = con.execute(
        f"SELECT count(*) FROM {rel['step_breakdown']} WHERE {train}"
    ).fetchone()[0]
    if not n_steps:
        return pd.DataFrame(columns=COLUMNS)
    if partials is None:
        partials = CollectivePartials()
        partials.add(con, rel["op_steps"], rel["step_breakdown"], keep_warmup)
    times = con.execute(
        f"""SELECT c.kind, sum(c.exposed_ps) AS exposed_ps, sum(c.overlapped_ps) AS overlapped_ps
            FROM {rel['collective_time']} c
            JOIN {rel['step_breakdown']} s ON s.host = c.host AND s.device_ordinal = c.device_ordinal
                 AND s.start_ps = c.step_start
            WHERE NOT s.is_eval{"" if keep_warmup else " AND NOT s.is_warmup"} GROUP BY c.kind"""
    ).df().set_index("kind")
    if not partials.rows and times.empty:
        return pd.DataFrame(columns=COLUMNS)
    payloads = _concat(partials.payloads, ["kind", "payload", "n"]).groupby(
        ["kind", "payload"], dropna=False)["n"].sum().reset_index()
    dtypes = _concat(partials.dtypes, ["kind", "dtype", "n"]).groupby(["kind", "dtype"])["n"].sum()
    durations = (pd.concat(partials.durations).groupby(level=0).sum() if partials.durations
                 else pd.Series(dtype="int64"))
    split = _compute_sync_split(partials, durations)
    rows = []
    for kind in COLLECTIVE_KINDS:
        k_pay = payloads[payloads["kind"] == kind]
        count = int(k_pay["n"].sum())
        if not count and kind not in times.index:
            continue
        known = k_pay[k_pay["payload"].notna()]
        rows.append({
            "kind": kind,
            "count_per_step": count / n_steps,
            "bytes": float((known["payload"] * known["n"]).sum()) / n_steps if len(known) else None,
            "dtype": _mode(dtypes, kind),
            "exposed_ms_per_step": float(times["exposed_ps"].get(kind, 0.0)) / n_steps / 1e9,
            "overlapped_ms_per_step": float(times["overlapped_ps"].get(kind, 0.0)) / n_steps / 1e9,
            "compute_ms": split.get(kind, (None, None))[0],
            "sync_ms": split.get(kind, (None, None))[1],
            "median_op_bytes": _median(known) if len(known) else None,
            "ops_per_step_total_ms": float(durations.get(kind, 0)) / n_steps / 1e9,
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def _mode(dtypes: pd.Series, kind: str) -> str | None:
    """The most frequent dtype of a kind, the first in sort order on a tie (as pandas' mode)."""
    if kind not in dtypes.index.get_level_values(0):
        return None
    counts = dtypes.loc[kind]
    return str(sorted(counts[counts == counts.max()].index)[0])


def _median(values: pd.DataFrame) -> float:
    """Median of the payloads given as (payload, n) value counts: the middle one, or the mean of the
    two middle ones (as pandas' median of the values themselves)."""
    ordered = values.sort_values("payload")
    cum = ordered["n"].cumsum().to_numpy()
    pay = ordered["payload"].to_numpy(dtype="float64")
    total = int(cum[-1])

    def nth(i: int) -> float:  # the i-th smallest payload, from 0
        return float(pay[int(np.searchsorted(cum, i + 1))])

    if total % 2:
        return nth(total // 2)
    return float(np.mean([nth(total // 2 - 1), nth(total // 2)]))


def _compute_sync_split(partials: CollectivePartials,
                        durations: pd.Series) -> dict[str, tuple[float, float]]:
    """XProf's split per kind, per device step (ms): compute = sum over collective instances of the
    minimum duration across devices; sync = mean total duration per device step - compute.

    Instances are matched across devices by (step number, op name, occurrence within the step)."""
    if not partials.instances:
        return {}
    per_instance = pd.concat(partials.instances).groupby(level=[0, 1, 2, 3], dropna=False).min()
    step_nums = pd.concat(partials.step_nums, ignore_index=True).drop_duplicates()
    out = {}
    for kind, k in per_instance.groupby(level=0):
        n_step_nums = max(step_nums.loc[step_nums["kind"] == kind, "step_num"].nunique(dropna=False), 1)
        compute_ms = float(k.sum()) / n_step_nums / 1e9
        total_ms = float(durations[kind]) / partials.dev_steps / 1e9
        out[kind] = (compute_ms, max(total_ms - compute_ms, 0.0))
    return out
