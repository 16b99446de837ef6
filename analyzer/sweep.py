"""The boundary sweep of stage ``att_elementary`` in numpy: running counters as cumulative sums over
the sorted start/end points of a batch.

attribution.sql states the sweep in SQL (a window of two packed HUGEINT running sums over every op
boundary), and that text stays the definition: the persistent ``att_elementary`` view runs it. On a pod
that window was the analysis's largest cost (~4.5 CPU s per million events), so ``materialize_run`` and
``materialize_per_host`` build the stage here instead: the same rows, columns and types from the stage
``att_intervals``, at a tenth of the CPU. The points are sorted in numpy too (``_sorted_points``).

Equality with the SQL is checked on every capture and on hypothesis-built intervals (tests/test_sweep.py).
Where the SQL's packed counters would be wrong this is not: more than 16,383 ops of one category active
at once on a device overflow into the next field there.
"""

from __future__ import annotations

import os
from typing import Any

import duckdb
import numpy as np

# TPUANALYZE_SWEEP=sql runs the stage's SQL instead (tests compare the two).
# att_intervals' categories, as the SQL's cat_bit numbers them
_CATEGORIES = ("eval", "weight_update", "compute", "collectives", "input", "output", "step",
               "container", "memory_transfer")
_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "send/recv")
# the elementary interval's category, by precedence (the SQL's CASE), code = index
_OUT = ("eval", "weight_update", "compute", "collectives", "memory_transfer", "input", "output", "idle")
_KIND_COLUMNS = ("ar", "ag", "rs", "a2a", "cp", "sr")


def sweep_in_sql() -> bool:
    """Whether TPUANALYZE_SWEEP asks for the stage's SQL instead of the numpy sweep."""
    return os.environ.get("TPUANALYZE_SWEEP", "").strip().lower() == "sql"


def numpy_elementary(con: duckdb.DuckDBPyConnection, intervals: str, steps: str,
                        target: str) -> None:
    """Create TEMP TABLE ``target`` with att_elementary's rows, from the relations ``intervals``
    (att_intervals) and ``steps`` (att_steps), by the numpy sweep."""
    import pyarrow as pa  # (here, not at the top: ingest imports this module's neighbours, never Arrow)

    cat_case = " ".join(f"WHEN '{c}' THEN {i}" for i, c in enumerate(_CATEGORIES))
    kind_case = " ".join(f"WHEN '{k}' THEN {i}" for i, k in enumerate(_KINDS))
    con.execute(f"CREATE OR REPLACE TEMP TABLE {target}_devs AS "
                f"SELECT run_id, host, device, (row_number() OVER (ORDER BY run_id, host, device) - 1)"
                f"::INTEGER AS dev_id FROM (SELECT DISTINCT run_id, host, device FROM {intervals})")
    # every interval is a +1 at its start and a -1 at its end, sorted by (device, time); a point's
    # category, kind and sign packed into one byte (_END, below); a category the sweep does not know
    # (the SQL's NULL cat_bit) makes boundaries but counts nowhere
    iv = (f"SELECT d.dev_id, coalesce(CASE i.category {cat_case} END, {_NO_CATEGORY}) * 8 "
          f"+ coalesce(CASE i.kind {kind_case} END, {_NO_KIND}) AS code, i.start_ps, i.end_ps "
          f"FROM {intervals} i JOIN {target}_devs d ON {_same_device('i')}")
    p_dev, p_ts, p_code = _sorted_points(con, iv)
    st = con.execute(
        f"SELECT d.dev_id, s.start_ps, max(s.end_ps) AS end_ps FROM {steps} s "
        # the steps of a NULL device are nobody's (the SQL's ASOF join matches devices by equality)
        f"JOIN {target}_devs d USING (run_id, host, device) GROUP BY ALL "
        f"ORDER BY d.dev_id, s.start_ps").fetchnumpy()
    o_dev, o_ts, o_len, o_cat, o_flags = _sweep(p_dev, p_ts, p_code)
    del p_dev, p_ts, p_code
    s_start = _np(st["start_ps"], np.int64)
    step = _latest_step(o_dev, o_ts, _np(st["dev_id"], np.int32), s_start, _np(st["end_ps"], np.int64))
    o_has_step = (step >= 0) & ((o_flags & _IN_STEP) > 0)  # the step of an interval inside a step span
    o_step = np.where(o_has_step, s_start[np.maximum(step, 0)] if len(s_start) else 0, 0)
    columns: dict[str, Any] = {
        "dev_id": o_dev, "ts": o_ts, "len_ps": o_len,
        "category": pa.DictionaryArray.from_arrays(pa.array(o_cat), pa.array(_OUT)),
        "collective_overlapped": (o_flags & _OVERLAPPED) > 0,
        "in_step": (o_flags & _IN_STEP) > 0,
    }
    for bit, name in enumerate(_KIND_COLUMNS):
        columns[name] = (o_flags & (_KIND0 << bit)) > 0
    columns["step_start"] = pa.array(o_step, mask=~o_has_step)
    arrow_name = f"{target}_arrow"
    con.register(arrow_name, pa.table(columns))
    try:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {target} AS SELECT d.run_id, d.host, d.device, x.ts, x.len_ps, "
            f"x.category::VARCHAR AS category, x.collective_overlapped, x.in_step, "
            f"{', '.join(f'x.{c}' for c in _KIND_COLUMNS)}, x.step_start "
            f"FROM {arrow_name} x JOIN {target}_devs d USING (dev_id)")
    finally:
        con.unregister(arrow_name)
        con.execute(f"DROP TABLE IF EXISTS {target}_devs")


def _sorted_points(con: duckdb.DuckDBPyConnection, iv: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(device, time, code) of every start and end point of the intervals ``iv`` (dev_id, code, start_ps,
    end_ps), sorted by device and time. Sorted in numpy on one packed int64 key where device and time
    fit (a 512-host pod: 0.39 CPU s per batch of 1M events against 0.68 for DuckDB's ORDER BY of the
    points); the order of points at one instant of a device does not matter to the sweep (every
    counter is read after the last of them). Intervals with a NULL end: DuckDB's order, as before."""
    fetched = con.execute(iv).fetchnumpy()
    if any(np.ma.getmaskarray(fetched[c]).any() for c in ("dev_id", "start_ps", "end_ps")):
        points = con.execute(
            f"WITH iv AS ({iv}) SELECT dev_id, ts, code::UTINYINT AS code FROM (SELECT dev_id, start_ps "
            f"AS ts, code FROM iv UNION ALL SELECT dev_id, end_ps, code + {_END} FROM iv) ORDER BY dev_id, ts"
        ).fetchnumpy()
        return (_np(points["dev_id"], np.int32), _np(points["ts"], np.int64), _np(points["code"], np.uint8))
    return sort_points(_np(fetched["dev_id"], np.int64), _np(fetched["code"], np.uint8),
                       _np(fetched["start_ps"], np.int64), _np(fetched["end_ps"], np.int64))


def sort_points(dev: np.ndarray, code: np.ndarray, start: np.ndarray,
                end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(device, time, code) of every start and end point of intervals (device ids, point codes,
    starts, ends: no NULLs), sorted by device and time on one packed int64 key where they fit."""
    dev = dev.astype(np.int64, copy=False)
    code = code.astype(np.uint8, copy=False)
    ts = np.concatenate([start.astype(np.int64, copy=False), end.astype(np.int64, copy=False)])
    dev = np.concatenate([dev, dev])
    code = np.concatenate([code, code + np.uint8(_END)])
    if not len(ts):
        return dev.astype(np.int32), ts, code
    low = int(ts.min())
    time_bits = (int(ts.max()) - low).bit_length()
    if time_bits + int(dev.max()).bit_length() <= 62:
        # stable: a merge of the sorted runs the points come in (each line's events in time order):
        # 8 ms for a pod batch's 2 M points against 126 for a quicksort
        order = np.argsort((dev << time_bits) | (ts - low), kind="stable")
    else:  # a capture spanning too long a time for one key
        order = np.lexsort((ts, dev))
    return dev[order].astype(np.int32), ts[order], code[order]


# a point's code (one byte): bit 7 set = an end (-1), bits 3-6 the category (_CATEGORIES; 15 = none),
# bits 0-2 the collective kind (_KINDS; 7 = none)
_END, _NO_CATEGORY, _NO_KIND = 128, 15, 7
# category number -> elementary category code (_OUT), lowest precedence first: each overrides the ones
# before it where its counter is positive (container ops count as compute where nothing else runs)
_PRECEDENCE = ((7, 2), (5, 6), (4, 5), (8, 4), (3, 3), (2, 2), (1, 1), (0, 0))
_STEP, _COLLECTIVES, _WEIGHT_UPDATE, _COMPUTE, _EVAL = 6, 3, 1, 2, 0
# flag bits of an elementary interval
_OVERLAPPED, _IN_STEP, _KIND0 = 1, 2, 4


def _sweep(dev: np.ndarray, ts: np.ndarray, code: np.ndarray) -> tuple[np.ndarray, ...]:
    """Elementary intervals of points sorted by (device, time): each device's consecutive distinct times
    [t, next t) with the category and flags of the counters after every point at t. A counter is the
    cumulative sum of its +1/-1 points; every interval ends on its own device, so the sums are back at
    zero where a device ends and one global cumulative sum serves every device."""
    n = len(ts)
    if n == 0:
        empty = np.empty(0, np.int64)
        return (empty.astype(np.int32), empty, empty, empty.astype(np.int8), empty.astype(np.uint8))
    same_dev = dev[1:] == dev[:-1]
    # the last point at each (device, time) opens an interval when its device has a later point
    opens = np.flatnonzero(same_dev & (ts[1:] != ts[:-1]))
    sign = np.where(code >= _END, np.int8(-1), np.int8(1))
    cat = (code & 127) >> 3
    kind = code & 7

    def active(mask: np.ndarray) -> np.ndarray:
        return np.cumsum(np.where(mask, sign, np.int8(0)), dtype=np.int32)[opens] > 0

    out = np.full(len(opens), 7, np.int8)  # idle
    act: dict[int, np.ndarray] = {}
    for number, out_code in _PRECEDENCE:
        act[number] = active(cat == number)
        out[act[number]] = out_code
    flags = np.where(act[_COLLECTIVES] & (act[_WEIGHT_UPDATE] | act[_COMPUTE]) & ~act[_EVAL],
                     np.uint8(_OVERLAPPED), np.uint8(0))
    flags |= np.where(active(cat == _STEP), np.uint8(_IN_STEP), np.uint8(0))
    for bit in range(len(_KINDS)):
        flags |= np.where(active(kind == bit), np.uint8(_KIND0 << bit), np.uint8(0))
    return dev[opens], ts[opens], ts[opens + 1] - ts[opens], out, flags


def _latest_step(dev: np.ndarray, ts: np.ndarray, s_dev: np.ndarray, s_start: np.ndarray,
                 s_end: np.ndarray) -> np.ndarray:
    """For each point, the index of its device's step with the latest start <= its time (the SQL's
    ASOF rule: a step's start counts for a point at the same instant), or -1 when there is none or
    the point is at or after that step's end. Points grouped by device, steps sorted by (device,
    start); a device is any sortable integer (a dense id or a hash key)."""
    found = np.full(len(ts), -1, np.int64)
    if not len(ts) or not len(s_start):
        return found
    devices, first = np.unique(s_dev, return_index=True)
    last = np.append(first[1:], len(s_dev))
    point_lo = np.searchsorted(dev, devices, side="left")
    point_hi = np.searchsorted(dev, devices, side="right")
    for d in range(len(devices)):
        a, b = point_lo[d], point_hi[d]
        if a == b:
            continue
        lo, hi = first[d], last[d]
        j = np.searchsorted(s_start[lo:hi], ts[a:b], side="right") - 1 + lo
        at = np.maximum(j, lo)
        found[a:b] = np.where((j >= lo) & (ts[a:b] < s_end[at]), at, -1)
    return found


def _same_device(alias: str) -> str:
    """A join of ``alias``'s rows to the batch's devices ``d``: a NULL device is a device too (the SQL
    keys devices by hash(run_id, host, device), which does not drop NULLs)."""
    return (f"d.run_id = {alias}.run_id AND d.host = {alias}.host "
            f"AND d.device IS NOT DISTINCT FROM {alias}.device")


def _np(column: Any, dtype: Any) -> np.ndarray:
    """A non-null fetched column as a contiguous numpy array of ``dtype``."""
    return np.ascontiguousarray(np.asarray(column), dtype=dtype)


# the columns of stage op_steps, in its order (attribution.sql)
_OP_STEPS_COLUMNS = ("run_id, host, device AS device_ordinal, short_name, name, category, collective_kind, "
                     "hlo_category, hlo_module, tf_op, shape, flops, bytes_accessed, start_ps, duration_ps, "
                     "line, is_container")


class OpSteps:
    """Stage op_steps' rows for a batch without its window: the step each op starts in found by numpy
    (the device's latest step start <= the op's start, if the op starts before that step ends: the
    stage's ASOF rule, a step's start before an op starting at the same instant), joined back to the op
    rows by position (``columns``: the op rows' to keep, the stage's by default). Use as a context
    manager: ``sql`` is valid inside it (an Arrow table registered on the connection)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, att_ops: str, step_breakdown: str,
                 name: str, columns: str = _OP_STEPS_COLUMNS) -> None:
        self._con, self._name = con, name
        key = "hash(run_id::BIGINT, host, {device}::BIGINT)"
        # the ops in scan order, the order the POSITIONAL JOIN below pairs them in: ``att_ops`` may be
        # a registered Arrow table (op_arrays' rows), which has no rowid
        ops = con.execute(f"SELECT {key.format(device='device')} AS k, start_ps "
                          f"FROM {att_ops}").fetchnumpy()
        steps = con.execute(f"SELECT {key.format(device='device_ordinal')} AS k, start_ps, duration_ps, "
                            f"step_num, is_eval FROM {step_breakdown} WHERE device_ordinal IS NOT NULL "
                            f"ORDER BY k, start_ps").fetchnumpy()
        n = len(ops["k"])
        op_key = _np(ops["k"], np.uint64)
        order = np.argsort(op_key, kind="stable")  # the ops grouped by device
        s_start = _np(steps["start_ps"], np.int64)
        at = np.empty(n, np.int64)  # the step row of each op, in the table's row order (-1: none)
        at[order] = _latest_step(op_key[order], _np(ops["start_ps"], np.int64)[order],
                                 _np(steps["k"], np.uint64), s_start,
                                 s_start + _np(steps["duration_ps"], np.int64))
        none = at < 0
        pick = np.maximum(at, 0)

        import pyarrow as pa

        def column(values: Any, kind: Any, fill: Any) -> Any:
            if not len(values):
                return pa.nulls(n, kind)
            taken = np.asarray(_filled(values, fill))[pick]
            return pa.array(taken, type=kind, mask=none | _null_mask(values)[pick])

        self._table = pa.table({
            "step_num": column(steps["step_num"], pa.int64(), 0),
            "step_start": column(steps["start_ps"], pa.int64(), 0),
            "step_is_eval": column(steps["is_eval"], pa.bool_(), False),
        })
        self.sql = (f"SELECT {columns}, k.step_num, k.step_start, k.step_is_eval "
                    f"FROM {att_ops} POSITIONAL JOIN {name} k")

    def __enter__(self) -> OpSteps:
        self._con.register(self._name, self._table)
        return self

    def __exit__(self, *exc: object) -> None:
        self._con.unregister(self._name)


def _null_mask(column: Any) -> np.ndarray:
    """Where a fetched column is NULL (fetchnumpy gives masked arrays for columns with NULLs)."""
    mask = np.ma.getmaskarray(column) if isinstance(column, np.ma.MaskedArray) else None
    return mask if mask is not None else np.zeros(len(column), bool)


def _filled(column: Any, fill: Any = 0) -> np.ndarray:
    """A fetched column with its NULLs replaced by ``fill`` (their masks kept apart, _null_mask)."""
    return column.filled(fill) if isinstance(column, np.ma.MaskedArray) else np.asarray(column)
