"""XSpace (``*.xplane.pb``) reader: one host file -> the staging Arrow tables of ``parsers.staging``.

Speed matters (2M+ events per host): the protobuf is parsed by upb in C, and every per-event field is
pulled out with one list comprehension per field over the repeated container, never per-event
Python logic. Event stats are flattened per plane into a long table; DuckDB pivots them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError
from tpuanalyze.parsers.staging import (
    EVENT_SCHEMA,
    LINE_SCHEMA,
    META_SCHEMA,
    PLANE_SCHEMA,
    TYPED_COLUMNS,
    TYPED_STATS,
    HostTables,
    StatColumns,
    classify_plane,
    json_safe,
    typed_value,
)

from tpuanalyze.errors import TraceFormatError
from tpuanalyze.proto import xplane_pb2

XSPACE_SUFFIX = ".xplane.pb"

# XStat oneof field -> small integer code used to split a plane's stats into typed columns.
_KIND_CODE = {
    "int64_value": 0,
    "uint64_value": 1,
    "double_value": 2,
    "str_value": 3,
    "bytes_value": 4,
    "ref_value": 5,
    None: 6,
}
_MODULE_PROGRAM_ID = re.compile(r"\((\d+)\)$")


def host_name_for(path: Path) -> str:
    """``<host>.xplane.pb`` -> ``<host>``."""
    name = path.name
    return name[: -len(XSPACE_SUFFIX)] if name.endswith(XSPACE_SUFFIX) else path.stem


def parse_xspace(path: str | Path) -> xplane_pb2.XSpace:
    """Parse and sanity-check one XSpace file; any problem is a one-line ``TraceFormatError``.

    Protobuf parsing of garbage can "succeed", so beyond DecodeError this refuses files whose top
    level or planes carry unknown fields, or that hold no named plane.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceFormatError("no such file", str(path)) from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc.strerror or exc}", str(path)) from None
    if not data:
        raise TraceFormatError("empty file", str(path))
    if data[:2] == b"\x1f\x8b":
        raise TraceFormatError("gzip-compressed data, not a raw XSpace protobuf", str(path))
    space = xplane_pb2.XSpace()
    try:
        space.ParseFromString(data)
    except DecodeError as exc:
        raise TraceFormatError(f"corrupt or truncated XSpace protobuf ({exc})", str(path)) from None
    except Exception as exc:  # upb may raise other errors on pathological input
        raise TraceFormatError(f"cannot parse as XSpace protobuf ({exc})", str(path)) from None
    _validate(space, str(path))
    return space


def _validate(space: xplane_pb2.XSpace, path: str) -> None:
    if len(unknown_fields.UnknownFieldSet(space)):
        raise TraceFormatError("not an XSpace protobuf (unknown top-level fields)", path)
    if not space.planes:
        raise TraceFormatError("XSpace holds no planes", path)
    if not any(plane.name for plane in space.planes):
        raise TraceFormatError("not an XSpace protobuf (no plane has a name)", path)
    for plane in space.planes:
        if len(unknown_fields.UnknownFieldSet(plane)):
            raise TraceFormatError(f"corrupt XSpace: plane {plane.name!r} has unknown fields", path)
        for line in plane.lines:
            if len(unknown_fields.UnknownFieldSet(line)):
                raise TraceFormatError(
                    f"corrupt XSpace: line {line.name!r} of plane {plane.name!r} has unknown fields", path
                )


def scalar_stat(stat: xplane_pb2.XStat, stat_names: dict[int, str]) -> Any:
    """One stat's Python value; a ref resolves to the referenced stat-metadata name."""
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(stat, kind)
    if kind == "ref_value":
        return stat_names.get(value, f"ref#{value}")
    return value


def _stat_dict(stats: Any, stat_names: dict[int, str]) -> dict[str, Any]:
    return {stat_names.get(s.metadata_id, f"stat#{s.metadata_id}"): scalar_stat(s, stat_names) for s in stats}


def _split_stats(
    flat: list[Any], ev_rows: np.ndarray, stat_names: dict[int, str], out: StatColumns
) -> None:
    """Flattened XStats of one plane -> typed long-table columns (one vectorised pass per kind)."""
    m = len(flat)
    mids = [s.metadata_id for s in flat]
    kinds = [s.WhichOneof("value") for s in flat]
    values = np.empty(m, dtype=object)
    values[:] = [getattr(s, k) if k else None for s, k in zip(flat, kinds, strict=False)]
    codes = np.fromiter((_KIND_CODE[k] for k in kinds), dtype=np.int8, count=m)
    keys = pa.array([stat_names.get(i) or f"stat#{i}" for i in mids], pa.string())

    def numeric(code: int, dtype: type, pa_type: pa.DataType) -> pa.Array:
        mask = codes == code
        full = np.zeros(m, dtype=dtype)
        if mask.any():
            full[mask] = values[mask].astype(dtype)
        return pa.array(full, type=pa_type, mask=~mask)

    i64 = numeric(0, np.int64, pa.int64())
    u64 = numeric(1, np.uint64, pa.uint64())
    f64_mask = codes == 2
    text = np.full(m, None, dtype=object)
    if f64_mask.any():
        doubles = values[f64_mask].astype(np.float64)
        bad = ~np.isfinite(doubles)
        if bad.any():  # NaN/inf are not JSON numbers: keep them as text
            idx = np.flatnonzero(f64_mask)[bad]
            text[idx] = [repr(float(v)) for v in values[idx]]
            f64_mask[idx] = False
    f64_full = np.zeros(m, dtype=np.float64)
    f64_full[f64_mask] = values[f64_mask].astype(np.float64)
    f64 = pa.array(f64_full, type=pa.float64(), mask=~f64_mask)
    str_mask = codes == 3
    text[str_mask] = values[str_mask]
    for idx in np.flatnonzero(codes == 4):
        text[idx] = json_safe(values[idx])
    ref_idx = np.flatnonzero(codes == 5)
    if len(ref_idx):
        text[ref_idx] = [stat_names.get(v, f"ref#{v}") for v in values[ref_idx]]
    out.add(ev_rows, keys, i64, u64, f64, pa.array(text, type=pa.string()))


def _host_t0_ns(space: xplane_pb2.XSpace) -> int | None:
    stamps = [line.timestamp_ns for plane in space.planes for line in plane.lines if len(line.events)]
    return min(stamps) if stamps else None


def read_xspace(path: str | Path, host: str | None = None) -> HostTables:
    """Read one ``.xplane.pb`` into staging tables (times relative to this host's first line)."""
    path = Path(path)
    space = parse_xspace(path)
    host = host or host_name_for(path)
    t0_ns = _host_t0_ns(space)
    base_ns = t0_ns or 0

    plane_rows: dict[str, list[Any]] = {f.name: [] for f in PLANE_SCHEMA}
    line_rows: dict[str, list[Any]] = {f.name: [] for f in LINE_SCHEMA}
    event_chunks: list[pa.Table] = []
    meta_chunks: list[pa.Table] = []
    stats_out = StatColumns()
    metadata: dict[str, Any] = {}
    ev_row = 0

    for plane_index, plane in enumerate(space.planes):
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        kind, ordinal = classify_plane(plane.name)
        plane_stats = {k: json_safe(v) for k, v in _stat_dict(plane.stats, stat_names).items()}
        if plane.name == "Task Environment":
            metadata.update({k: v for k, v in plane_stats.items() if k.startswith("profile_")})

        plane_events = 0
        flat_stats: list[Any] = []
        stat_owner: list[np.ndarray] = []
        module_md_ids: set[int] = set()
        for line_index, line in enumerate(plane.lines):
            events = line.events
            n = len(events)
            line_rows["plane_index"].append(plane_index)
            line_rows["line_index"].append(line_index)
            line_rows["line_id"].append(line.id)
            line_rows["display_id"].append(line.display_id)
            line_rows["name"].append(line.name)
            line_rows["display_name"].append(line.display_name or None)
            line_rows["timestamp_ns"].append(line.timestamp_ns)
            line_rows["duration_ps"].append(line.duration_ps)
            line_rows["num_events"].append(n)
            if not n:
                continue
            md_ids = np.fromiter((e.metadata_id for e in events), dtype=np.int64, count=n)
            offsets = np.fromiter((e.offset_ps for e in events), dtype=np.int64, count=n)
            durations = np.fromiter((e.duration_ps for e in events), dtype=np.int64, count=n)
            occurrences = np.fromiter((e.num_occurrences for e in events), dtype=np.int64, count=n)
            starts = offsets + (line.timestamp_ns - base_ns) * 1000
            rows = np.arange(ev_row, ev_row + n, dtype=np.int64)
            event_chunks.append(
                pa.Table.from_arrays(
                    [
                        pa.array(rows),
                        pa.array(np.full(n, plane_index, dtype=np.int32)),
                        pa.array(np.full(n, line_index, dtype=np.int32)),
                        pa.array(md_ids),
                        pa.array(starts),
                        pa.array(durations),
                        pa.array(occurrences, mask=occurrences == 0),
                    ],
                    schema=EVENT_SCHEMA,
                )
            )
            stat_lists = [e.stats for e in events]
            counts = np.fromiter((len(s) for s in stat_lists), dtype=np.int64, count=n)
            if counts.any():
                flat_stats.extend([s for ss in stat_lists for s in ss])
                stat_owner.append(np.repeat(rows, counts))
            if line.name == "XLA Modules":
                module_md_ids.update(np.unique(md_ids).tolist())
            ev_row += n
            plane_events += n
        if flat_stats:
            _split_stats(flat_stats, np.concatenate(stat_owner), stat_names, stats_out)
        meta_chunks.append(_metadata_table(plane, plane_index, stat_names, module_md_ids))

        plane_rows["plane_index"].append(plane_index)
        plane_rows["plane_id"].append(plane.id)
        plane_rows["name"].append(plane.name)
        plane_rows["kind"].append(kind)
        plane_rows["device_ordinal"].append(ordinal)
        plane_rows["device_type"].append(_as_str(plane_stats.get("device_type_string")))
        plane_rows["peak_tflops"].append(_as_float(plane_stats.get("peak_teraflops_per_second")))
        plane_rows["peak_hbm_bw_gbps"].append(_as_float(plane_stats.get("peak_hbm_bw_gigabytes_per_second")))
        plane_rows["num_lines"].append(len(plane.lines))
        plane_rows["num_events"].append(plane_events)
        plane_rows["stats"].append(json.dumps(plane_stats) if plane_stats else None)

    return HostTables(
        host=host,
        file_path=str(path.resolve()),
        file_bytes=path.stat().st_size,
        source_format="xspace",
        t0_ns=t0_ns,
        planes=pa.Table.from_pydict(plane_rows, schema=PLANE_SCHEMA),
        lines=pa.Table.from_pydict(line_rows, schema=LINE_SCHEMA),
        events=pa.concat_tables(event_chunks) if event_chunks else EVENT_SCHEMA.empty_table(),
        stats=stats_out.table(),
        meta=pa.concat_tables(meta_chunks) if meta_chunks else META_SCHEMA.empty_table(),
        hostnames=list(space.hostnames),
        errors=list(space.errors),
        warnings=list(space.warnings),
        metadata=metadata,
    )


def _as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _as_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _metadata_table(
    plane: xplane_pb2.XPlane, plane_index: int, stat_names: dict[int, str], module_md_ids: set[int]
) -> pa.Table:
    """Per event-metadata row: name, display name, typed stat columns, other stats as JSON.

    ``hlo_module``: an 'XLA Modules' event's name is the module; an op whose ``program_id`` matches
    a module's ``name(program_id)`` suffix inherits that module name.
    """
    columns: dict[str, list[Any]] = {f.name: [] for f in META_SCHEMA}
    typed_rows: list[dict[str, Any]] = []
    for md_id, md in plane.event_metadata.items():
        typed: dict[str, Any] = {}
        other: dict[str, Any] = {}
        for stat in md.stats:
            name = stat_names.get(stat.metadata_id, f"stat#{stat.metadata_id}")
            value = scalar_stat(stat, stat_names)
            target = TYPED_STATS.get(name)
            coerced = typed_value(target[1], value) if target else None
            if target and coerced is not None and target[0] not in typed:
                typed[target[0]] = coerced
            else:
                other[name] = json_safe(value)
        if md_id in module_md_ids and "hlo_module" not in typed:
            typed["hlo_module"] = md.name
        columns["plane_index"].append(plane_index)
        columns["md_id"].append(md_id)
        columns["name"].append(md.name)
        columns["display_name"].append(md.display_name or None)
        columns["stats"].append(json.dumps(other) if other else None)
        typed_rows.append(typed)

    modules_by_program: dict[int, str] = {}
    for md_id in module_md_ids:
        md = plane.event_metadata.get(md_id)
        match = _MODULE_PROGRAM_ID.search(md.name) if md is not None else None
        if match:
            modules_by_program[int(match.group(1))] = md.name
    for typed in typed_rows:
        if "hlo_module" not in typed and typed.get("program_id") in modules_by_program:
            typed["hlo_module"] = modules_by_program[typed["program_id"]]
    for column, _ in TYPED_COLUMNS:
        columns[column] = [typed.get(column) for typed in typed_rows]
    return pa.Table.from_pydict(columns, schema=META_SCHEMA)


def plane_summary(space: xplane_pb2.XSpace) -> list[dict[str, Any]]:
    """Planes/lines/event counts in file order (used by tests and ``--dry-run`` style checks)."""
    return [
        {"name": p.name, "lines": [{"name": ln.name, "events": len(ln.events)} for ln in p.lines]}
        for p in space.planes
    ]


__all__ = ["parse_xspace", "read_xspace", "host_name_for", "scalar_stat", "plane_summary"]
