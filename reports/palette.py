"""The one visual language of every report: category order, labels and colors, and natural host order.

Every chart (HTML, the stand-alone scaling page) and every table (terminal and HTML) takes its colors
from here, so a category looks the same everywhere: compute is blue in the breakdown, the top-ops
chart and the scaling charts alike. tests/test_palette.py walks the report's Vega-Lite specs to hold
this.
"""

from __future__ import annotations

import re

# The attribution categories in the order of the design contract (the priority order, with eval
# decided first).
CATEGORIES = ["compute", "weight_update", "collectives", "memory_transfer", "input", "output", "eval", "idle"]
CATEGORY_COLORS = {
    "compute": "#4c78a8",
    "weight_update": "#72b7b2",
    "collectives": "#f58518",
    "memory_transfer": "#eeca3b",
    "input": "#e45756",
    "output": "#b279a2",
    "eval": "#54a24b",
    "idle": "#bab0ac",
}
CATEGORY_LABELS = {
    "compute": "compute",
    "weight_update": "weight update",
    "collectives": "collectives (exposed)",
    "memory_transfer": "memory transfers (waits)",
    "input": "input (infeed)",
    "output": "output (outfeed)",
    "eval": "eval",
    "idle": "idle",
}
# Shades and neighbours of the categories, for the parts of one category a chart splits.
COLLECTIVES_OVERLAPPED = "#ffbf79"  # collective time hidden under compute: a light collectives
IDLE_BETWEEN_STEPS = "#d9d4d1"  # idle between steps (host overhead): a light idle
OTHER = "#9d755d"  # time outside every category
TOTAL = "#333333"  # a sum of categories (step time, time to train): neutral, never a category's color
MEASURED_POINT = "#222222"  # measured points drawn over a fitted line of a total
BOUNDARY = "#2f6f6a"  # a regime boundary (a rule across a chart)
EFFICIENCY = "#6f4e7c"  # scaling efficiency: not a category, so none of their colors
ROOFLINE = {"compute": CATEGORY_COLORS["compute"], "memory": "#9467bd", "roof": "#555555"}


def category_of(value: str | None) -> str | None:
    """The attribution category a label or id names ('collectives (exposed)' -> 'collectives')."""
    if value is None:
        return None
    text = str(value)
    if text in CATEGORY_COLORS:
        return text
    for category, label in CATEGORY_LABELS.items():
        if text == label:
            return category
    return None


def natural_key(text: object) -> tuple:
    """Sort key that orders numbers inside names by value: w-2 before w-10, TPU:9 before TPU:10."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", str(text)) if part)


def natural_sorted(values) -> list:
    return sorted(values, key=natural_key)
