"""Chrome-trace JSON reader (``*.trace.json[.gz]`` from JAX/TF, generic catapult/Kineto files).

Processes (pid) become planes and threads (tid) become lines, named by the ``M`` events
``process_name`` / ``thread_name``. Phases read: ``X`` (complete), ``B``/``E`` (paired per thread,
innermost first), ``i``/``I`` (instant, duration 0), ``C`` (counter sample, duration 0, its series
in ``stats``). Other phases (flows, async, objects) are counted in the host metadata and skipped.
``ts``/``dur`` are microseconds by the format's definition (``displayTimeUnit`` only changes how a
viewer displays them) and are stored as integer picoseconds relative to the file's first event.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tpuanalyze.parsers.discover import host_name
from tpuanalyze.parsers.staging import (
    CHUNK_EVENTS,
    MAX_LINES,
    MAX_PLANES,
    MAX_SPAN_NS,
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
from tpuanalyze.parsers.trace_file import open_trace_file

from tpuanalyze.errors import TraceFormatError

try:  # orjson parses large traces several times faster; the stdlib is the fallback
    import orjson

    _loads = orjson.loads
    _JSON_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads
    _JSON_ERRORS = (ValueError,)

INT64_MIN, INT64_MAX, UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


# Resource bounds (docs/input.md): the JSON is held whole in memory and parsed into Python objects
# (~1.2 KB per event with one arg: 1M events peak at 1.3 GB), so a file is refused past these,
# checked while it is read and inflated (never inflated whole first). Environment variables raise them.
MAX_JSON_BYTES = 1 << 30
MAX_JSON_EVENTS = 1_000_000
# Real trace JSON inflates 5-20x (generated, very regular traces a few hundred times); gzip's
# ceiling is ~1030x. Past 64 MiB of text, more than 500x is a decompression bomb.
MAX_GZIP_RATIO = 500
BOMB_CHECK_BYTES = 64 << 20
_READ_CHUNK = 1 << 20
_PHASE_KEY = b'"ph"'


def _limit(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, default)))
    except ValueError:
        return default


def json_limits() -> tuple[int, int]:
    """(bytes, events) a Chrome-trace file may hold: TPUANALYZE_MAX_JSON_BYTES / _EVENTS or defaults."""
    return (
        _limit("TPUANALYZE_MAX_JSON_BYTES", MAX_JSON_BYTES),
        _limit("TPUANALYZE_MAX_JSON_EVENTS", MAX_JSON_EVENTS),
    )


class _Bounded:
    """Collects the (inflated) JSON text chunk by chunk, refusing it once it passes the limits.

    Events are counted as ``"ph"`` keys in the text (an upper bound of the events, counted at C
    speed), so an oversized file is refused before orjson turns it into millions of objects."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.max_bytes, self.max_events = json_limits()
        self.data = bytearray()  # grown in place: no second copy when it is done
        self.size = self.events = 0
        self.compressed = 0  # gzip bytes read so far (0 for plain JSON)
        self.tail = b""

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.compressed and self.size > BOMB_CHECK_BYTES and self.size > MAX_GZIP_RATIO * self.compressed:
            raise TraceFormatError(
                f"gzip data inflates more than {MAX_GZIP_RATIO}x ({self.compressed:,} bytes to "
                f"{self.size:,} so far): refused as a decompression bomb",
                str(self.path),
            )
        if self.size > self.max_bytes:
            raise TraceFormatError(
                f"JSON text larger than {self.max_bytes:,} bytes (TPUANALYZE_MAX_JSON_BYTES; "
                "ingest the .xplane.pb of the capture instead)",
                str(self.path),
            )
        joined = self.tail + chunk[:3]
        self.events += chunk.count(_PHASE_KEY) + joined.count(_PHASE_KEY)
        self.tail = chunk[-3:]
        if self.events > self.max_events:
            raise TraceFormatError(
                f"more than {self.max_events:,} trace events (TPUANALYZE_MAX_JSON_EVENTS; "
                "ingest the .xplane.pb of the capture instead)",
                str(self.path),
            )
        self.data += chunk

    def text(self) -> bytearray:
        data, self.data = self.data, bytearray()
        return data


def _read_bytes(path: Path) -> bytearray:
    """The file's JSON text (gunzipped as it streams), within ``json_limits()``."""
    handle, _ = open_trace_file(path, "a Chrome trace file")
    bounded = _Bounded(path)
    with handle:
        head = handle.read(2)
        handle.seek(0)
        try:
            if head == b"\x1f\x8b":
                _inflate(handle, bounded, path)
            else:
                if path.name.endswith(".gz"):
                    raise TraceFormatError("not gzip data (the name ends in .gz)", str(path))
                while chunk := handle.read(_READ_CHUNK):
                    bounded.add(chunk)
        except OSError as exc:
            raise TraceFormatError(f"cannot read: {exc.strerror or exc}", str(path)) from None
    data = bounded.text()
    if not data:
        raise TraceFormatError("empty file (after gunzip)", str(path))
    return data


def _inflate(handle: Any, bounded: _Bounded, path: Path) -> None:
    """Gunzip ``handle`` into ``bounded`` at most ``_READ_CHUNK`` bytes at a time (so a bomb is
    refused by the limits after little work); concatenated gzip members are read like gzip does."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    started = False  # the current member has input
    pending = b""
    read = 0
    try:
        while True:
            if not pending:
                pending = handle.read(_READ_CHUNK)
                read += len(pending)
                if not pending:
                    break
            if not started and not pending.strip(b"\0"):
                pending = b""  # zero padding after the last member
                continue
            started = True
            out = inflater.decompress(pending, _READ_CHUNK)
            pending = inflater.unconsumed_tail
            bounded.compressed = read - len(pending)  # input consumed so far: the ratio is exact
            bounded.add(out)
            if inflater.eof:
                pending = inflater.unused_data + pending
                inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                started = False
    except zlib.error as exc:
        raise TraceFormatError(f"corrupt or truncated gzip data ({exc})", str(path)) from None
    if started:
        raise TraceFormatError("corrupt or truncated gzip data (compressed file ended early)", str(path))


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
    """Collects event args as the long stats table (typed by JSON value type).

    Rows gather in Python lists and are packed into numpy arrays every ``STATS_PACK_ROWS`` rows:
    held as lists, each stat cost ~90 bytes (seven list slots and an int object per value), packed
    ~50, and the lists and the arrays were both alive while the batches were cut (a Kineto trace
    of 300K kernels with 9 args each peaked at 1.16-1.27 GB, now 1.04-1.06;
    benchmarks/results/bench_ingest.md). Every stat is added before ``rows`` or ``long`` is read:
    the first read packs the table for good."""

    def __init__(self) -> None:
        self._lists: tuple[list[Any], ...] = ([], [], [], [], [], [], [])  # rows keys kinds i64 u64 f64 text
        self._packed: list[tuple[np.ndarray, ...]] = []
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
        rows, keys, kinds, i64, u64, f64, texts = self._lists
        rows.append(row)
        keys.append(str(key))
        kinds.append(kind)
        i64.append(i)
        u64.append(u)
        f64.append(f)
        texts.append(text)
        if len(rows) >= STATS_PACK_ROWS:
            self._pack()

    def _pack(self) -> None:
        rows, keys, kinds, i64, u64, f64, texts = self._lists
        if rows:
            self._packed.append((
                np.array(rows, dtype=np.int64),
                text_column(keys),
                np.array(kinds, dtype=np.int8),
                np.array(i64, dtype=np.int64),
                np.array(u64, dtype=np.uint64),
                np.array(f64, dtype=np.float64),
                text_column(texts),
            ))
        self._lists = ([], [], [], [], [], [], [])

    def _columns(self) -> tuple[np.ndarray, ...]:
        """(rows, key, kind, i64, u64, f64, text) of every stat, packed once (the pieces freed)."""
        if self._arrays is None:
            self._pack()
            pieces, self._packed = self._packed, []
            if len(pieces) == 1:
                self._arrays = pieces[0]
            else:
                dtypes = (np.int64, object, np.int8, np.int64, np.uint64, np.float64, object)
                self._arrays = tuple(
                    np.concatenate([piece[c] for piece in pieces]) if pieces else np.zeros(0, dtype)
                    for c, dtype in enumerate(dtypes))
        return self._arrays

    @property
    def rows(self) -> np.ndarray:
        """Each stat's event (its row in the reader's event arrays), in the order the stats were added."""
        return self._columns()[0]

    def long(self, rows: np.ndarray, owners: np.ndarray) -> StatLong:
        """The stat rows ``rows`` as a long table whose owners are ``owners`` (batch-local)."""
        key, kind, i64, u64, f64, text = (a[rows] for a in self._columns()[1:])
        return StatLong(owner=owners, key=key, kind=kind, i64=i64, u64=u64, f64=f64, text=text)


# Stats packed from lists into arrays at a time (``_Stats``): ~6 MB of lists.
STATS_PACK_ROWS = 65_536


def _int_text(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


class _BadEvent(Exception):
    """An event's field that cannot be stored (raised inside the read loop, named by ``_read``)."""


# microseconds whose nanoseconds no longer fit a signed 64-bit integer (the runs' and hosts' t0_ns)
_MAX_US = 2**63 / 1000


def _us(value: Any, field_name: str = "ts") -> float | None:
    """A ts/dur in microseconds: a JSON number (or numeric text, as some writers emit); None when
    absent; ``_BadEvent`` for anything else (booleans, lists, words, non-finite text)."""
    if value is None:
        return None
    if isinstance(value, float):
        number = value
    elif isinstance(value, int) and not isinstance(value, bool):
        number = float(value) if -1e300 < value < 1e300 else math.inf
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise _BadEvent(f"{field_name} is not a number ({value[:40]!r})") from None
    else:
        raise _BadEvent(f"{field_name} is not a number ({type(value).__name__})")
    if not math.isfinite(number):
        raise _BadEvent(f"{field_name} is not finite ({str(value)[:40]})")
    if abs(number) >= _MAX_US:
        raise _BadEvent(f"{field_name} {str(value)[:40]} us is beyond what a nanosecond clock holds "
                        "(292 years)")
    return number


def _hashable(value: Any, field_name: str) -> Any:
    if isinstance(value, (list, dict)):
        raise _BadEvent(f"{field_name} is a {type(value).__name__}, not a number or string")
    return value


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
        ev_src: list[int] = []  # index in traceEvents, to name an event the time policy refuses
        stats = _Stats()
        skipped: Counter[str] = Counter()
        open_slices: dict[tuple[Any, Any], list[tuple[int, float]]] = {}

        def add_event(e: dict[str, Any], ts: float, dur: float, index: int) -> int:
            p, ln = line_key(_hashable(e.get("pid"), "pid"), _hashable(e.get("tid"), "tid"))
            ev_src.append(index)
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

        index = 0
        try:
            for index, e in enumerate(events):
                if not isinstance(e, dict):
                    skipped["non-object"] += 1
                    continue
                ph = e.get("ph")
                if ph == "X":
                    ts = _us(e.get("ts"))
                    if ts is None:
                        skipped["X without ts"] += 1
                        continue
                    add_event(e, ts, _us(e.get("dur"), "dur") or 0.0, index)
                elif ph == "B":
                    ts = _us(e.get("ts"))
                    if ts is None:
                        skipped["B without ts"] += 1
                        continue
                    row = add_event(e, ts, 0.0, index)
                    open_slices.setdefault((e.get("pid"), e.get("tid")), []).append((row, ts))
                elif ph == "E":
                    key = (_hashable(e.get("pid"), "pid"), _hashable(e.get("tid"), "tid"))
                    stack = open_slices.get(key)
                    ts = _us(e.get("ts"))
                    if not stack or ts is None:
                        skipped["E without B"] += 1
                        continue
                    row, start = stack.pop()
                    if ts < start:
                        raise _BadEvent(f"E at ts {ts} ends before its B at ts {start}")
                    ev_dur[row] = ts - start
                    args = e.get("args")
                    if isinstance(args, dict):
                        for key, value in args.items():
                            stats.add(row, key, value)
                elif ph in ("i", "I", "C"):
                    ts = _us(e.get("ts"))
                    if ts is None:
                        skipped[f"{ph} without ts"] += 1
                        continue
                    add_event(e, ts, 0.0, index)
                elif ph == "M":
                    args = e.get("args") if isinstance(e.get("args"), dict) else {}
                    pid = _hashable(e.get("pid"), "pid")
                    if e.get("name") == "process_name":
                        process_names[pid] = str(args.get("name", ""))
                        plane_index(pid)
                    elif e.get("name") == "thread_name":
                        tid = _hashable(e.get("tid"), "tid")
                        thread_names[(pid, tid)] = str(args.get("name", ""))
                        line_key(pid, tid)
                else:
                    skipped[f"ph={str(ph)[:20]}"] += 1
        except _BadEvent as exc:
            raise TraceFormatError(
                f"traceEvents[{index}] ({_describe(events[index])}): {exc}", self.file_path
            ) from None
        if len(plane_of) > MAX_PLANES or len(line_of) > MAX_LINES:
            raise TraceFormatError(
                f"{len(plane_of):,} processes and {len(line_of):,} threads: more than a capture has "
                f"(at most {MAX_PLANES:,} and {MAX_LINES:,})",
                self.file_path,
            )
        unterminated = sum(len(s) for s in open_slices.values())
        for stack in open_slices.values():
            for row, _ in stack:
                stats.add(row, "unterminated", True)

        n = len(ev_ts)
        ts_arr = np.asarray(ev_ts, dtype=np.float64)
        dur_arr = np.asarray(ev_dur, dtype=np.float64)
        self._check_times(ts_arr, dur_arr, ev_src, events)
        t0_us = float(ts_arr.min()) if n else 0.0
        # Integral microseconds (Kineto) give an exact t0; fractional ones are as exact as a double.
        t0_ns = int(t0_us) * 1000 if t0_us.is_integer() else math.floor(t0_us * 1000.0)
        frac_ps = round((t0_us * 1000.0 - t0_ns) * 1000.0)
        self.t0_ns: int | None = t0_ns if n else None
        self.num_events = n
        self._start = np.rint((ts_arr - t0_us) * 1e6).astype(np.int64) + frac_ps
        self._duration = np.rint(dur_arr * 1e6).astype(np.int64)
        self._plane = np.asarray(ev_plane, dtype=np.int32)
        self._line = np.asarray(ev_line, dtype=np.int32)
        self._md = np.asarray(ev_md, dtype=np.int64)
        self._stats = stats
        self._stat_rows = stats.rows
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

    def _check_times(self, ts: np.ndarray, dur: np.ndarray, source: list[int], events: list[Any]) -> None:
        """The time policy (docs/input.md), vectorised: ts >= 0, durations in [0, 7 days], every
        event within 7 days of the median event time (one far event would shift all others)."""
        if not len(ts):
            return
        median = float(np.median(ts))
        span_us = MAX_SPAN_NS / 1000.0
        bad_ts = (ts < 0) | (np.abs(ts - median) > span_us)
        bad_dur = (dur < 0) | (dur > span_us)
        bad = bad_ts | bad_dur
        if not bad.any():
            return
        row = int(np.argmax(bad))
        if bad_dur[row]:
            what = f"dur {dur[row]:g} us is {'negative' if dur[row] < 0 else 'longer than 7 days'}"
        elif ts[row] < 0:
            what = f"ts {ts[row]:g} us is negative"
        else:
            days = abs(ts[row] - median) / 86_400e6
            what = (
                f"ts {ts[row]:.0f} us is {days:,.1f} days from the median of the trace's events "
                "(events of one file must lie within 7 days)"
            )
        index = source[row]
        raise TraceFormatError(f"traceEvents[{index}] ({_describe(events[index])}): {what}", self.file_path)

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


def _describe(event: Any) -> str:
    """An event as the error names it: phase and name, cut short."""
    if not isinstance(event, dict):
        return type(event).__name__
    name = str(event.get("name", ""))
    name = name if len(name) <= 60 else name[:57] + "..."
    return f"ph {str(event.get('ph'))[:8]!r}, name {name!r}"


def read_chrome_json(path: str | Path, host: str | None = None) -> ChromeJsonReader:
    """Read one Chrome-trace JSON file (see ``ChromeJsonReader``)."""
    return ChromeJsonReader(path, host)
