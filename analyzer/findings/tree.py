"""Root causes and combined gains (docs/findings.md "Root causes" and "How gains combine").

A finding explained by another carries ``caused_by``: the collective waits a straggler creates, the input
wait a slow host or the host's own processing creates. Its own estimate stays visible (``own_ms``) but is
not counted again (``ms`` 0). The stand-alone findings' gains are then combined: estimates on the same
category of step time are not additive (each removes a fraction of what is left), and the total never
exceeds the step time spent outside compute. Fractions are of the step cycle (a device's wall time per
train step), the base of the breakdown's shares.
"""

from __future__ import annotations

from typing import Any

COLLECTIVE_RULES = ("collective-bound", "latency-bound-collectives", "f32-gradient-allreduce",
                    "distributed-batch-norm")
INPUT_RULES = ("input-bound", "host-input-processing")


def _link(found: dict[str, dict], config: dict[str, Any]) -> None:
    """Set ``caused_by`` on findings another finding explains (one cause each, the most specific)."""
    strag = found.get("straggler")
    if strag is not None:
        m = strag["evidence"]["metrics"]
        compute, sync = m.get("collective_compute_ms") or 0.0, m.get("collective_sync_ms") or 0.0
        waiting = sync / (sync + compute) if sync + compute > 0 else 0.0
        if waiting >= config["root_causes"]["straggler_sync_share"]:  # the waits are for the slow core
            for rule in COLLECTIVE_RULES:
                if rule in found:
                    found[rule]["caused_by"] = "straggler"
        if "infeed" in strag.get("_reasons", ()):
            for rule in INPUT_RULES:  # a slow host's late batches are the input wait
                if rule in found:
                    found[rule]["caused_by"] = "straggler"
    hip = found.get("host-input-processing")
    if hip is not None and "caused_by" not in hip and "input-bound" in found:
        found["input-bound"]["caused_by"] = "host-input-processing"  # host decode/augment is the wait


def _root(rule: str, found: dict[str, dict]) -> str:
    seen = set()
    while "caused_by" in found[rule] and rule not in seen:
        seen.add(rule)
        rule = found[rule]["caused_by"]
    return rule


def _combine(stand_alone: list[dict], budget_ms: float, category_ms: dict[str, float]) -> dict[int, float]:
    """Combined ms per finding (by id): per category 1 - prod(1 - g_i / T_cat) of the category's time
    T_cat, shared in proportion to the own estimates; then all scaled to fit the budget."""
    by_cat: dict[str, list[dict]] = {}
    for f in stand_alone:
        by_cat.setdefault(f["_category"], []).append(f)
    out: dict[int, float] = {}
    for cat, group in by_cat.items():
        own = [f["_gain_ms"] for f in group]
        total_own = sum(own)
        # "a+b": a saving drawn from two categories (a straggler's infeed and the others' sync wait)
        parts = [category_ms.get(part) for part in cat.split("+")]
        cap = None if any(p is None for p in parts) else sum(parts)
        if cap is None or cap <= 0:  # a time the step breakdown does not hold (eval, gaps): no overlap
            combined = total_own
        else:
            left = 1.0
            for g in own:
                left *= 1.0 - min(g / cap, 1.0)
            combined = cap * (1.0 - left)
        for f, g in zip(group, own, strict=True):
            out[id(f)] = combined * g / total_own if total_own > 0 else 0.0
    total = sum(out.values())
    if total > budget_ms > 0 or budget_ms <= 0:
        scale = max(budget_ms, 0.0) / total if total > 0 else 0.0
        out = {k: v * scale for k, v in out.items()}
    return out


def _gain(ms: float, own_ms: float, step_ms: float, model: str, category: str) -> dict[str, Any]:
    return {"ms": round(ms, 4), "fraction": round(ms / step_ms, 4) if step_ms else None,
            "own_ms": round(own_ms, 4), "own_fraction": round(own_ms / step_ms, 4) if step_ms else None,
            "category": category, "label": "estimate", "model": model}


def resolve(drafts: list[dict], config: dict[str, Any], step: dict[str, Any]) -> list[dict]:
    """Link causes, combine gains and order the findings: each root (most severe, then largest gain)
    followed by the findings it explains."""
    found = {f["rule"]: f for f in drafts}
    _link(found, config)
    # Fractions and the budget are of the step cycle (wall time per train step: the steps, the gaps
    # between them, eval), so that idle and eval gains, which include time between steps, fit in it.
    step_ms = float(step.get("cycle_ms") or step.get("step_ms") or 0.0)
    compute = step.get("cycle_compute_fraction")
    if compute is None:
        compute = step.get("compute_fraction")
    budget_ms = step_ms * (1.0 - float(compute or 0.0))
    category_ms = {c: float(step.get(f"{c}_ms") or 0.0)
                   # idle and eval gains include time between steps: no per-category cap, the budget only
                   for c in ("compute", "weight_update", "collectives", "memory_transfer", "input", "output")}
    stand_alone = [f for f in drafts if "caused_by" not in f]
    combined = _combine(stand_alone, budget_ms, category_ms)
    for f in drafts:
        ms = combined.get(id(f), 0.0)
        f["estimated_gain"] = _gain(ms, f["_gain_ms"], step_ms, f["_model"], f["_category"])
        if "caused_by" in f:
            f["estimated_gain"]["model"] += f"; counted under {f['caused_by']}"
    order = {"high": 0, "medium": 1, "low": 2}
    roots = sorted(stand_alone, key=lambda f: (order[f["severity"]], -f["estimated_gain"]["ms"]))
    ordered: list[dict] = []
    for root in roots:
        ordered.append(root)
        children = [f for f in drafts if "caused_by" in f and _root(f["rule"], found) == root["rule"]]
        ordered += sorted(children, key=lambda f: (order[f["severity"]], -f["estimated_gain"]["own_ms"]))
    for f in drafts:
        for key in ("_gain_ms", "_model", "_category", "_reasons"):
            f.pop(key, None)
    return ordered
