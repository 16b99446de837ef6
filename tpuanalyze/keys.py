"""Integer keys of several columns, and which lines are device op lines, for the layers below the
pipeline alike (numpy only): the store's batch and the analyzer's array forms share them."""

from __future__ import annotations

from typing import Any

import numpy as np


def columns_in(rows: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Whether each column of ``rows`` (k x n ints >= 0) is a column of ``table`` (k x m ints >= 0):
    on one packed integer per column where the values fit, else row by row in Python."""
    if not table.shape[1] or not rows.shape[1]:
        return np.zeros(rows.shape[1], bool)
    bits = [max(int(rows[i].max()), int(table[i].max()), 0).bit_length() for i in range(rows.shape[0])]
    if sum(bits) <= 62 and int(rows.min()) >= 0 and int(table.min()) >= 0:
        def packed(values: np.ndarray) -> np.ndarray:
            key = np.zeros(values.shape[1], np.int64)
            for i, width in enumerate(bits):
                key = (key << width) | values[i].astype(np.int64)
            return key
        return np.isin(packed(rows), packed(table))
    known = set(map(tuple, table.T.tolist()))
    return np.array([tuple(c) in known for c in rows.T.tolist()], dtype=bool)


# The device op lines, which stage att_ops' device branch reads (analyzer/attribution.sql): an
# 'XLA Ops', 'Async XLA Ops' or 'Stream #...' line of a TPU or GPU plane. The numpy forms and the SQL
# form (analyzer/op_kinds.py, OP_LINES_SQL) are built from these.
DEVICE_PLANE_PREFIXES = ("/device:TPU:", "/device:GPU:")
OP_LINE_NAMES = ("XLA Ops", "Async XLA Ops")
STREAM_LINE_PREFIX = "Stream #"


def is_op_line(plane_name: object, line_name: object) -> bool:
    """Whether a line of this name on a plane of this name is a device op line (NULL names: no)."""
    return (isinstance(plane_name, str) and plane_name.startswith(DEVICE_PLANE_PREFIXES)
            and isinstance(line_name, str)
            and (line_name in OP_LINE_NAMES or line_name.startswith(STREAM_LINE_PREFIX)))


# Entries of a dense lookup table (``lookup``) above which a sorted search is used instead
DENSE_LOOKUP_LIMIT = 1 << 24


def dense_extents(ids: np.ndarray, limit: int | None = None) -> tuple[int, ...] | None:
    """The extent (largest id + 1) of each row of ``ids`` (k x n ints) for a dense table indexed by its
    columns, or None where an id is negative or the table would exceed ``limit`` entries (default
    ``DENSE_LOOKUP_LIMIT``). No ids: extents 1."""
    limit = DENSE_LOOKUP_LIMIT if limit is None else limit
    if not ids.shape[1]:
        return (1,) * ids.shape[0]
    if int(ids.min()) < 0:
        return None
    extents = tuple(int(row.max()) + 1 for row in ids)
    return extents if int(np.prod(extents, dtype=object)) <= limit else None


def lookup(keys: np.ndarray, values: np.ndarray, ids: np.ndarray, default: Any = 0,
           limit: int | None = None) -> np.ndarray:
    """For each column of ``ids`` (k x n ints, e.g. events' (host, plane, line)), the value of the equal
    column of ``keys`` (k x m ints; where one repeats, its last value), else ``default``; ``values``'
    dtype. A dense table indexed by the ids where they are compact (``dense_extents``: one gather per
    column), else a search in the sorted keys: any ids, never an error."""
    values = np.asarray(values)
    keys = np.asarray(keys, dtype=np.int64).reshape(ids.shape[0], -1)
    ids = np.asarray(ids, dtype=np.int64)
    out_empty = np.full(ids.shape[1], default, dtype=values.dtype)
    if not ids.shape[1] or not keys.shape[1]:
        return out_empty
    extents = dense_extents(ids, limit)
    if extents is not None:
        inside = np.all((keys >= 0) & (keys < np.array(extents)[:, None]), axis=0)
        table = np.full(int(np.prod(extents)), default, dtype=values.dtype)
        table[np.ravel_multi_index(keys[:, inside], extents)] = values[inside]
        return table[np.ravel_multi_index(ids, extents)]
    # sorted search: each column packed into one integer where the values fit, else numbered together
    low = np.minimum(ids.min(axis=1), keys.min(axis=1))
    high = np.maximum(ids.max(axis=1), keys.max(axis=1))
    bits = [int(h - lo).bit_length() for lo, h in zip(low.tolist(), high.tolist(), strict=True)]
    if sum(bits) <= 62:
        def packed(columns: np.ndarray) -> np.ndarray:
            key = np.zeros(columns.shape[1], np.int64)
            for row, lo, width in zip(columns, low.tolist(), bits, strict=True):
                key = (key << width) | (row - lo)
            return key
        key_codes, id_codes = packed(keys), packed(ids)
    else:
        _, inverse = np.unique(np.concatenate([keys, ids], axis=1), axis=1, return_inverse=True)
        inverse = inverse.reshape(-1)
        key_codes, id_codes = inverse[: keys.shape[1]], inverse[keys.shape[1]:]
    order = np.argsort(key_codes, kind="stable")
    sorted_codes = key_codes[order]
    at = np.searchsorted(sorted_codes, id_codes, side="right") - 1  # the last of equal keys
    found = at >= 0
    found[found] = sorted_codes[at[found]] == id_codes[found]
    out = out_empty
    out[found] = values[order[at[found]]]
    return out
