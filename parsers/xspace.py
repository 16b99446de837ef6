"""XSpace (``*.xplane.pb``) reader: one host file -> plane-by-plane numpy event batches.

Speed (2M+ events per host): upb parses each plane into a *skeleton* whose ``XLine.events`` are
left as raw bytes, so no Python object is ever made per event; ``parsers.wire`` then decodes the
events (and their stats) of up to ``CHUNK_EVENTS`` events at a time with numpy. Planes, lines and
event/stat metadata (thousands, not millions) are read through the normal message API.
Files with many events (``COMPILED_MIN_EVENTS``) are decoded by the compiled kernels of
``parsers.wire_jit`` instead (one pass over the bytes, GIL released); smaller ones, and a file its
caller asks to read with numpy (``decoder='numpy'``: one file loaded into the database, whose inserts
set the pace), keep the numpy decoder, which needs no numba import. Both give the same batches.
Memory: the file is never held whole; only its top-level field headers are walked, and each
plane is read from its byte range when needed (validation, then streaming).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields
from google.protobuf.message import DecodeError
from tpuanalyze.parsers import wire
from tpuanalyze.parsers.staging import (
    CHUNK_EVENTS,
    LINE_COLUMNS,
    MAX_LINES,
    MAX_PLANES,
    MAX_SPAN_NS,
    MAX_SPAN_PS,
    STAT_DOUBLE,
    STAT_INT,
    STAT_TEXT,
    STAT_UINT,
    Columns,
    EventBatch,
    PlaneData,
    PlaneInfo,
    StatLong,
    classify_plane,
    distinct_ids,
    empty_lines,
    first_bad_time,
    json_safe,
    lines_columns,
    metadata_table,
    stat_key_codes,
    text_column,
)
from tpuanalyze.parsers.trace_file import open_trace_file, read_trace_file
from tpuanalyze.parsers.xspace_metadata import decode_metadata, key_order

from tpuanalyze.errors import TraceFormatError
from tpuanalyze.proto import xplane_pb2

XSPACE_SUFFIX = ".xplane.pb"
# Files with at least this many events are decoded by the compiled kernels (parsers.wire_jit):
# importing numba and loading its cached kernels costs 1-2 CPU s and ~120 MB of RSS once per
# process, which the kernels (~0.7 CPU us per event less than the numpy decoder) pay back from
# ~2.5M events on (benchmarks/results/bench_decode.md); smaller files keep the numpy decoder.
COMPILED_MIN_EVENTS = 3_000_000
# The warm-up starts as soon as the validation pass has counted COMPILED_MIN_EVENTS events, so it
# overlaps the rest of the pass. It used to start when a file of 60 MB or more was opened (20 bytes an
# event, as on TPU core lines): a file of stat-heavy events (a GPU capture's ~107 bytes) then paid for
# numba and was decoded with numpy all the same (`report` of 1M such events: 6.2-6.7 s and 1.33 GB
# against 5.5 s and 1.20 GB; benchmarks/results/bench_ingest.md).
# Events one process reads in an ingest from which every file of it is decoded by the compiled
# kernels (``XSpaceReader.use_compiled``): they save ~1.4 CPU us per event of a pod host over the
# numpy decoder (small planes decoded together), so loading them (~1.5 CPU s) pays from ~1.1M on.
COMPILED_SHARE_EVENTS = 2_000_000
COMPILED_SHARE_FILES = 8  # host files per process, at least (many small hosts, not a few large ones)
_MODULE_PROGRAM_ID = re.compile(r"\((\d+)\)$")
# Consecutive planes of fewer than CHUNK_EVENTS events are decoded together, up to this many events
# and plane bytes: a pod host's ~20 planes of ~2K events each cost a decoder call apiece (~1 ms of
# numpy call overhead each, more than decoding the events), now a few per host. No more than a
# batch's events: 4x as many cut no more CPU (fresh pages for the larger temporaries: twice the
# page faults) and held 13 MB more.
GROUP_EVENTS = CHUNK_EVENTS
GROUP_BYTES = 4 << 20  # the group's plane bytes are held (and copied once) while it is decoded


def host_name_for(path: Path) -> str:
    """``<host>.xplane.pb`` -> ``<host>``."""
    name = path.name
    return name[: -len(XSPACE_SUFFIX)] if name.endswith(XSPACE_SUFFIX) else path.stem


def _skeleton_classes() -> dict[str, type]:
    """XSpace message classes that leave the bulky repeated fields as raw bytes, one level at a time.

    ``XSpace.planes``, ``XPlane.lines`` and ``XLine.events`` become ``repeated bytes``: one plane
    and one line are expanded at a time, and events are decoded
    from their bytes by ``parsers.wire`` (never one Python object per event).
    """
    fdp = descriptor_pb2.FileDescriptorProto()
    xplane_pb2.DESCRIPTOR.CopyToProto(fdp)
    old, new = f".{fdp.package}.", ".tpuanalyze.xplane_skeleton."
    fdp.name, fdp.package = "tpuanalyze_xplane_skeleton.proto", "tpuanalyze.xplane_skeleton"
    raw_fields = {("XSpace", "planes"), ("XPlane", "lines"), ("XLine", "events")}
    for message in fdp.message_type:
        for nested in [message, *message.nested_type]:
            for fld in nested.field:
                if fld.type_name:
                    fld.type_name = fld.type_name.replace(old, new)
                if (nested.name, fld.name) in raw_fields:
                    fld.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
                    fld.ClearField("type_name")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"tpuanalyze.xplane_skeleton.{name}")
        )
        for name in ("XSpace", "XPlane", "XLine")
    }


_SKELETON = _skeleton_classes()


def _parse_part(kind: str, data: bytes, path: str, where: str) -> Any:
    message = _SKELETON[kind]()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        detail = str(exc).rsplit(": ", 1)[-1]  # drop upb's internal message-type prefix
        raise TraceFormatError(f"corrupt or truncated XSpace protobuf in {where} ({detail})", path) from None
    except Exception as exc:  # upb may raise other errors on pathological input
        raise TraceFormatError(f"cannot parse {where} as XSpace protobuf ({exc})", path) from None
    if len(unknown_fields.UnknownFieldSet(message)):
        raise TraceFormatError(f"corrupt XSpace: {where} has unknown fields", path)
    return message


_LINES_TAG = (xplane_pb2.XPlane.DESCRIPTOR.fields_by_name["lines"].number << 3) | 2
_EVENT_TAG = (xplane_pb2.XLine.DESCRIPTOR.fields_by_name["events"].number << 3) | 2  # one byte
_METADATA_TAG = (xplane_pb2.XPlane.DESCRIPTOR.fields_by_name["event_metadata"].number << 3) | 2
_TRUNCATED = "corrupt or truncated XSpace protobuf in the file (truncated field)"


def _read_varint(handle: BinaryIO, where: str) -> int:
    value = shift = 0
    while True:
        byte = handle.read(1)
        if not byte or shift > 63:
            raise TraceFormatError("corrupt or truncated XSpace protobuf in the file (bad varint)", where)
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7


def _split_planes(handle: BinaryIO, end: int, where: str) -> tuple[list[tuple[int, int]], bytes]:
    """Top level of an XSpace: (offset, size) of each ``planes`` field, and the other fields' bytes.

    Reads only the top-level field headers (a few dozen) and seeks over the planes, so the file
    is never held in memory; the remaining fields (hostnames, errors, warnings, anything
    unknown) are parsed and checked by upb.
    """
    ranges: list[tuple[int, int]] = []
    rest: list[bytes] = []
    pos = 0
    handle.seek(0)
    while pos < end:
        field_start = pos
        tag = _read_varint(handle, where)
        wire_type = tag & 7
        if not 0 < tag >> 3 <= wire.MAX_FIELD_NUMBER:
            raise TraceFormatError(
                f"corrupt XSpace protobuf in the file (field number {tag >> 3} out of range)", where
            )
        if wire_type == 2:
            size = _read_varint(handle, where)
            pos = handle.tell()
            if pos + size > end:
                raise TraceFormatError(_TRUNCATED, where)
            if tag >> 3 == 1:
                if len(ranges) == MAX_PLANES:
                    raise TraceFormatError(
                        f"more than {MAX_PLANES:,} planes (no capture has that many: refused unread)", where
                    )
                ranges.append((pos, size))
                pos += size
                handle.seek(pos)
                continue
            pos += size
        elif wire_type == 0:
            _read_varint(handle, where)
            pos = handle.tell()
        elif wire_type in (1, 5):
            pos = handle.tell() + (8 if wire_type == 1 else 4)
            if pos > end:
                raise TraceFormatError(_TRUNCATED, where)
        else:
            raise TraceFormatError(
                f"corrupt or truncated XSpace protobuf in the file (wire type {wire_type})", where
            )
        handle.seek(field_start)
        rest.append(handle.read(pos - field_start))
    return ranges, b"".join(rest)


def _varint_at(data: bytes, pos: int, where: str, what: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise TraceFormatError(f"corrupt or truncated XSpace protobuf in {what} (bad varint)", where)
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _next_field(data: bytes, pos: int, end: int, where: str, what: str) -> tuple[int, int, int]:
    """The field at ``data[pos]``: (tag, where its payload starts, where the next field starts)."""
    tag, pos = _varint_at(data, pos, where, what)
    wire_type = tag & 7
    if not 0 < tag >> 3 <= wire.MAX_FIELD_NUMBER:
        raise TraceFormatError(
            f"corrupt XSpace protobuf in {what} (field number {tag >> 3} out of range)", where
        )
    if wire_type == 2:
        size, start = _varint_at(data, pos, where, what)
        after = start + size
    elif wire_type == 0:
        start, after = pos, _varint_at(data, pos, where, what)[1]
    elif wire_type in (1, 5):
        start, after = pos, pos + (8 if wire_type == 1 else 4)
    else:
        raise TraceFormatError(
            f"corrupt or truncated XSpace protobuf in {what} (wire type {wire_type})", where
        )
    if after > end:
        raise TraceFormatError(f"corrupt or truncated XSpace protobuf in {what} (truncated field)", where)
    return tag, start, after


def _split_lines(
    data: bytes, where: str, what: str
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[int], list[int], list[int]]:
    """An XPlane's bytes -> (offset, size) of each ``lines`` field, the (start, end) of the runs of
    other fields between them, the (start, end) of each ``event_metadata`` map entry's payload, and
    where each of those entries' fields starts (its tag).

    Why: upb would copy every line into the plane's arena and Python again on access; with the
    ranges each line is parsed straight from the plane's bytes (peak memory -9 MB per 4.6 MB
    plane). Walks only the plane's top-level fields (lines, metadata entries, stats); a field with
    a one-byte tag and length (nearly all) is stepped over inline, anything else by ``_next_field``
    (which also names what is wrong).
    """
    ranges: list[tuple[int, int]] = []
    rest: list[tuple[int, int]] = []
    md_starts: list[int] = []
    md_ends: list[int] = []
    md_fields: list[int] = []
    pos, end = 0, len(data)
    kept = 0  # start of the current run of non-line fields (copied to ``rest`` in one slice)
    lines_tag, metadata_tag = _LINES_TAG, _METADATA_TAG
    while pos < end:
        tag = data[pos]
        if tag < 0x80 and tag & 7 == 2 and tag >> 3 and pos + 1 < end and data[pos + 1] < 0x80:
            start = pos + 2
            after = start + data[pos + 1]
            if after > end:
                tag, start, after = _next_field(data, pos, end, where, what)  # raises: truncated
        elif tag < 0x80 and tag & 7 == 2 and tag >> 3 and pos + 2 < end and data[pos + 2] < 0x80 \
                and data[pos + 1] >= 0x80:
            start = pos + 3
            after = start + (data[pos + 1] & 0x7F) + (data[pos + 2] << 7)
            if after > end:
                tag, start, after = _next_field(data, pos, end, where, what)
        else:
            tag, start, after = _next_field(data, pos, end, where, what)
        if tag == lines_tag:
            if pos > kept:
                rest.append((kept, pos))
            kept = after
            ranges.append((start, after - start))
            if len(ranges) > MAX_LINES:
                raise TraceFormatError(f"{what} has more than {MAX_LINES:,} lines", where)
        elif tag == metadata_tag:
            md_starts.append(start)
            md_ends.append(after)
            md_fields.append(pos)
        pos = after
    if end > kept:
        rest.append((kept, end))
    return ranges, rest, md_starts, md_ends, md_fields


def _split_lines_compiled(
    jit: Any, buffer: np.ndarray, where: str, what: str
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], np.ndarray, np.ndarray, np.ndarray] | None:
    """``_split_lines`` by the compiled field walk (``wire_jit.fields``): the same ranges, with the
    metadata entries' as arrays; None where the bytes are malformed (``_split_lines`` then words the
    refusal). Why: the Python walk costs ~0.3 us per field, and a pod host's 18 planes hold ~6K
    metadata entries, walked when the host is validated (probe) and again when a map task opens it
    (3.6 -> 2.6 ms per host opened, benchmarks/results/pod.md)."""
    found = jit.fields(buffer)
    if found is None:
        return None
    tags, starts, afters, field_starts = found
    lines = np.flatnonzero(tags == _LINES_TAG)
    if len(lines) > MAX_LINES:
        raise TraceFormatError(f"{what} has more than {MAX_LINES:,} lines", where)
    line_starts, line_afters = starts[lines], afters[lines]
    ranges = list(zip(line_starts.tolist(), (line_afters - line_starts).tolist(), strict=True))
    # the runs of other fields: from the end of the previous line (or 0) to the next line's field start
    kept = np.concatenate(([0], line_afters))
    before = np.concatenate((field_starts[lines], [len(buffer)]))
    runs = before > kept
    rest = list(zip(kept[runs].tolist(), before[runs].tolist(), strict=True))
    metadata = tags == _METADATA_TAG
    return ranges, rest, starts[metadata], afters[metadata], field_starts[metadata]


@dataclass
class PlaneSplit:
    """Where a plane's top-level fields lie in its bytes (``_split_lines``): kept from the
    validation pass, so streaming the plane walks only its events, not its fields again."""

    line_ranges: list[tuple[int, int]]  # (offset, size) of each line
    rest: list[tuple[int, int]]  # (start, end) of the runs of other fields
    metadata_starts: np.ndarray  # each event_metadata entry's payload
    metadata_ends: np.ndarray
    metadata_fields: np.ndarray  # where each entry's field starts

    @cached_property
    def metadata_region(self) -> tuple[int, int] | None:
        """(start, end) of the event_metadata entries where they are one run of fields inside one run of
        ``rest`` (how XPlanes are written), else None; (0, 0) for a plane without entries. (Asked for
        when the plane is opened, streamed and its metadata decoded: found once.)"""
        if not len(self.metadata_ends):
            return (0, 0)
        fields, ends = self.metadata_fields, self.metadata_ends
        if len(ends) > 1 and not np.array_equal(fields[1:], ends[:-1]):
            return None
        low, high = int(self.metadata_fields[0]), int(self.metadata_ends[-1])
        return (low, high) if any(a <= low and high <= b for a, b in self.rest) else None

    def header(self) -> list[tuple[int, int]] | None:
        """The runs of ``rest`` without the event_metadata entries (``metadata_region``), or None."""
        region = self.metadata_region
        if region is None:
            return None
        low, high = region
        if low == high:
            return self.rest
        runs = []
        for a, b in self.rest:
            if b <= low or a >= high:
                runs.append((a, b))
                continue
            if a < low:
                runs.append((a, low))
            if high < b:
                runs.append((high, b))
        return runs


# a line's fields other than events (id, names, times: 6) past which ``_Plane.lines`` leaves it to upb
MAX_LINE_HEADER_FIELDS = 16

# event_metadata regions that passed upb's parse in this process lately (``_Plane``): the planes of a
# host, and the hosts of a pod, mostly carry the same bytes
VALIDATED_REGIONS = 8
_validated_regions: deque[bytes] = deque(maxlen=VALIDATED_REGIONS)


class _Plane:
    """One plane read from the file: its message without lines, and its lines parsed on demand.

    The message is parsed without the event_metadata entries where they are one region of the bytes
    (``PlaneSplit.header``): a pod host's planes carry ~80 KB of them each (~60% of the file), which the
    metadata decoder reads from the bytes (xspace_metadata.decode_metadata) and a table shared between
    planes spares decoding at all. Parsing them with upb for every plane opened cost time, and upb's
    arena blocks freed (every 10,000 it calls ``malloc_trim(0)``, returning memory a pool worker keeps
    for its next task: executors.keep_freed_memory). ``validate``: the entries are checked by upb's parse
    here all the same, unless the same bytes passed it lately in this process (``_validated_regions``);
    their message is parsed when asked for (``metadata_message``).
    """

    def __init__(self, blob: bytes, where: str, index: int, split: PlaneSplit | None = None,
                 validate: bool = True) -> None:
        what = f"plane #{index}"
        self.blob, self.where, self.index, self.what = blob, where, index, what
        self.buffer = np.frombuffer(blob, dtype=np.uint8)  # the blob, for numpy decoding
        if split is None:
            jit = _Warmup.ready()
            found = _split_lines_compiled(jit, self.buffer, where, what) if jit is not None else None
            if found is None:
                ranges, spans, md_starts, md_ends, md_fields = _split_lines(blob, where, what)
                found = (ranges, spans, np.array(md_starts, dtype=np.int64),
                         np.array(md_ends, dtype=np.int64), np.array(md_fields, dtype=np.int64))
            split = PlaneSplit(*found)
        self.split = split
        self.line_ranges = split.line_ranges
        self.metadata_ranges = (split.metadata_starts, split.metadata_ends)
        self._metadata_message: Any = None
        header = split.header()
        if header is None:  # the entries scattered: one parse of everything
            self.message = _parse_part("XPlane", self._joined(split.rest), where, what)
            self._metadata_message = self.message
        else:
            self.message = _parse_part("XPlane", self._joined(header), where, what)
            if validate:
                self._validate_metadata()
        self._stat_names: dict[int, str] | None = None

    def _joined(self, runs: list[tuple[int, int]]) -> bytes:
        if len(runs) == 1 and runs[0] == (0, len(self.blob)):
            return self.blob
        return b"".join([self.blob[a:b] for a, b in runs])

    def _validate_metadata(self) -> None:
        """upb's parse of the event_metadata entries (``metadata_message``), unless these bytes passed it
        lately."""
        region = self.split.metadata_region
        assert region is not None
        if region[0] == region[1]:
            return
        data = self.blob[region[0] : region[1]]
        with _SHARED_LOCK:  # (a Dask worker reads hosts in threads)
            if data in _validated_regions:
                return
        self.metadata_message()
        with _SHARED_LOCK:
            _validated_regions.append(data)

    def metadata_message(self) -> Any:
        """An XPlane message holding the plane's event_metadata entries (and perhaps its other fields)."""
        if self._metadata_message is None:
            region = self.split.metadata_region
            assert region is not None  # (else parsed with the rest)
            self._metadata_message = _parse_part("XPlane", self.blob[region[0] : region[1]], self.where,
                                                 self.what)
        return self._metadata_message

    @property
    def name(self) -> str:
        return self.message.name

    def stat_names(self) -> dict[int, str]:
        """Stat metadata id -> name."""
        if self._stat_names is None:
            self._stat_names = {k: v.name for k, v in self.message.stat_metadata.items()}
        return self._stat_names

    def lines(self, jit: Any = None) -> Iterator[tuple[Any, int]]:
        """Each line's message without its events, and how many events it has.

        With the compiled kernels (``jit``), the plane's lines are walked by ``wire_jit.line_headers`` (one
        call a plane) and only their fields other than events parsed by upb: upb would copy every event's
        bytes into its arena (~30 blocks a pod host's plane, each freed block counted toward its
        ``malloc_trim(0)``: see ``_Plane``) to check what the walk checks too, the fields' framing (the
        events' own fields are checked when they are decoded). Malformed bytes, or a line of many other
        fields, go to upb's parse of the whole line, which words the refusal."""
        view = memoryview(self.blob)
        found = None
        if jit is not None and self.line_ranges:
            starts = np.array([start for start, _ in self.line_ranges], dtype=np.int64)
            ends = starts + np.array([size for _, size in self.line_ranges], dtype=np.int64)
            found = jit.line_headers(self.buffer, starts, ends, MAX_LINE_HEADER_FIELDS)
        if found is not None:
            counts, others, other_starts, other_ends = (a.tolist() for a in found)
        for line_index, (start, size) in enumerate(self.line_ranges):
            what = f"line #{line_index} of plane {self.message.name!r}"
            if found is not None and others[line_index] <= MAX_LINE_HEADER_FIELDS:
                k = others[line_index]
                fields = zip(other_starts[line_index][:k], other_ends[line_index][:k], strict=True)
                header = b"".join([view[a:b] for a, b in fields])
                yield _parse_part("XLine", header, self.where, what), counts[line_index]
                continue
            line = _parse_part("XLine", view[start : start + size], self.where, what)
            yield line, len(line.events)

    def event_ranges(
        self, line_index: int, limit: int, jit: Any = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(starts, ends) of the line's events within the plane's bytes, ``limit`` at a time.

        Why walk the line here instead of letting upb split it: upb copies a line's events into
        its arena and needs a Python bytes object per event to hand them out (9 MB for a
        242K-event line, all of it at once); this walk holds ``limit`` offsets. Fields other than
        events are skipped: the validation pass read them (and checked the line with upb).
        """
        start, size = self.line_ranges[line_index]
        what = f"line #{line_index} of plane {self.message.name!r}"
        if jit is not None:
            yield from self._compiled_event_ranges(jit, start, start + size, limit, what)
            return
        data = self.blob
        pos, end = start, start + size
        heads: list[int] = []  # where each event's field starts; sizes are decoded with numpy
        append = heads.append
        event_tag = _EVENT_TAG
        try:
            while pos < end:
                if data[pos] == event_tag:
                    append(pos)
                    length = data[pos + 1]
                    if length < 0x80:
                        pos += 2 + length
                    else:
                        length, first = _varint_at(data, pos + 1, self.where, what)
                        pos = first + length
                    if len(heads) == limit:
                        yield self._event_spans(heads, end, what)
                        heads = []
                        append = heads.append
                    continue
                pos = _next_field(data, pos, end, self.where, what)[2]
        except IndexError:
            pos = -1
        if pos != end:
            raise TraceFormatError(f"corrupt or truncated XSpace protobuf in {what}", self.where)
        if heads:
            yield self._event_spans(heads, end, what)

    def _compiled_event_ranges(
        self, jit: Any, pos: int, end: int, limit: int, what: str
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``event_ranges`` by the compiled line walk (``wire_jit.line_events``)."""
        while pos < end:
            starts = np.empty(limit, dtype=np.int64)
            ends = np.empty(limit, dtype=np.int64)
            n, pos, err = jit.line_events(self.buffer, pos, end, limit, starts, ends)
            if err:
                raise TraceFormatError(f"corrupt or truncated XSpace protobuf in {what}", self.where)
            if n:
                yield starts[:n], ends[:n]

    def _event_spans(self, heads: list[int], end: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) of the events whose fields start at ``heads`` (tag byte, then length)."""
        buf = self.buffer
        at = np.array(heads, dtype=np.int64) + 1
        try:
            length, first = wire.varints(buf, at, np.full(len(at), end, dtype=np.int64))
        except wire.WireError as exc:
            raise TraceFormatError(f"corrupt XSpace protobuf in {what} ({exc})", self.where) from None
        return first, first + length.astype(np.int64)


def _read_range(handle: BinaryIO, start: int, size: int, where: str) -> bytes:
    handle.seek(start)
    try:
        blob = handle.read(size)
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc.strerror or exc}", where) from None
    if len(blob) != size:
        raise TraceFormatError("file changed while being ingested", where)
    return blob


def read_bytes(path: Path) -> bytes:
    """The file's bytes, or a one-line ``TraceFormatError`` (missing, unreadable, empty, gzip)."""
    data = read_trace_file(path, "an XSpace file")
    if data[:2] == b"\x1f\x8b":
        raise TraceFormatError("gzip-compressed data, not a raw XSpace protobuf", str(path))
    return data


def parse_xspace(path: str | Path) -> xplane_pb2.XSpace:
    """Parse (fully, with the generated classes) and sanity-check one XSpace file.

    For tests and tools; ingest uses ``XSpaceReader``. Any problem is a one-line ``TraceFormatError``.
    Protobuf parsing of garbage can "succeed", so beyond DecodeError this refuses files whose top
    level, planes or lines carry unknown fields, or that hold no named plane.
    """
    path = Path(path)
    data = read_bytes(path)
    space = xplane_pb2.XSpace()
    try:
        space.ParseFromString(data)
    except DecodeError as exc:
        raise TraceFormatError(f"corrupt or truncated XSpace protobuf ({exc})", str(path)) from None
    except Exception as exc:  # upb may raise other errors on pathological input
        raise TraceFormatError(f"cannot parse as XSpace protobuf ({exc})", str(path)) from None
    del data
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


def scalar_stat(stat: Any, stat_names: dict[int, str]) -> Any:
    """One stat's Python value; a ref resolves to the referenced stat-metadata name."""
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(stat, kind)
    if kind == "ref_value":
        return stat_names.get(value, f"ref#{value}")
    return value


def _stat_dict(stats: Any, stat_names: dict[int, str]) -> dict[str, Any]:
    """{stat name: value} (``scalar_stat``'s values; a repeated name keeps its last value), inlined:
    event metadata carry ~7 stats each, ~1 metadata per 8 events in many-host runs."""
    get = stat_names.get
    out: dict[str, Any] = {}
    for stat in stats:
        mid = stat.metadata_id
        key = get(mid)
        if key is None:
            key = f"stat#{mid}"
        kind = stat.WhichOneof("value")
        if kind is None:
            out[key] = None
        elif kind == "ref_value":
            ref = stat.ref_value
            name = get(ref)
            out[key] = f"ref#{ref}" if name is None else name
        else:
            out[key] = getattr(stat, kind)
    return out


# XStat value fields: number -> wire type (double fixed64, uint64/int64/ref varint, str/bytes length).
_STAT_DOUBLE, _STAT_UINT, _STAT_INT, _STAT_STR, _STAT_BYTES, _STAT_REF = 2, 3, 4, 5, 6, 7
_STAT_WIRE = {2: 1, 3: 0, 4: 0, 5: 2, 6: 2, 7: 0}


def _labels(ids: np.ndarray, names: dict[int, str], prefix: str) -> np.ndarray:
    """Int ids -> object array of names (one Python lookup per distinct id)."""
    texts, index = _label_index(ids, names, prefix)
    return text_column(texts)[index]


def _label_index(ids: np.ndarray, names: dict[int, str], prefix: str) -> tuple[list[str], np.ndarray]:
    """(the distinct ids' names, each id's index into them)."""
    uniq, index = distinct_ids(ids)
    return [names.get(u) or f"{prefix}#{u}" for u in uniq.tolist()], index


def _stat_values(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, ...]:
    """XStats at byte ranges -> (metadata_id, value field number, double, uint64, int64, ref, str
    start, str length, bytes start, bytes length), numpy decoder: the shape ``wire_jit.stats`` returns.

    A stat's value field is the highest-numbered one present; each field's last occurrence wins.
    """
    m = len(starts)
    fields = wire.decode_fields(buf, starts, starts + lengths)
    mids = wire.scalar(fields, m, 1)[0].view(np.int64)
    number = np.zeros(m, dtype=np.int8)
    found: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for field_number, wire_type in _STAT_WIRE.items():
        msg, value, length = fields.select(field_number, wire_type)
        number[msg] = field_number
        found[field_number] = (msg, value, length)
    del fields

    def numeric(field_number: int, view: str) -> np.ndarray:
        msg, value, _ = found[field_number]
        full = np.zeros(m, dtype=np.uint64)
        full[msg] = value
        return full.view(view)

    def span(field_number: int) -> tuple[np.ndarray, np.ndarray]:
        msg, value, length = found[field_number]
        start, size = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
        start[msg] = value.astype(np.int64)
        size[msg] = length
        return start, size

    return (
        mids,
        number,
        numeric(_STAT_DOUBLE, "<f8"),
        numeric(_STAT_UINT, "<u8"),
        numeric(_STAT_INT, "<i8"),
        numeric(_STAT_REF, "<i8"),
        *span(_STAT_STR),
        *span(_STAT_BYTES),
    )


def _stat_table(
    buf: np.ndarray, owners: np.ndarray, values: tuple[np.ndarray, ...], stat_names: dict[int, str]
) -> StatLong:
    """A chunk's decoded XStats (``_stat_values``' shape) -> long stats table, vectorised."""
    mids, number, f64, u64, i64, ref, str_start, str_len, raw_start, raw_len = values
    m = len(mids)
    kind = np.zeros(m, dtype=np.int8)
    kind[number == _STAT_INT] = STAT_INT
    kind[number == _STAT_UINT] = STAT_UINT
    kind[number == _STAT_DOUBLE] = STAT_DOUBLE
    text = np.full(m, None, dtype=object)
    rows = np.flatnonzero(number == _STAT_STR)
    if len(rows):
        text[rows] = wire.strings(buf, str_start[rows], str_len[rows])
    rows = np.flatnonzero(number == _STAT_REF)
    if len(rows):
        text[rows] = _labels(ref[rows], stat_names, "ref")
    nonfinite = np.flatnonzero((number == _STAT_DOUBLE) & ~np.isfinite(f64))
    if len(nonfinite):  # JSON has no NaN/inf: their text, as json_safe writes it
        text[nonfinite] = [repr(float(v)) for v in f64[nonfinite]]
    rows = np.flatnonzero(number == _STAT_BYTES)
    for i in rows.tolist():  # base64 text, few, one by one
        start, size = int(raw_start[i]), int(raw_len[i])
        text[i] = json_safe(buf[start : start + size].tobytes())
    kind[(number == _STAT_STR) | (number == _STAT_REF) | (number == _STAT_BYTES)] = STAT_TEXT
    kind[nonfinite] = STAT_TEXT
    key_names, key_index = _label_index(mids, stat_names, "stat")
    codes = stat_key_codes(key_names)
    return StatLong(
        owner=owners,
        key=text_column(key_names)[key_index],
        kind=kind,
        i64=i64,
        u64=u64,
        f64=f64,
        text=text,
        key_code=None if codes is None else codes[key_index],
    )


# Event-metadata tables decoded lately by any reader of this process, by their bytes (and stat names and
# modules): the hosts of a pod run one program, so a map task's hosts share them, decoded once, and a
# batch's planes then share one table object (store/batch.py keys the ops' kinds by it).
SHARED_METADATA_TABLES = 8
_SHARED_METADATA: OrderedDict[tuple[Any, ...], Columns] = OrderedDict()
_SHARED_LOCK = threading.Lock()


class XSpaceReader:
    """One host's ``.xplane.pb``: validated on construction, then streamed plane by plane.

    Construction walks the file's top level, then reads and expands every plane and line once to
    validate it and find ``t0_ns`` (the earliest ``timestamp_ns`` of a line with events); event
    ``start_ps`` values in the batches are relative to it (the loader shifts them to the run's t0).
    Memory: one plane's bytes (and one expanded line) at a time, while validating and streaming.
    """

    source_format = "xspace"

    def __init__(self, path: str | Path, host: str | None = None, decoder: str = "auto") -> None:
        """``decoder``: 'numpy' keeps the numpy decoder whatever the file's size; 'auto' uses the
        compiled kernels from ``COMPILED_MIN_EVENTS`` events. ``TPUANALYZE_DECODER`` overrides both."""
        self.path = Path(path)
        self.host = host or host_name_for(self.path)
        self.file_path = str(self.path.resolve())
        where = str(self.path)
        if decoder not in ("auto", "numpy"):
            raise ValueError(f"decoder must be 'auto' or 'numpy', not {decoder!r}")
        mode = decoder_mode()
        if mode == "auto" and decoder == "numpy":
            mode = "numpy"
        handle, self.file_bytes = open_trace_file(self.path, "an XSpace file")
        with handle:
            if handle.read(2) == b"\x1f\x8b":
                raise TraceFormatError("gzip-compressed data, not a raw XSpace protobuf", where)
            ranges, rest = _split_planes(handle, self.file_bytes, where)
            space = _parse_part("XSpace", rest, where, "the file")
            if not ranges:
                raise TraceFormatError("XSpace holds no planes", where)
            self.hostnames = list(space.hostnames)
            self.errors = list(space.errors)
            self.warnings = list(space.warnings)
            self.metadata: dict[str, Any] = {}
            # Plane byte ranges only: each plane is read back from the file when streamed.
            self._ranges: list[tuple[int, int]] | None = ranges
            del space
            names: list[str] = []
            stamps: list[int] = []
            self.num_events = 0
            # Each plane's lines (id, display_id, name, display_name, timestamp_ns, duration_ps,
            # events): streaming then walks only the events.
            self._line_rows: list[list[tuple[Any, ...]]] = []
            self._splits: list[PlaneSplit] = []
            lines_seen = 0
            for index, (start, size) in enumerate(ranges):
                plane = _Plane(_read_range(handle, start, size, where), where, index)
                self._splits.append(plane.split)
                names.append(plane.name)
                rows = []
                for line_index, (line, count) in enumerate(plane.lines(_Warmup.ready())):
                    if line.duration_ps < 0:
                        raise TraceFormatError(
                            f"line #{line_index} ({line.name!r}) of plane {plane.name!r}: "
                            f"negative duration_ps ({line.duration_ps})", where
                        )
                    rows.append(
                        (line.id, line.display_id, line.name, line.display_name or None,
                         line.timestamp_ns, line.duration_ps, count)
                    )
                    if count:
                        stamps.append((line.timestamp_ns, index, line_index))
                        self.num_events += count
                    del line
                if mode == "auto" and self.num_events >= COMPILED_MIN_EVENTS:
                    _Warmup.start()  # to be needed: loads beside the rest of the pass (once a process)
                self._line_rows.append(rows)
                lines_seen += len(rows)
                if lines_seen > MAX_LINES:
                    raise TraceFormatError(f"more than {MAX_LINES:,} lines in the file", where)
                del plane
        if not any(names):
            raise TraceFormatError("not an XSpace protobuf (no plane has a name)", where)
        self.t0_ns: int | None = min(stamps)[0] if stamps else None
        if stamps:
            _check_line_span(stamps, names, self._line_rows, where)
        wanted = mode == "compiled" or mode == "auto" and self.num_events >= COMPILED_MIN_EVENTS
        self._jit = compiled_decoder() if wanted else None
        self._last_metadata: tuple[tuple[Any, ...], Columns] | None = None

    def use_compiled(self) -> None:
        """Decode with the compiled kernels whatever the file's size (unless ``TPUANALYZE_DECODER``
        is 'numpy'): the ingest's process reads enough events in all (``COMPILED_SHARE_EVENTS``)."""
        if self._jit is None and decoder_mode() != "numpy":
            self._jit = compiled_decoder()

    def release(self) -> None:
        """Forget the plane ranges once streamed."""
        self._ranges = None
        self._splits = []
        self._last_metadata = None

    def planes(self) -> Iterator[PlaneData]:
        if self._ranges is None:
            raise RuntimeError("XSpaceReader already released")
        handle, size = open_trace_file(self.path, "an XSpace file")
        with handle:
            if size != self.file_bytes:
                raise TraceFormatError("file changed while being ingested", self.file_path)
            group: list[_Plane] = []  # small planes read ahead, their events decoded together
            group_events = group_bytes = 0
            for plane_index, (start, size) in enumerate(self._ranges):
                events = sum(row[-1] for row in self._line_rows[plane_index])
                if group and (events >= CHUNK_EVENTS or group_events + events > GROUP_EVENTS
                              or group_bytes + size > GROUP_BYTES):
                    yield from self._grouped(group)
                    group, group_events, group_bytes = [], 0, 0
                plane = _Plane(_read_range(handle, start, size, self.file_path), self.file_path, plane_index,
                               self._splits[plane_index], validate=False)  # (validated when opened)
                if events >= CHUNK_EVENTS:
                    yield self._plane(plane_index, plane)
                else:
                    group.append(plane)
                    group_events += events
                    group_bytes += size
                del plane
            yield from self._grouped(group)

    def _grouped(self, planes: list[_Plane]) -> Iterator[PlaneData]:
        """The planes of a group, each with its batch cut from one decode of the whole group."""
        if len(planes) == 1:
            yield self._plane(planes[0].index, planes[0])
            return
        group = _PlaneGroup(self, planes)
        group.decode()
        for position, plane in enumerate(planes):
            yield self._plane(plane.index, plane, group.batches(position), group.module_ids(position))

    def _plane(
        self, plane_index: int, read: _Plane, batches: Iterator[EventBatch] | None = None,
        known_module_ids: set[int] | None = None,
    ) -> PlaneData:
        plane = read.message
        stat_names = read.stat_names()
        kind, ordinal = classify_plane(plane.name)
        plane_stats = {k: json_safe(v) for k, v in _stat_dict(plane.stats, stat_names).items()}
        if plane.name == "Task Environment":
            self.metadata.update({k: v for k, v in plane_stats.items() if k.startswith("profile_")})
        rows = self._line_rows[plane_index]
        if len(rows) != len(read.line_ranges):
            raise TraceFormatError("file changed while being ingested", self.file_path)
        lines = empty_lines()
        module_ids: set[int] = set() if known_module_ids is None else known_module_ids
        buf = read.buffer
        for line_index, row in enumerate(rows):
            for column, value in zip(LINE_COLUMNS, (line_index, *row), strict=True):
                lines[column].append(value)
            if row[2] == "XLA Modules" and row[-1] and known_module_ids is None:
                for starts, ends in read.event_ranges(line_index, CHUNK_EVENTS, self._jit):
                    module_ids.update(np.unique(self._decode_chunk(buf, starts, ends)[0]).tolist())
        metadata = self._plane_metadata(read, stat_names, module_ids)
        info = PlaneInfo(
            plane_index=plane_index,
            plane_id=plane.id,
            name=plane.name,
            kind=kind,
            device_ordinal=ordinal,
            device_type=_as_str(plane_stats.get("device_type_string")),
            peak_tflops=_as_float(plane_stats.get("peak_teraflops_per_second")),
            peak_hbm_bw_gbps=_as_float(plane_stats.get("peak_hbm_bw_gigabytes_per_second")),
            num_lines=len(read.line_ranges),
            num_events=sum(lines["num_events"]),
            stats=json.dumps(plane_stats) if plane_stats else None,
        )
        return PlaneData(
            info=info,
            lines=lines_columns(lines),
            metadata=metadata,
            batches=self._batches(read, stat_names) if batches is None else batches,
        )

    def _plane_metadata(self, read: _Plane, stat_names: dict[int, str], module_ids: set[int]) -> Columns:
        """The plane's event-metadata columns; the previous plane's when both planes' metadata are
        the same bytes under the same stat names and modules (the cores of a host run one program:
        their tables are usually identical, and decoded once)."""
        starts, ends = read.metadata_ranges
        blob = read.blob
        # the entries' fields (their bytes determine their keys and upb's order of them: not parsed here)
        region = read.split.metadata_region
        key = (
            blob[region[0] : region[1]] if region is not None
            else b"".join([blob[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]),
            None if region is not None else (ends - starts).tobytes(),
            frozenset(module_ids),
            tuple(sorted(stat_names.items())),
        )
        if self._last_metadata is not None and self._last_metadata[0] == key:
            return self._last_metadata[1]
        with _SHARED_LOCK:
            shared = _SHARED_METADATA.get(key)
            if shared is not None:
                _SHARED_METADATA.move_to_end(key)
        if shared is not None:  # another host of this process had the same table
            self._last_metadata = (key, shared)
            return shared
        entries = read.metadata_message()
        metadata = decode_metadata(
            read.buffer, starts, ends, key_order(entries), stat_names, module_ids, _MODULE_PROGRAM_ID
        )
        if metadata is None:  # a shape only the upb reading gets exactly right
            metadata = self._metadata(entries, stat_names, module_ids)
        self._last_metadata = (key, metadata)
        with _SHARED_LOCK:  # (a Dask worker reads hosts in threads)
            _SHARED_METADATA[key] = metadata
            while len(_SHARED_METADATA) > SHARED_METADATA_TABLES:
                _SHARED_METADATA.popitem(last=False)
        return metadata

    def _metadata(self, plane: Any, stat_names: dict[int, str], module_ids: set[int]) -> Columns:
        """Event metadata of a plane; ``hlo_module`` filled for XLA modules and their ops.

        An 'XLA Modules' event's name is the module; an op whose ``program_id`` matches a module's
        ``name(program_id)`` suffix inherits that module name.
        """
        rows = []
        modules_by_program: dict[int, str] = {}
        for md_id, md in plane.event_metadata.items():
            stats = _stat_dict(md.stats, stat_names)
            if md_id in module_ids:
                stats.setdefault("hlo_module", md.name)
                match = _MODULE_PROGRAM_ID.search(md.name)
                if match:
                    modules_by_program[int(match.group(1))] = md.name
            rows.append((md_id, md.name, md.display_name, stats))
        for _, _, _, stats in rows:
            if "hlo_module" not in stats and isinstance(stats.get("program_id"), int):
                module = modules_by_program.get(stats["program_id"] & 0xFFFFFFFFFFFFFFFF)
                if module:
                    stats["hlo_module"] = module
        return metadata_table(rows)

    def _decode_chunk(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
        """XEvents at ``buf[starts[i]:ends[i]]`` -> metadata_id, offset_ps, duration_ps,
        num_occurrences (+ mask), and their XStats' owner (event), start and length."""
        jit = self._jit
        if jit is not None:
            try:
                mids, offsets, durations, occ, has_occ, owner, start, end = jit.events(buf, starts, ends)
            except wire.WireError as exc:
                raise TraceFormatError(f"corrupt XSpace events: {exc}", self.file_path) from None
            return mids, offsets, durations, occ, has_occ, owner, start, end - start
        try:
            fields = wire.decode_fields(buf, starts, ends)
        except wire.WireError as exc:
            raise TraceFormatError(f"corrupt XSpace events: {exc}", self.file_path) from None
        n = len(starts)
        occurrences, has_occurrences = wire.scalar(fields, n, 5)
        owner, start, length = fields.select(4, 2)
        return (
            wire.scalar(fields, n, 1)[0].view(np.int64),
            wire.scalar(fields, n, 2)[0].view(np.int64),
            wire.scalar(fields, n, 3)[0].view(np.int64),
            occurrences.view(np.int64),
            has_occurrences,
            owner,
            start.astype(np.int64),
            length,
        )

    def _decode_stats(
        self,
        buf: np.ndarray,
        owner: np.ndarray,
        start: np.ndarray,
        length: np.ndarray,
        stat_names: dict[int, str],
    ) -> StatLong:
        jit = self._jit
        try:
            if jit is not None:
                values = jit.stats(buf, start, start + length)
            else:
                values = _stat_values(buf, start, length)
            return _stat_table(buf, owner, values, stat_names)
        except wire.WireError as exc:
            raise TraceFormatError(f"corrupt XSpace event stats: {exc}", self.file_path) from None

    def _batches(self, plane: _Plane, stat_names: dict[int, str]) -> Iterator[EventBatch]:
        base_ns = self.t0_ns or 0
        buf = plane.buffer
        pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        count = 0
        for line_index, row in enumerate(self._line_rows[plane.index]):
            base_ps = (row[4] - base_ns) * 1000
            # a batch holds CHUNK_EVENTS to 2 x CHUNK_EVENTS events (short lines are gathered)
            for starts, ends in plane.event_ranges(line_index, CHUNK_EVENTS, self._jit):
                n = len(starts)
                line_column = np.full(n, line_index, dtype=np.int32)
                pending.append((starts, ends, line_column, np.full(n, base_ps, dtype=np.int64)))
                count += n
                if count >= CHUNK_EVENTS:
                    yield self._batch(buf, pending, stat_names, plane.index, plane.name)
                    pending, count = [], 0
        if count:
            yield self._batch(buf, pending, stat_names, plane.index, plane.name)

    def _batch(
        self,
        buf: np.ndarray,
        pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        stat_names: dict[int, str],
        plane_index: int,
        plane_name: str,
    ) -> EventBatch:
        starts, ends, lines, bases = (np.concatenate(part) for part in zip(*pending, strict=True))
        md_ids, offsets, durations, occurrences, has_occ, owner, start, length = self._decode_chunk(
            buf, starts, ends
        )
        # offsets first (bounded, so adding the line's base cannot wrap), then the time policy
        offsets = np.clip(offsets, -4 * MAX_SPAN_PS, 4 * MAX_SPAN_PS)
        start_ps = offsets + bases
        bad = first_bad_time(start_ps, durations)
        if bad is not None:
            i, what = bad
            row = self._line_rows[plane_index][int(lines[i])]
            raise TraceFormatError(
                f"an event of line #{int(lines[i])} ({row[2]!r}) of plane {plane_name!r}: {what}",
                self.file_path,
            )
        stats = self._decode_stats(buf, owner, start, length, stat_names) if len(owner) else None
        return EventBatch(
            line_index=lines,
            metadata_id=md_ids,
            start_ps=start_ps,
            duration_ps=durations,
            num_occurrences=occurrences,
            has_occurrences=has_occ,
            stats=stats,
        )


class _PlaneGroup:
    """Consecutive small planes whose events are decoded in one pass (``XSpaceReader._grouped``).

    Each plane gets exactly the batch its own decode gives (same events, stats in the same order,
    owners relative to the plane); the decode runs when the first plane's batches are asked for.
    Should any of the planes be refused (corrupt events, the time policy), the group falls back to
    decoding plane by plane, so the error, and which plane's rows came before it, are as without
    grouping.
    """

    def __init__(self, reader: XSpaceReader, planes: list[_Plane]) -> None:
        self.reader, self.planes = reader, planes
        self.decoded: list[EventBatch | None] | None = None
        self.modules: list[set[int]] = []
        self.fallback = False

    def decode(self) -> None:
        """Decode the group's events (once); a refusal means plane by plane instead."""
        if self.decoded is None and not self.fallback:
            try:
                self.decoded = self._decode()
            except TraceFormatError:
                self.fallback = True

    def module_ids(self, position: int) -> set[int] | None:
        """The metadata ids of the plane's 'XLA Modules' events (None: the plane finds them itself)."""
        return None if self.fallback else self.modules[position]

    def batches(self, position: int) -> Iterator[EventBatch]:
        self.decode()
        plane = self.planes[position]
        if self.fallback:
            yield from self.reader._batches(plane, plane.stat_names())
            return
        assert self.decoded is not None
        batch, self.decoded[position] = self.decoded[position], None
        if batch is not None:
            yield batch

    def _decode(self) -> list[EventBatch | None]:
        reader = self.reader
        base_ns = reader.t0_ns or 0
        buffers: list[np.ndarray] = []
        pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        bounds = [0]  # each plane's first event in the group
        offset = 0
        for plane in self.planes:
            count = 0
            for line_index, row in enumerate(reader._line_rows[plane.index]):
                base_ps = (row[4] - base_ns) * 1000
                for starts, ends in plane.event_ranges(line_index, CHUNK_EVENTS, reader._jit):
                    n = len(starts)
                    pieces.append((starts + offset, ends + offset, np.full(n, line_index, dtype=np.int32),
                                   np.full(n, base_ps, dtype=np.int64)))
                    count += n
            bounds.append(bounds[-1] + count)
            buffers.append(plane.buffer)
            offset += len(plane.buffer)
        if not pieces:
            self.modules = [set() for _ in self.planes]
            return [None] * len(self.planes)
        buf = np.concatenate(buffers)
        starts, ends, lines, bases = (np.concatenate(part) for part in zip(*pieces, strict=True))
        del pieces
        md_ids, offsets, durations, occurrences, has_occ, owner, start, length = reader._decode_chunk(
            buf, starts, ends
        )
        offsets = np.clip(offsets, -4 * MAX_SPAN_PS, 4 * MAX_SPAN_PS)
        start_ps = offsets + bases
        if first_bad_time(start_ps, durations) is not None:
            raise TraceFormatError("bad event time", reader.file_path)  # the plane-by-plane decode says which
        values: tuple[np.ndarray, ...] | None = None
        stat_order = stat_bounds = None
        if len(owner):
            try:
                values = reader._jit.stats(buf, start, start + length) if reader._jit is not None \
                    else _stat_values(buf, start, length)
            except wire.WireError as exc:
                raise TraceFormatError(f"corrupt XSpace event stats: {exc}", reader.file_path) from None
            stat_plane = np.searchsorted(np.array(bounds[1:-1], dtype=np.int64), owner, side="right")
            stat_order = np.argsort(stat_plane, kind="stable")  # trace order kept within a plane
            stat_bounds = np.searchsorted(stat_plane[stat_order], np.arange(len(self.planes) + 1))
        out: list[EventBatch | None] = []
        self.modules = []
        for position, plane in enumerate(self.planes):
            a, b = bounds[position], bounds[position + 1]
            module_lines = [i for i, row in enumerate(reader._line_rows[plane.index])
                            if row[2] == "XLA Modules" and row[-1]]
            if module_lines:
                on_module_lines = np.isin(lines[a:b], module_lines)
                self.modules.append(set(np.unique(md_ids[a:b][on_module_lines]).tolist()))
            else:
                self.modules.append(set())
            if a == b:
                out.append(None)
                continue
            stats = None
            if values is not None:
                assert stat_order is not None and stat_bounds is not None
                rows = stat_order[stat_bounds[position]:stat_bounds[position + 1]]
                if len(rows):
                    try:
                        stats = _stat_table(buf, owner[rows] - a, tuple(v[rows] for v in values),
                                            plane.stat_names())
                    except wire.WireError as exc:
                        raise TraceFormatError(
                            f"corrupt XSpace event stats: {exc}", reader.file_path
                        ) from None
            out.append(EventBatch(
                line_index=lines[a:b],
                metadata_id=md_ids[a:b],
                start_ps=start_ps[a:b],
                duration_ps=durations[a:b],
                num_occurrences=occurrences[a:b],
                has_occurrences=has_occ[a:b],
                stats=stats,
            ))
        return out


class _Warmup:
    """Imports numba and loads the cached kernels in a background thread, once per process.

    Why: that costs ~1 s (more on a busy machine), mostly in LLVM (ctypes calls that release the
    GIL), so started when a large file is opened it overlaps the file's validation pass.
    """

    _lock = threading.Lock()
    _thread: threading.Thread | None = None
    _module: Any = None
    _pid: int | None = None  # a forked worker starts its own (the parent's thread is not in it)

    @classmethod
    def start(cls) -> None:
        with cls._lock:
            if cls._thread is None or cls._pid != os.getpid():
                if cls._pid is None:  # a fork waits for the warm-up: a child must not inherit its locks
                    os.register_at_fork(before=cls._finish)
                cls._pid, cls._module = os.getpid(), None
                cls._thread = threading.Thread(target=cls._load, name="tpuanalyze-jit-warmup", daemon=True)
                cls._thread.start()

    @classmethod
    def ready(cls) -> Any:
        """The kernels module if this process has loaded it already, else None (never waits or starts
        the load: for work that has a Python path of its own, ``_split_lines``)."""
        if cls._pid != os.getpid() or decoder_mode() == "numpy":
            return None
        return cls._module

    @classmethod
    def _finish(cls) -> None:
        thread = cls._thread
        if thread is not None and thread.is_alive() and cls._pid == os.getpid():
            thread.join()

    @classmethod
    def _load(cls) -> None:
        try:
            from tpuanalyze.parsers import wire_jit

            wire_jit.warm_up()
            cls._module = wire_jit
        except Exception:  # numba missing or broken here: the numpy decoder reads every file
            cls._module = None

    @classmethod
    def result(cls) -> Any:
        cls.start()
        assert cls._thread is not None
        cls._thread.join()
        return cls._module


def decoder_mode() -> str:
    """``TPUANALYZE_DECODER``: 'numpy' (never compile), 'compiled' (every file), else 'auto' (by size)."""
    mode = os.environ.get("TPUANALYZE_DECODER", "auto")
    return mode if mode in ("numpy", "compiled") else "auto"


def compiled_decoder() -> Any:
    """The compiled kernels module (``parsers.wire_jit``), or None when ``TPUANALYZE_DECODER=numpy``
    or where numba cannot load (the numpy decoder then reads every file: same results, slower)."""
    if decoder_mode() == "numpy":
        return None
    return _Warmup.result()


def _check_line_span(
    stamps: list[tuple[int, int, int]], names: list[str], line_rows: list[list[tuple[Any, ...]]], where: str
) -> None:
    """Refuse a host whose lines with events start more than ``MAX_SPAN_NS`` apart (time policy,
    docs/input.md): the far line would set the host's time zero and shift every other event."""
    stamps = sorted(stamps)
    first, last = stamps[0], stamps[-1]
    if last[0] - first[0] <= MAX_SPAN_NS:
        return
    median = stamps[len(stamps) // 2][0]
    far = first if median - first[0] > last[0] - median else last
    _, plane_index, line_index = far
    days = abs(far[0] - median) / 86_400e9
    raise TraceFormatError(
        f"line #{line_index} ({line_rows[plane_index][line_index][2]!r}) of plane {names[plane_index]!r}: "
        f"timestamp_ns {far[0]} is {days:,.1f} days from the host's other lines "
        "(a host's events must lie within 7 days)",
        where,
    )


def _as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _as_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def plane_summary(space: Any) -> list[dict[str, Any]]:
    """Planes/lines/event counts in file order (used by tests and quick checks)."""
    return [
        {"name": p.name, "lines": [{"name": ln.name, "events": len(ln.events)} for ln in p.lines]}
        for p in space.planes
    ]
