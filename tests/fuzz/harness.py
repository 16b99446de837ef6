"""Fuzzing the three readers: seeds cut from real captures, hostile mutations, an independent oracle.

The invariant checked for every input (``check``): the reader either accepts it, and then what it
would store equals an independent parse (the generated protobuf classes for XSpace, the standard
library's ``json`` for Chrome traces, a separate line parser for MLPerf logs) and obeys the time
policy (docs/input.md); or it refuses it with a one-line ``TpuAnalyzeError``. Any other exception
is a "traceback", any difference "wrong". Used by tests/test_fuzz_readers.py (hypothesis, a few
seconds) and tests/fuzz/run_fuzz.py (a million inputs).
"""

from __future__ import annotations

import gzip
import json
import math
import random
import re
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tpuanalyze.parsers.chrome_json import ChromeJsonReader
from tpuanalyze.parsers.mlperf import load_mlperf, read_entries, summarize_file
from tpuanalyze.parsers.staging import MAX_SPAN_NS, MAX_SPAN_PS
from tpuanalyze.parsers.xspace import XSpaceReader

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.proto import xplane_pb2

ROOT = Path(__file__).resolve().parents[2]
SHARED_TRACES = ROOT.parent / "shared" / "traces"
SHARED_MLPERF = ROOT.parent / "shared" / "mlperf_logs"
SAMPLES = ROOT / "sample_traces"

INT64_MAX = (1 << 63) - 1
HOSTILE_INTS = [
    0,
    1,
    -1,
    INT64_MAX,
    -(1 << 63),
    INT64_MAX - 1,
    (1 << 62),
    MAX_SPAN_PS,
    MAX_SPAN_PS + 1,
    -MAX_SPAN_PS,
    86_400 * 10**12 * 106,
    10**18,
    2**53 + 1,
]
HOSTILE_VALUES: list[Any] = [
    0,
    -1,
    -1e-9,
    1e999,
    -1e999,
    1e308,
    10**30,
    2**63,
    -(2**63) - 1,
    2**64,
    True,
    False,
    None,
    "nan",
    "inf",
    "-inf",
    "1e999",
    "abc",
    "",
    "12",
    [1],
    [],
    {},
    {"a": 1},
    9.2e12,
    1.7e15,
    1.7e15 + 9.2e12,
    0.5,
    -0.0,
    "[/x]",
    "[memory]",
    "[link=http://x]y[/link]",
    "\x1b[31mred",
    "a\nb",
    "\u202e",
    "\x00",
    "\ud800",
]


@dataclass
class Outcome:
    kind: str  # accepted | refused | traceback | wrong
    detail: str = ""


@dataclass
class Tally:
    """What a fuzz run saw, per input class."""

    inputs: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)  # (class, kind)
    problems: dict[str, str] = field(default_factory=dict)  # first detail per distinct problem

    def add(self, klass: str, outcome: Outcome) -> None:
        self.inputs[klass] += 1
        self.outcomes[(klass, outcome.kind)] += 1
        if outcome.kind in ("traceback", "wrong"):
            key = (
                f"{klass}: {outcome.kind}: {outcome.detail.splitlines()[-1][:160] if outcome.detail else ''}"
            )
            self.problems.setdefault(key, outcome.detail)


# ---------------------------------------------------------------- seeds (cut from real captures)


def _xspace_files() -> list[Path]:
    files = sorted(SAMPLES.rglob("*.xplane.pb"))
    if SHARED_TRACES.is_dir():
        files += [p for p in sorted(SHARED_TRACES.rglob("*.xplane.pb")) if "corrupt" not in p.name]
    return files


def xspace_seeds(events_per_line: int = 3, max_lines: int = 3, max_planes: int = 3) -> list[bytes]:
    """Each real XSpace cut down to a few planes, lines and events (metadata kept small)."""
    seeds = []
    for path in _xspace_files():
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        # at most max_planes planes (those with events first): each plane costs the readers a few
        # milliseconds of fixed work, and a million inputs must fit in an hour on a shared machine
        planes = sorted(space.planes, key=lambda p: not any(line.events for line in p.lines))[:max_planes]
        kept = [xplane_pb2.XPlane() for _ in planes]
        for copy, plane in zip(kept, planes, strict=True):
            copy.CopyFrom(plane)
        del space.planes[:]
        space.planes.extend(kept)
        for plane in space.planes:
            keep = [line for line in plane.lines if line.events][:max_lines] or list(plane.lines)[:1]
            used: set[int] = set()
            lines = []
            for line in keep:
                copy = xplane_pb2.XLine()
                copy.CopyFrom(line)
                del copy.events[events_per_line:]
                used.update(e.metadata_id for e in copy.events)
                lines.append(copy)
            del plane.lines[:]
            plane.lines.extend(lines)
            for md_id in [k for k in plane.event_metadata if k not in used]:
                del plane.event_metadata[md_id]
        data = space.SerializeToString()
        if len(data) > 64_000:  # a capture with huge metadata tables: keep the planes' own fields only
            for plane in space.planes:
                if len(plane.stat_metadata) > 64:
                    plane.stat_metadata.clear()
                del plane.stats[:]
            data = space.SerializeToString()
        if len(data) <= 64_000:
            seeds.append(data)
    return seeds


def _json_files() -> list[Path]:
    files = sorted(SAMPLES.rglob("*.trace.json.gz"))
    if SHARED_TRACES.is_dir():
        files += sorted(SHARED_TRACES.rglob("*.json.gz"))
    return files


def json_seeds(events: int = 24) -> list[dict]:
    """Each real Chrome trace cut to its metadata events and a few dozen timed events."""
    seeds = []
    for path in _json_files():
        doc = json.loads(gzip.decompress(path.read_bytes()))
        trace = doc["traceEvents"] if isinstance(doc, dict) else doc
        meta = [e for e in trace if isinstance(e, dict) and e.get("ph") == "M"][:12]
        timed = [e for e in trace if isinstance(e, dict) and e.get("ph") in ("X", "B", "E", "i", "I", "C")]
        seeds.append({"traceEvents": meta + timed[:events], "displayTimeUnit": "ns"})
    return seeds


def mlperf_seeds(lines: int = 16) -> list[list[str]]:
    """Windows of real MLPerf result logs (both formats), a few per version."""
    seeds = []
    if not SHARED_MLPERF.is_dir():
        return seeds
    for path in sorted(SHARED_MLPERF.rglob("result_0.txt"))[:12]:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        body = [ln for ln in text if ":::MLL" in ln]
        seeds.append(body[:lines])
        if len(body) > 2 * lines:
            seeds.append(body[len(body) // 2 : len(body) // 2 + lines])
    return seeds


# ---------------------------------------------------------------- mutations


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Flip, truncate, insert, delete or duplicate bytes."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not buf:
            buf = bytearray(rng.randbytes(8))
        op = rng.randrange(6)
        i = rng.randrange(len(buf))
        if op == 0:
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[i] = rng.choice([0, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif op == 2:
            del buf[i:]
        elif op == 3:
            buf[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 4:
            del buf[i : i + rng.randint(1, 16)]
        else:
            j = min(len(buf), i + rng.randint(1, 32))
            buf[i:i] = buf[i:j] * rng.randint(1, 4)
    return bytes(buf)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int64(value: int) -> int:
    return max(-(1 << 63), min(INT64_MAX, value))


def mutate_xspace(seed: bytes, rng: random.Random) -> bytes:
    """Structured: hostile times, durations, ids, names, empty planes, big field numbers."""
    space = xplane_pb2.XSpace()
    space.ParseFromString(seed)
    planes = list(space.planes)
    op = rng.randrange(8)
    lines = [line for plane in planes for line in plane.lines]
    events = [event for line in lines for event in line.events]
    if op == 0 and events:
        rng.choice(events).offset_ps = _int64(rng.choice(HOSTILE_INTS) * rng.choice([1, -1]))
    elif op == 1 and events:
        rng.choice(events).duration_ps = _int64(rng.choice(HOSTILE_INTS) * rng.choice([1, -1]))
    elif op == 2 and lines:
        line = rng.choice(lines)
        line.timestamp_ns = max(-(1 << 63), min(INT64_MAX, line.timestamp_ns + rng.choice(HOSTILE_INTS)))
    elif op == 3 and lines:
        rng.choice(lines).duration_ps = rng.choice(HOSTILE_INTS)
    elif op == 4 and planes:
        rng.choice(planes).name = rng.choice(
            [v for v in HOSTILE_VALUES if isinstance(v, str) and v != "\ud800"]
        )
    elif op == 5:
        for i in range(rng.choice([1, 4])):
            space.planes.add(id=i, name=f"/host:empty{i}")
    elif op == 6 and events:
        rng.choice(events).metadata_id = rng.choice(HOSTILE_INTS)
    data = space.SerializeToString()
    if op == 7:  # a field with a number above 2^29-1 (or zero) somewhere
        number = rng.choice([(1 << 29), (1 << 32) - 1, 0, (1 << 29) - 1])
        raw = _varint(number << 3) + _varint(rng.randrange(1 << 20))
        at = rng.randrange(len(data) + 1)
        data = data[:at] + raw + data[at:] if rng.random() < 0.3 else data + raw
    if rng.random() < 0.25:
        data = mutate_bytes(data, rng)
    return data


def mutate_json(seed: dict, rng: random.Random) -> bytes:
    """Structured: hostile ts/dur/pid/tid/name/ph/args values, removed keys, odd documents."""
    doc = json.loads(json.dumps(seed))
    events = doc["traceEvents"]
    op = rng.randrange(9)
    if events and op < 5:
        event = rng.choice(events)
        key = rng.choice(["ts", "dur", "pid", "tid", "name", "ph", "args", "cat"][: 8 if op else 2])
        event[key] = rng.choice(HOSTILE_VALUES)
    elif events and op == 5:
        event = rng.choice(events)
        event.pop(rng.choice(list(event)), None)
    elif events and op == 6:  # one far event: ts 0, or 100+ days away
        event = rng.choice([e for e in events if "ts" in e] or events)
        event["ts"] = rng.choice(
            [0, float(event.get("ts") or 0) + 9.2e12, float(event.get("ts") or 0) - 9.2e12]
        )
    elif op == 7:
        doc = rng.choice(
            [
                [],
                {},
                {"traceEvents": {}},
                {"traceEvents": [[]]},
                events,
                {"traceEvents": [{"ph": "X", "ts": 1, "pid": [1], "tid": {"a": 1}}]},
                {
                    "traceEvents": [
                        {"ph": "B", "ts": 5, "pid": 1, "tid": 1},
                        {"ph": "E", "ts": 1, "pid": 1, "tid": 1},
                    ]
                },
                {"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "pid": i, "tid": 0} for i in range(50)]},
            ]
        )
    else:
        nested: Any = 1
        for _ in range(rng.choice([10, 600, 3000])):
            nested = [nested]
        if events:
            rng.choice(events)["args"] = {"deep": nested}
    try:
        text = json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        text = b"[" * 5000
    if rng.random() < 0.2:
        text = mutate_bytes(text, rng)
    return text


def mutate_mlperf(seed: list[str], rng: random.Random) -> bytes:
    """Structured: hostile time_ms, metadata, values and keys in MLLOG/MLL lines; garbled lines."""
    lines = list(seed)
    i = rng.randrange(len(lines))
    line = lines[i]
    op = rng.randrange(6)
    value = rng.choice(HOSTILE_VALUES)
    if line.startswith(":::MLLOG") and op < 4:
        try:
            record = json.loads(line[len(":::MLLOG") :])
        except ValueError:
            record = {}
        if isinstance(record, dict):
            record[rng.choice(["time_ms", "metadata", "value", "key"])] = value
            lines[i] = ":::MLLOG " + json.dumps(record, allow_nan=True)
    elif line.startswith(":::MLL ") and op < 4:
        parts = line.split(" ", 3)
        if len(parts) == 4 and op < 2:
            parts[1] = str(value) if not isinstance(value, (list, dict)) else json.dumps(value)
            lines[i] = " ".join(parts)
        else:
            payload = json.dumps({"value": value, "metadata": rng.choice(HOSTILE_VALUES)}, allow_nan=True)
            lines[i] = re.sub(r"\{.*\}", lambda _: payload, line)
    elif op == 4:
        lines.insert(
            i,
            rng.choice(
                [
                    ":::MLL",
                    ":::MLLOG {",
                    ":::MLL nan key: {}",
                    ":::MLLOG []",
                    ':::MLLOG {"key": "run_start", "time_ms": [1]}',
                    "garbage",
                ]
            ),
        )
    text = "\n".join(lines).encode("utf-8", "surrogatepass")
    if op == 5 or rng.random() < 0.1:
        text = mutate_bytes(text, rng)
    return text


# ---------------------------------------------------------------- oracles


def _refused(exc: TpuAnalyzeError) -> Outcome:
    text = str(exc)
    if "\n" in text or not text:
        return Outcome("wrong", f"error is not one line: {text!r}")
    return Outcome("refused", text)


def _guard(run) -> Outcome:
    try:
        return run()
    except TpuAnalyzeError as exc:
        return _refused(exc)
    except Exception:  # anything else is a bug: reported, never hidden
        return Outcome("traceback", traceback.format_exc(limit=-3))


def check_xspace(path: Path) -> Outcome:
    """XSpaceReader on ``path`` vs the generated protobuf classes (upb), event by event."""

    def run() -> Outcome:
        reader = XSpaceReader(path)
        got = []
        stats = 0
        for plane in reader.planes():
            for batch in plane.batches:
                got.append(
                    (
                        np.full(batch.num_rows, plane.info.plane_index),
                        batch.line_index,
                        batch.metadata_id,
                        batch.start_ps,
                        batch.duration_ps,
                    )
                )
                stats += len(batch.stats) if batch.stats is not None else 0
        space = xplane_pb2.XSpace()
        try:
            space.ParseFromString(path.read_bytes())
        except Exception as exc:
            return Outcome("wrong", f"accepted, but protobuf refuses it: {exc}")
        stamps = [line.timestamp_ns for plane in space.planes for line in plane.lines if line.events]
        t0 = min(stamps) if stamps else 0
        expected = []
        want_stats = 0
        for p, plane in enumerate(space.planes):
            for ln, line in enumerate(plane.lines):
                for event in line.events:
                    start = (line.timestamp_ns - t0) * 1000 + event.offset_ps
                    expected.append((p, ln, event.metadata_id, start, event.duration_ps))
                    want_stats += len(event.stats)
        if got:
            columns = [np.concatenate(c).tolist() for c in zip(*got, strict=True)]
            rows = list(zip(*columns, strict=True))
        else:
            rows = []
        if sorted(rows) != sorted(expected):
            return Outcome("wrong", f"events differ from protobuf's: {len(rows)} vs {len(expected)}")
        if stats != want_stats:
            return Outcome("wrong", f"event stats {stats} vs protobuf's {want_stats}")
        for _, _, _, start, duration in expected:
            if not (0 <= start <= 2 * MAX_SPAN_PS and 0 <= duration <= MAX_SPAN_PS):
                return Outcome(
                    "wrong", f"accepted an event outside the time policy: start {start}, dur {duration}"
                )
        return Outcome("accepted")

    return _guard(run)


def _number(value: Any) -> float | None:
    """The independent reading of a ts/dur: a number, numeric text, else None (invalid)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def expected_json_events(doc: Any) -> list[tuple[float, float]] | None:
    """(ts, dur) in microseconds of the events a Chrome trace holds, by the format's rules (X, B/E,
    i/I/C), or None when a reader must refuse it (a bad value, or outside the time policy)."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        return None
    out: list[list[float]] = []
    stacks: dict[Any, list[int]] = {}
    for e in events:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph not in ("X", "B", "E", "i", "I", "C", "M"):
            continue
        bad_pid = isinstance(e.get("pid"), (list, dict))
        bad_ids = bad_pid or isinstance(e.get("tid"), (list, dict))
        if ph == "M":  # the thread id matters for thread names only
            if bad_pid or (e.get("name") == "thread_name" and bad_ids):
                return None
            continue
        if ph == "E" and bad_ids:
            return None
        if e.get("ts") is None:
            continue
        ts = _number(e["ts"])
        if ts is None or bad_ids:
            return None
        key = (e.get("pid"), e.get("tid"))  # JSON values compared as Python compares them, like a dict key
        if ph == "E":
            stack = stacks.get(key)
            if stack:
                row = stack.pop()
                if ts < out[row][0]:
                    return None
                out[row][1] = ts - out[row][0]
            continue
        dur = 0.0
        if ph == "X" and e.get("dur") is not None:
            dur = _number(e["dur"])
            if dur is None:
                return None
        out.append([ts, dur])
        if ph == "B":
            stacks.setdefault(key, []).append(len(out) - 1)
    if out:
        ts = np.array([r[0] for r in out])
        dur = np.array([r[1] for r in out])
        median = float(np.median(ts))
        span = MAX_SPAN_NS / 1000
        if (ts < 0).any() or (np.abs(ts - median) > span).any() or (dur < 0).any() or (dur > span).any():
            return None
    return [(a, b) for a, b in out]


def check_json(path: Path) -> Outcome:
    """ChromeJsonReader on ``path`` vs the standard library's json and the format's rules."""

    def run() -> Outcome:
        reader = ChromeJsonReader(path)
        got = []
        for plane in reader.planes():
            for batch in plane.batches:
                got += zip(batch.start_ps.tolist(), batch.duration_ps.tolist(), strict=True)
        raw = path.read_bytes()
        try:
            doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        except Exception as exc:
            return Outcome("wrong", f"accepted, but json refuses it: {type(exc).__name__}")
        expected = expected_json_events(doc)
        if expected is None:
            return Outcome("wrong", "accepted an event the format or the time policy rules out")
        if len(expected) != len(got):
            return Outcome("wrong", f"{len(got)} events vs {len(expected)} expected")
        # times are stored relative to the host's t0 in whole nanoseconds (the earliest ts, floored),
        # so the earliest event starts at the sub-nanosecond rest of its ts
        t0 = min((ts for ts, _ in expected), default=0.0)
        rest_ps = (t0 * 1000 - math.floor(t0 * 1000)) * 1000
        want = sorted((round((ts - t0) * 1e6 + rest_ps), round(dur * 1e6)) for ts, dur in expected)
        for (gs, gd), (ws, wd) in zip(sorted(got), want, strict=True):
            tolerance = 2 + 1e-9 * max(abs(ws), abs(wd))
            if abs(gs - ws) > tolerance or abs(gd - wd) > tolerance:
                return Outcome("wrong", f"event at {gs} ps / {gd} ps, expected {ws} / {wd}")
        return Outcome("accepted")

    return _guard(run)


_MLLOG = re.compile(r":::MLLOG\s+(\{.*\})\s*$")
_MLL = re.compile(r":::MLL\s+(\S+)\s+([A-Za-z0-9_.\-]+):\s*(\{.*\})\s*$")


def expected_mlperf(text: str) -> list[tuple[float, str]] | None:
    """(time_ms, key) of each log line, or None when the log must be refused."""
    entries = []
    for line in text.splitlines():
        if ":::MLL" not in line:
            continue
        if m := _MLLOG.search(line):
            try:
                record = json.loads(m.group(1))
            except ValueError:
                return None
            if not isinstance(record, dict) or "key" not in record:
                return None
            time = _number(record.get("time_ms") or 0.0)
            metadata = record.get("metadata")
            key = str(record["key"])
        elif m := _MLL.search(line):
            try:
                payload = json.loads(m.group(3))
            except ValueError:
                return None
            time = _number(m.group(1))
            time = time * 1000 if time is not None and math.isfinite(time * 1000) else None
            metadata = payload.get("metadata") if isinstance(payload, dict) else None
            key = m.group(2)
        else:
            return None
        if time is None or time < 0 or not (metadata is None or isinstance(metadata, dict)):
            return None
        entries.append((time, key))
    return entries or None


def check_mlperf(path: Path, with_tables: bool = True) -> Outcome:
    """read_entries + summarize_file (the rows ingest stores) vs an independent line parser; with
    ``with_tables`` also load_mlperf (those rows as the Arrow tables, ~2 ms: the long run samples it)."""

    def run() -> Outcome:
        entries = read_entries(path)
        if not with_tables:
            summarize_file(path, path.parent, entries)
            expected = expected_mlperf(path.read_text(encoding="utf-8", errors="replace"))
            if expected is None or [(e.time_ms, e.key) for e in entries] != expected:
                return Outcome("wrong", "entries differ from the independent parse")
            return Outcome("accepted")
        tables = load_mlperf([path])
        expected = expected_mlperf(path.read_text(encoding="utf-8", errors="replace"))
        if expected is None:
            return Outcome("wrong", "accepted a log the independent parser refuses")
        got = [(e.time_ms, e.key) for e in entries]
        if got != expected:
            return Outcome("wrong", f"{len(got)} entries differ from the independent parse ({len(expected)})")
        if tables.results.num_rows != 1:
            return Outcome("wrong", f"{tables.results.num_rows} result rows for one file")
        for column in ("start_ms", "stop_ms"):
            values = [v for v in tables.intervals.column(column).to_pylist() if v is not None]
            if any(not math.isfinite(v) or v < 0 for v in values):
                return Outcome("wrong", f"interval {column} not a finite non-negative time")
        return Outcome("accepted")

    return _guard(run)


def db_state(db: Path) -> tuple:
    """What a database holds: its runs, and the row count of every table (a refused ingest must leave
    both as they were; every table, so none a future loader adds is left unchecked)."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        runs = con.execute(
            "SELECT run_id, name, source_path, num_events FROM runs ORDER BY run_id"
        ).fetchall()
        tables = [name for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE NOT temporary ORDER BY table_name").fetchall()]
        counts = tuple((t, con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) for t in tables)
        return tuple(runs), counts
    finally:
        con.close()


def write_input(folder: Path, kind: str, data: bytes, gz: bool = False) -> Path:
    """The input as a file the reader opens (MLPerf logs in a result folder of their own)."""
    if kind == "xspace":
        path = folder / "host.xplane.pb"
    elif kind == "json":
        path = folder / ("host.trace.json.gz" if gz else "host.trace.json")
        data = gzip.compress(data, compresslevel=1) if gz else data
    else:
        path = folder / "v0.7" / "tpu-v3-32" / "bench" / "result_0.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


CHECKS = {"xspace": check_xspace, "json": check_json, "mlperf": check_mlperf}
