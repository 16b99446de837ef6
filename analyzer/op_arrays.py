"""The device branch of stage ``att_ops`` as narrow op rows, joined in numpy rather than in SQL.

``op_kinds.OpKinds`` keys every device op to a *kind* (its line, properties and class): a pod's millions
of ops carry a few thousand distinct kinds. Its SQL form joins the batch's op events to their keys and
the keys back to their kinds row by row (three joins over every op: a third of a 512-host analysis'
attribution time). Here SQL does what is small or a scan (the op lines; the op events read with their
line number; each distinct key's properties and class, as the SQL form reads and classifies them) and
numpy does what is per op: the distinct keys of the events (``numpy.unique`` on one packed integer)
and each op's kind through the keys' inverse index. Same rows, columns and types as the SQL form
(tests/test_op_arrays.py checks it on every capture); the SQL form stays the definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
from tpuanalyze.analyzer.op_kinds import (
    _OWN_PROPERTIES,
    KIND_COLUMNS,
    PROPERTY_COLUMNS,
    _same,
    batch_relation,
    classes_select,
)

if TYPE_CHECKING:
    from tpuanalyze.analyzer.op_kinds import OpKinds

# columns of a narrow op row (op_kinds.ROW_COLUMNS) and their types in the SQL form's TEMP table
ROW_TYPES = (("run_id", "INTEGER"), ("host", "VARCHAR"), ("device", "INTEGER"), ("kind_id", "INTEGER"),
             ("collective_kind", "VARCHAR"), ("start_ps", "BIGINT"), ("duration_ps", "BIGINT"),
             ("group_id", "BIGINT"), ("correlation_id", "BIGINT"))


def _masked(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values with NULLs as 0, NULL mask) of a fetched column."""
    if isinstance(column, np.ma.MaskedArray):
        return np.asarray(column.filled(0)), np.ma.getmaskarray(column)
    values = np.asarray(column)
    return values, np.zeros(len(values), bool)


@dataclass
class OpArrays:
    """A batch's narrow op rows as arrays (the rows table holds the same, in this order): each row's
    device as an index into ``devices`` ((host, device ordinal or None), sorted), its kind, start and
    duration."""

    devices: list[tuple[str, int | None]]
    device_index: np.ndarray  # int32
    kind_id: np.ndarray  # int32
    start_ps: np.ndarray  # int64
    duration_ps: np.ndarray  # int64
    table: Any = None  # the rows as an Arrow table (op_kinds.ROW_COLUMNS, the rows table's types)


def device_sort_key(device: tuple[str, int | None]) -> tuple[str, bool, int]:
    """(host, device) in SQL's ORDER BY host, device order (NULLs last)."""
    return (device[0], device[1] is None, device[1] if device[1] is not None else 0)


def _texts(column: Any) -> np.ndarray:
    """A fetched text column as an object array with None for NULL (``filled(None)`` would write the
    masked array's fill value, '?')."""
    values = np.array(np.ma.getdata(column), dtype=object)
    if isinstance(column, np.ma.MaskedArray):
        values[np.ma.getmaskarray(column)] = None
    return values


def _distinct_keys(line_key: np.ndarray, metadata_id: np.ndarray, own: np.ndarray,
                   own_null: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (line_key, metadata_id, own_index) of the events (NULL own_index: -1) and each
    event's index into them: one integer key where the values fit (a pod: always), else a lexsort."""
    own_key = np.where(own_null, -1, own)
    n = len(line_key)
    if not n:
        empty = np.empty(0, np.int64)
        return empty, empty, empty, empty
    lk_bits = max(int(line_key.max()), 0).bit_length()
    md_low, md_high = int(metadata_id.min()), int(metadata_id.max())
    md_bits = (md_high - md_low).bit_length()
    if not own_null.all():
        own_key = own_key + 1  # -1 -> 0
        own_bits = max(int(own_key.max()), 0).bit_length()
    else:
        own_key, own_bits = np.zeros(n, np.int64), 0
    if lk_bits + md_bits + own_bits <= 62 and md_low >= -(1 << 62):
        packed = ((line_key.astype(np.int64) << (md_bits + own_bits))
                  | ((metadata_id - md_low) << own_bits) | own_key)
        uniq, inverse = np.unique(packed, return_inverse=True)
        u_line = uniq >> (md_bits + own_bits)
        u_md = ((uniq >> own_bits) & ((1 << md_bits) - 1)) + md_low
        u_own = (uniq & ((1 << own_bits) - 1)) - 1 if own_bits else np.full(len(uniq), -1, np.int64)
        return u_line, u_md, u_own, inverse.reshape(-1)
    stacked = np.stack([line_key.astype(np.int64), metadata_id.astype(np.int64),
                        np.where(own_null, -1, own).astype(np.int64)])
    uniq, inverse = np.unique(stacked, axis=1, return_inverse=True)
    return uniq[0], uniq[1], uniq[2], inverse.reshape(-1)


def narrow_device_ops(kinds: OpKinds, con: duckdb.DuckDBPyConnection, subs: dict[str, str], local: str,
                      rows: str) -> OpArrays:
    """Create TEMP TABLE ``rows`` (the batch's narrow device op rows, op_kinds.ROW_COLUMNS) on ``con``, the
    batch's new kinds added to ``kinds``' table: what ``OpKinds``' SQL form makes, from the same
    statements where they read or classify, with the per-op joins in numpy. Returns the rows' arrays."""
    import pyarrow as pa

    lines, keys, classes = f"{local}op_lines", f"{local}op_keys", f"{local}op_classes"
    key_table = f"{local}op_key_arrow"
    run = subs["run_filter"]
    e_host, l_host = subs["e_host"], subs["l_host"]
    # 1. the batch's op lines, numbered (as the SQL form numbers them)
    con.execute(f"""CREATE OR REPLACE TEMP TABLE {lines} AS
SELECT l.run_id, l.host, l.plane_index, l.line_index, p.device_ordinal AS device, l.name AS line,
       CAST(row_number() OVER (ORDER BY l.host, l.plane_index, l.line_index) AS INTEGER) AS line_key
FROM lines l JOIN planes p USING (run_id, host, plane_index)
WHERE l.{run} AND {l_host} AND l.run_id IN (SELECT run_id FROM {subs['att_runs']})
  AND (p.name LIKE '/device:TPU:%' OR p.name LIKE '/device:GPU:%')
  AND (l.name IN ('XLA Ops', 'Async XLA Ops') OR l.name LIKE 'Stream #%')""")
    try:
        line_rows = con.execute(f"SELECT line_key, run_id, host, device FROM {lines} "
                                "ORDER BY line_key").fetchnumpy()
        own = " OR ".join(f"d.{c} IS NOT NULL" for c in _OWN_PROPERTIES)
        # 2. the batch's op events with their line number (one scan and a join to the few op lines)
        ev = con.execute(f"""
SELECT o.line_key, e.metadata_id, CASE WHEN {own} THEN d.event_index END AS own_index,
       e.start_ps, e.duration_ps, e.group_id, d.correlation_id
FROM event_rows e JOIN {lines} o USING (run_id, host, plane_index, line_index)
LEFT JOIN {batch_relation(subs, 'event_details', 'd')} d
  ON d.run_id = e.run_id AND d.host = e.host AND d.plane_index = e.plane_index
 AND d.event_index = e.event_index
WHERE e.{run} AND {e_host} AND e.duration_ps > 0""").fetchnumpy()
        line_key = np.asarray(ev["line_key"]).astype(np.int64)
        metadata_id, _ = _masked(ev["metadata_id"])
        own_index, own_null = _masked(ev["own_index"])
        u_line, u_md, u_own, inverse = _distinct_keys(line_key, metadata_id.astype(np.int64),
                                                      own_index.astype(np.int64), own_null)
        # 3. each distinct key's properties, as the events view resolves them (the event's own value wins)
        con.register(key_table, pa.table({
            "key_index": pa.array(np.arange(len(u_line), dtype=np.int64)),
            "line_key": pa.array(u_line.astype(np.int32)),
            "metadata_id": pa.array(u_md.astype(np.int64)),
            "own_index": pa.array(u_own.astype(np.int64), mask=u_own < 0)}))
        try:
            props = ", ".join(f"COALESCE(d.{c}, m.{c}) AS {c}" for c in _OWN_PROPERTIES)
            con.execute(f"""CREATE OR REPLACE TEMP TABLE {keys} AS
WITH k AS (
    SELECT o.run_id, o.host, o.plane_index, o.line, k.*
    FROM {key_table} k JOIN {lines} o USING (line_key)
)
SELECT k.key_index, k.line_key, k.line, k.metadata_id, k.own_index, COALESCE(m.name, '') AS full_name,
       coalesce(nullif(COALESCE(NULLIF(m.display_name, ''), m.name, ''), ''), COALESCE(m.name, ''))
           AS short_name,
       {props}, m.group_id AS metadata_group_id, m.correlation_id AS metadata_correlation_id
FROM k LEFT JOIN {batch_relation(subs, 'event_metadata', 'm')} m
  ON m.run_id = k.run_id AND m.host = k.host AND m.plane_index = k.plane_index
 AND m.metadata_id = k.metadata_id
LEFT JOIN {batch_relation(subs, 'event_details', 'd')} d
  ON k.own_index IS NOT NULL AND d.run_id = k.run_id AND d.host = k.host AND d.plane_index = k.plane_index
 AND d.event_index = k.own_index""")
        finally:
            con.unregister(key_table)
        # 4. each distinct combination of properties classified once
        properties = ("line", "full_name", *PROPERTY_COLUMNS)
        con.execute(f"CREATE OR REPLACE TEMP TABLE {classes} AS {classes_select(keys, subs)}")
        kinds._add(con, classes)
        # 5. each key's kind (small: one row per distinct key)
        keyed = con.execute(f"""
SELECT y.key_index, n.kind_id, n.line = 'Async XLA Ops' AND n.collective_kind IS NULL AS dropped,
       y.metadata_group_id, y.metadata_correlation_id
FROM {keys} y
JOIN {classes} c ON {_same('y', 'c', properties)}
JOIN {kinds.table} n ON {_same('n', 'c', KIND_COLUMNS)}
ORDER BY y.key_index""").fetchnumpy()
        if len(keyed["key_index"]) != len(u_line):
            raise RuntimeError("op kinds: a key matched no kind, or several")
        kinds_rows = con.execute(f"SELECT kind_id, collective_kind FROM {kinds.table}").fetchnumpy()
        # 6. every op its key's kind, in numpy (the async line only contributes collective spans)
        kept = ~np.asarray(keyed["dropped"], bool)[inverse]
        at = inverse[kept]
        kind_id = np.asarray(keyed["kind_id"]).astype(np.int32)[at]
        group, group_null = _masked(ev["group_id"])
        md_group, md_group_null = _masked(keyed["metadata_group_id"])
        corr, corr_null = _masked(ev["correlation_id"])
        md_corr, md_corr_null = _masked(keyed["metadata_correlation_id"])
        group, group_null = group[kept], group_null[kept]
        corr, corr_null = corr[kept], corr_null[kept]
        group_id = np.where(group_null, md_group[at], group)
        group_id_null = group_null & md_group_null[at]
        correlation_id = np.where(corr_null, md_corr[at], corr)
        correlation_id_null = corr_null & md_corr_null[at]
        lk = line_key[kept]
        # line_key is dense from 1 in line_rows' order
        line_pos = lk - 1
        run_ids = np.asarray(line_rows["run_id"]).astype(np.int32)
        devices, devices_null = _masked(line_rows["device"])
        host_names = pa.array(np.asarray(line_rows["host"], dtype=object), type=pa.string())
        kind_order = np.argsort(np.asarray(kinds_rows["kind_id"]))
        sorted_ids = np.asarray(kinds_rows["kind_id"])[kind_order]
        kind_pos = kind_order[np.searchsorted(sorted_ids, kind_id)]
        coll_text = _texts(kinds_rows["collective_kind"])
        table = pa.table({
            "run_id": pa.array(run_ids[line_pos], type=pa.int32()),
            "host": host_names.take(pa.array(line_pos)),
            "device": pa.array(devices[line_pos].astype(np.int32), mask=devices_null[line_pos]),
            "kind_id": pa.array(kind_id, type=pa.int32()),
            "collective_kind": pa.array(coll_text, type=pa.string()).take(pa.array(kind_pos)),
            "start_ps": pa.array(np.asarray(ev["start_ps"]).astype(np.int64)[kept]),
            "duration_ps": pa.array(np.asarray(ev["duration_ps"]).astype(np.int64)[kept]),
            "group_id": pa.array(group_id.astype(np.int64), mask=group_id_null),
            "correlation_id": pa.array(correlation_id.astype(np.int64), mask=correlation_id_null),
        })
        arrow = f"{local}op_rows_arrow"
        con.register(arrow, table)
        try:
            cols = ", ".join(f"CAST({c} AS {t}) AS {c}" for c, t in ROW_TYPES)
            con.execute(f"CREATE OR REPLACE TEMP TABLE {rows} AS SELECT {cols} FROM {arrow}")
        finally:
            con.unregister(arrow)
        # each op line's device, as an index into the batch's sorted devices
        line_devices = [(str(h), None if null else int(d)) for h, d, null in
                        zip(np.asarray(line_rows["host"], dtype=object).tolist(), devices.tolist(),
                            devices_null.tolist(), strict=True)]
        device_list = sorted(set(line_devices), key=device_sort_key)
        position = {dev: i for i, dev in enumerate(device_list)}
        line_device = np.array([position[dev] for dev in line_devices], dtype=np.int32)
        return OpArrays(devices=device_list, device_index=line_device[line_pos] if len(line_device)
                        else np.empty(0, np.int32), kind_id=kind_id,
                        start_ps=np.asarray(ev["start_ps"]).astype(np.int64)[kept],
                        duration_ps=np.asarray(ev["duration_ps"]).astype(np.int64)[kept], table=table)
    finally:
        for table_name in (lines, keys, classes):
            con.execute(f"DROP TABLE IF EXISTS {table_name}")
