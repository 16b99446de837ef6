"""A batch of hosts attributed in numpy where the work is per op or per instant: the batch engine.

attribution.sql defines every stage; for a batch of hosts whose ops are accelerator op lines (the
``op_kinds`` fast path), the per-batch attribution (analyzer/per_host.py) builds the stages that scan
every op or every elementary interval from arrays instead, and leaves to SQL the stages over a few
thousand rows (steps, programs, eval spans, the device breakdown's wall and cycle bounds):

- ``$events``: the stages after att_ops read events only off the device op lines (a step or module
  line, a host thread: attribution.sql), so they read a TEMP table of the batch's events off those
  lines (a twentieth of a pod's events) instead of the ``events`` view over every op;
- att_ops: the narrow op rows joined in numpy (analyzer/op_arrays.py), kept as arrays;
- att_intervals and att_elementary: the sweep over the op arrays and the small spans (analyzer/sweep.py);
- step_breakdown and collective_time: sums over the elementary intervals in numpy;
- device_breakdown: its SQL, over the elementary intervals outside steps only (the only ones it reads);
- op_steps: each op's step found in numpy (the stage's ASOF rule).

Each relation has the stage's columns, types and rows (tests/test_batch_engine.py compares the reports
with the stages' SQL's on every capture); floating sums may differ in their last digits (summation order).
``TPUANALYZE_BATCH_ENGINE=0`` runs the stages' SQL instead.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
from tpuanalyze.analyzer.op_arrays import OpArrays, device_sort_key
from tpuanalyze.analyzer.op_kinds import OP_LINES_SQL
from tpuanalyze.analyzer.sweep import (
    _CATEGORIES,
    _IN_STEP,
    _KIND0,
    _KIND_COLUMNS,
    _KINDS,
    _NO_CATEGORY,
    _NO_KIND,
    _OUT,
    _OVERLAPPED,
    _latest_step,
    _sweep,
    sort_points,
)
from tpuanalyze.store.database import events_select

from tpuanalyze.keys import columns_in, is_op_line, lookup

# the stages the engine builds from arrays (the others run their SQL)
ENGINE_STAGES = ("att_intervals", "att_elementary", "step_breakdown", "collective_time", "op_steps")
_CAT_CODE = {name: i for i, name in enumerate(_OUT)}


def engine_enabled() -> bool:
    """Whether the batch engine runs (TPUANALYZE_BATCH_ENGINE=0: the stages' SQL)."""
    return os.environ.get("TPUANALYZE_BATCH_ENGINE", "1").strip().lower() not in ("0", "false", "no")


def off_op_line_events(con: duckdb.DuckDBPyConnection, subs: dict[str, str], target: str) -> str:
    """TEMP TABLE ``target``: the batch's rows of the ``events`` view that are not on a device op line
    (the events every stage after att_ops reads); its name."""
    run, e_host, l_host = subs["run_filter"], subs["e_host"], subs["l_host"]
    r_host = e_host.replace("e.host", "r.host")
    rows = (f"(SELECT r.* FROM event_rows r WHERE r.{run} AND {r_host} AND NOT EXISTS ("
            f"SELECT 1 FROM lines l JOIN planes p USING (run_id, host, plane_index) "
            f"WHERE l.{run} AND {l_host} AND {OP_LINES_SQL} AND l.run_id = r.run_id AND l.host = r.host "
            f"AND l.plane_index = r.plane_index AND l.line_index = r.line_index))")
    con.execute(f"CREATE OR REPLACE TEMP TABLE {target} AS {events_select(rows)}")
    return target


@dataclass
class Elementary:
    """The batch's elementary intervals (att_elementary) as arrays, sorted by device and time; each
    interval's step as an index into ``steps`` (-1: none)."""

    devices: list[tuple[str, int | None]]
    dev: np.ndarray  # int32 into devices
    ts: np.ndarray
    length: np.ndarray
    category: np.ndarray  # int8 code into sweep._OUT
    flags: np.ndarray  # uint8: sweep._OVERLAPPED, _IN_STEP, kind bits
    step: np.ndarray  # int64 index into the steps arrays, -1 none
    step_dev: np.ndarray  # the batch's steps, grouped by (device, start): device
    step_start: np.ndarray
    step_end: np.ndarray  # the largest end of the steps starting there


def _spans(con: duckdb.DuckDBPyConnection, relation: str, where: str = "") -> dict[str, Any] | None:
    """host, device, start_ps, end_ps of a small span relation, or None where a time is NULL."""
    got = con.execute(f"SELECT host, device, start_ps, end_ps FROM {relation} {where}").fetchnumpy()
    if any(np.ma.getmaskarray(got[c]).any() for c in ("start_ps", "end_ps")):
        return None
    return got


def _device_keys(got: dict[str, Any]) -> list[tuple[str, int | None]]:
    hosts = np.asarray(np.ma.getdata(got["host"]), dtype=object).tolist()
    devices = got["device"]
    null = np.ma.getmaskarray(devices).tolist()
    values = np.asarray(np.ma.getdata(devices)).tolist()
    return [(str(h), None if n else int(d)) for h, d, n in zip(hosts, values, null, strict=True)]


def sweep_batch(con: duckdb.DuckDBPyConnection, ops: OpArrays, kinds_table: str,
                rel: dict[str, str]) -> Elementary | None:
    """The batch's elementary intervals from its op arrays and its (small) eval, input and step spans,
    as stage att_elementary defines them over att_intervals; None where a span's time is NULL (the
    stage's SQL sweep then runs)."""
    evals = _spans(con, rel["att_eval_spans"])
    inputs = _spans(con, rel["att_input_spans"], "WHERE end_ps > start_ps")
    steps = _spans(con, rel["att_steps"])
    if evals is None or inputs is None or steps is None:
        return None
    span_keys = [_device_keys(x) for x in (evals, inputs, steps)]
    devices = sorted(set(ops.devices).union(*span_keys), key=device_sort_key)
    position = {dev: i for i, dev in enumerate(devices)}
    op_dev = (np.array([position[d] for d in ops.devices], dtype=np.int64)[ops.device_index]
              if len(ops.device_index) else np.empty(0, np.int64))
    # each op's point code: its kind's interval category (a container is 'container') and collective kind
    kinds = con.execute(f"SELECT kind_id, CASE WHEN is_container THEN 'container' ELSE category END, "
                        f"collective_kind FROM {kinds_table}").fetchall()
    cat_index = {c: i for i, c in enumerate(_CATEGORIES)}
    kind_index = {k: i for i, k in enumerate(_KINDS)}
    top = max((int(k) for k, _, _ in kinds), default=-1) + 1
    code_of_kind = np.zeros(max(top, 1), np.uint8)
    for kind_id, category, kind in kinds:
        code_of_kind[int(kind_id)] = (cat_index.get(category, _NO_CATEGORY) * 8
                                      + kind_index.get(kind, _NO_KIND))
    parts_dev = [op_dev]
    parts_code = [code_of_kind[ops.kind_id] if len(ops.kind_id) else np.empty(0, np.uint8)]
    parts_start = [ops.start_ps]
    parts_end = [ops.start_ps + ops.duration_ps]
    for got, keys, category in ((evals, span_keys[0], "eval"), (inputs, span_keys[1], "input"),
                                (steps, span_keys[2], "step")):
        parts_dev.append(np.array([position[k] for k in keys], dtype=np.int64))
        parts_code.append(np.full(len(keys), cat_index[category] * 8 + _NO_KIND, np.uint8))
        parts_start.append(np.asarray(np.ma.getdata(got["start_ps"])).astype(np.int64))
        parts_end.append(np.asarray(np.ma.getdata(got["end_ps"])).astype(np.int64))
    p_dev, p_ts, p_code = sort_points(np.concatenate(parts_dev), np.concatenate(parts_code),
                                      np.concatenate(parts_start), np.concatenate(parts_end))
    o_dev, o_ts, o_len, o_cat, o_flags = _sweep(p_dev, p_ts, p_code)
    del p_dev, p_ts, p_code
    # the steps for the ASOF rule: one per (device, start), its largest end, as numpy_elementary takes
    # them; a NULL device's steps are nobody's (the SQL's ASOF join matches devices by equality)
    owned = np.array([k[1] is not None for k in span_keys[2]], dtype=bool)
    s_dev = np.array([position[k] for k in span_keys[2]], dtype=np.int64)[owned]
    s_start = np.asarray(np.ma.getdata(steps["start_ps"])).astype(np.int64)[owned]
    s_end = np.asarray(np.ma.getdata(steps["end_ps"])).astype(np.int64)[owned]
    if len(s_dev):
        order = np.lexsort((s_start, s_dev))
        s_dev, s_start, s_end = s_dev[order], s_start[order], s_end[order]
        new = np.ones(len(s_dev), bool)
        new[1:] = (s_dev[1:] != s_dev[:-1]) | (s_start[1:] != s_start[:-1])
        first = np.flatnonzero(new)
        s_end = np.maximum.reduceat(s_end, first)
        s_dev, s_start = s_dev[first], s_start[first]
    step = _latest_step(o_dev, o_ts, s_dev.astype(np.int32), s_start, s_end)
    step = np.where((step >= 0) & ((o_flags & _IN_STEP) > 0), step, -1)
    return Elementary(devices=devices, dev=o_dev, ts=o_ts, length=o_len, category=o_cat, flags=o_flags,
                      step=step, step_dev=s_dev, step_start=s_start, step_end=s_end)


def _grouped(step: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows in a step, ordered by step; each group's first position; each group's step) of the
    intervals' step indexes (-1 none)."""
    rows = np.flatnonzero(step >= 0)
    keys = step[rows]
    if len(keys) > 1 and (np.diff(keys) < 0).any():  # (sorted already: the sweep's order)
        order = np.argsort(keys, kind="stable")
        rows, keys = rows[order], keys[order]
    if not len(rows):
        return rows, np.empty(0, np.int64), np.empty(0, np.int64)
    new = np.ones(len(keys), bool)
    new[1:] = keys[1:] != keys[:-1]
    first = np.flatnonzero(new)
    return rows, first, keys[first]


def _register(con: duckdb.DuckDBPyConnection, name: str, columns: dict[str, Any], target: str,
              select: str) -> None:
    """TEMP TABLE ``target`` AS ``select`` over the Arrow table of ``columns`` registered as ``name``."""
    import pyarrow as pa

    con.register(name, pa.table(columns))
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {target} AS {select}")
    finally:
        con.unregister(name)


def _steps_rows(con: duckdb.DuckDBPyConnection, att_steps: str) -> tuple[Any, list[tuple[str, int | None]]]:
    got = con.execute(f"SELECT run_id, host, device, step_num, start_ps, end_ps, named_eval, step_source, "
                      f"program, is_warmup FROM {att_steps}").fetchnumpy()
    return got, _device_keys(got)


def step_breakdown(con: duckdb.DuckDBPyConnection, elem: Elementary, att_steps: str, target: str) -> None:
    """TEMP TABLE ``target``: stage step_breakdown from the elementary intervals (sums per step in numpy)."""
    import pyarrow as pa

    got, keys = _steps_rows(con, att_steps)
    n = len(keys)
    rows, first, group_step = _grouped(elem.step)
    sums = {}
    for name, mask in ((c, elem.category[rows] == _CAT_CODE[c]) for c in _OUT if c != "idle"):
        sums[name] = np.add.reduceat(np.where(mask, elem.length[rows], 0), first) if len(rows) else first
    overlapped = (elem.flags[rows] & _OVERLAPPED) > 0
    sums["overlapped"] = (np.add.reduceat(np.where(overlapped, elem.length[rows], 0), first)
                          if len(rows) else first)
    # each step row's sums: its (device, start) among the grouped steps (a NULL device matches none)
    position = {dev: i for i, dev in enumerate(elem.devices)}
    found = np.full(n, -1, np.int64)
    if len(group_step):
        g_dev, g_start = elem.step_dev[group_step], elem.step_start[group_step]
        lookup = {(int(d), int(s)): i for i, (d, s) in enumerate(zip(g_dev.tolist(), g_start.tolist(),
                                                                       strict=True))}
        starts = np.asarray(np.ma.getdata(got["start_ps"])).tolist()
        start_null = np.ma.getmaskarray(got["start_ps"]).tolist()
        for i, (key, start, null) in enumerate(zip(keys, starts, start_null, strict=True)):
            if key[1] is None or null or key not in position:
                continue
            found[i] = lookup.get((position[key], int(start)), -1)
    has = found >= 0
    at = np.maximum(found, 0)

    def column(name: str) -> np.ndarray:
        return np.where(has, sums[name][at], 0) if len(group_step) else np.zeros(n, np.int64)

    start = np.asarray(np.ma.getdata(got["start_ps"])).astype(np.int64)
    end = np.asarray(np.ma.getdata(got["end_ps"])).astype(np.int64)
    duration_null = np.ma.getmaskarray(got["start_ps"]) | np.ma.getmaskarray(got["end_ps"])
    duration = end - start
    parts = {name: column(name) for name in sums}
    busy = sum(parts[c] for c in ("compute", "weight_update", "collectives", "memory_transfer", "input",
                                  "output", "eval"))
    named_eval = got["named_eval"]
    named = np.asarray(np.ma.getdata(named_eval)).astype(bool)
    named_null = np.ma.getmaskarray(named_eval)
    # is_eval: named_eval OR eval_ps * 2 > duration, three-valued (NULL OR FALSE is NULL)
    named_true = named & ~named_null
    more_true = (parts["eval"] * 2 > duration) & ~duration_null
    is_eval = named_true | more_true
    is_eval_null = ~is_eval & (named_null | duration_null)

    def arrow(values: Any, kind: Any, mask: np.ndarray | None = None) -> Any:
        if isinstance(values, np.ma.MaskedArray):
            return pa.array(np.asarray(values.filled(0) if values.dtype != object else
                                       np.ma.getdata(values)), type=kind,
                            mask=np.ma.getmaskarray(values) | (mask if mask is not None else False))
        return pa.array(values, type=kind, mask=mask)

    def texts(values: Any) -> Any:
        data = np.array(np.ma.getdata(values), dtype=object)
        data[np.ma.getmaskarray(values)] = None
        return pa.array(data, type=pa.string())

    columns = {
        "run_id": arrow(got["run_id"], pa.int32()),
        "host": texts(got["host"]),
        "device_ordinal": arrow(got["device"], pa.int32()),
        "step_num": arrow(got["step_num"], pa.int64()),
        "is_eval": pa.array(is_eval, type=pa.bool_(), mask=is_eval_null),
        "start_ps": arrow(got["start_ps"], pa.int64()),
        "duration_ps": pa.array(duration, type=pa.int64(), mask=duration_null),
        "compute_ps": parts["compute"], "weight_update_ps": parts["weight_update"],
        "collectives_ps": parts["collectives"], "input_ps": parts["input"], "output_ps": parts["output"],
        "eval_ps": parts["eval"],
        "idle_ps": pa.array(duration - busy, type=pa.int64(), mask=duration_null),
        "collectives_overlapped_ps": parts["overlapped"],
        "step_source": texts(got["step_source"]),
        "memory_transfer_ps": parts["memory_transfer"],
        "is_warmup": arrow(got["is_warmup"], pa.bool_()),
        "program": texts(got["program"]),
    }
    huge = ("compute_ps", "weight_update_ps", "collectives_ps", "input_ps", "output_ps", "eval_ps",
            "idle_ps", "collectives_overlapped_ps", "memory_transfer_ps")
    select = ", ".join(f"CAST({c} AS HUGEINT) AS {c}" if c in huge else c for c in columns)
    _register(con, f"{target}_arrow", columns, target, f"SELECT {select} FROM {target}_arrow")


def collective_time(con: duckdb.DuckDBPyConnection, elem: Elementary, run_id: int, target: str) -> None:
    """TEMP TABLE ``target``: stage collective_time from the elementary intervals: per device step and
    collective kind, the exposed and overlapped time, an instant shared evenly by the kinds active."""
    import pyarrow as pa

    kind_bits = (elem.flags >> 2) & 63
    rows = np.flatnonzero((elem.step >= 0) & (kind_bits > 0))
    bits = kind_bits[rows]
    count = np.zeros(len(rows), np.int64)
    for b in range(len(_KINDS)):
        count += (bits >> b) & 1
    share = elem.length[rows] / count
    exposed = elem.category[rows] == _CAT_CODE["collectives"]
    overlapped = (elem.flags[rows] & _OVERLAPPED) > 0
    steps = elem.step[rows]
    out_step, out_kind, out_exposed, out_overlapped = [], [], [], []
    for b, kind in enumerate(_KINDS):
        mine = np.flatnonzero((bits >> b) & 1)
        if not len(mine):
            continue
        key = steps[mine]
        uniq, inverse = np.unique(key, return_inverse=True)
        out_step.append(uniq)
        out_kind.extend([kind] * len(uniq))
        out_exposed.append(np.bincount(inverse, weights=np.where(exposed[mine], share[mine], 0.0),
                                       minlength=len(uniq)))
        out_overlapped.append(np.bincount(inverse, weights=np.where(overlapped[mine], share[mine], 0.0),
                                          minlength=len(uniq)))
    step_index = np.concatenate(out_step) if out_step else np.empty(0, np.int64)
    hosts, ordinals = _device_columns(elem.devices, elem.step_dev[step_index])
    columns = {
        "run_id": pa.array(np.full(len(step_index), run_id, np.int32)),
        "host": hosts,
        "device_ordinal": ordinals,
        "step_start": pa.array(elem.step_start[step_index], type=pa.int64()),
        "kind": pa.array(out_kind, type=pa.string()),
        "exposed_ps": pa.array(np.concatenate(out_exposed) if out_exposed else np.empty(0),
                               type=pa.float64()),
        "overlapped_ps": pa.array(np.concatenate(out_overlapped) if out_overlapped else np.empty(0),
                                  type=pa.float64()),
    }
    _register(con, f"{target}_arrow", columns, target, f"SELECT * FROM {target}_arrow")


def _device_columns(devices: list[tuple[str, int | None]], index: np.ndarray) -> tuple[Any, Any]:
    """(host, device ordinal) Arrow columns of the rows whose devices are ``index`` into ``devices``."""
    import pyarrow as pa

    take = pa.array(index.astype(np.int64))
    hosts = pa.array([d[0] for d in devices], type=pa.string()).take(take)
    ordinals = pa.array([d[1] for d in devices], type=pa.int32()).take(take)
    return hosts, ordinals


def outside_steps(con: duckdb.DuckDBPyConnection, elem: Elementary, run_id: int, target: str) -> None:
    """TEMP TABLE ``target``: the elementary intervals outside any step span, with att_elementary's
    columns: all that stage device_breakdown reads of it (its ``NOT in_step`` rows)."""
    import pyarrow as pa

    rows = np.flatnonzero((elem.flags & _IN_STEP) == 0)
    hosts, ordinals = _device_columns(elem.devices, elem.dev[rows])
    columns: dict[str, Any] = {
        "run_id": pa.array(np.full(len(rows), run_id, np.int32)),
        "host": hosts,
        "device": ordinals,
        "ts": pa.array(elem.ts[rows]), "len_ps": pa.array(elem.length[rows]),
        "category": pa.array(np.array(_OUT, dtype=object)[elem.category[rows]], type=pa.string()),
        "collective_overlapped": pa.array((elem.flags[rows] & _OVERLAPPED) > 0),
        "in_step": pa.array(np.zeros(len(rows), bool)),
    }
    for bit, name in enumerate(_KIND_COLUMNS):
        columns[name] = pa.array((elem.flags[rows] & (_KIND0 << bit)) > 0)
    columns["step_start"] = pa.nulls(len(rows), pa.int64())
    _register(con, f"{target}_arrow", columns, target, f"SELECT * FROM {target}_arrow")


def op_steps_rows(con: duckdb.DuckDBPyConnection, ops: OpArrays, step_breakdown_table: str) -> Any:
    """The batch's narrow op_steps rows (op_kinds.OP_STEPS_OWN) as an Arrow table: the op rows
    (``ops``) each with the step it starts in (the stage's ASOF rule over the step_breakdown rows of a
    device: the latest start at or before the op's, if the op starts before that step ends). The
    collectives come first (as the scratch database stores them: a file's row groups of compute ops
    then have no collective kind, which the findings' filters skip), host and collective kind
    dictionary-encoded (cheap to write and to read back)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from tpuanalyze.analyzer.sweep import _filled, _null_mask

    steps = con.execute(f"SELECT host, device_ordinal AS device, start_ps, duration_ps, step_num, is_eval "
                        f"FROM {step_breakdown_table} WHERE device_ordinal IS NOT NULL").fetchnumpy()
    keys = _device_keys(steps)
    position = {dev: i for i, dev in enumerate(ops.devices)}
    s_dev = np.array([position.get(k, -1) for k in keys], dtype=np.int64)
    s_start = _filled(steps["start_ps"]).astype(np.int64)
    s_end = s_start + _filled(steps["duration_ps"]).astype(np.int64)
    order = np.lexsort((s_start, s_dev))
    n = len(ops.start_ps)
    op_order = np.argsort(ops.device_index, kind="stable")
    found = np.empty(n, np.int64)
    found[op_order] = _latest_step(ops.device_index[op_order].astype(np.int64), ops.start_ps[op_order],
                                   s_dev[order], s_start[order], s_end[order])
    kinds = ops.collective_kind
    collective = np.asarray(pc.is_valid(kinds))
    rows = np.concatenate([np.flatnonzero(collective), np.flatnonzero(~collective)])  # collectives first
    found = found[rows]
    none = found < 0
    pick = order[np.maximum(found, 0)] if len(order) else np.zeros(n, np.int64)

    def column(values: Any, kind: Any, fill: Any) -> Any:
        if not len(values):
            return pa.nulls(n, kind)
        return pa.array(np.asarray(_filled(values, fill))[pick], type=kind,
                        mask=none | _null_mask(values)[pick])

    hosts = sorted({host for host, _ in ops.devices})
    host_index = {host: i for i, host in enumerate(hosts)}
    device_host = np.array([host_index[host] for host, _ in ops.devices], dtype=np.int32)
    device_ordinal = np.array([d if d is not None else 0 for _, d in ops.devices], dtype=np.int32)
    device_null = np.array([d is None for _, d in ops.devices], dtype=bool)
    device = ops.device_index[rows]
    run_id = ops.table.column("run_id")[0].as_py() if n else 0
    indices = np.asarray(kinds.indices.fill_null(0))[rows]
    return pa.table({
        "run_id": pa.array(np.full(n, run_id, np.int32)),
        "host": pa.DictionaryArray.from_arrays(pa.array(device_host[device] if len(device_host)
                                                        else np.empty(0, np.int32)),
                                               pa.array(hosts, type=pa.string())),
        "device_ordinal": pa.array(device_ordinal[device] if len(device_ordinal) else np.empty(0, np.int32),
                                   mask=device_null[device] if len(device_null) else None),
        "kind_id": pa.array(ops.kind_id[rows], type=pa.int32()),
        "collective_kind": pa.DictionaryArray.from_arrays(pa.array(indices, mask=~collective[rows]),
                                                          kinds.dictionary),
        "start_ps": pa.array(ops.start_ps[rows]),
        "duration_ps": pa.array(ops.duration_ps[rows]),
        "step_num": column(steps["step_num"], pa.int64(), 0),
        "step_start": column(steps["start_ps"], pa.int64(), 0),
        "step_is_eval": column(steps["is_eval"], pa.bool_(), False),
    })


_RUN_RE = re.compile(r"run_id\s*=\s*(-?\d+)")


def run_of(subs: dict[str, str]) -> int:
    """The run id of a batch's ``$run_filter`` (``run_id = N``)."""
    match = _RUN_RE.search(subs["run_filter"])
    if match is None:
        raise ValueError(f"no run id in {subs['run_filter']!r}")
    return int(match.group(1))


def batch_flags(batch: Any) -> dict[str, bool]:
    """Stage att_runs' flags of a map worker's batch in memory (``store.batch.BatchTables``), from its
    arrays: the same facts the stage reads from the tables (which device lines hold events, an op
    event's group id of its own or of its metadata), for an XSpace run (no Kineto JSON)."""
    planes, lines, events = batch.columns("planes"), batch.columns("lines"), batch.columns("event_rows")
    flags = dict.fromkeys(("has_device_planes", "has_steps_line", "has_modules_line", "has_group_ids",
                           "is_kineto"), False)
    if planes is None:
        return flags
    count = np.where(planes["num_events__ok"], planes["num_events"], 0) if "num_events__ok" in planes \
        else planes["num_events"]
    flags["has_device_planes"] = bool(any(k in ("tpu", "gpu") and n > 0 for k, n in
                                          zip(planes["kind"].tolist(), count.tolist(), strict=True)))
    if lines is None or events is None or not len(events["host_code"]):
        return flags
    plane_hosts, line_hosts, ev_hosts = (batch.host_names(t) for t in ("planes", "lines", "event_rows"))
    plane_name = {(plane_hosts[h], int(p)): name for h, p, name in
                  zip(planes["host_code"].tolist(), planes["plane_index"].tolist(), planes["name"].tolist(),
                      strict=True)}
    code = {h: i for i, h in enumerate(ev_hosts)}
    e_host, e_plane, e_line = (events["host_code"].astype(np.int64), events["plane_index"].astype(np.int64),
                               events["line_index"].astype(np.int64))
    keys, bits = [], []  # each device line's (host, plane, line) and bits: 1 steps, 2 modules, 4 op line
    for h, p, i, name in zip(lines["host_code"].tolist(), lines["plane_index"].tolist(),
                             lines["line_index"].tolist(), lines["name"].tolist(), strict=True):
        host = line_hosts[h]
        plane = plane_name.get((host, int(p)))
        if host not in code or not isinstance(plane, str) or not plane.startswith("/device:"):
            continue
        keys.append((code[host], p, i))
        bits.append((1 if name == "Steps" else 0) | (2 if name == "XLA Modules" else 0)
                    | (4 if is_op_line(plane, name) else 0))
    line_bits = lookup(np.array(keys, dtype=np.int64).T, np.array(bits, dtype=np.int8),
                       np.stack([e_host, e_plane, e_line]))
    flags["has_steps_line"] = bool((line_bits & 1).any())
    flags["has_modules_line"] = bool((line_bits & 2).any())
    op = ((line_bits & 4) > 0) & (events["duration_ps"] > 0)
    if (op & events["group_id__ok"]).any():
        flags["has_group_ids"] = True
    elif op.any():
        metadata = batch.columns("event_metadata")
        if metadata is not None and metadata["group_id__ok"].any():
            md_hosts = batch.host_names("event_metadata")
            md_code = {h: i for i, h in enumerate(md_hosts)}
            remap = np.array([md_code.get(h, -1) for h in ev_hosts], dtype=np.int64)
            grouped = metadata["group_id__ok"]
            keys = np.stack([metadata["host_code"][grouped].astype(np.int64),
                             metadata["plane_index"][grouped].astype(np.int64),
                             metadata["metadata_id"][grouped].astype(np.int64)])
            op &= remap[e_host] >= 0  # (a host without metadata names none)
            ops = np.stack([remap[e_host[op]], e_plane[op], events["metadata_id"][op].astype(np.int64)])
            flags["has_group_ids"] = bool(columns_in(ops, keys).any())
    return flags
