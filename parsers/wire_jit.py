"""Compiled (numba) decoding of XLine events and their XStats: one pass over the bytes, no temporaries.

Why: the numpy decoder (``parsers.wire``) makes ~40 array passes per batch and the walk that finds
each event's bytes is a Python loop per event, both holding the GIL; together ~0.6 us per event.
These kernels read each byte once (~0.05 us per event) and release the GIL, so decoding runs
beside DuckDB's inserts on another core. Same results as ``parsers.wire`` + ``parsers.xspace``
field for field (last occurrence of a field wins; a stat's value is its highest-numbered value
field present, as the numpy decoder picks it), same refusals: every read is bounds-checked, and
a truncated varint, a length past its message or an unsupported wire type returns an error code,
never reads outside the buffer.

Compiled once and cached on disk (``cache=True``); imported only for files with many events
(``parsers.xspace.COMPILED_MIN_EVENTS``), as importing numba and loading the kernels costs 1-2 CPU
seconds and ~120 MB of RSS per process.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from tpuanalyze.parsers.wire import WireError

MAX_FIELD_NUMBER = (1 << 29) - 1

# Error codes of the kernels -> the messages ``parsers.wire.WireError`` uses.
OK = 0
ERRORS = {
    1: "truncated varint",
    2: "varint longer than 10 bytes",
    3: "truncated fixed64",
    4: "truncated fixed32",
    5: "unsupported wire type",
    6: "field number 0",
    7: "field number above 2^29-1",
    8: "field runs past the end of its message",
    9: "negative length",
    10: "message extends past the buffer",
}
LINE_ERROR = 11  # the XLine's own field structure is broken (reported as a corrupt line)

_NEG_LENGTH = np.uint64(1 << 63)


@njit(cache=True, nogil=True, inline="always")
def _varint(buf, pos, limit):
    """(value, position after it, error code): a varint at ``pos`` that must end before ``limit``."""
    value = np.uint64(0)
    shift = np.uint64(0)
    for _ in range(10):
        if pos >= limit:
            return value, pos, 1
        b = buf[pos]
        pos += 1
        value |= np.uint64(b & 0x7F) << shift
        if b < 0x80:
            return value, pos, 0
        shift += np.uint64(7)
    return value, pos, 2


@njit(cache=True, nogil=True, inline="always")
def _field(buf, pos, limit):
    """One field record at ``pos`` of a message ending at ``limit``:
    (field number, wire type, value or payload start, payload length, next position, error)."""
    tag, pos, err = _varint(buf, pos, limit)
    if err:
        return 0, 0, np.uint64(0), 0, pos, err
    field = tag >> np.uint64(3)
    wire = int(tag & np.uint64(7))
    value = np.uint64(0)
    length = 0
    after = pos
    if wire == 0:
        value, after, err = _varint(buf, pos, limit)
        if err:
            return 0, 0, value, 0, after, err
    elif wire == 1:
        if pos + 8 > limit:
            return 0, 0, value, 0, pos, 3
        for i in range(8):
            value |= np.uint64(buf[pos + i]) << np.uint64(8 * i)
        after = pos + 8
    elif wire == 2:
        size, start, err = _varint(buf, pos, limit)
        if err:
            return 0, 0, value, 0, start, err
        if size >= _NEG_LENGTH:
            return 0, 0, value, 0, start, 9
        if size > np.uint64(limit - start):
            return 0, 0, value, 0, start, 8
        value = np.uint64(start)
        length = int(size)
        after = start + length
    elif wire == 5:
        if pos + 4 > limit:
            return 0, 0, value, 0, pos, 4
        for i in range(4):
            value |= np.uint64(buf[pos + i]) << np.uint64(8 * i)
        after = pos + 4
    else:
        return 0, 0, value, 0, pos, 5
    if field == 0:
        return 0, 0, value, 0, after, 6
    if field > np.uint64(MAX_FIELD_NUMBER):
        return 0, 0, value, 0, after, 7
    return int(field), wire, value, length, after, 0


@njit(cache=True, nogil=True)
def line_events(buf, pos, end, cap, starts, ends):
    """Walk an XLine's bytes ``buf[pos:end]`` and record where its next ``cap`` events lie.

    Returns (events found, position to resume from, error): ``starts``/``ends`` get each XEvent's
    payload range. Other line fields are skipped (upb checked them when the line was validated).
    """
    if end > len(buf) or pos < 0:
        return 0, pos, LINE_ERROR
    n = 0
    while pos < end and n < cap:
        field, wire, value, length, after, err = _field(buf, pos, end)
        if err:
            return n, pos, LINE_ERROR
        if field == 4 and wire == 2:
            starts[n] = np.int64(value)
            ends[n] = np.int64(value) + length
            n += 1
        pos = after
    return n, pos, OK


@njit(cache=True, nogil=True)
def decode_events(buf, starts, ends, mid, offset, duration, occ, has_occ, stat_owner, stat_start, stat_end):
    """Decode the XEvents ``buf[starts[i]:ends[i]]``: metadata_id, offset_ps, duration_ps,
    num_occurrences (+ present), and the byte range and owner of each of their XStats.

    Returns (stats found, error, index of the failing event). Stats beyond the capacity of the
    ``stat_*`` arrays are counted but not written: the caller retries with the count.
    """
    n_stats = 0
    cap = len(stat_owner)
    size = len(buf)
    for i in range(len(starts)):
        pos = starts[i]
        limit = ends[i]
        if pos < 0 or limit > size or pos > limit:
            return n_stats, 10, i
        m = np.uint64(0)
        o = np.uint64(0)
        d = np.uint64(0)
        c = np.uint64(0)
        has = False
        while pos < limit:
            field, wire, value, length, after, err = _field(buf, pos, limit)
            if err:
                return n_stats, err, i
            if wire == 0:
                if field == 1:
                    m = value
                elif field == 2:
                    o = value
                elif field == 3:
                    d = value
                elif field == 5:
                    c = value
                    has = True
            elif wire == 2 and field == 4:
                if n_stats < cap:
                    stat_owner[n_stats] = i
                    stat_start[n_stats] = np.int64(value)
                    stat_end[n_stats] = np.int64(value) + length
                n_stats += 1
            pos = after
        mid[i] = np.int64(m)
        offset[i] = np.int64(o)
        duration[i] = np.int64(d)
        occ[i] = np.int64(c)
        has_occ[i] = has
    return n_stats, 0, -1


@njit(cache=True, nogil=True)
def decode_stats(buf, starts, ends, mid, number, f64, u64, i64, ref, str_start, str_len, raw_start, raw_len):
    """Decode the XStats ``buf[starts[i]:ends[i]]``: metadata_id, which value field holds the value
    (``number``: the highest-numbered value field present, 0 for none), and every value field's last
    occurrence (double as its bits in ``f64``; str/bytes as byte ranges). Returns (error, index)."""
    size = len(buf)
    for i in range(len(starts)):
        pos = starts[i]
        limit = ends[i]
        if pos < 0 or limit > size or pos > limit:
            return 10, i
        m = np.uint64(0)
        num = 0
        vf = np.uint64(0)
        vu = np.uint64(0)
        vi = np.uint64(0)
        vr = np.uint64(0)
        ss = 0
        sl = 0
        bs = 0
        bl = 0
        while pos < limit:
            field, wire, value, length, after, err = _field(buf, pos, limit)
            if err:
                return err, i
            if field == 1 and wire == 0:
                m = value
            elif field == 2 and wire == 1:
                vf = value
                num = max(num, 2)
            elif field == 3 and wire == 0:
                vu = value
                num = max(num, 3)
            elif field == 4 and wire == 0:
                vi = value
                num = max(num, 4)
            elif field == 5 and wire == 2:
                ss = np.int64(value)
                sl = length
                num = max(num, 5)
            elif field == 6 and wire == 2:
                bs = np.int64(value)
                bl = length
                num = max(num, 6)
            elif field == 7 and wire == 0:
                vr = value
                num = max(num, 7)
            pos = after
        mid[i] = np.int64(m)
        number[i] = num
        f64[i] = vf
        u64[i] = vu
        i64[i] = np.int64(vi)
        ref[i] = np.int64(vr)
        str_start[i] = ss
        str_len[i] = sl
        raw_start[i] = bs
        raw_len[i] = bl
    return 0, -1


@njit(cache=True, nogil=True)
def message_fields(buf, tags, starts, afters, field_starts):
    """Walk a message's top-level fields ``buf[0:len(buf)]`` (an XPlane's, for
    ``parsers.xspace._split_lines``): each field's tag (number << 3 | wire type), payload start (of a
    length-delimited field; any other field's is its end), end, and where the field itself starts.
    The arrays may be empty (a counting pass) or hold at least as many entries as there are fields.
    Returns (fields, error): any error stops the walk (the caller words it)."""
    pos = 0
    end = len(buf)
    n = 0
    cap = len(tags)
    while pos < end:
        field, wire, value, length, after, err = _field(buf, pos, end)
        if err:
            return n, err
        if n < cap:
            tags[n] = np.int64(field) * 8 + wire
            starts[n] = np.int64(value) if wire == 2 else after
            afters[n] = after
            field_starts[n] = pos
        n += 1
        pos = after
    return n, OK


def fields(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``message_fields`` of ``buf``: (tags, payload starts, ends, field starts), or None where the
    bytes are malformed (the caller's own walk then names what is wrong)."""
    empty = np.empty(0, np.int64)
    count, err = message_fields(buf, empty, empty, empty, empty)
    if err:
        return None
    out = tuple(np.empty(count, np.int64) for _ in range(4))
    message_fields(buf, *out)
    return out  # type: ignore[return-value]


@njit(cache=True, nogil=True)
def lines_fields(buf, starts, ends, counts, other_counts, other_starts, other_ends):
    """Walk each XLine ``buf[starts[i]:ends[i]]`` (a plane's lines, for ``parsers.xspace._Plane.lines``):
    ``counts[i]`` its events (field 4, length-delimited), ``other_counts[i]`` its other fields and the
    (start, end) of the first ``other_starts.shape[1]`` of them in row ``i``. Returns (index of the first
    malformed line, error code), or (-1, OK): the caller's upb parse then names what is wrong."""
    cap = other_starts.shape[1]
    for i in range(len(starts)):
        pos = starts[i]
        end = ends[i]
        if pos < 0 or end > len(buf) or pos > end:
            return i, LINE_ERROR
        events = 0
        other = 0
        while pos < end:
            field, wire, value, length, after, err = _field(buf, pos, end)
            if err:
                return i, err
            if field == 4 and wire == 2:
                events += 1
            else:
                if other < cap:
                    other_starts[i, other] = pos
                    other_ends[i, other] = after
                other += 1
            pos = after
        counts[i] = events
        other_counts[i] = other
    return -1, OK


def line_headers(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``lines_fields`` over the lines at ``buf[starts[i]:ends[i]]``: (events per line, other fields per
    line, their starts and ends, ``cap`` columns), or None where a line is malformed."""
    n = len(starts)
    counts, other = np.empty(n, np.int64), np.empty(n, np.int64)
    other_starts, other_ends = np.empty((n, cap), np.int64), np.empty((n, cap), np.int64)
    bad, _ = lines_fields(buf, starts, ends, counts, other, other_starts, other_ends)
    if bad >= 0:
        return None
    return counts, other, other_starts, other_ends


class JitWireError(WireError):
    """Malformed bytes found by a kernel (worded as the numpy decoder words it)."""


def events(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
    """XEvents at ``buf[starts[i]:ends[i]]`` -> (metadata_id, offset_ps, duration_ps, num_occurrences,
    has_occurrences, stat_owner, stat_start, stat_end), all int64 except the bool mask."""
    n = len(starts)
    mid = np.empty(n, np.int64)
    offset = np.empty(n, np.int64)
    duration = np.empty(n, np.int64)
    occ = np.empty(n, np.int64)
    has_occ = np.empty(n, np.bool_)
    cap = 2 * n + 16
    while True:
        owner = np.empty(cap, np.int64)
        sstart = np.empty(cap, np.int64)
        send = np.empty(cap, np.int64)
        count, err, _ = decode_events(
            buf, starts, ends, mid, offset, duration, occ, has_occ, owner, sstart, send
        )
        if err:
            raise JitWireError(ERRORS[err])
        if count <= cap:
            return mid, offset, duration, occ, has_occ, owner[:count], sstart[:count], send[:count]
        cap = count


def stats(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
    """XStats at ``buf[starts[i]:ends[i]]`` -> (metadata_id, value field number (int8), double, uint64,
    int64, ref, str start, str length, bytes start, bytes length)."""
    m = len(starts)
    out = (
        np.empty(m, np.int64),
        np.empty(m, np.int8),
        np.empty(m, np.uint64),
        np.empty(m, np.uint64),
        np.empty(m, np.int64),
        np.empty(m, np.int64),
        np.empty(m, np.int64),
        np.empty(m, np.int64),
        np.empty(m, np.int64),
        np.empty(m, np.int64),
    )
    err, _ = decode_stats(buf, starts, ends, *out)
    if err:
        raise JitWireError(ERRORS[err])
    mid, number, f64_bits, *rest = out
    return (mid, number, f64_bits.view(np.float64), *rest)


def warm_up() -> None:
    """Load every kernel (from numba's on-disk cache, compiling it the first time) on a tiny input."""
    buf = np.frombuffer(b"\x08\x01", dtype=np.uint8)
    starts, ends = np.zeros(1, np.int64), np.full(1, 2, np.int64)
    events(buf, starts, ends)
    stats(buf, starts, ends)
    line_events(buf, 0, 0, 1, starts.copy(), ends.copy())
    fields(buf)
    line_headers(buf, starts, ends, 2)
