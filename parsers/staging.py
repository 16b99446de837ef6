"""The columnar shape every trace reader produces for one host file, before it reaches DuckDB.

Readers (XSpace, Chrome-trace JSON) emit the same five Arrow tables per host, so one loader turns any
of them into the public relations (``store/schema.sql``). Event stats travel as a *long* table (one
row per stat) rather than per-event dicts or JSON strings: building that is a handful of list
comprehensions in Python, and DuckDB pivots it into typed columns and the ``stats`` JSON in C++.
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

# Stats that become typed columns of ``events`` (public contract, docs/schema.md). Each maps the stat
# name in the trace to (column, value kind). Anything else stays in the ``stats`` JSON column.
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

# Column order of the typed stat columns (shared by the metadata table and the events relation).
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

PLANE_SCHEMA = pa.schema(
    [
        ("plane_index", pa.int32()),
        ("plane_id", pa.int64()),
        ("name", pa.string()),
        ("kind", pa.string()),
        ("device_ordinal", pa.int32()),
        ("device_type", pa.string()),
        ("peak_tflops", pa.float64()),
        ("peak_hbm_bw_gbps", pa.float64()),
        ("num_lines", pa.int32()),
        ("num_events", pa.int64()),
        ("stats", pa.string()),
    ]
)

LINE_SCHEMA = pa.schema(
    [
        ("plane_index", pa.int32()),
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

EVENT_SCHEMA = pa.schema(
    [
        ("ev_row", pa.int64()),
        ("plane_index", pa.int32()),
        ("line_index", pa.int32()),
        ("md_id", pa.int64()),
        ("start_ps", pa.int64()),
        ("duration_ps", pa.int64()),
        ("num_occurrences", pa.int64()),
    ]
)

STAT_SCHEMA = pa.schema(
    [
        ("ev_row", pa.int64()),
        ("key", pa.string()),
        ("i64", pa.int64()),
        ("u64", pa.uint64()),
        ("f64", pa.float64()),
        ("s", pa.string()),  # str values, ref targets (stat-metadata names), base64 of bytes
        ("j", pa.string()),  # a value that is already JSON text (lists, objects, booleans from JSON)
    ]
)

META_SCHEMA = pa.schema(
    [("plane_index", pa.int32()), ("md_id", pa.int64()), ("name", pa.string()), ("display_name", pa.string())]
    + TYPED_COLUMNS
    + [("stats", pa.string())]
)


@dataclass
class HostTables:
    """One host file, read: Arrow tables keyed by (plane_index, line_index, ev_row) local to the file.

    ``events.start_ps`` is relative to ``t0_ns`` (this host's earliest line/event time); the loader
    shifts it to the run's common time zero.
    """

    host: str
    file_path: str
    file_bytes: int
    source_format: str
    t0_ns: int | None
    planes: pa.Table
    lines: pa.Table
    events: pa.Table
    stats: pa.Table
    meta: pa.Table
    hostnames: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_events(self) -> int:
        return self.events.num_rows


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


def empty_stats_table() -> pa.Table:
    return STAT_SCHEMA.empty_table()


class StatColumns:
    """Accumulates the long stats table: appends already-split per-kind value columns cheaply."""

    def __init__(self) -> None:
        self._chunks: list[pa.Table] = []

    def add(
        self,
        ev_rows: np.ndarray,
        keys: pa.Array,
        i64: pa.Array,
        u64: pa.Array,
        f64: pa.Array,
        s: pa.Array,
        j: pa.Array | None = None,
    ) -> None:
        if len(ev_rows) == 0:
            return
        if j is None:
            j = pa.nulls(len(ev_rows), pa.string())
        self._chunks.append(
            pa.Table.from_arrays(
                [pa.array(ev_rows, pa.int64()), keys, i64, u64, f64, s, j], schema=STAT_SCHEMA
            )
        )

    def table(self) -> pa.Table:
        if not self._chunks:
            return empty_stats_table()
        return pa.concat_tables(self._chunks).combine_chunks()
