"""Chrome-trace JSON reader (``*.trace.json[.gz]`` from JAX/TF, generic catapult/Kineto files).

Processes (pid) become planes and threads (tid) become lines, named by the ``M`` events
``process_name`` / ``thread_name``. Phases read: ``X`` (complete), ``B``/``E`` (paired per thread,
innermost first), ``i``/``I`` (instant, duration 0), ``C`` (counter sample, duration 0, its series
in ``stats``). Other phases (flows, async, objects) are counted in the host metadata and skipped.
``ts``/``dur`` are microseconds by the format's definition (``displayTimeUnit`` only changes how a
viewer displays them) and are stored as integer picoseconds relative to the file's first event.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tpuanalyze.parsers.discover import host_name
from tpuanalyze.parsers.staging import (
    EVENT_SCHEMA,
    LINE_SCHEMA,
    META_SCHEMA,
    PLANE_SCHEMA,
    TYPED_COLUMNS,
    HostTables,
    StatColumns,
    classify_plane,
)

from tpuanalyze.errors import TraceFormatError

try:  # orjson parses large traces several times faster; the stdlib is the fallback
    import orjson

    _loads = orjson.loads
    _JSON_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads
    _JSON_ERRORS = (ValueError,)

INT64_MIN, INT64_MAX, UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceFormatError("no such file", str(path)) from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc.strerror or exc}", str(path)) from None
    if not raw:
        raise TraceFormatError("empty file", str(path))
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"corrupt or truncated gzip data ({exc})", str(path)) from None
        if not raw:
            raise TraceFormatError("empty file (after gunzip)", str(path))
    elif path.name.endswith(".gz"):
        raise TraceFormatError("not gzip data (the name ends in .gz)", str(path))
    return raw


def load_trace_events(path: str | Path) -> tuple[list[Any], dict[str, Any]]:
    """The ``traceEvents`` list and the other top-level keys; refuses JSON that is not a trace."""
    path = Path(path)
    raw = _read_bytes(path)
    try:
        doc = _loads(raw)
    except _JSON_ERRORS as exc:
        raise TraceFormatError(f"not valid JSON ({_first_line(exc)})", str(path)) from None
    except UnicodeDecodeError:
        raise TraceFormatError("not valid JSON (not UTF-8 text)", str(path)) from None
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        events, top = doc["traceEvents"], {k: v for k, v in doc.items() if k != "traceEvents"}
    elif isinstance(doc, list) and doc and all(isinstance(e, dict) and "ph" in e for e in doc[:100]):
        events, top = doc, {}
    else:
        raise TraceFormatError("JSON is not a Chrome trace (no traceEvents list)", str(path))
    if not any(isinstance(e, dict) and "ph" in e for e in events[:1000]) and events:
        raise TraceFormatError("JSON is not a Chrome trace (events have no 'ph' phase)", str(path))
    return events, top


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class _Stats:
    """Collects event args as the long stats table (typed by JSON value type)."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.keys: list[str] = []
        self.i64: list[int | None] = []
        self.u64: list[int | None] = []
        self.f64: list[float | None] = []
        self.s: list[str | None] = []
        self.j: list[str | None] = []

    def add(self, row: int, key: str, value: Any) -> None:
        i = u = f = s = j = None
        if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
            j = json.dumps(value)
        elif isinstance(value, int):
            if INT64_MIN <= value <= INT64_MAX:
                i = value
            elif 0 <= value <= UINT64_MAX:
                u = value
            else:
                s = str(value)
        elif isinstance(value, float):
            if math.isfinite(value):
                f = value
            else:
                s = repr(value)
        else:
            s = str(value)
        self.rows.append(row)
        self.keys.append(str(key))
        self.i64.append(i)
        self.u64.append(u)
        self.f64.append(f)
        self.s.append(s)
        self.j.append(j)

    def flush(self, out: StatColumns) -> None:
        out.add(
            np.asarray(self.rows, dtype=np.int64),
            pa.array(self.keys, pa.string()),
            pa.array(self.i64, pa.int64()),
            pa.array(self.u64, pa.uint64()),
            pa.array(self.f64, pa.float64()),
            pa.array(self.s, pa.string()),
            pa.array(self.j, pa.string()),
        )


def _us(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def read_chrome_json(path: str | Path, host: str | None = None) -> HostTables:
    """Read one Chrome-trace JSON file into staging tables (times relative to its first event)."""
    path = Path(path)
    events, top = load_trace_events(path)
    host = host or host_name(path)

    process_names: dict[Any, str] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    plane_of: dict[Any, int] = {}
    line_of: dict[tuple[Any, Any], tuple[int, int]] = {}
    lines_per_plane: list[int] = []
    md_of: list[dict[str, int]] = []

    def plane_index(pid: Any) -> int:
        idx = plane_of.get(pid)
        if idx is None:
            idx = plane_of[pid] = len(plane_of)
            lines_per_plane.append(0)
            md_of.append({})
        return idx

    def line_key(pid: Any, tid: Any) -> tuple[int, int]:
        key = (pid, tid)
        found = line_of.get(key)
        if found is None:
            p = plane_index(pid)
            found = line_of[key] = (p, lines_per_plane[p])
            lines_per_plane[p] += 1
        return found

    ev_plane: list[int] = []
    ev_line: list[int] = []
    ev_md: list[int] = []
    ev_ts: list[float] = []
    ev_dur: list[float] = []
    stats = _Stats()
    skipped: Counter[str] = Counter()
    open_slices: dict[tuple[Any, Any], list[tuple[int, float]]] = {}

    def add_event(e: dict[str, Any], ts: float, dur: float) -> int:
        p, ln = line_key(e.get("pid"), e.get("tid"))
        names = md_of[p]
        name = str(e.get("name", ""))
        md = names.get(name)
        if md is None:
            md = names[name] = len(names)
        row = len(ev_ts)
        ev_plane.append(p)
        ev_line.append(ln)
        ev_md.append(md)
        ev_ts.append(ts)
        ev_dur.append(dur)
        cat = e.get("cat")
        if cat is not None:
            stats.add(row, "cat", cat)
        args = e.get("args")
        if isinstance(args, dict):
            for key, value in args.items():
                stats.add(row, key, value)
        return row

    for e in events:
        if not isinstance(e, dict):
            skipped["non-object"] += 1
            continue
        ph = e.get("ph")
        if ph == "X":
            ts = _us(e.get("ts"))
            if ts is None:
                skipped["X without ts"] += 1
                continue
            add_event(e, ts, _us(e.get("dur")) or 0.0)
        elif ph == "B":
            ts = _us(e.get("ts"))
            if ts is None:
                skipped["B without ts"] += 1
                continue
            row = add_event(e, ts, 0.0)
            open_slices.setdefault((e.get("pid"), e.get("tid")), []).append((row, ts))
        elif ph == "E":
            stack = open_slices.get((e.get("pid"), e.get("tid")))
            ts = _us(e.get("ts"))
            if not stack or ts is None:
                skipped["E without B"] += 1
                continue
            row, start = stack.pop()
            ev_dur[row] = max(ts - start, 0.0)
            args = e.get("args")
            if isinstance(args, dict):
                for key, value in args.items():
                    stats.add(row, key, value)
        elif ph in ("i", "I", "C"):
            ts = _us(e.get("ts"))
            if ts is None:
                skipped[f"{ph} without ts"] += 1
                continue
            add_event(e, ts, 0.0)
        elif ph == "M":
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            if e.get("name") == "process_name":
                process_names[e.get("pid")] = str(args.get("name", ""))
                plane_index(e.get("pid"))
            elif e.get("name") == "thread_name":
                thread_names[(e.get("pid"), e.get("tid"))] = str(args.get("name", ""))
                line_key(e.get("pid"), e.get("tid"))
        else:
            skipped[f"ph={ph}"] += 1
    unterminated = sum(len(s) for s in open_slices.values())
    for stack in open_slices.values():
        for row, _ in stack:
            stats.add(row, "unterminated", True)

    n = len(ev_ts)
    ts_arr = np.asarray(ev_ts, dtype=np.float64)
    t0_us = float(ts_arr.min()) if n else 0.0
    t0_ns = math.floor(t0_us * 1000.0)
    frac_ps = round((t0_us * 1000.0 - t0_ns) * 1000.0)
    starts = np.rint((ts_arr - t0_us) * 1e6).astype(np.int64) + frac_ps
    durations = np.rint(np.asarray(ev_dur, dtype=np.float64) * 1e6).astype(np.int64)
    plane_arr = np.asarray(ev_plane, dtype=np.int32)
    line_arr = np.asarray(ev_line, dtype=np.int32)

    events_table = pa.Table.from_arrays(
        [
            pa.array(np.arange(n, dtype=np.int64)),
            pa.array(plane_arr, pa.int32()),
            pa.array(line_arr, pa.int32()),
            pa.array(np.asarray(ev_md, dtype=np.int64), pa.int64()),
            pa.array(starts),
            pa.array(durations),
            pa.nulls(n, pa.int64()),
        ],
        schema=EVENT_SCHEMA,
    )
    stats_out = StatColumns()
    stats.flush(stats_out)

    # Per-line and per-plane counts, vectorised.
    pids = sorted(plane_of, key=plane_of.get)
    line_events = Counter(zip(ev_plane, ev_line, strict=False))
    plane_events = Counter(ev_plane)
    planes: dict[str, list[Any]] = {f.name: [] for f in PLANE_SCHEMA}
    for pid in pids:
        p = plane_of[pid]
        name = process_names.get(pid) or f"pid {pid}"
        kind, ordinal = classify_plane(name)
        planes["plane_index"].append(p)
        planes["plane_id"].append(pid if isinstance(pid, int) else None)
        planes["name"].append(name)
        planes["kind"].append(kind)
        planes["device_ordinal"].append(ordinal)
        planes["device_type"].append(None)
        planes["peak_tflops"].append(None)
        planes["peak_hbm_bw_gbps"].append(None)
        planes["num_lines"].append(lines_per_plane[p])
        planes["num_events"].append(plane_events.get(p, 0))
        planes["stats"].append(json.dumps({"pid": pid}))
    lines: dict[str, list[Any]] = {f.name: [] for f in LINE_SCHEMA}
    for (pid, tid), (p, ln) in sorted(line_of.items(), key=lambda kv: kv[1]):
        lines["plane_index"].append(p)
        lines["line_index"].append(ln)
        lines["line_id"].append(tid if isinstance(tid, int) and INT64_MIN <= tid <= INT64_MAX else None)
        lines["display_id"].append(None)
        lines["name"].append(thread_names.get((pid, tid)) or f"tid {tid}")
        lines["display_name"].append(None)
        lines["timestamp_ns"].append(None)
        lines["duration_ps"].append(None)
        lines["num_events"].append(line_events.get((p, ln), 0))

    meta: dict[str, list[Any]] = {f.name: [] for f in META_SCHEMA}
    for p, names in enumerate(md_of):
        for name, md in names.items():
            meta["plane_index"].append(p)
            meta["md_id"].append(md)
            meta["name"].append(name)
            meta["display_name"].append(None)
            meta["stats"].append(None)
    for column, _ in TYPED_COLUMNS:
        meta[column] = [None] * len(meta["md_id"])

    metadata: dict[str, Any] = {k: v for k, v in top.items() if isinstance(v, (str, int, float, bool))}
    if skipped:
        metadata["skipped_events"] = dict(skipped)
    if unterminated:
        metadata["unterminated_slices"] = unterminated
    return HostTables(
        host=host,
        file_path=str(path.resolve()),
        file_bytes=path.stat().st_size,
        source_format="chrome_json",
        t0_ns=t0_ns if n else None,
        planes=pa.Table.from_pydict(planes, schema=PLANE_SCHEMA),
        lines=pa.Table.from_pydict(lines, schema=LINE_SCHEMA),
        events=events_table,
        stats=stats_out.table(),
        meta=pa.Table.from_pydict(meta, schema=META_SCHEMA),
        metadata=metadata,
    )
