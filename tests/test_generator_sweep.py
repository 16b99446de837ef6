"""The ground-truth sweep against a brute-force attribution of every picosecond, on random intervals."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tpuanalyze.generator.ground_truth import CATEGORIES, COLLECTIVE_KINDS, sweep

PRIORITY = list(range(len(CATEGORIES)))  # eval, weight_update, compute, collectives, input, output


def _brute(starts, ends, cats, kinds, lo, hi):
    totals = np.zeros(len(CATEGORIES) + 1)
    overlapped = 0
    exposed = np.zeros(len(COLLECTIVE_KINDS))
    for t in range(lo, hi):
        active = {int(c) for s, e, c in zip(starts, ends, cats, strict=True) if s <= t < e}
        choice = next((c for c in PRIORITY if c in active), len(CATEGORIES))
        totals[choice] += 1
        if 3 in active and active & {1, 2} and 0 not in active:
            overlapped += 1
        if choice == 3:
            on = {
                int(k) for s, e, c, k in zip(starts, ends, cats, kinds, strict=True) if s <= t < e and k >= 0
            }
            exposed[min(on)] += 1
    return totals, overlapped, exposed


intervals = st.lists(
    st.tuples(
        st.integers(0, 60),
        st.integers(1, 25),
        st.integers(0, len(CATEGORIES) - 1),
        st.integers(0, len(COLLECTIVE_KINDS) - 1),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(intervals)
def test_sweep_matches_brute_force(rows) -> None:
    starts = np.array([[r[0]] for r in rows], dtype=np.int64)
    ends = starts + np.array([[r[1]] for r in rows], dtype=np.int64)
    cats = np.array([r[2] for r in rows])
    kinds = np.array([r[3] if r[2] == 3 else -1 for r in rows])
    lo, hi = int(starts.min()), int(ends.max())
    res = sweep(starts, ends, cats, np.array([[lo, hi]]), kinds)
    totals, overlapped, exposed = _brute(starts[:, 0], ends[:, 0], cats, kinds, lo, hi)
    for c, name in enumerate(CATEGORIES):
        assert res[name][0] == totals[c], name
    assert res["collectives_overlapped"][0] == overlapped
    for k, name in enumerate(COLLECTIVE_KINDS):
        assert res["exposed_" + name][0] == exposed[k], name
    assert res["step_compute"][0, 0] == totals[2]
