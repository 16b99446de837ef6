"""Which runs do the user's paths name? A file, a run folder, a logdir with many runs, or a folder.

Layout written by JAX/TF/XProf: ``<logdir>/plugins/profile/<run>/<host>.xplane.pb`` (one per host),
with ``.hlo_proto.pb`` and other sidecars (ignored) and, from JAX, ``<host>.trace.json.gz`` holding the
same capture as Chrome-trace JSON. Rules (docs/schema.md, "How paths become runs"):

* a run folder (parent ``profile``, grandparent ``plugins``) is one run; its hosts are the
  ``.xplane.pb`` files, or, only when it has none, the ``.trace.json[.gz]`` files;
* a single file named directly is a run of its own (even a ``.trace.json.gz`` beside an xplane);
* any other folder is searched recursively: each run folder inside is a run, and each other trace
  file is a run of its own (generic ``.json[.gz]`` only when it looks like a Chrome trace).
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path

from tpuanalyze.errors import TraceFormatError

XSPACE_SUFFIX = ".xplane.pb"
TRACE_JSON_SUFFIXES = (".trace.json", ".trace.json.gz")
JSON_SUFFIXES = (".json", ".json.gz")


@dataclass
class RunSource:
    """One run to ingest: its files (one per host) and how they are encoded."""

    name: str
    source_path: str
    source_format: str  # 'xspace' | 'chrome_json'
    files: list[tuple[str, Path]]  # (host, file)
    notes: list[str] = field(default_factory=list)


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
    stripped = head.lstrip()
    return b'"traceEvents"' in head or (stripped.startswith(b"[") and b'"ph"' in head)


def _run_from_folder(folder: Path) -> RunSource | None:
    files = sorted(p for p in folder.iterdir() if p.is_file())
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


def _run_from_file(path: Path) -> RunSource:
    fmt = file_format(path)
    if fmt is None:
        raise TraceFormatError(
            "not a trace file (expected .xplane.pb, .trace.json, .trace.json.gz, .json or .json.gz)",
            str(path),
        )
    host = host_name(path)
    name = path.parent.name if is_run_folder(path.parent) else host
    return RunSource(name, str(path.resolve()), fmt, [(host, path)])


def _walk(root: Path) -> list[RunSource]:
    runs: list[RunSource] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        if is_run_folder(here):
            run = _run_from_folder(here)
            if run:
                runs.append(run)
            dirnames[:] = []  # nothing below a run folder is a separate run
            continue
        for name in sorted(filenames):
            path = here / name
            fmt = file_format(path)
            if fmt == "xspace" or name.endswith(TRACE_JSON_SUFFIXES):
                runs.append(_run_from_file(path))
            elif fmt == "chrome_json" and looks_like_chrome_trace(path):
                runs.append(_run_from_file(path))
    return runs


def discover(paths: list[str | Path]) -> list[RunSource]:
    """Runs named by the paths, in order, each source path once. Missing paths are errors."""
    runs: list[RunSource] = []
    seen: set[str] = set()
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise TraceFormatError("no such file or directory", str(raw))
        if path.is_file():
            found = [_run_from_file(path)]
        elif is_run_folder(path):
            run = _run_from_folder(path)
            if run is None:
                raise TraceFormatError("run folder holds no .xplane.pb or .trace.json[.gz] file", str(raw))
            found = [run]
        else:
            found = _walk(path)
            if not found:
                raise TraceFormatError("no trace files found (.xplane.pb, .trace.json[.gz])", str(raw))
        for run in found:
            if run.source_path not in seen:
                seen.add(run.source_path)
                runs.append(run)
    return runs
