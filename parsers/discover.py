"""Which runs do the user's paths name? A file, a run folder, a logdir with many runs, or a folder.

Layout written by JAX/TF/XProf: ``<logdir>/plugins/profile/<run>/<host>.xplane.pb`` (one per host),
with ``.hlo_proto.pb`` and other sidecars (ignored) and, from JAX, ``<host>.trace.json.gz`` holding the
same capture as Chrome-trace JSON. Rules (docs/schema.md, "How paths become runs"):

* a run folder (parent ``profile``, grandparent ``plugins``) is one run; its hosts are the
  ``.xplane.pb`` files, or, only when it has none, the ``.trace.json[.gz]`` files;
* a single file named directly is a run of its own (even a ``.trace.json.gz`` beside an xplane);
* any other folder is searched recursively: each run folder inside is a run, and each other trace
  file is a run of its own (generic ``.json[.gz]`` only when it looks like a Chrome trace);
* MLPerf result logs ride along (:func:`discover_inputs`): a file that is not a trace but holds
  ``:::MLLOG``/``:::MLL`` lines, and, while walking, ``*.txt``/``*.log``/``result_*`` files that do
  (only those names are sniffed, so a big logdir costs no extra reads). The MLPerf reader groups
  them into result folders (one run each).

A URL (``gs://bucket/logdir``, ``file:///...``: any fsspec protocol) is listed with fsspec under the
same rules; its runs' ``source_path`` and host files are URL strings (read through a local copy,
``parsers/remote.py``). MLPerf logs are read from local paths only: a URL walk does not sniff for them.
"""

from __future__ import annotations

import gzip
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from tpuanalyze.parsers.mlperf import is_mlperf_log
from tpuanalyze.parsers.remote import filesystem, is_url, read_head
from tpuanalyze.parsers.trace_file import check_utf8_name, file_kind, is_regular_file

from tpuanalyze.errors import TpuAnalyzeError, TraceFormatError

XSPACE_SUFFIX = ".xplane.pb"
TRACE_JSON_SUFFIXES = (".trace.json", ".trace.json.gz")
JSON_SUFFIXES = (".json", ".json.gz")
MLPERF_SNIFF_SUFFIXES = (".txt", ".log")  # plus names starting with MLPERF_SNIFF_PREFIX
MLPERF_SNIFF_PREFIX = "result_"


@dataclass
class RunSource:
    """One run to ingest: its files (one per host) and how they are encoded."""

    name: str
    source_path: str
    source_format: str  # 'xspace' | 'chrome_json'
    files: list[tuple[str, Path | str]]  # (host, file): a local Path, or a URL string
    notes: list[str] = field(default_factory=list)


@dataclass
class Inputs:
    """What the user's paths name: trace runs and MLPerf result log files (absolute, each once)."""

    runs: list[RunSource] = field(default_factory=list)
    mlperf_files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # files skipped while walking, and why


def host_name(path: Path) -> str:
    """``<host>.xplane.pb`` / ``<host>.trace.json.gz`` / ``<name>.json`` -> host name."""
    name = path.name
    for suffix in (XSPACE_SUFFIX, *TRACE_JSON_SUFFIXES[::-1], *JSON_SUFFIXES[::-1]):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return path.stem


def is_run_folder(path: Path) -> bool:
    return path.is_dir() and path.parent.name == "profile" and path.parent.parent.name == "plugins"


def file_format(path: Path) -> str | None:
    """'xspace' | 'chrome_json' by file name, else None."""
    name = path.name
    if name.endswith(XSPACE_SUFFIX):
        return "xspace"
    if name.endswith(JSON_SUFFIXES):
        return "chrome_json"
    return None


def looks_like_chrome_trace(path: Path, probe_bytes: int = 1 << 20) -> bool:
    """Cheap sniff for generic ``.json[.gz]`` met while walking folders (explicit files skip this)."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                head = fh.read(probe_bytes)
        else:
            with open(path, "rb") as fh:
                head = fh.read(probe_bytes)
    except (OSError, EOFError):
        return False
    return _chrome_trace_head(head)


def _chrome_trace_head(head: bytes) -> bool:
    stripped = head.lstrip()
    return b'"traceEvents"' in head or (stripped.startswith(b"[") and b'"ph"' in head)


def worth_mlperf_sniff(path: Path) -> bool:
    """Names a walk sniffs for MLPerf lines: ``*.txt``, ``*.log``, ``result_*`` (never trace files)."""
    name = path.name
    return file_format(path) is None and (
        name.endswith(MLPERF_SNIFF_SUFFIXES) or name.startswith(MLPERF_SNIFF_PREFIX)
    )


def _regular(paths: list[Path], notes: list[str]) -> list[Path]:
    """The regular files among trace-named ``paths``; a FIFO, device, socket or broken link named
    like a trace is skipped with a note (opening a FIFO would block forever)."""
    kept = []
    for path in paths:
        if is_regular_file(path):
            kept.append(path)
        elif file_format(path) is not None and not path.is_dir():
            notes.append(f"{path}: skipped, not a regular file")
    return kept


def _run_from_folder(folder: Path, notes: list[str] | None = None) -> RunSource | None:
    files = _regular(sorted(folder.iterdir()), notes if notes is not None else [])
    xspaces = [p for p in files if p.name.endswith(XSPACE_SUFFIX)]
    jsons = [p for p in files if p.name.endswith(TRACE_JSON_SUFFIXES)]
    resolved = str(folder.resolve())
    if xspaces:
        notes = [
            f"{p.name}: skipped, same capture as the .xplane.pb (XSpace preferred; name the file to read it)"
            for p in jsons
        ]
        return RunSource(folder.name, resolved, "xspace", [(host_name(p), p) for p in xspaces], notes)
    if jsons:
        return RunSource(folder.name, resolved, "chrome_json", [(host_name(p), p) for p in jsons])
    return None


NOT_A_TRACE = (
    "not a trace file or MLPerf result log (expected .xplane.pb, .trace.json, .trace.json.gz, "
    ".json, .json.gz, or ':::MLLOG'/':::MLL' lines)"
)


def _run_from_file(path: Path) -> RunSource:
    fmt = file_format(path)
    if fmt is None:
        raise TraceFormatError(NOT_A_TRACE, str(path))
    host = host_name(path)
    name = path.parent.name if is_run_folder(path.parent) else host
    return RunSource(name, str(path.resolve()), fmt, [(host, path)])


def _walk(root: Path, found: Inputs) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        if is_run_folder(here):
            run = _run_from_folder(here, found.notes)
            if run:
                found.runs.append(run)
            dirnames[:] = []  # nothing below a run folder is a separate run
            continue
        for path in _regular([here / name for name in sorted(filenames)], found.notes):
            name = path.name
            fmt = file_format(path)
            if fmt == "xspace" or name.endswith(TRACE_JSON_SUFFIXES):
                found.runs.append(_run_from_file(path))
            elif fmt == "chrome_json" and looks_like_chrome_trace(path):
                found.runs.append(_run_from_file(path))
            elif worth_mlperf_sniff(path) and is_mlperf_log(path):
                found.mlperf_files.append(path.resolve())


def discover_inputs(paths: list[str | Path]) -> Inputs:
    """Trace runs and MLPerf logs named by the paths, in order, each once. Missing paths are errors,
    and so is a folder holding neither."""
    inputs = Inputs()
    seen: set[str] = set()
    seen_files: set[str] = set()
    for raw in paths:
        if is_url(raw):
            _add_found(inputs, _url_inputs(str(raw)), seen, seen_files)
            continue
        path = Path(raw)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise TraceFormatError("no such file or directory", str(raw)) from None
        except OSError as exc:  # a symlink loop, a permission problem
            raise TraceFormatError(f"cannot read: {exc.strerror or exc}", str(raw)) from None
        if stat.S_ISDIR(mode):
            path = path.resolve()  # a symlink to a run folder is that run folder, read once
        elif not stat.S_ISREG(mode):
            raise TraceFormatError(f"not a regular file ({file_kind(mode)})", str(raw))
        found = Inputs()
        if stat.S_ISREG(mode):
            if file_format(path) is None and is_mlperf_log(path):
                found.mlperf_files.append(path.resolve())
            else:
                found.runs.append(_run_from_file(path))
        elif is_run_folder(path):
            run = _run_from_folder(path, found.notes)
            if run is None:
                raise TraceFormatError("run folder holds no .xplane.pb or .trace.json[.gz] file", str(raw))
            found.runs.append(run)
        else:
            _walk(path, found)
            if not found.runs and not found.mlperf_files:
                raise TraceFormatError(
                    "no trace files (.xplane.pb, .trace.json[.gz]) or MLPerf result logs found", str(raw)
                )
        _add_found(inputs, found, seen, seen_files)
    return inputs


def _file_key(path: Path | str) -> str:
    """What tells two files apart: a local file's resolved path, a URL as given by the listing."""
    return path if isinstance(path, str) else str(path.resolve())


def _add_found(inputs: Inputs, found: Inputs, seen: set[str], seen_files: set[str]) -> None:
    """Add what one of the user's paths named: each run and log once."""
    inputs.notes.extend(found.notes)
    for file in [p for run in found.runs for _, p in run.files] + found.mlperf_files:
        check_utf8_name(file)
    for run in found.runs:
        files = {_file_key(p) for _, p in run.files}
        if run.source_path in seen:
            continue
        if files <= seen_files:  # e.g. a symlink to a file of a run already found
            inputs.notes.append(f"{run.source_path}: skipped, its files are already part of another run")
            continue
        seen.add(run.source_path)
        seen_files.update(files)
        inputs.runs.append(run)
    for file in found.mlperf_files:
        if str(file) not in seen:
            seen.add(str(file))
            inputs.mlperf_files.append(file)


def _url_is_run_folder(path: str) -> bool:
    folder = PurePosixPath(path)
    return folder.parent.name == "profile" and folder.parent.parent.name == "plugins"


def _url_run_from_folder(fs: Any, folder: str, files: list[str]) -> RunSource | None:
    """As ``_run_from_folder``, for the file paths listed in a URL's run folder."""
    names = sorted(files)
    xspaces = [p for p in names if p.endswith(XSPACE_SUFFIX)]
    jsons = [p for p in names if p.endswith(TRACE_JSON_SUFFIXES)]
    name = PurePosixPath(folder).name
    url = fs.unstrip_protocol(folder)
    hosts = xspaces or jsons
    if not hosts:
        return None
    notes = []
    if xspaces:
        notes = [
            f"{PurePosixPath(p).name}: skipped, same capture as the .xplane.pb (XSpace preferred; "
            "name the file to read it)"
            for p in jsons
        ]
    files_of = [(host_name(PurePosixPath(p)), fs.unstrip_protocol(p)) for p in hosts]
    return RunSource(name, url, "xspace" if xspaces else "chrome_json", files_of, notes)


def _url_run_from_file(fs: Any, path: str) -> RunSource:
    fmt = file_format(PurePosixPath(path))
    url = fs.unstrip_protocol(path)
    if fmt is None:
        raise TraceFormatError(NOT_A_TRACE, url)
    host = host_name(PurePosixPath(path))
    name = PurePosixPath(path).parent.name if _url_is_run_folder(str(PurePosixPath(path).parent)) else host
    return RunSource(name, url, fmt, [(host, url)])


def _url_reason(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file or directory"
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"cannot read: {getattr(exc, 'strerror', None) or text or type(exc).__name__}"


def _url_walk(fs: Any, folder: str) -> Iterator[tuple[str, list[str]]]:
    """(folder, its files) top-down in name order, as ``_walk`` visits a local tree; nothing below a
    run folder (it is one run)."""
    entries = fs.ls(folder, detail=True)
    files = sorted(e["name"] for e in entries if e.get("type") == "file")
    yield folder, files
    if _url_is_run_folder(folder):
        return
    for sub in sorted(e["name"] for e in entries if e.get("type") == "directory"):
        if sub.rstrip("/") != folder.rstrip("/"):
            yield from _url_walk(fs, sub)


def _url_inputs(url: str) -> Inputs:
    """What a URL names, by the local rules: a trace file, a run folder, or a folder walked for both
    (generic ``.json[.gz]`` kept when its head looks like a Chrome trace)."""
    fs, root = filesystem(url)
    found = Inputs()
    try:
        info = fs.info(root)
        if info.get("type") != "directory":
            found.runs.append(_url_run_from_file(fs, root))
            return found
        if _url_is_run_folder(root):
            files = [e["name"] for e in fs.ls(root, detail=True) if e.get("type") == "file"]
            run = _url_run_from_folder(fs, root, files)
            if run is None:
                raise TraceFormatError("run folder holds no .xplane.pb or .trace.json[.gz] file", url)
            found.runs.append(run)
            return found
        for here, files in _url_walk(fs, root):
            if _url_is_run_folder(here):
                run = _url_run_from_folder(fs, here, files)
                if run:
                    found.runs.append(run)
                continue
            for path in files:
                fmt = file_format(PurePosixPath(path))
                if fmt == "xspace" or path.endswith(TRACE_JSON_SUFFIXES):
                    found.runs.append(_url_run_from_file(fs, path))
                elif fmt == "chrome_json" and _chrome_trace_head(read_head(fs, path, 1 << 20)):
                    found.runs.append(_url_run_from_file(fs, path))
    except TpuAnalyzeError:
        raise
    except Exception as exc:  # any backend's error (missing, permission, HTTP) is one line
        raise TraceFormatError(_url_reason(exc), url) from None
    if not found.runs:
        raise TraceFormatError("no trace files (.xplane.pb, .trace.json[.gz]) found", url)
    return found


def discover(paths: list[str | Path]) -> list[RunSource]:
    """The trace runs named by the paths (MLPerf logs among them are left out: see discover_inputs)."""
    return discover_inputs(paths).runs
