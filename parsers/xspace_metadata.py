"""A plane's event metadata (``XPlane.event_metadata``) decoded from its bytes with numpy.

Why: a TPU core plane of a pod host holds ~300 metadata entries of ~7 stats for ~130 events, so
reading them as upb messages, one Python dict per entry, cost more per event than decoding the
events (~60 us per entry with the JSON of the other stats). Here every entry, and every stat of
every entry, of a plane is decoded at once (``parsers.wire``); Python runs per distinct stat name,
per module and per entry's JSON text only.

The columns are exactly what ``staging.metadata_table`` builds from the upb messages (the first
stat of a typed column that fits wins, the others go to the JSON written as ``json.dumps`` does).
Anything this fast path does not reproduce bit for bit (a duplicate map key or stat name, a stat
without a value or with bytes, a text or double value for a typed column that needs a cast)
returns None, and the caller reads the plane's metadata through upb as before.
"""

from __future__ import annotations

import re
from json.encoder import encode_basestring_ascii
from typing import Any

import numpy as np
from tpuanalyze.parsers import wire
from tpuanalyze.parsers.staging import TYPED_COLUMNS, TYPED_STATS, Columns, text_column

# XStat value field numbers (parsers.xspace: _STAT_*).
_DOUBLE, _UINT, _INT, _STR, _BYTES, _REF = 2, 3, 4, 5, 6, 7
_VALUE_WIRE = {_DOUBLE: 1, _UINT: 0, _INT: 0, _STR: 2, _BYTES: 2, _REF: 0}
_COLUMN_INDEX = {column: i for i, (column, _) in enumerate(TYPED_COLUMNS)}
_MASK64 = 0xFFFFFFFFFFFFFFFF
_TWO63 = np.uint64(1 << 63)


def _by_message(msg: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """Field records grouped by message, wire order kept (``decode_fields`` yields them pass by pass)."""
    order = np.argsort(msg, kind="stable")
    return (msg[order], *(c[order] for c in columns))


def _once(msg: np.ndarray, n: int) -> bool:
    return not len(msg) or int(np.bincount(msg, minlength=n).max()) <= 1


def decode_metadata(
    buf: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    key_order: list[int],
    stat_names: dict[int, str],
    module_ids: set[int],
    module_program: re.Pattern[str],
) -> Columns | None:
    """Event-metadata columns of the map entries at ``buf[starts[i]:ends[i]]`` (rows in
    ``key_order``, the map's iteration order), or None where only the upb reading is exact."""
    n = len(starts)
    if not n or len(key_order) != n:
        return None
    try:
        return _decode(buf, starts, ends, key_order, stat_names, module_ids, module_program)
    except wire.WireError:
        return None


def _decode(
    buf: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    key_order: list[int],
    stat_names: dict[int, str],
    module_ids: set[int],
    module_program: re.Pattern[str],
) -> Columns | None:
    n = len(starts)
    entry = wire.decode_fields(buf, starts, ends)
    key_msg, key_value, _ = entry.select(1, 0)
    value_msg, value_start, value_length = entry.select(2, 2)
    if len(entry.msg) != 2 * n or len(key_msg) != n or not _once(key_msg, n) or not _once(value_msg, n):
        return None
    keys = np.zeros(n, dtype=np.uint64)
    keys[key_msg] = key_value
    keys = keys.view(np.int64)
    position = {k: i for i, k in enumerate(keys.tolist())}
    if len(position) != n:
        return None  # a repeated key: upb keeps the last entry
    try:
        order = np.array([position[k] for k in key_order], dtype=np.int64)
    except KeyError:
        return None
    md_start = np.zeros(n, dtype=np.int64)
    md_end = np.zeros(n, dtype=np.int64)
    md_start[value_msg] = value_start.astype(np.int64)
    md_end[value_msg] = md_start[value_msg] + value_length
    # reorder the entries once: every column below is in the map's order
    keys, md_start, md_end = keys[order], md_start[order], md_end[order]
    fields = wire.decode_fields(buf, md_start, md_end)
    names = _text_field(buf, fields, n, 2)
    displays = _text_field(buf, fields, n, 4)
    if names is None or displays is None:
        return None
    stat_msg, stat_start, stat_length = fields.select(5, 2)
    stat_msg, stat_start, stat_length = _by_message(stat_msg, stat_start, stat_length)
    stats = _stats(buf, stat_start.astype(np.int64), stat_length, stat_names)
    if stats is None:
        return None
    key_code, key_text, kind, number, text = stats
    if len(stat_msg):
        pairs = stat_msg * len(key_text) + key_code
        if len(np.unique(pairs)) != len(pairs):
            return None  # a stat name twice in one entry: the dict keeps its first place, last value
    columns = _typed(n, stat_msg, key_code, key_text, kind, number, text)
    if columns is None:
        return None
    typed, in_json = columns
    _module_names(typed, keys.tolist(), names, stat_msg, key_code, key_text, kind, number, module_ids,
                  module_program)
    out: Columns = {"metadata_id": keys}
    out["name"] = text_column(names)
    out["display_name"] = text_column([d or None for d in displays])
    out["stats"] = _json(n, stat_msg[in_json], key_code[in_json], key_text, kind[in_json],
                         number[in_json], text[in_json])
    for column, kind_name in TYPED_COLUMNS:
        values, ok = typed[column]
        if kind_name == "str":
            out[column] = values
        else:
            out[column], out[f"{column}__ok"] = values, ok
    return out


def _text_field(buf: np.ndarray, fields: wire.Fields, n: int, number: int) -> list[str] | None:
    """A string field per message ('' when absent), or None when one occurs twice."""
    msg, start, length = fields.select(number, 2)
    if not _once(msg, n):
        return None
    out = [""] * n
    if len(msg):
        for i, s in zip(msg.tolist(), wire.strings(buf, start.astype(np.int64), length), strict=True):
            out[i] = s
    return out


def _stats(
    buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, stat_names: dict[int, str]
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray] | None:
    """Every stat: (name code, names by code, value field number, raw 64-bit value, text of
    string and ref values); None for a stat with no value, two values, two ids or bytes."""
    m = len(starts)
    fields = wire.decode_fields(buf, starts, starts + lengths)
    id_msg, id_value, _ = fields.select(1, 0)
    if not _once(id_msg, m):
        return None
    mids = np.zeros(m, dtype=np.uint64)
    mids[id_msg] = id_value
    kind = np.zeros(m, dtype=np.int8)
    number = np.zeros(m, dtype=np.uint64)
    seen = np.zeros(m, dtype=np.int64)
    text = np.full(m, None, dtype=object)
    for field_number, wire_type in _VALUE_WIRE.items():
        msg, value, length = fields.select(field_number, wire_type)
        if not len(msg):
            continue
        if field_number == _BYTES:
            return None
        np.add.at(seen, msg, 1)
        kind[msg] = field_number
        number[msg] = value
        if field_number == _STR:
            text[msg] = wire.strings(buf, value.astype(np.int64), length)
    if m and (seen != 1).any():
        return None
    refs = np.flatnonzero(kind == _REF)
    if len(refs):
        uniq, inverse = np.unique(number[refs], return_inverse=True)
        labels = [stat_names.get(r) for r in uniq.tolist()]
        labels = [f"ref#{r}" if name is None else name for r, name in zip(uniq.tolist(), labels, strict=True)]
        text[refs] = text_column(labels)[inverse.reshape(-1)]
    uniq, inverse = np.unique(mids.view(np.int64), return_inverse=True)
    names = [stat_names.get(mid) for mid in uniq.tolist()]
    names = [f"stat#{mid}" if name is None else name for mid, name in zip(uniq.tolist(), names, strict=True)]
    distinct = list(dict.fromkeys(names))  # two ids may carry one name: one key of the dict
    code_of = {name: i for i, name in enumerate(distinct)}
    codes = np.array([code_of[name] for name in names], dtype=np.int64)[inverse.reshape(-1)]
    return codes, distinct, kind, number, text


def _typed(
    n: int,
    owner: np.ndarray,
    key_code: np.ndarray,
    key_text: list[str],
    kind: np.ndarray,
    number: np.ndarray,
    text: np.ndarray,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray] | None:
    """Typed columns (values, present) and the mask of stats left for the JSON; None where a
    cast would be needed that only ``staging.typed_value`` does exactly."""
    typed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for column, kind_name in TYPED_COLUMNS:
        if kind_name == "str":
            typed[column] = (np.full(n, None, dtype=object), np.zeros(n, dtype=bool))
        else:
            dtype = {"double": np.float64, "uint": np.uint64, "int": np.int64}[kind_name]
            typed[column] = (np.zeros(n, dtype=dtype), np.zeros(n, dtype=bool))
    in_json = np.ones(len(owner), dtype=bool)
    target_of_code = [TYPED_STATS.get(name) for name in key_text]
    rows_by_column: dict[str, list[np.ndarray]] = {}
    for code, target in enumerate(target_of_code):
        if target is not None:
            rows_by_column.setdefault(target[0], []).append(np.flatnonzero(key_code == code))
    for column, parts in rows_by_column.items():
        rows = np.sort(np.concatenate(parts))  # wire order = the dict's order (names are unique)
        if not len(rows):
            continue
        kind_name = TYPED_STATS_KIND[column]
        k = kind[rows]
        values: np.ndarray
        if kind_name == "str":
            if (k == _DOUBLE).any():
                return None  # str(float): left to typed_value
            values = text[rows].copy()
            ints = np.flatnonzero((k == _INT) | (k == _UINT))
            if len(ints):
                raw = number[rows[ints]]
                values[ints] = [str(v) for v in _python_ints(raw, k[ints])]
            fits = np.ones(len(rows), dtype=bool)
        else:
            if ((k == _STR) | (k == _REF)).any():
                return None  # float("...") / int("..."): left to typed_value
            raw = number[rows]
            if kind_name == "double":
                values = np.where(k == _DOUBLE, raw.view(np.float64),
                                  np.where(k == _INT, raw.view(np.int64).astype(np.float64),
                                           raw.astype(np.float64)))
                fits = np.ones(len(rows), dtype=bool)
            elif kind_name == "uint":
                if (k == _DOUBLE).any():
                    return None  # int(float) truncation and its range: left to typed_value
                values = raw.copy()  # an int64 is stored as its two's complement, as typed_value masks it
                fits = np.ones(len(rows), dtype=bool)
            else:
                if (k == _DOUBLE).any():
                    return None
                values = raw.view(np.int64).copy()
                fits = (k == _INT) | (raw < _TWO63)  # a uint64 past int64 does not fit
        full, ok = typed[column]
        # the first fitting stat of each entry feeds the column; every other one goes to the JSON
        candidates = np.flatnonzero(fits)
        if len(candidates):
            first = candidates[np.unique(owner[rows[candidates]], return_index=True)[1]]
            full[owner[rows[first]]] = values[first]
            ok[owner[rows[first]]] = True
            in_json[rows[first]] = False
    return typed, in_json


TYPED_STATS_KIND = dict(TYPED_COLUMNS)


def _python_ints(raw: np.ndarray, kind: np.ndarray) -> list[int]:
    """Raw 64-bit values as the Python ints upb gives (int64 signed, uint64 and ref unsigned)."""
    signed = raw.view(np.int64).tolist()
    unsigned = raw.tolist()
    return [s if k == _INT else u for s, u, k in zip(signed, unsigned, kind.tolist(), strict=True)]


def _module_names(
    typed: dict[str, tuple[np.ndarray, np.ndarray]],
    keys: list[int],
    names: list[str],
    owner: np.ndarray,
    key_code: np.ndarray,
    key_text: list[str],
    kind: np.ndarray,
    number: np.ndarray,
    module_ids: set[int],
    module_program: re.Pattern[str],
) -> None:
    """``hlo_module`` of the XLA modules (their name) and of the ops whose ``program_id`` names a
    module (``name(program_id)``), where no ``hlo_module`` stat says otherwise (xspace._metadata)."""
    hlo_module, present = typed["hlo_module"]
    has_stat = np.zeros(len(keys), dtype=bool)
    if "hlo_module" in key_text:
        has_stat[owner[key_code == key_text.index("hlo_module")]] = True
    by_program: dict[int, str] = {}
    is_module = np.zeros(len(keys), dtype=bool)
    for i, key in enumerate(keys):
        if key in module_ids:
            is_module[i] = True
            if not has_stat[i]:
                hlo_module[i], present[i] = names[i], True
            match = module_program.search(names[i])
            if match:
                by_program[int(match.group(1))] = names[i]
    if not by_program or "program_id" not in key_text:
        return
    rows = np.flatnonzero((key_code == key_text.index("program_id")) & ((kind == _INT) | (kind == _UINT)))
    rows = rows[~has_stat[owner[rows]] & ~is_module[owner[rows]]]
    for i, value in zip(owner[rows].tolist(), _python_ints(number[rows], kind[rows]), strict=True):
        module = by_program.get(value & _MASK64)
        if module:
            hlo_module[i], present[i] = module, True


def _json(
    n: int,
    owner: np.ndarray,
    key_code: np.ndarray,
    key_text: list[str],
    kind: np.ndarray,
    number: np.ndarray,
    text: np.ndarray,
) -> np.ndarray:
    """Each entry's other stats as ``json.dumps`` writes the dict of ``json_safe`` values
    (None where there are none)."""
    out = np.full(n, None, dtype=object)
    if not len(owner):
        return out
    values = np.empty(len(owner), dtype=object)
    ints = np.flatnonzero((kind == _INT) | (kind == _UINT))
    if len(ints):
        values[ints] = [str(v) for v in _python_ints(number[ints], kind[ints])]
    doubles = np.flatnonzero(kind == _DOUBLE)
    if len(doubles):
        values[doubles] = [_json_float(v) for v in number[doubles].view(np.float64).tolist()]
    texts = np.flatnonzero((kind == _STR) | (kind == _REF))
    if len(texts):
        values[texts] = [encode_basestring_ascii(s) for s in text[texts].tolist()]
    keys = np.array([encode_basestring_ascii(k) + ": " for k in key_text], dtype=object)
    pieces = (keys[key_code] + values).tolist()
    bounds = np.flatnonzero(np.diff(owner)) + 1
    starts = [0, *bounds.tolist()]
    stops = [*bounds.tolist(), len(owner)]
    for entry, a, b in zip(owner[starts].tolist(), starts, stops, strict=True):
        out[entry] = "{" + ", ".join(pieces[a:b]) + "}"
    return out


def _json_float(value: float) -> str:
    """A double stat in the JSON: its repr, or (NaN, infinities) its repr as a string (json_safe)."""
    text = float.__repr__(value)
    if value != value or value in (float("inf"), float("-inf")):
        return encode_basestring_ascii(text)
    return text


def key_order(message: Any) -> list[int]:
    """The map's keys in upb's iteration order (the order the upb reading yields rows in)."""
    return list(message.event_metadata.keys())
