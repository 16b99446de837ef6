"""Integer keys of several columns, for the layers below the pipeline alike (numpy only)."""

from __future__ import annotations

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
