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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tpuanalyze.parsers.discover import host_name
from tpuanalyze.parsers.staging import (
    CHUNK_EVENTS,
    STAT_DOUBLE,
    STAT_INT,
    STAT_JSON,
    STAT_TEXT,
    STAT_UINT,
    TYPED_STATS,
    EventBatch,
    PlaneData,
    PlaneInfo,
    StatLong,
    classify_plane,
    empty_lines,
    lines_columns,
    metadata_table,
    text_column,
    typed_value,
)
from tpuanalyze.parsers.trace_file import read_trace_file

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
    raw = read_trace_file(path, "a Chrome trace file")
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
        self.kinds: list[int] = []
        self.i64: list[int] = []
        self.u64: list[int] = []
        self.f64: list[float] = []
        self.text: list[str | None] = []
        self._arrays: tuple[np.ndarray, ...] | None = None

    def add(self, row: int, key: str, value: Any) -> None:
        i = u = 0
        f = 0.0
        text = None
        typed = TYPED_STATS.get(key)
        if typed and typed[1] != "str" and isinstance(value, str):
            # JAX/TF write every arg as a string: numbers for typed columns are parsed back.
            parsed = typed_value(typed[1], value if typed[1] == "double" else _int_text(value))
            value = value if parsed is None else parsed
        if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
            kind, text = STAT_JSON, json.dumps(value)
        elif isinstance(value, int):
            if INT64_MIN <= value <= INT64_MAX:
                kind, i = STAT_INT, value
            elif 0 <= value <= UINT64_MAX:
                kind, u = STAT_UINT, value
            else:
                kind, text = STAT_TEXT, str(value)
        elif isinstance(value, float):
            if math.isfinite(value):
                kind, f = STAT_DOUBLE, value
            else:
                kind, text = STAT_TEXT, repr(value)
        else:
            kind, text = STAT_TEXT, str(value)
        self.rows.append(row)
        self.keys.append(str(key))
        self.kinds.append(kind)
        self.i64.append(i)
        self.u64.append(u)
        self.f64.append(f)
        self.text.append(text)

    def long(self, rows: np.ndarray, owners: np.ndarray) -> StatLong:
        """The stat rows ``rows`` as a long table whose owners are ``owners`` (batch-local)."""
        if self._arrays is None:
            self._arrays = (
                text_column(self.keys),
                np.array(self.kinds, dtype=np.int8),
                np.array(self.i64, dtype=np.int64),
                np.array(self.u64, dtype=np.uint64),
                np.array(self.f64, dtype=np.float64),
                text_column(self.text),
            )
        key, kind, i64, u64, f64, text = (a[rows] for a in self._arrays)
        return StatLong(owner=owners, key=key, kind=kind, i64=i64, u64=u64, f64=f64, text=text)


def _int_text(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def _us(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class ChromeJsonReader:
    """One Chrome-trace JSON file, read fully on construction (JSON has no random access), streamed
    to the loader plane by plane in the common batch shape."""

    source_format = "chrome_json"

    def __init__(self, path: str | Path, host: str | None = None) -> None:
        self.path = Path(path)
        self.host = host or host_name(self.path)
        self.file_path = str(self.path.resolve())
        events, top = load_trace_events(self.path)
        self.file_bytes = self.path.stat().st_size
        self.hostnames: list[str] = []
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self._read(events, top)

    def release(self) -> None:
        self._stats = None

    def _read(self, events: list[Any], top: dict[str, Any]) -> None:
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
        # Integral microseconds (Kineto) give an exact t0; fractional ones are as exact as a double.
        t0_ns = int(t0_us) * 1000 if t0_us.is_integer() else math.floor(t0_us * 1000.0)
        frac_ps = round((t0_us * 1000.0 - t0_ns) * 1000.0)
        self.t0_ns: int | None = t0_ns if n else None
        self.num_events = n
        self._start = np.rint((ts_arr - t0_us) * 1e6).astype(np.int64) + frac_ps
        self._duration = np.rint(np.asarray(ev_dur, dtype=np.float64) * 1e6).astype(np.int64)
        self._plane = np.asarray(ev_plane, dtype=np.int32)
        self._line = np.asarray(ev_line, dtype=np.int32)
        self._md = np.asarray(ev_md, dtype=np.int64)
        self._stats = stats
        self._stat_rows = np.asarray(stats.rows, dtype=np.int64)
        self._plane_of = plane_of
        self._line_of = line_of
        self._lines_per_plane = lines_per_plane
        self._md_of = md_of
        self._process_names = process_names
        self._thread_names = thread_names
        self.metadata: dict[str, Any] = {
            k: v for k, v in top.items() if isinstance(v, (str, int, float, bool))
        }
        if skipped:
            self.metadata["skipped_events"] = dict(skipped)
        if unterminated:
            self.metadata["unterminated_slices"] = unterminated

    def planes(self) -> Iterator[PlaneData]:
        line_events = Counter(zip(self._plane.tolist(), self._line.tolist(), strict=True))
        lines_by_plane: dict[int, list[tuple[Any, int]]] = {}
        for (_pid, tid), (p, ln) in self._line_of.items():
            lines_by_plane.setdefault(p, []).append((tid, ln))
        stat_plane = self._plane[self._stat_rows] if len(self._stat_rows) else np.zeros(0, np.int32)
        for pid, p in sorted(self._plane_of.items(), key=lambda kv: kv[1]):
            name = self._process_names.get(pid) or f"pid {pid}"
            kind, ordinal = classify_plane(name)
            lines = empty_lines()
            line_names: list[str] = []
            for tid, ln in sorted(lines_by_plane.get(p, []), key=lambda t: t[1]):
                line_name = self._thread_names.get((pid, tid)) or f"tid {tid}"
                line_names.append(line_name)
                lines["line_index"].append(ln)
                lines["line_id"].append(
                    tid if isinstance(tid, int) and INT64_MIN <= tid <= INT64_MAX else None
                )
                lines["display_id"].append(None)
                lines["name"].append(line_name)
                lines["display_name"].append(None)
                lines["timestamp_ns"].append(None)
                lines["duration_ps"].append(None)
                lines["num_events"].append(line_events.get((p, ln), 0))
            rows = np.flatnonzero(self._plane == p)
            names = self._md_of[p]
            metadata = metadata_table([(md, nm, None, {}) for nm, md in names.items()])
            info = PlaneInfo(
                plane_index=p,
                plane_id=pid if isinstance(pid, int) and INT64_MIN <= pid <= INT64_MAX else None,
                name=name,
                kind=kind,
                device_ordinal=ordinal,
                device_type=None,
                peak_tflops=None,
                peak_hbm_bw_gbps=None,
                num_lines=len(line_names),
                num_events=len(rows),
                stats=json.dumps({"pid": pid}, default=str),
            )
            yield PlaneData(
                info=info,
                lines=lines_columns(lines),
                metadata=metadata,
                batches=self._batches(p, rows, stat_plane),
            )

    def _batches(self, p: int, rows: np.ndarray, stat_plane: np.ndarray) -> Iterator[EventBatch]:
        local = np.full(self.num_events, -1, dtype=np.int64)
        for lo in range(0, len(rows), CHUNK_EVENTS):
            chunk = rows[lo : lo + CHUNK_EVENTS]
            local[chunk] = np.arange(len(chunk))
            stat_sel = np.flatnonzero(stat_plane == p)
            stat_sel = stat_sel[local[self._stat_rows[stat_sel]] >= 0]
            stat_sel = stat_sel[np.isin(self._stat_rows[stat_sel], chunk)]
            stats = self._stats.long(stat_sel, local[self._stat_rows[stat_sel]]) if len(stat_sel) else None
            yield EventBatch(
                line_index=self._line[chunk],
                metadata_id=self._md[chunk],
                start_ps=self._start[chunk],
                duration_ps=self._duration[chunk],
                stats=stats,
            )
            local[chunk] = -1


def read_chrome_json(path: str | Path, host: str | None = None) -> ChromeJsonReader:
    """Read one Chrome-trace JSON file (see ``ChromeJsonReader``)."""
    return ChromeJsonReader(path, host)
