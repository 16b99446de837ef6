"""Time to train with the structure of the TPU-pod scaling papers (catalog §1, §3.1, §3.13).

    time = epochs(B) x (examples per epoch / B) x step(b, P) + evals x eval(N) + lead

B = global batch, N = chips, b = B / cores = examples per core per step, P = cores per replica
(spatial/model partitioning). The step splits into what shrinks with the per-core batch and what does
not:

    step(b, P) = c_P x b + d

``c_P x b`` is compute and input (per example per core; one coefficient per partitioning, since a
partitioned replica spends more per example on halo exchange), ``d`` the gradient all-reduce (~ M/B on
the 2-D torus, independent of N, catalog §2), the weight update (per parameter, not per example,
§3.2) and fixed per-step overhead. ``c_P`` and ``d`` are fitted per target from the measured runs,
each weighted by its closeness to the target in per-core batch (halved per octave: MXU efficiency
changes with b, §3.1, so the linear split holds locally). When the runs cannot separate ``d`` from
the ``c_P`` (fewer runs than unknowns, or a negative fit), ``d`` is the catalog cost model's
all-reduce + weight update of the workload's parameter bytes (an estimate, labelled).

epochs(B): the logged epochs per global batch, interpolated linearly in log2 B between logged
batches; past the largest logged batch it is extrapolated along the last segment's slope (never
falling: larger batches need more epochs, catalog §1/§3.11) and labelled ``extrapolated``.

Evaluation and initialization come from the logs' intervals: eval wall time that training waits for
(per eval, fitted a + b/N near the target chips) times the evals per epoch of the nearest batch; the
lead from run_start to the first block. init_start..init_stop precedes run_start and is not part of
the MLPerf time to train; it is reported beside it.

Every projection is an estimate and carries the model's leave-one-out error. See docs/scaling.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from tpuanalyze.analyzer.workload_facts import canonical, facts_for

from tpuanalyze.errors import TpuAnalyzeError

ICI_BYTES_PER_S = 100e9     # one ICI link, one way [est] (catalog §2): 2-D torus all-reduce ~ M/B
HBM_BYTES_PER_S = 900e9     # per chip (catalog §2)
GRADIENT_BYTES = 4          # f32 gradients; bf16 summation halves them (catalog §3.4)
PARTITION_WAYS = 4          # the partitioning the v0.6 submissions used past the data-parallel limit (§1)
MIN_PER_CORE_BATCH = 1.0    # per-core batch below 1 needs partitioning: the data-parallel limit (§3.1)
LABEL = "estimate"


@dataclass
class EpochsModel:
    """Epochs to reach the target vs global batch, from the logged runs (catalog §1)."""

    batches: np.ndarray     # distinct logged global batches, ascending
    epochs: np.ndarray      # mean logged epochs at each

    @classmethod
    def fit(cls, frame: pd.DataFrame) -> EpochsModel:
        by_batch = frame.groupby("global_batch")["epochs"].mean().sort_index()
        return cls(by_batch.index.to_numpy(dtype=float), by_batch.to_numpy(dtype=float))

    def at(self, batch: float) -> tuple[float, str]:
        """Epochs at ``batch`` and how they were obtained: logged / interpolated / extrapolated."""
        x, y = np.log2(self.batches), self.epochs
        b = math.log2(batch)
        if np.any(np.isclose(self.batches, batch)):
            return float(y[np.isclose(self.batches, batch)][0]), "logged at this batch (mean of its runs)"
        if b < x[0]:
            return float(y[0]), "extrapolated (below the smallest logged batch: its epochs)"
        if b > x[-1]:
            if len(x) < 2:
                return float(y[-1]), "extrapolated (one logged batch: its epochs, likely too few)"
            slope = max((y[-1] - y[-2]) / (x[-1] - x[-2]), 0.0)
            return float(y[-1] + slope * (b - x[-1])), (
                f"extrapolated (+{slope:.2f} epochs per doubling past batch {int(self.batches[-1])})")
        return float(np.interp(b, x, y)), "interpolated between logged batches"

    def to_json(self) -> dict:
        return {"batches": [int(b) for b in self.batches],
                "epochs": [round(float(e), 3) for e in self.epochs],
                "between": "linear in log2(batch)", "beyond": "last segment's slope, not falling (labelled)"}


KERNEL_PER_CORE_BATCH = 2.0   # weight / 4 per octave of per-core batch from the target
KERNEL_GLOBAL_BATCH = 1.0     # and / 2 per octave of global batch (another batch, another schedule)
KERNEL_EVAL_CHIPS = 1.0       # time per eval: / 2 per octave of chips (and KERNEL_GLOBAL_BATCH of batch)


def _weights(values: np.ndarray, target: float, per_octave: float = 1.0) -> np.ndarray:
    """Closeness in octaves: 1 at the target, divided by 2**per_octave per doubling away."""
    return np.exp2(-per_octave * np.abs(np.log2(values / target)))


def prior_fixed_s(workload: str | None) -> dict[str, float] | None:
    """Cost-model estimate of the non-shrinking step time [est]: gradient all-reduce of the parameter
    bytes on the 2-D torus (~M/B, catalog §2) and the replicated weight update (§3.2)."""
    facts = facts_for(workload)
    if facts is None:
        return None
    allreduce = facts.parameters * GRADIENT_BYTES / ICI_BYTES_PER_S
    update = facts.parameters * facts.update_bytes_per_param / HBM_BYTES_PER_S
    return {"allreduce_s": allreduce, "weight_update_s": update}


@dataclass
class StepModel:
    """step(b, P) = c_P x b + d, in seconds per step (see the module docstring)."""

    c: dict[int, float]
    d: float
    d_source: str                   # 'fitted' | 'cost model [est]'
    target_batch: float             # the per-core batch the fit was weighted around

    def compute_s(self, per_core_batch: float, partition: int) -> tuple[float, str]:
        if partition in self.c:
            return self.c[partition] * per_core_batch, "fitted"
        # an unmeasured partitioning: the nearest measured one's cost per example (efficiency unknown)
        nearest = min(self.c, key=lambda p: (abs(math.log2(p) - math.log2(partition)), -p))
        note = (f"cost per example assumed as the P={nearest} runs' (no P={partition} run measured: "
                "perfect partitioning, a bound)")
        return self.c[nearest] * per_core_batch, note

    def to_json(self) -> dict:
        return {"formula": "step = c_P * b + d  (b = examples per core per step)",
                "c_s_per_example": {str(p): v for p, v in self.c.items()}, "d_s": self.d,
                "d_source": self.d_source, "weighted_around_per_core_batch": self.target_batch}


def fit_step_model(runs: pd.DataFrame, target_b: float, workload: str | None,
                   target_batch: float | None = None) -> StepModel:
    """Fit c_P and d to the runs' step times (``step_s``, ``per_core_batch``, ``partition``), each run
    weighted by its closeness to the target in per-core batch and in global batch."""
    b = runs["per_core_batch"].to_numpy(dtype=float)
    y = runs["step_s"].to_numpy(dtype=float)
    parts = runs["partition"].fillna(1).astype(int).to_numpy()
    groups = sorted(set(parts.tolist()))
    closeness = _weights(b, target_b, KERNEL_PER_CORE_BATCH)
    if target_batch is not None:
        closeness = closeness * _weights(runs["global_batch"].to_numpy(dtype=float), target_batch,
                                         KERNEL_GLOBAL_BATCH)
    scale = closeness / y                      # relative residuals, weighted by closeness
    design = np.column_stack([b * (parts == g) for g in groups] + [np.ones_like(b)])
    rows, target, weight = design, y, scale
    if "compute_s" in runs and runs["compute_s"].notna().any():
        # trace points measured the split: compute + input = c_P x b and the rest = d, one equation each
        split = runs["compute_s"].notna().to_numpy()
        shrinking = np.column_stack([b * (parts == g) for g in groups] + [np.zeros_like(b)])[split]
        fixed = np.column_stack([np.zeros_like(b)] * len(groups) + [np.ones_like(b)])[split]
        rows = np.vstack([design[~split], shrinking, fixed])
        target = np.concatenate([y[~split], runs["compute_s"].to_numpy(dtype=float)[split],
                                 runs["fixed_s"].to_numpy(dtype=float)[split]])
        weight = np.concatenate([scale[~split], scale[split], scale[split]])
    solved = None
    if len(target) >= len(groups) + 1 and np.linalg.matrix_rank(rows) == rows.shape[1]:
        params, *_ = np.linalg.lstsq(rows * weight[:, None], target * weight, rcond=None)
        if params[-1] >= 0 and (params[:-1] > 0).all():
            solved = StepModel(dict(zip(groups, map(float, params[:-1]), strict=True)), float(params[-1]),
                               "fitted", target_b)
    if solved is not None:
        return solved
    prior = prior_fixed_s(workload)
    d = sum(prior.values()) if prior else 0.0
    d = min(d, 0.5 * float(y.min()))        # never more than half the fastest measured step
    source = "cost model [est]" if prior else "none (no cost model)"
    c = {}
    for g in groups:
        mask = parts == g
        w = scale[mask]
        c[g] = float(np.sum(w * w * b[mask] * (y[mask] - d)) / np.sum(w * w * b[mask] ** 2))
    return StepModel(c, d, source, target_b)


@dataclass
class TimeToTrainModel:
    """The fitted model of one MLPerf series (a frame from ``mlperf_summary.scaling_series``)."""

    runs: pd.DataFrame
    workload: str
    epochs_model: EpochsModel
    cores_per_chip: float
    traces: pd.DataFrame | None = None   # trace runs' measured steps (see trace_points), same model

    @classmethod
    def fit(cls, frame: pd.DataFrame, workload: str | None = None) -> TimeToTrainModel:
        runs = prepare(frame)
        name = canonical(workload or (str(frame["benchmark"].iloc[0]) if "benchmark" in frame else ""))
        cpc = float((runs["cores"] / runs["chips"]).iloc[-1])
        return cls(runs, name, EpochsModel.fit(runs), cpc)

    # --- the pieces at a target -------------------------------------------------------------------

    def partition_at(self, chips: float, per_core_batch: float) -> int:
        """Cores per replica at a target: that of the nearest measured run at or below its chips, and
        PARTITION_WAYS once the per-core batch drops below 1 without partitioning (catalog §3.1)."""
        below = self.runs[self.runs["chips"] <= chips]
        part = int(below["partition"].iloc[-1]) if not below.empty else 1
        if part == 1 and per_core_batch < MIN_PER_CORE_BATCH:
            part = PARTITION_WAYS
        return part

    def eval_s_at(self, chips: float, batch: float, epochs: float) -> float:
        """Evals x time per eval (a + b/N fitted near the target chips and batch, catalog §3.10)."""
        runs = self.runs
        evals = runs["eval_count"].to_numpy(dtype=float)
        per_eval = np.where(evals > 0, runs["eval_s"].to_numpy(dtype=float) / np.maximum(evals, 1), 0.0)
        if not (per_eval > 0).any():
            return 0.0
        n = runs["chips"].to_numpy(dtype=float)
        w = _weights(n, chips, KERNEL_EVAL_CHIPS)
        w = w * _weights(runs["global_batch"].to_numpy(dtype=float), batch, KERNEL_GLOBAL_BATCH)
        if len(n) >= 2 and np.ptp(1 / n) > 0:
            design = np.column_stack([np.ones_like(n), 1 / n])
            (a, b), *_ = np.linalg.lstsq(design * w[:, None], per_eval * w, rcond=None)
            one = a + b / chips
            if a < 0 or one <= 0:    # not a physical split: the nearest runs' time per eval
                one = float(np.sum(w * per_eval) / np.sum(w))
        else:
            one = float(per_eval.mean())
        # evals per epoch: that of the runs at the nearest logged batch (evaluation schedule)
        nearest = runs.iloc[(np.abs(np.log2(runs["global_batch"].astype(float) / batch))).argsort()]
        same = nearest[np.isclose(nearest["global_batch"], nearest["global_batch"].iloc[0])]
        per_epoch = float((same["eval_count"] / same["epochs"]).mean())
        return float(max(one, 0.0) * per_epoch * epochs)

    def lead_s_at(self, chips: float) -> float:
        """run_start to the first block, as in the runs nearest in chips (initialization in the run)."""
        lead = self.runs["lead_s"].fillna(0).to_numpy(dtype=float)
        w = _weights(self.runs["chips"].to_numpy(dtype=float), chips)
        return float(np.sum(w * lead) / np.sum(w))

    def predict(self, chips: float, batch: float | None = None, partition: int | None = None
                ) -> dict[str, Any]:
        """Time to train at ``chips`` (global batch ``batch``, default the batch assumption)."""
        batch_value, batch_source = (float(batch), "given") if batch else self.default_batch(chips)
        cores = chips * self.cores_per_chip
        b = batch_value / cores
        part = partition or self.partition_at(chips, b)
        epochs, epochs_source = self.epochs_model.at(batch_value)
        model = fit_step_model(self.step_points(), b, self.workload, batch_value)
        compute_s, compute_source = model.compute_s(b, part)
        step_s = compute_s + model.d
        examples = float(self.runs["examples_per_epoch"].iloc[-1])
        steps = epochs * examples / batch_value
        eval_s = self.eval_s_at(chips, batch_value, epochs)
        lead_s = self.lead_s_at(chips)
        return {
            "chips": int(chips), "global_batch": int(batch_value), "batch_source": batch_source,
            "per_core_batch": b, "partition": part, "epochs_est": epochs, "epochs_source": epochs_source,
            "steps_est": steps, "step_time_ms_est": step_s * 1e3, "compute_ms_est": compute_s * 1e3,
            "fixed_ms_est": model.d * 1e3, "fixed_source": model.d_source, "compute_source": compute_source,
            "train_s_est": steps * step_s, "eval_s_est": eval_s, "lead_s_est": lead_s,
            "time_to_train_s_est": steps * step_s + eval_s + lead_s, "label": LABEL,
        }

    def default_batch(self, chips: float) -> tuple[float, str]:
        """The global batch assumed where none is stated: the logged one at those chips; between runs the
        batch of the nearest run below (its configuration); past the largest run the largest logged
        batch, the convergence cap the logs show (larger batches need more epochs, catalog §1/§3.1)."""
        same = self.runs[np.isclose(self.runs["chips"], chips)]
        if not same.empty:
            return float(same["global_batch"].iloc[-1]), "logged at these chips"
        below = self.runs[self.runs["chips"] < chips]
        if below.empty:
            return float(self.runs["global_batch"].iloc[0]), "the smallest run's batch (below every run)"
        if len(below) < len(self.runs):
            batch, near = float(below["global_batch"].iloc[-1]), int(below["chips"].iloc[-1])
            return batch, f"batch {int(batch)} of the nearest run below ({near} chips)"
        largest = float(self.runs["global_batch"].max())
        return largest, (f"largest logged global batch {int(largest)} (the convergence cap seen in the "
                         "logs; larger batches need more epochs, catalog §1/§3.1)")

    def curve(self, chips: np.ndarray) -> pd.DataFrame:
        """Projections on a grid of chip counts at the assumed batches (for charts), estimates."""
        return pd.DataFrame([self.predict(float(c)) for c in chips])

    def step_model_json(self) -> dict[str, Any]:
        """The step model around the largest run (what the projections past it start from)."""
        last = self.runs.iloc[-1]
        model = fit_step_model(self.step_points(), float(last["per_core_batch"]), self.workload,
                               float(last["global_batch"]))
        return {**model.to_json(), "fixed_split_s": self.fixed_split(model.d),
                "fixed_split_source": self.fixed_split_source(),
                "points": {"logs": len(self.runs), "traces": 0 if self.traces is None else len(self.traces)}}

    def step_points(self) -> pd.DataFrame:
        """The measured steps the step model is fitted to: the logs' runs and any trace runs."""
        columns = ["chips", "per_core_batch", "global_batch", "partition", "step_s"]
        points = self.runs[columns].assign(source="log")
        if self.traces is not None and not self.traces.empty:
            traces = self.traces[columns + ["compute_s", "fixed_s"]].assign(source="trace")
            points = pd.concat([points.assign(compute_s=np.nan, fixed_s=np.nan), traces], ignore_index=True)
        return points

    def with_traces(self, measured: pd.DataFrame) -> TimeToTrainModel:
        """The same model with a trace series' measured steps among its step points."""
        points = trace_points(measured, self.cores_per_chip)
        return TimeToTrainModel(self.runs, self.workload, self.epochs_model, self.cores_per_chip,
                                points if not points.empty else None)

    def join(self, measured: pd.DataFrame) -> list[dict[str, Any]]:
        """Each trace run beside the logged result at its chip count: the trace's step time x the
        logged steps (+ the logged evals and lead) against the logged time to train."""
        out = []
        for _, trace in trace_points(measured, self.cores_per_chip).iterrows():
            same = self.runs[np.isclose(self.runs["chips"], trace["chips"])]
            if same.empty:
                continue
            logged = same.iloc[-1]
            train = float(trace["step_s"]) * float(logged["steps"])
            estimate = train + float(logged["eval_s"]) + float(logged["lead_s"])
            measured_s = float(logged["time_to_train_s"])
            out.append({
                "trace_run": trace["run"], "trace_run_id": trace.get("run_id"),
                "chips": int(trace["chips"]), "mlperf_run": logged.get("run"),
                "mlperf_folder": logged.get("folder"), "trace_global_batch": int(trace["global_batch"]),
                "logged_global_batch": int(logged["global_batch"]),
                "same_batch": bool(np.isclose(trace["global_batch"], logged["global_batch"])),
                "trace_step_ms": float(trace["step_s"]) * 1e3,
                "logged_step_ms_est": float(logged["step_s"]) * 1e3,
                "logged_steps": float(logged["steps"]), "logged_eval_s": float(logged["eval_s"]),
                "time_to_train_from_trace_s_est": estimate, "logged_time_to_train_s": measured_s,
                "difference": (estimate - measured_s) / measured_s, "label": LABEL,
            })
        return out

    # --- errors -----------------------------------------------------------------------------------

    def leave_one_out(self) -> list[dict[str, Any]]:
        """Each run predicted by the model fitted on the others (its batch and partitioning known in
        advance, its epochs from the others' epochs(batch))."""
        out = []
        for i in range(len(self.runs)):
            rest = self.runs.drop(index=self.runs.index[i])
            if rest["chips"].nunique() < 2 and len(rest) < 2:
                continue
            target = self.runs.iloc[i]
            other = TimeToTrainModel(rest.reset_index(drop=True), self.workload, EpochsModel.fit(rest),
                                     self.cores_per_chip)
            row = other.predict(float(target["chips"]), float(target["global_batch"]),
                                int(target["partition"]))
            measured = float(target["time_to_train_s"])
            out.append({"chips": int(target["chips"]), "predicted_s": row["time_to_train_s_est"],
                        "measured_s": measured,
                        "relative_error": (row["time_to_train_s_est"] - measured) / measured})
        return out

    def loo_error(self) -> float | None:
        errors = [r["relative_error"] for r in self.leave_one_out()]
        return float(np.sqrt(np.mean(np.square(errors)))) if errors else None

    def holdout(self) -> dict[str, Any]:
        """The largest chip count predicted from the others only (its logged batch and partitioning are
        configuration, known before the run; its time and epochs are not used)."""
        largest = float(self.runs["chips"].max())
        rest = self.runs[self.runs["chips"] < largest].reset_index(drop=True)
        if rest["chips"].nunique() < 2:
            return {"chips": int(largest), "note": "needs 2 smaller chip counts"}
        target = self.runs[self.runs["chips"] == largest].iloc[-1]
        other = TimeToTrainModel(rest, self.workload, EpochsModel.fit(rest), self.cores_per_chip)
        row = other.predict(largest, float(target["global_batch"]), int(target["partition"]))
        measured = float(target["time_to_train_s"])
        logged_train = measured - float(target["eval_s"]) - float(target["lead_s"])
        parts = {"step_ms": (row["step_time_ms_est"], float(target["step_s"]) * 1e3),
                 "train_s": (row["train_s_est"], logged_train),
                 "eval_s": (row["eval_s_est"], float(target["eval_s"])),
                 "epochs": (row["epochs_est"], float(target["epochs"]))}
        return {"chips": int(largest), "fitted_on_chips": [int(c) for c in rest["chips"]],
                "global_batch": int(target["global_batch"]), "epochs_used": row["epochs_est"],
                "epochs_source": row["epochs_source"], "predicted": row["time_to_train_s_est"],
                "measured": measured, "relative_error": (row["time_to_train_s_est"] - measured) / measured,
                "parts_predicted_vs_logged": {k: [float(p), float(m)] for k, (p, m) in parts.items()},
                "step_fixed_source": row["fixed_source"], "label": LABEL}

    # --- the limit (catalog §3.1, §3.13) ----------------------------------------------------------

    def limits(self) -> dict[str, Any]:
        """Where data parallelism runs out and where the non-shrinking step passes compute, with the
        catalog remedies' projected gains there (estimates)."""
        cap = float(self.runs["global_batch"].max())
        dp_limit = cap / (MIN_PER_CORE_BATCH * self.cores_per_chip)   # one example per core
        model = fit_step_model(self.runs, MIN_PER_CORE_BATCH, self.workload)
        c1 = model.c.get(1, next(iter(model.c.values())))
        # c1 * cap / (N * cpc) = d  <=>  N = c1 * cap / (d * cpc)
        crossover = c1 * cap / (model.d * self.cores_per_chip) if model.d > 0 else None
        at = float(2 ** round(math.log2(dp_limit)))
        base = self.predict(at, cap, 1)
        return {
            "label": LABEL,
            "convergence_cap_batch": int(cap),
            "data_parallel_limit_chips": int(round(dp_limit)),
            "data_parallel_limit_rule": "per-core batch reaches 1 at the capped global batch (catalog §3.1)",
            "fixed_passes_compute_chips": None if crossover is None else int(round(crossover)),
            "fixed_passes_compute_rule": "c x (cap / cores) = d: all-reduce + update + overhead pass compute",
            "at_chips": int(at),
            "time_to_train_s_est": base["time_to_train_s_est"],
            "remedies": self.remedies(at, cap, base, model),
        }

    def remedies(self, chips: float, cap: float, base: dict[str, Any], model: StepModel) -> list[dict]:
        """Catalog remedies at ``chips``: time-to-train gains, each an estimate with its model."""
        steps, step_s = base["steps_est"], base["step_time_ms_est"] / 1e3
        split = self.fixed_split(model.d)
        replicas = chips * self.cores_per_chip
        out = []
        wider = self.predict(chips * PARTITION_WAYS, cap, PARTITION_WAYS)
        out.append({"remedy": f"{PARTITION_WAYS}-way model/spatial partitioning", "catalog": "3.1",
                    "at_chips": int(chips * PARTITION_WAYS),
                    "gain_s": base["time_to_train_s_est"] - wider["time_to_train_s_est"],
                    "model": (f"{PARTITION_WAYS}x the chips at the same global batch, partitioned: per-core "
                              f"compute / {PARTITION_WAYS} ({wider['compute_source']}), d unchanged")})
        update_saving = split["weight_update_s"] * (1 - 1 / replicas)
        out.append({"remedy": "weight-update sharding", "catalog": "3.2", "at_chips": int(chips),
                    "gain_s": update_saving * steps,
                    "model": "update x (1 - 1/N replicas) per step (catalog §3.2)"})
        out.append({"remedy": "bf16 gradient all-reduce", "catalog": "3.4", "at_chips": int(chips),
                    "gain_s": 0.5 * split["allreduce_s"] * steps,
                    "model": "half the all-reduce bytes: ~half its bandwidth term (catalog §3.4)"})
        for row in out:
            row["fraction"] = row["gain_s"] / base["time_to_train_s_est"]
            row["step_share_fixed"] = model.d / step_s if step_s else None
            row["label"] = LABEL
        return out

    def fixed_split_source(self) -> str:
        if self.traces is not None and (self.traces["fixed_s"] > 0).any():
            return "the trace runs' measured collectives / weight update / rest of the non-shrinking step"
        return "catalog §2 cost model of the parameter bytes [est], scaled to d"

    def fixed_split(self, d: float) -> dict[str, float]:
        """d split into all-reduce, weight update and the rest: as the trace runs measured it when there
        are any, else by the cost model [est], scaled to d when the cost model exceeds the fitted value."""
        traces = self.traces
        if traces is not None and (traces["fixed_s"] > 0).any():
            fixed = float(traces["fixed_s"].sum())
            allreduce = d * float(traces["collectives_s"].sum()) / fixed
            update = d * float(traces["weight_update_s"].sum()) / fixed
            return {"allreduce_s": allreduce, "weight_update_s": update,
                    "other_s": max(d - allreduce - update, 0.0)}
        prior = prior_fixed_s(self.workload) or {"allreduce_s": 0.0, "weight_update_s": 0.0}
        total = prior["allreduce_s"] + prior["weight_update_s"]
        shrink = min(1.0, d / total) if total > 0 else 0.0
        allreduce, update = prior["allreduce_s"] * shrink, prior["weight_update_s"] * shrink
        return {"allreduce_s": allreduce, "weight_update_s": update,
                "other_s": max(d - allreduce - update, 0.0)}


SHRINKING = ("compute", "input")                                  # per example (catalog §3.1, §3.8)
FIXED = ("collectives", "weight_update", "output", "idle", "other")  # per step (catalog §2, §3.2, §3.13)


def trace_points(measured: pd.DataFrame, cores_per_chip: float) -> pd.DataFrame:
    """Trace runs as step points of the model: per-core batch, global batch and the measured step split
    into its shrinking (compute, input) and non-shrinking categories (collectives, weight update...)."""
    if measured is None or measured.empty or "per_core_batch" not in measured \
            or measured["per_core_batch"].isna().all():
        return pd.DataFrame(columns=["run", "chips", "per_core_batch", "global_batch", "partition", "step_s",
                                     "compute_s", "fixed_s", "collectives_s", "weight_update_s"])
    rows = measured[measured["per_core_batch"].notna()].copy()
    cores = rows["cores"].astype(float) if "cores" in rows and rows["cores"].notna().all() else \
        rows["chips"].astype(float) * cores_per_chip
    out = pd.DataFrame({"run": rows["run"].astype(str), "chips": rows["chips"].astype(float)})
    if "run_id" in rows:
        out["run_id"] = rows["run_id"]
    out["per_core_batch"] = rows["per_core_batch"].astype(float)
    given = rows["global_batch"] if "global_batch" in rows else pd.Series(np.nan, index=rows.index)
    out["global_batch"] = given.astype(float).fillna(out["per_core_batch"] * cores)
    out["partition"] = 1
    out["step_s"] = rows["step_time_ms"].astype(float) / 1e3
    def total(names):
        return sum(rows[c].fillna(0).astype(float) for c in names if c in rows) / 1e3 + 0 * out["step_s"]
    out["compute_s"] = total(SHRINKING)
    out["fixed_s"] = total(FIXED)
    out["collectives_s"] = total(("collectives",))
    out["weight_update_s"] = total(("weight_update",))
    return out.reset_index(drop=True)


def prepare(frame: pd.DataFrame) -> pd.DataFrame:
    """The runs with their measured step time: (time - evals - lead) / (epochs x examples / batch)."""
    need = {"chips", "cores", "global_batch", "epochs", "time_to_train_s", "examples_per_epoch"}
    missing = need - set(frame.columns)
    if missing:
        raise TpuAnalyzeError(f"time-to-train model lacks columns {sorted(missing)}")
    runs = frame.dropna(subset=sorted(need)).sort_values("chips", kind="stable").reset_index(drop=True).copy()
    if runs["chips"].nunique() < 2:
        raise TpuAnalyzeError("time-to-train model needs runs at 2 or more chip counts")
    for column, default in (("eval_s", 0.0), ("eval_count", 0.0), ("lead_s", 0.0), ("partition", 1)):
        runs[column] = runs[column].fillna(default) if column in runs else default
    runs["per_core_batch"] = runs["global_batch"].astype(float) / runs["cores"].astype(float)
    runs["steps"] = runs["epochs"] * runs["examples_per_epoch"] / runs["global_batch"]
    train = runs["time_to_train_s"] - runs["eval_s"] - runs["lead_s"]
    runs["step_s"] = train.clip(lower=1e-9) / runs["steps"]
    return runs


def projection_table(model: TimeToTrainModel, targets: Sequence[tuple[int, int | None]]) -> pd.DataFrame:
    """Projected rows (estimates) at (chips, batch or None), each with the model's leave-one-out error."""
    error = model.loo_error()
    measured = set(model.runs["chips"].astype(int))
    rows = []
    for chips, batch in targets:
        row = model.predict(float(chips), batch)
        row["error_est"] = error
        row["measured"] = int(chips) in measured and batch is None
        rows.append(row)
    out = pd.DataFrame(rows)
    base = model.runs.iloc[0]
    base_rate = base["epochs"] * base["examples_per_epoch"] / (base["time_to_train_s"] * base["cores"])
    rate = out["epochs_est"] * model.runs["examples_per_epoch"].iloc[-1] / (
        out["time_to_train_s_est"] * out["chips"] * model.cores_per_chip)
    out["per_core_examples_per_s_est"] = rate
    out["per_core_throughput_rel_est"] = rate / base_rate
    return out
