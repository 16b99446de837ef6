"""Cross-run scaling: per-category time per step vs chips, simple fitted models, projections and the
``scaling-limit`` finding (catalog §3.13).

Works on a plain table, independent of where the numbers come from: one row per run with columns
``run``, ``chips`` and the metric (``step_time_ms`` for traces, ``time_to_train_s`` for MLPerf
series), optionally the per-category times (``compute``, ``weight_update``, ``collectives``, ``input``,
``output``, ``eval``, ``idle``, same unit as the metric), ``cores``, ``per_core_batch``,
``global_batch`` and ``epochs``.

Per category the model is the best of a few simple forms in N = chips (catalog §3.13, §2 cost models):
``constant`` (a), ``inverse`` (a + b/N: compute at a fixed global batch, constant at fixed per-core
batch when b ~ 0), ``log`` (a + b log2 N: tree/torus collective latency), ``sqrt`` (a + b sqrt N: hop
count across a 2-D torus), ``linear`` (a + b N) and ``power`` (a N^b). With three or more runs the form
with the smallest leave-one-out error wins; with two runs every two-parameter form fits exactly, so the
cost-model prior of the category decides (constant when the two runs differ by < 2%). When the per-core
batch differs between runs, compute and input are fitted per example against the per-core batch
(MXU efficiency, catalog §3.1) instead of N. Projections are estimates and carry the fit's error.
See docs/scaling.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tpuanalyze.errors import TpuAnalyzeError

CATEGORIES = ["compute", "weight_update", "collectives", "memory_transfer", "input", "output", "eval", "idle"]
# Categories whose time per step is proportional to the examples a core processes per step.
BATCH_PROPORTIONAL = {"compute", "input"}
# Exposed all-reduce time per step does not fall with more replicas of a fixed model (catalog §2).
NON_DECREASING = {"collectives"}
# Categories that can overtake compute as chips grow (catalog §3.2, §3.3, §3.8, §3.13).
LIMITING = ["collectives", "weight_update", "input", "output", "idle"]

_FORMS: dict[str, tuple[list[Callable[[np.ndarray], np.ndarray]], str]] = {
    "constant": ([np.ones_like], "a"),
    "inverse": ([np.ones_like, lambda n: 1.0 / n], "a + b/N"),
    "log": ([np.ones_like, np.log2], "a + b*log2(N)"),
    "sqrt": ([np.ones_like, np.sqrt], "a + b*sqrt(N)"),
    "linear": ([np.ones_like, lambda n: n], "a + b*N"),
    "power": ([np.ones_like, np.log2], "a*N^b"),      # fitted as log2(y) = log2(a) + b*log2(N)
}
# With two runs the data cannot choose between two-parameter forms: the cost model does. Collectives:
# a ring all-reduce moves (n-1)/n * M/B = M/B - (M/B)/n (catalog §2), i.e. a + b/N with b < 0.
_PRIOR = {"compute": "inverse", "weight_update": "inverse", "collectives": "inverse",
          "memory_transfer": "inverse", "input": "inverse",
          "output": "inverse", "eval": "inverse", "idle": "log", "other": "inverse", "total": "power"}
_FLAT = 0.02          # two runs within 2% of each other: a constant
_TIE = 0.005          # leave-one-out errors within 0.5% of the step are a tie: prefer the simpler form
SHARE_RISE = 0.02     # a share rising by >= 2 points of the step counts as growing (catalog §3.13)
MAX_PROJECTED_CHIPS = 1 << 22


def _lstsq(form: str, n: np.ndarray, y: np.ndarray) -> np.ndarray:
    basis = np.column_stack([f(n) for f in _FORMS[form][0]])
    if form == "power":
        coef, *_ = np.linalg.lstsq(basis, np.log2(np.maximum(y, 1e-12)), rcond=None)
        return np.array([2.0 ** coef[0], coef[1]])
    params, *_ = np.linalg.lstsq(basis, y, rcond=None)
    return params


def _raw(form: str, params: Sequence[float], n: np.ndarray) -> np.ndarray:
    if form == "power":
        return params[0] * np.power(n, params[1])
    return sum(p * f(n) for p, f in zip(params, _FORMS[form][0], strict=True))


def _evaluate(form: str, params: Sequence[float], n: np.ndarray) -> np.ndarray:
    return np.maximum(np.asarray(_raw(form, params, n), dtype=float) * np.ones_like(n), 0.0)


@dataclass
class CategoryFit:
    """The chosen form for one category; ``predict`` is per step, in the metric's unit.

    ``normalized_by`` names the factor the values were divided by before fitting (``per_core_batch``
    when it varied across runs, ``epochs`` for a time to train); predictions multiply it back.
    """

    category: str
    form: str
    params: list[float]
    rms_error: float                 # in-sample, metric unit (normalized when normalized_by is set)
    loo_error: float | None          # leave-one-out rms, same unit (None with too few runs)
    normalized_by: str | None = None
    candidates: dict[str, float | None] = field(default_factory=dict)
    regressor: str = "chips"         # the model's variable: chips N, or the per-core batch b

    @property
    def formula(self) -> str:
        text = _FORMS[self.form][1]
        for name, value in zip("ab", self.params, strict=False):
            text = text.replace(name, f"{value:.4g}", 1)
        text = text.replace("+ -", "- ")
        if self.regressor == "per_core_batch":
            text = text.replace("N", "b") + " with b = per-core batch"
        return text + (f", per unit of {self.normalized_by}" if self.normalized_by else "")

    def predict(self, chips: np.ndarray | float, factors: dict[str, np.ndarray] | None = None
                ) -> np.ndarray:
        n = np.atleast_1d(np.asarray(chips, dtype=float))
        x = n if self.regressor == "chips" else np.asarray((factors or {})[self.regressor], dtype=float)
        value = _evaluate(self.form, self.params, x) * np.ones_like(n)
        if self.normalized_by:
            value = value * np.asarray((factors or {})[self.normalized_by], dtype=float)
        return value


def _loo_rms(form: str, n: np.ndarray, y: np.ndarray) -> float | None:
    k = len(_FORMS[form][0])
    if len(n) - 1 < k or len(n) < 3:
        return None
    errors = []
    for i in range(len(n)):
        keep = np.arange(len(n)) != i
        params = _lstsq(form, n[keep], y[keep])
        errors.append(_evaluate(form, params, n[i:i + 1])[0] - y[i])
    return float(np.sqrt(np.mean(np.square(errors))))


def _physical(form: str, n: np.ndarray, y: np.ndarray, non_decreasing: bool = False) -> bool:
    """A form that predicts no time at all 8x past the largest run is not a model of a cost; nor is a
    falling all-reduce time (catalog §2: per-step all-reduce time is ~M/B on the torus, plus latency
    terms growing with N, for a fixed model size)."""
    if form == "power" and (y <= 0).any():
        return False
    params = _lstsq(form, n, y)
    if non_decreasing and form != "constant":
        probe = np.geomspace(n.min(), 8.0 * n.max(), 16)
        if (np.diff(_raw(form, params, probe)) < -1e-12).any():
            return False
    return bool(_raw(form, params, np.array([8.0 * n.max()]))[0] > 0 or np.allclose(y, 0))


def fit_category(category: str, chips: Sequence[float], values: Sequence[float], scale: float,
                 normalized_by: str | None = None, regressor: str = "chips",
                 prior: str | None = None) -> CategoryFit:
    """Choose and fit a form for one category; ``scale`` (mean value) sets the tie tolerance.

    ``chips`` holds the regressor's values (chips N, or the per-core batch b when regressor says so).
    """
    n = np.asarray(chips, dtype=float)
    y = np.asarray(values, dtype=float)
    prior = prior or _PRIOR.get(category, "inverse")
    rising = category in NON_DECREASING and regressor == "chips"
    candidates: dict[str, float | None] = {}
    if len(n) >= 3:
        for form in _FORMS:
            candidates[form] = _loo_rms(form, n, y) if _physical(form, n, y, rising) else None
        scored = {f: e for f, e in candidates.items() if e is not None} or {"constant": 0.0}
        best = min(scored.values())
        # a tie is what cannot matter for the step (0.5% of it) nor for the category's own shape (5%)
        tolerance = min(_TIE * scale, 0.05 * float(np.mean(np.abs(y)))) + 1e-12
        tied = [f for f, e in scored.items() if e - best <= tolerance]
        # among equally good forms: fewest parameters, then the cost-model prior
        form = min(tied, key=lambda f: (len(_FORMS[f][0]), f != prior))
    else:
        spread = (y.max() - y.min()) / max(abs(y.mean()), 1e-12) if len(y) else 0.0
        flat = len(n) < 2 or spread < _FLAT or abs(y.max() - y.min()) < _TIE * scale
        fallback = "constant" if rising else "inverse"
        form = "constant" if flat else (prior if _physical(prior, n, y, rising) else fallback)
    params = _lstsq(form, n, y)
    rms = float(np.sqrt(np.mean(np.square(_evaluate(form, params, n) - y)))) if len(n) else 0.0
    return CategoryFit(category, form, [float(p) for p in params], rms,
                       candidates.get(form) if candidates else _loo_rms(form, n, y), normalized_by,
                       candidates, regressor)


@dataclass
class ScalingAnalysis:
    """Measured series, fitted models, projections and findings of one workload."""

    workload: str
    metric: str                      # 'step_time_ms' | 'time_to_train_s'
    unit: str                        # 'ms' | 's'
    batch_mode: str                  # fixed-per-core-batch | fixed-global-batch | varying-batch | unknown
    measured: pd.DataFrame
    fits: dict[str, CategoryFit]
    projection: pd.DataFrame
    crossovers: dict[str, float | None]
    growing: str | None
    findings: list[dict]
    holdout: dict[str, Any] | None   # the largest run predicted from the others
    time_to_train: dict[str, Any] | None = None   # time-to-train model (MLPerf, or traces placed in one)
    joined: list[dict] = field(default_factory=list)  # trace runs beside the MLPerf result at their chips
    model: Any = field(default=None, repr=False)     # the TimeToTrainModel (not in the JSON)
    limits: dict[str, Any] | None = None             # data-parallel limit, fixed > compute, remedies

    def to_json(self) -> dict:
        """The scaling JSON document (see docs/scaling.md)."""
        return {
            "workload": self.workload,
            "metric": self.metric,
            "unit": self.unit,
            "batch_mode": self.batch_mode,
            "projection_assumption": projection_assumption(self.measured),
            "runs": _records(self.measured),
            "fits": {c: {"form": f.form, "formula": f.formula, "params": f.params,
                         "rms_error": f.rms_error, "loo_error": f.loo_error,
                         "normalized_by": f.normalized_by}
                     for c, f in self.fits.items()},
            "projection": {"label": "estimate (fitted model, not measured)",
                           "rows": _records(self.projection)},
            "crossover_chips": self.crossovers,
            "growing_category": self.growing,
            "holdout": self.holdout,
            "findings": self.findings,
            "time_to_train": self.time_to_train,
            "limits": self.limits,
            "joined_mlperf": self.joined,
        }


def _records(frame: pd.DataFrame) -> list[dict]:
    rows = frame.to_dict(orient="records")
    return [{k: (None if isinstance(v, float) and math.isnan(v) else
                 (v.item() if isinstance(v, np.generic) else v)) for k, v in row.items()} for row in rows]


def batch_mode(frame: pd.DataFrame) -> str:
    """How the batch changes across runs: it picks the compute model (catalog §3.13)."""
    if "per_core_batch" in frame and frame["per_core_batch"].notna().all():
        b = frame["per_core_batch"].astype(float)
        if np.allclose(b, b.iloc[0], rtol=1e-6):
            return "fixed-per-core-batch"
        if _constant_global_batch(frame):
            return "fixed-global-batch"
        return "varying-batch"
    if _constant_global_batch(frame):
        return "fixed-global-batch"
    return "unknown"


def _constant_global_batch(frame: pd.DataFrame) -> bool:
    return "global_batch" in frame and bool(frame["global_batch"].notna().all()) \
        and frame["global_batch"].nunique() == 1


def _validate(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    missing = {"run", "chips", metric} - set(frame.columns)
    if missing:
        raise TpuAnalyzeError(f"scaling table lacks columns {sorted(missing)}")
    frame = frame.dropna(subset=["chips", metric]).sort_values("chips", kind="stable").reset_index(drop=True)
    if len(frame) < 2:
        raise TpuAnalyzeError(f"scaling needs at least 2 runs, got {len(frame)}")
    if frame["chips"].nunique() < 2:
        raise TpuAnalyzeError(f"scaling needs runs at 2 or more chip counts, all {len(frame)} runs "
                              f"have {int(frame['chips'].iloc[0])}")
    if (frame["chips"] <= 0).any() or (frame[metric] <= 0).any():
        raise TpuAnalyzeError("scaling needs positive chip counts and times")
    return frame


def _cores(frame: pd.DataFrame) -> pd.Series:
    if "cores" in frame and frame["cores"].notna().all():
        return frame["cores"].astype(float)
    return frame["chips"].astype(float) * 2.0  # TPU v3: 2 TensorCores per chip (catalog §2)


Target = int | tuple[int, int | None]   # chips, or (chips, global batch at that scale or None)


def _split_targets(project_to: Sequence[Target] | None) -> list[tuple[int, int | None]]:
    return [(int(t[0]), None if t[1] is None else int(t[1])) if isinstance(t, tuple) else (int(t), None)
            for t in project_to or []]


def analyze_scaling(frame: pd.DataFrame, metric: str = "step_time_ms", workload: str = "",
                    project_to: Sequence[Target] | None = None) -> ScalingAnalysis:
    """Fit the series, project it and derive the scaling-limit findings.

    ``project_to`` adds projections: chip counts, or (chips, global batch) pairs. A time-to-train
    series with the logs' facts (epochs, batch, examples per epoch) uses the time-to-train model
    (``analyzer/time_to_train.py``)."""
    frame = _validate(frame.copy(), metric)
    targets = _split_targets(project_to)
    if metric == "time_to_train_s" and _has_time_to_train_facts(frame):
        return _analyze_time_to_train(frame, workload, targets)
    unit = "s" if metric.endswith("_s") else "ms"
    categories = [c for c in CATEGORIES if c in frame and frame[c].notna().all()]
    mode = batch_mode(frame)
    chips = frame["chips"].astype(float).to_numpy()
    cores = _cores(frame)

    fits = analyze_scaling_fits(frame, metric)
    measured = _measured_table(frame, metric, categories, cores)
    batches = {c: b for c, b in targets if b is not None}
    projection = _project(fits, _projection_chips(chips, [c for c, _ in targets]), frame, metric, categories,
                          batches)
    crossovers = _crossovers(fits, frame, categories)
    limits = trace_limits(fits, frame)
    growing = _growing(measured, categories)
    holdout = holdout_check(frame, metric) if frame["chips"].nunique() >= 3 else None
    analysis = ScalingAnalysis(workload, metric, unit, mode, measured, fits, projection, crossovers,
                               growing, [], holdout)
    analysis.limits = limits
    analysis.findings = scaling_findings(analysis)
    return analysis


def _measured_table(frame: pd.DataFrame, metric: str, categories: list[str],
                    cores: pd.Series) -> pd.DataFrame:
    out = frame[["run", "chips"] + [c for c in ("run_id", "cores", "per_core_batch", "global_batch", "epochs")
                                   if c in frame]].copy()
    out[metric] = frame[metric]
    for category in categories:
        out[category] = frame[category]
        out[f"{category}_share"] = frame[category] / frame[metric]
    out["per_core_throughput_rel"] = per_core_throughput(frame, metric, cores)
    out["speedup"] = _speedup(frame, metric)
    return out


def per_core_throughput(frame: pd.DataFrame, metric: str, cores: pd.Series | None = None) -> pd.Series:
    """Per-core throughput relative to the smallest run = scaling efficiency.

    Trace runs: examples per core per step / step time (per-core batch assumed fixed when unknown).
    MLPerf series: epochs / (time to train x cores): the dataset size cancels out.
    """
    cores = _cores(frame) if cores is None else cores
    if metric == "time_to_train_s":
        epochs = frame["epochs"] if "epochs" in frame and frame["epochs"].notna().all() else 1.0
        throughput = epochs / (frame[metric] * cores)
    elif "per_core_batch" in frame and frame["per_core_batch"].notna().all():
        throughput = frame["per_core_batch"] / frame[metric]
    else:
        throughput = 1.0 / frame[metric]
    return throughput / throughput.iloc[0]


def _speedup(frame: pd.DataFrame, metric: str) -> pd.Series:
    """Work rate relative to the smallest run (global examples per unit time)."""
    if metric == "time_to_train_s":
        epochs = frame["epochs"] if "epochs" in frame and frame["epochs"].notna().all() else 1.0
        rate = epochs / frame[metric]
    elif "per_core_batch" in frame and frame["per_core_batch"].notna().all():
        rate = frame["per_core_batch"] * _cores(frame) / frame[metric]
    else:
        rate = _cores(frame) / frame[metric]
    return rate / rate.iloc[0]


def _cores_per_chip(frame: pd.DataFrame) -> float:
    return float((_cores(frame) / frame["chips"].astype(float)).iloc[-1])


def projection_assumption(frame: pd.DataFrame) -> str:
    """How the batch continues past the largest run: the global batch stays when the largest two runs
    share it (convergence caps it, catalog §3.1), else the per-core batch of the largest run stays."""
    if "per_core_batch" not in frame or frame["per_core_batch"].isna().any():
        return "unknown batch"
    if "global_batch" in frame and frame["global_batch"].notna().all() and len(frame) >= 2 and \
            frame["global_batch"].iloc[-1] == frame["global_batch"].iloc[-2]:
        return "fixed global batch"
    return "fixed per-core batch"


def _interpolate(frame: pd.DataFrame, column: str, chips: np.ndarray, beyond: np.ndarray,
                 log_values: bool) -> np.ndarray:
    """A run property at any chip count: log-log interpolation between runs (exact at runs), the
    smallest run's value below them and ``beyond`` above the largest."""
    by_chips = frame.assign(chips=frame["chips"].astype(float)).groupby("chips")[column].last()
    x = np.log2(by_chips.index.to_numpy(dtype=float))
    y = by_chips.to_numpy(dtype=float)
    y = np.log2(y) if log_values else y
    inside = np.interp(np.log2(chips), x, y)
    inside = np.exp2(inside) if log_values else inside
    return np.where(chips > by_chips.index.max(), beyond, inside)


def factors_at(frame: pd.DataFrame, chips: np.ndarray) -> dict[str, np.ndarray]:
    """Per-core batch and epochs at ``chips``: the runs' values (interpolated between them), and past
    the largest run the projection assumption (see projection_assumption) and its epochs."""
    chips = np.atleast_1d(np.asarray(chips, dtype=float))
    largest = frame.iloc[-1]
    out: dict[str, np.ndarray] = {}
    if "per_core_batch" in frame and frame["per_core_batch"].notna().all() and \
            (frame["per_core_batch"] > 0).all():
        if projection_assumption(frame) == "fixed global batch":
            beyond = float(largest["global_batch"]) / (chips * _cores_per_chip(frame))
        else:
            beyond = np.full_like(chips, float(largest["per_core_batch"]))
        out["per_core_batch"] = _interpolate(frame, "per_core_batch", chips, beyond, log_values=True)
    if "epochs" in frame and frame["epochs"].notna().all():
        out["epochs"] = _interpolate(frame, "epochs", chips, np.full_like(chips, float(largest["epochs"])),
                                     log_values=False)
    return out


def predict(fits: dict[str, CategoryFit], chips: np.ndarray, factors: dict[str, np.ndarray]
            ) -> dict[str, np.ndarray]:
    """Per-category predictions (metric unit per step) at ``chips``."""
    return {c: f.predict(chips, factors) for c, f in fits.items()}


def _projection_chips(chips: np.ndarray, project_to: Sequence[int] | None) -> np.ndarray:
    largest = int(chips.max())
    base = sorted({int(c) for c in chips})
    extra = [largest * 2 ** k for k in range(1, 4)] + list(project_to or [])
    return np.array(sorted(set(base + [int(c) for c in extra])), dtype=float)


def _project(fits, targets, frame, metric, categories, batches: dict[int, int] | None = None
             ) -> pd.DataFrame:
    factors = factors_at(frame, targets)
    given = np.array([float((batches or {}).get(int(c), np.nan)) for c in targets])
    if "per_core_batch" in factors and np.isfinite(given).any():
        # a stated global batch at that scale: its per-core batch drives compute and input
        factors["per_core_batch"] = np.where(np.isfinite(given), given / (targets * _cores_per_chip(frame)),
                                             factors["per_core_batch"])
    predictions = predict(fits, targets, factors)
    total = sum(predictions.values())
    out = pd.DataFrame({"chips": targets.astype(int), f"{metric}_est": total})
    for category in categories:
        out[f"{category}_est"] = predictions[category]
        out[f"{category}_share_est"] = predictions[category] / total
    out["measured"] = out["chips"].isin(set(frame["chips"].astype(int))) & ~np.isfinite(given)
    out["error_est"] = _relative_error(fits, frame, metric)
    loo = all(f.loo_error is not None for f in fits.values())
    out["error_kind"] = "leave-one-out" if loo else "in-sample (too few runs for leave-one-out)"
    if "per_core_batch" in factors:
        out["per_core_batch"] = factors["per_core_batch"]
        out["global_batch"] = factors["per_core_batch"] * targets * _cores_per_chip(frame)
        out["batch_source"] = np.where(np.isfinite(given), "given", np.where(
            out["measured"], "measured", projection_assumption(frame)))
    out["label"] = "estimate"
    cores = targets * _cores_per_chip(frame)
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric == "time_to_train_s":
            work = factors.get("epochs", np.ones_like(targets)) / (total * cores)
            base = _number(frame.iloc[0], "epochs", 1.0) / (frame[metric].iloc[0] * _cores(frame).iloc[0])
        else:
            work = factors.get("per_core_batch", np.ones_like(targets)) / total
            base = _number(frame.iloc[0], "per_core_batch", 1.0) / frame[metric].iloc[0]
        out["per_core_throughput_rel_est"] = np.where(total > 0, work / base, np.nan)
    return out


_TTT_FACTS = ("cores", "epochs", "global_batch", "examples_per_epoch")


def _has_time_to_train_facts(frame: pd.DataFrame) -> bool:
    return all(c in frame and frame[c].notna().all() for c in _TTT_FACTS)


def _analyze_time_to_train(frame: pd.DataFrame, workload: str, targets: list[tuple[int, int | None]]
                           ) -> ScalingAnalysis:
    """An MLPerf series through the time-to-train model: epochs(batch) x steps x step(b, P) + evals."""
    from tpuanalyze.analyzer.time_to_train import TimeToTrainModel, projection_table

    metric = "time_to_train_s"
    benchmark = str(frame["benchmark"].iloc[0]) if "benchmark" in frame else workload
    model = TimeToTrainModel.fit(frame, benchmark)
    measured = _measured_table(frame, metric, [], _cores(frame))
    runs = model.runs
    measured["step_time_ms"] = runs["step_s"].to_numpy() * 1e3
    measured["steps"] = runs["steps"].to_numpy()
    for column in ("eval_s", "lead_s", "partition", "examples_per_epoch"):
        measured[column] = runs[column].to_numpy()
    measured["per_core_examples_per_s"] = (runs["epochs"] * runs["examples_per_epoch"] / (
        runs["time_to_train_s"] * runs["cores"])).to_numpy()
    chips = sorted({int(c) for c in frame["chips"]})
    wanted = [(c, None) for c in chips] + [(chips[-1] * 2 ** k, None) for k in range(1, 4)] + targets
    seen: set[tuple[int, int | None]] = set()
    wanted = [t for t in wanted if not (t in seen or seen.add(t))]
    projection = projection_table(model, sorted(wanted, key=lambda t: (t[0], t[1] or 0)))
    projection["error_kind"] = "leave-one-out"
    holdout = model.holdout()
    limits = model.limits()
    ttt = {
        "model": "time = epochs(B) x examples/B x (c_P x b + d) + evals x eval(N) + lead (docs/scaling.md)",
        "label": "estimate",
        "step": model.step_model_json(),
        "epochs": model.epochs_model.to_json(),
        "examples_per_epoch": int(runs["examples_per_epoch"].iloc[-1]),
        "batch_assumption": model.default_batch(float(chips[-1]) * 2)[1],
        "leave_one_out": model.leave_one_out(),
        "loo_error": model.loo_error(),
        "init_s_outside_time_to_train": [None if pd.isna(v) else float(v) for v in runs.get(
            "init_s", pd.Series([None] * len(runs)))],
        "limits": limits,
    }
    fits = analyze_scaling_fits(frame, metric)
    return ScalingAnalysis(workload, metric, "s", batch_mode(frame), measured, fits, projection, {},
                           None, [], holdout, ttt, model=model, limits=limits)


def link_traces_and_logs(analyses: Sequence[ScalingAnalysis], lone: Sequence[pd.DataFrame] = ()) -> None:
    """One model for traces and logs of a workload: a trace series' measured steps join the step points
    of the MLPerf series of the same benchmark (its time-to-train projection then uses the logs'
    epochs(batch) and evals), and every trace run at a logged chip count is shown beside that result."""
    from tpuanalyze.analyzer.time_to_train import projection_table
    from tpuanalyze.analyzer.workload_facts import canonical

    logs = [a for a in analyses if a.model is not None]
    for frame in lone:  # trace runs at a single chip count: only the side-by-side
        workload = next((str(w) for w in frame.get("workload", pd.Series(dtype=object)).dropna()), "")
        for log in (a for a in logs if canonical(a.model.workload) == canonical(workload) and workload):
            log.joined.extend(log.model.join(frame))
    for trace in (a for a in analyses if a.model is None and a.metric == "step_time_ms"):
        name = canonical(trace.workload)
        chips = set(trace.measured["chips"].astype(int))
        matches = [a for a in logs if canonical(a.model.workload) == name]
        if not name or not matches:
            continue
        log = max(matches, key=lambda a: (len(chips & set(a.measured["chips"].astype(int))), a.workload))
        joined = log.model.join(trace.measured)
        log.joined.extend(joined)
        trace.joined = joined
        combined = log.model.with_traces(trace.measured)
        if combined.traces is None:
            continue
        batches = combined.traces.set_index(combined.traces["chips"].astype(int))["global_batch"]
        largest = int(max(chips))
        batch_at = batches.groupby(level=0).last()
        targets = [(int(c), int(batch_at.loc[c])) for c in sorted(chips)] + \
            [(largest * 2 ** k, None) for k in range(1, 4)]
        rows = projection_table(combined, targets)
        trace.time_to_train = {
            "label": "estimate",
            "model": f"the {log.workload} time-to-train model with these trace runs among its step points",
            "from_logs": log.workload, "step": combined.step_model_json(),
            "loo_error_logs": combined.loo_error(), "projection": _records(rows), "joined_mlperf": joined,
        }


def _number(row: pd.Series, key: str, default: float) -> float:
    value = row.get(key)
    return default if value is None or pd.isna(value) else float(value)


def _relative_error(fits: dict[str, CategoryFit], frame: pd.DataFrame, metric: str) -> float | None:
    """Relative error of the whole model: leave-one-out where available, else in-sample, per category
    scaled back to the metric and added in quadrature, over the mean metric."""
    if not fits:
        return None
    factors = factors_at(frame, frame["chips"].astype(float).to_numpy())
    total = 0.0
    for fit in fits.values():
        error = fit.loo_error if fit.loo_error is not None else fit.rms_error
        if fit.normalized_by:
            error *= float(np.mean(factors[fit.normalized_by]))
        total += error * error
    return math.sqrt(total) / float(frame[metric].mean())


def _crossovers(fits, frame, categories) -> dict[str, float | None]:
    """Smallest chip count (>= the smallest run) where a category's time passes compute's."""
    if "compute" not in fits:
        return {}
    grid = np.unique(np.concatenate([
        np.geomspace(frame["chips"].min(), MAX_PROJECTED_CHIPS, 400), frame["chips"].astype(float)]))
    predictions = predict(fits, grid, factors_at(frame, grid))
    out: dict[str, float | None] = {}
    for category in LIMITING:
        if category not in fits or category not in categories:
            continue
        above = np.nonzero(predictions[category] > predictions["compute"])[0]
        out[category] = float(grid[above[0]]) if len(above) else None
    return out


SHRINKING = ("compute", "input")   # per example: they shrink with the per-core batch (catalog §3.1, §3.8)
PARTITION_WAYS = 4                  # the partitioning the v0.6 submissions used past the limit (§1)


def trace_limits(fits: dict[str, CategoryFit], frame: pd.DataFrame) -> dict[str, Any] | None:
    """The limit of a trace series (estimates from the category fits): where the per-core batch reaches
    1 at the capped global batch (catalog §3.1), where the non-shrinking categories together pass
    compute + input (§3.13), and the catalog remedies' gains per step at the data-parallel limit."""
    if "compute" not in fits or "per_core_batch" not in frame or frame["per_core_batch"].isna().any():
        return None
    cpc = _cores_per_chip(frame)
    if "global_batch" in frame and frame["global_batch"].notna().all():
        cap = float(frame["global_batch"].max())
    else:
        cap = float((frame["per_core_batch"] * _cores(frame)).max())
    largest = float(frame["chips"].max())

    def at(chips: np.ndarray, per_core: np.ndarray | None = None) -> dict[str, np.ndarray]:
        factors = factors_at(frame, chips)
        capped = cap / (chips * cpc)
        factors["per_core_batch"] = np.where(chips > largest, capped, factors["per_core_batch"]) \
            if per_core is None else per_core
        return predict(fits, chips, factors)

    grid = np.unique(np.concatenate([np.geomspace(frame["chips"].min(), MAX_PROJECTED_CHIPS, 400),
                                     frame["chips"].astype(float)]))
    parts = at(grid)
    shrinking = sum(parts[c] for c in SHRINKING if c in parts)
    fixed = sum(v for c, v in parts.items() if c not in SHRINKING)
    above = np.nonzero(fixed > shrinking)[0]
    limit = cap / cpc                                        # one example per core
    chips = float(2 ** round(math.log2(limit)))
    here = at(np.array([chips]), np.array([cap / (chips * cpc)]))
    step = float(sum(v[0] for v in here.values()))
    wider = at(np.array([chips * PARTITION_WAYS]), np.array([cap / (chips * cpc * PARTITION_WAYS)]))
    remedies = [
        {"remedy": f"{PARTITION_WAYS}-way model/spatial partitioning", "catalog": "3.1",
         "at_chips": int(chips * PARTITION_WAYS), "gain_ms": step - float(sum(v[0] for v in wider.values())),
         "model": f"{PARTITION_WAYS}x the chips at the same global batch; compute and input per example as "
                  "fitted (perfect partitioning, a bound), the other categories as fitted at those chips"},
        {"remedy": "weight-update sharding", "catalog": "3.2", "at_chips": int(chips),
         "gain_ms": float(here.get("weight_update", [0.0])[0]) * (1 - 1 / (chips * cpc)),
         "model": "update x (1 - 1/N replicas) (catalog §3.2)"},
        {"remedy": "bf16 gradient all-reduce", "catalog": "3.4", "at_chips": int(chips),
         "gain_ms": 0.5 * float(here.get("collectives", [0.0])[0]),
         "model": "half the exposed all-reduce (catalog §3.4)"},
    ]
    for remedy in remedies:
        remedy["fraction"] = remedy["gain_ms"] / step if step else None
        remedy["label"] = "estimate"
    return {"label": "estimate", "convergence_cap_batch": int(cap),
            "data_parallel_limit_chips": int(round(limit)),
            "data_parallel_limit_rule": "per-core batch reaches 1 at the largest global batch (catalog §3.1)",
            "fixed_passes_compute_chips": int(round(float(grid[above[0]]))) if len(above) else None,
            "fixed_passes_compute_rule": "collectives + weight update + output + idle pass compute + input",
            "at_chips": int(chips), "step_time_ms_est": step, "remedies": remedies}


def _growing(measured: pd.DataFrame, categories: list[str]) -> str | None:
    rises = {c: measured[f"{c}_share"].iloc[-1] - measured[f"{c}_share"].iloc[0]
             for c in categories if c != "compute"}
    if not rises:
        return None
    best = max(rises, key=rises.get)
    return best if rises[best] >= SHARE_RISE else None


def holdout_check(frame: pd.DataFrame, metric: str = "step_time_ms") -> dict[str, Any]:
    """Fit on all runs but the largest, predict the largest: an honest extrapolation error."""
    frame = _validate(frame.copy(), metric)
    smaller, largest = frame.iloc[:-1], frame.iloc[-1]
    if smaller["chips"].nunique() < 2:
        return {"chips": int(largest["chips"]), "note": "needs 2 smaller chip counts"}
    fits = analyze_scaling_fits(smaller, metric)
    target = np.array([float(largest["chips"])])
    # the largest run's own per-core batch / epochs are known inputs, not predictions
    factors = factors_at(frame, target)
    predicted = float(sum(predict(fits, target, factors).values())[0])
    actual = float(largest[metric])
    return {"chips": int(largest["chips"]), "fitted_on_chips": [int(c) for c in smaller["chips"]],
            "predicted": predicted, "measured": actual, "relative_error": (predicted - actual) / actual}


def analyze_scaling_fits(frame: pd.DataFrame, metric: str = "step_time_ms") -> dict[str, CategoryFit]:
    """The category fits of a series (also used alone for held-out checks)."""
    frame = _validate(frame.copy(), metric)
    categories = [c for c in CATEGORIES if c in frame and frame[c].notna().all()]
    chips = frame["chips"].astype(float).to_numpy()
    scale = float(frame[metric].mean())
    batch = frame["per_core_batch"].astype(float) if "per_core_batch" in frame else None
    varying = batch is not None and batch.notna().all() and not np.allclose(batch, batch.iloc[0])
    fits: dict[str, CategoryFit] = {}
    for category in categories:
        if varying and category in BATCH_PROPORTIONAL:
            # time per example depends on the per-core batch (MXU efficiency, catalog §3.1), not on N:
            # fit it against b and multiply back by the per-core batch at the projected scale
            fits[category] = fit_category(category, batch.to_numpy(), frame[category] / batch,
                                          scale / float(batch.mean()), "per_core_batch",
                                          regressor="per_core_batch", prior="log")
        else:
            fits[category] = fit_category(category, chips, frame[category], scale)
    if categories:
        residual = frame[metric] - frame[categories].sum(axis=1)
        if (residual.abs() > 0.005 * frame[metric]).any():  # time in no category (e.g. eval steps)
            fits["other"] = fit_category("other", chips, residual.clip(lower=0), scale)
    elif metric == "time_to_train_s" and "epochs" in frame and frame["epochs"].notna().all():
        # time per epoch: larger batches need more epochs (catalog §1), which is not a cost of scale
        per_epoch = frame[metric] / frame["epochs"]
        fits["total"] = fit_category("total", chips, per_epoch, float(per_epoch.mean()), "epochs")
    else:
        fits["total"] = fit_category("total", chips, frame[metric], scale)
    return fits


# --- the scaling-limit finding (catalog §3.13) -------------------------------------------------------

_RECOMMENDATION = {
    "collectives": ("catalog §3.3-3.5: 2-D torus gradient all-reduce, bf16 gradient summation, "
                    "combine small all-reduces and overlap them with the backward pass"),
    "weight_update": ("catalog §3.2: shard the weight update across replicas (reduce-scatter + "
                      "sharded optimizer + all-gather instead of one all-reduce)"),
    "input": "catalog §3.8: scale the host input pipeline (per-host sharding, caching, prefetch)",
    "output": "catalog §3.10: distributed, overlapped evaluation; fewer outfeeds",
    "idle": "catalog §3.7: on-device training loops to remove per-step host gaps",
}


def _gain(category: str, measured: pd.DataFrame, metric: str) -> dict[str, Any]:
    """Saving per step at the largest measured run from the catalog's cost model (an estimate), in the
    analyzer's gain shape {ms, fraction, label, model}."""
    last = measured.iloc[-1]
    step = float(last[metric])
    cat_time = float(last[category])
    cores = _number(last, "cores", float(last["chips"]) * 2)
    if category == "weight_update":
        saving, model = cat_time * (1 - 1 / cores), "catalog §3.2: update x (1 - 1/N), N replicas"
    elif category == "collectives":
        saving, model = cat_time * 0.5, ("catalog §3.3-3.4: bf16 summation, or two concurrent 2-D torus "
                                         "schedules, halve the bandwidth term")
    else:
        saving, model = cat_time, f"up to the whole exposed {category} time"
    return {"ms": round(saving, 4), "fraction": round(saving / step, 4) if step else None,
            "label": "estimate", "model": f"{model}, at {int(last['chips'])} chips"}


def evidence_sql(measured: pd.DataFrame, category: str) -> str:
    """SQL that shows the measured numbers in the database the runs came from."""
    if "run_id" in measured and measured["run_id"].notna().all():
        ids = ", ".join(str(int(r)) for r in measured["run_id"])
        return (f"SELECT run_id, avg(duration_ps) / 1e9 AS step_ms, avg({category}_ps) / 1e9 AS "
                f"{category}_ms, avg({category}_ps) / avg(duration_ps) AS {category}_share\n"
                f"FROM step_breakdown WHERE run_id IN ({ids}) AND NOT is_eval\n"
                "GROUP BY run_id ORDER BY run_id")
    return "-- the runs were not read from a database"


def scaling_findings(analysis: ScalingAnalysis) -> list[dict]:
    """One ``scaling-limit`` finding per category whose share of the step grows with chips (§3.13)."""
    measured = analysis.measured
    findings = []
    largest_chips = float(measured["chips"].iloc[-1])
    for category in LIMITING:
        share_col = f"{category}_share"
        if share_col not in measured:
            continue
        first, last = float(measured[share_col].iloc[0]), float(measured[share_col].iloc[-1])
        if last - first < SHARE_RISE:
            continue
        crossover = analysis.crossovers.get(category)
        if (crossover is not None and crossover <= 4 * largest_chips) or last >= 0.30:
            severity = "high"
        elif (crossover is not None and crossover <= 64 * largest_chips) or last - first >= 0.05:
            severity = "medium"
        else:
            severity = "low"
        fit = analysis.fits[category]
        smallest = float(measured["chips"].iloc[0])
        if crossover is not None and crossover <= smallest:
            where = f"already above compute at {int(smallest)} chips (measured)"
        elif crossover is not None:
            where = f"passes compute at ~{int(round(crossover))} chips (estimate)"
        else:
            where = f"stays below compute up to {MAX_PROJECTED_CHIPS} chips (estimate)"
        error = analysis.projection["error_est"].iloc[0]
        metrics = {
            "category": category,
            "chips": [int(c) for c in measured["chips"]],
            "share": [round(float(v), 4) for v in measured[share_col]],
            f"{category}_{analysis.unit}_per_step": [round(float(v), 4) for v in measured[category]],
            "compute_share": [round(float(v), 4) for v in measured["compute_share"]]
            if "compute_share" in measured else None,
            "fit": fit.formula,
            "fit_error_relative": None if error is None or pd.isna(error) else round(float(error), 4),
            "projected_crossover_chips": None if crossover is None else int(round(crossover)),
            "projection_label": "estimate from the fitted model",
            "runs": [str(r) for r in measured["run"]],
        }
        findings.append({
            "rule": "scaling-limit",
            "severity": severity,
            "evidence": {
                "summary": (f"{category} share grows from {first:.1%} to {last:.1%} of the step between "
                            f"{int(measured['chips'].iloc[0])} and {int(largest_chips)} chips; {where}"),
                "metrics": metrics,
                "sql": evidence_sql(measured, category),
            },
            "recommendation": _RECOMMENDATION.get(category, "catalog §3.13"),
            "catalog": "3.13",
            "estimated_gain": _gain(category, measured, analysis.metric),
        })
    return findings
