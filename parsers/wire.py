"""Vectorised protobuf wire-format decoding with numpy: many small messages at once.

Why: materialising one upb Python object per XEvent costs about a microsecond, which caps an
XSpace reader at a few hundred thousand events per second. Instead the reader gets each line's
events as raw bytes and decodes *all* events of a plane together: every loop iteration below
reads the k-th field of every message still having fields, so the Python loop runs (fields per
message) times, not (messages) times. Truncated or malformed input raises ``WireError``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_SHIFTS = [np.uint64(7 * i) for i in range(10)]
_LOW7 = np.uint8(0x7F)
_HIGH = np.uint8(0x80)


MAX_FIELD_NUMBER = (1 << 29) - 1  # protobuf's largest field number


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def varints(buf: np.ndarray, pos: np.ndarray, limit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode one varint at each position; returns (uint64 values, positions after them).

    Dense passes over all rows while many varints continue (cheap gathers, no scatter), then
    sparse passes over the few long ones.
    """
    n = len(pos)
    if n and (pos >= limit).any():
        raise WireError("truncated varint")
    b = buf[pos]
    values = (b & _LOW7).astype(np.uint64)
    length = np.ones(n, dtype=np.int64)
    cont = b >= _HIGH
    idx: np.ndarray | None = None
    k = 1
    while True:
        if idx is None:
            count = int(np.count_nonzero(cont))
            if count == 0:
                break
            if count * 8 < n:
                idx = np.flatnonzero(cont)
                continue
            p = pos + k
            if ((p >= limit) & cont).any():
                raise WireError("truncated varint")
            bk = buf.take(p, mode="clip")
            values |= ((bk & _LOW7).astype(np.uint64) << _SHIFTS[k]) * cont
            length += cont
            cont &= bk >= _HIGH
        else:
            if not len(idx):
                break
            p = pos[idx] + k
            if (p >= limit[idx]).any():
                raise WireError("truncated varint")
            bk = buf[p]
            values[idx] |= (bk & _LOW7).astype(np.uint64) << _SHIFTS[k]
            length[idx] += 1
            idx = idx[bk >= _HIGH]
        k += 1
        if k >= 10 and (idx is None and cont.any() or idx is not None and len(idx)):
            raise WireError("varint longer than 10 bytes")
    return values, pos + length


def fixed64(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Little-endian 8-byte words at each position, as uint64."""
    gathered = buf[pos[:, None] + np.arange(8)]
    return np.ascontiguousarray(gathered).view("<u8").reshape(-1).astype(np.uint64, copy=False)


@dataclass
class Fields:
    """Every field record of a batch of messages, in wire order within each message.

    ``msg``: index of the owning message; ``field`` number; ``wire`` type; ``value``: the varint or
    fixed value (wire types 0, 1, 5) or the payload start (wire type 2); ``length``: payload length
    (wire type 2, else 0).
    """

    msg: np.ndarray
    field: np.ndarray
    wire: np.ndarray
    value: np.ndarray
    length: np.ndarray

    def select(self, field: int, wire: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mask = (self.field == field) & (self.wire == wire)
        return self.msg[mask], self.value[mask], self.length[mask]


def decode_fields(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Fields:
    """Split each message ``buf[starts[i]:ends[i]]`` into its field records."""
    parts: list[tuple[np.ndarray, ...]] = []
    pos = starts.astype(np.int64, copy=True)
    ends = ends.astype(np.int64, copy=False)
    active = np.flatnonzero(pos < ends)
    while len(active):
        p = pos[active]
        limit = ends[active]
        tag, p = varints(buf, p, limit)
        field = (tag >> np.uint64(3)).astype(np.int64)
        wire = (tag & np.uint64(7)).astype(np.int8)
        value = np.zeros(len(active), dtype=np.uint64)
        length = np.zeros(len(active), dtype=np.int64)
        new_pos = p.copy()
        w0 = np.flatnonzero(wire == 0)
        if len(w0):
            value[w0], new_pos[w0] = varints(buf, p[w0], limit[w0])
        w1 = np.flatnonzero(wire == 1)
        if len(w1):
            if (p[w1] + 8 > limit[w1]).any():
                raise WireError("truncated fixed64")
            value[w1] = fixed64(buf, p[w1])
            new_pos[w1] = p[w1] + 8
        w2 = np.flatnonzero(wire == 2)
        if len(w2):
            ln, after = varints(buf, p[w2], limit[w2])
            ln = ln.astype(np.int64)
            if (ln < 0).any():
                raise WireError("negative length")
            value[w2] = after.astype(np.uint64)
            length[w2] = ln
            new_pos[w2] = after + ln
        w5 = np.flatnonzero(wire == 5)
        if len(w5):
            if (p[w5] + 4 > limit[w5]).any():
                raise WireError("truncated fixed32")
            gathered = buf[p[w5][:, None] + np.arange(4)]
            value[w5] = np.ascontiguousarray(gathered).view("<u4").reshape(-1).astype(np.uint64)
            new_pos[w5] = p[w5] + 4
        if ((wire == 3) | (wire == 4) | (wire > 5)).any():
            raise WireError("unsupported wire type")
        if (field == 0).any():
            raise WireError("field number 0")
        if (field > MAX_FIELD_NUMBER).any():
            raise WireError("field number above 2^29-1")
        if (new_pos > limit).any():
            raise WireError("field runs past the end of its message")
        parts.append((active, field, wire, value, length))
        pos[active] = new_pos
        active = active[new_pos < limit]
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return Fields(empty, empty, np.zeros(0, np.int8), np.zeros(0, np.uint64), empty)
    return Fields(*(np.concatenate(cols) for cols in zip(*parts, strict=True)))


def scalar(
    fields: Fields, n: int, field: int, wire: int = 0, default: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A scalar field per message (last occurrence wins, as in protobuf): (uint64 values, present)."""
    msg, value, _ = fields.select(field, wire)
    out = np.full(n, default, dtype=np.uint64)
    present = np.zeros(n, dtype=bool)
    out[msg] = value
    present[msg] = True
    return out, present


def strings(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> list[str]:
    """``buf[start:start+length]`` per row, decoded as UTF-8 (protobuf ``string`` fields must be).

    One Python ``str`` per value: only event stats with string values come here (host threads'
    annotations, not the millions of device ops). Raises ``WireError`` on invalid UTF-8.
    """
    view = memoryview(buf)
    try:
        return [
            str(view[start : start + size], "utf-8")
            for start, size in zip(starts.tolist(), lengths.tolist(), strict=True)
        ]
    except UnicodeDecodeError as exc:
        raise WireError(f"invalid UTF-8 in a string field ({exc.reason})") from None
