"""Vectorised protobuf wire encoding of repeated XEvent messages (fields of `tpuanalyze.proto.xplane`).

Building millions of XEvent objects one by one is the slow part of writing a 4096-chip run, so the
events of a line are encoded column-wise with numpy: each field is a varint column, rows are glued
with a byte mask. The result is byte-for-byte what `XLine.SerializeToString()` would emit for the
events (tests check that against the generated `xplane_pb2` classes); the line header, planes and
metadata are built with `xplane_pb2` itself.
"""

from __future__ import annotations

import numpy as np

# XEvent: metadata_id=1 (varint), offset_ps=2, duration_ps=3, stats=4 (message)
# XStat:  metadata_id=1, int64_value=4
_T_EV_MD, _T_EV_OFF, _T_EV_DUR, _T_EV_STAT = 0x08, 0x10, 0x18, 0x22
_T_ST_MD, _T_ST_INT = 0x08, 0x20
_T_LINE_EVENT = 0x22  # XLine.events = 4


_THRESHOLDS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def varint_len(v: np.ndarray) -> np.ndarray:
    """Bytes a non-negative varint takes (1..10)."""
    return np.searchsorted(_THRESHOLDS, np.asarray(v, dtype=np.uint64), side="right") + 1


def _varint_cols(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lens = varint_len(v)
    width = int(lens.max()) if v.size else 1
    cols = np.empty((v.size, width), dtype=np.uint8)
    rest = v.astype(np.uint64)
    for k in range(width):
        cols[:, k] = (rest & np.uint64(0x7F)).astype(np.uint8)
        rest = rest >> np.uint64(7)
        if k < width - 1:
            cols[:, k] |= (rest > 0).view(np.uint8) << 7
    return cols, lens


class _Rows:
    """Row-wise concatenation of byte pieces (constants or varint columns) for n records."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pieces: list[tuple[np.ndarray, np.ndarray]] = []

    def const(self, byte: int) -> None:
        self.pieces.append((np.full((self.n, 1), byte, dtype=np.uint8), np.ones(self.n, dtype=np.int64)))

    def varint(self, v: np.ndarray | int) -> None:
        if np.ndim(v) == 0:  # a constant: encode once, repeat
            one, lens = _varint_cols(np.array([v]))
            self.pieces.append((np.repeat(one, self.n, axis=0), np.repeat(lens, self.n)))
            return
        arr = np.broadcast_to(np.asarray(v, dtype=np.uint64), (self.n,))
        self.pieces.append(_varint_cols(np.ascontiguousarray(arr)))

    def lengths(self) -> np.ndarray:
        total = np.zeros(self.n, dtype=np.int64)
        for _, lens in self.pieces:
            total += lens
        return total

    def pack(self) -> tuple[np.ndarray, np.ndarray]:
        """Scatter each piece's byte columns to their row offsets; masks only where widths differ."""
        row_len = self.lengths()
        pos = np.zeros(self.n, dtype=np.int64)
        pos[1:] = np.cumsum(row_len)[:-1]
        out = np.empty(int(row_len.sum()), dtype=np.uint8)
        for cols, lens in self.pieces:
            shortest = int(lens.min())
            for k in range(cols.shape[1]):
                if k < shortest:
                    out[pos + k] = cols[:, k]
                else:
                    valid = lens > k
                    out[pos[valid] + k] = cols[valid, k]
            pos += lens
        return out, row_len


def encode_events(
    metadata_id: np.ndarray,
    offset_ps: np.ndarray,
    duration_ps: np.ndarray,
    int_stats: list[tuple[int, np.ndarray, np.ndarray | None]] | None = None,
    groups: list[int] | None = None,
) -> list[bytes]:
    """The bytes of `XLine.events` (field 4, repeated) for these events, with optional int64 stats.

    int_stats: (stat metadata id, values, present mask or None). groups: split the rows into
    consecutive groups (e.g. one per core) and return one byte string per group."""
    n = int(metadata_id.size)
    groups = groups if groups is not None else [n]
    if n == 0:
        return [b"" for _ in groups]
    inner = _Rows(n)
    inner.const(_T_EV_MD)
    inner.varint(metadata_id)
    inner.const(_T_EV_OFF)
    inner.varint(offset_ps)
    inner.const(_T_EV_DUR)
    inner.varint(duration_ps)
    for stat_md, values, present in int_stats or []:
        v = np.broadcast_to(np.asarray(values, dtype=np.int64), (n,)).astype(np.uint64)
        md_len = int(varint_len(np.array([stat_md]))[0])
        stat_len = 1 + md_len + 1 + varint_len(v)
        parts = [
            (_T_EV_STAT, None),
            (None, stat_len),
            (_T_ST_MD, None),
            (None, np.uint64(stat_md)),
            (_T_ST_INT, None),
            (None, v),
        ]
        for const, var in parts:
            if const is not None:
                inner.const(const)
            else:
                inner.varint(var)
            if present is not None:  # absent rows write nothing for this stat
                cols, lens = inner.pieces[-1]
                inner.pieces[-1] = (cols, np.where(present, lens, 0))
    outer = _Rows(n)
    outer.const(_T_LINE_EVENT)
    outer.varint(inner.lengths())
    outer.pieces += inner.pieces
    buf, row_len = outer.pack()
    ends = np.concatenate(([0], np.cumsum(row_len)))
    bounds = ends[np.concatenate(([0], np.cumsum(groups)))]
    data = buf.tobytes()
    return [data[int(bounds[i]) : int(bounds[i + 1])] for i in range(len(groups))]


def length_delimited(field_number: int, payload: bytes) -> bytes:
    """One length-delimited field (tag, varint length, payload)."""
    return _scalar_varint((field_number << 3) | 2) + _scalar_varint(len(payload)) + payload


def _scalar_varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
