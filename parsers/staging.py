"""The columnar shape every trace reader hands to the loader: one Arrow batch per plane (chunk).

Readers (XSpace, Chrome-trace JSON) stream ``PlaneData`` per plane, so memory stays bounded by a
chunk of events rather than the whole file. Everything per event is built with vectorised numpy /
Arrow operations: names come from the plane's event metadata through dictionary arrays (one string
per distinct name, not per event), typed stat columns are metadata values overridden by event
values, and the event's own remaining stats become a JSON object assembled by Arrow string kernels.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Stats that become typed columns of ``events`` / ``event_metadata`` (contract, docs/schema.md):
# stat name in the trace -> (column, value kind). Everything else stays in the ``stats`` JSON.
TYPED_STATS: dict[str, tuple[str, str]] = {
    "hlo_category": ("hlo_category", "str"),
    "hlo_module": ("hlo_module", "str"),
    "program_id": ("program_id", "uint"),
    "flops": ("flops", "double"),
    "bytes_accessed": ("bytes_accessed", "double"),
    "tf_op": ("tf_op", "str"),
    "shape_with_layout": ("shape", "str"),
    "source": ("source", "str"),
    "step_num": ("step_num", "int"),
    "iter_num": ("step_num", "int"),
    "group_id": ("group_id", "int"),
    "correlation_id": ("correlation_id", "int"),
}

TYPED_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("hlo_category", pa.string()),
    ("hlo_module", pa.string()),
    ("program_id", pa.uint64()),
    ("flops", pa.float64()),
    ("bytes_accessed", pa.float64()),
    ("tf_op", pa.string()),
    ("shape", pa.string()),
    ("source", pa.string()),
    ("step_num", pa.int64()),
    ("group_id", pa.int64()),
    ("correlation_id", pa.int64()),
]
_TYPED_TYPES = dict(TYPED_COLUMNS)
_NUMPY_OF = {"uint": np.uint64, "double": np.float64, "int": np.int64}

LINE_SCHEMA = pa.schema(
    [
        ("line_index", pa.int32()),
        ("line_id", pa.int64()),
        ("display_id", pa.int64()),
        ("name", pa.string()),
        ("display_name", pa.string()),
        ("timestamp_ns", pa.int64()),
        ("duration_ps", pa.int64()),
        ("num_events", pa.int64()),
    ]
)

META_SCHEMA = pa.schema(
    [("metadata_id", pa.int64()), ("name", pa.string()), ("display_name", pa.string())]
    + TYPED_COLUMNS
    + [("stats", pa.string())]
)

# Event batch columns (the ``event_rows`` storage: names and metadata values are not repeated per
# event; the ``events`` view joins them from ``event_metadata``).
EVENT_COLUMNS = [
    "line_index",
    "metadata_id",
    "start_ps",
    "duration_ps",
    "num_occurrences",
    *[c for c, _ in TYPED_COLUMNS],
    "stats",
]

# Events per Arrow batch: bounds the decoder's temporaries (with one streamed INSERT per plane the
# per-batch cost is small; 16K vs 64K: peak RSS -35 MB on a 2M-event XSpace, same speed).
CHUNK_EVENTS = 16_384


@dataclass
class PlaneInfo:
    """One plane's row of ``planes`` (without run_id/host)."""

    plane_index: int
    plane_id: int | None
    name: str
    kind: str
    device_ordinal: int | None
    device_type: str | None
    peak_tflops: float | None
    peak_hbm_bw_gbps: float | None
    num_lines: int
    num_events: int
    stats: str | None


@dataclass
class PlaneData:
    """A plane: its row, its lines, its event metadata and a stream of event batches."""

    info: PlaneInfo
    lines: pa.Table
    metadata: pa.Table
    batches: Iterator[pa.Table]


class HostReader(Protocol):
    """What the loader needs from any reader of one host file."""

    host: str
    file_path: str
    file_bytes: int
    source_format: str
    t0_ns: int | None
    num_events: int
    hostnames: list[str]
    errors: list[str]
    warnings: list[str]
    metadata: dict[str, Any]

    def planes(self) -> Iterator[PlaneData]: ...


@dataclass
class StatLong:
    """Event stats as a long table (one row per stat) for one batch of events.

    ``owner`` is the event's index within the batch; exactly one of the value columns is set per
    row (``s``: string, ref target name or base64 of bytes; ``j``: value already JSON text).
    """

    owner: np.ndarray
    keys: pa.Array
    i64: pa.Array
    u64: pa.Array
    f64: pa.Array
    s: pa.Array
    j: pa.Array | None = None


_DEVICE_RE = re.compile(r"^/device:([A-Za-z_]+):(\d+)$")


def classify_plane(name: str) -> tuple[str, int | None]:
    """Plane kind ('tpu' | 'gpu' | 'cpu_host' | 'metadata' | 'other') and device ordinal from its name."""
    match = _DEVICE_RE.match(name)
    if match:
        device, ordinal = match.group(1).upper(), int(match.group(2))
        if device == "TPU":
            return "tpu", ordinal
        if device == "GPU":
            return "gpu", ordinal
        return "other", ordinal
    if name.startswith("/host:CPU"):
        return "cpu_host", None
    if name == "/host:metadata":
        return "metadata", None
    return "other", None


def json_safe(value: Any) -> Any:
    """A stat value as a JSON-encodable Python value (bytes -> base64 text, non-finite floats -> text)."""
    if isinstance(value, bytes):
        import base64

        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def typed_value(kind: str, value: Any) -> Any:
    """Coerce a stat value to its typed column's kind, or None when it does not fit."""
    try:
        if kind == "str":
            return value if isinstance(value, str) else str(value)
        if kind == "double":
            return float(value)
        if kind == "uint":
            v = int(value)
            return v & 0xFFFFFFFFFFFFFFFF if -(1 << 63) <= v < (1 << 64) else None
        if kind == "int":
            v = int(value)
            return v if -(1 << 63) <= v < (1 << 63) else None
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def metadata_table(rows: list[tuple[int, str, str | None, dict[str, Any]]]) -> pa.Table:
    """Event-metadata rows (id, name, display name, {stat: value}) -> META_SCHEMA table.

    Typed stats go to their columns (first occurrence wins), the rest to ``stats`` JSON.
    """
    columns: dict[str, list[Any]] = {f.name: [] for f in META_SCHEMA}
    for md_id, name, display_name, stats in rows:
        typed: dict[str, Any] = {}
        other: dict[str, Any] = {}
        for key, value in stats.items():
            target = TYPED_STATS.get(key)
            coerced = typed_value(target[1], value) if target else None
            if target and coerced is not None and target[0] not in typed:
                typed[target[0]] = coerced
            else:
                other[key] = json_safe(value)
        columns["metadata_id"].append(md_id)
        columns["name"].append(name)
        columns["display_name"].append(display_name or None)
        columns["stats"].append(json.dumps(other) if other else None)
        for column, _ in TYPED_COLUMNS:
            columns[column].append(typed.get(column))
    return pa.Table.from_pydict(columns, schema=META_SCHEMA)


def _dict_array(indices: np.ndarray, dictionary: pa.Array) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32, copy=False)), dictionary)


def _json_string_values(values: pa.Array) -> pa.Array:
    """JSON string literals for an Arrow string array (vectorised escaping; rare odd rows in Python)."""
    escaped = values
    for old, new in (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
        escaped = pc.replace_substring(escaped, old, new)
    odd = pc.match_substring_regex(values, r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
    quoted = pc.binary_join_element_wise('"', escaped, '"', "")
    if pc.any(odd).as_py():
        fixed = [
            json.dumps(v) if o else q
            for v, o, q in zip(values.to_pylist(), odd.to_pylist(), quoted.to_pylist(), strict=True)
        ]
        quoted = pa.array(fixed, pa.string())
    return quoted


def _stats_json(
    stats: StatLong, key_codes: np.ndarray, key_names: list[str], keep: np.ndarray, n: int
) -> pa.Array:
    """Per-event JSON object text of the kept stat rows (null for events without any)."""
    rows = np.flatnonzero(keep)
    if not len(rows):
        return pa.nulls(n, pa.string())
    key_json = _dict_array(key_codes[rows], pa.array([json.dumps(k) + ":" for k in key_names], pa.string()))
    parts = [
        pc.cast(stats.i64.take(pa.array(rows)), pa.string()),
        pc.cast(stats.u64.take(pa.array(rows)), pa.string()),
        pc.cast(stats.f64.take(pa.array(rows)), pa.string()),
    ]
    s = stats.s.take(pa.array(rows))
    if s.null_count < len(s):
        parts.append(_json_string_values(s))
    if stats.j is not None:
        parts.append(stats.j.take(pa.array(rows)))
    value_json = pc.coalesce(*parts)
    value_json = pc.fill_null(value_json, "null")
    fragments = pc.binary_join_element_wise(key_json.cast(pa.string()), value_json, "")
    owners = stats.owner[rows]
    order = np.argsort(owners, kind="stable")
    counts = np.bincount(owners, minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    grouped = pa.ListArray.from_arrays(pa.array(offsets), fragments.take(pa.array(order)))
    joined = pc.binary_join(grouped, ",")
    wrapped = pc.binary_join_element_wise("{", joined, "}", "")
    return pc.if_else(pa.array(counts > 0), wrapped, pa.nulls(n, pa.string()))


def _typed_from_stats(stats: StatLong, key_codes: np.ndarray, names: list[str], n: int) -> dict[str, Any]:
    """Event-level typed values per column.

    String columns: (event rows, Arrow strings); numeric columns: (present mask, numpy values).
    When two stat names feed one column (step_num, iter_num) the first listed wins.
    """
    found: dict[str, Any] = {}
    for stat, (column, kind) in TYPED_STATS.items():
        if stat not in names:
            continue
        rows = pa.array(np.flatnonzero(key_codes == names.index(stat)))
        if not len(rows):
            continue
        owners = stats.owner[rows.to_numpy()]
        pa_type = _TYPED_TYPES[column]
        if kind == "str":
            values = pc.coalesce(
                stats.s.take(rows),
                pc.cast(stats.i64.take(rows), pa.string()),
                pc.cast(stats.u64.take(rows), pa.string()),
            )
        else:
            values = pc.coalesce(
                pc.cast(stats.f64.take(rows), pa_type, safe=False),
                pc.cast(stats.i64.take(rows), pa_type, safe=False),
                pc.cast(stats.u64.take(rows), pa_type, safe=False),
            )
        ok = np.asarray(pc.is_valid(values).to_numpy(zero_copy_only=False), dtype=bool)
        owners, values = owners[ok], values.filter(pa.array(ok))
        if kind == "str":
            if column not in found:
                found[column] = (owners, values)
            continue
        present, full = found.get(column, (np.zeros(n, dtype=bool), np.zeros(n, dtype=_NUMPY_OF[kind])))
        fresh = ~present[owners]
        full[owners[fresh]] = values.to_numpy(zero_copy_only=False)[fresh]
        present[owners[fresh]] = True
        found[column] = (present, full)
    return found


def event_batch(
    line_index: np.ndarray,
    line_names: list[str],
    metadata_ids: np.ndarray,
    metadata: pa.Table,
    start_ps: np.ndarray,
    duration_ps: np.ndarray,
    num_occurrences: pa.Array,
    stats: StatLong | None,
) -> pa.Table:
    """Assemble one batch of event rows (column order ``EVENT_COLUMNS``), vectorised throughout.

    Typed columns hold the event's own stat values only (NULL where the event has none: the
    ``events`` view then takes its metadata's); the event's other stats become JSON text.
    ``line_names`` and ``metadata`` are accepted for readers' convenience (names are resolved by
    the view), so every reader keeps one call shape.
    """
    del line_names, metadata
    n = len(metadata_ids)
    event_typed: dict[str, Any] = {}
    stats_json = pa.nulls(n, pa.string())
    if stats is not None and len(stats.owner):
        key_values = stats.keys
        if not pa.types.is_dictionary(key_values.type):
            key_values = key_values.dictionary_encode()
        key_names = [str(k) for k in key_values.dictionary.to_pylist()]
        key_codes = key_values.indices.to_numpy(zero_copy_only=False)
        event_typed = _typed_from_stats(stats, key_codes, key_names, n)
        typed_codes = [i for i, k in enumerate(key_names) if k in TYPED_STATS]
        keep = ~np.isin(key_codes, typed_codes)
        stats_json = _stats_json(stats, key_codes, key_names, keep, n)

    columns: dict[str, Any] = {
        "line_index": pa.array(line_index.astype(np.int32, copy=False)),
        "metadata_id": pa.array(metadata_ids.astype(np.int64, copy=False)),
        "start_ps": pa.array(start_ps.astype(np.int64, copy=False)),
        "duration_ps": pa.array(duration_ps.astype(np.int64, copy=False)),
        "num_occurrences": num_occurrences,
    }
    for column, pa_type in TYPED_COLUMNS:
        override = event_typed.get(column)
        if override is None:
            columns[column] = pa.nulls(n, pa_type)
        elif pa.types.is_string(pa_type):
            owners, values = override
            index = np.full(n, -1, dtype=np.int64)
            index[owners] = np.arange(len(owners))
            columns[column] = values.take(pa.array(index, mask=index < 0))
        else:
            present, values = override
            columns[column] = pa.array(values, pa_type, mask=~present)
    columns["stats"] = stats_json
    return pa.table({name: columns[name] for name in EVENT_COLUMNS})


@dataclass
class HostSummary:
    """Counts a reader reports after streaming (for runs/hosts rows)."""

    planes: int = 0
    events: int = 0
    devices: int = 0
    device_type: str | None = None
    kinds: set[str] = field(default_factory=set)
