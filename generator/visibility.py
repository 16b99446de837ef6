"""Does an injected bottleneck show by the catalog's own detection rules? Checked on the exact ground
truth, so a scenario whose effect is physically too small at the requested scale says so."""

from __future__ import annotations

import numpy as np
from tpuanalyze.generator.cost_model import StepCosts
from tpuanalyze.generator.program import COLLECTIVE_CATEGORIES, Program
from tpuanalyze.generator.scenarios import Scenario


def _all_reduce_stats(train: Program) -> tuple[int, float]:
    sizes = [op.bytes_accessed for op in train.ops if op.category == "all-reduce" and op.role != "async_done"]
    return len(sizes), float(np.median(sizes)) if sizes else 0.0


def check_visibility(
    exposed_by_kind: dict[str, float],
    scen: Scenario,
    mean: dict,
    op_ms: dict,
    infeed_ps: list[float],
    train: Program,
    costs: StepCosts,
    host_processing: float,
) -> dict:
    """Per injected rule: the metric, its value, the catalog threshold and whether it is met."""
    step_ms = sum(op_ms.values()) or 1.0
    compute_ms = sum(v for k, v in op_ms.items() if k not in COLLECTIVE_CATEGORIES + ("infeed", "outfeed"))
    n_ar, median_ar = _all_reduce_stats(train)
    infeed = np.array(infeed_ps) if infeed_ps else np.zeros(1)
    has_sharding = any(op.category in ("reduce-scatter", "all-gather") for op in train.ops)
    first_conv = next((op for op in train.ops if op.category in ("convolution", "convolution fusion")), None)
    conv0_share = 0.0
    if first_conv is not None and compute_ms > 0:
        conv0_share = first_conv.base_ms * 2 / compute_ms  # forward + weight gradient
    checks = {
        # catalog §3.8 / §4: infeed >= 5% moderate, >= 20% high
        "input-bound": ("input fraction", mean["input"], 0.05),
        "host-input-processing": (
            "host processing share of input time (with input >= 5%)",
            host_processing if mean["input"] >= 0.05 else 0.0,
            0.5,
        ),
        "outfeed-bound": ("output fraction", mean["output"], 0.05),  # catalog §3.10
        "f32-gradient-allreduce": (
            "exposed gradient all-reduce/reduce-scatter/all-gather with f32 gradients",  # catalog §3.4
            sum(exposed_by_kind[k] for k in ("all-reduce", "reduce-scatter", "all-gather"))
            if scen.grad_dtype == "f32"
            else 0.0,
            0.06,
        ),
        "latency-bound-collectives": (
            "all-reduces per step (median < 1 MB)",  # catalog §3.5
            float(n_ar) if median_ar < 1e6 else 0.0,
            50.0,
        ),
        "collective-bound": ("collectives fraction", mean["collectives"], 0.30),  # catalog §4
        "weight-update-unsharded": (
            "weight-update fraction without reduce-scatter/all-gather",  # §3.2
            mean["weight_update"] if not has_sharding else 0.0,
            0.10,
        ),
        "eval-overhead": ("eval fraction of wall time", mean["eval"], 0.10),  # catalog §3.10
        "host-overhead": ("idle fraction", mean["idle"], 0.03),  # catalog §3.7
        "straggler": ("max/avg infeed across cores", float(infeed.max() / max(infeed.mean(), 1.0)), 2.0),
        "data-parallel-limit": (
            "1 / per-core batch without partitioning",  # catalog §3.1
            1.0 / costs.per_core_batch if costs.partition == 1 else 0.0,
            1.0,
        ),
        "partition-overhead": (
            "collective-permute share of step",  # catalog §3.1
            op_ms.get("collective-permute", 0.0) / step_ms,
            0.10,
        ),
        "data-formatting": (
            "data formatting share of compute, or first convolution share",  # §3.9
            max(op_ms.get("data formatting", 0.0) / max(compute_ms, 1e-9), conv0_share),
            0.05,
        ),
    }
    out = {}
    for rule in scen.injected_rules + scen.secondary_rules:
        metric, value, threshold = checks[rule]
        out[rule] = {
            "metric": metric,
            "value": value,
            "threshold": threshold,
            "visible": bool(value > threshold),
        }
    return out
