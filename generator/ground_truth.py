"""Exact attribution of the written op intervals under the design.md contract, by a sweep in numpy.

Independent of how the schedule was built: it only sees (start, end, category) intervals per core, the
eval program spans and the Steps events. Priority at every instant: eval (by program) > weight_update >
compute > collectives > input > output > idle. Collectives under compute or weight_update count as
`collectives_overlapped` (outside the sum). Fractions are of the core's wall time, from the start of
its first Steps event to the end of its last.
"""

from __future__ import annotations

import numpy as np

CATEGORIES = ("eval", "weight_update", "compute", "collectives", "input", "output")
COLLECTIVE_KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")
BREAKDOWN_KEYS = ("compute", "weight_update", "collectives", "input", "output", "eval", "idle")


def sweep(
    starts: np.ndarray,
    ends: np.ndarray,
    cats: np.ndarray,
    step_bounds: np.ndarray,
    collective_kind: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Attribute intervals to categories for several cores at once.

    starts, ends: (n, W) interval bounds in ps (one column per core); cats: (n,) index into CATEGORIES.
    step_bounds: (S, 2) Steps event [start, end) in ps, the same on every written core.
    collective_kind: (n,) index into COLLECTIVE_KINDS for collective intervals (-1 otherwise); exposed
    collective time is then also split by kind, the first active in COLLECTIVE_KINDS order winning.
    Returns ps totals per category and core (W,), plus per-step totals (S, W) under "step_<cat>".
    """
    n, w = starts.shape
    times = np.concatenate([starts, ends], axis=0)
    cat = np.concatenate([cats, cats])
    delta = np.concatenate([np.ones(n, dtype=np.int64), -np.ones(n, dtype=np.int64)])
    order = np.argsort(times, axis=0, kind="stable")
    ts = np.take_along_axis(times, order, axis=0)
    cat_s = cat[order]
    delta_s = delta[order]
    seg = np.diff(ts, axis=0)  # length of the segment after each point
    active = [np.cumsum(np.where(cat_s == c, delta_s, 0), axis=0)[:-1] > 0 for c in range(len(CATEGORIES))]
    choice = np.select(active, list(range(len(CATEGORIES))), default=len(CATEGORIES))  # len = idle
    overlapped = active[3] & (active[1] | active[2]) & ~active[0]

    # which Steps event each segment lies in (segments between steps belong to none)
    flat_bounds = step_bounds.reshape(-1)
    region = np.searchsorted(flat_bounds, ts[:-1], side="right") - 1
    in_step = (region % 2 == 0) & (region >= 0) & (region < flat_bounds.size)
    step_idx = np.where(in_step, region // 2, -1)

    out: dict[str, np.ndarray] = {}
    for c, name in enumerate(CATEGORIES):
        out[name] = np.where(choice == c, seg, 0).sum(axis=0)
    out["collectives_overlapped"] = np.where(overlapped, seg, 0).sum(axis=0)
    if collective_kind is not None:
        kind_s = np.concatenate([collective_kind, collective_kind])[order]
        exposed = choice == CATEGORIES.index("collectives")
        taken = np.zeros_like(exposed)
        for k, name in enumerate(COLLECTIVE_KINDS):
            on = (np.cumsum(np.where(kind_s == k, delta_s, 0), axis=0)[:-1] > 0) & exposed & ~taken
            out["exposed_" + name] = np.where(on, seg, 0).sum(axis=0)
            taken |= on
    s_count = step_bounds.shape[0]
    # flat (step, core) bin per segment; segments outside every Steps event go to bin row s_count
    bins = (np.where(step_idx >= 0, step_idx, s_count) * w + np.arange(w)).ravel()
    size = (s_count + 1) * w

    def per_step(values: np.ndarray) -> np.ndarray:
        return np.bincount(bins, weights=values.ravel(), minlength=size).reshape(s_count + 1, w)[:s_count]

    for c, name in enumerate(CATEGORIES[1:], start=1):
        out["step_" + name] = per_step(np.where(choice == c, seg, 0))
    out["step_collectives_overlapped"] = per_step(np.where(overlapped, seg, 0))
    return out


class TruthAccumulator:
    """Sums per-core attributions over the written hosts; `result()` gives the ground-truth numbers."""

    def __init__(self, step_bounds_ps: np.ndarray, wall_ps: int) -> None:
        self.step_bounds = step_bounds_ps
        self.wall = float(wall_ps)
        self.per_core: list[dict[str, float]] = []
        self.step_sums: dict[str, np.ndarray] = {}
        self.cores = 0

    def add(
        self, host: int, ordinals: list[int], starts: np.ndarray, ends: np.ndarray, cats: np.ndarray
    ) -> None:
        self.add_sweep(host, ordinals, sweep(starts, ends, cats, self.step_bounds))

    def add_sweep(self, host: int, ordinals: list[int], res: dict[str, np.ndarray]) -> None:
        for i, ordinal in enumerate(ordinals):
            fr = {name: float(res[name][i]) / self.wall for name in CATEGORIES}
            fr["idle"] = 1.0 - sum(fr.values())
            fr["collectives_overlapped"] = float(res["collectives_overlapped"][i]) / self.wall
            for name in COLLECTIVE_KINDS:
                if "exposed_" + name in res:
                    fr["exposed_" + name] = float(res["exposed_" + name][i]) / self.wall
            fr["host"] = host
            fr["device_ordinal"] = ordinal
            self.per_core.append(fr)
        for key, val in res.items():
            if key.startswith("step_"):
                self.step_sums[key] = self.step_sums.get(key, 0) + val.sum(axis=1)
        self.cores += len(ordinals)

    def result(self) -> dict:
        keys = list(BREAKDOWN_KEYS) + ["collectives_overlapped"]
        mean = {k: float(np.mean([c[k] for c in self.per_core])) for k in keys}
        lo = {k: float(np.min([c[k] for c in self.per_core])) for k in keys}
        hi = {k: float(np.max([c[k] for c in self.per_core])) for k in keys}
        dur = self.step_bounds[:, 1] - self.step_bounds[:, 0]
        per_step = []
        for s in range(self.step_bounds.shape[0]):
            row = {"step": s, "step_time_ms": float(dur[s]) / 1e9}
            busy = 0.0
            for name in CATEGORIES[1:] + ("collectives_overlapped",):
                v = float(self.step_sums["step_" + name][s]) / self.cores / float(dur[s])
                row[name] = v
                busy += v if name != "collectives_overlapped" else 0.0
            row["idle"] = 1.0 - busy
            per_step.append(row)
        exposed = {
            k: float(np.mean([c.get("exposed_" + k, 0.0) for c in self.per_core])) for k in COLLECTIVE_KINDS
        }
        return {"mean": mean, "min": lo, "max": hi, "per_step": per_step, "exposed_by_kind": exposed}
