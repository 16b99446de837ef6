"""MLPerf training result logs (``result_*.txt``) into two Arrow tables: results and intervals.

Two line formats exist (catalog §5): v0.7+ ``:::MLLOG {"namespace", "time_ms", "key", "value",
"metadata"}`` and v0.6 ``:::MLL <unix seconds> <key>: {"value", "metadata"}``. Both become one
:class:`LogEntry` stream; everything after that is format-free. One result folder (the files of one
benchmark on one system, e.g. ``v0.7/tpu-v3-8192-TF/resnet``) is one run of the database.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import pyarrow as pa

from tpuanalyze.parsers.trace_file import check_utf8_name

from tpuanalyze.errors import TraceFormatError

_MLLOG = re.compile(r":::MLLOG\s+(\{.*\})\s*$")
_MLL = re.compile(r":::MLL\s+(\S+)\s+([A-Za-z0-9_.\-]+):\s*(\{.*\})\s*$")
# Folder/platform names count TPU cores: tpu-v3-8192 is 4096 chips (catalog §1); an optional
# framework suffix follows in v0.7 (tpu-v3-8192-TF, tpu-v3-32-TF2.0).
_PLATFORM = re.compile(r"^tpu-v(\d+)-(\d+)(?:-(.+))?$", re.IGNORECASE)
_VERSION = re.compile(r"^v\d+\.\d+$")

# Keys that mark lifecycle events rather than hyperparameters.
_EVENT_KEYS = {
    "init_start", "init_stop", "run_start", "run_stop", "run_final", "block_start", "block_stop",
    "eval_start", "eval_stop", "eval_accuracy", "epoch_start", "epoch_stop", "cache_clear",
}


@dataclass(frozen=True)
class LogEntry:
    """One MLPerf log line, either format: time in ms since the epoch, key, value, metadata."""

    time_ms: float
    key: str
    value: Any
    metadata: dict


class MlperfTables(NamedTuple):
    """What :func:`load_mlperf` returns: one row per result file, one row per interval."""

    results: pa.Table
    intervals: pa.Table


@dataclass
class ResultFolder:
    """The result files of one benchmark on one system: one run of the database."""

    path: Path
    files: list[Path] = field(default_factory=list)


def _schemas() -> tuple[pa.Schema, pa.Schema]:
    """Arrow schemas of the results and intervals tables (pyarrow imported only when MLPerf logs
    are read, so ingesting traces never pays for it)."""
    import pyarrow as pa

    results = pa.schema([
        ("folder", pa.string()),            # absolute folder path: the runs.source_path
        ("result_file", pa.string()),
        ("benchmark", pa.string()),
        ("submitter_path", pa.string()),
        ("version", pa.string()),
        ("platform", pa.string()),
        ("cores", pa.int32()),
        ("chips", pa.int32()),
        ("framework", pa.string()),
        ("run_start_ms", pa.float64()),
        ("run_stop_ms", pa.float64()),
        ("status", pa.string()),
        ("global_batch_size", pa.int64()),
        ("opt_name", pa.string()),
        ("epochs", pa.float64()),
        ("eval_count", pa.int32()),
        ("eval_ms", pa.float64()),
        ("train_samples", pa.int64()),
        ("num_lines", pa.int64()),
        ("hyperparameters", pa.string()),   # JSON object
    ])

    intervals = pa.schema([
        ("folder", pa.string()),
        ("result_file", pa.string()),
        ("kind", pa.string()),              # init | run | block | eval | epoch
        ("start_ms", pa.float64()),
        ("stop_ms", pa.float64()),
        ("epoch", pa.float64()),
        ("epoch_count", pa.float64()),
        ("value", pa.float64()),
    ])
    return results, intervals


def _time(value: Any, what: str) -> float:
    """A log time as a finite, non-negative float (a JSON number or numeric text), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{what} is not a number ({type(value).__name__})")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{what} is not a number ({str(value)[:40]!r})") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{what} is {'not finite' if not math.isfinite(number) else 'negative'} ({value})")
    return number


def _metadata(value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"metadata is a {type(value).__name__}, not an object")
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _loads(text: str) -> Any:
    """JSON of a log line; a lone surrogate escape (``"\\ud800"``) is refused: such a string
    cannot be stored as UTF-8 (the regex spares the encode check on ordinary lines)."""
    value = json.loads(text)
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a string holds a lone UTF-16 surrogate (not valid Unicode)") from None
    return value


def parse_line(line: str) -> LogEntry | None:
    """One log line as a LogEntry, None for lines that are not MLPerf log lines.

    Raises ValueError when a line has the MLPerf prefix but its payload is broken: bad JSON, a
    time that is not a finite non-negative number, metadata that is not an object.
    """
    if ":::MLL" not in line:
        return None
    match = _MLLOG.search(line)
    if match:
        record = _loads(match.group(1))
        if not isinstance(record, dict) or "key" not in record:
            raise ValueError("MLLOG record without a key")
        if record.get("time_ms") is None:  # not the epoch: a run "started" in 1970 spans 56 years
            raise ValueError("MLLOG record without time_ms")
        time_ms = _time(record["time_ms"], "time_ms")
        return LogEntry(time_ms, str(record["key"]), record.get("value"), _metadata(record.get("metadata")))
    match = _MLL.search(line)
    if match:
        payload = _loads(match.group(3))
        if not isinstance(payload, dict):
            payload = {"value": payload}
        time_ms = _time(match.group(1), "the time") * 1000.0
        if not math.isfinite(time_ms):
            raise ValueError(f"the time is out of range ({match.group(1)[:40]})")
        return LogEntry(time_ms, match.group(2), payload.get("value"), _metadata(payload.get("metadata")))
    raise ValueError("line starts like an MLPerf log line but matches neither :::MLLOG nor :::MLL")


def read_entries(path: Path) -> list[LogEntry]:
    """All log entries of one result file; a file without any is not an MLPerf log."""
    entries: list[LogEntry] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TraceFormatError(f"cannot read MLPerf log: {exc.strerror}", str(path)) from exc
    for number, line in enumerate(text.splitlines(), 1):
        try:
            entry = parse_line(line)
        except (ValueError, json.JSONDecodeError) as exc:
            raise TraceFormatError(f"line {number}: bad MLPerf log line ({exc})", str(path)) from exc
        if entry is not None:
            entries.append(entry)
    if not entries:
        raise TraceFormatError("no ':::MLLOG' or ':::MLL' lines: not an MLPerf result log", str(path))
    return entries


def is_mlperf_log(path: Path) -> bool:
    """Cheap sniff for discovery: the first MLPerf-looking line within the first 64 KiB."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open
            return False
        with open(path, "rb") as handle:
            head = handle.read(65536)
    except OSError:
        return False
    return b":::MLLOG" in head or b":::MLL " in head


def discover(paths: Iterable[str | Path]) -> list[ResultFolder]:
    """Result folders under the given files/folders; a folder is the parent of ``result_*.txt`` files."""
    folders: dict[Path, ResultFolder] = {}
    for raw in paths:
        path = Path(raw).resolve()
        if not path.exists():
            raise TraceFormatError("no such file or directory", str(raw))
        if path.is_file():
            candidates = [path]
        else:
            candidates = sorted(p for p in path.rglob("*.txt") if p.is_file())
            candidates = [p for p in candidates if p.name.startswith("result_") or is_mlperf_log(p)]
            if not candidates:
                raise TraceFormatError("no MLPerf result logs (result_*.txt) found", str(raw))
        for file in candidates:
            check_utf8_name(file)
            folder = folders.setdefault(file.parent, ResultFolder(file.parent))
            if file not in folder.files:
                folder.files.append(file)
    for folder in folders.values():
        folder.files.sort(key=_result_order)
    return [folders[key] for key in sorted(folders)]


def _result_order(path: Path) -> tuple[int, str]:
    match = re.search(r"(\d+)", path.stem)
    return (int(match.group(1)) if match else -1, path.name)


def platform_scale(platform: str | None) -> tuple[int | None, int | None, str | None]:
    """(cores, chips, framework suffix) from a name like ``tpu-v3-8192-TF``.

    Cloud TPU v2/v3/v4 names count TensorCores, two per chip (catalog §1: tpu-v3-8192 = 4096 chips).
    """
    if not platform:
        return None, None, None
    match = _PLATFORM.match(platform.strip())
    if not match:
        return None, None, None
    generation, cores = int(match.group(1)), int(match.group(2))
    if cores >= 1 << 31:  # the int32 columns (no pod has two billion cores)
        return None, None, match.group(3)
    chips = cores // 2 if generation <= 4 else cores
    return cores, chips, match.group(3)


def _folder_identity(folder: Path) -> tuple[str | None, str | None, str]:
    """(version, system folder name, submitter path) from ``.../v0.7/tpu-v3-8192-TF/resnet``."""
    parts = folder.parts
    for index in range(len(parts) - 1, -1, -1):
        if _VERSION.match(parts[index]):
            rel = "/".join(parts[index:])
            system = parts[index + 1] if index + 1 < len(parts) else None
            return parts[index], system, rel
    system = parts[-2] if len(parts) >= 2 else None
    return None, system, "/".join(parts[-2:])


def _as_int(value: Any) -> int | None:
    """An int64 column's value, None when the logged value is not an integer that fits."""
    if isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if -(1 << 63) <= number < (1 << 63) else None


def _as_float(value: Any) -> float | None:
    """A float column's value, None when the logged value is not a finite number."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _key(value: Any) -> Any:
    """A metadata value usable as a dict key (lists/objects compared as their JSON text)."""
    try:
        hash(value)
    except TypeError:
        return json.dumps(value, sort_keys=True, default=str)
    return value


def _pair(starts: list[LogEntry], stops: list[LogEntry], key: str) -> list[tuple[LogEntry | None,
                                                                                  LogEntry | None]]:
    """Match each stop with the earliest open start before it carrying the same metadata key (epoch);
    when either side lacks the key, with the earliest open start before it.

    Evaluations can overlap training and each other (asynchronous COCO eval in SSD), so pairing by
    the epoch number is what keeps them apart. Unmatched starts or stops stay as half-open pairs.
    """
    open_starts = sorted(starts, key=lambda entry: entry.time_ms)
    used = [False] * len(open_starts)
    pairs: list[tuple[LogEntry | None, LogEntry | None]] = []
    for stop in sorted(stops, key=lambda entry: entry.time_ms):
        wanted = stop.metadata.get(key)
        candidates = [i for i, start in enumerate(open_starts)
                      if not used[i] and start.time_ms <= stop.time_ms]
        same = [i for i in candidates if open_starts[i].metadata.get(key) == wanted]
        loose = [i for i in candidates if wanted is None or open_starts[i].metadata.get(key) is None]
        match = (same or loose or [None])[0]
        if match is not None:
            used[match] = True
        pairs.append((open_starts[match] if match is not None else None, stop))
    pairs.extend((start, None) for i, start in enumerate(open_starts) if not used[i])
    pairs.sort(key=lambda pair: (pair[0] or pair[1]).time_ms)  # type: ignore[union-attr]
    return pairs


def summarize_file(path: Path, folder: Path, entries: Sequence[LogEntry]) -> tuple[dict, list[dict]]:
    """One results row and its interval rows from the entries of one result file."""
    by_key: dict[str, list[LogEntry]] = {}
    for entry in entries:
        by_key.setdefault(entry.key, []).append(entry)

    def first(key: str) -> LogEntry | None:
        found = by_key.get(key)
        return found[0] if found else None

    def value(key: str) -> Any:
        entry = first(key)
        return entry.value if entry is not None else None

    version, system, submitter_path = _folder_identity(folder)
    logged_platform = value("submission_platform")
    platform = str(logged_platform) if logged_platform not in (None, "") else system
    cores, chips, framework = platform_scale(system) if _PLATFORM.match(system or "") else (None, None, None)
    if cores is None:
        cores, chips, framework = platform_scale(platform)
    benchmark = value("submission_benchmark") or value("benchmark") or folder.name

    hyper: dict[str, Any] = {}
    for entry in entries:
        if entry.key in _EVENT_KEYS or entry.key.startswith("submission_"):
            continue
        if isinstance(entry.value, float) and not math.isfinite(entry.value):
            hyper.setdefault(entry.key, repr(entry.value))  # JSON has no NaN/inf: their text
        elif isinstance(entry.value, (int, float, str, bool)) or entry.value is None:
            hyper.setdefault(entry.key, entry.value)
    for key in ("submission_platform", "submission_division", "submission_status", "submission_org"):
        if value(key) is not None:
            hyper[key] = value(key)

    intervals: list[dict] = []

    def add(kind: str, start: LogEntry | None, stop: LogEntry | None, epoch: Any = None,
            epoch_count: Any = None, measured: Any = None) -> None:
        intervals.append({
            "folder": str(folder), "result_file": str(path), "kind": kind,
            "start_ms": start.time_ms if start else None, "stop_ms": stop.time_ms if stop else None,
            "epoch": _as_float(epoch), "epoch_count": _as_float(epoch_count), "value": _as_float(measured),
        })

    for kind in ("init", "run"):
        start, stop = first(f"{kind}_start"), first(f"{kind}_stop")
        if start or stop:
            add(kind, start, stop)
    block_pairs = _pair(by_key.get("block_start", []), by_key.get("block_stop", []), "first_epoch_num")
    for start, stop in block_pairs:
        meta = (start or stop).metadata  # type: ignore[union-attr]
        add("block", start, stop, meta.get("first_epoch_num"), meta.get("epoch_count"))
    for start, stop in _pair(by_key.get("epoch_start", []), by_key.get("epoch_stop", []), "epoch_num"):
        add("epoch", start, stop, (start or stop).metadata.get("epoch_num"))  # type: ignore[union-attr]

    accuracy = {_key(entry.metadata.get("epoch_num")): entry for entry in by_key.get("eval_accuracy", [])}
    eval_pairs = _pair(by_key.get("eval_start", []), by_key.get("eval_stop", []), "epoch_num")
    seen_epochs = set()
    for start, stop in eval_pairs:
        epoch = _key((start or stop).metadata.get("epoch_num"))  # type: ignore[union-attr]
        seen_epochs.add(epoch)
        measured = accuracy.get(epoch)
        add("eval", start, stop, epoch, None, measured.value if measured else None)
    for epoch, entry in accuracy.items():
        if epoch not in seen_epochs:  # eval inside the training block: only its result is logged
            add("eval", entry, entry, epoch, None, entry.value)

    run_start, run_stop = first("run_start"), first("run_stop")
    window = (run_start.time_ms if run_start else None, run_stop.time_ms if run_stop else None)
    eval_ms = None
    if eval_pairs:
        # Wall time with an evaluation in flight, as logged. Asynchronous evaluation (SSD's COCO
        # eval, stamped from the start of the block it overlaps) runs beside training, so this is an
        # upper bound on what evaluation costs the run (catalog §3.10).
        eval_ms = _length(_union([(a.time_ms, b.time_ms) for a, b in eval_pairs if a and b], *window))
    status = None
    if run_stop is not None:
        status = run_stop.metadata.get("status")
        if status is None and isinstance(run_stop.value, dict):
            status = run_stop.value.get("status")
        status = str(status) if status is not None else "unknown"
    elif run_start is not None:
        status = "incomplete"

    result = {
        "folder": str(folder),
        "result_file": str(path),
        "benchmark": str(benchmark),
        "submitter_path": submitter_path,
        "version": version,
        "platform": platform,
        "cores": cores,
        "chips": chips,
        "framework": framework,
        "run_start_ms": run_start.time_ms if run_start else None,
        "run_stop_ms": run_stop.time_ms if run_stop else None,
        "status": status,
        "global_batch_size": _as_int(value("global_batch_size")),
        "opt_name": _optimizer(value("opt_name"), hyper),
        "epochs": _epochs_reached(by_key),
        "eval_count": len(by_key.get("eval_accuracy", [])),
        "eval_ms": eval_ms,
        "train_samples": _as_int(value("train_samples") or value("num_train_examples")),
        "num_lines": len(entries),
        "hyperparameters": json.dumps(hyper, sort_keys=True, default=str),
    }
    return result, intervals


def _union(spans: list[tuple[float, float]], lo: float | None, hi: float | None) -> list[tuple[float, float]]:
    """The union of [start, stop) spans clipped to the run window, as sorted disjoint spans."""
    merged: list[list[float]] = []
    for a, b in sorted((max(a, lo) if lo is not None else a, min(b, hi) if hi is not None else b)
                       for a, b in spans):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _optimizer(logged: Any, hyper: dict[str, Any]) -> str | None:
    """The logged ``opt_name``, else the optimizer the hyperparameter names give away (lars_*, opt_lamb_*).

    Several v0.6/v0.7 logs never log ``opt_name``; their optimizer-specific keys still say which it is.
    """
    if logged is not None:
        return str(logged).lower()
    keys = " ".join(hyper)
    for name in ("lamb", "lars", "adam", "sgd", "momentum"):
        if name in keys:
            return name
    return None


def _epochs_reached(by_key: dict[str, list[LogEntry]]) -> float | None:
    """The epoch of the last evaluation (where the target was met), else the end of the last block.

    In BERT logs an "epoch" is a step (catalog §5); the number is reported as logged.
    """
    evals = [_as_float(e.metadata.get("epoch_num")) for e in by_key.get("eval_accuracy", [])]
    evals = [e for e in evals if e is not None]
    if evals:
        return max(evals)
    ends = []
    for entry in by_key.get("block_start", []):
        first_epoch = _as_float(entry.metadata.get("first_epoch_num"))
        count = _as_float(entry.metadata.get("epoch_count"))
        if first_epoch is not None:
            ends.append(first_epoch + (count or 0.0))
    return max(ends) if ends else None


def load_folder(folder: ResultFolder) -> tuple[list[dict], list[dict]]:
    """Result and interval rows of one result folder."""
    results: list[dict] = []
    intervals: list[dict] = []
    for file in folder.files:
        entries = read_entries(file)
        result, rows = summarize_file(file, folder.path, entries)
        if result["version"] is None:
            result["version"] = _version_from_format(file)
        results.append(result)
        intervals.extend(rows)
    return results, intervals


def _version_from_format(path: Path) -> str:
    """Without a vX.Y folder, the line format tells the era: ':::MLL' is v0.6, ':::MLLOG' later."""
    with open(path, "rb") as handle:
        head = handle.read(65536)
    return "v0.7" if b":::MLLOG" in head else "v0.6"


def load_mlperf(paths: Iterable[str | Path]) -> MlperfTables:
    """Every result file under ``paths`` as Arrow tables (one row per result file / per interval).

    Raises TraceFormatError (naming the file) for a path that holds no MLPerf log or a broken line.
    """
    results: list[dict] = []
    intervals: list[dict] = []
    for folder in discover(paths):
        folder_results, folder_intervals = load_folder(folder)
        results.extend(folder_results)
        intervals.extend(folder_intervals)
    import pyarrow as pa

    results_schema, intervals_schema = _schemas()
    return MlperfTables(pa.Table.from_pylist(results, schema=results_schema),
                        pa.Table.from_pylist(intervals, schema=intervals_schema))

