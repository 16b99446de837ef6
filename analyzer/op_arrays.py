"""The device branch of stage ``att_ops`` as narrow op rows, joined in numpy rather than in SQL.

``op_kinds.OpKinds`` keys every device op to a *kind* (its line, properties and class): a pod's millions
of ops carry a few thousand distinct kinds. Its SQL form joins the batch's op events to their keys and
the keys back to their kinds row by row (three joins over every op: a third of a 512-host analysis'
attribution time). Here SQL does what is small or a scan (the op lines; the op events read with their
line number; each distinct key's properties and class, as the SQL form reads and classifies them) and
numpy does what is per op: the distinct keys of the events (``numpy.unique`` on one packed integer)
and each op's kind through the keys' inverse index. Same rows, columns and types as the SQL form
(tests/test_map_analysis.py: a map task's rows made from arrays, from fetched arrays and in SQL;
tests/test_batch_engine.py: every capture's report); the SQL form stays the definition.
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
    op_lines_select,
)

from tpuanalyze.keys import dense_extents, is_op_line, lookup

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
    collective_kind: Any = None  # the rows' collective kind (Arrow, dictionary-encoded)


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

    lines, keys = f"{local}op_lines", f"{local}op_keys"
    key_table = f"{local}op_key_arrow"
    run = subs["run_filter"]
    e_host = subs["e_host"]
    # 1. the batch's op lines, numbered (as the SQL form numbers them)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {lines} AS {op_lines_select(subs)}")
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
        group, group_null = _masked(ev["group_id"])
        corr, corr_null = _masked(ev["correlation_id"])
        line_devices, line_null = _masked(line_rows["device"])
        return _finish(kinds, con, subs, local, rows, keys, len(u_line), inverse,
                       LineInfo(run_id=np.asarray(line_rows["run_id"]).astype(np.int32),
                                host=np.asarray(line_rows["host"], dtype=object),
                                device=line_devices, device_null=line_null),
                       line_key - 1, np.asarray(ev["start_ps"]).astype(np.int64),
                       np.asarray(ev["duration_ps"]).astype(np.int64), group, group_null, corr, corr_null)
    finally:
        for table_name in (lines, keys):
            con.execute(f"DROP TABLE IF EXISTS {table_name}")


@dataclass
class LineInfo:
    """The batch's op lines in line-key order (key 1 first): run, host and device of each."""

    run_id: np.ndarray
    host: np.ndarray  # object (str)
    device: np.ndarray
    device_null: np.ndarray


def _finish(kinds: OpKinds, con: duckdb.DuckDBPyConnection, subs: dict[str, str], local: str, rows: str,
            keys: str, n_keys: int, inverse: np.ndarray, lines: LineInfo, line_pos: np.ndarray,
            start: np.ndarray, duration: np.ndarray, group: np.ndarray, group_null: np.ndarray,
            corr: np.ndarray, corr_null: np.ndarray) -> OpArrays:
    """Steps 4-6 of the narrow op rows, from the keys' TEMP table ``keys`` (key_index, line, full_name,
    PROPERTY_COLUMNS, metadata_group_id, metadata_correlation_id; ``n_keys`` rows) and each op
    event's key (``inverse``), line (``line_pos`` into ``lines``) and own numbers: the keys' classes,
    the batch's new kinds, TEMP TABLE ``rows`` and its arrays."""
    import pyarrow as pa

    classes = f"{local}op_classes"
    try:
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
        if len(keyed["key_index"]) != n_keys:
            raise RuntimeError("op kinds: a key matched no kind, or several")
        kinds_rows = con.execute(f"SELECT kind_id, collective_kind FROM {kinds.table}").fetchnumpy()
    finally:
        con.execute(f"DROP TABLE IF EXISTS {classes}")
    # 6. every op its key's kind, in numpy (the async line only contributes collective spans)
    kept = ~np.asarray(keyed["dropped"], bool)[inverse]
    at = inverse[kept]
    kind_id = np.asarray(keyed["kind_id"]).astype(np.int32)[at]
    md_group, md_group_null = _masked(keyed["metadata_group_id"])
    md_corr, md_corr_null = _masked(keyed["metadata_correlation_id"])
    group, group_null = group[kept], group_null[kept]
    corr, corr_null = corr[kept], corr_null[kept]
    group_id = np.where(group_null, md_group[at], group)
    group_id_null = group_null & md_group_null[at]
    correlation_id = np.where(corr_null, md_corr[at], corr)
    correlation_id_null = corr_null & md_corr_null[at]
    line_pos = line_pos[kept]
    # host and collective kind as dictionaries: a few distinct strings over a million rows
    line_hosts = sorted(set(lines.host.tolist()))
    host_of_line = np.array([line_hosts.index(h) for h in lines.host.tolist()], dtype=np.int32)
    kind_order = np.argsort(np.asarray(kinds_rows["kind_id"]))
    sorted_ids = np.asarray(kinds_rows["kind_id"])[kind_order]
    kind_pos = kind_order[np.searchsorted(sorted_ids, kind_id)]
    coll_text = _texts(kinds_rows["collective_kind"])
    coll_names = sorted({c for c in coll_text.tolist() if c is not None})
    coll_code = np.array([coll_names.index(c) if c is not None else -1 for c in coll_text.tolist()],
                         dtype=np.int32)
    row_coll = coll_code[kind_pos] if len(coll_code) else np.empty(0, np.int32)
    collective_kind = pa.DictionaryArray.from_arrays(
        pa.array(np.maximum(row_coll, 0), mask=row_coll < 0), pa.array(coll_names, type=pa.string()))
    start, duration = start[kept], duration[kept]
    table = pa.table({
        "run_id": pa.array(lines.run_id[line_pos], type=pa.int32()),
        "host": pa.DictionaryArray.from_arrays(pa.array(host_of_line[line_pos] if len(host_of_line)
                                                        else np.empty(0, np.int32)),
                                               pa.array(line_hosts, type=pa.string())),
        "device": pa.array(lines.device[line_pos].astype(np.int32), mask=lines.device_null[line_pos]),
        "kind_id": pa.array(kind_id, type=pa.int32()),
        "collective_kind": collective_kind,
        "start_ps": pa.array(start),
        "duration_ps": pa.array(duration),
        "group_id": pa.array(group_id.astype(np.int64), mask=group_id_null),
        "correlation_id": pa.array(correlation_id.astype(np.int64), mask=correlation_id_null),
    })
    # registered, not copied: its Arrow types are the rows table's (ROW_TYPES; dictionaries read as VARCHAR)
    con.unregister(rows)  # (the rows of an earlier pass)
    con.execute(f"DROP TABLE IF EXISTS {rows}")
    con.register(rows, table)
    # each op line's device, as an index into the batch's sorted devices
    line_devices = [(str(h), None if null else int(d)) for h, d, null in
                    zip(lines.host.tolist(), lines.device.tolist(), lines.device_null.tolist(), strict=True)]
    device_list = sorted(set(line_devices), key=device_sort_key)
    position = {dev: i for i, dev in enumerate(device_list)}
    line_device = np.array([position[dev] for dev in line_devices], dtype=np.int32)
    return OpArrays(devices=device_list, device_index=line_device[line_pos] if len(line_device)
                    else np.empty(0, np.int32), kind_id=kind_id, start_ps=start, duration_ps=duration,
                    table=table, collective_kind=collective_kind)


def narrow_from_batch(kinds: OpKinds, con: duckdb.DuckDBPyConnection, batch: Any, subs: dict[str, str],
                      local: str, rows: str, run_id: int) -> OpArrays:
    """``narrow_device_ops`` from a map worker's batch in memory (``store.batch.BatchTables``, every row
    of which is the batch's): the op events straight from its arrays, and an op's key its line's name,
    its plane's metadata table and its metadata id (the planes and hosts that share a metadata table
    share its keys: a pod batch's million ops have a few hundred), so only the distinct keys are
    looked up and classified. The same rows and kinds as the SQL form (tests/test_map_analysis.py)."""
    import pyarrow as pa

    keys = f"{local}op_keys"
    key_table = f"{local}op_key_arrow"
    events = batch.columns("event_rows")
    lines = batch.columns("lines")
    planes = batch.columns("planes")
    if events is None or lines is None or planes is None:
        raise NoArrays()
    # 1. the op lines (SQL's order: host, plane, line), and each plane's device
    plane_hosts = batch.host_names("planes")
    plane_of: dict[tuple[str, int], tuple[Any, Any, Any]] = {}  # name, device ordinal, NULL ordinal
    ordinal, ordinal_null = planes["device_ordinal"], ~planes["device_ordinal__ok"]
    for h, p, name, d, null in zip(planes["host_code"].tolist(), planes["plane_index"].tolist(),
                                   planes["name"].tolist(), ordinal.tolist(), ordinal_null.tolist(),
                                   strict=True):
        plane_of[(plane_hosts[h], int(p))] = (name, d, null)
    line_hosts = batch.host_names("lines")
    op_lines = sorted((line_hosts[h], int(p), int(i), name) for h, p, i, name in
                      zip(lines["host_code"].tolist(), lines["plane_index"].tolist(),
                          lines["line_index"].tolist(), lines["name"].tolist(), strict=True)
                      if is_op_line(plane_of.get((line_hosts[h], int(p)), (None,))[0], name))
    line_names = sorted({name for *_, name in op_lines})
    line_code = {name: i for i, name in enumerate(line_names)}
    info = LineInfo(run_id=np.full(len(op_lines), run_id, np.int32),
                    host=np.array([h for h, *_ in op_lines], dtype=object),
                    device=np.array([int(plane_of[(h, p)][1]) for h, p, *_ in op_lines], dtype=np.int64),
                    device_null=np.array([bool(plane_of[(h, p)][2]) for h, p, *_ in op_lines], dtype=bool))
    # 2. each event's op line (0: none), through a lookup of (host, plane, line); ids too sparse for a
    # dense table: the SQL-fetching form
    ev_hosts = batch.host_names("event_rows")
    host_code = {h: i for i, h in enumerate(ev_hosts)}
    e_host = events["host_code"].astype(np.int64)
    e_plane = events["plane_index"].astype(np.int64)
    e_line = events["line_index"].astype(np.int64)
    e_ids = np.stack([e_host, e_plane, e_line])
    if dense_extents(e_ids) is None:
        raise NoArrays()
    line_keys = [((host_code[h], p, i), k + 1) for k, (h, p, i, _) in enumerate(op_lines) if h in host_code]
    line_key = lookup(np.array([key for key, _ in line_keys], dtype=np.int64).T,
                      np.array([k for _, k in line_keys], dtype=np.int64), e_ids)
    chosen = np.flatnonzero((line_key > 0) & (events["duration_ps"] > 0))
    line_key = line_key[chosen]
    # 3. details: an event's own properties (then it is a key of its own) and correlation id
    details = batch.columns("event_details")
    n_events = len(events["host_code"])
    own = np.zeros(n_events, bool)
    corr = np.zeros(n_events, np.int64)
    corr_null = np.ones(n_events, bool)
    if details is not None:
        serial = details["serial"]
        has_own = np.zeros(len(serial), bool)
        for column in _OWN_PROPERTIES:
            values = details[column]
            has_own |= (details[f"{column}__ok"] if f"{column}__ok" in details
                        else np.array([v is not None for v in values.tolist()], dtype=bool))
        own[serial[has_own]] = True
        corr[serial] = details["correlation_id"]
        corr_null[serial] = ~details["correlation_id__ok"]
    # 4. each event's key: its line's name, its plane's metadata table and its metadata id; an event
    # with properties of its own, itself
    blocks = batch.metadata_blocks()
    table_of_plane = {(host_code[b.host], b.plane): b.table for b in blocks if b.host in host_code}
    table_of = lookup(np.array(list(table_of_plane), dtype=np.int64).T,
                      np.array(list(table_of_plane.values()), dtype=np.int64),
                      np.stack([e_host[chosen], e_plane[chosen]]), default=-1)
    name_of_line = np.array([line_code[name] for *_, name in op_lines], dtype=np.int64)
    md = events["metadata_id"][chosen].astype(np.int64)
    own_chosen = own[chosen]
    own_key = np.where(own_chosen, chosen + 1, 0)
    u_name, u_table, u_md, u_own, inverse = _distinct_keys4(name_of_line[line_key - 1], table_of + 1, md,
                                                           own_key)
    # 5. the distinct keys' properties: their metadata row (in their table's first block), their details
    metadata = batch.columns("event_metadata")
    first_block: dict[int, tuple[int, int]] = {}
    for block in blocks:
        first_block.setdefault(block.table, (block.first, block.rows))
    row_of: dict[int, dict[int, int]] = {}
    md_rows = np.full(len(u_name), -1, np.int64)
    for k, (t, m) in enumerate(zip((u_table - 1).tolist(), u_md.tolist(), strict=True)):
        if t < 0:
            continue
        if t not in row_of:
            first, n = first_block[t]
            ids = metadata["metadata_id"][first : first + n].tolist()
            row_of[t] = {}
            for offset, value in enumerate(ids):
                row_of[t].setdefault(int(value), first + offset)  # (ids are unique in a plane's table)
        md_rows[k] = row_of[t].get(int(m), -1)
    # an own key's event: its details row (by serial) and its own plane's metadata row
    det_row = np.full(len(u_name), -1, np.int64)
    if details is not None and (u_own > 0).any():
        serial_pos = {int(v): i for i, v in enumerate(details["serial"].tolist())}
        for k in np.flatnonzero(u_own > 0).tolist():
            event = int(u_own[k]) - 1
            det_row[k] = serial_pos.get(event, -1)
    columns: dict[str, Any] = {"key_index": pa.array(np.arange(len(u_name), dtype=np.int64)),
                               "line": pa.array([line_names[i] for i in u_name.tolist()], type=pa.string())}
    have = md_rows >= 0
    at = np.maximum(md_rows, 0)

    def gather(source: dict[str, np.ndarray] | None, column: str, rows_at: np.ndarray, present: np.ndarray,
               kind: str) -> Any:
        if source is None or not len(rows_at):
            return pa.nulls(len(rows_at), getattr(pa, kind)())
        values = source[column][rows_at] if len(source[column]) else np.zeros(len(rows_at))
        if kind == "string":
            return pa.array(np.where(present, values, None), type=pa.string())
        ok = source.get(f"{column}__ok")
        mask = ~present if ok is None else ~(present & ok[rows_at])
        return pa.array(values, type=getattr(pa, kind)(), mask=mask)

    kinds_of = {"hlo_category": "string", "hlo_module": "string", "tf_op": "string", "shape": "string",
                "flops": "float64", "bytes_accessed": "float64"}
    columns["name"] = gather(metadata, "name", at, have, "string")
    columns["display_name"] = gather(metadata, "display_name", at, have, "string")
    d_have = det_row >= 0
    d_at = np.maximum(det_row, 0)
    for column in _OWN_PROPERTIES:
        columns[f"m_{column}"] = gather(metadata, column, at, have, kinds_of[column])
        columns[f"d_{column}"] = gather(details, column, d_at, d_have, kinds_of[column])
    columns["metadata_group_id"] = gather(metadata, "group_id", at, have, "int64")
    columns["metadata_correlation_id"] = gather(metadata, "correlation_id", at, have, "int64")
    con.register(key_table, pa.table(columns))
    try:
        props = ", ".join(f"COALESCE(d_{c}, m_{c}) AS {c}" for c in _OWN_PROPERTIES)
        con.execute(f"""CREATE OR REPLACE TEMP TABLE {keys} AS
SELECT key_index, line, COALESCE(name, '') AS full_name,
       coalesce(nullif(COALESCE(NULLIF(display_name, ''), name, ''), ''), COALESCE(name, '')) AS short_name,
       {props}, metadata_group_id, metadata_correlation_id
FROM {key_table}""")
    finally:
        con.unregister(key_table)
    try:
        group = events["group_id"][chosen]
        group_null = ~events["group_id__ok"][chosen]
        start = (events["start_ps"][chosen] + events["shift_ps"][chosen]).astype(np.int64)
        return _finish(kinds, con, subs, local, rows, keys, len(u_name), inverse, info, line_key - 1, start,
                       events["duration_ps"][chosen].astype(np.int64), group, group_null, corr[chosen],
                       corr_null[chosen])
    finally:
        con.execute(f"DROP TABLE IF EXISTS {keys}")


class NoArrays(Exception):
    """The batch's arrays do not fit the array form (the SQL-fetching form runs instead)."""


# Keys of up to this many bits are made distinct through a table of every possible key (linear time)
# rather than a sort; a pod batch's keys (line name, metadata table, metadata id) take ~16 bits.
DENSE_KEY_BITS = 23


def dense_unique(packed: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.unique(packed, return_inverse=True)`` of non-negative keys below ``2**bits``: a presence
    table where the keys are few bits, else the sort."""
    if bits > DENSE_KEY_BITS:
        uniq, inverse = np.unique(packed, return_inverse=True)
        return uniq, inverse.reshape(-1)
    present = np.zeros(1 << bits, bool)
    present[packed] = True
    uniq = np.flatnonzero(present)
    position = np.cumsum(present, dtype=np.int64) - 1
    return uniq.astype(np.int64), position[packed]


def _distinct_keys4(a: np.ndarray, b: np.ndarray, c: np.ndarray,
                    d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The distinct rows of four non-negative int columns and each row's index into them: one packed
    integer where the values fit, else a lexsort."""
    n = len(a)
    if not n:
        empty = np.empty(0, np.int64)
        return empty, empty, empty, empty, empty
    low_c = int(c.min())
    cols = [a.astype(np.int64), b.astype(np.int64), c.astype(np.int64) - low_c, d.astype(np.int64)]
    bits = [max(int(x.max()), 0).bit_length() for x in cols]
    if sum(bits) <= 62 and all(int(x.min()) >= 0 for x in cols):
        packed = np.zeros(n, np.int64)
        for x, width in zip(cols, bits, strict=True):
            packed = (packed << width) | x
        uniq, inverse = dense_unique(packed, sum(bits))
        out = []
        shift = sum(bits)
        for width in bits:
            shift -= width
            out.append((uniq >> shift) & ((1 << width) - 1))
        out[2] = out[2] + low_c
        return out[0], out[1], out[2], out[3], inverse
    stacked = np.stack(cols)
    uniq, inverse = np.unique(stacked, axis=1, return_inverse=True)
    return uniq[0], uniq[1], uniq[2] + low_c, uniq[3], inverse.reshape(-1)
