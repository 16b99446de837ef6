"""The columnar shape every trace reader hands to the loader: numpy columns, one plane at a time.

Readers (XSpace, Chrome-trace JSON) stream ``PlaneData`` per plane, so memory stays bounded by a
chunk of events rather than the whole file. Everything per event is a numpy array: names stay
event-metadata ids (the ``events`` view joins them), and an event's own stats travel as a long
table (``StatLong``) that the loader turns into typed columns and JSON inside DuckDB.

Why numpy and not Arrow: DuckDB scans numpy arrays directly, and the ingest path then never
imports pyarrow (~35 MB of peak memory on a 38 MB file, a quarter of the budget); see
benchmarks/results/ingest_memory.md.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

# Stats that become typed columns of ``events`` / ``event_metadata`` (contract, docs/schema.md):
# stat name in the trace -> (column, value kind). Everything else stays in the ``stats`` JSON.
# Where two stat names feed one column (step_num, iter_num) the first listed wins.
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

# Typed columns and their value kind ('str' | 'uint' | 'double' | 'int'), in table order.
TYPED_COLUMNS: list[tuple[str, str]] = [
    ("hlo_category", "str"),
    ("hlo_module", "str"),
    ("program_id", "uint"),
    ("flops", "double"),
    ("bytes_accessed", "double"),
    ("tf_op", "str"),
    ("shape", "str"),
    ("source", "str"),
    ("step_num", "int"),
    ("group_id", "int"),
    ("correlation_id", "int"),
]
_NUMPY_OF = {"uint": np.uint64, "double": np.float64, "int": np.int64}

# A table handed to the loader: column name -> numpy array. Strings are object arrays (str or
# None); a nullable number is two columns, ``<name>`` (values) and ``<name>__ok`` (present mask),
# because DuckDB infers object arrays of Python ints by sampling (and fails past the sample).
Columns = dict[str, np.ndarray]

LINE_COLUMNS = [
    "line_index",
    "line_id",
    "display_id",
    "name",
    "display_name",
    "timestamp_ns",
    "duration_ps",
    "num_events",
]
META_COLUMNS = ["metadata_id", "name", "display_name", *[c for c, _ in TYPED_COLUMNS], "stats"]

# Events per batch: bounds the decoder's temporaries and DuckDB's per-statement buffers
# (2M-event XSpace: 16K vs 64K peak RSS -35 MB; 8K vs 16K -3 MB but 10% slower: DuckDB's
# per-statement cost is the bottleneck of the load).
CHUNK_EVENTS = 16_384

# Time policy (docs/input.md). Event times are stored as int64 picoseconds relative to the run's t0,
# which overflows past ~106 days. A host's events must lie within MAX_SPAN_NS of the host's time
# zero (Chrome JSON: of the median of its event times), durations must be finite, non-negative and
# at most MAX_SPAN_NS, and the hosts of a run must start within MAX_SPAN_NS of each other.
# Anything else (one event 100 days away, ts 0 among epoch times) refuses the file: stored, it
# would shift or overflow every other start. Starts (< 2 spans), durations and host shifts then
# add up to < 4 spans = 28 days: never near int64.
MAX_SPAN_NS = 7 * 86_400 * 1_000_000_000
MAX_SPAN_PS = MAX_SPAN_NS * 1000


def first_bad_time(start_ps: np.ndarray, duration_ps: np.ndarray) -> tuple[int, str] | None:
    """(index, what is wrong) of the first event whose start/duration (int64 ps relative to the
    host's t0) breaks the time policy, or None. Vectorised: one pass of comparisons per batch."""
    bad_start = (start_ps < 0) | (start_ps > 2 * MAX_SPAN_PS)
    bad_duration = (duration_ps < 0) | (duration_ps > MAX_SPAN_PS)
    bad = bad_start | bad_duration
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    if bad_duration[i]:
        what = "negative duration" if duration_ps[i] < 0 else "duration longer than 7 days"
        return i, f"{what} ({int(duration_ps[i])} ps)"
    when = "before" if start_ps[i] < 0 else "more than 14 days after"
    return i, f"starts {when} the host's first line ({int(start_ps[i])} ps from it)"


# Structure bounds (docs/input.md): real captures have tens of planes and thousands of lines; a
# file with more is refused before its planes are read (200k empty planes cost 80 s otherwise).
MAX_PLANES = 16_384
MAX_LINES = 1_000_000

# Value kinds of a stat row (StatLong.kind).
STAT_NULL, STAT_INT, STAT_UINT, STAT_DOUBLE, STAT_TEXT, STAT_JSON = 0, 1, 2, 3, 4, 5


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


# Stat names this process has read, numbered: a reader gives each stat row its name's number
# (``StatLong.key_code``), so the loader finds a batch's distinct names among integers instead of
# hashing every row's string (``stat_key_names``; hashing was ~3% of a pod host's map CPU).
# Bounded: past ``MAX_STAT_KEYS`` names (hostile input) a reader gives no numbers and the loader hashes.
STAT_KEY_NAMES: list[str] = []
_STAT_KEY_CODES: dict[str, int] = {}
_STAT_KEY_LOCK = threading.Lock()  # (a Dask worker reads hosts in threads)
MAX_STAT_KEYS = 1 << 16


def distinct_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct ids ascending, each id's index into them): through a table of the ids where they
    are small and not negative (stat metadata ids, stat name numbers), else a sort."""
    if len(ids) and 0 <= int(ids.min()) and int(ids.max()) < DISTINCT_BY_TABLE:
        present = np.zeros(int(ids.max()) + 1, bool)
        present[ids] = True
        return np.flatnonzero(present), (np.cumsum(present) - 1)[ids]
    uniq, inverse = np.unique(ids, return_inverse=True)
    return uniq, inverse.reshape(-1)


DISTINCT_BY_TABLE = 1 << 16  # ids below this are found through a presence table (distinct_ids)


def stat_key_names(codes: np.ndarray) -> tuple[list[str], np.ndarray] | None:
    """(the distinct names of stat rows numbered ``codes``, each row's index into them), or None if
    some row has no number (-1: ``StatLong.columns``)."""
    if len(codes) and int(codes.min()) < 0:
        return None
    used, index = distinct_ids(codes)
    return [STAT_KEY_NAMES[code] for code in used.tolist()], index.astype(np.int64)


def stat_key_codes(names: list[str]) -> np.ndarray | None:
    """The numbers of ``names`` in ``STAT_KEY_NAMES`` (new names numbered), or None once it is full."""
    codes = np.empty(len(names), dtype=np.int32)
    with _STAT_KEY_LOCK:
        for i, name in enumerate(names):
            code = _STAT_KEY_CODES.get(name)
            if code is None:
                if len(STAT_KEY_NAMES) >= MAX_STAT_KEYS:
                    return None
                code = _STAT_KEY_CODES[name] = len(STAT_KEY_NAMES)
                STAT_KEY_NAMES.append(name)
            codes[i] = code
    return codes


@dataclass
class StatLong:
    """Event stats of one batch as a long table: one row per stat, in the trace's order.

    ``owner``: the event's index within the batch; ``key``: stat name (object array); ``kind``:
    which value column holds the value (``STAT_*``); ``text`` holds strings (also ref targets,
    base64 of bytes, non-finite floats) and, for ``STAT_JSON``, values already written as JSON.
    ``key_code``: each row's name as its number in ``STAT_KEY_NAMES``, where the reader gives them
    (the ``key_code`` column is -1 where it does not).
    """

    owner: np.ndarray
    key: np.ndarray
    kind: np.ndarray
    i64: np.ndarray
    u64: np.ndarray
    f64: np.ndarray
    text: np.ndarray
    key_code: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.owner)

    def columns(self) -> Columns:
        return {
            "owner": self.owner.astype(np.int64, copy=False),
            "seq": np.arange(len(self.owner), dtype=np.int64),
            "key": self.key,
            "key_code": np.full(len(self.owner), -1, np.int32) if self.key_code is None else self.key_code,
            "kind": self.kind.astype(np.int8, copy=False),
            "i64": self.i64.astype(np.int64, copy=False),
            "u64": self.u64.astype(np.uint64, copy=False),
            "f64": self.f64.astype(np.float64, copy=False),
            "text": self.text,
        }


@dataclass
class EventBatch:
    """A batch of one plane's events: the ``event_rows`` numbers plus the events' own stats."""

    line_index: np.ndarray
    metadata_id: np.ndarray
    start_ps: np.ndarray
    duration_ps: np.ndarray
    num_occurrences: np.ndarray | None = None
    has_occurrences: np.ndarray | None = None
    stats: StatLong | None = None

    @property
    def num_rows(self) -> int:
        return len(self.metadata_id)

    def columns(self) -> Columns:
        n = self.num_rows
        occ = self.num_occurrences
        ok = self.has_occurrences
        return {
            "row": np.arange(n, dtype=np.int64),
            "line_index": self.line_index.astype(np.int32, copy=False),
            "metadata_id": self.metadata_id.astype(np.int64, copy=False),
            "start_ps": self.start_ps.astype(np.int64, copy=False),
            "duration_ps": self.duration_ps.astype(np.int64, copy=False),
            "num_occurrences": np.zeros(n, np.int64) if occ is None else occ.astype(np.int64, copy=False),
            "num_occurrences__ok": np.zeros(n, bool) if ok is None else ok.astype(bool, copy=False),
        }


@dataclass
class PlaneData:
    """A plane: its row, its lines, its event metadata and a stream of event batches."""

    info: PlaneInfo
    lines: Columns
    metadata: Columns
    batches: Iterator[EventBatch]


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


def text_column(values: list[Any]) -> np.ndarray:
    """Object array of str / None (what DuckDB reads as VARCHAR)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def nullable_columns(name: str, values: list[Any], kind: str) -> Columns:
    """``<name>`` values and ``<name>__ok`` mask of a nullable numeric column ('int'|'uint'|'double')."""
    ok = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    dtype = _NUMPY_OF[kind]
    filled = [v if v is not None else 0 for v in values]
    return {name: np.array(filled, dtype=dtype), f"{name}__ok": ok}


def lines_columns(lines: dict[str, list[Any]]) -> Columns:
    """A plane's lines (``LINE_COLUMNS`` lists, ints may be None) -> loader columns."""
    if not lines["name"]:
        return dict(_EMPTY_LINES)  # many planes have no lines: no arrays built for them
    columns: Columns = {
        "name": text_column(lines["name"]),
        "display_name": text_column(lines["display_name"]),
    }
    for name in ("line_index", "line_id", "display_id", "timestamp_ns", "duration_ps", "num_events"):
        columns.update(nullable_columns(name, lines[name], "int"))
    return columns


def empty_lines() -> dict[str, list[Any]]:
    return {name: [] for name in LINE_COLUMNS}


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


def metadata_table(rows: list[tuple[int, str, str | None, dict[str, Any]]]) -> Columns:
    """Event-metadata rows (id, name, display name, {stat: value}) -> loader columns.

    Typed stats go to their columns (first occurrence wins), the rest to ``stats`` JSON.
    """
    if not rows:
        return dict(_EMPTY_METADATA)  # planes without event metadata: no arrays built for them
    return _build_metadata(rows)


# Typed stat name -> (index in TYPED_COLUMNS, value kind).
_TYPED_TARGET = {
    stat: ([c for c, _ in TYPED_COLUMNS].index(column), kind) for stat, (column, kind) in TYPED_STATS.items()
}


def _build_metadata(rows: list[tuple[int, str, str | None, dict[str, Any]]]) -> Columns:
    # One pass per row, typed values in a list per row transposed at the end: metadata rows are
    # ~1 per 8 events in many-host runs, so this loop is a per-event cost there.
    targets = _TYPED_TARGET
    width = len(TYPED_COLUMNS)
    ids: list[int] = []
    names: list[Any] = []
    displays: list[Any] = []
    jsons: list[Any] = []
    typed_rows: list[list[Any]] = []
    for md_id, name, display_name, stats in rows:
        typed: list[Any] = [None] * width
        other: dict[str, Any] | None = None
        for key, value in stats.items():
            target = targets.get(key)
            if target is not None and typed[target[0]] is None:
                coerced = typed_value(target[1], value)
                if coerced is not None:
                    typed[target[0]] = coerced
                    continue
            if other is None:
                other = {}
            other[key] = json_safe(value)
        ids.append(md_id)
        names.append(name)
        displays.append(display_name or None)
        jsons.append(json.dumps(other) if other else None)
        typed_rows.append(typed)
    by_column = [list(v) for v in zip(*typed_rows, strict=True)] if typed_rows else [[] for _ in range(width)]
    columns: Columns = {"metadata_id": np.array(ids, dtype=np.int64)}
    for column, values in (("name", names), ("display_name", displays), ("stats", jsons)):
        columns[column] = text_column(values)
    for (column, kind), values in zip(TYPED_COLUMNS, by_column, strict=True):
        if kind == "str":
            columns[column] = text_column(values)
        else:
            columns.update(nullable_columns(column, values, kind))
    return columns


# Shared (never written) columns of a plane without lines / event metadata.
_EMPTY_LINES: Columns = {
    name: values[:0] for name, values in lines_columns({**empty_lines(), "name": [None]}).items()
}
_EMPTY_METADATA: Columns = _build_metadata([])
