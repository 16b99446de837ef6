"""analyzer/coverage.py: a large share of wall time that no finding's gain comes out of gets a note;
a category a finding covers (alone or joined with '+') and compute never do."""

from __future__ import annotations

import pandas as pd
from tpuanalyze.analyzer.coverage import UNCOVERED_SHARE, uncovered_notes

BREAKDOWN = {"compute": 0.40, "input": 0.30, "collectives": 0.25, "idle": 0.05}
OPS = pd.DataFrame({"name": ["infeed.1", "infeed.2", "all-reduce.3", "fusion"],
                    "category": ["input", "input", "collectives", "compute"],
                    "self_time_ms": [50.0, 10.0, 40.0, 80.0], "share": [0.28, 0.06, 0.22, 0.44]})


def test_each_large_uncovered_category_is_named_with_its_ops() -> None:
    notes = uncovered_notes(BREAKDOWN, [], OPS)
    assert [n.split(" ")[0] for n in notes] == ["input", "collectives"]  # largest first; compute never
    assert notes[0].startswith("input is 30% of wall time and no catalog rule covers it")
    assert "infeed.1 (28% of op time), infeed.2 (6% of op time)" in notes[0]
    assert "all-reduce.3" in notes[1] and "infeed" not in notes[1]


def test_a_finding_covers_its_categories() -> None:
    joined = [{"rule": "straggler", "estimated_gain": {"category": "collectives+input"}}]
    assert uncovered_notes(BREAKDOWN, joined, OPS) == []
    only_input = [{"rule": "input-bound", "estimated_gain": {"category": "input"}}]
    assert [n.split(" ")[0] for n in uncovered_notes(BREAKDOWN, only_input, OPS)] == ["collectives"]


def test_below_the_share_no_note() -> None:
    small = {"compute": 0.9, "memory_transfer": UNCOVERED_SHARE - 0.01}
    assert uncovered_notes(small, [], OPS) == []
    assert uncovered_notes({"compute": 0.1, "idle": 0.9}, [], OPS) == ["idle is 90% of wall time and no "
                                                                       "catalog rule covers it"]
