"""What the findings leave unexplained: a large share of wall time that no catalog rule speaks to.

"No finding" must not read as "nothing to fix". When a category other than compute takes a large share
of the step cycle and no finding draws its gain from it (an XLA async copy wait, say, for which the
catalog has no technique, or a rule its platform silences), a note names the category, its share and
the ops that make it up, so the reader knows where the time goes and that the catalog is silent on it.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

# A category at or above this share of wall time is worth a sentence when no finding covers it: the
# lowest "medium" trigger of the rules on step shares is 3-10% (catalog §4); a fifth of the cycle left
# unexplained is the point where the reader must be told, not a threshold of any one rule.
UNCOVERED_SHARE = 0.20
TOP_OPS = 3
# compute is the work itself (its rules, data-parallel-limit and data-formatting, judge its efficiency)
_NOT_A_COST = ("compute",)


def uncovered_notes(breakdown: dict[str, float], findings: list[dict[str, Any]],
                    ops: pd.DataFrame) -> list[str]:
    """One note per large category of the breakdown that no finding's gain comes out of."""
    covered = {part for f in findings
               for part in str((f.get("estimated_gain") or {}).get("category") or "").split("+")}
    notes = []
    for category, share in sorted(breakdown.items(), key=lambda kv: -(kv[1] or 0.0)):
        if category in _NOT_A_COST or category in covered or (share or 0.0) < UNCOVERED_SHARE:
            continue
        notes.append(f"{category} is {share:.0%} of wall time and no catalog rule covers it"
                     f"{_top_ops(ops, category)}")
    return notes


def _top_ops(ops: pd.DataFrame, category: str) -> str:
    if ops.empty or "category" not in ops:
        return ""
    mine = ops[ops["category"] == category].nlargest(TOP_OPS, "self_time_ms")
    if mine.empty:  # idle, or time between ops
        return ""
    parts = [f"{row['name']} ({row['share']:.0%} of op time)" for _, row in mine.iterrows()
             if row["share"] == row["share"]]
    return f"; its largest ops: {', '.join(parts)}" if parts else ""
