"""The direct load decodes a large plane's batches ahead of the inserts, a flush's worth at least:
with fewer ahead, decoding and inserting took turns (store/load.py ``_prefetched``)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from tpuanalyze.parsers.staging import CHUNK_EVENTS
from tpuanalyze.store.load import FLUSH_EVENTS, PREFETCH_MIN_EVENTS, _prefetched


def _reader(batches: int, produced: list[int]) -> SimpleNamespace:
    def plane_batches():
        for number in range(batches):
            produced.append(number)
            yield number

    plane = SimpleNamespace(info=SimpleNamespace(num_events=max(PREFETCH_MIN_EVENTS, batches * CHUNK_EVENTS)),
                            batches=plane_batches())
    return SimpleNamespace(planes=lambda: iter([plane]))


def _made(produced: list[int], wanted: int) -> int:
    """How many batches the decoding thread has made, once it made ``wanted`` or stopped short of it
    (its queue full) for a second."""
    seen, since = -1, time.monotonic()
    while len(produced) < wanted and time.monotonic() - since < 1.0:
        if len(produced) != seen:
            seen, since = len(produced), time.monotonic()
        time.sleep(0.005)
    return len(produced)


def test_a_large_plane_is_decoded_a_flush_ahead_of_the_insert():
    per_flush = FLUSH_EVENTS // CHUNK_EVENTS
    produced: list[int] = []
    (plane, batches), = list(_prefetched(_reader(4 * per_flush, produced)))
    first = next(batches)
    assert first == 0
    ahead = _made(produced, per_flush + 1) - 1  # made but not yet taken
    assert ahead >= per_flush, f"only {ahead} batches decoded ahead; a flush takes {per_flush}"
    assert list(batches) == list(range(1, 4 * per_flush))  # every batch, in order
